"""What users naturally pass (issue 13, H): numpy, dtypes, (N, 1) targets, numpy integers, torch distributions,
a renamed data plate, conditioned weights, guides set up without targets."""

import numpy as np
import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import pytest
import torch
from pyro.nn import PyroModule

import pyro_bbb
from pyro_bbb import likelihoods, metrics
from pyro_bbb.inputs import as_tensor, cast_inputs, targets_like
from pyro_bbb.nn import BayesianLinear


def regression_data(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g)
    return x, x.sum(-1) + 0.3 * torch.randn(n, generator=g)


def bnn(likelihood=None):
    return pyro_bbb.BNN(BayesianLinear(2, 1), likelihood or likelihoods.Gaussian(scale=0.3))


def test_n_by_1_targets_give_the_same_fit_metrics_and_export_as_n_targets():
    x, y = regression_data()
    results = []
    for targets in (y, y.unsqueeze(-1)):
        pyro.clear_param_store()
        torch.manual_seed(0)
        model = bnn()
        guide = pyro_bbb.MeanFieldGuide(model)
        history = pyro_bbb.fit(model, guide, (x, targets), epochs=3, batch_size=16, progress=False, seed=0,
                               validation_data=(x, targets))  # fmt: skip
        pyro.set_rng_seed(1)
        pred = pyro_bbb.predict(model, guide, x, num_samples=20)
        idata = pyro_bbb.to_inference_data(model, guide, x, targets, num_samples=10)
        results.append((history["loss"], metrics.rmse(pred, targets), metrics.log_likelihood(pred, targets),
                        metrics.interval_coverage(pred, targets), idata.log_likelihood["y"].values))  # fmt: skip
    (loss_a, rmse_a, ll_a, cov_a, lik_a), (loss_b, rmse_b, ll_b, cov_b, lik_b) = results
    assert loss_a == loss_b and rmse_a == rmse_b and ll_a == ll_b and cov_a == cov_b
    np.testing.assert_array_equal(lik_a, lik_b)
    # the silent wrong number of broadcasting (N,) against (N, 1): an (N, N) error matrix
    assert rmse_a == pytest.approx(float((pred.mean - y).pow(2).mean().sqrt()))


def test_n_by_1_class_labels_are_accepted():
    x = torch.randn(30, 2)
    labels = (x[:, 0] > 0).long()
    model = pyro_bbb.BNN(BayesianLinear(2, 2), likelihoods.Categorical())
    guide = pyro_bbb.MeanFieldGuide(model)
    pyro_bbb.fit(model, guide, (x, labels.unsqueeze(-1)), epochs=2, progress=False)
    pred = pyro_bbb.predict(model, guide, x, num_samples=5)
    assert metrics.accuracy(pred, labels.unsqueeze(-1)) == metrics.accuracy(pred, labels)


def test_numpy_and_float64_inputs_work_everywhere():
    x, y = regression_data()
    model = bnn()
    guide = pyro_bbb.MeanFieldGuide(model)
    xn, yn = x.double().numpy(), y.double().numpy()
    pyro_bbb.fit(model, guide, (xn, yn), epochs=2, progress=False, validation_data=(xn, yn))
    pred = pyro_bbb.predict(model, guide, xn, num_samples=5)
    assert pred.mean.dtype == torch.float32
    assert np.isfinite(metrics.rmse(pred, yn))
    pyro_bbb.to_inference_data(model, guide, xn, yn, num_samples=5)


def test_integer_inputs_to_a_float_model_name_both_dtypes():
    model = bnn()
    guide = pyro_bbb.MeanFieldGuide(model)
    with pytest.raises(TypeError, match=r"torch.int64 but its weights are torch.float32"):
        pyro_bbb.fit(model, guide, (torch.ones(10, 2, dtype=torch.long), torch.zeros(10)), epochs=1, progress=False)


def test_other_types_are_a_clear_type_error():
    model = bnn()
    with pytest.raises(TypeError, match="tensors or numpy arrays"):
        pyro_bbb.fit(model, pyro_bbb.MeanFieldGuide(model), ([[0.0, 1.0]], [0.0]), epochs=1, progress=False)
    with pytest.raises(TypeError, match="numpy array, got list"):
        as_tensor([1.0], "x")


def test_numpy_integer_num_data_and_bad_init_scales():
    assert pyro_bbb.ELBO(num_data=np.int64(200)).num_data == 200
    model = bnn()
    for bad in (float("inf"), True, float("nan"), 0.0):
        with pytest.raises(ValueError, match="init_scale"):
            pyro_bbb.MeanFieldGuide(model, init_scale=bad)


def test_a_torch_distributions_prior_works_like_pyros():
    x, y = regression_data(10)
    losses = []
    for prior in (torch.distributions.Normal(0.0, 2.0), dist.Normal(0.0, 2.0)):
        pyro.clear_param_store()
        torch.manual_seed(0)
        model = pyro_bbb.BNN(BayesianLinear(2, 1, prior=prior), likelihoods.Gaussian(scale=0.3))
        guide = pyro_bbb.MeanFieldGuide(model)
        guide(x, y)
        pyro.set_rng_seed(0)
        losses.append(pyro_bbb.ELBO(num_data=10).loss(model, guide, x, y))
    assert losses[0] == losses[1]


class Hand(PyroModule):
    """A hand-written regression; ``inside=True`` runs the layer inside the data plate (a mistake)."""

    def __init__(self, inside=False, plate="batch"):
        super().__init__()
        self.fc1 = BayesianLinear(2, 1)
        self.inside, self.plate = inside, plate

    def forward(self, x, y=None):
        mean = None if self.inside else self.fc1(x).squeeze(-1)
        with pyro.plate(self.plate, x.shape[0]):
            if mean is None:
                mean = self.fc1(x).squeeze(-1)
            return pyro.sample("y", dist.Normal(mean, 0.3), obs=y)


def test_the_layer_inside_the_plate_guard_follows_the_configured_data_plate():
    x, y = regression_data(10)
    model = Hand(inside=True, plate="batch")
    guide = pyro_bbb.MeanFieldGuide(model)
    with pytest.raises(ValueError, match=r"inside pyro.plate\('batch'\)"):
        pyro_bbb.ELBO(num_data=10, data_plate="batch").loss(model, guide, x, y)
    # a BNN with data_plate="batch" trains and predicts
    model = pyro_bbb.BNN(BayesianLinear(2, 1), likelihoods.Gaussian(scale=0.3), data_plate="batch")
    guide = pyro_bbb.MeanFieldGuide(model)
    pyro_bbb.fit(model, guide, (x, y), epochs=2, progress=False)
    assert pyro_bbb.predict(model, guide, x, num_samples=4).mean.shape == (10,)


def test_conditioning_a_global_weight_is_not_an_unscaled_likelihood():
    x, y = regression_data(20)
    model = Hand(plate="data")
    w = torch.tensor([[1.0, 1.0]])
    conditioned = poutine.condition(model, {"fc1.weight": w})
    guide = pyro_bbb.MeanFieldGuide(conditioned)
    elbo = pyro_bbb.ELBO(num_data=100)
    elbo.loss(conditioned, guide, x[:5], y[:5])
    assert list(elbo.last_terms["kl_by_site"]) == ["fc1.bias"]
    # a real likelihood outside the plate is still refused
    def unscaled(x, y=None):
        return pyro.sample("y", dist.Normal(torch.zeros(len(x)), 1.0).to_event(1), obs=y)

    with pytest.raises(ValueError, match="not inside pyro.plate"):
        pyro_bbb.ELBO(num_data=100).loss(unscaled, lambda x, y=None: None, x, y)


def test_predict_sets_up_a_guide_that_has_not_seen_the_model_and_leaves_the_rng_alone():
    x = torch.randn(8, 2)
    model = pyro_bbb.BNN(BayesianLinear(2, 3, prior=pyro_bbb.priors.Moped(0.1)), likelihoods.Categorical())
    guide = pyro_bbb.MeanFieldGuide(model)
    state = torch.get_rng_state()
    pyro_bbb.set_up_guide(model, guide, x[:1])
    assert torch.equal(torch.get_rng_state(), state)
    pyro.clear_param_store()
    guide = pyro_bbb.MeanFieldGuide(model)
    pred = pyro_bbb.predict(model, guide, x, num_samples=5)
    assert pred.probs.shape == (8, 3)
    # set up from inputs alone, the observation stayed an observation: fit continues from here
    pyro_bbb.fit(model, guide, (x, torch.zeros(8, dtype=torch.long)), epochs=1, progress=False)


def test_fit_after_a_guide_was_set_up_without_targets_is_a_clear_error():
    x, y = regression_data(10)
    model = bnn()
    guide = pyro_bbb.MeanFieldGuide(model)
    guide(x)  # y=None: Pyro takes y for a latent
    with pytest.raises(ValueError, match="set up by a call without targets"):
        pyro_bbb.fit(model, guide, (x, y), epochs=1, progress=False)


def test_helpers():
    assert targets_like(torch.zeros(3, 1), (3,)).shape == (3,)
    assert targets_like(torch.zeros(3, 2), (3,)).shape == (3, 2)
    assert cast_inputs(torch.zeros(2, dtype=torch.long), torch.float32).dtype == torch.long
