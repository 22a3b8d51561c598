"""Time per training step: pyro_bbb (each estimator) against hand-written PyTorch and plain Pyro, side by side.

Two MLPs (ReLU): small 1-50-50-1 (regression, batch 100) and medium 784-400-400-10 (classification, batch 128).
Contenders, all with Adam:

* deterministic: the same MLP with ``nn.Linear`` layers (the floor);
* hand-written Bayes-by-Backprop in plain PyTorch: ``mu + softplus(rho) * eps`` per weight, closed-form KL against
  N(0, 1), ``N/B * NLL + KL``;
* plain Pyro: the same Bayesian model with ``AutoNormal`` and ``TraceMeanField_ELBO``;
* pyro_bbb: ``MeanFieldGuide`` + ``pyro_bbb.ELBO(num_data=N)`` + ``pyro_bbb.optim.Adam`` in ``SVI`` (what
  ``pyro_bbb.fit`` runs), with plain reparameterization, Flipout and local reparameterization;
* bayesian-torch (where installed: ``pip install bayesian-torch --no-deps``): ``dnn_to_bnn`` of the deterministic
  net, reparameterization and Flipout, ``N/B * NLL + get_kl_loss``, ``torch.optim.Adam``.

Each round times every contender for ``repeats`` steps (median), rounds are interleaved, and the table reports the
median over rounds. Recurrent nets: pyro_bbb's ``BayesianLSTM`` (reparameterization and Flipout) against
``torch.nn.LSTM`` of the same size and against a hand-written Bayes-by-Backprop LSTM step that samples the same
weights and runs ``torch.nn.LSTM``'s fused kernel with them (``torch.func.functional_call``). ``--profile`` prints
where a pyro_bbb reparameterization step spends its time.

    python benchmarks/step_time.py            # prints the table and ratios
    python benchmarks/step_time.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import importlib.util
import pstats
import statistics
from collections.abc import Callable

import pyro
import torch
import torch.nn.functional as F
from pyro.infer import SVI, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal
from timing import median_ms  # noqa: E402  (benchmarks/timing.py)

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb.nn import BayesianConv2d, BayesianLinear, BayesianLSTM

CONFIGS = {
    "small 1-50-50-1, batch 100": ([1, 50, 50, 1], 100, 10_000),
    "medium 784-400-400-10, batch 128": ([784, 400, 400, 10], 128, 60_000),
}


def make_data(widths, batch, num_batches=8):
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(batch, widths[0], generator=g) for _ in range(num_batches)]
    if widths[-1] == 1:
        ys = [torch.randn(batch, generator=g) for _ in range(num_batches)]
    else:
        ys = [torch.randint(0, widths[-1], (batch,), generator=g) for _ in range(num_batches)]
    return list(zip(xs, ys))


def negative_log_likelihood(output, y):
    if output.shape[-1] == 1:
        return -torch.distributions.Normal(output.squeeze(-1), 0.1).log_prob(y).sum()
    return F.cross_entropy(output, y, reduction="sum")


def mlp(widths) -> torch.nn.Sequential:
    layers = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def deterministic(widths, batch, num_data):
    net = mlp(widths)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)

    def step(x, y):
        optimizer.zero_grad()
        (negative_log_likelihood(net(x), y) / x.shape[0]).backward()
        optimizer.step()

    return step


def hand_written(widths, batch, num_data, init_scale=1e-4):
    mus, rhos = [], []
    for a, b in zip(widths[:-1], widths[1:]):
        ref = torch.nn.Linear(a, b)
        for p in (ref.weight, ref.bias):
            mus.append(torch.nn.Parameter(p.detach().clone()))
            rhos.append(torch.nn.Parameter(torch.full_like(p, float(torch.log(torch.expm1(torch.tensor(init_scale)))))))
    optimizer = torch.optim.Adam(mus + rhos, lr=1e-3)

    def step(x, y):
        optimizer.zero_grad()
        kl, h = 0.0, x
        for i in range(0, len(mus), 2):
            draws = []
            for mu, rho in ((mus[i], rhos[i]), (mus[i + 1], rhos[i + 1])):
                sigma = F.softplus(rho)
                draws.append(mu + sigma * torch.randn_like(mu))
                kl = kl + (0.5 * (sigma**2 + mu**2 - 1) - torch.log(sigma)).sum()
            h = F.linear(h, *draws)
            if i < len(mus) - 2:
                h = torch.relu(h)
        (negative_log_likelihood(h, y) * (num_data / x.shape[0]) + kl).backward()
        optimizer.step()

    return step


def bayesian_torch_step(net: torch.nn.Module, loss: Callable, num_data: int, kind: str, init_scale=1e-4):
    """bayesian-torch 0.5's recipe on ``net`` (converted in place by ``dnn_to_bnn``; ``kind`` "Reparameterization" or
    "Flipout"): ``N/B * NLL + get_kl_loss(net)`` against N(0, 1), ``torch.optim.Adam``."""
    from bayesian_torch.models.dnn_to_bnn import dnn_to_bnn, get_kl_loss

    rho = float(torch.log(torch.expm1(torch.tensor(init_scale))))
    dnn_to_bnn(net, {"prior_mu": 0.0, "prior_sigma": 1.0, "posterior_mu_init": 0.0, "posterior_rho_init": rho,
                     "type": kind, "moped_enable": False})
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)

    def step(x, y):
        optimizer.zero_grad()
        (loss(net(x), y) * (num_data / x.shape[0]) + get_kl_loss(net)).backward()
        optimizer.step()

    return step


def bayesian_torch(kind: str):
    def build(widths, batch, num_data):
        return bayesian_torch_step(mlp(widths), negative_log_likelihood, num_data, kind)

    return build


#: bayesian-torch's rows appear where it is installed (``pip install bayesian-torch --no-deps``: an optional
#: benchmark extra; its declared requirements would pull a CUDA build of torch, and its layers need none of them).
HAVE_BAYESIAN_TORCH = importlib.util.find_spec("bayesian_torch") is not None


def bayesian_model(widths):
    layers = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [BayesianLinear(a, b), torch.nn.ReLU()]
    likelihood = likelihoods.Gaussian(scale=0.1) if widths[-1] == 1 else likelihoods.Categorical()
    return pyro_bbb.BNN(torch.nn.Sequential(*layers[:-1]), likelihood)


def plain_pyro(widths, batch, num_data):
    model = bayesian_model(widths)
    model.num_data = num_data  # the likelihood scaled by N / B through the model's data plate (Pyro's ELBO has no N)
    guide = AutoNormal(model, init_scale=1e-4)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-3}), TraceMeanField_ELBO())
    return svi.step


def svi_step(model, num_data: int, estimator: Callable, natural_gradient: bool = False):
    """pyro_bbb's training step for ``model``: MeanFieldGuide, pyro_bbb.ELBO and Adam (or IVON) in SVI, under
    ``estimator``."""
    guide = pyro_bbb.MeanFieldGuide(model)
    optimizer = pyro_bbb.optim.IVON(guide, num_data=num_data) if natural_gradient else pyro_bbb.optim.Adam(lr=1e-3)
    svi = SVI(model, guide, optimizer, pyro_bbb.ELBO(num_data=num_data))

    def step(x, y):
        with estimator():
            svi.step(x, y)

    return step


def ours(estimator: Callable, natural_gradient: bool = False):
    def build(widths, batch, num_data):
        return svi_step(bayesian_model(widths), num_data, estimator, natural_gradient)

    return build


def ivon_opt(widths, batch, num_data):
    """``ivon-opt`` 0.1.3 on the deterministic net (its own weight sampling, one draw per step)."""
    import ivon

    net = mlp(widths)
    optimizer = ivon.IVON(net.parameters(), lr=0.1, ess=num_data, beta2=0.99, weight_decay=1.0 / num_data)

    def step(x, y):
        with optimizer.sampled_params(train=True):
            optimizer.zero_grad()
            (negative_log_likelihood(net(x), y) / x.shape[0]).backward()
        optimizer.step()

    return step


CONTENDERS = {
    "deterministic MLP": deterministic,
    "hand-written PyTorch BbB": hand_written,
    "plain Pyro (AutoNormal)": plain_pyro,
    "pyro_bbb reparam": ours(contextlib.nullcontext),
    "pyro_bbb flipout": ours(pyro_bbb.flipout),
    "pyro_bbb local reparam": ours(pyro_bbb.local_reparameterization),
    "pyro_bbb IVON reparam": ours(contextlib.nullcontext, natural_gradient=True),
}
if importlib.util.find_spec("ivon") is not None:  # pip install --no-deps ivon-opt==0.1.3
    CONTENDERS["ivon-opt (deterministic net)"] = ivon_opt
if HAVE_BAYESIAN_TORCH:
    CONTENDERS |= {"bayesian-torch reparam": bayesian_torch("Reparameterization"),
                   "bayesian-torch flipout": bayesian_torch("Flipout")}


def run(name, widths, batch, num_data, repeats, rounds) -> dict[str, float]:
    builds = {contender: lambda b=build: b(widths, batch, num_data) for contender, build in CONTENDERS.items()}
    return time_contenders(builds, make_data(widths, batch), repeats, rounds)


def time_contenders(builds: dict[str, Callable], data: list, repeats: int, rounds: int) -> dict[str, float]:
    """Median ms per step of each contender (``build()`` -> ``step(x, y)``), interleaved rounds on ``data``."""
    steps = {}
    for contender, build in builds.items():
        pyro.clear_param_store()  # each Pyro contender gets its own parameters
        torch.manual_seed(0)
        steps[contender] = build()
        for x, y in data[:3]:  # warm-up (and guide set-up)
            steps[contender](x, y)
    times: dict[str, list[float]] = {c: [] for c in steps}
    counter = iter(range(10**9))
    for _ in range(rounds):
        for contender, step in steps.items():
            times[contender].append(median_ms(lambda s=step: s(*data[next(counter) % len(data)]), repeats))
    return {c: statistics.median(t) for c, t in times.items()}


# -- a small CNN: digits-sized images, two convolutions and a linear head ---------------------------------
CNN = ("CNN 8x8 digits: conv 1->8, conv 8->16 (3x3), linear 1024->10, batch 128", 128, 1_797)


def cnn_data(batch, num_batches=8):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(batch, 1, 8, 8, generator=g), torch.randint(0, 10, (batch,), generator=g))
            for _ in range(num_batches)]


def cnn_modules(conv, linear):
    return [conv(1, 8, 3, padding=1), torch.nn.ReLU(), conv(8, 16, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Flatten(), linear(16 * 8 * 8, 10)]


def cnn_deterministic(batch, num_data):
    net = torch.nn.Sequential(*cnn_modules(torch.nn.Conv2d, torch.nn.Linear))
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)

    def step(x, y):
        optimizer.zero_grad()
        (F.cross_entropy(net(x), y, reduction="sum") / x.shape[0]).backward()
        optimizer.step()

    return step


def cnn_hand_written(batch, num_data, init_scale=1e-4):
    reference = torch.nn.Sequential(*cnn_modules(torch.nn.Conv2d, torch.nn.Linear))
    layers = [m for m in reference if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)]
    rho = float(torch.log(torch.expm1(torch.tensor(init_scale))))
    mus = [torch.nn.Parameter(p.detach().clone()) for m in layers for p in (m.weight, m.bias)]
    rhos = [torch.nn.Parameter(torch.full_like(mu, rho)) for mu in mus]
    optimizer = torch.optim.Adam(mus + rhos, lr=1e-3)

    def step(x, y):
        optimizer.zero_grad()
        kl, draws = 0.0, []
        for mu, r in zip(mus, rhos):
            sigma = F.softplus(r)
            draws.append(mu + sigma * torch.randn_like(mu))
            kl = kl + (0.5 * (sigma**2 + mu**2 - 1) - torch.log(sigma)).sum()
        h = torch.relu(F.conv2d(x, draws[0], draws[1], padding=1))
        h = torch.relu(F.conv2d(h, draws[2], draws[3], padding=1))
        logits = F.linear(h.flatten(1), draws[4], draws[5])
        (F.cross_entropy(logits, y, reduction="sum") * (num_data / x.shape[0]) + kl).backward()
        optimizer.step()

    return step


def cnn_ours(estimator: Callable):
    def build(batch, num_data):
        model = pyro_bbb.BNN(torch.nn.Sequential(*cnn_modules(BayesianConv2d, BayesianLinear)),
                             likelihoods.Categorical())
        return svi_step(model, num_data, estimator)

    return build


def cnn_bayesian_torch(kind: str):
    def build(batch, num_data):
        net = torch.nn.Sequential(*cnn_modules(torch.nn.Conv2d, torch.nn.Linear))
        return bayesian_torch_step(net, lambda logits, y: F.cross_entropy(logits, y, reduction="sum"), num_data, kind)

    return build


CNN_CONTENDERS = {
    "deterministic CNN": cnn_deterministic,
    "hand-written PyTorch BbB": cnn_hand_written,
    "pyro_bbb reparam": cnn_ours(contextlib.nullcontext),
    "pyro_bbb flipout": cnn_ours(pyro_bbb.flipout),
    "pyro_bbb local reparam": cnn_ours(pyro_bbb.local_reparameterization),
}
if HAVE_BAYESIAN_TORCH:
    CNN_CONTENDERS |= {"bayesian-torch reparam": cnn_bayesian_torch("Reparameterization"),
                       "bayesian-torch flipout": cnn_bayesian_torch("Flipout")}


def run_cnn(batch, num_data, repeats, rounds) -> dict[str, float]:
    builds = {contender: lambda b=build: b(batch, num_data) for contender, build in CNN_CONTENDERS.items()}
    return time_contenders(builds, cnn_data(batch), repeats, rounds)


RECURRENT = {
    "LSTM 7->4, T = 12, batch 32 (Embedded Reber)": (7, 4, 12, 32),
    "LSTM 32->128, T = 20, batch 64": (32, 128, 20, 64),
}


def recurrent_steps(input_size, hidden, steps, batch):
    """torch.nn.LSTM (deterministic, Adam) against pyro_bbb's BayesianLSTM under each estimator."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(batch, steps, input_size, generator=g), torch.randint(0, 2, (batch,), generator=g).float()

    class LastStep(torch.nn.Module):
        def __init__(self, rnn):
            super().__init__()
            self.rnn, self.head = rnn, torch.nn.Linear(hidden, 1)

        def forward(self, x):
            return self.head(self.rnn(x)[0][..., -1, :])

    torch.manual_seed(0)
    plain = LastStep(torch.nn.LSTM(input_size, hidden, batch_first=True))
    optimizer = torch.optim.Adam(plain.parameters(), lr=1e-3)

    def torch_step():
        optimizer.zero_grad()
        F.binary_cross_entropy_with_logits(plain(x).squeeze(-1), y).backward()
        optimizer.step()

    # hand-written Bayes-by-Backprop LSTM: sample every LSTM weight (mu + softplus(rho) * eps), closed-form KL,
    # and run torch.nn.LSTM's own fused kernel with the sampled weights
    torch.manual_seed(0)
    reference = LastStep(torch.nn.LSTM(input_size, hidden, batch_first=True))
    rho0 = float(torch.log(torch.expm1(torch.tensor(1e-4))))
    mus = {n: torch.nn.Parameter(p.detach().clone()) for n, p in reference.rnn.named_parameters()}
    rhos = {n: torch.nn.Parameter(torch.full_like(p, rho0)) for n, p in reference.rnn.named_parameters()}
    hand_optimizer = torch.optim.Adam([*mus.values(), *rhos.values(), *reference.head.parameters()], lr=1e-3)
    num_data = 10 * batch

    def hand_written_step():
        hand_optimizer.zero_grad()
        kl, weights = 0.0, {}
        for n, mu in mus.items():
            sigma = F.softplus(rhos[n])
            weights[n] = mu + sigma * torch.randn_like(mu)
            kl = kl + (0.5 * (sigma**2 + mu**2 - 1) - torch.log(sigma)).sum()
        out, _ = torch.func.functional_call(reference.rnn, weights, (x,))
        nll = F.binary_cross_entropy_with_logits(reference.head(out[:, -1]).squeeze(-1), y, reduction="sum")
        (nll * (num_data / batch) + kl).backward()
        hand_optimizer.step()

    contenders = {"torch.nn.LSTM (deterministic)": torch_step, "hand-written BbB LSTM": hand_written_step}
    pyro.clear_param_store()
    model = pyro_bbb.BNN(LastStep(BayesianLSTM(input_size, hidden, batch_first=True)), likelihoods.Bernoulli())
    guide = pyro_bbb.MeanFieldGuide(model)
    svi = SVI(model, guide, pyro_bbb.optim.Adam(lr=1e-3), pyro_bbb.ELBO(num_data=10 * batch))
    for name, estimator in (("BayesianLSTM reparam", lambda: pyro.poutine.messenger.Messenger()),
                            ("BayesianLSTM flipout", pyro_bbb.flipout)):

        def step(estimator=estimator):
            with estimator():
                svi.step(x, y)

        step()
        contenders[name] = step
    return contenders


def profile(widths, batch, num_data, steps=200) -> None:
    pyro.clear_param_store()
    data = make_data(widths, batch)
    step = ours(contextlib.nullcontext)(widths, batch, num_data)
    step(*data[0])
    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(steps):
        step(*data[i % len(data)])
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def print_table(title: str, result: dict[str, float], hand: str, floor: str, floor_label: str, width: int) -> None:
    """One table: ms per step and the ratios to the hand-written and the deterministic contenders."""
    print(f"\n{title}")
    print(f"  {'':{width}s} {'ms/step':>8s} {'/ hand-written':>15s} {'/ ' + floor_label:>16s}")
    for contender, ms in result.items():
        print(f"  {contender:{width}s} {ms:8.2f} {ms / result[hand]:15.2f} {ms / result[floor]:16.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--profile", choices=list(CONFIGS), default=None)
    parser.add_argument("--recurrent-only", action="store_true", help="only the LSTM rows")
    args = parser.parse_args()
    if args.profile:
        profile(*CONFIGS[args.profile])
        return
    repeats, rounds = (5, 1) if args.quick else (40, 7)
    print(f"torch {torch.__version__}, pyro {pyro.__version__}, {torch.get_num_threads()} threads; "
          f"median ms per step over {rounds} interleaved rounds x {repeats} steps")
    for name, sizes in RECURRENT.items():
        contenders = recurrent_steps(*sizes)
        times = {c: [] for c in contenders}
        for _ in range(rounds):
            for contender, step in contenders.items():
                times[contender].append(median_ms(step, max(5, repeats // 2)))
        result = {c: statistics.median(t) for c, t in times.items()}
        print_table(name, result, "hand-written BbB LSTM", "torch.nn.LSTM (deterministic)", "torch.nn.LSTM", 30)
    if args.recurrent_only:
        return
    for name, (widths, batch, num_data) in CONFIGS.items():
        result = run(name, widths, batch, num_data, repeats, rounds)
        print_table(f"{name} (N = {num_data})", result, "hand-written PyTorch BbB", "deterministic MLP",
                    "deterministic", 28)
    name, batch, num_data = CNN
    result = run_cnn(batch, num_data, repeats, rounds)
    print_table(f"{name} (N = {num_data})", result, "hand-written PyTorch BbB", "deterministic CNN", "deterministic",
                28)

if __name__ == "__main__":
    main()
