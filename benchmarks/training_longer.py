"""Does training longer ever hurt? pyro_bbb's defaults (the KL weight chosen by ``fit``) at 1, 3 and 10 times the
epochs, test NLL side by side.

Three tasks: ``uncertainty.py``'s digits MLP (its first split, 100 epochs at 1x) and two UCI sets of ``uci.py``
(Boston housing and yacht, the protocol's 40 epochs at 1x, the first splits; NLL per point in the original units).
Each run is ``fit`` with its defaults for that many epochs, so the selection's path grows with them; the table shows
the weight each run chose. The goal: test NLL non-increasing within 0.02 from 1x to 3x to 10x.

    python benchmarks/training_longer.py            # under an hour on 2 cores
    python benchmarks/training_longer.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import statistics

import pyro
import torch
import uci
import uncertainty

from pyro_bbb.data import digits

FACTORS = (1, 3, 10)


def digits_mlp(epochs: int, seed: int) -> tuple[float, float]:
    data = uncertainty.split(digits(), seed)
    row = uncertainty.bayesian_row("defaults", uncertainty.mlp, data, epochs, seed)
    return row["NLL"], row["weight"]


def uci_set(name: str, epochs: int, split: int) -> tuple[float, float]:
    x_train, y_train, x_test, y_test, y_mean, y_std = uci.load_split(name, split)
    hidden = int(uci._read(name, "n_hidden.txt"))
    bnn, guide, history = uci._train(x_train, y_train, hidden, 1, "default", "reparam", split, epochs, None,
                                     kl_weight="auto")
    pyro.set_rng_seed(split)
    log_lik, _ = uci.test_log_likelihood(bnn, guide, x_test, y_test, y_mean, y_std, num_samples=200)
    return -log_lik, history.kl_weight_choice.kl_weight


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--splits", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    tasks = {"digits MLP": (digits_mlp, 2 if args.quick else 100, 1),
             "boston": (lambda e, s: uci_set("bostonHousing", e, s), 2 if args.quick else 40, args.splits),
             "yacht": (lambda e, s: uci_set("yacht", e, s), 2 if args.quick else 40, args.splits)}
    print("| task | epochs | test NLL (median) | KL weights chosen |")
    print("|---|---|---|---|")
    for name, (run, epochs, repetitions) in tasks.items():
        for factor in FACTORS:
            results = [run(epochs * factor, seed) for seed in range(1 if args.quick else repetitions)]
            nll = statistics.median(r[0] for r in results)
            print(f"| {name} | {epochs * factor} ({factor}x) | {nll:.3f} | "
                  f"{', '.join(f'{r[1]:g}' for r in results)} |", flush=True)


if __name__ == "__main__":
    main()
