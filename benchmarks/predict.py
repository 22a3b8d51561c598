"""Vectorized ``pyro_bbb.predict`` against the same function looping over weight draws, side by side.

Both paths use the same S weight draws and give the same numbers (checked here and in tests/test_predictive.py);
the vectorized one runs the network once for all draws inside a sample plate.

    python benchmarks/predict.py            # prints medians and ratios
    python benchmarks/predict.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import statistics

import pyro
import torch
from timing import median_ms  # noqa: E402  (benchmarks/timing.py)

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb.nn import BayesianLinear, BayesianLSTM

CASES = {
    # name: (layer widths, likelihood, number of test inputs)
    "digits MLP 64-100-10, 450 inputs": ([64, 100, 10], likelihoods.Categorical, 450),
    "regression MLP 32-256-256-1, 500 inputs": ([32, 256, 256, 1], lambda: likelihoods.Gaussian(0.1), 500),
    "small MLP 8-50-1, 100 inputs": ([8, 50, 1], lambda: likelihoods.Gaussian(0.1), 100),
}


def converted_cnn(num_inputs=450):
    """A trained-style torch CNN (conv, BatchNorm, MaxPool, nn.Flatten, linear head) converted by bayesianize."""
    torch.manual_seed(0)
    cnn = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 10),
    )
    cnn(torch.randn(64, 1, 8, 8))  # running statistics
    model = pyro_bbb.BNN(pyro_bbb.bayesianize(cnn), likelihoods.Categorical()).eval()
    return model, torch.randn(num_inputs, 1, 8, 8), torch.randint(0, 10, (num_inputs,))


class LastStep(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = BayesianLSTM(7, 8, batch_first=True)
        self.head = BayesianLinear(8, 2)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


def reber_lstm():
    """The Embedded Reber Grammar model of the recurrent tutorial: out[:, -1] after a batch-first LSTM."""
    torch.manual_seed(0)
    return pyro_bbb.BNN(LastStep(), likelihoods.Categorical()), torch.randn(200, 12, 7), torch.randint(0, 2, (200,))


MODELS = {"converted CNN (BatchNorm, MaxPool, Flatten), 450 inputs": converted_cnn,
          "converted CNN (BatchNorm, MaxPool, Flatten), 32 inputs": lambda: converted_cnn(32),
          "LSTM(8) last step, ERG 200 x 12": reber_lstm}


def build(widths, likelihood):
    layers = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [BayesianLinear(a, b), torch.nn.ReLU()]
    return pyro_bbb.BNN(torch.nn.Sequential(*layers[:-1]), likelihood())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--num-samples", type=int, default=100)
    args = parser.parse_args()
    repeats, rounds = (2, 1) if args.quick else (5, 3)
    if args.quick:
        args.num_samples = min(args.num_samples, 20)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, S = {args.num_samples} weight draws")
    print(f"{'case':58s} {'vectorized':>11s} {'loop':>10s} {'speed-up':>9s}")
    for name in [*CASES, *MODELS]:
        pyro.clear_param_store()
        if name in MODELS:
            model, x, y = MODELS[name]()
        else:
            widths, likelihood, n = CASES[name]
            torch.manual_seed(0)
            model = build(widths, likelihood)
            x = torch.randn(n, widths[0])
            y = torch.randint(0, widths[-1], (n,)) if widths[-1] > 1 else torch.randn(n)
        guide = pyro_bbb.MeanFieldGuide(model, init_scale=0.05)
        guide(x, y)

        def run(vectorize, model=model, guide=guide, x=x):
            pyro.set_rng_seed(0)
            return pyro_bbb.predict(model, guide, x, num_samples=args.num_samples, vectorize=vectorize)

        a, b = run(None), run(False)
        assert torch.allclose(a.samples.float(), b.samples.float(), atol=1e-4), "the two paths disagree"
        vectorized, looped = [], []
        for _ in range(rounds):  # interleaved rounds: both see the same machine state
            vectorized.append(median_ms(lambda: run(None), repeats))
            looped.append(median_ms(lambda: run(False), repeats))
        v, loop = statistics.median(vectorized), statistics.median(looped)
        print(f"{name:58s} {v:9.1f}ms {loop:8.1f}ms {loop / v:8.1f}x")
        if name.startswith("regression") and not args.quick:
            sweep_block_sizes(name, model, guide, x, args.num_samples, repeats, rounds)


def sweep_block_sizes(name, model, guide, x, num_samples, repeats, rounds) -> None:
    """Why CPU predictions run in cache-sized blocks of draws: time per block size on the largest network."""
    shapes = {n: s["value"].shape for n, s in guide.prototype_trace.iter_stochastic_nodes()}
    automatic = pyro_bbb.prediction.predictive.draws_per_block(num_samples, x, shapes)
    print(f"    draws per vectorized call (automatic choice on this device: {automatic}):")
    for block in (1, 4, 8, 16, 32, num_samples):
        times = [median_ms(lambda b=block: pyro_bbb.predict(model, guide, x, num_samples=num_samples,
                                                             sample_batch_size=b), repeats) for _ in range(rounds)]
        print(f"      sample_batch_size={block:4d}: {statistics.median(times):7.1f} ms")


if __name__ == "__main__":
    main()
