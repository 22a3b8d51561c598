# %% [markdown]
# # Natural-gradient variational learning: IVON against Bayes-by-Backprop with Adam
#
# Adam steps a weight's posterior mean and its width as two unrelated numbers. IVON (Shen et al., 2024) keeps a
# running estimate of the loss's curvature per weight and *sets* the width from it: a weight the data pins down gets
# a narrow posterior, one the data says nothing about keeps its prior's. The curvature comes for free from the
# gradient the ELBO already has with respect to the width (Price's theorem), so a step costs what an Adam step costs.
#
# This script trains the quickstart's 1-50-50-1 ReLU network on the same 600 points twice, with the same data,
# batches and epochs: once with `fit`'s Adam, once with `pyro_bbb.optim.IVON`. It prints test RMSE,
# log-likelihood, 90% interval coverage and how much wider the epistemic band is beyond the data than inside it,
# and saves `natural_gradient.png`: the two predictive bands and the two loss traces.

# %%
import argparse
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
from pyro_bbb.optim import IVON  # noqa: E402


def train(optimizer_name: str, x, y, epochs: int, progress: bool):
    pyro.clear_param_store()
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        BayesianLinear(1, 50), torch.nn.ReLU(), BayesianLinear(50, 50), torch.nn.ReLU(), BayesianLinear(50, 1)
    )
    bnn = pyro_bbb.BNN(net, likelihood=likelihoods.Gaussian(prior_median=0.1))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    # %% The only difference: IVON needs the guide (whose widths it sets) and N (the posterior's sample size).
    if optimizer_name == "IVON":
        options = {"optimizer": IVON(guide, num_data=len(x), lr=0.1)}
    else:
        options = {"lr": 1e-2, "kl_weight": 1}  # the same objective as IVON's: the ELBO
    history = pyro_bbb.fit(bnn, guide, (x, y), epochs=epochs, batch_size=64, progress=progress, seed=0, **options)
    return bnn, guide, history


def main(epochs: int, out_dir: Path, progress: bool = True) -> dict[str, dict[str, float]]:
    x_train, y_train = toy_regression(600, seed=0)  # sin(3x) + noise; no data in the middle or beyond |x| = 2
    x_test, y_test = toy_regression(500, seed=1)
    grid = torch.linspace(-3, 3, 601).unsqueeze(-1)
    distance = grid.squeeze(-1).abs()
    inside, beyond = (distance >= 0.5) & (distance <= 2), distance > 2.5

    figure, axes = plt.subplots(1, 3, figsize=(15, 4))
    results = {}
    for name, axis in zip(("Adam-BbB", "IVON"), axes[:2]):
        bnn, guide, history = train(name, x_train, y_train, epochs, progress)
        pyro.set_rng_seed(0)
        pred = pyro_bbb.predict(bnn, guide, x_test, num_samples=200)
        band = pyro_bbb.predict(bnn, guide, grid, num_samples=200)
        results[name] = {
            "test_rmse": metrics.rmse(pred, y_test),
            "test_log_likelihood": metrics.log_likelihood(pred, y_test),
            "coverage_90": metrics.interval_coverage(pred, y_test, level=0.9),
            "epistemic_ratio": float(band.epistemic_std[beyond].mean() / band.epistemic_std[inside].mean()),
        }
        # %% The predictive band: the mean, 90% of the epistemic spread, 90% of the total.
        mean, epistemic, total = band.mean, band.epistemic_std, band.std
        xs = grid.squeeze(-1)
        axis.fill_between(xs, mean - 1.645 * total, mean + 1.645 * total, alpha=0.2, label="total (90%)")
        axis.fill_between(xs, mean - 1.645 * epistemic, mean + 1.645 * epistemic, alpha=0.4, label="epistemic (90%)")
        axis.plot(xs, mean, lw=1.5, label="predictive mean")
        axis.scatter(x_train.squeeze(-1), y_train, s=3, c="k", alpha=0.4, label="training data")
        axis.set(title=f"{name}: test RMSE {results[name]['test_rmse']:.3f}", xlabel="x", ylabel="y", ylim=(-3, 3))
        axis.legend(fontsize=7, loc="lower left")
        axes[2].plot(range(1, len(history) + 1), history["loss_per_datum"], label=name)
    axes[2].set(xlabel="epoch", ylabel="negative ELBO per datum (nats)", title="training loss")
    plots.symlog_yaxis(axes[2])
    axes[2].legend()
    figure.tight_layout()
    plots.save_figure(figure, out_dir / "natural_gradient.png")

    # %% Numbers.
    print(f"{'':10s} {'RMSE':>7s} {'log-lik':>8s} {'90% cov':>8s} {'epistemic out/in':>17s}")
    for name, row in results.items():
        print(
            f"{name:10s} {row['test_rmse']:7.3f} {row['test_log_likelihood']:8.3f} {row['coverage_90']:8.3f} "
            f"{row['epistemic_ratio']:17.2f}"
        )
    return results


# %%
if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "figures")
    args = parser.parse_args()
    main(args.epochs, args.out_dir)
