"""Do the ELBO and the test score agree? Candidate models compared by their training ELBO, beside their test scores.

For each UCI set and standard split, every candidate (a weight prior, a noise model, an initial posterior width and a
gradient estimator) is trained on the training split with the same recipe, then scored twice: by
:func:`pyro_bbb.evidence` on the *training* data (what chooses a default: no test data is read) and by the test
log-likelihood (what a user sees, reported after the choice). Per set it prints one row per candidate (medians over
the splits), the Spearman rank correlation between the training ELBO and the test log-likelihood across candidates,
and the test log-likelihood of the candidate with the best training ELBO next to the best one.

    python benchmarks/evidence.py                                   # development sets, 3 splits (~10 min, 2 cores)
    python benchmarks/evidence.py --sets wine-quality-red kin8nm --priors fan-in --noises heteroscedastic
    python benchmarks/evidence.py --sets digits --priors normal he eb --noises homoscedastic   # a classifier
    python benchmarks/evidence.py --quick                           # smoke run

Candidates are the product of ``--priors``, ``--noises``, ``--inits`` and ``--estimators``:

- priors: ``normal`` N(0, 1) (the old default); ``normal-2`` N(0, 2); ``fan-in`` N(0, 1/sqrt(fan_in)) on weights
  and biases; ``he`` N(0, sqrt(2/fan_in)) on weights and N(0, 1) on biases (the new default); ``eb`` empirical
  Bayes per weight tensor under an inverse-gamma hyperprior at the fan-in scale (Wu et al. 2019); ``learned`` a
  scale per tensor learned by gradient steps (type-II maximum likelihood, no hyperprior).
- sets: the UCI sets of ``../shared/uci`` and ``digits`` (scikit-learn's 8x8 digits, a 64-100-10 classifier with a
  Categorical likelihood, batches of 128; the split seeds the train/test partition; the noise option is ignored).
- noises: ``homoscedastic`` (``likelihoods.Gaussian()``: one learned scale under a LogNormal(0, 1) prior);
  ``heteroscedastic`` (``likelihoods.HeteroscedasticGaussian()``: the net also outputs the scale).
- inits: the posterior's initial width, ``1e-4`` (the old default) or ``prior`` (each weight at its prior's std).
- estimators: ``reparam``, ``local_reparam``, ``flipout``, ``moments`` (training only; every candidate is scored by
  the same Monte Carlo ELBO).
- optimizers: ``adam`` (Adam-BbB, 1e-2 decaying to 1e-3) or ``ivon`` (:class:`pyro_bbb.optim.IVON`, 0.1 to 0.01).

Every candidate trains for ``--epochs`` epochs (batches of 32; 128 on digits), its rate decaying tenfold unless
``--constant-rate``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import statistics
import time
from pathlib import Path

import numpy as np
import pyro
import torch
from uci import _read, load_split, test_log_likelihood  # noqa: E402  (benchmarks/uci.py)

import pyro_bbb
from pyro_bbb import likelihoods, priors
from pyro_bbb.data import datasets
from pyro_bbb.evaluate import metrics
from pyro_bbb.nn import BayesianLinear
from pyro_bbb.optim import IVON

DEVELOPMENT_SETS = ["bostonHousing", "concrete", "energy", "yacht"]

PRIORS = {
    "normal": lambda: priors.Normal(0.0, 1.0),
    "normal-2": lambda: priors.Normal(0.0, 2.0),
    "fan-in": priors.FanInNormal,
    "he": lambda: priors.FanInNormal(gain=2**0.5, bias_scale=1.0),
    "eb": priors.EmpiricalBayesNormal,
    "learned": priors.LearnedNormal,
}
NOISES = {"homoscedastic": likelihoods.Gaussian, "heteroscedastic": likelihoods.HeteroscedasticGaussian}
INITS = {"1e-4": 1e-4, "prior": "prior"}


#: optimizer -> (its first learning rate, the last one): the same tenfold decay for both.
OPTIMIZERS = {"adam": (1e-2, 1e-3), "ivon": (0.1, 1e-2)}


def candidate_name(prior: str, noise: str, init: str, estimator: str, optimizer: str = "adam") -> str:
    return f"{prior}, {noise}, init {init}, {estimator}" + ("" if optimizer == "adam" else f", {optimizer}")


def run(task: tuple) -> dict:
    """Train one candidate on one split; its training ELBO (per datum) and test scores."""
    name, split, (prior, noise, init, estimator, optimizer), epochs, draws, constant_rate = task
    torch.set_num_threads(1)
    classifier = name == "digits"
    if classifier:  # the 8x8 digits (the split seeds the train/test partition), a 64-100-10 net, batches of 128
        x_train, y_train, x_test, y_test = datasets.digits(seed=split)
        hidden, outputs, batch_size, y_mean, y_std = 100, 10, 128, 0.0, 1.0
    else:
        x_train, y_train, x_test, y_test, y_mean, y_std = load_split(name, split)
        hidden, batch_size = int(_read(name, "n_hidden.txt")), 32
        outputs = 2 if noise == "heteroscedastic" else 1
    pyro.clear_param_store()
    torch.manual_seed(split)
    net = torch.nn.Sequential(BayesianLinear(x_train.shape[1], hidden, prior=PRIORS[prior]()), torch.nn.ReLU(),
                              BayesianLinear(hidden, outputs, prior=PRIORS[prior]()))
    bnn = pyro_bbb.BNN(net, likelihoods.Categorical() if classifier else NOISES[noise]())
    guide = pyro_bbb.MeanFieldGuide(bnn, init_scale=INITS[init])
    lr, lr_final = OPTIMIZERS[optimizer]
    lr_final = None if constant_rate else lr_final
    options = {"optimizer": IVON(guide, num_data=len(y_train), lr=lr)} if optimizer == "ivon" else {"lr": lr}
    start = time.perf_counter()
    status = "ok"
    try:
        pyro_bbb.fit(bnn, guide, (x_train, y_train), epochs=epochs, batch_size=batch_size, lr_final=lr_final,
                     estimator=estimator, progress=False, seed=split, **options)
    except pyro_bbb.TrainingDivergedError:
        status = "diverged"  # parameters restored to the last finite state: scored as they are
    seconds = time.perf_counter() - start
    result = pyro_bbb.evidence(bnn, guide, (x_train, y_train), num_draws=draws, seed=split)
    if classifier:  # "test_rmse" holds the accuracy
        prediction = pyro_bbb.predict(bnn, guide, x_test, num_samples=200)
        log_lik, rmse = metrics.log_likelihood(prediction, y_test), metrics.accuracy(prediction, y_test)
    else:
        log_lik, rmse = test_log_likelihood(bnn, guide, x_test, y_test, y_mean, y_std, 200)
    # the ELBO of the normalised targets, in the original units like the test score: log p(y) = log p(z) - log y_std
    candidate = candidate_name(prior, noise, init, estimator, optimizer) + f", {epochs} epochs"
    return {"set": name, "split": split, "candidate": candidate,
            "elbo_per_datum": result.per_datum - float(np.log(y_std)), "elbo_se": result.per_datum_standard_error,
            "kl_per_datum": result.kl / result.num_data, "test_log_lik": log_lik, "test_rmse": rmse,
            "seconds": seconds, "status": status}


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (no ties expected among continuous scores).

    >>> spearman([1.0, 2.0, 3.0], [10.0, 30.0, 20.0])
    0.5
    """
    ranks_a, ranks_b = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ranks_a, ranks_b)[0, 1])


def summarise(rows: list[dict], sets: list[str]) -> None:
    """One table per set (medians over splits) and the agreement of the training ELBO with the test score."""
    correlations = []
    for name in sets:
        by_candidate: dict[str, list[dict]] = {}
        for row in rows:
            if row["set"] == name:
                by_candidate.setdefault(row["candidate"], []).append(row)
        if not by_candidate:
            continue
        medians = {c: {k: statistics.median(r[k] for r in rs) for k in ("elbo_per_datum", "elbo_se", "kl_per_datum",
                                                                          "test_log_lik", "test_rmse", "seconds")}
                   | {"splits": len(rs), "diverged": sum(r["status"] != "ok" for r in rs)}
                   for c, rs in by_candidate.items()}
        order = sorted(medians, key=lambda c: -medians[c]["elbo_per_datum"])
        print(f"\n### {name}\n")
        score = "test accuracy" if name == "digits" else "test RMSE"
        print(f"| candidate | splits | training ELBO / datum | KL / datum | test log-lik | {score} | s / run |")
        print("|---|---|---|---|---|---|---|")
        for c in order:
            m = medians[c]
            flag = f" ({m['diverged']} diverged)" if m["diverged"] else ""
            print(f"| {c}{flag} | {m['splits']} | {m['elbo_per_datum']:.3f} ± {m['elbo_se']:.3f} | "
                  f"{m['kl_per_datum']:.3f} | {m['test_log_lik']:.3f} | {m['test_rmse']:.3f} | {m['seconds']:.0f} |")
        if len(order) > 1:
            rho = spearman([medians[c]["elbo_per_datum"] for c in order], [medians[c]["test_log_lik"] for c in order])
            correlations.append(rho)
            best_test = max(medians[c]["test_log_lik"] for c in order)
            chosen = medians[order[0]]["test_log_lik"]
            print(f"\nSpearman(training ELBO, test log-lik) = {rho:.2f}; the best training ELBO ({order[0]}) has test "
                  f"log-lik {chosen:.3f}, the best test log-lik is {best_test:.3f} ({chosen - best_test:+.3f})")
    if correlations:
        print(f"\nmedian Spearman over sets: {statistics.median(correlations):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", nargs="*", default=DEVELOPMENT_SETS)
    parser.add_argument("--splits", type=int, default=3, help="the first K standard splits")
    parser.add_argument("--priors", nargs="*", default=["normal", "fan-in", "eb"], choices=list(PRIORS))
    parser.add_argument("--noises", nargs="*", default=list(NOISES), choices=list(NOISES))
    parser.add_argument("--inits", nargs="*", default=list(INITS), choices=list(INITS))
    parser.add_argument("--estimators", nargs="*", default=["reparam"])
    parser.add_argument("--optimizers", nargs="*", default=["adam"], choices=list(OPTIMIZERS),
                        help="adam: Adam-BbB from 1e-2 to 1e-3; ivon: pyro_bbb.optim.IVON from 0.1 to 0.01")
    parser.add_argument("--epochs", type=int, nargs="*", default=[200], help="one run per candidate and budget")
    parser.add_argument("--constant-rate", action="store_true", help="no decay of the learning rate (fit's default)")
    parser.add_argument("--draws", type=int, default=100, help="weight draws of each training-ELBO estimate")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--raw", type=Path, default=None, help="also write every run's figures to this JSON file")
    parser.add_argument("--summarise", type=Path, default=None, help="only print the tables of an earlier --raw file")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.summarise is not None:
        rows = json.loads(args.summarise.read_text())
        summarise(rows, list(dict.fromkeys(r["set"] for r in rows)))
        return
    if args.quick:
        args.sets, args.splits, args.epochs, args.draws = ["yacht"], 1, [2], 4
        args.priors, args.noises, args.inits = ["normal", "fan-in"], ["homoscedastic"], ["prior"]
    candidates = list(itertools.product(args.priors, args.noises, args.inits, args.estimators, args.optimizers))
    tasks = [(name, split, c, epochs, args.draws, args.constant_rate)
             for name in args.sets for split in range(args.splits) for c in candidates for epochs in args.epochs]
    start, rows = time.perf_counter(), []
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        for row in pool.imap_unordered(run, tasks):
            rows.append(row)
            print(f"[{len(rows)}/{len(tasks)}, {time.perf_counter() - start:.0f} s] {row['set']} split "
                  f"{row['split']}, {row['candidate']}: training ELBO/datum {row['elbo_per_datum']:.3f}, test "
                  f"log-lik {row['test_log_lik']:.3f} ({row['status']})", flush=True)
            if args.raw is not None:
                args.raw.write_text(json.dumps(rows, indent=1))
    summarise(rows, args.sets)


if __name__ == "__main__":
    main()
