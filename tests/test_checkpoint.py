import pickle

import pyro
import pytest
import torch

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb.nn import BayesianLinear


def build(hidden=8, likelihood=None):
    net = torch.nn.Sequential(BayesianLinear(3, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
    return pyro_bbb.BNN(net, likelihood or likelihoods.Gaussian())


def trained(tmp_path):
    x, y = torch.randn(40, 3), torch.randn(40)
    model = build()
    guide = pyro_bbb.MeanFieldGuide(model)
    pyro_bbb.fit(model, guide, (x, y), epochs=3, batch_size=16, progress=False, lr=0.05)
    path = tmp_path / "bnn.pt"
    pyro_bbb.save(path, model, guide)
    return model, guide, path, x


def test_round_trip_gives_the_same_predictions(tmp_path):
    model, guide, path, x = trained(tmp_path)
    pyro.set_rng_seed(1)
    before = pyro_bbb.predict(model, guide, x, num_samples=30)
    pyro.clear_param_store()
    model2 = build()
    guide2 = pyro_bbb.load(path, model2, pyro_bbb.MeanFieldGuide(model2))
    pyro.set_rng_seed(1)
    after = pyro_bbb.predict(model2, guide2, x, num_samples=30)
    torch.testing.assert_close(after.distribution.loc, before.distribution.loc, rtol=0, atol=0)
    torch.testing.assert_close(after.distribution.scale, before.distribution.scale, rtol=0, atol=0)
    torch.testing.assert_close(model2.net[2].weight, model.net[2].weight)


def test_checkpoint_is_plain_data_readable_with_weights_only(tmp_path):
    _, _, path, _ = trained(tmp_path)
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["format"] == "pyro_bbb.checkpoint"
    assert checkpoint["settings"]["likelihood"] == "Gaussian"


def test_loading_into_another_shape_is_a_clear_error_and_changes_nothing(tmp_path):
    _, _, path, _ = trained(tmp_path)
    pyro.clear_param_store()
    other = build(hidden=5)
    guide = pyro_bbb.MeanFieldGuide(other)
    guide(torch.randn(2, 3), torch.randn(2))
    before = {k: v.detach().clone() for k, v in guide.state_dict().items()}
    with pytest.raises(ValueError, match=r"(?s)does not fit .*net.0.weight_unconstrained.: checkpoint shape \(8, 3\)"):
        pyro_bbb.load(path, other, guide)
    assert all(torch.equal(before[k], v) for k, v in guide.state_dict().items())


def test_loading_with_another_likelihood_is_a_clear_error(tmp_path):
    _, _, path, _ = trained(tmp_path)
    pyro.clear_param_store()
    other = build(likelihood=likelihoods.HeteroscedasticGaussian())
    with pytest.raises(ValueError, match="likelihood 'Gaussian'"):
        pyro_bbb.load(path, other, pyro_bbb.MeanFieldGuide(other))


class Exploit:
    def __reduce__(self):
        return (exec, ("import pathlib; pathlib.Path(__import__('os').environ['PWNED']).write_text('x')",))


def test_a_malicious_checkpoint_does_not_run_code(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    monkeypatch.setenv("PWNED", str(marker))
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        pickle.dump({"format": "pyro_bbb.checkpoint", "payload": Exploit()}, f, protocol=2)
    model = build()
    with pytest.raises(pickle.UnpicklingError):
        pyro_bbb.load(path, model, pyro_bbb.MeanFieldGuide(model))
    assert not marker.exists()


def test_not_a_checkpoint(tmp_path):
    path = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(3)}, path)
    model = build()
    with pytest.raises(ValueError, match="not a pyro_bbb checkpoint"):
        pyro_bbb.load(path, model, pyro_bbb.MeanFieldGuide(model))


def test_saving_an_unfitted_guide_is_an_error(tmp_path):
    model = build()
    with pytest.raises(ValueError, match="not been fitted"):
        pyro_bbb.save(tmp_path / "x.pt", model, pyro_bbb.MeanFieldGuide(model))
