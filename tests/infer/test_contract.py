"""The optimizer checks the objective that computed its gradients (``pyro_bbb.infer.contract``): IVON in a plain SVI
loop, with MeanFieldGuide or AutoNormal, and under Lightning, refuses the five wrong pairings with a clear error
before any parameter changes; the right pairing trains."""

import pyro
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal

import pyro_bbb
from pyro_bbb import ELBO, MeanFieldGuide, likelihoods
from pyro_bbb.infer.contract import latest_objective_run, note_objective_run
from pyro_bbb.infer.schedules import Constant, LinearWarmup
from pyro_bbb.nn import BayesianLinear
from pyro_bbb.optim import IVON

N = 200

WRONG = {  # objective -> what the error names
    "warm-up": (lambda: ELBO(num_data=N, kl_weight=LinearWarmup(100)), "kl_weight=LinearWarmup"),
    "kl_weight 0.1": (lambda: ELBO(num_data=N, kl_weight=0.1), "kl_weight=Constant"),
    "another N": (lambda: ELBO(num_data=100), r"IVON\(num_data=200\) disagrees with the objective, which scales the "
                                              r"data to N=100"),
    "Trace_ELBO": (Trace_ELBO, "pyro_bbb.ELBO did not compute"),
    "TraceMeanField_ELBO": (TraceMeanField_ELBO, "pyro_bbb.ELBO did not compute"),
}


def _setup(guide_kind):
    pyro.clear_param_store()
    torch.manual_seed(0)
    bnn = pyro_bbb.BNN(torch.nn.Sequential(BayesianLinear(3, 8), torch.nn.Tanh(), BayesianLinear(8, 1)),
                       likelihoods.Gaussian(scale=0.5))
    guide = MeanFieldGuide(bnn) if guide_kind == "MeanFieldGuide" else AutoNormal(bnn)
    x, y = torch.randn(N, 3), torch.randn(N, 1)
    guide(x[:32], y[:32])  # the parameters exist, as after a first step
    return bnn, guide, x, y


def _params():
    return {name: p.detach().clone() for name, p in pyro.get_param_store().named_parameters()}


@pytest.mark.parametrize("guide_kind", ["MeanFieldGuide", "AutoNormal"])
@pytest.mark.parametrize("wrong", list(WRONG))
def test_ivon_in_plain_svi_refuses_a_wrong_objective_with_nothing_changed(guide_kind, wrong):
    make_objective, message = WRONG[wrong]
    bnn, guide, x, y = _setup(guide_kind)
    svi = SVI(bnn, guide, IVON(guide, num_data=N), make_objective())
    before = _params()
    with pytest.raises(ValueError, match=message):
        svi.step(x[:32], y[:32])
    after = _params()
    assert after.keys() == before.keys()
    for name, value in before.items():
        torch.testing.assert_close(after[name], value, rtol=0, atol=0)
    assert all(p.grad is None for _, p in pyro.get_param_store().named_parameters())  # no stale gradient left


@pytest.mark.parametrize("guide_kind", ["MeanFieldGuide", "AutoNormal"])
def test_the_right_pairing_trains_and_a_later_switch_to_pyros_elbo_is_refused(guide_kind):
    bnn, guide, x, y = _setup(guide_kind)
    optimizer = IVON(guide, num_data=N)
    right = SVI(bnn, guide, optimizer, ELBO(num_data=N))
    start = _params()
    for i in range(3):
        right.step(x[32 * i:32 * (i + 1)], y[32 * i:32 * (i + 1)])
    assert optimizer.steps == 2  # the first call sets the widths
    moved = _params()
    assert any(not torch.equal(moved[name], start[name]) for name in start)
    # gradients from Pyro's ELBO after pyro_bbb.ELBO's: the last run is the previous step's, not this one's
    with pytest.raises(ValueError, match="pyro_bbb.ELBO did not compute"):
        SVI(bnn, guide, optimizer, Trace_ELBO()).step(x[:32], y[:32])
    for name, value in moved.items():
        torch.testing.assert_close(_params()[name], value, rtol=0, atol=0)
    right.step(x[:32], y[:32])  # and the right objective trains on
    assert optimizer.steps == 3


def test_full_batch_without_num_data_is_the_right_n():
    """``ELBO()`` on the whole training set scales nothing: N is the batch, which IVON(num_data=N) accepts."""
    bnn, guide, x, y = _setup("MeanFieldGuide")
    svi = SVI(bnn, guide, IVON(guide, num_data=N), ELBO())
    svi.step(x, y)
    svi.step(x, y)
    assert latest_objective_run().num_data == N


def test_each_gradient_computation_is_a_new_run_with_the_objectives_settings():
    bnn, guide, x, y = _setup("MeanFieldGuide")
    elbo = ELBO(num_data=N, kl_weight=0.5)
    elbo.loss(bnn, guide, x[:10], y[:10])  # no gradients: no run
    first = note_objective_run(7, 1.0)
    assert latest_objective_run() is first
    elbo.differentiable_loss(bnn, guide, x[:10], y[:10])
    run = latest_objective_run()
    assert run.number > first.number and run.num_data == N and run.kl_weight.weight == 0.5
    elbo.loss_and_grads(bnn, guide, x[:10], y[:10])
    assert latest_objective_run().number == run.number + 1
    assert isinstance(latest_objective_run().kl_weight, Constant)


def test_under_lightning_an_objective_swapped_in_after_construction_is_refused():
    """BayesianLightningModule checks its own settings up front; an ELBO replaced afterwards (a subclass, a user's
    edit) is caught by the optimizer at its step, with the guide unchanged."""
    pl = pytest.importorskip("lightning.pytorch")
    from torch.utils.data import DataLoader, TensorDataset

    from pyro_bbb.train.lightning import BayesianLightningModule

    bnn, guide, x, y = _setup("MeanFieldGuide")
    module = BayesianLightningModule(bnn, guide, num_data=N, optimizer=IVON(guide, num_data=N))
    module.elbo = ELBO(num_data=N, kl_weight=0.1)
    before = {k: v.clone() for k, v in guide.state_dict().items()}
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(ValueError, match="kl_weight=Constant"):
        trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=32))
    for name, value in guide.state_dict().items():
        torch.testing.assert_close(value, before[name], rtol=0, atol=0)
