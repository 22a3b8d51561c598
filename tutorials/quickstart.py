# %% [markdown]
# # Quickstart: a Bayesian neural network for 1-D regression in about a minute
#
# The three-line happy path: `BNN(net, likelihood)` -> `MeanFieldGuide` -> `fit` -> `predict`. The network is
# 1-50-50-1 (ReLU) with Bayes-by-Backprop weights and a learned noise scale; `fit` trains on minibatches of 64 and
# scales each one to the full data set (nothing is divided by N by hand), and `predict` runs 200 weight draws in
# one vectorized pass. Prints test RMSE, test log-likelihood, interval coverage, the KL and how much wider the
# epistemic band is beyond the data than inside it, and saves two PNGs: the predictive band (epistemic and total)
# and the training traces (loss, KL per layer, posterior/prior std).
#
# Why ReLU and 600 points: with tanh units the band saturates to a constant width beyond the data, and with 200
# points and a 1-50-1 net the mean-field posterior underfits (test RMSE 0.26 against a noise sd of 0.1, the epistemic
# band as wide inside the data as outside). ReLU units extrapolate linearly, so the weight uncertainty grows with
# |x| beyond the data; the second hidden layer and the larger sample let the posterior fit the sine.

# %%
import argparse
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pyro  # noqa: E402
import torch  # noqa: E402

import pyro_bbb  # noqa: E402
from pyro_bbb import likelihoods  # noqa: E402
from pyro_bbb.data import toy_regression  # noqa: E402
from pyro_bbb.evaluate import metrics, plots
from pyro_bbb.nn import BayesianLinear  # noqa: E402


def main(epochs: int, out_dir: Path, progress: bool = True) -> dict[str, float]:
    pyro.clear_param_store()
    torch.manual_seed(0)
    x_train, y_train = toy_regression(600, seed=0)  # sin(3x) + noise; no data in the middle or beyond |x| = 2
    x_test, y_test = toy_regression(500, seed=1)

    # %% The three lines (plus the network).
    net = torch.nn.Sequential(BayesianLinear(1, 50), torch.nn.ReLU(), BayesianLinear(50, 50), torch.nn.ReLU(),
                              BayesianLinear(50, 1))
    bnn = pyro_bbb.BNN(net, likelihood=likelihoods.Gaussian(prior_median=0.1))  # learned noise scale
    guide = pyro_bbb.MeanFieldGuide(bnn)
    start = time.perf_counter()
    history = pyro_bbb.fit(bnn, guide, (x_train, y_train), epochs=epochs, batch_size=64, lr=1e-2,
                           progress=progress, seed=0)
    seconds = time.perf_counter() - start
    pred = pyro_bbb.predict(bnn, guide, x_test, num_samples=200)
    grid = torch.linspace(-3, 3, 601).unsqueeze(-1)
    band = pyro_bbb.predict(bnn, guide, grid, num_samples=200)
    distance = grid.squeeze(-1).abs()
    inside, beyond = (distance >= 0.5) & (distance <= 2), distance > 2.5  # the training data: 0.5 <= |x| <= 2
    epistemic_ratio = band.epistemic_std[beyond].mean() / band.epistemic_std[inside].mean()

    # %% Numbers.
    results = {
        "test_rmse": metrics.rmse(pred, y_test),
        "test_log_lik": metrics.log_likelihood(pred, y_test),
        "coverage_90": metrics.interval_coverage(pred, y_test, level=0.9),
        "kl": history.last["kl"],
        "epistemic_ratio": float(epistemic_ratio),
        "train_seconds": seconds,
    }
    print(f"trained {epochs} epochs ({len(history.step_loss)} steps) in {seconds:.1f} s")
    print(f"test RMSE            {results['test_rmse']:.3f}   (noise sd 0.1)")
    print(f"test log-likelihood  {results['test_log_lik']:.3f} per point")
    print(f"90% interval covers  {results['coverage_90']:.1%} of test points")
    print(f"KL(q || p)           {results['kl']:.1f} nats over {len(x_train)} data; per layer "
          + ", ".join(f"{k}: {v:.0f}" for k, v in history.last["kl_by_layer"].items()))
    print(f"epistemic std beyond |x| = 2.5 is {results['epistemic_ratio']:.1f}x its value inside the data")

    # %% The predictive band: the 90% interval whose coverage is printed above, and the ±2 sd epistemic band, which
    # grows in the gap between the two halves of the data and beyond them.
    fig = plots.plot_predictive_band(band, grid, x_train=x_train, y_train=y_train, truth=lambda g: torch.sin(3 * g),
                                     level=0.9)
    fig.axes[0].set(title="pyro_bbb quickstart: Bayes-by-Backprop regression", ylim=(-3, 3))
    plots.save_figure(fig, out_dir / "quickstart_band.png", dpi=120)

    # %% The training traces: the loss per datum flattens; each layer's KL falls as its posterior widens from the
    # narrow start the KL-weight selection leaves (a narrow posterior is far from the prior) to a fraction of the
    # prior's width -- nearly all of it for the 50x50 middle layer, most of whose weights the data does not need.
    history.plot(out_dir / "quickstart_history.png")
    plt.close("all")
    print(f"figures          ->  {out_dir / 'quickstart_band.png'}, {out_dir / 'quickstart_history.png'}")
    return results


# %%
if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=700)
    parser.add_argument("--out-dir", type=Path, default=Path("tutorials/figures"))
    args = parser.parse_args()
    main(args.epochs, args.out_dir)
