"""Natural-gradient variational learning (IVON) against Bayes-by-Backprop with Adam, side by side in one run.

Tasks, each with the same model, data, batches and epochs for every contender:

* ``blr``: Bayesian linear regression (fixed noise, N(0, 1) prior, minibatches of 32 with a partial last one), whose
  optimal mean-field Gaussian is known in closed form: the shortest run (each with a geometric rate decay to 1/100,
  ``fit(lr_final=)``) after which every posterior std is within 2% and every mean within 0.1 posterior std of it on
  every seed, for IVON and Adam-BbB at three initial rates each, under reparameterization and local
  reparameterization;
* ``digits``: a 64-100-10 ReLU MLP on scikit-learn's digits: a deterministic net with Adam, Adam-BbB, pyro_bbb's
  IVON, and ``ivon-opt`` 0.1.3 on the deterministic net (the paper's way: predictions average sampled weights) --
  accuracy, NLL, ECE; a reliability diagram and the loss traces;
* ``cnn``: the digits as 8x8 images, a two-convolution CNN: deterministic Adam, Adam-BbB and IVON (reparameterization
  and Flipout) -- accuracy, NLL, ECE;
* ``uci``: the standard splits of UCI boston and concrete (``../shared/uci``), a 1x50 ReLU net with a learned
  homoscedastic noise, test log-likelihood per datum of Adam-BbB and IVON at the same epochs;
* ``rates``: IVON's step size (its default 0.1 and 0.03) beside Adam-BbB on UCI boston, concrete, energy and yacht
  (300 epochs): test log-likelihood and final -ELBO per datum;
* ``init``: the same boston net with MeanFieldGuide's ``init_scale`` at 1e-4, 1e-2 and 0.1: the spread of the final
  test log-likelihood per optimizer;
* ``clusters``: 1-D regression on data no default was tuned on (two clusters of x, a 1-50-50-1 ReLU net, learned
  noise, run to a flat ELBO): test RMSE, epistemic std beyond the data over inside it, the final ELBO per datum;
* ``optimum``: one objective, one optimum -- a 1-20-1 tanh net (fixed noise, full batch) trained with each estimator
  under each optimizer: the final -ELBO (evaluated the same way for all) and the predictive's W2 to Pyro's NUTS;
* ``fixed-point``: the same tanh net, IVON started at Adam's best posterior (moment propagation): does it stay there,
  or leave for a worse ELBO? And IVON from its own start with a larger ``hess_init`` (narrower first widths);
* ``convergence``: epochs until the smoothed ELBO stays within 1% of its converged value (UCI boston, concrete,
  energy; the digits MLP);
* ``report``: the Bayesian-LSTM report's own task (Embedded Reber, LSTM(4) under Flipout, a dense head, fit's
  defaults) at 100 epochs and at half of them.

    python benchmarks/natural_gradient.py                 # all tasks, prints tables, writes natural_gradient_*.png
    python benchmarks/natural_gradient.py --task digits   # one of them
    python benchmarks/natural_gradient.py --quick         # smoke run
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import time
from pathlib import Path

import numpy
import pyro
import torch
import torch.nn.functional as F
from torch import nn

import pyro_bbb
from pyro_bbb import likelihoods, priors
from pyro_bbb.data import digits
from pyro_bbb.evaluate import metrics, plots
from pyro_bbb.nn import BayesianConv2d, BayesianLinear, BayesianLSTM
from pyro_bbb.optim import IVON

HERE = Path(__file__).resolve().parent
UCI = HERE.parent.parent / "shared" / "uci"


# -- Bayesian linear regression against its closed form ------------------------------------------------------------
def linear_problem(n=200, noise=0.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g, dtype=torch.float64) * torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64)
    y = x @ torch.randn(3, generator=g, dtype=torch.float64) + noise * torch.randn(n, generator=g, dtype=torch.float64)
    design = torch.cat([x, torch.ones(n, 1, dtype=torch.float64)], 1)
    precision = design.T @ design / noise**2 + torch.eye(4, dtype=torch.float64)
    return x, y, torch.linalg.solve(precision, design.T @ y / noise**2), 1.0 / precision.diagonal().sqrt()


def blr_run(optimizer_name, estimator, epochs, seed, lr):
    """The final max errors (std relative, mean in posterior stds) after ``epochs`` with a geometric rate decay from
    ``lr`` to ``lr / 100``."""
    x, y, mean, std = linear_problem(seed=seed)
    pyro.clear_param_store()
    bnn = pyro_bbb.BNN(BayesianLinear(3, 1, dtype=torch.float64), likelihoods.Gaussian(scale=0.5))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    if optimizer_name == "IVON":
        options = {"optimizer": IVON(guide, num_data=len(x), lr=lr)}
    else:
        options = {"lr": lr}
    pyro_bbb.fit(bnn, guide, (x, y), epochs=epochs, batch_size=32, estimator=estimator, lr_final=lr / 100,
                 progress=False, seed=seed, **options)
    q = guide.site_posteriors()
    m = torch.cat([q["net.weight"].loc.reshape(-1), q["net.bias"].loc])
    s = torch.cat([q["net.weight"].scale.reshape(-1), q["net.bias"].scale])
    return float((s / std - 1).abs().max()), float(((m - mean) / std).abs().max())


def blr(quick: bool) -> None:
    """Epochs needed for the same accuracy: for each optimizer, estimator and initial rate, runs of increasing length
    (each with its own rate decay), and the shortest after which every seed is within 2% of every closed-form std
    and 0.1 posterior std of every mean."""
    budgets, seeds = ([20, 40], [0]) if quick else ([40, 80, 160, 320, 640], [0, 1, 2])
    contenders = [("Adam-BbB", 3e-2), ("Adam-BbB", 0.1), ("IVON", 0.03), ("IVON", 0.1), ("IVON", 0.3)]
    print(
        f"\nBayesian linear regression (N = 200, batch 32, rate decay to 1/100 over each run): max std error / max mean"
        f" error (in posterior stds) at the end of runs of {budgets} epochs, worst of seeds {seeds}; the shortest run"
        " within 2% / 0.1 on every seed"
    )
    for estimator in ("reparam", "local_reparam"):
        for name, lr in contenders:
            cells, shortest = [], math.inf
            for epochs in budgets:
                errors = [blr_run(name, estimator, epochs, seed, lr) for seed in seeds]
                worst = (max(e[0] for e in errors), max(e[1] for e in errors))
                cells.append(f"{worst[0]:.3f}/{worst[1]:.2f}")
                if worst[0] < 0.02 and worst[1] < 0.1:
                    shortest = min(shortest, epochs)
            print(f"  {name + ' ' + format(lr, 'g') + ' (' + estimator + ')':30s} " + "  ".join(cells)
                  + f"   shortest: {shortest}")


# -- digits: the classifier side by side ----------------------------------------------------------------------------
def mlp(bayesian: bool) -> nn.Module:
    make = BayesianLinear if bayesian else nn.Linear
    return nn.Sequential(make(64, 100), nn.ReLU(), make(100, 10))


def train_deterministic(net: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, batch: int) -> nn.Module:
    """``net`` trained as a classifier with torch's Adam (lr 1e-3) on shuffled minibatches of cross-entropy."""
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(epochs):
        for idx in torch.randperm(len(y)).split(batch):
            optimizer.zero_grad()
            F.cross_entropy(net(x[idx]), y[idx]).backward()
            optimizer.step()
    return net


def digits_contenders(epochs: int, batch: int, seed: int, ivon_lr: float = 0.1):
    import ivon  # the reference implementation: pip install --no-deps ivon-opt==0.1.3

    x_train, y_train, x_test, y_test = digits()
    n = len(y_train)
    results, traces, predictions = {}, {}, {}

    torch.manual_seed(seed)
    net = train_deterministic(mlp(False), x_train, y_train, epochs, batch)
    with torch.no_grad():
        predictions["deterministic Adam"] = net(x_test).softmax(-1)

    torch.manual_seed(seed)
    net = mlp(False)
    reference = ivon.IVON(net.parameters(), lr=0.1, ess=n, beta2=0.99, weight_decay=1.0 / n)
    for _ in range(epochs):
        for idx in torch.randperm(n).split(batch):
            with reference.sampled_params(train=True):
                reference.zero_grad()
                F.cross_entropy(net(x_train[idx]), y_train[idx]).backward()
            reference.step()
    with torch.no_grad():
        draws = []
        for _ in range(32):
            with reference.sampled_params():
                draws.append(net(x_test).softmax(-1))
        predictions["ivon-opt (deterministic net)"] = torch.stack(draws).mean(0)

    for name in ("Adam-BbB", "IVON"):
        pyro.clear_param_store()
        torch.manual_seed(seed)
        bnn = pyro_bbb.BNN(mlp(True), likelihoods.Categorical())
        guide = pyro_bbb.MeanFieldGuide(bnn)
        options = {"optimizer": IVON(guide, num_data=n, lr=ivon_lr)} if name == "IVON" else {"lr": 1e-3}
        start = time.perf_counter()
        history = pyro_bbb.fit(
            bnn, guide, (x_train, y_train), epochs=epochs, batch_size=batch, progress=False, seed=seed, **options
        )
        traces[name] = (history["loss_per_datum"], time.perf_counter() - start)
        pyro.set_rng_seed(seed)
        predictions[name] = pyro_bbb.predict(bnn, guide, x_test, num_samples=32).probs

    for name, probs in predictions.items():
        results[name] = {"-ELBO/datum": traces[name][0][-1] if name in traces else math.nan}
        results[name] |= dict(zip(("accuracy", "NLL", "ECE"), classifier_scores(probs, y_test)))
    return results, traces, predictions, y_test


def digits_task(quick: bool, out: Path, ivon_lr: float = 0.1) -> None:
    epochs, seeds = (3, [0]) if quick else (100, [0, 1, 2])
    print(f"\ndigits, 64-100-10 ReLU MLP, batch 64, {epochs} epochs, IVON lr {ivon_lr:g}, medians over seeds {seeds}")
    runs = [digits_contenders(epochs, 64, seed, ivon_lr) for seed in seeds]
    print(f"  {'':30s} {'accuracy':>9s} {'NLL':>7s} {'ECE':>7s} {'-ELBO/datum':>12s}")
    for name in runs[0][0]:
        keys = ("accuracy", "NLL", "ECE", "-ELBO/datum")
        row = {key: statistics.median(run[0][name][key] for run in runs) for key in keys}
        print(f"  {name:30s} {row['accuracy']:9.4f} {row['NLL']:7.4f} {row['ECE']:7.4f} {row['-ELBO/datum']:12.4f}")
    import matplotlib.pyplot as plt

    results, traces, predictions, y_test = runs[0]
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, (trace, _) in traces.items():
        axes[0].plot(range(1, len(trace) + 1), trace, label=name)
    axes[0].set(xlabel="epoch", ylabel="negative ELBO per datum (nats)", yscale="log", title="loss (seed 0)")
    axes[0].legend()
    for name, probs in predictions.items():
        confidence, guess = probs.max(-1)
        bins = torch.linspace(0, 1, 11)
        index = torch.bucketize(confidence, bins[1:-1])
        centres, accuracy = [], []
        for b in range(10):
            chosen = index == b
            if chosen.any():
                centres.append(float(confidence[chosen].mean()))
                accuracy.append(float((guess[chosen] == y_test[chosen]).float().mean()))
        axes[1].plot(centres, accuracy, "o-", label=name)
    axes[1].plot([0, 1], [0, 1], "k:", lw=1)
    axes[1].set(xlabel="confidence", ylabel="accuracy", title="reliability (seed 0)")
    axes[1].legend(fontsize=8)
    figure.tight_layout()
    plots.save_figure(figure, out / "natural_gradient_digits.png")
    print(f"  wrote {out / 'natural_gradient_digits.png'}")


# -- a small CNN on the 8x8 digits -------------------------------------------------------------------------------------
def cnn(bayesian: bool) -> nn.Module:
    conv, linear = (BayesianConv2d, BayesianLinear) if bayesian else (nn.Conv2d, nn.Linear)
    return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), conv(1, 8, 3, padding=1), nn.ReLU(), conv(8, 16, 3, padding=1),
                         nn.ReLU(), nn.Flatten(), linear(1024, 10))


def cnn_task(quick: bool) -> None:
    """The digits as 8x8 images, a two-convolution CNN: deterministic Adam, Adam-BbB and IVON (plain
    reparameterization and Flipout), batch 64: accuracy, NLL, ECE and the final -ELBO per datum, medians over seeds."""
    epochs, seeds = (2, [0]) if quick else (100, [0, 1, 2])
    x_train, y_train, x_test, y_test = digits()
    n = len(y_train)
    rows: dict[str, list[tuple[float, ...]]] = {}
    for seed in seeds:
        torch.manual_seed(seed)
        net = train_deterministic(cnn(False), x_train, y_train, epochs, 64)
        with torch.no_grad():
            probs = net(x_test).softmax(-1)
        rows.setdefault("deterministic Adam", []).append((*classifier_scores(probs, y_test), math.nan))
        for name, estimator in (("Adam-BbB", "reparam"), ("Adam-BbB", "flipout"), ("IVON", "reparam"),
                                ("IVON", "flipout")):
            pyro.clear_param_store()
            torch.manual_seed(seed)
            bnn = pyro_bbb.BNN(cnn(True), likelihoods.Categorical())
            guide = pyro_bbb.MeanFieldGuide(bnn)
            options = {"optimizer": IVON(guide, num_data=n)} if name == "IVON" else {}
            history = pyro_bbb.fit(bnn, guide, (x_train, y_train), epochs=epochs, batch_size=64, estimator=estimator,
                                   progress=False, seed=seed, **options)
            pyro.set_rng_seed(seed)
            probs = pyro_bbb.predict(bnn, guide, x_test, num_samples=32).probs
            rows.setdefault(f"{name} ({estimator})", []).append(
                (*classifier_scores(probs, y_test), history["loss_per_datum"][-1]))
    print(f"\ndigits as 8x8 images, CNN conv 1->8, conv 8->16 (3x3), linear 1024->10, batch 64, {epochs} epochs, "
          f"medians over seeds {seeds}")
    print(f"  {'':22s} {'accuracy':>9s} {'NLL':>7s} {'ECE':>7s} {'-ELBO/datum':>12s}")
    for name, runs in rows.items():
        accuracy, nll, ece, loss = (statistics.median(r[i] for r in runs) for i in range(4))
        print(f"  {name:22s} {accuracy:9.4f} {nll:7.4f} {ece:7.4f} {loss:12.4f}")


def classifier_scores(probs: torch.Tensor, labels: torch.Tensor) -> tuple[float, float, float]:
    """Accuracy, NLL per datum and expected calibration error of class probabilities ``probs`` (N, C)."""
    nll = float(-probs.clamp_min(1e-12).log().gather(-1, labels[:, None]).mean())
    return metrics.accuracy(probs, labels), nll, metrics.expected_calibration_error(probs, labels)


# -- UCI -------------------------------------------------------------------------------------------------------------
def uci_found(task: str) -> bool:
    """Whether the UCI sets are there (``../shared/uci``); if not, say that ``task`` is skipped."""
    if not UCI.exists():
        print(f"\n{task}: {UCI} not found; skipped")
    return UCI.exists()


def uci_split(name: str, split: int):
    folder = UCI / name
    data = torch.as_tensor(numpy.loadtxt(folder / "data.txt"), dtype=torch.float32)
    train, test = (
        torch.as_tensor(numpy.loadtxt(folder / f"index_{kind}_{split}.txt"), dtype=torch.long)
        for kind in ("train", "test")
    )
    features = numpy.loadtxt(folder / "index_features.txt").astype(int)
    x, y = data[:, features], data[:, int(numpy.loadtxt(folder / "index_target.txt"))]
    mx, sx = x[train].mean(0), x[train].std(0).clamp_min(1e-6)
    my, sy = y[train].mean(), y[train].std()
    return (x[train] - mx) / sx, (y[train] - my) / sy, (x[test] - mx) / sx, y[test], my, sy


def uci_run(name, split, optimizer_name, epochs, init_scale=None, prior=None, estimator="reparam", ivon_lr=0.1):
    x, y, x_test, y_test, my, sy = uci_split(name, split)
    pyro.clear_param_store()
    torch.manual_seed(split)
    layer_prior = lambda: priors.EmpiricalBayesNormal() if prior == "eb" else None  # noqa: E731
    net = nn.Sequential(BayesianLinear(x.shape[1], 50, prior=layer_prior()), nn.ReLU(),
                        BayesianLinear(50, 1, prior=layer_prior()))
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian())
    guide = pyro_bbb.MeanFieldGuide(bnn, init_scale=init_scale)
    options = {"optimizer": IVON(guide, num_data=len(y), lr=ivon_lr)} if optimizer_name == "IVON" else {}
    history = pyro_bbb.fit(bnn, guide, (x, y), epochs=epochs, batch_size=32, progress=False, seed=split,
                           estimator=estimator, **options)
    pyro.set_rng_seed(0)
    pred = pyro_bbb.predict(bnn, guide, x_test, num_samples=100)
    return metrics.log_likelihood(pred, (y_test - my) / sy) - math.log(float(sy)), history.last["loss_per_datum"]


def uci(quick: bool, estimator: str = "reparam") -> None:
    if not uci_found("UCI"):
        return
    epochs, splits = (5, [0]) if quick else (40, [0, 1, 2])
    print(
        f"\nUCI, 1x50 ReLU, learned noise, batch 32, estimator {estimator}, fit defaults otherwise: test log-lik "
        f"per datum, mean over splits {splits}"
    )
    for prior in ("normal", "eb"):
        print(f"  weight prior: {'N(0, 1)' if prior == 'normal' else 'EmpiricalBayesNormal (closed-form scale)'}")
        for name in ("bostonHousing", "concrete"):
            for epochs_here in [epochs] if quick else [40, 300]:
                runs = {o: [uci_run(name, s, o, epochs_here, prior=prior, estimator=estimator) for s in splits]
                        for o in ("Adam-BbB", "IVON")}
                row = {o: [statistics.mean(r[i] for r in rs) for i in (0, 1)] for o, rs in runs.items()}
                print(
                    f"  {name:14s} {epochs_here:4d} epochs  test log-lik: Adam-BbB {row['Adam-BbB'][0]:7.3f}, IVON "
                    f"{row['IVON'][0]:7.3f};  final -ELBO/datum (standardised y): Adam-BbB {row['Adam-BbB'][1]:7.3f}, "
                    f"IVON {row['IVON'][1]:7.3f}"
                )


def rates(quick: bool) -> None:
    """IVON's step size on four UCI sets (two of them, energy and yacht, in no other task here), beside Adam-BbB."""
    if not uci_found("rates"):
        return
    epochs, splits = (5, [0]) if quick else (300, [0, 1, 2])
    print(f"\nIVON's step size, UCI 1x50 ReLU, learned noise, batch 32, {epochs} epochs: test log-lik (final -ELBO per "
          f"datum), mean over splits {splits}")
    for name in ("bostonHousing", "concrete", "energy", "yacht"):
        cells = []
        for label, optimizer, lr in (("Adam-BbB", "Adam-BbB", None), ("IVON 0.1", "IVON", 0.1),
                                     ("IVON 0.03", "IVON", 0.03)):
            runs = [uci_run(name, s, optimizer, epochs, ivon_lr=lr) for s in splits]
            log_lik, loss = (statistics.mean(r[i] for r in runs) for i in (0, 1))
            cells.append(f"{label} {log_lik:7.3f} ({loss:.3f})")
        print(f"  {name:14s} " + "   ".join(cells))


# -- init sensitivity ------------------------------------------------------------------------------------------------
def init_sensitivity(quick: bool) -> None:
    """UCI boston, splits 0-2: the final test log-likelihood for MeanFieldGuide's init_scale 1e-4, 1e-2 and 0.1."""
    if not uci_found("init"):
        return
    epochs, splits = (3, [0]) if quick else (100, [0, 1, 2])
    print(f"\ninit_scale sensitivity, UCI boston, 1x50 ReLU, {epochs} epochs, batch 32: test log-likelihood, mean over "
          f"splits {splits}")
    for name in ("Adam-BbB", "IVON"):
        scores = {scale: statistics.mean(uci_run("bostonHousing", s, name, epochs, init_scale=scale)[0] for s in splits)
                  for scale in (1e-4, 1e-2, 0.1)}
        cells = ", ".join(f"{scale:g}: {value:.3f}" for scale, value in scores.items())
        print(f"  {name:9s} {cells}   spread {max(scores.values()) - min(scores.values()):.3f}")


# -- 1-D regression on data nothing was tuned on ----------------------------------------------------------------------
def clusters_data(n: int, seed: int):
    """y = sin(2x) + 0.3x + N(0, 0.1^2) on two clusters of x, [-3, -1.5] and [0.5, 2]."""
    g = torch.Generator().manual_seed(seed)
    left = torch.rand(n // 2, 1, generator=g) * 1.5 - 3.0
    right = torch.rand(n - n // 2, 1, generator=g) * 1.5 + 0.5
    x = torch.cat([left, right])
    y = torch.sin(2 * x).squeeze(-1) + 0.3 * x.squeeze(-1) + 0.1 * torch.randn(n, generator=g)
    return x, y


def clusters_run(optimizer_name: str, epochs: int, seed: int, estimator: str = "reparam", ivon_lr: float = 0.1):
    x, y = clusters_data(300, seed)
    x_test, y_test = clusters_data(1000, seed + 100)
    pyro.clear_param_store()
    torch.manual_seed(seed)
    net = nn.Sequential(BayesianLinear(1, 50), nn.ReLU(), BayesianLinear(50, 50), nn.ReLU(), BayesianLinear(50, 1))
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian())
    guide = pyro_bbb.MeanFieldGuide(bnn)
    options = {"optimizer": IVON(guide, num_data=len(y), lr=ivon_lr)} if optimizer_name == "IVON" else {}
    history = pyro_bbb.fit(bnn, guide, (x, y), epochs=epochs, batch_size=32, progress=False, seed=seed,
                           estimator=estimator, **options)
    pred = pyro_bbb.predict(bnn, guide, x_test, num_samples=200)
    grid = torch.linspace(-5, 4, 901).unsqueeze(-1)
    band = pyro_bbb.predict(bnn, guide, grid, num_samples=200).epistemic_std
    g = grid.squeeze(-1)
    inside = ((g >= -3) & (g <= -1.5)) | ((g >= 0.5) & (g <= 2))
    outside = (g <= -4) | (g >= 3)
    return {"rmse": metrics.rmse(pred, y_test), "ratio": float(band[outside].mean() / band[inside].mean()),
            "elbo": -history.last["loss_per_datum"], "drift": history.drift()}


def clusters(quick: bool, estimator: str = "reparam", ivon_lr: float = 0.1) -> None:
    epochs, seeds = (5, [0]) if quick else (1000, [0, 1, 2])
    print(f"\n1-D regression, two clusters (data not tuned on), 1-50-50-1 ReLU, learned noise, {epochs} epochs, "
          f"batch 32, estimator {estimator}, fit defaults (IVON lr {ivon_lr:g}): medians over seeds {seeds}")
    for name in ("Adam-BbB", "IVON"):
        runs = [clusters_run(name, epochs, seed, estimator, ivon_lr) for seed in seeds]
        cells = "  ".join(f"{key} {statistics.median(r[key] for r in runs):.3f}" for key in runs[0])
        print(f"  {name:9s} {cells}")


# -- one objective, one optimum: the estimators under each optimizer, against NUTS ------------------------------------
def optimum_data(seed: int = 0):
    """100 training points, y = sin(2x) + N(0, 0.1^2) with x uniform on [-2, 2]; 61 test inputs on [-3, 3]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(100, 1, generator=g) * 4 - 2
    y = torch.sin(2 * x).squeeze(-1) + 0.1 * torch.randn(100, generator=g)
    return x, y, torch.linspace(-3, 3, 61).unsqueeze(-1)


def tanh_bnn():
    net = nn.Sequential(BayesianLinear(1, 20), nn.Tanh(), BayesianLinear(20, 1))
    return pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.1))


def function_draws(bnn, draws: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The network's output at ``x`` (S, N) for each of S weight draws ``{site: (S, ...)}``."""
    count = len(next(iter(draws.values())))
    rows = []
    for i in range(count):
        trace = pyro.poutine.trace(pyro.poutine.condition(bnn, data={k: v[i] for k, v in draws.items()})).get_trace(x)
        rows.append(trace.nodes["y"]["fn"].mean.reshape(-1))
    return torch.stack(rows)


def w2(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean over test inputs of the 1-D Wasserstein-2 distance between two sets of draws (S, N), by quantiles."""
    q = torch.linspace(0.005, 0.995, 199)
    return float(((torch.quantile(a, q, dim=0) - torch.quantile(b, q, dim=0)) ** 2).mean(0).sqrt().mean())


def nuts_reference(x, y, x_test, quick: bool) -> torch.Tensor:
    from pyro.infer import MCMC, NUTS

    logging.getLogger("pyro").setLevel(logging.WARNING)  # NUTS and vectorized particles guess the plate nesting aloud

    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    bnn = tanh_bnn()
    warmup, samples = (10, 10) if quick else (400, 400)
    mcmc = MCMC(NUTS(bnn, jit_compile=not quick, ignore_jit_warnings=True), num_samples=samples, warmup_steps=warmup,
                disable_progbar=True)
    mcmc.run(x, y)
    return function_draws(bnn, mcmc.get_samples(), x_test)


def negative_elbo(bnn, guide, x, y) -> float:
    """The -ELBO every posterior here is scored by: 10,000 reparameterized draws (one objective for all)."""
    pyro.set_rng_seed(0)
    elbo = pyro_bbb.ELBO(num_data=len(y), num_particles=1000, vectorize_particles=True)
    with torch.no_grad():
        return statistics.mean(elbo.loss(bnn, guide, x, y) for _ in range(10))


def optimum_fit(optimizer_name: str, estimator: str, epochs: int, seed: int, x, y, hess_init: float = 1.0):
    """The tanh net and its guide trained with ``optimizer_name`` and ``estimator`` (Adam 1e-2 -> 1e-3, IVON 0.1 ->
    1e-2, full batch)."""
    pyro.clear_param_store()
    torch.manual_seed(seed)
    bnn = tanh_bnn()
    guide = pyro_bbb.MeanFieldGuide(bnn)
    if optimizer_name == "IVON":
        options = {"optimizer": IVON(guide, num_data=len(y), lr=0.1, hess_init=hess_init), "lr_final": 1e-2}
    else:
        options = {"lr": 1e-2, "lr_final": 1e-3}
    pyro_bbb.fit(bnn, guide, (x, y), epochs=epochs, batch_size=len(y), estimator=estimator, progress=False, seed=seed,
                 **options)
    return bnn, guide


def optimum_run(optimizer_name: str, estimator: str, epochs: int, seed: int, x, y, x_test, hess_init: float = 1.0):
    bnn, guide = optimum_fit(optimizer_name, estimator, epochs, seed, x, y, hess_init)
    with torch.no_grad():
        draws = {k: q.sample((1000,)) for k, q in guide.site_posteriors().items()}
    return negative_elbo(bnn, guide, x, y), function_draws(bnn, draws, x_test)


def optimum(quick: bool) -> None:
    """The 1-20-1 tanh net (fixed noise 0.1, N(0, 1) prior, full batch): the final -ELBO of every estimator under
    each optimizer (one objective, evaluated the same way), and the test-point W2 of its predictive mean function to
    a NUTS reference."""
    epochs, seeds = (20, [0]) if quick else (5000, [0, 1, 2])
    x, y, x_test = optimum_data()
    reference = nuts_reference(x, y, x_test, quick)
    print(f"\nOne objective: 1-20-1 tanh, 100 points, noise 0.1, N(0, 1) prior, full batch, {epochs} epochs "
          f"(Adam 1e-2 -> 1e-3; IVON 0.1 -> 1e-2); -ELBO by 10,000 reparameterized draws; W2 of f(x*) to NUTS "
          f"(400 + 400); medians over seeds {seeds}")
    for name in ("Adam-BbB", "IVON"):
        for estimator in ("reparam", "flipout", "moments"):
            runs = [optimum_run(name, estimator, epochs, seed, x, y, x_test) for seed in seeds]
            loss = statistics.median(r[0] for r in runs)
            distance = statistics.median(w2(r[1], reference) for r in runs)
            print(f"  {name:9s} {estimator:8s} -ELBO {loss:8.1f}   W2 to NUTS {distance:.3f}")


def fixed_point(quick: bool) -> None:
    """Is the best posterior found (Adam with moment propagation) a fixed point of IVON? IVON starts there
    (``keep_widths=True``: its curvature read off the widths) and runs on at a constant rate; then IVON from
    its own start with ``hess_init`` 10 (first widths sqrt(10) times narrower) instead of 1."""
    epochs, more, seeds = (20, 10, [0]) if quick else (5000, 2000, [0, 1, 2])
    x, y, x_test = optimum_data()
    n = len(y)
    bnn, guide = optimum_fit("Adam-BbB", "moments", epochs, 0, x, y)
    store = pyro.get_param_store()
    start = {name: value.detach().clone() for name, value in store.named_parameters()}
    print(f"\nIVON started at Adam's best posterior (tanh net, moment propagation, {epochs} epochs, seed 0): -ELBO "
          f"{negative_elbo(bnn, guide, x, y):.1f}; IVON from there, {more} epochs at a constant rate:")
    for estimator, lr in (("reparam", 0.1), ("reparam", 0.01), ("moments", 0.1)):
        with torch.no_grad():
            for name, value in store.named_parameters():
                value.copy_(start[name])
        optimizer = IVON(guide, num_data=n, lr=lr, keep_widths=True)  # its curvature read off the widths
        pyro_bbb.fit(bnn, guide, (x, y), epochs=more, batch_size=n, estimator=estimator, optimizer=optimizer,
                     progress=False, seed=0)
        print(f"  {estimator:8s} lr {lr:<5g} -ELBO {negative_elbo(bnn, guide, x, y):.1f}")
    print(f"IVON from its own start, hess_init 10 (the optimum task's schedule, {epochs} epochs), medians over seeds "
          f"{seeds}:")
    for estimator in ("reparam", "flipout", "moments"):
        runs = [optimum_run("IVON", estimator, epochs, seed, x, y, x_test, hess_init=10.0) for seed in seeds]
        print(f"  {estimator:8s} -ELBO {statistics.median(r[0] for r in runs):.1f}")


# -- the Bayesian-LSTM report's own experiment -------------------------------------------------------------------------
def report_run(optimizer_name: str, epochs: int, seed: int, x, y, validation) -> float:
    pyro.clear_param_store()
    torch.manual_seed(seed)
    from reber_convergence import Classifier  # (this folder's: read the string, classify from its last step)

    bnn = pyro_bbb.BNN(Classifier(BayesianLSTM(7, 4, batch_first=True), nn.Linear(4, 1)), likelihoods.Bernoulli())
    guide = pyro_bbb.MeanFieldGuide(bnn)
    options = {"optimizer": IVON(guide, num_data=len(y))} if optimizer_name == "IVON" else {}
    history = pyro_bbb.fit(bnn, guide, (x, y), epochs=epochs, batch_size=32, estimator="flipout",
                           validation_data=validation, progress=False, seed=seed, **options)
    return history.last["val_accuracy"]


def report(quick: bool) -> None:
    """The report's task: Embedded Reber strings of up to 12 symbols (5000 to train, 1000 to validate), a Bayesian
    LSTM(4) under Flipout with a deterministic dense head, batches of 32, fit's defaults otherwise (Adam 1e-3, no
    clipping, no warm-up): final validation accuracy per seed at 100 epochs and at half of them."""
    from pyro_bbb.data import embedded_reber

    epochs, seeds = (2, [0]) if quick else (100, [0, 1, 2])
    x, y = embedded_reber(5000, seed=0)
    validation = embedded_reber(1000, seed=1)
    print(f"\nThe report's experiment: ERG (<= 12 symbols, 5000 strings), Bayesian LSTM(4) Flipout + dense head, batch "
          f"32, fit defaults; final validation accuracy, seeds {seeds}")
    for name in ("Adam-BbB", "IVON"):
        for epochs_here in (epochs, max(1, epochs // 2)):
            runs = [report_run(name, epochs_here, seed, x, y, validation) for seed in seeds]
            print(f"  {name:9s} {epochs_here:4d} epochs: " + ", ".join(f"{a:.3f}" for a in runs))


# -- epochs to a converged ELBO ---------------------------------------------------------------------------------------
def epochs_to_converge(losses: list[float], window: int = 10, tolerance: float = 0.01) -> int:
    """The first epoch from which the loss's moving average over ``window`` epochs stays within ``tolerance`` (relative)
    of its converged value, the mean of the last 10% of the epochs.

    >>> epochs_to_converge([10.0, 5.0, 2.0] + [1.0] * 47, window=1)
    4
    """
    smooth = numpy.convolve(losses, numpy.ones(window) / window, mode="valid")
    final = float(numpy.mean(losses[-max(1, len(losses) // 10):]))
    outside = numpy.nonzero(numpy.abs(smooth - final) > tolerance * abs(final))[0]
    first = int(outside[-1] + 1 + window) if len(outside) else window
    return first if first <= len(losses) else math.inf  # (inf: still moving at the end)


def epochs_to_reach(losses: list[float], target: float, window: int = 10) -> int:
    """The first epoch at which the loss's moving average over ``window`` epochs is at or below ``target`` (inf: never).

    >>> epochs_to_reach([5.0, 4.0, 3.0, 2.0], 3.0, window=1)
    3
    """
    smooth = numpy.convolve(losses, numpy.ones(window) / window, mode="valid")
    below = numpy.nonzero(smooth <= target)[0]
    return int(below[0] + window) if len(below) else math.inf


def convergence_run(task: str, optimizer_name: str, epochs: int, seed: int) -> list[float]:
    pyro.clear_param_store()
    torch.manual_seed(seed)
    if task == "digits":
        x, y, _, _ = digits()
        bnn, batch = pyro_bbb.BNN(mlp(True), likelihoods.Categorical()), 64
    else:
        x, y = uci_split(task, seed)[:2]
        net = nn.Sequential(BayesianLinear(x.shape[1], 50), nn.ReLU(), BayesianLinear(50, 1))
        bnn, batch = pyro_bbb.BNN(net, likelihoods.Gaussian()), 32
    guide = pyro_bbb.MeanFieldGuide(bnn)
    options = {"optimizer": IVON(guide, num_data=len(y))} if optimizer_name == "IVON" else {}
    history = pyro_bbb.fit(bnn, guide, (x, y), epochs=epochs, batch_size=batch, progress=False, seed=seed, **options)
    return history["loss_per_datum"]


def convergence(quick: bool) -> None:
    """Epochs until the ELBO (smoothed over 10 epochs) stays within 1% of its converged value (the mean of the last
    10% of a long run), fit's defaults otherwise; UCI splits / digits seeds 0-2; and the epoch from which IVON's
    smoothed ELBO is at or below Adam-BbB's converged value in the same split / seed."""
    epochs, seeds = (12, [0]) if quick else (400, [0, 1, 2])
    tasks = ["bostonHousing", "concrete", "energy", "digits"] if UCI.exists() else ["digits"]
    print(f"\nEpochs until the smoothed -ELBO stays within 1% of its converged value ({epochs}-epoch runs, fit "
          f"defaults; seeds/splits {seeds}): medians, each run's in brackets")
    for task in tasks:
        cells, losses = [], {}
        for name in ("Adam-BbB", "IVON"):
            losses[name] = runs = [convergence_run(task, name, epochs, seed) for seed in seeds]
            counts = [epochs_to_converge(r) for r in runs]
            finals = [statistics.mean(r[-max(1, len(r) // 10):]) for r in runs]
            each = ", ".join(f"{c:.0f}" for c in counts)
            cells.append(f"{name} {statistics.median(counts):5.0f} ({each}), final -ELBO/datum "
                         f"{statistics.median(finals):.3f}")
        passing = [epochs_to_reach(ivon, statistics.mean(adam[-max(1, len(adam) // 10):]))
                   for adam, ivon in zip(losses["Adam-BbB"], losses["IVON"])]
        cells.append("IVON below Adam-BbB's final -ELBO from epoch " + ", ".join(f"{c:.0f}" for c in passing))
        print(f"  {task:14s} " + ";  ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--task", default="all",
                        choices=["blr", "digits", "cnn", "uci", "rates", "init", "clusters", "optimum", "fixed-point",
                                 "report", "convergence", "all"])
    parser.add_argument("--out-dir", type=Path, default=HERE)
    parser.add_argument("--estimator", default="reparam", choices=["reparam", "flipout", "local_reparam", "moments"],
                        help="the gradient estimator of the uci and clusters tasks (both optimizers)")
    parser.add_argument("--ivon-lr", type=float, default=0.1, help="IVON's step size in the digits and clusters tasks")
    args = parser.parse_args()
    if args.task in ("blr", "all"):
        blr(args.quick)
    if args.task in ("digits", "all"):
        digits_task(args.quick, args.out_dir, args.ivon_lr)
    if args.task in ("cnn", "all"):
        cnn_task(args.quick)
    if args.task in ("uci", "all"):
        uci(args.quick, args.estimator)
    if args.task in ("rates", "all"):
        rates(args.quick)
    if args.task in ("init", "all"):
        init_sensitivity(args.quick)
    if args.task in ("clusters", "all"):
        clusters(args.quick, args.estimator, args.ivon_lr)
    if args.task in ("optimum", "all"):
        optimum(args.quick)
    if args.task in ("fixed-point", "all"):
        fixed_point(args.quick)
    if args.task in ("report", "all"):
        report(args.quick)
    if args.task in ("convergence", "all"):
        convergence(args.quick)


if __name__ == "__main__":
    main()
