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



def _ivon_setup():
    pyro.clear_param_store()
    torch.manual_seed(0)
    x = torch.randn(64, 2)
    y = x.sum(-1) + 0.1 * torch.randn(64)
    net = torch.nn.Sequential(BayesianLinear(2, 8), torch.nn.Tanh(), BayesianLinear(8, 1))
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian())  # a learned noise: Adam's part of the step
    guide = pyro_bbb.MeanFieldGuide(bnn)
    guide(x[:2], y[:2])
    return x, y, bnn, guide


def _trainer(**settings):
    import lightning.pytorch as pl

    settings = {"max_epochs": 2, **settings}
    return pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, **settings)


def test_lightning_trains_with_ivon_exactly_as_a_hand_written_loop():
    """BayesianLightningModule(optimizer=IVON(...)): Lightning's steps are IVON's steps on the same gradients -- every
    posterior mean and width equals a hand-written loop's (same batches, same random stream) after two epochs, and
    the optimizer's state is IVON's, by site name."""
    from torch.utils.data import DataLoader, TensorDataset

    from pyro_bbb.optim import IVON
    from pyro_bbb.train.lightning import BayesianLightningModule

    x, y, bnn, guide = _ivon_setup()
    ivon = IVON(guide, num_data=64)
    elbo = pyro_bbb.ELBO(num_data=64)
    pyro.set_rng_seed(1)
    for _ in range(2):
        for xb, yb in DataLoader(TensorDataset(x, y), batch_size=16):
            elbo.differentiable_loss(bnn, guide, xb, yb).backward()
            ivon([p for p in [*guide.parameters(), *bnn.parameters()] if p.grad is not None])
    by_hand = {k: v.clone() for k, v in guide.state_dict().items()}

    x, y, bnn, guide = _ivon_setup()
    module = BayesianLightningModule(bnn, guide, num_data=64, optimizer=IVON(guide, num_data=64))
    pyro.set_rng_seed(1)
    _trainer().fit(module, DataLoader(TensorDataset(x, y), batch_size=16))
    assert by_hand.keys() == guide.state_dict().keys()
    for name, value in guide.state_dict().items():
        torch.testing.assert_close(value, by_hand[name], rtol=1e-6, atol=1e-7)
    state = module.trainer.optimizers[0].state_dict()["pyro_optimizer"]
    assert state["steps"] == ivon.steps == 7  # eight calls: the first sets the widths, seven steps
    assert set(state["sites"]) == {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"}


def test_lightning_refuses_what_ivon_cannot_read_before_any_step():
    """Another guide, a KL schedule, gradient clipping by the Trainer, a torch optimizer: clear errors, nothing
    trained."""
    from torch.utils.data import DataLoader, TensorDataset

    from pyro_bbb.optim import IVON
    from pyro_bbb.train.lightning import BayesianLightningModule

    x, y, bnn, guide = _ivon_setup()
    before = {k: v.clone() for k, v in guide.state_dict().items()}
    with pytest.raises(ValueError, match="kl_weight"):
        BayesianLightningModule(bnn, guide, num_data=64, kl_weight=pyro_bbb.infer.schedules.LinearWarmup(10),
                                optimizer=IVON(guide, num_data=64))
    with pytest.raises(ValueError, match="another guide"):
        BayesianLightningModule(bnn, guide, num_data=64, optimizer=IVON(pyro_bbb.MeanFieldGuide(bnn), num_data=64))
    with pytest.raises(ValueError, match="num_data=64"):
        BayesianLightningModule(bnn, guide, num_data=64, optimizer=IVON(guide, num_data=60))
    with pytest.raises(TypeError, match="pyro_bbb optimizer"):
        BayesianLightningModule(bnn, guide, num_data=64, optimizer=torch.optim.SGD(guide.parameters(), lr=0.1))
    with pytest.raises(ValueError, match=r"lr=0.5 is the learning rate of the module's own Adam"):  # (ignored before)
        BayesianLightningModule(bnn, guide, num_data=64, optimizer=IVON(guide, num_data=64), lr=0.5)
    module = BayesianLightningModule(bnn, guide, num_data=64, optimizer=IVON(guide, num_data=64))
    with pytest.raises(ValueError, match=r"Trainer\(gradient_clip_val\)=1.0"):
        _trainer(gradient_clip_val=1.0).fit(module, DataLoader(TensorDataset(x, y), batch_size=16))
    with pytest.raises(ValueError, match=r"Trainer\(accumulate_grad_batches=2\) sums the gradients"):
        _trainer(accumulate_grad_batches=2).fit(module, DataLoader(TensorDataset(x, y), batch_size=16))
    for name, value in guide.state_dict().items():
        torch.testing.assert_close(value, before[name], rtol=0, atol=0)


def test_a_lightning_checkpoint_resumes_ivon_by_site_name(tmp_path):
    """Trainer checkpoints hold IVON's curvature and momentum by site name; resuming gives the new optimizer the same
    state and the guide the same parameters, and training then runs on from there."""
    from torch.utils.data import DataLoader, TensorDataset

    from pyro_bbb.optim import IVON
    from pyro_bbb.train.lightning import BayesianLightningModule

    x, y, bnn, guide = _ivon_setup()
    first = IVON(guide, num_data=64)
    trainer = _trainer()
    trainer.fit(BayesianLightningModule(bnn, guide, num_data=64, optimizer=first),
                DataLoader(TensorDataset(x, y), batch_size=16))
    trainer.save_checkpoint(tmp_path / "run.ckpt")
    saved, saved_params = first.get_state(), {k: v.clone() for k, v in guide.state_dict().items()}

    x, y, bnn, guide = _ivon_setup()  # a fresh model, guide and optimizer (fresh parameters)
    second = IVON(guide, num_data=64)
    module = BayesianLightningModule(bnn, guide, num_data=64, optimizer=second)
    trainer = _trainer()  # max_epochs=2 reached: restore, no further step
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=16), ckpt_path=tmp_path / "run.ckpt")
    assert second.steps == saved["steps"] == 7
    for site, entry in saved["sites"].items():
        for key, value in entry.items():
            torch.testing.assert_close(second.site_state[site][key], value, rtol=0, atol=0)
    for name, value in guide.state_dict().items():
        torch.testing.assert_close(value, saved_params[name], rtol=0, atol=0)
    _trainer(max_epochs=3).fit(module, DataLoader(TensorDataset(x, y), batch_size=16), ckpt_path=tmp_path / "run.ckpt")
    assert second.steps == 11  # one more epoch of four steps on the restored state


@pytest.mark.parametrize("kl_weight", ["schedule", 0.25])
def test_lightning_records_the_kl_weight_it_trained_at_where_the_posterior_is_shown(kl_weight):
    """A number from the start; a schedule's weight at the last step when training ends (as fit records it)."""
    from torch.utils.data import DataLoader, TensorDataset

    from pyro_bbb.infer.tempering import kl_weight_of
    from pyro_bbb.train.lightning import BayesianLightningModule

    x, y, bnn, guide = _ivon_setup()
    weight = pyro_bbb.infer.schedules.LinearWarmup(100) if kl_weight == "schedule" else kl_weight
    module = BayesianLightningModule(bnn, guide, num_data=64, kl_weight=weight)
    _trainer().fit(module, DataLoader(TensorDataset(x, y), batch_size=16))
    last = float(module.elbo.last_terms["kl_weight"])
    assert last == (pyro_bbb.infer.schedules.LinearWarmup(100)(7) if kl_weight == "schedule" else 0.25)
    assert kl_weight_of(guide).kl_weight == last and kl_weight_of(guide).tempered
    assert set(pyro_bbb.summary(bnn, guide)["kl_weight"]) == {last}


def test_lightning_records_only_the_steps_it_trains():
    """Constructing the module trains nothing: a guide trained at 0.01 keeps that record until a step; a validation
    loss under no_grad (a subclass's validation_step) neither advances the schedule nor records its weight."""
    from torch.utils.data import DataLoader, TensorDataset

    from pyro_bbb.infer.tempering import KLWeightChoice, kl_weight_of, record_kl_weight
    from pyro_bbb.train.lightning import BayesianLightningModule

    x, y, bnn, guide = _ivon_setup()
    record_kl_weight(guide, KLWeightChoice(kl_weight=0.01))
    BayesianLightningModule(bnn, guide, num_data=64, kl_weight=1.0)
    assert kl_weight_of(guide).kl_weight == 0.01

    class Validated(BayesianLightningModule):
        def validation_step(self, batch, batch_idx):
            return self.pyro_step.differentiable_loss(*batch)

    module = Validated(bnn, guide, num_data=64, kl_weight=pyro_bbb.infer.schedules.LinearWarmup(100))
    loader = DataLoader(TensorDataset(x, y), batch_size=16)
    _trainer(max_epochs=1).fit(module, loader, loader)
    assert module.elbo.step == 4  # the four training steps; not the validation batches
    assert kl_weight_of(guide).kl_weight == pyro_bbb.infer.schedules.LinearWarmup(100)(3)


def test_a_lightning_checkpoint_resumes_the_kl_schedule_and_the_weights_record(tmp_path):
    """A run resumed from a Trainer checkpoint restarted its KL schedule at step 0: after one of two epochs, the second
    trained at weights 0 to 0.375 where the uninterrupted run trained at 0.5 to 0.875. A loaded module with no
    further step shows the weight the posterior was trained at."""
    from torch.utils.data import DataLoader, TensorDataset

    from pyro_bbb.infer.tempering import kl_weight_of
    from pyro_bbb.train.lightning import BayesianLightningModule

    def run(epochs, resume_from=None, save_to=None):
        x, y, bnn, guide = _ivon_setup()
        torch.manual_seed(0)
        module = BayesianLightningModule(bnn, guide, num_data=64, kl_weight=pyro_bbb.infer.schedules.LinearWarmup(8))
        trainer = _trainer(max_epochs=epochs)
        trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=16), ckpt_path=resume_from)
        if save_to is not None:
            trainer.save_checkpoint(save_to)
        return module, guide

    uninterrupted, _ = run(2)
    _, saved_guide = run(1, save_to=tmp_path / "run.ckpt")
    resumed, _ = run(2, resume_from=tmp_path / "run.ckpt")
    assert resumed.pyro_step.schedule_step == uninterrupted.pyro_step.schedule_step == 8
    assert resumed.elbo.last_terms["kl_weight"] == uninterrupted.elbo.last_terms["kl_weight"] == 0.875
    restored, restored_guide = run(1, resume_from=tmp_path / "run.ckpt")  # max_epochs reached: restore, no step
    assert restored.pyro_step.schedule_step == 4
    assert kl_weight_of(restored_guide) == kl_weight_of(saved_guide)


def test_lightning_accepts_ivon_at_the_weight_its_ess_sets_and_refuses_another():
    from pyro_bbb.optim import IVON
    from pyro_bbb.train.lightning import BayesianLightningModule

    _, _, bnn, guide = _ivon_setup()
    BayesianLightningModule(bnn, guide, num_data=64, kl_weight=0.1, optimizer=IVON(guide, num_data=64, ess=640))
    with pytest.raises(ValueError, match="ess"):
        BayesianLightningModule(bnn, guide, num_data=64, kl_weight=0.5, optimizer=IVON(guide, num_data=64, ess=640))
