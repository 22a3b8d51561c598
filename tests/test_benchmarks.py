"""Every benchmark script runs in its --quick mode (CI runs these; the tables come from full runs)."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
UCI = BENCHMARKS.parents[1] / "shared" / "uci"


@pytest.mark.slow
@pytest.mark.parametrize(
    "script",
    ["step_time.py", "predict.py", "fit_overhead.py", "gradient_variance.py", "init_scale.py", "classification.py",
     "uci.py", "reber_convergence.py", "memory.py", "natural_gradient.py", "evidence.py", "uncertainty.py",
     "held_out_tasks.py", "training_longer.py"],
)
def test_benchmark_quick_mode(script):
    if script in ("uci.py", "evidence.py", "training_longer.py") and not UCI.exists():
        pytest.skip("the UCI data (../shared/uci) is not available here")
    result = subprocess.run([sys.executable, str(BENCHMARKS / script), "--quick"], capture_output=True, text=True,
                            timeout=600, cwd=BENCHMARKS)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip()


@pytest.mark.slow
def test_uci_early_stopping_with_refit_runs():
    if not UCI.exists():
        pytest.skip("the UCI data (../shared/uci) is not available here")
    command = [sys.executable, str(BENCHMARKS / "uci.py"), "--quick", "--early-stopping", "1", "--refit"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=BENCHMARKS)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Early-stopped on a 10% validation split (patience 1" in result.stdout


def test_uci_convergence_check():
    """The benchmark's convergence columns: the raw last-epoch change, and History.drift of the loss and std ratio."""
    import doctest
    import importlib.util

    import pyro_bbb

    spec = importlib.util.spec_from_file_location("uci", BENCHMARKS / "uci.py")
    uci = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(uci)
    assert doctest.testmod(uci, verbose=False).failed == 0
    history = pyro_bbb.train.History()
    # a loss jittering around a flat end: no drift, while the raw last-epoch change sees the jitter
    for epoch, loss in enumerate([10.0] * 10 + [1.0, 1.2] * 50, 1):
        history.append({"epoch": epoch, "loss": loss, "std_ratio": {"a": 1.0, "b": 2.0 - epoch / 110}})
    change, drift, std_drift = uci.convergence(history)
    assert drift < 0.003 and change == pytest.approx(0.2 / 1.2)
    assert std_drift == pytest.approx(history.drift("std_ratio")["b"]) and std_drift == pytest.approx(11 / 99)


def test_the_diagonal_last_layer_laplace_is_the_exact_hessian_diagonal_on_a_linear_model():
    """Softmax regression (the last layer on identity features): the Laplace precision's diagonal equals the exact
    Hessian diagonal of the negative log posterior (cross-entropy summed, plus the prior precision's quadratic), at any
    weights -- for a linear model with the canonical link the generalised Gauss-Newton matrix is the Hessian."""
    import importlib.util
    import sys

    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("baselines", BENCHMARKS / "baselines.py")
        baselines = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(baselines)
    finally:
        sys.path.remove(str(BENCHMARKS))
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 3, generator=g, dtype=torch.float64)
    y = torch.randint(0, 4, (60,), generator=g)
    last = torch.nn.Linear(3, 4).double()
    laplace = baselines.DiagonalLastLayerLaplace(lambda inputs: inputs, last).fit(x)
    laplace.prior_precision = 0.7
    augmented = torch.cat([x, torch.ones(60, 1, dtype=torch.float64)], -1)

    def negative_log_posterior(theta):
        logits = augmented @ theta.view(4, 4).T
        return torch.nn.functional.cross_entropy(logits, y, reduction="sum") + 0.35 * theta.square().sum()

    theta = torch.cat([last.weight, last.bias.unsqueeze(-1)], -1).detach().reshape(-1)
    hessian = torch.autograd.functional.hessian(negative_log_posterior, theta)
    torch.testing.assert_close(laplace.precision().reshape(-1), torch.diagonal(hessian), rtol=1e-10, atol=1e-10)
    draws = laplace.probs(x[:5], num_samples=100)
    assert draws.shape == (100, 5, 4) and torch.allclose(draws.sum(-1), torch.ones(100, 5, dtype=torch.float64))


@pytest.mark.slow
def test_uncertainty_sweep_runs_fixed_weights_beside_the_deterministic_net():
    command = [sys.executable, str(BENCHMARKS / "uncertainty.py"), "--quick", "--sweep", "1", "0.01", "--tasks",
               "digits MLP"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=BENCHMARKS)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| digits MLP |")]
    assert [row.split("|")[2].strip() for row in rows] == ["deterministic", "kl_weight=1", "kl_weight=0.01"]
