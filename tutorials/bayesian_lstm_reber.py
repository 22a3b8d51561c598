# %% [markdown]
# # A Bayesian LSTM that converges: the Embedded Reber Grammar
#
# A well-known report: a Bayesian LSTM(4) with Flipout on the Embedded Reber Grammar (ERG) drove its loss down
# while its accuracy stayed at 0.5, where a plain LSTM(4) reached about 90%. The causes: the KL term was not scaled
# by the data set size (the NLL was a batch *mean*, the KL was added whole, so it counted N times), and no gradient
# clipping. With pyro_bbb the scale is right by construction (`pyro_bbb.ELBO` / `fit` read N from the data) and
# `fit(clip_norm=...)` clips the global gradient norm.
#
# Five models, all trained through `pyro_bbb.fit` on the same data for the same epochs:
# a deterministic LSTM(4); a Bayesian LSTM(4) with plain reparameterization and with Flipout (sign vectors per
# example, shared by all time steps); a deterministic LSTM(4) with a Bayesian output layer; and that report's
# mis-scaled Bayesian LSTM (`kl_weight=N`: the KL counted N times), which stalls at 0.5.
# Writes `tutorials/figures/reber_curves.png` (validation accuracy and KL per epoch) and prints a table.

# %%
import argparse
import statistics
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pyro  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import pyro_bbb  # noqa: E402
from pyro_bbb import likelihoods, priors  # noqa: E402
from pyro_bbb.data import embedded_reber  # noqa: E402
from pyro_bbb.evaluate import plots
from pyro_bbb.infer import schedules
from pyro_bbb.nn import BayesianLinear, BayesianLSTM  # noqa: E402


class Classifier(nn.Module):
    """Read the string with an LSTM, classify from the last hidden state (one logit: grammatical or not)."""

    def __init__(self, rnn: nn.Module, head: nn.Module):
        super().__init__()
        self.rnn, self.head = rnn, head

    def forward(self, x):
        return self.head(self.rnn(x)[0][..., -1, :])


def variants(num_train: int):
    lstm, bayesian_lstm = (lambda: nn.LSTM(7, 4, batch_first=True)), (lambda: BayesianLSTM(7, 4, batch_first=True))
    return {
        "deterministic LSTM(4)": (lambda: Classifier(lstm(), nn.Linear(4, 1)), "reparam", 1.0),
        "Bayesian LSTM(4), reparam": (lambda: Classifier(bayesian_lstm(), nn.Linear(4, 1)), "reparam", 1.0),
        "Bayesian LSTM(4), Flipout": (lambda: Classifier(bayesian_lstm(), nn.Linear(4, 1)), "flipout", 1.0),
        "LSTM(4) + Bayesian head": (lambda: Classifier(lstm(), BayesianLinear(4, 1)), "flipout", 1.0),
        "Bayesian LSTM(4), KL x N (mis-scaled)": (
            lambda: Classifier(bayesian_lstm(), nn.Linear(4, 1)), "flipout", float(num_train)),
    }


def main(epochs: int, num_train: int, out_dir: Path, progress: bool = True) -> dict[str, dict[str, float]]:
    x, y = embedded_reber(num_train, seed=0)
    validation = embedded_reber(1000, seed=1)
    results, histories = {}, {}
    for name, (make, estimator, kl_weight) in variants(num_train).items():
        pyro.clear_param_store()
        torch.manual_seed(0)
        bnn = pyro_bbb.BNN(make(), likelihoods.Bernoulli())
        guide = pyro_bbb.MeanFieldGuide(bnn)
        start = time.perf_counter()
        history = pyro_bbb.fit(bnn, guide, (x, y), epochs=epochs, batch_size=32, lr=0.01, clip_norm=5.0,
                               estimator=estimator, kl_weight=kl_weight, validation_data=validation,
                               progress=progress, seed=0)
        histories[name] = history
        results[name] = {"best val accuracy": max(history["val_accuracy"]),
                         "final val accuracy": history.last["val_accuracy"], "KL (nats)": history.last["kl"],
                         "seconds": time.perf_counter() - start}

    print(f"\nEmbedded Reber Grammar: {num_train} training strings, 1000 validation, {epochs} epochs")
    print(f"{'model':40s} {'best acc':>9s} {'final acc':>10s} {'KL':>9s} {'s':>6s}")
    for name, r in results.items():
        print(f"{name:40s} {r['best val accuracy']:9.3f} {r['final val accuracy']:10.3f} {r['KL (nats)']:9.1f} "
              f"{r['seconds']:6.1f}")

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for i, (name, history) in enumerate(histories.items()):  # one colour per model in both panels
        axes[0].plot(history["epoch"], history["val_accuracy"], color=f"C{i}", label=name)
        if max(history["kl"]) > 0:
            axes[1].plot(history["epoch"], history["kl"], color=f"C{i}", label=name)
    axes[0].axhline(0.5, color="k", lw=0.8, ls=":")
    axes[0].set(xlabel="epoch", ylabel="validation accuracy", title="Embedded Reber Grammar", ylim=(0.4, 1.0))
    axes[1].set(xlabel="epoch", ylabel="nats", title="KL(q || p)", yscale="log")
    for ax in axes:
        ax.legend(fontsize=7)
    plots.save_figure(fig, out_dir / "reber_curves.png", dpi=110)
    print(f"figure -> {out_dir / 'reber_curves.png'}")
    return results


# %% [markdown]
# ## Does it converge on every seed?
#
# One run proves little: single runs of the same recipe land several points apart, and with torch's initialisation
# one Bayesian seed in five never left 0.5 (`benchmarks/reber_convergence.py`, table in `benchmarks/README.md`).
# Three findings, measured over ten seeds (2000 training strings of up to 16 symbols, LSTM(8), batches of 100, 800
# steps, Adam 1e-2 decaying to 1e-3, `clip_norm=5`, Flipout; `benchmarks/README.md` has the tables):
#
# * **The forget gate.** Strings are zero-padded and read at the last step, so the state must survive the padding;
#   a forget gate near sigmoid(0) = 0.5 loses it and the run stalls at chance. `BayesianLSTM` therefore starts its
#   forget-gate biases at 1 (`forget_bias=1.0`, the usual LSTM advice), which removed the stall (a GRU's update
#   gate likewise, `update_bias=1.0`).
# * **The prior's width.** With 2000 strings a `Normal(0, 1)` prior pulls the posterior means towards 0 faster than
#   the data pins them down (the worst of five seeds 17 points below the deterministic median); tighter priors, and
#   empirical Bayes, collapse every seed to 0.5. Recurrent layers default to `Normal(0, 2)`
#   (`pyro_bbb.nn.DEFAULT_RECURRENT_PRIOR`); give the head the same prior.
# * **Early KL pressure.** With all of that, the worst of ten Bayesian seeds still ended 6.8 points below the
#   deterministic median, and 1.7 without any KL: the KL pulls the weights back while the data has not yet pinned
#   them. Warming the KL weight up over the first half of training
#   (`fit(..., kl_weight=pyro_bbb.infer.schedules.LinearWarmup(400))`; the second half optimises the ELBO) brings the
#   worst seed to 4.0 points below (reparameterization 3.4, GRU 4.3): within 5 points over ten seeds.
#
# The plot shows test accuracy against the step for every seed, deterministic and Bayesian with and without the
# warm-up, at the same steps, and every seed's final accuracy beside the deterministic median. Float32 training of
# a recurrent net is chaotic: the same seeds on another CPU instruction set land several points elsewhere (seven
# points for one deterministic seed), so read this as evidence over seeds, not as a guarantee per run. On smaller
# (LSTM(4), 1000 strings) and larger (LSTM(16), 4000 strings) configurations the deterministic LSTM's own worst
# seed is 6-11 points below its median; the Bayesian median matches or beats it there.


def convergence_over_seeds(seeds: int, epochs: int, num_train: int, out_dir: Path, max_len: int = 16,
                           progress: bool = False, warmup_steps: int = 400) -> dict[str, list[float]]:
    """Deterministic LSTM(8) vs Bayesian LSTM(8) (Flipout, Normal(0, 2) prior) with and without a KL warm-up over
    the first ``warmup_steps`` steps, per seed; test accuracy after every epoch. Adam 1e-2 decaying to 1e-3 and
    ``clip_norm=5`` for all three."""
    test = embedded_reber(2000, max_len=max_len, seed=999)
    names = ["deterministic LSTM(8)", f"Bayesian LSTM(8), KL warm-up {warmup_steps} steps",
             "Bayesian LSTM(8), no warm-up"]
    curves: dict[str, list[list[float]]] = {name: [] for name in names}
    steps_per_epoch = -(-num_train // 100)
    for seed in range(seeds):
        x, y = embedded_reber(num_train, max_len=max_len, seed=100 + seed)
        for name in curves:
            pyro.clear_param_store()
            torch.manual_seed(seed)
            settings = {"kl_weight": 1}  # the report's experiment: the ELBO itself
            if name.startswith("deterministic"):
                rnn, head = nn.LSTM(7, 8, batch_first=True), nn.Linear(8, 1)
                with torch.no_grad():  # the same forget-gate start as BayesianLSTM's default
                    rnn.bias_ih_l0[8:16], rnn.bias_hh_l0[8:16] = 1.0, 0.0
            else:
                prior = priors.Normal(0.0, 2.0)  # the recurrent layers' default; the head needs it too
                rnn, head = BayesianLSTM(7, 8, batch_first=True), BayesianLinear(8, 1, prior=prior)
                settings["estimator"] = "flipout"
                if name == names[1]:  # the KL warm-up
                    settings["kl_weight"] = schedules.LinearWarmup(warmup_steps)
            bnn = pyro_bbb.BNN(Classifier(rnn, head), likelihoods.Bernoulli())
            guide = pyro_bbb.MeanFieldGuide(bnn)
            history = pyro_bbb.fit(bnn, guide, (x, y), epochs=epochs, batch_size=100, lr=1e-2, lr_final=1e-3,
                                   clip_norm=5.0, validation_data=test, progress=progress, seed=seed,
                                   **settings)
            curves[name].append(history["val_accuracy"])
    finals = {name: [run[-1] for run in runs] for name, runs in curves.items()}
    fig, (ax, right) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [2, 1]})
    for i, (name, runs) in enumerate(curves.items()):
        for j, run in enumerate(runs):
            ax.plot([steps_per_epoch * (e + 1) for e in range(len(run))], run, color=f"C{i}", alpha=0.7,
                    label=name if j == 0 else None)
        right.plot([i] * len(runs), finals[name], "o", color=f"C{i}", alpha=0.8)
    ax.axhline(0.5, color="k", lw=0.8, ls=":")
    ax.set(xlabel="step", ylabel="test accuracy", ylim=(0.4, 1.0),
           title=f"Embedded Reber Grammar, {seeds} seeds: every run at the same steps")
    ax.legend(fontsize=8)
    median = statistics.median(finals[names[0]])
    right.axhline(median, color="C0", lw=1, label="deterministic median")
    right.axhline(median - 0.05, color="C0", lw=1, ls="--", label="5 points below it")
    right.set(xticks=range(len(names)), xticklabels=["deterministic", "warm-up", "no warm-up"], xlim=(-0.5, 2.5),
              ylabel="final test accuracy", title="every seed's final accuracy")
    right.legend(fontsize=8)
    plots.save_figure(fig, out_dir / "reber_seeds.png", dpi=110)
    for name, values in finals.items():
        print(f"{name:40s} final accuracy per seed: " + ", ".join(f"{v:.3f}" for v in values))
    print(f"figure -> {out_dir / 'reber_seeds.png'}")
    return finals


# %%
if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--num-train", type=int, default=5000)
    parser.add_argument("--out-dir", type=Path, default=Path("tutorials/figures"))
    parser.add_argument("--seeds", type=int, default=10, help="runs per model in the convergence-over-seeds part")
    parser.add_argument("--seeds-only", action="store_true", help="only the convergence-over-seeds part")
    args = parser.parse_args()
    if not args.seeds_only:
        main(args.epochs, args.num_train, args.out_dir, progress=False)
    convergence_over_seeds(args.seeds, epochs=40, num_train=2000, out_dir=args.out_dir)
