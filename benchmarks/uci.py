"""The UCI regression benchmark (Hernández-Lobato & Adams 2015 protocol) against the published results.

For every set in ``../shared/uci`` and every standard split: normalise features and target on the training split,
train a one-hidden-layer ReLU net (50 units, 100 for protein) with pyro_bbb for the protocol's epochs, and report
test RMSE and test log-likelihood per point in the original units (mean ± standard error over splits), next to the
published VI, PBP, MC dropout, deep ensembles and MCVI log-likelihoods. Tasks run in parallel processes.

    python benchmarks/uci.py                          # everything (slow: hours on 2 cores)
    python benchmarks/uci.py --sets bostonHousing yacht --splits 5
    python benchmarks/uci.py --quick                  # smoke run: one split of one set, 2 epochs
    python benchmarks/uci.py --variants "DVI (moments), heteroscedastic" --lr-final 1e-3   # the DVI recipe
    python benchmarks/uci.py --epochs 400 --early-stopping 40 --refit ...   # epochs chosen on a validation split

With ``--early-stopping P`` the last 10% of each training split (a fixed permutation per split) is held out;
training stops once its log-likelihood has not improved for P epochs and keeps the best epoch's parameters
(:class:`pyro_bbb.EarlyStopping`); with ``--refit`` a fresh net is then trained on the whole training split for
that many epochs, on the same learning-rate schedule cut at that epoch. Such rows are early-stopped, not converged.

The convergence check of every run: ``elbo_change`` (the last epoch's loss against the one 10% of the epochs
earlier, relative to the last) and ``elbo_drift`` (the mean loss of the last 10% of the epochs against the 10%
before, relative to the improvement since the first 10%: the share of the run's progress still being made at its
end, insensitive to epoch-to-epoch jitter and to a loss near zero: ``History.drift``), and ``std_drift`` (the same
for each layer's posterior/prior std ratio, the largest over layers).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import multiprocessing
import statistics
import time
from pathlib import Path

import numpy as np
import pyro
import torch

import pyro_bbb
from pyro_bbb import likelihoods, priors
from pyro_bbb.nn import BayesianLinear

ROOT = Path(__file__).resolve().parents[1].parent / "shared" / "uci"

#: Published test log-likelihoods (``../shared/uci/README.md``): VI, PBP, MC dropout, deep ensembles, MCVI.
PUBLISHED = {
    "bostonHousing": (-2.90, -2.57, -2.46, -2.41, -2.46),
    "concrete": (-3.39, -3.16, -3.04, -3.06, -3.07),
    "energy": (-2.39, -2.04, -1.99, -1.38, -1.03),
    "kin8nm": (0.90, 0.90, 0.95, 1.20, 1.14),
    "naval-propulsion-plant": (3.73, 3.73, 3.80, 5.63, 5.94),
    "power-plant": (-2.89, -2.84, -2.80, -2.79, -2.80),
    "protein-tertiary-structure": (-2.99, -2.97, -2.89, -2.83, -2.87),
    "wine-quality-red": (-0.98, -0.97, -0.93, -0.94, -0.92),
    "yacht": (-3.43, -1.63, -1.55, -1.18, -0.68),
}

#: Wu et al. (2019)'s deterministic VI (their own 90/10 splits, not the protocol's): test log-likelihood.
DVI = {
    "bostonHousing": -2.41, "concrete": -3.06, "energy": -1.01, "kin8nm": 1.13, "naval-propulsion-plant": 6.29,
    "power-plant": -2.80, "protein-tertiary-structure": -2.85, "wine-quality-red": -0.90, "yacht": -0.47,
}

#: The weight priors of the variants: the layers' default (``priors.DEFAULT_PRIOR``); N(0, 1) (the default before
#: it); empirical Bayes with a learned scale; empirical Bayes with the closed-form scale given the posterior, under Wu
#: et al.'s inverse-gamma hyperprior ("eb") or none ("eb-plain").
PRIORS = {
    "default": lambda: None,
    "normal": lambda: priors.Normal(0.0, 1.0),
    "learned": priors.LearnedNormal,
    "eb": priors.EmpiricalBayesNormal,
    "eb-plain": lambda: priors.EmpiricalBayesNormal(concentration=None),
}

#: name -> (estimator, noise model, weight prior: a key of PRIORS). The defaults choose the KL weight (``fit``'s
#: ``kl_weight="auto"``); every other variant is the Bayes posterior (``KL_WEIGHTS``).
VARIANTS = {
    "defaults": ("reparam", "homoscedastic", "default"),
    "defaults, kl_weight=1": ("reparam", "homoscedastic", "default"),
    "defaults, heteroscedastic": ("reparam", "heteroscedastic", "default"),
    "BbB, learned noise": ("reparam", "homoscedastic", "normal"),
    "BbB local reparam, learned noise": ("local_reparam", "homoscedastic", "normal"),
    "BbB local reparam, heteroscedastic": ("local_reparam", "heteroscedastic", "normal"),
    "DVI (moments), heteroscedastic": ("moments", "heteroscedastic", "normal"),
    "DVI (moments), heteroscedastic, empirical Bayes": ("moments", "heteroscedastic", "learned"),
    "BbB local reparam, heteroscedastic, empirical Bayes": ("local_reparam", "heteroscedastic", "learned"),
    "DVI (moments), heteroscedastic, EB closed form + hyperprior": ("moments", "heteroscedastic", "eb"),
    "DVI (moments), heteroscedastic, EB closed form": ("moments", "heteroscedastic", "eb-plain"),
}

#: The KL weight of each variant: "auto" for the defaults, 1 (the Bayes posterior) for the rest.
KL_WEIGHTS = {name: "auto" if name in ("defaults", "defaults, heteroscedastic") else 1.0 for name in VARIANTS}


def _read(name: str, filename: str) -> np.ndarray:
    return np.loadtxt(ROOT / name / filename)


def load_split(name: str, split: int) -> tuple:
    """One standard split of a UCI set: ``(x_train, y_train, x_test, y_test, y_mean, y_std)``, features and the
    training target normalised on the training split (``y_test`` in original units, float32 tensors)."""
    data = _read(name, "data.txt")
    features = _read(name, "index_features.txt").astype(int).reshape(-1)
    target = int(_read(name, "index_target.txt"))
    train = _read(name, f"index_train_{split}.txt").astype(int)
    test = _read(name, f"index_test_{split}.txt").astype(int)
    x, y = data[:, features], data[:, target]
    x_mean, x_std = x[train].mean(0), x[train].std(0)
    x_std[x_std == 0] = 1.0
    y_mean, y_std = y[train].mean(), y[train].std()

    def tensor(a):
        return torch.as_tensor(a, dtype=torch.float32)

    return (tensor((x[train] - x_mean) / x_std), tensor((y[train] - y_mean) / y_std),
            tensor((x[test] - x_mean) / x_std), tensor(y[test]), float(y_mean), float(y_std))


def test_log_likelihood(bnn, guide, x_test, y_test, y_mean: float, y_std: float, num_samples: int) -> tuple:
    """Test log-likelihood per point and RMSE in the original units: ``y = y_mean + y_std * z``, so ``log p(y) =
    log p(z) - log(y_std)``."""
    prediction = pyro_bbb.predict(bnn, guide, x_test, num_samples=num_samples)
    log_lik = prediction.log_likelihood((y_test - y_mean) / y_std).mean().item() - math.log(y_std)
    rmse = ((prediction.mean * y_std + y_mean - y_test) ** 2).mean().sqrt().item()
    return log_lik, rmse


def convergence(history: pyro_bbb.train.History) -> tuple[float, float, float]:
    """``(elbo_change, elbo_drift, std_drift)`` of a run (see the module docstring); NaN when too short.

    >>> h = pyro_bbb.train.History()
    >>> for e, loss in enumerate([10.0, 8.0, 7.0, 6.5, 6.2, 6.1, 6.05, 6.0, 6.0, 6.0], 1):
    ...     h.append({"epoch": e, "loss": loss, "std_ratio": {"fc": 1.0}})
    >>> convergence(h)
    (0.0, 0.0, 0.0)
    """
    losses = history["loss"]
    tail = max(1, len(losses) // 10)
    change = abs(losses[-1] - losses[-1 - tail]) / abs(losses[-1]) if len(losses) > tail else math.nan
    std_drifts = list(history.drift("std_ratio").values()) if "std_ratio" in history.keys() else []
    return change, history.drift("loss"), max(std_drifts, default=math.nan)


def run_split(task: tuple) -> tuple:
    """Train and evaluate one (set, split, variant); returns test log-likelihood and RMSE in original units, the
    wall time, the convergence check (``convergence``) and the epochs the returned net was trained for."""
    name, split, variant, epochs, num_samples, lr_final, patience, refit = task
    torch.set_num_threads(1)
    estimator, noise, prior = VARIANTS[variant]
    x_train, y_train, x_test, y_test, y_mean, y_std = load_split(name, split)
    hidden = int(_read(name, "n_hidden.txt"))
    outputs = 2 if noise == "heteroscedastic" else 1
    start = time.perf_counter()
    if patience is None:
        bnn, guide, history = _train(x_train, y_train, hidden, outputs, prior, estimator, split, epochs, lr_final,
                                     kl_weight=KL_WEIGHTS[variant])
        trained = len(history)
    else:
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(1000 + split))
        held = max(1, len(order) // 10)
        fit_rows, validation_rows = order[:-held], order[-held:]
        stop = pyro_bbb.EarlyStopping(patience)
        bnn, guide, history = _train(x_train[fit_rows], y_train[fit_rows], hidden, outputs, prior, estimator, split,
                                     epochs, lr_final, early_stopping=stop, kl_weight=KL_WEIGHTS[variant],
                                     validation_data=(x_train[validation_rows], y_train[validation_rows]))
        trained = stop.best_epoch or len(history)
        if refit:  # the whole training split, for the chosen epochs, on the schedule cut at that epoch
            cut = None if lr_final is None else 1e-2 * (lr_final / 1e-2) ** ((trained - 1) / max(1, epochs - 1))
            bnn, guide, history = _train(x_train, y_train, hidden, outputs, prior, estimator, split, trained, cut,
                                         kl_weight=KL_WEIGHTS[variant])
    change, drift, std_drift = convergence(history)
    log_lik, rmse = test_log_likelihood(bnn, guide, x_test, y_test, y_mean, y_std, num_samples)
    chosen = history.kl_weight_choice.kl_weight if history.kl_weight_choice is not None else history.last["kl_weight"]
    return name, variant, log_lik, rmse, time.perf_counter() - start, change, drift, trained, std_drift, chosen


def _train(x_train, y_train, hidden, outputs, prior, estimator, split, epochs, lr_final, **fit_options):
    """A fresh net (seeded by the split) trained by the recipe: its model, guide and History."""
    pyro.clear_param_store()
    torch.manual_seed(split)
    weight_prior = PRIORS[prior]()
    layers = [BayesianLinear(x_train.shape[1], hidden, prior=weight_prior), torch.nn.ReLU(),
              BayesianLinear(hidden, outputs, prior=weight_prior)]
    net = torch.nn.Sequential(*layers)
    likelihood = likelihoods.HeteroscedasticGaussian() if outputs == 2 else likelihoods.Gaussian(prior_median=0.1)
    bnn = pyro_bbb.BNN(net, likelihood)
    guide = pyro_bbb.MeanFieldGuide(bnn)
    history = pyro_bbb.fit(bnn, guide, (x_train, y_train), epochs=epochs, batch_size=32, lr=1e-2, lr_final=lr_final,
                           estimator=estimator, progress=False, seed=split, num_validation_samples=100,
                           **fit_options)
    return bnn, guide, history


def _mean_se(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], math.nan
    return statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", nargs="*", default=list(PUBLISHED))
    parser.add_argument("--splits", type=int, default=None, help="first K splits only (default: all)")
    parser.add_argument("--first-split", type=int, default=0, help="start at this split (with --splits: K from it)")
    parser.add_argument("--raw", type=Path, default=None, help="also write every run's figures to this JSON file")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS))
    parser.add_argument("--epochs", type=int, default=None, help="default: the protocol's n_epochs.txt (40)")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--lr-final", type=float, default=None,
                        help="decay the learning rate from 1e-2 to this by the last epoch (default: constant)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--early-stopping", type=int, default=None, metavar="PATIENCE",
                        help="hold out 10%% of each training split and stop once its log-likelihood has not improved "
                             "for PATIENCE epochs (--epochs is then the most)")
    parser.add_argument("--refit", action="store_true",
                        help="with --early-stopping: retrain on the whole training split for the chosen epochs")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.refit and args.early_stopping is None:
        parser.error("--refit retrains for the epochs --early-stopping chose: give --early-stopping too.")
    if args.quick:
        args.sets, args.splits, args.epochs, args.samples = ["yacht"], 1, 2, 20
        args.variants, args.lr_final = ["BbB, learned noise", "DVI (moments), heteroscedastic, empirical Bayes"], 1e-3
    tasks = []
    for name in args.sets:
        splits = int(_read(name, "n_splits.txt"))
        epochs = args.epochs or int(_read(name, "n_epochs.txt"))
        for split in range(args.first_split, min(splits, args.first_split + (args.splits or splits))):
            tasks += [(name, split, variant, epochs, args.samples, args.lr_final, args.early_stopping, args.refit)
                      for variant in args.variants]
    start = time.perf_counter()
    fields = ("set", "variant", "log_lik", "rmse", "seconds", "elbo_change", "elbo_drift", "epochs", "std_drift",
              "kl_weight")
    results = []
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        # each run reported as it ends (hours-long runs show progress, and what ended survives an interruption)
        for task, row in zip(tasks, pool.imap(run_split, tasks, chunksize=1)):
            results.append(row)
            print(f"[{len(results)}/{len(tasks)}, {time.perf_counter() - start:.0f} s] {task[0]} split {task[1]}, "
                  f"{task[2]}: test log-lik {row[2]:.3f}, RMSE {row[3]:.3f}, {row[4]:.0f} s, {row[7]} epochs, "
                  f"ELBO change over the last 10% {row[5]:.1%}, drift {row[6]:.1%}, std-ratio drift {row[8]:.1%}, "
                  f"KL weight {row[9]:g}",
                  flush=True)
            if args.raw is not None:
                args.raw.write_text(json.dumps([dict(zip(fields, r, strict=True)) for r in results], indent=1))
    print(f"{len(tasks)} runs in {time.perf_counter() - start:.0f} s ({args.workers} processes)\n")
    if args.early_stopping is not None:
        print(f"Early-stopped on a 10% validation split (patience {args.early_stopping}, at most "
              f"{args.epochs or 'the protocol’s'} epochs"
              f"{', then refitted on the whole training split' if args.refit else ''}): not a converged ELBO.\n")
    print("| set | model | splits | test log-lik | test RMSE | PBP | MCVI | DVI | s / run | epochs | "
          "ELBO change, last 10% | ELBO drift | std-ratio drift |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.sets:
        for variant in args.variants:
            rows = [r for r in results if r[0] == name and r[1] == variant]
            ll, ll_se = _mean_se([r[2] for r in rows])
            rmse, rmse_se = _mean_se([r[3] for r in rows])
            pbp, mcvi, dvi = PUBLISHED[name][1], PUBLISHED[name][4], DVI[name]
            seconds = statistics.median(r[4] for r in rows)
            change, drift, std_drift = (statistics.median(r[i] for r in rows) for i in (5, 6, 8))
            trained = statistics.median(r[7] for r in rows)
            print(f"| {name} | {variant} | {len(rows)} | {ll:.2f} ± {ll_se:.2f} | {rmse:.2f} ± {rmse_se:.2f} | "
                  f"{pbp:.2f} | {mcvi:.2f} | {dvi:.2f} | {seconds:.0f} | {trained:.0f} | {change:.1%} | "
                  f"{drift:.1%} | {std_drift:.1%} |")
    print("\nKL weights the runs trained at (chosen by validation for the defaults), with the number of splits:")
    for name in args.sets:
        for variant in args.variants:
            weights = collections.Counter(r[9] for r in results if r[0] == name and r[1] == variant)
            print(f"- {name}, {variant}: " + ", ".join(f"{w:g} ({n})" for w, n in sorted(weights.items())))


if __name__ == "__main__":
    main()
