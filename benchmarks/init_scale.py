"""Which initial posterior std should ``MeanFieldGuide`` use? Measured, not guessed.

Trains the quickstart network (1-50-1 tanh, learned noise, minibatches of 64) and a deeper one (1-100-100-1 ReLU)
from each candidate ``init_scale`` for a fixed budget of SVI steps, over several seeds, and prints the median test
log-likelihood per point and RMSE. Peers use softplus(-3) = 0.049 (bayesian-torch) down to softplus(-7) = 0.0009
(blitz); Pyro's AutoNormal uses 0.1.

    python benchmarks/init_scale.py            # full run (~3 min on 2 cores)
    python benchmarks/init_scale.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import math
import statistics

import pyro
import pyro.distributions as dist
import torch
from models import BayesianMLP  # noqa: E402  (benchmarks/models.py)
from pyro.infer import SVI, Predictive

import pyro_bbb
from pyro_bbb.data import toy_regression

ARCHITECTURES = {"1-50-1 tanh": ([1, 50, 1], torch.tanh), "1-100-100-1 relu": ([1, 100, 100, 1], torch.relu)}


def run(arch: str, init_scale: float, seed: int, steps: int) -> tuple[float, float, float]:
    """Test log-likelihood per point, RMSE, and the negative ELBO per datum the posterior reached (64 particles on
    all the training data: what VI optimises, so a start that stops short of the optimum does not score well)."""
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    x, y = toy_regression(200, seed=seed)
    x_test, y_test = toy_regression(500, seed=1000 + seed, gap=False)
    model = BayesianMLP(*ARCHITECTURES[arch])
    guide = pyro_bbb.MeanFieldGuide(model, init_scale=init_scale)
    svi = SVI(model, guide, pyro.optim.ClippedAdam({"lr": 1e-2, "lrd": 0.1 ** (1 / steps)}),
              pyro_bbb.ELBO(num_data=len(x)))
    step = 0
    while step < steps:
        for idx in torch.randperm(len(x)).split(64):
            svi.step(x[idx], y[idx])
            step += 1
    with torch.no_grad():
        s = Predictive(model, guide=guide, num_samples=100, parallel=True, return_sites=["mean", "sigma"])(x_test)
    mean, sigma = s["mean"].reshape(100, -1), s["sigma"].reshape(100, 1)
    ll = torch.logsumexp(dist.Normal(mean, sigma).log_prob(y_test), 0) - math.log(100)
    with torch.no_grad():
        neg_elbo = pyro_bbb.ELBO(num_data=len(x), num_particles=64).loss(model, guide, x, y) / len(x)
    return ll.mean().item(), (mean.mean(0) - y_test).pow(2).mean().sqrt().item(), neg_elbo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, nargs="*", default=[2000], help="step budgets (default: 2000)")
    args = parser.parse_args()
    scales = [0.1, 0.049, 0.01, 1e-3, 1e-4] if not args.quick else [0.1, 0.01]
    seeds = range(3) if not args.quick else range(1)
    budgets = args.steps if not args.quick else [100]
    print(f"median over {len(seeds)} seeds, test points on [-2, 2] (gap included); -ELBO/N: lower is a better fit")
    print(f"{'architecture':<18} {'steps':>6} {'init_scale':>10} {'test LL':>9} {'RMSE':>7} {'-ELBO/N':>8}")
    for arch in ARCHITECTURES:
        for steps in budgets:
            for scale in scales:
                results = [run(arch, scale, seed, steps) for seed in seeds]
                ll, rmse, neg_elbo = (statistics.median(r[i] for r in results) for i in range(3))
                print(f"{arch:<18} {steps:>6} {scale:>10.4g} {ll:>9.3f} {rmse:>7.3f} {neg_elbo:>8.3f}", flush=True)


if __name__ == "__main__":
    main()
