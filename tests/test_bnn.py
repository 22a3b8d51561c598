import pyro
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import SVI, TraceMeanField_ELBO

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb.nn import BayesianLinear


def mixed_net():
    return torch.nn.Sequential(BayesianLinear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def test_sites_weights_outside_and_observation_inside_the_data_plate():
    bnn = pyro_bbb.BNN(mixed_net(), likelihoods.Gaussian(scale=0.1))
    tr = poutine.trace(bnn).get_trace(torch.randn(4, 3), torch.randn(4))
    assert tr.nodes["net.0.weight"]["cond_indep_stack"] == ()
    assert [f.name for f in tr.nodes["y"]["cond_indep_stack"]] == ["data"]
    assert tr.nodes["net.2.weight"]["type"] == "param"  # the deterministic layer is a point estimate


def test_loss_equals_pyros_mean_field_elbo_on_the_full_batch():
    """With B = N the scaling is 1: our ELBO must equal Pyro's TraceMeanField_ELBO for the same guide draw."""
    x, y = torch.randn(20, 3), torch.randn(20)
    bnn = pyro_bbb.BNN(mixed_net(), likelihoods.Gaussian(scale=0.5))
    guide = pyro_bbb.MeanFieldGuide(bnn, init_scale=0.1)
    guide(x, y)
    pyro.set_rng_seed(3)
    ours = pyro_bbb.ELBO(num_data=20).loss(bnn, guide, x, y)
    pyro.set_rng_seed(3)
    reference = TraceMeanField_ELBO().loss(bnn, guide, x, y)
    assert ours == pytest.approx(reference, rel=1e-5)


def test_plain_svi_trains_deterministic_and_bayesian_parts():
    x, y = torch.randn(32, 3), torch.randn(32)
    bnn = pyro_bbb.BNN(mixed_net(), likelihoods.Gaussian(scale=0.5))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    svi = SVI(bnn, guide, pyro.optim.Adam({"lr": 0.05}), pyro_bbb.ELBO(num_data=100))
    svi.step(x, y)
    store = pyro.get_param_store()
    before = {k: v.detach().clone() for k, v in store.items()}
    svi.step(x, y)
    assert not torch.equal(before["net.2.weight"], store["net.2.weight"])
    assert not torch.equal(before["MeanFieldGuide.locs.net.0.weight"], store["MeanFieldGuide.locs.net.0.weight"])


def test_rejects_bad_arguments():
    with pytest.raises(TypeError, match="Likelihood"):
        pyro_bbb.BNN(mixed_net(), torch.nn.MSELoss())
    with pytest.raises(TypeError, match="torch.nn.Module"):
        pyro_bbb.BNN(lambda x: x, likelihoods.Gaussian())
    bnn = pyro_bbb.BNN(mixed_net(), likelihoods.Gaussian())
    with pytest.raises(ValueError, match="3 rows but y has 4"):
        bnn(torch.randn(3, 3), torch.randn(4))


def test_custom_data_plate_name():
    bnn = pyro_bbb.BNN(mixed_net(), likelihoods.Gaussian(scale=1.0), data_plate="obs")
    tr = poutine.trace(bnn).get_trace(torch.randn(4, 3), torch.randn(4))
    assert [f.name for f in tr.nodes["y"]["cond_indep_stack"]] == ["obs"]
    elbo = pyro_bbb.ELBO(num_data=40, data_plate="obs")
    elbo.loss(bnn, pyro_bbb.MeanFieldGuide(bnn), torch.randn(4, 3), torch.randn(4))
    assert (elbo.last_terms["num_data"], elbo.last_terms["batch_size"]) == (40, 4)
