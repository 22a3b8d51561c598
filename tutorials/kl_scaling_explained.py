# %% [markdown]
# # How exactly should the KL be scaled with minibatches? An experiment
#
# The ELBO of a data set of N points is `sum_i E_q[log p(y_i | x_i, w)] - KL(q || p)`. On a minibatch of B points
# the unbiased estimate is `N/B * sum_batch log p - KL`, or per datum: `mean_batch NLL + KL / N`. The usual
# mistakes, written as what they do to the KL's weight relative to that correct objective:
#
# | what the code does (with the batch *mean* NLL) | equivalent KL weight |
# |---|---|
# | `+ KL / N` (correct; what `pyro_bbb.ELBO(num_data=N)` does through `pyro.plate`) | 1 |
# | `+ KL / B` (divided by the batch size) | N / B |
# | `+ KL / num_batches` (= KL · B / N) | B |
# | `+ KL` (not scaled at all) | N |
# | warm-up: weight rising linearly from 0 to 1 over the first steps | 0 → 1 |
#
# (With the batch *sum* of the NLL, `KL / num_batches` is correct: that is Blundell et al.'s recipe. The scale
# depends on how the likelihood is reduced, which is why pyro_bbb takes both decisions for you.)
#
# Part 1 trains Bayesian linear regression, whose optimal mean-field posterior is known in closed form, under each
# variant. Part 2 trains a classifier on scikit-learn's digits. Writes `tutorials/figures/kl_scaling.png`.
#
# In pyro_bbb nothing is divided by hand: the likelihood is sampled inside `pyro.plate("data", B)`, and
# `pyro_bbb.ELBO(num_data=N)` scales every site in that plate by N/B (B counted per batch, so the last, partial
# batch is right too), while the KL is added once. `pyro.plate("data", N, subsample=idx)` does the same, and the ELBO
# checks that the two agree.

# %%
import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pyro  # noqa: E402
import torch  # noqa: E402

import pyro_bbb  # noqa: E402
from pyro_bbb import likelihoods, priors  # noqa: E402
from pyro_bbb.data import digits  # noqa: E402
from pyro_bbb.evaluate import metrics, plots
from pyro_bbb.infer import schedules
from pyro_bbb.nn import BayesianLinear  # noqa: E402

BATCH = 32


def variants(num_data: int, steps: int) -> dict[str, object]:
    return {
        "KL / N (correct)": 1.0,
        "KL / B": num_data / BATCH,
        "KL / num_batches": float(BATCH),
        "KL unscaled": float(num_data),
        "warm-up to 1": schedules.LinearWarmup(max(1, steps // 3)),
    }


def optimal_mean_field(x: torch.Tensor, y: torch.Tensor, sigma: float, prior_scale: float):
    """The best mean-field Gaussian for Bayesian linear regression: the exact posterior's mean, and standard
    deviations ``1 / sqrt(diag(precision))`` (the mean-field optimum is not the exact marginal's width)."""
    features = torch.cat([x, torch.ones(len(x), 1)], 1).double()
    precision = torch.eye(features.shape[1], dtype=torch.double) / prior_scale**2 + features.T @ features / sigma**2
    mean = torch.linalg.solve(precision, features.T @ y.double() / sigma**2)
    return mean, precision.diagonal().rsqrt()


# %% Bayesian linear regression has a closed-form optimal mean-field posterior: each way of scaling the KL is judged
# by how far its posterior std ends from that optimum (1 is right).
def linear_regression(epochs: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, 3, generator=g)
    y = x @ torch.tensor([1.0, -0.5, 0.25]) + 0.3 + 0.5 * torch.randn(500, generator=g)
    best_mean, best_std = optimal_mean_field(x, y, sigma=0.5, prior_scale=1.0)
    steps = epochs * -(-len(x) // BATCH)
    ratios = {}
    for name, kl_weight in variants(len(x), steps).items():
        pyro.clear_param_store()
        bnn = pyro_bbb.BNN(BayesianLinear(3, 1, prior=priors.Normal(0.0, 1.0)), likelihoods.Gaussian(scale=0.5))
        guide = pyro_bbb.MeanFieldGuide(bnn)
        pyro_bbb.fit(bnn, guide, (x, y), epochs=epochs, batch_size=BATCH, lr=0.02, kl_weight=kl_weight,
                     progress=False, seed=0)
        q = guide.site_posteriors()
        std = torch.cat([q["net.weight"].scale.reshape(-1), q["net.bias"].scale]).double()
        ratios[name] = float((std / best_std).mean())
        print(f"[linear regression] {name:18s} posterior std / optimal std = {ratios[name]:7.2f}")
    return ratios


# %% The same five ways on a real network: a 64-100-10 Bayesian MLP on the digits, judged by test accuracy.
def classifier(epochs: int) -> dict[str, float]:
    x_train, y_train, x_test, y_test = digits()
    steps = epochs * -(-len(x_train) // BATCH)
    accuracies = {}
    for name, kl_weight in variants(len(x_train), steps).items():
        pyro.clear_param_store()
        torch.manual_seed(0)
        net = torch.nn.Sequential(BayesianLinear(64, 100), torch.nn.ReLU(), BayesianLinear(100, 10))
        bnn = pyro_bbb.BNN(net, likelihoods.Categorical())
        guide = pyro_bbb.MeanFieldGuide(bnn)
        pyro_bbb.fit(bnn, guide, (x_train, y_train), epochs=epochs, batch_size=BATCH, lr=1e-2, kl_weight=kl_weight,
                     progress=False, seed=0)
        accuracies[name] = metrics.accuracy(pyro_bbb.predict(bnn, guide, x_test, num_samples=50), y_test)
        print(f"[digits] {name:18s} test accuracy = {accuracies[name]:.3f}")
    return accuracies


# %% Both experiments, side by side.
def main(regression_epochs: int, digits_epochs: int, out_dir: Path) -> dict[str, dict[str, float]]:
    ratios = linear_regression(regression_epochs)
    accuracies = classifier(digits_epochs)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    names = list(ratios)
    axes[0].bar(names, list(ratios.values()), color=["C2", "C3", "C1", "C3", "C0"])
    axes[0].axhline(1.0, color="k", ls="--", lw=1)
    axes[0].set(yscale="log", ylabel="posterior std / closed-form optimum",
                title="Bayesian linear regression (N = 500, B = 32)")
    axes[1].bar(names, list(accuracies.values()), color=["C2", "C3", "C1", "C3", "C0"])
    axes[1].set(ylim=(0, 1), ylabel="test accuracy", title="digits, 64-100-10 Bayesian MLP")
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=25, labelsize=8)
    plots.save_figure(fig, out_dir / "kl_scaling.png", dpi=110)
    print(f"figure -> {out_dir / 'kl_scaling.png'}")
    return {"std_ratio": ratios, "accuracy": accuracies}


# %%
if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--regression-epochs", type=int, default=150)
    parser.add_argument("--digits-epochs", type=int, default=100)
    parser.add_argument("--out-dir", type=Path, default=Path("tutorials/figures"))
    args = parser.parse_args()
    main(args.regression_epochs, args.digits_epochs, args.out_dir)
