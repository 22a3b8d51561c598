"""What ``pyro_bbb.fit`` costs over a bare ``pyro.infer.SVI`` loop, measured side by side.

Both run the same epochs (digits-sized data: N = 1348, 64 inputs, batches of 128, a 64-100-10 Bayesian MLP,
``pyro_bbb.ELBO``, Adam) of the same objective (``kl_weight=1``, as the loop). ``fit`` adds: data checks, the
finiteness check and rollback snapshot of every step, global gradient clipping when asked, and the per-layer summary
(KL, posterior std) at the end of each epoch. The last row is ``fit``'s defaults, the KL weight's selection included
(a MAP warm start, a path of three candidates, then the same epochs): what choosing the weight costs, not overhead.
Times are the process's CPU time (one thread: the wall time of an idle machine, without what other jobs on a shared
one take from it), medians of interleaved rounds.

    python benchmarks/fit_overhead.py            # prints medians and the ratio
    python benchmarks/fit_overhead.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import statistics
import time

import pyro
import torch
from pyro.infer import SVI

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb.nn import BayesianLinear

N, D, C, B = 1348, 64, 10, 128


def build():
    pyro.clear_param_store()
    torch.manual_seed(0)
    net = torch.nn.Sequential(BayesianLinear(D, 100), torch.nn.ReLU(), BayesianLinear(100, C))
    model = pyro_bbb.BNN(net, likelihoods.Categorical())
    return model, pyro_bbb.MeanFieldGuide(model)


def time_fit(x, y, epochs, **kwargs) -> float:
    model, guide = build()
    start = time.process_time()
    pyro_bbb.fit(model, guide, (x, y), epochs=epochs, batch_size=B, lr=1e-2, progress=False, seed=0, **kwargs)
    return time.process_time() - start


def time_svi(x, y, epochs) -> float:
    model, guide = build()
    pyro.set_rng_seed(0)
    svi = SVI(model, guide, pyro_bbb.optim.Adam(lr=1e-2), pyro_bbb.ELBO(num_data=N))  # fit's default optimizer
    start = time.process_time()
    for _ in range(epochs):
        for idx in torch.randperm(N).split(B):
            svi.step(x[idx], y[idx])
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)  # CPU time of one thread (more would add their spin-waits)
    epochs, rounds = (2, 1) if args.quick else (20, 7)
    x, y = torch.rand(N, D), torch.randint(0, C, (N,))
    steps = epochs * -(-N // B)
    results = {"SVI loop": [], "fit": [], "fit, clip_norm=5": [], "fit, defaults (auto)": []}
    for _ in range(rounds):  # interleaved rounds
        results["SVI loop"].append(time_svi(x, y, epochs))
        results["fit"].append(time_fit(x, y, epochs, kl_weight=1))
        results["fit, clip_norm=5"].append(time_fit(x, y, epochs, kl_weight=1, clip_norm=5.0))
        results["fit, defaults (auto)"].append(time_fit(x, y, epochs))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {epochs} epochs = {steps} steps, "
          f"medians of {rounds} rounds")
    base = statistics.median(results["SVI loop"])
    for name, times in results.items():
        ms = 1000 * statistics.median(times) / steps
        print(f"  {name:20s} {ms:6.2f} ms/step   ratio to SVI loop {statistics.median(times) / base:5.2f}")


if __name__ == "__main__":
    main()
