"""Does a Bayesian LSTM converge on every seed? Embedded Reber Grammar, deterministic vs Bayesian, over seeds.

The criterion: over 5 seeds, the worst Bayesian LSTM's test accuracy within 5 points of the deterministic
LSTM's median *at the same number of steps*. Each run trains ``Classifier(rnn, head)`` (the last step of a
batch-first LSTM, one logit) with ``pyro_bbb.fit`` and records the test accuracy (2000 fresh strings) after every
epoch; the table reports the accuracy after the last epoch. The deterministic model is ``nn.LSTM`` + ``nn.Linear``
(point estimates through ``fit``), the Bayesian one ``BayesianLSTM`` + ``BayesianLinear``.

Configurations (``--config``): ``A`` is the issue's (strings up to 16 symbols, 2000 training strings, LSTM(8),
batches of 100, 40 epochs, Adam 1e-2, clip_norm 5). Variants (flags) change both models alike unless said:

* ``--forget-bias B``: initial forget-gate bias B (torch draws it uniformly around 0); for a GRU the update gate's
  (``z``: the state is kept where it is near 1);
* ``--lr-decay D``: multiply the learning rate by D after every step (``pyro.optim.ClippedAdam``'s ``lrd``);
* ``--lr-final LR``: decay the learning rate epoch by epoch from ``--lr`` to LR (``fit(lr_final=)``);
* ``--epochs E``: train E epochs instead of the configuration's;
* ``--kl-weight W`` / ``--kl-warmup STEPS``: the Bayesian model's KL weight, constant or ramped from 0;
* ``--estimator``: the Bayesian model's gradient estimator (``flipout`` by default, as in the issue);
* ``--prior learned``: the Bayesian model's layers get ``priors.LearnedNormal()`` (empirical Bayes) instead of
  ``Normal(0, 1)``; ``--prior-scale S``: ``Normal(0, S)``; ``--prior eb``: ``priors.EmpiricalBayesNormal(gain=S)``
  (the closed-form scale under an inverse-gamma hyperprior whose mode is ``S / sqrt(fan_in)``);
* ``--init-scale S``: the guide's initial posterior std (``MeanFieldGuide(init_scale=S)``);
* ``--bayesian-only``: skip the deterministic runs (compare with a previous run's median);
* ``--optimizer ivon``: the Bayesian model trained by ``pyro_bbb.optim.IVON`` at its defaults (``--lr`` then only
  reaches the deterministic model and the parameters IVON leaves to Adam);
* ``--padding start``: short strings padded before the string instead of after it.

    python benchmarks/reber_convergence.py --config A                       # current defaults, 5 seeds
    python benchmarks/reber_convergence.py --config A --forget-bias 1 --lr-decay 0.997
    python benchmarks/reber_convergence.py --quick                          # smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import pyro
import torch
from torch import nn

import pyro_bbb
from pyro_bbb import likelihoods, priors
from pyro_bbb.data import embedded_reber
from pyro_bbb.infer import schedules
from pyro_bbb.nn import BayesianGRU, BayesianLinear, BayesianLSTM

CONFIGS = {
    "A": {"max_len": 16, "num_train": 2000, "hidden": 8, "batch_size": 100, "epochs": 40},
    "B": {"max_len": 12, "num_train": 1000, "hidden": 4, "batch_size": 50, "epochs": 40},
    "C": {"max_len": 20, "num_train": 4000, "hidden": 16, "batch_size": 100, "epochs": 20},
    "quick": {"max_len": 12, "num_train": 200, "hidden": 4, "batch_size": 50, "epochs": 2},
}
BAYESIAN = {"LSTM": BayesianLSTM, "GRU": BayesianGRU}


class Classifier(nn.Module):
    """Read the string with a recurrent layer, classify from the last step's output."""

    def __init__(self, rnn: nn.Module, head: nn.Module):
        super().__init__()
        self.rnn, self.head = rnn, head

    def forward(self, x):
        return self.head(self.rnn(x)[0][..., -1, :])


def set_forget_bias(lstm: nn.LSTM | nn.GRU, value: float, hidden: int) -> None:
    """Forget-gate bias ``value`` (input-to-hidden bias; the hidden-to-hidden one 0) in every layer of a
    ``torch.nn.LSTM`` -- what ``BayesianLSTM(forget_bias=value)`` does to its initial posterior means; a
    ``torch.nn.GRU``'s update gate likewise (its second chunk too)."""
    with torch.no_grad():
        for name, param in lstm.named_parameters():
            if name.startswith("bias_"):
                param[hidden : 2 * hidden] = value if name.startswith("bias_ih") else 0.0


def train(config: dict, kind: str, mode: str, seed: int, args) -> dict:
    x, y = embedded_reber(config["num_train"], max_len=config["max_len"], seed=100 + seed, padding=args.padding)
    x_test, y_test = embedded_reber(2000, max_len=config["max_len"], seed=999, padding=args.padding)
    pyro.clear_param_store()
    torch.manual_seed(seed)
    hidden = config["hidden"]
    if kind == "deterministic":
        rnn, head = getattr(nn, mode)(7, hidden, batch_first=True), nn.Linear(hidden, 1)
        if args.forget_bias is not None:  # an LSTM's forget gate, a GRU's update gate (both the second chunk)
            set_forget_bias(rnn, args.forget_bias, hidden)
    else:
        prior = {"learned": priors.LearnedNormal, "eb": lambda: priors.EmpiricalBayesNormal(gain=args.prior_scale),
                 "normal": lambda: priors.Normal(0.0, args.prior_scale)}[args.prior]()
        # the flag, or torch's initialisation like the deterministic model's (not the layers' default of 1)
        extra = {"forget_bias" if mode == "LSTM" else "update_bias": args.forget_bias}
        rnn = BAYESIAN[mode](7, hidden, batch_first=True, prior=prior, **extra)
        head = BayesianLinear(hidden, 1, prior=prior)
    model = pyro_bbb.BNN(Classifier(rnn, head), likelihoods.Bernoulli())
    guide = pyro_bbb.MeanFieldGuide(model, **({"init_scale": args.init_scale} if args.init_scale else {}))
    settings = {}
    if args.lr_decay is not None:
        settings["optimizer"] = pyro.optim.ClippedAdam({"lr": args.lr, "lrd": args.lr_decay, "clip_norm": 1e9})
    if kind == "bayesian":
        if args.optimizer == "ivon":
            settings["optimizer"] = pyro_bbb.optim.IVON(guide, num_data=config["num_train"], **args.ivon)
        if args.kl_warmup:
            settings["kl_weight"] = schedules.LinearWarmup(args.kl_warmup)
        elif args.kl_weight is not None:
            settings["kl_weight"] = args.kl_weight
    clip_norm = None if kind == "bayesian" and args.optimizer == "ivon" else 5.0  # IVON clips its own steps
    start = time.perf_counter()
    if args.lr_final is not None:
        settings["lr_final"] = args.lr_final
    history = pyro_bbb.fit(model, guide, (x, y), epochs=config["epochs"], batch_size=config["batch_size"],
                           lr=args.lr, clip_norm=clip_norm,
                           estimator=args.estimator if kind == "bayesian" else "reparam",
                           validation_data=(x_test, y_test), progress=False, seed=seed, **settings)
    return {"kind": kind, "mode": mode, "seed": seed, "final": history.last["val_accuracy"],
            "best": max(history["val_accuracy"]), "curve": history["val_accuracy"],
            "steps": config["epochs"] * -(-config["num_train"] // config["batch_size"]),
            "seconds": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=[c for c in CONFIGS if c != "quick"], default="A")
    parser.add_argument("--mode", choices=list(BAYESIAN), default="LSTM")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--forget-bias", type=float, default=None)
    parser.add_argument("--lr-decay", type=float, default=None)
    parser.add_argument("--lr-final", type=float, default=None)
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--kl-weight", type=float, default=None)
    parser.add_argument("--kl-warmup", type=int, default=0)
    parser.add_argument("--estimator", default="flipout")
    parser.add_argument("--prior", choices=["normal", "learned", "eb"], default="normal")
    parser.add_argument("--prior-scale", type=float, default=1.0)
    parser.add_argument("--init-scale", type=float, default=None)
    parser.add_argument("--bayesian-only", action="store_true")
    parser.add_argument("--optimizer", choices=["adam", "ivon"], default="adam",
                        help="the Bayesian model's optimizer (ivon: pyro_bbb.optim.IVON at its defaults)")
    parser.add_argument("--padding", choices=["end", "start"], default="end", help="where short strings are padded")
    parser.add_argument("--ivon-lr", type=float, default=None, help="IVON's lr (its default otherwise)")
    parser.add_argument("--ivon-hess-init", type=float, default=None, help="IVON's hess_init (its default otherwise)")
    parser.add_argument("--json", action="store_true", help="also print every run as a JSON line")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    args.ivon = {k: v for k, v in (("lr", args.ivon_lr), ("hess_init", args.ivon_hess_init)) if v is not None}
    config = dict(CONFIGS["quick" if args.quick else args.config])
    if args.epochs is not None and not args.quick:
        config["epochs"] = args.epochs
    seeds = 1 if args.quick else args.seeds
    runs = {"deterministic": [], "bayesian": []}
    kinds = ["bayesian"] if args.bayesian_only else list(runs)
    for seed in range(seeds):
        for kind in kinds:
            result = train(config, kind, args.mode, seed, args)
            runs[kind].append(result)
            if args.json:
                print(json.dumps(result), flush=True)
    print(f"ERG {config}, {args.mode}, padding at the {args.padding}, Bayesian optimizer {args.optimizer}, {seeds} "
          f"seeds; test accuracy after {runs['bayesian'][0]['steps']} steps")
    for kind, results in runs.items():
        if not results:
            continue
        finals = ", ".join(f"{r['final']:.3f}" for r in results)
        print(f"  {kind:13s} final {finals}  (median {statistics.median(r['final'] for r in results):.3f}, "
              f"best-epoch median {statistics.median(r['best'] for r in results):.3f})")
    if args.bayesian_only:
        return
    gap = statistics.median(r["final"] for r in runs["deterministic"]) - min(r["final"] for r in runs["bayesian"])
    print(f"  worst Bayesian is {100 * gap:.1f} points below the deterministic median "
          f"({'within' if gap <= 0.05 else 'outside'} the criterion's 5 points)")


if __name__ == "__main__":
    main()
