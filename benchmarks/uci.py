"""The UCI regression benchmark (Hernández-Lobato & Adams 2015 protocol) against the published results.

For every set in ``../shared/uci`` and every standard split: normalise features and target on the training split,
train a one-hidden-layer ReLU net (50 units, 100 for protein) with pyro_bbb for the protocol's epochs, and report
test RMSE and test log-likelihood per point in the original units (mean ± standard error over splits), next to the
published VI, PBP, MC dropout, deep ensembles and MCVI log-likelihoods. Tasks run in parallel processes.

    python benchmarks/uci.py                          # everything (slow: hours on 2 cores)
    python benchmarks/uci.py --sets bostonHousing yacht --splits 5
    python benchmarks/uci.py --quick                  # smoke run: one split of one set, 2 epochs
    python benchmarks/uci.py --variants "DVI (moments), heteroscedastic" --lr-final 1e-3   # the DVI recipe
"""

from __future__ import annotations

import argparse
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
}  # fmt: skip

#: The weight priors of the variants: N(0, 1); empirical Bayes with a learned scale; empirical Bayes with the
#: closed-form scale given the posterior, under Wu et al.'s inverse-gamma hyperprior ("eb") or none ("eb-plain").
PRIORS = {
    "normal": lambda: None,
    "learned": priors.LearnedNormal,
    "eb": priors.EmpiricalBayesNormal,
    "eb-plain": lambda: priors.EmpiricalBayesNormal(concentration=None),
}

#: name -> (estimator, noise model, weight prior: a key of PRIORS).
VARIANTS = {
    "BbB, learned noise": ("reparam", "homoscedastic", "normal"),
    "BbB local reparam, learned noise": ("local_reparam", "homoscedastic", "normal"),
    "BbB local reparam, heteroscedastic": ("local_reparam", "heteroscedastic", "normal"),
    "DVI (moments), heteroscedastic": ("moments", "heteroscedastic", "normal"),
    "DVI (moments), heteroscedastic, empirical Bayes": ("moments", "heteroscedastic", "learned"),
    "BbB local reparam, heteroscedastic, empirical Bayes": ("local_reparam", "heteroscedastic", "learned"),
    "DVI (moments), heteroscedastic, EB closed form + hyperprior": ("moments", "heteroscedastic", "eb"),
    "DVI (moments), heteroscedastic, EB closed form": ("moments", "heteroscedastic", "eb-plain"),
}


def _read(name: str, filename: str) -> np.ndarray:
    return np.loadtxt(ROOT / name / filename)


def run_split(task: tuple[str, int, str, int, int, float | None]) -> tuple[str, str, float, float, float, float]:
    """Train and evaluate one (set, split, variant); returns test log-likelihood and RMSE in original units, the
    wall time and the ELBO's relative change over the last 10% of the epochs (a convergence check)."""
    name, split, variant, epochs, num_samples, lr_final = task
    torch.set_num_threads(1)
    estimator, noise, prior = VARIANTS[variant]
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

    x_train, y_train = tensor((x[train] - x_mean) / x_std), tensor((y[train] - y_mean) / y_std)
    x_test, y_test = tensor((x[test] - x_mean) / x_std), tensor(y[test])
    hidden = int(_read(name, "n_hidden.txt"))
    pyro.clear_param_store()
    torch.manual_seed(split)
    outputs = 2 if noise == "heteroscedastic" else 1
    weight_prior = PRIORS[prior]()
    layers = [BayesianLinear(x_train.shape[1], hidden, prior=weight_prior), torch.nn.ReLU(),
              BayesianLinear(hidden, outputs, prior=weight_prior)]  # fmt: skip
    net = torch.nn.Sequential(*layers)
    likelihood = likelihoods.HeteroscedasticGaussian() if outputs == 2 else likelihoods.Gaussian(prior_median=0.1)
    bnn = pyro_bbb.BNN(net, likelihood)
    guide = pyro_bbb.MeanFieldGuide(bnn)
    start = time.perf_counter()
    history = pyro_bbb.fit(bnn, guide, (x_train, y_train), epochs=epochs, batch_size=32, lr=1e-2, lr_final=lr_final,
                           estimator=estimator, progress=False, seed=split)  # fmt: skip
    losses = history["loss"]
    tail = max(1, len(losses) // 10)
    change = abs(losses[-1] - losses[-1 - tail]) / abs(losses[-1]) if len(losses) > tail else math.nan
    prediction = pyro_bbb.predict(bnn, guide, x_test, num_samples=num_samples)
    # original units: y = y_mean + y_std * z, so log p(y) = log p(z) - log(y_std)
    log_lik = prediction.log_likelihood((y_test - y_mean) / y_std).mean().item() - math.log(y_std)
    rmse = ((prediction.mean * y_std + y_mean - y_test) ** 2).mean().sqrt().item()
    return name, variant, log_lik, rmse, time.perf_counter() - start, change


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
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.sets, args.splits, args.epochs, args.samples = ["yacht"], 1, 2, 20
        args.variants, args.lr_final = ["BbB, learned noise", "DVI (moments), heteroscedastic, empirical Bayes"], 1e-3
    tasks = []
    for name in args.sets:
        splits = int(_read(name, "n_splits.txt"))
        epochs = args.epochs or int(_read(name, "n_epochs.txt"))
        for split in range(args.first_split, min(splits, args.first_split + (args.splits or splits))):
            tasks += [(name, split, variant, epochs, args.samples, args.lr_final) for variant in args.variants]
    start = time.perf_counter()
    fields = ("set", "variant", "log_lik", "rmse", "seconds", "elbo_change")
    results = []
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        # each run reported as it ends (hours-long runs show progress, and what ended survives an interruption)
        for task, row in zip(tasks, pool.imap(run_split, tasks, chunksize=1)):
            results.append(row)
            print(f"[{len(results)}/{len(tasks)}, {time.perf_counter() - start:.0f} s] {task[0]} split {task[1]}, "
                  f"{task[2]}: test log-lik {row[2]:.3f}, RMSE {row[3]:.3f}, {row[4]:.0f} s, "
                  f"ELBO change over the last 10% {row[5]:.1%}", flush=True)  # fmt: skip
            if args.raw is not None:
                args.raw.write_text(json.dumps([dict(zip(fields, r, strict=True)) for r in results], indent=1))
    print(f"{len(tasks)} runs in {time.perf_counter() - start:.0f} s ({args.workers} processes)\n")
    print("| set | model | splits | test log-lik | test RMSE | PBP | MCVI | DVI | s / run | ELBO change, last 10% |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.sets:
        for variant in args.variants:
            rows = [r for r in results if r[0] == name and r[1] == variant]
            ll, ll_se = _mean_se([r[2] for r in rows])
            rmse, rmse_se = _mean_se([r[3] for r in rows])
            pbp, mcvi, dvi = PUBLISHED[name][1], PUBLISHED[name][4], DVI[name]
            seconds = statistics.median(r[4] for r in rows)
            change = statistics.median(r[5] for r in rows)
            print(f"| {name} | {variant} | {len(rows)} | {ll:.2f} ± {ll_se:.2f} | {rmse:.2f} ± {rmse_se:.2f} | "
                  f"{pbp:.2f} | {mcvi:.2f} | {dvi:.2f} | {seconds:.0f} | {change:.1%} |")  # fmt: skip


if __name__ == "__main__":
    main()
