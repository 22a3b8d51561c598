import subprocess
import sys
from pathlib import Path

import pyro
import pytest
import torch

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb.nn import BayesianLinear

pytest.importorskip("lightning")
SCRIPT = Path(__file__).with_name("lightning_script.py")


def _run(devices, out):
    result = subprocess.run([sys.executable, str(SCRIPT), str(devices), str(out)], capture_output=True, text=True,
                            timeout=300, cwd=SCRIPT.parent.parent)
    assert result.returncode == 0, result.stderr[-3000:]


def _predictions(path):
    pyro.clear_param_store()
    net = torch.nn.Sequential(BayesianLinear(2, 8), torch.nn.Tanh(), BayesianLinear(8, 1))
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.2))
    guide = pyro_bbb.load(path, bnn, pyro_bbb.MeanFieldGuide(bnn))
    pyro.set_rng_seed(0)
    grid = torch.linspace(-2, 2, 50).unsqueeze(-1).expand(50, 2)
    return pyro_bbb.predict(bnn, guide, grid, num_samples=200), guide


@pytest.mark.slow
def test_lightning_ddp_on_two_processes_matches_one_process(tmp_path):
    _run(2, tmp_path / "ddp.pt")
    _run(1, tmp_path / "single.pt")
    ddp, ddp_guide = _predictions(tmp_path / "ddp.pt")
    single, single_guide = _predictions(tmp_path / "single.pt")
    # the same initialisation, batches and noise: the gradients averaged over the two ranks are the single
    # process's, so the fits agree up to floating-point summation order
    for name, value in single_guide.state_dict().items():
        torch.testing.assert_close(ddp_guide.state_dict()[name], value, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ddp.mean, single.mean, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_lightning_ddp_nan_on_one_rank_stops_every_rank_with_its_message(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), "2", str(tmp_path / "nan.pt"), "nan"], capture_output=True,
                            text=True, timeout=300, cwd=SCRIPT.parent.parent)
    assert result.returncode != 0
    assert "rank 1 failed" in result.stderr and "nan" in result.stderr.lower(), result.stderr[-3000:]

