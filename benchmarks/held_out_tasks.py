"""The KL weight's selection on tasks no choice was made on: pyro_bbb's defaults against the deterministic twin.

The four tasks are named in ``benchmarks/README.md`` (scikit-learn's bundled breast cancer, wine, iris and diabetes
sets; nothing downloaded). Each repetition splits 80 / 20 by its seed and standardises the inputs (and a regression's
targets) on the training split. A d-100-100-k ReLU net: pyro_bbb's defaults (``BNN`` of ``BayesianLinear`` layers,
``MeanFieldGuide``, ``fit(epochs=100, batch_size=64)``: the KL weight chosen on a split of the training data), the
same at ``kl_weight=1`` (the Bayes posterior), and the deterministic twin (Adam 1e-3, weight decay 1e-4, the same
epochs and batches; a regression's twin learns a Gaussian noise scale with the mean). Reports test accuracy (or
RMSE), NLL per point, ECE (15 bins), training seconds and the chosen weight; medians over the repetitions.

    python benchmarks/held_out_tasks.py             # 5 repetitions (a few minutes on 2 cores)
    python benchmarks/held_out_tasks.py --quick     # smoke run
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import pyro
import torch
from torch import nn

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb.evaluate import metrics
from pyro_bbb.nn import BayesianLinear

COLUMNS = ["score", "NLL", "ECE", "train s"]


def load(name: str):
    """``(x, y, classes)``: inputs, targets (long labels, or float targets), the number of classes (0: regression)."""
    from sklearn import datasets

    loader = {"breast cancer": datasets.load_breast_cancer, "wine": datasets.load_wine, "iris": datasets.load_iris,
              "diabetes": datasets.load_diabetes}[name]
    bunch = loader()
    x = torch.as_tensor(bunch.data, dtype=torch.float32)
    if name == "diabetes":
        return x, torch.as_tensor(bunch.target, dtype=torch.float32), 0
    y = torch.as_tensor(bunch.target, dtype=torch.long)
    return x, y, int(y.max()) + 1


def split(x, y, classes: int, seed: int):
    """80 / 20 by ``seed``; inputs (and a regression's targets) standardised on the training split."""
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(y))
    train, test = order[:cut], order[cut:]
    mean, std = x[train].mean(0), x[train].std(0).clamp_min(1e-6)
    x = (x - mean) / std
    if not classes:
        y = (y - y[train].mean()) / y[train].std()
    return (x[train], y[train]), (x[test], y[test])


def mlp(inputs: int, outputs: int, bayesian: bool) -> nn.Sequential:
    linear = BayesianLinear if bayesian else nn.Linear
    return nn.Sequential(linear(inputs, 100), nn.ReLU(), linear(100, 100), nn.ReLU(), linear(100, outputs))


def deterministic(train, test, classes: int, epochs: int, seed: int) -> dict:
    (x, y), (x_test, y_test) = train, test
    torch.manual_seed(seed)
    net = mlp(x.shape[1], classes or 1, False)
    log_noise = nn.Parameter(torch.zeros(()))
    parameters = list(net.parameters()) + ([] if classes else [log_noise])
    optimizer = torch.optim.Adam(parameters, lr=1e-3, weight_decay=1e-4)
    g = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    for _ in range(epochs):
        for idx in torch.randperm(len(y), generator=g).split(64):
            optimizer.zero_grad()
            out = net(x[idx])
            if classes:
                loss = nn.functional.cross_entropy(out, y[idx])
            else:
                loss = -torch.distributions.Normal(out.squeeze(-1), log_noise.exp()).log_prob(y[idx]).mean()
            loss.backward()
            optimizer.step()
    seconds = time.perf_counter() - start
    with torch.no_grad():
        out = net.eval()(x_test)
    if classes:
        probs = torch.softmax(out, -1)
        prediction = pyro_bbb.prediction.ClassificationPrediction(pyro.distributions.Categorical(probs=probs[None]),
                                                                  torch.zeros(1, len(y_test)))
        return {"score": metrics.accuracy(prediction, y_test), "NLL": -metrics.log_likelihood(prediction, y_test),
                "ECE": metrics.expected_calibration_error(prediction, y_test, num_bins=15), "train s": seconds}
    normal = torch.distributions.Normal(out.squeeze(-1), log_noise.exp().detach())
    return {"score": float((out.squeeze(-1) - y_test).pow(2).mean().sqrt()),
            "NLL": -float(normal.log_prob(y_test).mean()), "ECE": math.nan, "train s": seconds}


def bayesian(train, test, classes: int, epochs: int, seed: int, **options) -> dict:
    (x, y), (x_test, y_test) = train, test
    pyro.clear_param_store()
    torch.manual_seed(seed)
    likelihood = likelihoods.Categorical() if classes else likelihoods.Gaussian()  # (standardised targets)
    bnn = pyro_bbb.BNN(mlp(x.shape[1], classes or 1, True), likelihood)
    guide = pyro_bbb.MeanFieldGuide(bnn)
    start = time.perf_counter()
    history = pyro_bbb.fit(bnn, guide, (x, y), epochs=epochs, batch_size=64, progress=False, seed=seed, **options)
    seconds = time.perf_counter() - start
    pyro.set_rng_seed(seed)
    prediction = pyro_bbb.predict(bnn, guide, x_test, num_samples=100)
    row = {"NLL": -metrics.log_likelihood(prediction, y_test), "train s": seconds,
           "weight": history.kl_weight_choice.kl_weight}
    if classes:
        row |= {"score": metrics.accuracy(prediction, y_test),
                "ECE": metrics.expected_calibration_error(prediction, y_test, num_bins=15)}
    else:
        row |= {"score": metrics.rmse(prediction, y_test), "ECE": math.nan}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--tasks", nargs="*", default=["breast cancer", "wine", "iris", "diabetes"])
    args = parser.parse_args()
    repetitions, epochs = (1, 2) if args.quick else (args.repetitions, 100)
    methods = {"deterministic": None, "pyro_bbb defaults": {}, "pyro_bbb kl_weight=1": {"kl_weight": 1}}
    print("| task | method | accuracy or RMSE | NLL | ECE | train s | KL weights chosen |")
    print("|---|---|---|---|---|---|---|")
    for name in args.tasks:
        x, y, classes = load(name)
        rows = {method: [] for method in methods}
        for seed in range(repetitions):
            train, test = split(x, y, classes, seed)
            for method, options in methods.items():
                rows[method].append(deterministic(train, test, classes, epochs, seed) if options is None
                                    else bayesian(train, test, classes, epochs, seed, **options))
        for method, runs in rows.items():
            cells = [statistics.median(r[c] for r in runs) for c in COLUMNS]
            chosen = ", ".join(f"{r['weight']:g}" for r in runs) if "weight" in runs[0] else ""
            print(f"| {name} | {method} | {cells[0]:.3f} | {cells[1]:.3f} | {cells[2]:.3f} | {cells[3]:.1f} | "
                  f"{chosen} |", flush=True)


if __name__ == "__main__":
    main()
