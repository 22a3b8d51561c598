# %% [markdown]
# # A model written the way Pyro's tutorials write one, with Flipout and deterministic VI
#
# Pyro's Bayesian-regression tutorial builds its network from `PyroModule[nn.Linear]` layers whose `weight` and
# `bias` are `PyroSample` priors. pyro_bbb's estimators work on such a model unchanged: under
# `pyro_bbb.flipout()` or `pyro_bbb.local_reparameterization()` every weight the guide drew is met where it enters
# torch's `F.linear` (or a convolution), and gets its per-example perturbations, as in pyro_bbb's own layers; under
# `pyro_bbb.moment_propagation()` the model observes through a pyro_bbb likelihood and the ELBO has no Monte Carlo
# noise at all. A weight used any other way (elementwise, say) is a clear error, never a silent no-op.
#
# This script measures, on a 1-20-1 tanh network for 1-D regression written Pyro's way, the standard deviation of
# the ELBO's gradient (over 200 draws at fixed parameters, minibatches of 64) under plain reparameterization, Flipout,
# local reparameterization and moment propagation, trains the model under each, and saves `pyro_style_models.png`:
# the gradient noise per estimator and the four loss traces.

# %%
import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pyro  # noqa: E402
import pyro.distributions as dist  # noqa: E402
import torch  # noqa: E402
from pyro.nn import PyroModule, PyroSample  # noqa: E402

import pyro_bbb  # noqa: E402
from pyro_bbb import likelihoods  # noqa: E402
from pyro_bbb.data import toy_regression  # noqa: E402
from pyro_bbb.evaluate import metrics, plots
from pyro_bbb.infer.estimators import ESTIMATORS  # noqa: E402


class PyroStyleNet(PyroModule):
    """Pyro's tutorial idiom: torch layers made Bayesian with PyroSample priors, observed through a pyro_bbb
    likelihood (which is what lets moment propagation compute the expected log-likelihood)."""

    def __init__(self, hidden: int = 20):
        super().__init__()
        self.hidden = PyroModule[torch.nn.Linear](1, hidden)
        self.hidden.weight = PyroSample(dist.Normal(0.0, 1.0).expand([hidden, 1]).to_event(2))
        self.hidden.bias = PyroSample(dist.Normal(0.0, 1.0).expand([hidden]).to_event(1))
        self.out = PyroModule[torch.nn.Linear](hidden, 1)
        self.out.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, hidden]).to_event(2))
        self.out.bias = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))
        self.likelihood = likelihoods.Gaussian(scale=0.1)

    def forward(self, x, y=None):
        return self.likelihood(self.out(torch.tanh(self.hidden(x))), y)


def gradient_noise(model, guide, x, y, estimator: str, draws: int) -> float:
    """The mean standard deviation, over ``draws`` repeated gradient evaluations, of the ELBO's gradient with respect
    to every posterior mean (the parameters are fixed)."""
    elbo = pyro_bbb.ELBO(num_data=600)
    grads = []
    for _ in range(draws):
        with pyro.poutine.trace(param_only=True) as capture, ESTIMATORS[estimator]():
            elbo.loss_and_grads(model, guide, x, y)
        params = {name: site["value"].unconstrained() for name, site in capture.trace.nodes.items()}
        grads.append(torch.cat([p.grad.reshape(-1) for name, p in sorted(params.items()) if ".locs." in name]))
        for p in params.values():
            p.grad = None
    return float(torch.stack(grads).std(0).mean())


def main(epochs: int, out_dir: Path, progress: bool = True, draws: int = 200) -> dict[str, dict[str, float]]:
    x_train, y_train = toy_regression(600, seed=0)
    x_test, y_test = toy_regression(500, seed=1)
    results, traces = {}, {}
    for estimator in ("reparam", "flipout", "local_reparam", "moments"):
        pyro.clear_param_store()
        torch.manual_seed(0)
        model = PyroStyleNet()
        guide = pyro_bbb.MeanFieldGuide(model, init_scale=0.05)
        guide(x_train[:64], y_train[:64])
        noise = gradient_noise(model, guide, x_train[:64], y_train[:64], estimator, draws)
        history = pyro_bbb.fit(model, guide, (x_train, y_train), epochs=epochs, batch_size=64, lr=1e-2,
                               estimator=estimator, progress=progress, seed=0, kl_weight=1)  # one objective for all
        pyro.set_rng_seed(0)
        pred = pyro_bbb.predict(model, guide, x_test, num_samples=100)
        results[estimator] = {"gradient_std": noise, "test_rmse": metrics.rmse(pred, y_test),
                              "test_log_likelihood": metrics.log_likelihood(pred, y_test)}
        traces[estimator] = history["loss_per_datum"]

    # %% The gradient noise and the loss traces.
    figure, (noise_axis, loss_axis) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(results)
    values = [results[n]["gradient_std"] for n in names]
    noise_axis.bar(names, values)
    for i, value in enumerate(values):  # moment propagation's is exactly 0
        noise_axis.annotate(f"{value:.3g}", (i, value), ha="center", va="bottom")
    noise_axis.set(ylabel="std of the ELBO's gradient per posterior mean", title="gradient noise, batch 64")
    for name, trace in traces.items():
        loss_axis.plot(range(1, len(trace) + 1), trace, label=name)
    loss_axis.set(xlabel="epoch", ylabel="negative ELBO per datum (nats)", title="training loss")
    plots.symlog_yaxis(loss_axis)
    loss_axis.legend()
    plots.save_figure(figure, out_dir / "pyro_style_models.png")

    # %% Numbers.
    print(f"{'':14s} {'gradient std':>13s} {'test RMSE':>10s} {'test log-lik':>13s}")
    for name, row in results.items():
        print(f"{name:14s} {row['gradient_std']:13.4g} {row['test_rmse']:10.3f} {row['test_log_likelihood']:13.3f}")
    return results


# %%
if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "figures")
    args = parser.parse_args()
    main(args.epochs, args.out_dir)
