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
from pyro_bbb.datasets import toy_regression

ARCHITECTURES = {"1-50-1 tanh": ([1, 50, 1], torch.tanh), "1-100-100-1 relu": ([1, 100, 100, 1], torch.relu)}


def run(arch: str, init_scale: float, seed: int, steps: int) -> tuple[float, float]:
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    x, y = toy_regression(200, seed=seed)
    x_test, y_test = toy_regression(500, seed=1000 + seed, gap=False)
    model = BayesianMLP(*ARCHITECTURES[arch])
    guide = pyro_bbb.MeanFieldGuide(model, init_scale=init_scale)
    svi = SVI(model, guide, pyro.optim.ClippedAdam({"lr": 1e-2, "lrd": 0.1 ** (1 / steps)}),
              pyro_bbb.ELBO(num_data=len(x)))  # fmt: skip
    step = 0
    while step < steps:
        for idx in torch.randperm(len(x)).split(64):
            svi.step(x[idx], y[idx])
            step += 1
    with torch.no_grad():
        s = Predictive(model, guide=guide, num_samples=100, parallel=True, return_sites=["mean", "sigma"])(x_test)
    mean, sigma = s["mean"].reshape(100, -1), s["sigma"].reshape(100, 1)
    ll = torch.logsumexp(dist.Normal(mean, sigma).log_prob(y_test), 0) - math.log(100)
    return ll.mean().item(), (mean.mean(0) - y_test).pow(2).mean().sqrt().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    scales = [0.1, 0.049, 0.01, 1e-3, 1e-4] if not args.quick else [0.1, 0.01]
    seeds = range(3) if not args.quick else range(1)
    steps = 2000 if not args.quick else 100
    print(f"median over {len(seeds)} seeds, {steps} SVI steps, test points on [-2, 2] (gap included)")
    print(f"{'architecture':<18} {'init_scale':>10} {'test LL':>9} {'RMSE':>7}")
    for arch in ARCHITECTURES:
        for scale in scales:
            results = [run(arch, scale, seed, steps) for seed in seeds]
            ll = statistics.median(r[0] for r in results)
            rmse = statistics.median(r[1] for r in results)
            print(f"{arch:<18} {scale:>10.4g} {ll:>9.3f} {rmse:>7.3f}", flush=True)


if __name__ == "__main__":
    main()
