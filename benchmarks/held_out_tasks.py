"""The KL weight's selection on tasks no choice was made on: pyro_bbb's defaults against the deterministic twin and
bayesian-torch's recipes.

The tasks are named in ``benchmarks/README.md`` before their results were seen: scikit-learn's bundled breast cancer,
wine, iris and diabetes sets, then four more sets drawn from scikit-learn's generators with fixed seeds (the second
to fifth sets of that page: 14 tasks, each set named before its results were seen); nothing downloaded. Each
repetition splits 80 / 20 by its seed and standardises the inputs (and a regression's targets) on the training split.
A d-100-100-k ReLU net: pyro_bbb's defaults (``BNN`` of ``BayesianLinear`` layers, ``MeanFieldGuide``,
``fit(epochs=100, batch_size=64)``: the KL weight chosen on a split of the training data), the same at
``kl_weight=1`` (the Bayes posterior), the deterministic twin (Adam 1e-3, weight decay 1e-4, the same epochs and
batches; a regression's twin learns a Gaussian noise scale with the mean), and bayesian-torch 0.5's README recipe and
MOPED flow on the same net (a benchmark dependency only: ``pip install bayesian-torch==0.5.0 --no-deps``). Reports
test accuracy (or RMSE), NLL per point, ECE (15 bins), training seconds, those seconds over a 5-net ensemble's (five
times the twin's in the same repetition; with the deterministic rows) and the chosen weight; medians over the
repetitions.

    python benchmarks/held_out_tasks.py             # every task, 5 repetitions (about 25 minutes on 2 cores)
    python benchmarks/held_out_tasks.py --quick     # smoke run
    python benchmarks/held_out_tasks.py --tasks blobs linear --methods deterministic "pyro_bbb defaults"
    python benchmarks/held_out_tasks.py --methods "pyro_bbb defaults" --lr 1e-3 3e-3 1e-2   # fit's learning rate
    python benchmarks/held_out_tasks.py --methods "pyro_bbb defaults" --folds 1 2   # cross-fitting's selection
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import math
import statistics
import time

import pyro
import torch
from baselines import bayesian_torch_flow
from torch import nn

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb.evaluate import metrics
from pyro_bbb.nn import BayesianLinear
from pyro_bbb.train import SelectKLWeight

COLUMNS = ["score", "NLL", "ECE", "train s"]


def load(name: str):
    """``(x, y, classes)``: inputs, targets (long labels, or float targets), the number of classes (0: regression)."""
    from sklearn import datasets

    generated = {  # scikit-learn's generators, fixed seeds: (x, y)
        "friedman": lambda: datasets.make_friedman1(n_samples=600, n_features=10, noise=1.0, random_state=0),
        "four classes": lambda: datasets.make_classification(
            n_samples=1200, n_features=20, n_informative=8, n_redundant=4, n_classes=4, flip_y=0.05,
            random_state=0),
        "moons": lambda: datasets.make_moons(n_samples=500, noise=0.3, random_state=0),
        # the third set, named for the MAP warm start's proof
        "hastie": lambda: datasets.make_hastie_10_2(n_samples=1000, random_state=1),
        "quantiles": lambda: datasets.make_gaussian_quantiles(n_samples=900, n_features=6, n_classes=3,
                                                              random_state=1),
        "friedman3": lambda: datasets.make_friedman3(n_samples=600, noise=0.1, random_state=1),
        # the fourth set, named for the selection's validation fraction
        "circles": lambda: datasets.make_circles(n_samples=600, noise=0.2, factor=0.5, random_state=2),
        "noisy three": lambda: datasets.make_classification(
            n_samples=1000, n_features=15, n_informative=6, n_redundant=3, n_classes=3, flip_y=0.1, random_state=2),
        "friedman2": lambda: datasets.make_friedman2(n_samples=600, noise=100.0, random_state=2),
        "sparse": lambda: datasets.make_sparse_uncorrelated(n_samples=600, n_features=10, random_state=2),
        # the fifth set, named for cross-fitting's proof
        "blobs": lambda: datasets.make_blobs(n_samples=600, centers=4, n_features=5, cluster_std=2.5, random_state=3),
        "three classes": lambda: datasets.make_classification(
            n_samples=800, n_features=12, n_informative=5, n_classes=3, flip_y=0.05, random_state=3),
        "linear": lambda: datasets.make_regression(n_samples=500, n_features=8, n_informative=5, noise=20.0,
                                                   random_state=3),
        "friedman b": lambda: datasets.make_friedman1(n_samples=500, n_features=10, noise=0.5, random_state=3),
        # the sixth set, named for the short fits' warm start (run with --epochs 10 20)
        "swiss roll": lambda: datasets.make_swiss_roll(n_samples=800, noise=0.5, random_state=4),
        "s curve": lambda: datasets.make_s_curve(n_samples=600, noise=0.3, random_state=4),
        "five classes": lambda: datasets.make_classification(
            n_samples=1000, n_features=16, n_informative=6, n_redundant=2, n_classes=5, flip_y=0.03, random_state=4),
        "two classes": lambda: datasets.make_classification(
            n_samples=600, n_features=8, n_informative=3, n_redundant=1, n_classes=2, class_sep=0.8, flip_y=0.05,
            random_state=4),
    }
    if name in generated:
        data, target = generated[name]()
    else:
        loader = {"breast cancer": datasets.load_breast_cancer, "wine": datasets.load_wine,
                  "iris": datasets.load_iris, "diabetes": datasets.load_diabetes}[name]
        data, target = loader(return_X_y=True)
    x = torch.as_tensor(data, dtype=torch.float32)
    if name in ("diabetes", "friedman", "friedman3", "friedman2", "sparse", "linear", "friedman b", "swiss roll",
                "s curve"):
        return x, torch.as_tensor(target, dtype=torch.float32), 0
    y = torch.as_tensor(target > 0 if name == "hastie" else target, dtype=torch.long)  # hastie's labels are -1, 1
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


def mlp(inputs: int, outputs: int, bayesian: bool, prior=None) -> nn.Sequential:
    linear = functools.partial(BayesianLinear, prior=prior) if bayesian else nn.Linear
    return nn.Sequential(linear(inputs, 100), nn.ReLU(), linear(100, 100), nn.ReLU(), linear(100, outputs))


def train_net(net: nn.Module, x, y, classes: int, epochs: int, seed: int, kl=None, batch_size: int = 64):
    """Adam 1e-3 over batches of ``batch_size`` of the mean NLL (a regression's learns a Gaussian noise scale too),
    plus ``kl(net) / batch_size`` when given (bayesian-torch's README recipe); returns the noise scale's log."""
    log_noise = nn.Parameter(torch.zeros(()))
    parameters = list(net.parameters()) + ([] if classes else [log_noise])
    optimizer = torch.optim.Adam(parameters, lr=1e-3, weight_decay=0.0 if kl else 1e-4)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(y), generator=g).split(batch_size):
            optimizer.zero_grad()
            out = net(x[idx])
            if classes:
                loss = nn.functional.cross_entropy(out, y[idx])
            else:
                loss = -torch.distributions.Normal(out.squeeze(-1), log_noise.exp()).log_prob(y[idx]).mean()
            if kl is not None:
                loss = loss + kl(net) / batch_size
            loss.backward()
            optimizer.step()
    return log_noise.detach()


@torch.no_grad()
def scores(outputs: torch.Tensor, log_noise, y_test, classes: int) -> dict:
    """Test scores of ``outputs`` (draws x rows x outputs; one draw for a deterministic net), averaged as a mixture."""
    if classes:
        probs = torch.softmax(outputs, -1).mean(0)
        prediction = pyro_bbb.prediction.ClassificationPrediction(pyro.distributions.Categorical(probs=probs[None]),
                                                                  torch.zeros(1, len(y_test)))
        return {"score": metrics.accuracy(prediction, y_test), "NLL": -metrics.log_likelihood(prediction, y_test),
                "ECE": metrics.expected_calibration_error(prediction, y_test, num_bins=15)}
    means = outputs.squeeze(-1)
    log_density = torch.distributions.Normal(means, log_noise.exp()).log_prob(y_test)
    nll = -float((log_density.logsumexp(0) - math.log(len(means))).mean())
    return {"score": float((means.mean(0) - y_test).pow(2).mean().sqrt()), "NLL": nll, "ECE": math.nan}


def deterministic(train, test, classes: int, epochs: int, seed: int) -> dict:
    (x, y), (x_test, y_test) = train, test
    torch.manual_seed(seed)
    net = mlp(x.shape[1], classes or 1, False)
    start = time.perf_counter()
    log_noise = train_net(net, x, y, classes, epochs, seed)
    seconds = time.perf_counter() - start
    return scores(net.eval()(x_test)[None], log_noise, y_test, classes) | {"train s": seconds}


def bayesian_torch_recipe(train, test, classes: int, epochs: int, seed: int, moped: bool = False) -> dict:
    """bayesian-torch's README recipe: ``dnn_to_bnn`` of the twin's net, loss = NLL + ``get_kl_loss / batch_size``,
    100 draws averaged; with ``moped``, its MOPED flow: train the twin, start the posterior at its weights (widths
    ``delta |w|``), fine-tune 20 epochs. A benchmark dependency only (``pip install bayesian-torch==0.5.0 --no-deps``).
    """
    (x, y), (x_test, y_test) = train, test
    torch.manual_seed(seed)
    net = mlp(x.shape[1], classes or 1, False)
    start = time.perf_counter()
    log_noise = bayesian_torch_flow(net, lambda n, e, kl: train_net(n, x, y, classes, e, seed, kl=kl), epochs, moped)
    seconds = time.perf_counter() - start
    torch.manual_seed(seed)
    with torch.no_grad():
        outputs = torch.stack([net(x_test) for _ in range(100)])
    return scores(outputs, log_noise, y_test, classes) | {"train s": seconds}


#: ``--prior``'s choices: the layers' default (He-scaled weights, N(0, 1) biases) and N(0, 1) on every weight.
PRIORS = {"default": None, "normal": pyro_bbb.priors.Normal(0.0, 1.0)}


def bayesian(train, test, classes: int, epochs: int, seed: int, prior: str = "default",
             init_scale: float | None = None, folds: int = 1, min_warm_start: int | None = None, **options) -> dict:
    (x, y), (x_test, y_test) = train, test
    selection = {"folds": folds} if folds != 1 else {}  # cross-fitting: the path on `folds` held-out splits
    if min_warm_start is not None:  # the short fits' warm start (min_warm_start 1: a quarter of the epochs, as before)
        selection["min_warm_start_epochs"] = min_warm_start
    if selection and "kl_weight" not in options:
        options["kl_weight"] = SelectKLWeight(**selection)
    pyro.clear_param_store()
    torch.manual_seed(seed)
    likelihood = likelihoods.Categorical() if classes else likelihoods.Gaussian()  # (standardised targets)
    bnn = pyro_bbb.BNN(mlp(x.shape[1], classes or 1, True, PRIORS[prior]), likelihood)
    guide = pyro_bbb.MeanFieldGuide(bnn, init_scale=init_scale)
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


TASKS = ["breast cancer", "wine", "iris", "diabetes", "friedman", "four classes", "moons", "hastie", "quantiles",
         "friedman3", "circles", "noisy three", "friedman2", "sparse", "blobs", "three classes", "linear", "friedman b"]
METHODS = {"deterministic": deterministic, "pyro_bbb defaults": bayesian,
           "pyro_bbb kl_weight=1": functools.partial(bayesian, kl_weight=1),
           "bayesian-torch README": bayesian_torch_recipe,
           "bayesian-torch MOPED": functools.partial(bayesian_torch_recipe, moped=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--tasks", nargs="*", default=TASKS)
    parser.add_argument("--methods", nargs="*", default=list(METHODS))
    parser.add_argument("--lr", nargs="+", type=float, default=None,
                        help="pyro_bbb's rows at each of these fit(lr=...) (default: fit's own)")
    parser.add_argument("--prior", nargs="+", choices=sorted(PRIORS), default=None,
                        help="pyro_bbb's rows with each of these layer priors (default: the layers' own)")
    parser.add_argument("--init-scale", nargs="+", type=float, default=None,
                        help="pyro_bbb's rows at each of these MeanFieldGuide(init_scale=...) (default: its own)")
    parser.add_argument("--folds", nargs="+", type=int, default=None,
                        help="the defaults' selection with each of these SelectKLWeight(folds=...) (default: 1)")
    parser.add_argument("--min-warm-start", nargs="+", type=int, default=None,
                        help="the defaults' selection with each of these SelectKLWeight(min_warm_start_epochs=...)")
    parser.add_argument("--epochs", nargs="+", type=int, default=[100], help="fit's epochs (each in turn)")
    args = parser.parse_args()
    methods = {}
    for method in args.methods:  # pyro_bbb's rows once per setting asked for
        if not method.startswith("pyro_bbb"):
            methods[method] = METHODS[method]
            continue
        variants = {method: {}}
        for name, values in (("lr", args.lr), ("prior", args.prior), ("init_scale", args.init_scale),
                             ("folds", args.folds), ("min_warm_start", args.min_warm_start)):
            if values:
                variants = {f"{label}, {name} {value:g}" if isinstance(value, float) else f"{label}, {name} {value}":
                            settings | {name: value} for label, settings in variants.items() for value in values}
        methods |= {label: functools.partial(METHODS[method], **settings) for label, settings in variants.items()}
    repetitions, epoch_counts = (1, [2]) if args.quick else (args.repetitions, args.epochs)
    if importlib.util.find_spec("bayesian_torch") is None:
        methods = {m: run for m, run in methods.items() if not m.startswith("bayesian-torch")}
        print("(bayesian-torch is not installed: its rows are left out; pip install bayesian-torch==0.5.0 --no-deps)")
    for epochs in epoch_counts:
        if len(epoch_counts) > 1:
            print(f"\n{epochs} epochs")
        print_table(args.tasks, methods, repetitions, epochs)


def print_table(tasks: list[str], methods: dict, repetitions: int, epochs: int) -> None:
    print("| task | method | accuracy or RMSE | NLL | ECE | train s | time / 5-net ensemble | KL weights chosen |")
    print("|---|---|---|---|---|---|---|---|")
    for name in tasks:
        x, y, classes = load(name)
        rows = {method: [] for method in methods}
        for seed in range(repetitions):
            train, test = split(x, y, classes, seed)
            for method, run in methods.items():
                rows[method].append(run(train, test, classes, epochs, seed))
        for method, runs in rows.items():
            cells = [statistics.median(r[c] for r in runs) for c in COLUMNS]
            chosen = ", ".join(f"{r['weight']:g}" for r in runs) if "weight" in runs[0] else ""
            # the cost goal, side by side: this method's seconds over five twins' in the same repetition
            ratio = (f"{statistics.median(r['train s'] / (5 * d['train s']) for r, d in zip(runs, twins)):.2f}"
                     if (twins := rows.get("deterministic")) else "")
            print(f"| {name} | {method} | {cells[0]:.3f} | {cells[1]:.3f} | {cells[2]:.3f} | {cells[3]:.1f} | "
                  f"{ratio} | {chosen} |", flush=True)


if __name__ == "__main__":
    main()
