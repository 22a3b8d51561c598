# %% [markdown]
# # Uncertainty you can look at: aleatoric vs epistemic, calibration, and what the posterior learned
#
# Two problems, each in the three-line style (`BNN` -> `MeanFieldGuide` -> `fit` -> `predict`):
#
# 1. **Heteroscedastic regression** (`datasets.heteroscedastic_regression`: noise sd `0.1 + 0.2|x|` on
#    `[-2, 2]`). A `HeteroscedasticGaussian` likelihood learns the noise; the weight posterior gives the epistemic
#    part, which grows away from the data. Figure: `uncertainty_regression.png`.
# 2. **Digits** (scikit-learn's bundled 8x8 images). A 64-100-10 Bayesian MLP; a reliability diagram, the
#    epistemic uncertainty (mutual information) of right and wrong answers, and accuracy after pruning the
#    weights with the lowest signal-to-noise ratio (Blundell et al. 2015). Figures: `uncertainty_digits.png`,
#    `uncertainty_reliability.png`, `uncertainty_digits_std.png` (posterior std per layer against the prior's) and
#    the training traces `uncertainty_digits_history.png`.

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
from pyro_bbb import diagnostics, likelihoods, metrics, plots, priors  # noqa: E402
from pyro_bbb.datasets import digits, heteroscedastic_noise_std, heteroscedastic_regression  # noqa: E402
from pyro_bbb.nn import BayesianLinear  # noqa: E402


def regression(epochs: int, out_dir: Path, progress: bool) -> dict[str, float]:
    pyro.clear_param_store()
    torch.manual_seed(0)
    x, y = heteroscedastic_regression(2000, seed=0)
    x_test, y_test = heteroscedastic_regression(2000, seed=1)
    net = torch.nn.Sequential(BayesianLinear(1, 32), torch.nn.ReLU(), BayesianLinear(32, 32), torch.nn.ReLU(),
                              BayesianLinear(32, 2))  # fmt: skip
    bnn = pyro_bbb.BNN(net, likelihoods.HeteroscedasticGaussian())
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (x, y), epochs=epochs, batch_size=200, lr=1e-2, progress=progress, seed=0)
    pred = pyro_bbb.predict(bnn, guide, x_test, num_samples=200)
    coverage = metrics.interval_coverage(pred, y_test, level=0.9)
    log_lik, rmse = metrics.log_likelihood(pred, y_test), metrics.rmse(pred, y_test)
    print(f"[regression] test log-lik {log_lik:.3f}, RMSE {rmse:.3f}, 90% interval coverage {coverage:.1%}")

    grid = torch.linspace(-4, 4, 400).unsqueeze(-1)
    band = pyro_bbb.predict(bnn, guide, grid, num_samples=200)
    g = grid.squeeze(-1)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    lower, upper = band.interval(0.9)
    axes[0].scatter(x.squeeze(-1)[:600], y[:600], s=4, color="k", alpha=0.4, label="training data (600 of 2000)")
    axes[0].fill_between(g, lower, upper, color="C0", alpha=0.25, label="90% predictive interval")
    axes[0].plot(g, band.mean, color="C0", label="predictive mean")
    axes[0].plot(g, torch.sin(2 * g), "k--", lw=1, label="truth")
    axes[0].axvspan(-2, 2, color="grey", alpha=0.08)
    axes[0].set(xlabel="x", ylabel="y", title=f"heteroscedastic regression (coverage {coverage:.1%})", ylim=(-4, 4))
    axes[0].legend(fontsize=8, loc="lower left")
    axes[1].plot(g, band.aleatoric_std, label="aleatoric std (learned noise)")
    axes[1].plot(g, heteroscedastic_noise_std(g), "k--", lw=1, label="true noise std")
    axes[1].plot(g, band.epistemic_std, label="epistemic std (weight posterior)")
    axes[1].axvspan(-2, 2, color="grey", alpha=0.08, label="training inputs")
    axes[1].set(xlabel="x", ylabel="std", title="uncertainty decomposition", yscale="log")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "uncertainty_regression.png", dpi=110)
    plt.close(fig)
    return {"coverage_90": coverage}


def classification(epochs: int, out_dir: Path, progress: bool) -> dict[str, float]:
    pyro.clear_param_store()
    torch.manual_seed(0)
    x_train, y_train, x_test, y_test = digits()
    prior = priors.Normal(0.0, 2.0)
    net = torch.nn.Sequential(BayesianLinear(64, 100, prior=prior), torch.nn.ReLU(),
                              BayesianLinear(100, 10, prior=prior))  # fmt: skip
    bnn = pyro_bbb.BNN(net, likelihoods.Categorical())
    guide = pyro_bbb.MeanFieldGuide(bnn)
    history = pyro_bbb.fit(bnn, guide, (x_train, y_train), epochs=epochs, batch_size=128, lr=1e-2,
                           validation_data=(x_test, y_test), progress=progress, seed=0)  # fmt: skip
    history.plot(out_dir / "uncertainty_digits_history.png")
    pred = pyro_bbb.predict(bnn, guide, x_test, num_samples=100)
    acc, ece = metrics.accuracy(pred, y_test), metrics.expected_calibration_error(pred, y_test)
    print(f"[digits] accuracy {acc:.1%}, ECE {ece:.3f}, Brier {metrics.brier_score(pred, y_test):.3f}, "
          f"test log-lik {metrics.log_likelihood(pred, y_test):.3f}")  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = diagnostics.check_posterior(bnn, guide)
    for layer, entry in report.items():
        if "std_ratio" in entry:
            print(f"[digits] {layer}: KL {entry['kl']:.0f} nats, posterior/prior std {entry['std_ratio_geomean']:.2f} "
                  f"(geometric mean), status {entry['status']}")  # fmt: skip
    for w in caught:
        print(f"[digits] warning: {w.message}")

    fractions = [0.0, 0.5, 0.75, 0.9, 0.95, 0.98]
    pruned_accuracy = []
    for fraction in fractions:
        pruned, _ = diagnostics.prune_by_snr(guide, fraction)
        pruned_accuracy.append(metrics.accuracy(pyro_bbb.predict(bnn, pruned, x_test, num_samples=50), y_test))
    table = ", ".join(f"{f:.0%}: {a:.1%}" for f, a in zip(fractions, pruned_accuracy))
    print(f"[digits] accuracy after pruning: {table}")

    plots.plot_reliability(pred, y_test, path=out_dir / "uncertainty_reliability.png")
    plots.plot_std_ratio(bnn, guide, path=out_dir / "uncertainty_digits_std.png")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    wrong = pred.predicted_class != y_test
    mi = pred.mutual_information
    bins = torch.linspace(0, float(mi.max()) + 1e-6, 30)
    axes[0].hist(mi[~wrong], bins=bins, alpha=0.6, density=True, label=f"right ({int((~wrong).sum())})")
    axes[0].hist(mi[wrong], bins=bins, alpha=0.6, density=True, label=f"wrong ({int(wrong.sum())})")
    axes[0].set(xlabel="mutual information (nats)", ylabel="density", title="epistemic uncertainty", yscale="log")
    axes[0].legend(fontsize=8)
    axes[1].plot([100 * f for f in fractions], [100 * a for a in pruned_accuracy], "o-")
    axes[1].set(xlabel="% of weights removed (lowest |mu|/sigma)", ylabel="test accuracy (%)",
                title="pruning by signal-to-noise")  # fmt: skip
    fig.tight_layout()
    fig.savefig(out_dir / "uncertainty_digits.png", dpi=110)
    plt.close("all")
    return {"accuracy": acc, "ece": ece, "pruned_90_accuracy": pruned_accuracy[fractions.index(0.9)]}


def main(regression_epochs: int, digits_epochs: int, out_dir: Path, progress: bool = True) -> dict[str, float]:
    out_dir.mkdir(parents=True, exist_ok=True)
    results = regression(regression_epochs, out_dir, progress)
    results |= classification(digits_epochs, out_dir, progress)
    print(f"figures -> {out_dir}/uncertainty_*.png")
    return results


# %%
if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--regression-epochs", type=int, default=300)
    parser.add_argument("--digits-epochs", type=int, default=300)
    parser.add_argument("--out-dir", type=Path, default=Path("tutorials/figures"))
    args = parser.parse_args()
    main(args.regression_epochs, args.digits_epochs, args.out_dir)
