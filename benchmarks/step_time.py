"""Step time of pyro_bbb against a hand-written PyTorch Bayes-by-Backprop step, measured side by side.

Both train the same MLP (32-256-256-1, ReLU, Normal(0, 1) prior, closed-form KL, Gaussian likelihood, Adam)
on minibatches of 128 out of N = 10,000. The hand-written step is the minimum a PyTorch user would write:
``mu + softplus(rho) * eps`` per layer, ``N/B * NLL + KL``, backward, Adam. Also compares posterior prediction with
all weight draws vectorized (``Predictive(parallel=True)``) against a Python loop over draws.

    python benchmarks/step_time.py            # prints medians and ratios
    python benchmarks/step_time.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import statistics

import pyro
import torch
import torch.nn.functional as F
from models import BayesianMLP  # noqa: E402  (benchmarks/models.py)
from pyro.infer import SVI, Predictive
from timing import median_ms  # noqa: E402  (benchmarks/timing.py)

import pyro_bbb

WIDTHS = [32, 256, 256, 1]
N, B = 10_000, 128


class HandWritten(torch.nn.Module):
    """Bayes-by-Backprop in plain PyTorch: the baseline."""

    def __init__(self, init_scale: float):
        super().__init__()
        rho = torch.log(torch.expm1(torch.tensor(init_scale)))
        self.mu = torch.nn.ParameterList()
        self.rho = torch.nn.ParameterList()
        for a, b in zip(WIDTHS[:-1], WIDTHS[1:]):
            ref = torch.nn.Linear(a, b)
            for p in (ref.weight, ref.bias):
                self.mu.append(torch.nn.Parameter(p.detach().clone()))
                self.rho.append(torch.nn.Parameter(torch.full_like(p, rho.item())))

    def loss(self, x, y):
        kl = 0.0
        h = x
        for i in range(0, len(self.mu), 2):
            draws = []
            for mu, rho in ((self.mu[i], self.rho[i]), (self.mu[i + 1], self.rho[i + 1])):
                sigma = F.softplus(rho)
                draws.append(mu + sigma * torch.randn_like(mu))
                kl = kl + (0.5 * (sigma**2 + mu**2 - 1) - torch.log(sigma)).sum()
            h = F.linear(h, *draws)
            if i < len(self.mu) - 2:
                h = torch.relu(h)
        nll = -torch.distributions.Normal(h.squeeze(-1), 0.1).log_prob(y).sum() * (N / x.shape[0])
        return nll + kl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeats, rounds = (20, 2) if args.quick else (200, 5)
    torch.manual_seed(0)
    x, y = torch.randn(N, WIDTHS[0]), torch.randn(N)
    batches = [torch.randint(0, N, (B,)) for _ in range(16)]

    pyro.clear_param_store()
    model = BayesianMLP(WIDTHS, torch.relu, sigma=0.1)
    guide = pyro_bbb.MeanFieldGuide(model)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-3}), pyro_bbb.ELBO(num_data=N))
    svi.step(x[batches[0]], y[batches[0]])
    hand = HandWritten(pyro_bbb.DEFAULT_INIT_SCALE)
    optimizer = torch.optim.Adam(hand.parameters(), lr=1e-3)

    def hand_step(idx):
        optimizer.zero_grad()
        loss = hand.loss(x[idx], y[idx])
        loss.backward()
        optimizer.step()

    counter = {"i": 0}

    def next_batch():
        counter["i"] += 1
        return batches[counter["i"] % len(batches)]

    ours, theirs = [], []
    for _ in range(rounds):  # interleave so that both see the same machine state
        ours.append(median_ms(lambda: svi.step(x[(i := next_batch())], y[i]), repeats))
        theirs.append(median_ms(lambda: hand_step(next_batch()), repeats))
    step_ours, step_hand = statistics.median(ours), statistics.median(theirs)

    x_test = x[:500]
    S = 100
    with torch.no_grad():
        vectorized = Predictive(model, guide=guide, num_samples=S, parallel=True, return_sites=["_RETURN"])
        looped = Predictive(model, guide=guide, num_samples=S, parallel=False, return_sites=["_RETURN"])
        pred_vec = statistics.median(median_ms(lambda: vectorized(x_test), 2) for _ in range(rounds))
        pred_loop = statistics.median(median_ms(lambda: looped(x_test), 1) for _ in range(rounds))

    print(f"MLP {'-'.join(map(str, WIDTHS))}, batch {B} of N = {N}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; medians of {rounds} rounds x {repeats} steps")  # fmt: skip
    print(f"{'SVI step, pyro_bbb (ELBO + MeanFieldGuide)':<48} {step_ours:8.2f} ms")
    print(f"{'hand-written PyTorch BbB step':<48} {step_hand:8.2f} ms")
    print(f"{'ratio pyro_bbb / hand-written':<48} {step_ours / step_hand:8.2f}")
    print(f"{f'predict {S} draws x 500 points, vectorized':<48} {pred_vec:8.2f} ms")
    print(f"{f'predict {S} draws x 500 points, Python loop':<48} {pred_loop:8.2f} ms")
    print(f"{'speed-up of vectorized prediction':<48} {pred_loop / pred_vec:8.1f}x")


if __name__ == "__main__":
    main()
