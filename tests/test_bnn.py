from types import SimpleNamespace

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


class Wrapped(torch.nn.Module):
    """A net whose output is not a tensor: like a transformers model (``.logits``), an RNN (a tuple), or neither."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.fc = BayesianLinear(3, 2)

    def forward(self, x):
        out = self.fc(x)
        if self.kind == "object":
            return SimpleNamespace(logits=out, hidden_states=None)
        if self.kind == "dict":
            return {"loss": None, "logits": out}
        if self.kind == "tuple":
            return out, torch.zeros(())
        return {"prediction": out}


@pytest.mark.parametrize("kind", ["object", "dict", "tuple"])
def test_the_output_adapter_finds_the_logits(kind):
    bnn = pyro_bbb.BNN(Wrapped(kind), likelihoods.Categorical())
    x, y = torch.randn(6, 3), torch.randint(0, 2, (6,))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (x, y), epochs=2, progress=False, seed=0)
    pyro.set_rng_seed(0)
    prediction = pyro_bbb.predict(bnn, guide, x, num_samples=5, vectorize=True)  # adapted on folded draws too
    assert prediction.probs.shape == (6, 2)
    # the likelihood reads the net's logits under the same draws
    draws = poutine.trace(guide).get_trace(x)
    trace = poutine.trace(poutine.replay(bnn, trace=draws)).get_trace(x)
    logits = trace.nodes["y"]["fn"].logits
    w, b = draws.nodes["net.fc.weight"]["value"], draws.nodes["net.fc.bias"]["value"]
    torch.testing.assert_close(logits, torch.log_softmax(x @ w.T + b, -1))


def test_an_output_without_a_tensor_needs_an_adapter():
    bnn = pyro_bbb.BNN(Wrapped("other"), likelihoods.Categorical())
    with pytest.raises(TypeError, match="the net returned a dict; .* output_adapter="):
        bnn(torch.randn(4, 3))
    adapted = pyro_bbb.BNN(Wrapped("other"), likelihoods.Categorical(), output_adapter=lambda out: out["prediction"])
    assert adapted(torch.randn(4, 3)).shape == (4,)
    with pytest.raises(TypeError, match="output_adapter must be callable"):
        pyro_bbb.BNN(Wrapped("other"), likelihoods.Categorical(), output_adapter="prediction")
