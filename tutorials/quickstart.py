# %% [markdown]
# # Quickstart: a Bayesian neural network for 1-D regression in under a minute
#
# A two-layer Bayes-by-Backprop network with a learned noise scale, trained on minibatches with a plain
# `pyro.infer.SVI` loop. `pyro_bbb.ELBO(num_data=N)` scales every minibatch to the full data set, so nothing is
# divided by N by hand. Prints test RMSE, test log-likelihood and the KL, and saves the predictive band as a PNG.

# %%
import argparse
import math
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pyro  # noqa: E402
import pyro.distributions as dist  # noqa: E402
import torch  # noqa: E402
from pyro.infer import SVI, Predictive  # noqa: E402
from pyro.nn import PyroModule  # noqa: E402

import pyro_bbb  # noqa: E402
from pyro_bbb.datasets import toy_regression  # noqa: E402
from pyro_bbb.nn import BayesianLinear  # noqa: E402


# %% The model: the network runs outside the data plate, the likelihood inside it.
class Regressor(PyroModule):
    def __init__(self, hidden: int = 50):
        super().__init__()
        self.fc1 = BayesianLinear(1, hidden)
        self.fc2 = BayesianLinear(hidden, 1)

    def forward(self, x, y=None):
        mean = pyro.deterministic("mean", self.fc2(torch.tanh(self.fc1(x))).squeeze(-1))
        sigma = pyro.sample("sigma", dist.LogNormal(math.log(0.1), 1.0))  # learned noise scale
        with pyro.plate("data", x.shape[0]):
            return pyro.sample("y", dist.Normal(mean, sigma), obs=y)


def main(steps: int, out: Path) -> dict[str, float]:
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    x_train, y_train = toy_regression(200, seed=0)  # sin(3x) + noise, no data in the middle or beyond |x| = 2
    x_test, y_test = toy_regression(500, seed=1)
    model = Regressor()
    guide = pyro_bbb.MeanFieldGuide(model)
    elbo = pyro_bbb.ELBO(num_data=len(x_train))
    svi = SVI(model, guide, pyro.optim.ClippedAdam({"lr": 1e-2, "lrd": 0.1 ** (1 / steps)}), elbo)

    start = time.perf_counter()
    batch_size = 64  # 200 is not a multiple of 64: the last batch of each epoch has 8 points
    step = 0
    while step < steps:
        for idx in torch.randperm(len(x_train)).split(batch_size):
            svi.step(x_train[idx], y_train[idx])
            step += 1
    seconds = time.perf_counter() - start

    # Posterior predictive: 200 weight draws evaluated in one vectorized call.
    mean_draws, sigma_draws = posterior_draws(model, guide, x_test, num_samples=200)
    rmse = (mean_draws.mean(0) - y_test).pow(2).mean().sqrt().item()
    log_lik = dist.Normal(mean_draws, sigma_draws.unsqueeze(-1)).log_prob(y_test)  # (draws, points)
    test_ll = (torch.logsumexp(log_lik, 0) - math.log(log_lik.shape[0])).mean().item()

    grid = torch.linspace(-3, 3, 300).unsqueeze(-1)
    grid_mean, grid_sigma = posterior_draws(model, guide, grid, num_samples=200)
    epistemic = grid_mean.std(0)
    total = (grid_mean.var(0) + grid_sigma.pow(2).mean()).sqrt()
    m = grid_mean.mean(0)
    fig, ax = plt.subplots(figsize=(7, 4))
    g = grid.squeeze(-1)
    ax.fill_between(g, m - 2 * total, m + 2 * total, alpha=0.2, color="C0", label="±2 sd predictive (total)")
    ax.fill_between(g, m - 2 * epistemic, m + 2 * epistemic, alpha=0.4, color="C0", label="±2 sd epistemic")
    ax.plot(g, m, color="C0", label="predictive mean")
    ax.plot(g, torch.sin(3 * g), "k--", lw=1, label="truth")
    ax.scatter(x_train.squeeze(-1), y_train, s=6, color="k", label="training data")
    ax.set(xlabel="x", ylabel="y", title="pyro_bbb quickstart: Bayes-by-Backprop regression", ylim=(-3, 3))
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)

    results = {"test_rmse": rmse, "test_log_lik": test_ll, "kl": elbo.last_terms["kl"],
               "train_seconds": seconds, "steps": steps}  # fmt: skip
    print(f"trained {steps} SVI steps in {seconds:.1f} s")
    print(f"test RMSE            {rmse:.3f}   (noise sd 0.1)")
    print(f"test log-likelihood  {test_ll:.3f} per point")
    print(f"KL(q || p)           {elbo.last_terms['kl']:.1f} nats over {len(x_train)} data")
    print(f"predictive band  ->  {out}")
    return results


def posterior_draws(model, guide, x, num_samples):
    """Network mean ``(S, len(x))`` and noise scale ``(S,)`` under S posterior draws, in one vectorized pass."""
    predictive = Predictive(model, guide=guide, num_samples=num_samples, parallel=True, return_sites=["mean", "sigma"])
    with torch.no_grad():
        samples = predictive(x)
    return samples["mean"].reshape(num_samples, -1), samples["sigma"].reshape(num_samples)


# %%
if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=Path("tutorials/figures/quickstart_band.png"))
    args = parser.parse_args()
    main(args.steps, args.out)
