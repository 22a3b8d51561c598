"""What the uncertainty buys, against what a user would pick instead: one table, medians of 3 seeds.

Three tasks, each trained on 8 classes and shown the 2 held-out classes as out-of-distribution inputs:

* digits MLP: scikit-learn's 8x8 digits (64 pixels in [0, 1]), a 64-100-100-8 ReLU MLP;
* digits CNN: the same images as 1x8x8, conv 16 - conv 32 - max-pool - linear;
* mnist1d MLP: ``mnist1d``'s procedural 40-point signals (4000 of them, standardised), a 40-100-100-8 MLP.

10% of each training split is held out as a validation split (temperature scaling and the Laplace prior precision
are fitted on it; every method trains on the other 90%). Contenders, all trained with Adam for the same epochs and
batches: a deterministic net (weight decay 1e-4), the same with temperature scaling, MC dropout (p = 0.1, 50 passes),
a deep ensemble of 5 deterministic nets, a diagonal last-layer Laplace approximation of the deterministic net
(``baselines.py``), and pyro_bbb with its defaults (``BNN`` of Bayesian layers, ``MeanFieldGuide``, ``fit``), with
Flipout, and with IVON (``fit(optimizer=IVON(...), estimator="local_reparam")``); where bayesian-torch 0.5 is installed
(``pip install bayesian-torch==0.5.0 --no-deps``), its README recipe and its MOPED flow on the same net (the peers the
goals name); 100 draws per prediction. Reports
accuracy, NLL, ECE (15 bins), OOD AUROC (predictive entropy; in-distribution test inputs against the held-out
classes), AURC (risk against coverage, max probability) and training time (seconds, the ensemble's for all 5 nets).

    python benchmarks/uncertainty.py                      # the table (about 15 minutes on 2 cores)
    python benchmarks/uncertainty.py --quick              # smoke run
    python benchmarks/uncertainty.py --figures docs/figures   # also the risk-coverage and OOD-score figures
    python benchmarks/uncertainty.py --sweep 1 0.1 0.01 0.001 --tasks "digits MLP"   # fixed KL weights side by side
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import pyro
import torch
from baselines import DiagonalLastLayerLaplace, bayesian_torch_flow, mc_dropout_probs, softmax_probs, train_net
from torch import nn

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb.data import digits
from pyro_bbb.evaluate import metrics
from pyro_bbb.evaluate.calibration import TemperatureScaling
from pyro_bbb.nn import BayesianConv2d, BayesianLinear
from pyro_bbb.optim import IVON
from pyro_bbb.prediction import ClassificationPrediction

IN_CLASSES = 8  # classes 0-7 in distribution, 8 and 9 held out
METHODS = ["deterministic", "deterministic + temperature", "MC dropout", "deep ensemble (5)", "last-layer Laplace",
           "pyro_bbb defaults", "pyro_bbb kl_weight=1", "pyro_bbb Flipout", "pyro_bbb IVON"]
#: the peers' recipes, beside the table when bayesian-torch is installed (a benchmark dependency only)
PEERS = ["bayesian-torch README", "bayesian-torch MOPED"]
HAS_PEERS = importlib.util.find_spec("bayesian_torch") is not None
COLUMNS = ["accuracy", "NLL", "ECE", "OOD AUROC", "AURC", "train s"]


def split(raw, seed):
    """(train, validation, test, ood) of ``(x_train, y_train, x_test, y_test)``: the test split's classes >= 8 are
    the OOD inputs."""
    x_train, y_train, x_test, y_test = raw
    keep, g = y_train < IN_CLASSES, torch.Generator().manual_seed(seed)
    x_train, y_train = x_train[keep], y_train[keep]
    perm = torch.randperm(len(y_train), generator=g)
    val, fit = perm[: len(perm) // 10], perm[len(perm) // 10:]
    inside = y_test < IN_CLASSES
    return (x_train[fit], y_train[fit]), (x_train[val], y_train[val]), (x_test[inside], y_test[inside]), \
        x_test[~inside]


def mnist1d_data(num_samples: int = 5000):
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.seed = num_samples, 0
    data = make_dataset(args)
    x, x_test = (torch.as_tensor(data[k], dtype=torch.float32) for k in ("x", "x_test"))
    mean, std = x.mean(0), x.std(0)
    return (x - mean) / std, torch.as_tensor(data["y"]), (x_test - mean) / std, torch.as_tensor(data["y_test"])


def mlp(inputs: int, bayesian: bool, dropout: float = 0.0) -> nn.Sequential:
    linear = BayesianLinear if bayesian else nn.Linear
    drop = [nn.Dropout(dropout)] if dropout else []
    return nn.Sequential(linear(inputs, 100), nn.ReLU(), *drop, linear(100, 100), nn.ReLU(), *drop,
                         linear(100, IN_CLASSES))


class Image(nn.Module):
    def forward(self, x):
        return x.reshape(*x.shape[:-1], 1, 8, 8)


def cnn(inputs: int, bayesian: bool, dropout: float = 0.0) -> nn.Sequential:
    conv, linear = (BayesianConv2d, BayesianLinear) if bayesian else (nn.Conv2d, nn.Linear)
    drop = [nn.Dropout(dropout)] if dropout else []
    return nn.Sequential(Image(), conv(1, 16, 3, padding=1), nn.ReLU(), conv(16, 32, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), *drop, linear(32 * 16, IN_CLASSES))


def prediction(draws: torch.Tensor) -> ClassificationPrediction:
    """A pyro_bbb prediction of ``(S, batch, C)`` class probabilities (any method's)."""
    return ClassificationPrediction(pyro.distributions.Categorical(probs=draws), torch.zeros(draws.shape[:2]))


def scores(probs_draws: torch.Tensor, y: torch.Tensor, ood_draws: torch.Tensor) -> dict[str, float]:
    """The columns from ``(S, batch, C)`` class probabilities of the test and OOD inputs."""
    inside, outside = prediction(probs_draws), prediction(ood_draws)
    return {"_draws": (probs_draws, ood_draws), "accuracy": metrics.accuracy(inside, y),
            "NLL": -metrics.log_likelihood(inside, y),
            "ECE": metrics.expected_calibration_error(inside, y, num_bins=15),
            "OOD AUROC": metrics.ood_auroc(inside, outside, score="entropy"),
            "AURC": metrics.aurc(inside, y, score="max_probability")}


def deterministic_rows(make, data, epochs, seed) -> dict:
    """Rows of the deterministic net, temperature, MC dropout, ensemble, Laplace."""
    (x, y), (x_val, y_val), (x_test, y_test), x_ood = data
    rows = {}
    torch.manual_seed(seed)
    start = time.perf_counter()
    net = train_net(make(x.shape[1], False), x, y, epochs=epochs, seed=seed)
    seconds = time.perf_counter() - start
    test, ood = softmax_probs(net, x_test)[None], softmax_probs(net, x_ood)[None]
    rows["deterministic"] = {**scores(test, y_test, ood), "train s": seconds}
    start = time.perf_counter()
    scaling = TemperatureScaling().fit(softmax_probs(net, x_val), y_val)
    rows["deterministic + temperature"] = {**scores(scaling(test[0])[None].float(), y_test,
                                                    scaling(ood[0])[None].float()),
                                           "train s": seconds + time.perf_counter() - start}
    start = time.perf_counter()
    laplace = DiagonalLastLayerLaplace(lambda inputs: net[:-1](inputs), net[-1]).fit(x)
    laplace.choose_prior_precision(x_val, y_val)
    rows["last-layer Laplace"] = {**scores(laplace.probs(x_test), y_test, laplace.probs(x_ood)),
                                  "train s": seconds + time.perf_counter() - start}
    torch.manual_seed(seed)
    start = time.perf_counter()
    dropout_net = train_net(make(x.shape[1], False, dropout=0.1), x, y, epochs=epochs, seed=seed)
    rows["MC dropout"] = {**scores(mc_dropout_probs(dropout_net, x_test), y_test, mc_dropout_probs(dropout_net, x_ood)),
                          "train s": time.perf_counter() - start}
    members, start = [net], time.perf_counter()
    for k in range(1, 5):
        torch.manual_seed(seed * 100 + k)
        members.append(train_net(make(x.shape[1], False), x, y, epochs=epochs, seed=seed * 100 + k))
    ensemble_test = torch.stack([softmax_probs(m, x_test) for m in members])
    ensemble_ood = torch.stack([softmax_probs(m, x_ood) for m in members])
    rows["deep ensemble (5)"] = {**scores(ensemble_test, y_test, ensemble_ood),
                                 "train s": seconds + time.perf_counter() - start}
    return rows


def bayesian_row(method, make, data, epochs, seed, kl_weight: float | None = None) -> dict:
    (x, y), _, (x_test, y_test), x_ood = data
    pyro.clear_param_store()
    torch.manual_seed(seed)
    bnn = pyro_bbb.BNN(make(x.shape[1], True), likelihoods.Categorical())
    guide = pyro_bbb.MeanFieldGuide(bnn)
    options = {"flipout": {"estimator": "flipout"}, "bayes": {"kl_weight": 1},
               "ivon": {"estimator": "local_reparam"}}.get(method, {})
    if method == "ivon":
        options["optimizer"] = IVON(guide, num_data=len(y))
    if kl_weight is not None:
        options["kl_weight"] = kl_weight
    start = time.perf_counter()
    history = pyro_bbb.fit(bnn, guide, (x, y), epochs=epochs, batch_size=64, progress=False, seed=seed, **options)
    seconds = time.perf_counter() - start
    print(f"    {method}: {history.kl_weight_choice.describe()}", flush=True)
    pyro.set_rng_seed(seed)
    test = pyro_bbb.predict(bnn, guide, x_test, num_samples=100).draw_probs
    ood = pyro_bbb.predict(bnn, guide, x_ood, num_samples=100).draw_probs
    return {**scores(test, y_test, ood), "train s": seconds, "weight": history.kl_weight_choice.kl_weight}


def bayesian_torch_row(make, data, epochs, seed, moped: bool) -> dict:
    """bayesian-torch 0.5's README recipe: ``dnn_to_bnn`` of the deterministic net (N(0, 1) prior, posterior rho
    -3), loss = cross-entropy + ``get_kl_loss(net) / batch_size``, no weight decay, 100 draws; with ``moped``, its
    MOPED flow: the deterministic net trained as its row is, the posterior started at its weights (widths
    ``0.5 |w|``), fine-tuned 20 epochs (its time included)."""
    (x, y), _, (x_test, y_test), x_ood = data
    torch.manual_seed(seed)
    net = make(x.shape[1], False)
    start = time.perf_counter()
    bayesian_torch_flow(net, lambda n, e, kl: train_net(n, x, y, epochs=e, seed=seed, kl=kl,
                                                        weight_decay=1e-4 if kl is None else 0.0), epochs, moped)
    seconds = time.perf_counter() - start
    torch.manual_seed(seed)  # (its layers draw weights in eval mode too)
    test = torch.stack([softmax_probs(net, x_test) for _ in range(100)])
    ood = torch.stack([softmax_probs(net, x_ood) for _ in range(100)])
    return {**scores(test, y_test, ood), "train s": seconds}


def run_task(name, make, raw, epochs, seeds, figures: Path | None):
    methods = METHODS + (PEERS if HAS_PEERS else [])
    per_seed = {method: [] for method in methods}
    for seed in seeds:
        data = split(raw, seed)
        rows = deterministic_rows(make, data, epochs, seed)
        rows["pyro_bbb defaults"] = bayesian_row("defaults", make, data, epochs, seed)
        rows["pyro_bbb kl_weight=1"] = bayesian_row("bayes", make, data, epochs, seed)
        rows["pyro_bbb Flipout"] = bayesian_row("flipout", make, data, epochs, seed)
        rows["pyro_bbb IVON"] = bayesian_row("ivon", make, data, epochs, seed)
        for peer in PEERS if HAS_PEERS else []:
            rows[peer] = bayesian_torch_row(make, data, epochs, seed, moped="MOPED" in peer)
        for method in methods:
            per_seed[method].append(rows[method])
        if figures is not None and seed == seeds[0]:
            draw_figures(name, rows, data[2][1], figures)
        print(f"  {name}, seed {seed}: done", flush=True)
    return {method: {c: statistics.median(r[c] for r in runs) for c in COLUMNS} for method, runs in per_seed.items()}


def run_sweep(name, make, raw, epochs, seeds, weights: list[float]) -> dict:
    """The deterministic net and pyro_bbb at each fixed KL weight (no selection), medians over ``seeds``: what the
    weight alone does on this task (docs/concepts.md's table). Illustration only: no default is chosen by it."""
    per_seed: dict[str, list[dict]] = {}
    for seed in seeds:
        data = split(raw, seed)
        (x, y), _, (x_test, y_test), x_ood = data
        torch.manual_seed(seed)
        start = time.perf_counter()
        net = train_net(make(x.shape[1], False), x, y, epochs=epochs, seed=seed)
        seconds = time.perf_counter() - start
        row = {**scores(softmax_probs(net, x_test)[None], y_test, softmax_probs(net, x_ood)[None]), "train s": seconds}
        per_seed.setdefault("deterministic", []).append(row)
        for weight in weights:
            per_seed.setdefault(f"kl_weight={weight:g}", []).append(
                bayesian_row("fixed", make, data, epochs, seed, kl_weight=weight))
        print(f"  {name}, seed {seed}: done", flush=True)
    return {method: {c: statistics.median(r[c] for r in runs) for c in COLUMNS} for method, runs in per_seed.items()}


def print_table(tables: dict) -> None:
    print("| task | method | " + " | ".join(COLUMNS) + " |")
    print("|---|---|" + "---|" * len(COLUMNS))
    for name, table in tables.items():
        for method, row in table.items():
            cells = [f"{row[c]:.1f}" if c == "train s" else f"{row[c]:.3f}" for c in COLUMNS]
            print(f"| {name} | {method} | " + " | ".join(cells) + " |")


def draw_figures(name: str, rows: dict, y_test: torch.Tensor, out: Path) -> None:
    """Risk against coverage of every method, and the entropy in and out of distribution of three of them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pyro_bbb.evaluate import plots

    shown = ["deterministic", "deep ensemble (5)", "pyro_bbb defaults"]
    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    plots.plot_risk_coverage({m: prediction(rows[m]["_draws"][0]) for m in METHODS}, y_test, ax=axes[0])
    axes[0].set(xlim=(0.5, 1.0), title=f"{name}: risk against coverage")
    for ax, method in zip(axes[1:], shown):
        inside, outside = rows[method]["_draws"]
        plots.plot_ood_scores(prediction(inside), prediction(outside), ax=ax, title=method)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"uncertainty_{name.replace(' ', '_').lower()}.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    print(f"  figure -> {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--figures", type=Path, default=None)
    parser.add_argument("--tasks", nargs="+", default=None, help='e.g. "digits MLP" (default: all three)')
    parser.add_argument("--sweep", nargs="+", type=float, default=None, metavar="KL_WEIGHT",
                        help="instead of the table: the deterministic net and pyro_bbb at each of these fixed weights")
    args = parser.parse_args()
    seeds = list(range(1 if args.quick else args.seeds))
    tasks = {"digits MLP": (mlp, digits, 2 if args.quick else 100),
             "digits CNN": (cnn, digits, 1 if args.quick else 50),
             "mnist1d MLP": (mlp, lambda: mnist1d_data(600 if args.quick else 5000), 1 if args.quick else 60)}
    unknown = set(args.tasks or ()) - tasks.keys()
    if unknown:
        parser.error(f"unknown task(s) {sorted(unknown)}; choose from {sorted(tasks)}")
    tasks = {name: task for name, task in tasks.items() if args.tasks is None or name in args.tasks}
    if args.sweep:
        tables = {name: run_sweep(name, make, load(), epochs, seeds, args.sweep)
                  for name, (make, load, epochs) in tasks.items()}
        print(f"\nmedians over {len(seeds)} seeds, fixed KL weights (no selection); NLL, ECE, AURC lower is better\n")
        print_table(tables)
        return
    if not HAS_PEERS:
        print("(bayesian-torch is not installed: its rows are left out; pip install bayesian-torch==0.5.0 --no-deps)")
    tables = {name: run_task(name, make, load(), epochs, seeds, args.figures)
              for name, (make, load, epochs) in tasks.items()}
    print(f"\nmedians over {len(seeds)} seeds; NLL, ECE and AURC lower is better\n")
    print_table(tables)
    print("\ngoals (pyro_bbb defaults): accuracy >= deterministic - 0.005, NLL <= deterministic, ECE <= max(its, "
          "0.02), OOD AUROC >= deterministic, NLL or AUROC at or above the ensemble, training time <= the ensemble's, "
          "NLL <= bayesian-torch's README recipe's and MOPED's (when installed):")
    for name, table in tables.items():
        ours, ensemble, det = table["pyro_bbb defaults"], table["deep ensemble (5)"], table["deterministic"]
        checks = {"accuracy": ours["accuracy"] >= det["accuracy"] - 0.005, "NLL": ours["NLL"] <= det["NLL"],
                  "ECE": ours["ECE"] <= max(det["ECE"], 0.02), "AUROC": ours["OOD AUROC"] >= det["OOD AUROC"],
                  "vs ensemble": ours["NLL"] <= ensemble["NLL"] or ours["OOD AUROC"] >= ensemble["OOD AUROC"],
                  "time": ours["train s"] <= ensemble["train s"]}
        checks |= {f"NLL vs {peer}": ours["NLL"] <= table[peer]["NLL"] for peer in PEERS if peer in table}
        verdict = ", ".join(f"{k} {'met' if ok else 'NOT met'}" for k, ok in checks.items())
        print(f"  {name}: NLL {ours['NLL']:.3f} (deterministic {det['NLL']:.3f}, ensemble {ensemble['NLL']:.3f}), "
              f"AUROC {ours['OOD AUROC']:.3f} ({det['OOD AUROC']:.3f}, {ensemble['OOD AUROC']:.3f}), time "
              f"{ours['train s'] / ensemble['train s']:.2f} of the ensemble's: {verdict}")


if __name__ == "__main__":
    main()
