"""The data plate's N/B scaling against Pyro's own subsampling, and every error it raises."""


import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import SVI, TraceMeanField_ELBO

from pyro_bbb import ELBO
from pyro_bbb.nn import BayesianLinear

from ..helpers import Regression, guide_for, regression_data


# ---------------------------------------------------------------------------------------------------------------
# Declared subsampling, Pyro's reference ELBO, and every error
# ---------------------------------------------------------------------------------------------------------------
def test_matches_pyros_own_subsampling_and_never_scales_twice():
    N, B = 100, 16
    x, y = regression_data(N)
    idx = torch.arange(30, 30 + B)
    plain = Regression()
    declared = Regression(subsample_size=B, num_data=N)
    declared.fc = plain.fc  # same layer, same site names
    guide = guide_for(plain, x[idx], y[idx], init_scale=0.1)

    losses = {}
    for label, model, elbo, kwargs in [
        ("ours, plate of B", plain, ELBO(num_data=N), {}),
        ("ours, declared plate", declared, ELBO(num_data=N), {"idx": idx}),
        ("ours, declared, no num_data", declared, ELBO(), {"idx": idx}),
        ("pyro reference", declared, TraceMeanField_ELBO(), {"idx": idx}),
    ]:
        pyro.set_rng_seed(11)
        losses[label] = elbo.loss(model, guide, x[idx], y[idx], **kwargs)
    reference = losses.pop("pyro reference")
    for label, value in losses.items():
        assert value == pytest.approx(reference, rel=1e-6), label

    elbo = ELBO()
    elbo.loss(declared, guide, x[idx], y[idx], idx=idx)
    assert (elbo.last_terms["num_data"], elbo.last_terms["batch_size"]) == (N, B)


def test_a_plate_nested_in_the_data_plate_is_scaled_by_n_over_b_once():
    """Multi-output regression (an "outputs" plate of 3 inside the data plate), a batch of 10 of 40 data: our ELBO
    with ``num_data=40`` equals Pyro's TraceMeanField_ELBO on the same model with the data plate declared as a
    subsample of 40 (Pyro's own N/B), for the full and the partial batch; the inner plate's size scales nothing."""
    from ..helpers import MultiOutput

    class Declared(MultiOutput):
        def forward(self, x, y=None, idx=None):
            mean = self.fc(x)
            with pyro.plate("data", 40, subsample=idx, dim=-2), pyro.plate("outputs", self.outputs, dim=-1):
                return pyro.sample("y", dist.Normal(mean, self.sigma), obs=y)

    x, y = torch.randn(40, 2), torch.randn(40, 3)
    plain, declared = MultiOutput(), Declared()
    declared.fc = plain.fc
    guide = guide_for(plain, x[:10], y[:10], init_scale=0.2)
    for idx in (torch.arange(10), torch.arange(33, 40)):  # a full and a partial batch
        pyro.set_rng_seed(3)
        ours = ELBO(num_data=40).loss(plain, guide, x[idx], y[idx])
        pyro.set_rng_seed(3)
        reference = TraceMeanField_ELBO().loss(declared, guide, x[idx], y[idx], idx=idx)
        pyro.set_rng_seed(3)
        unscaled = ELBO().loss(plain, guide, x[idx], y[idx])
        assert ours == pytest.approx(reference, rel=1e-6)
        assert abs(ours - unscaled) > 1.0  # the scale did something


@pytest.mark.parametrize("vectorize", [False, True])
def test_a_conditioned_layer_weight_is_data_not_a_likelihood_to_scale(vectorize):
    """``poutine.condition(bnn, {"net.weight": w})`` with ``num_data=40`` on a batch of 20: the weight's prior
    density at ``w`` counts once, the likelihood twice, as in Pyro's TraceMeanField_ELBO on the same model with the
    data plate declared as a subsample of 40 -- also with vectorized particles, where Pyro's particle plate
    broadcasts the weight's prior before the scaling sees it."""
    import pyro.poutine as poutine

    from pyro_bbb import BNN, MeanFieldGuide, likelihoods

    class Declared(BNN):
        def forward(self, x, y=None, idx=None):
            mean = self.net(x)
            with pyro.plate("data", 40, subsample=idx):
                return pyro.sample("y", dist.Normal(mean, 0.5).to_event(1), obs=y)

    x, y = torch.randn(20, 3), torch.randn(20, 2)
    bnn = BNN(BayesianLinear(3, 2), likelihoods.Gaussian(scale=0.5))
    declared = Declared(bnn.net, bnn.likelihood)
    w = {"net.weight": torch.randn(2, 3)}
    guide = MeanFieldGuide(poutine.condition(bnn, data=w), init_scale=1e-6)  # the bias nearly a point: no MC noise
    guide(x, y)
    ours = ELBO(num_data=40, num_particles=8, vectorize_particles=vectorize).loss(
        poutine.condition(bnn, data=w), guide, x, y)
    reference = TraceMeanField_ELBO().loss(poutine.condition(declared, data=w), guide, x, y, idx=torch.arange(20))
    assert ours == pytest.approx(reference, rel=1e-4)


def test_disagreeing_num_data_is_an_error():
    x, y = regression_data(100)
    model = Regression(num_data=100)
    idx = torch.arange(10)
    guide = guide_for(model, x[idx], y[idx], idx)
    with pytest.raises(ValueError, match=r"(?s)num_data=50 disagrees with pyro.plate\('data', size=100.*pyro_bbb.fit "
                                         r"passes the number of training rows"):
        ELBO(num_data=50).loss(model, guide, x[idx], y[idx], idx=idx)


def test_observed_site_outside_the_data_plate_is_an_error_with_a_fix():
    layer = BayesianLinear(3, 1)

    def model(x, y):
        pyro.sample("y", dist.Normal(layer(x).squeeze(-1), 1.0).to_event(1), obs=y)

    x, y = regression_data(10)
    guide = guide_for(model, x, y)
    with pytest.raises(ValueError, match=r"(?s)'y' is not inside pyro.plate\('data', \.\.\.\).*with pyro.plate.*"
                                         r"a `data_plate` attribute naming it, which pyro_bbb.fit "
                                         r"and pyro_bbb.ELBO read"):
        ELBO(num_data=10).loss(model, guide, x, y)
    ELBO().loss(model, guide, x, y)  # without num_data there is nothing to scale: fine


def test_num_data_smaller_than_the_batch_is_an_error():
    x, y = regression_data(10)
    model = Regression()
    guide = guide_for(model, x, y)
    with pytest.raises(ValueError, match="num_data=5 is smaller than the batch of 10"):
        ELBO(num_data=5).loss(model, guide, x, y)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_invalid_num_data(bad):
    with pytest.raises(ValueError, match="`num_data` must be a positive integer"):
        ELBO(num_data=bad)


def test_a_failed_step_leaves_the_parameters_untouched():
    x, y = regression_data(10)
    model = Regression()
    guide = guide_for(model, x, y)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.1}), ELBO(num_data=5))
    before = {k: v.detach().clone() for k, v in pyro.get_param_store().items()}
    with pytest.raises(ValueError):
        svi.step(x, y)
    after = dict(pyro.get_param_store().items())
    assert all(torch.equal(before[k], after[k]) for k in before)
