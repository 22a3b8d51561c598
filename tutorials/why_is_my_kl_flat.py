# %% [markdown]
# # "My KL loss does not change": diagnosing a stuck Bayes-by-Backprop run
#
# A flat KL curve has two opposite causes, and the loss curve alone cannot tell them apart:
#
# * **The posterior sits on the prior.** The KL is over-weighted (typically: the NLL is a batch *mean* and the KL
#   is added unscaled, so it counts N times), the data cannot move the weights, the KL falls to ~0 and stays there,
#   the predictions are the prior's (here: chance accuracy).
# * **The posterior has collapsed to a point estimate.** The KL is under-weighted (a tiny `kl_weight`, or
#   `num_data` far too large), the posterior widths never leave their tiny initial values, the KL stays high and
#   flat, the network is deterministic in all but name.
#
# `pyro_bbb.evaluate.diagnostics.check_posterior` names both from the guide alone (per layer: the KL of the best-
# informed weights, and the posterior width against the prior's) and says what to change. This script trains the
# same digits classifier three ways and plots, per run, the NLL, the KL per layer and the posterior/prior width
# from `History`; it writes `tutorials/figures/why_is_my_kl_flat.png` and prints what `check_posterior` says.

# %%
import argparse
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pyro  # noqa: E402
import torch  # noqa: E402

import pyro_bbb  # noqa: E402
from pyro_bbb import likelihoods  # noqa: E402
from pyro_bbb.data import digits  # noqa: E402
from pyro_bbb.evaluate import diagnostics, metrics, plots
from pyro_bbb.infer import schedules
from pyro_bbb.nn import BayesianLinear  # noqa: E402


def runs(num_data: int, steps: int) -> dict[str, object]:
    return {
        "KL counted N times (on the prior)": float(num_data),
        "KL weight 1e-6 (collapsed)": 1e-6,
        "correct scale, with warm-up": schedules.LinearWarmup(max(1, steps // 4)),
    }


def main(epochs: int, out_dir: Path) -> dict[str, dict[str, object]]:
    # %% The same digits MLP trained three ways (`runs` above): the KL over-weighted (stuck on the prior), nearly
    # switched off (collapsed), and correct with a warm-up; after each, `check_posterior` speaks.
    x_train, y_train, x_test, y_test = digits()
    steps = epochs * -(-len(x_train) // 64)
    results, histories = {}, {}
    for name, kl_weight in runs(len(x_train), steps).items():
        pyro.clear_param_store()
        torch.manual_seed(0)
        net = torch.nn.Sequential(BayesianLinear(64, 100), torch.nn.ReLU(), BayesianLinear(100, 10))
        bnn = pyro_bbb.BNN(net, likelihoods.Categorical())
        guide = pyro_bbb.MeanFieldGuide(bnn)
        histories[name] = pyro_bbb.fit(bnn, guide, (x_train, y_train), epochs=epochs, batch_size=64, lr=1e-2,
                                       kl_weight=kl_weight, progress=False, seed=0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", diagnostics.PosteriorWarning)
            report = diagnostics.check_posterior(bnn, guide)
        accuracy = metrics.accuracy(pyro_bbb.predict(bnn, guide, x_test, num_samples=50), y_test)
        results[name] = {"accuracy": accuracy, "status": {layer: e["status"] for layer, e in report.items()}}
        print(f"\n{name}: test accuracy {accuracy:.3f}, final KL {histories[name].last['kl']:.1f} nats")
        for warning in caught:
            print(f"  check_posterior: {warning.message}")
        if not caught:
            print("  check_posterior: no warning")

    # %% The traces that tell the runs apart: a KL near zero with the posterior at the prior's width (on the prior),
    # a KL far above the others with the width collapsing (under-weighted), and the correct runs in between.
    fig, axes = plt.subplots(len(histories), 3, figsize=(14, 3.2 * len(histories)), squeeze=False)
    for row, (name, history) in zip(axes, histories.items()):
        epochs_seen = history["epoch"]
        row[0].plot(epochs_seen, [r["nll"] / r["num_data"] for r in history.records])
        row[0].set(ylabel=name, title="NLL per datum", yscale="log")
        for layer, values in history["kl_by_layer"].items():
            row[1].plot(epochs_seen, values, label=layer)
        row[1].set(title="KL per layer (nats)", yscale="log")
        for layer, values in history["std_ratio_geomean"].items():  # the average check_posterior judges by
            row[2].plot(epochs_seen, values, label=layer)
        row[2].axhline(1.0, color="k", ls="--", lw=0.8)
        row[2].set(title="posterior std / prior std (geometric mean)", yscale="log")
        for ax in row[1:]:
            ax.legend(fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("epoch")
    plots.save_figure(fig, out_dir / "why_is_my_kl_flat.png", dpi=100)
    print(f"\nfigure -> {out_dir / 'why_is_my_kl_flat.png'}")
    return results


# %%
if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=150)
    parser.add_argument("--out-dir", type=Path, default=Path("tutorials/figures"))
    args = parser.parse_args()
    main(args.epochs, args.out_dir)
