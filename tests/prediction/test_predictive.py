import math
import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import pytest
import torch
from pyro.nn import PyroModule
from scipy import optimize, stats

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb.evaluate import metrics
from pyro_bbb.nn import BayesianLinear
from pyro_bbb.prediction import UntrainedGuideWarning
from pyro_bbb.prediction.results import ClassificationPrediction, RegressionPrediction

from ..helpers import BatchCentred, Regression


def fitted_guide(model, x, y, init_scale=0.1):
    guide = pyro_bbb.MeanFieldGuide(model, init_scale=init_scale)
    guide(x, y)
    return guide


def test_linear_model_epistemic_std_matches_closed_form():
    """f(x) = w.x + b with independent w_i ~ N(m_i, s_i^2): Var f = sum x_i^2 s_i^2 + s_b^2."""
    bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.2))
    x = torch.randn(6, 3)
    guide = fitted_guide(bnn, x, torch.randn(6), init_scale=0.3)
    q = guide.site_posteriors()
    w, b = q["net.weight"], q["net.bias"]
    pyro.set_rng_seed(0)
    pred = pyro_bbb.predict(bnn, guide, x, num_samples=20000)
    mean = x @ w.loc.squeeze(0) + b.loc
    std = (x.pow(2) @ w.scale.squeeze(0).pow(2) + b.scale.pow(2)).sqrt()
    # Monte Carlo with 20000 draws: standard errors std/141 for the mean and ~std/200 for the std
    torch.testing.assert_close(pred.mean, mean, atol=float(4 * std.max() / 141), rtol=0)
    torch.testing.assert_close(pred.epistemic_std, std, rtol=0.03, atol=0)
    torch.testing.assert_close(pred.aleatoric_std, torch.full((6,), 0.2))
    torch.testing.assert_close(pred.std, (std**2 + 0.04).sqrt(), rtol=0.03, atol=0)


def test_mixture_quantiles_match_scipy():
    loc = torch.tensor([[0.0, 1.0], [2.0, 1.5], [-1.0, 1.2]])
    scale = torch.tensor([[1.0, 0.1], [0.5, 0.2], [2.0, 0.3]])
    pred = RegressionPrediction(dist.Normal(loc, scale), loc)
    lower, upper = pred.interval(0.8)
    for i in range(2):
        cdf = lambda t, q, i=i: stats.norm.cdf(t, loc[:, i].numpy(), scale[:, i].numpy()).mean() - q  # noqa: E731
        assert float(lower[i]) == pytest.approx(optimize.brentq(cdf, -20, 20, args=(0.1,)), abs=1e-5)
        assert float(upper[i]) == pytest.approx(optimize.brentq(cdf, -20, 20, args=(0.9,)), abs=1e-5)
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        pred.interval(1.0)


def test_entropy_decomposition():
    probs = torch.tensor([[[0.7, 0.2, 0.1]], [[0.1, 0.6, 0.3]]])
    pred = ClassificationPrediction(dist.Categorical(probs=probs), torch.zeros(2, 1))
    mean = probs.mean(0)
    h = lambda p: -(p * p.log()).sum(-1)  # noqa: E731
    torch.testing.assert_close(pred.predictive_entropy, h(mean))
    torch.testing.assert_close(pred.expected_entropy, h(probs).mean(0))
    torch.testing.assert_close(pred.mutual_information, h(mean) - h(probs).mean(0))
    assert pred.predicted_class.tolist() == [0]


def test_binary_prediction():
    logits = torch.tensor([[2.0, -1.0], [0.0, -3.0]])
    pred = ClassificationPrediction(dist.Bernoulli(logits=logits), torch.zeros(2, 2))
    p = torch.sigmoid(logits)
    torch.testing.assert_close(pred.probs, p.mean(0))
    assert pred.predicted_class.tolist() == [1, 0]
    hb = lambda q: -(q * q.log() + (1 - q) * (1 - q).log())  # noqa: E731
    torch.testing.assert_close(pred.expected_entropy, hb(p).mean(0))


def classifier():
    net = torch.nn.Sequential(BayesianLinear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    return pyro_bbb.BNN(net, likelihoods.Categorical())


def regressor(likelihood=None):
    likelihood = likelihood or likelihoods.HeteroscedasticGaussian()
    outputs = 2 if isinstance(likelihood, likelihoods.HeteroscedasticGaussian) else 1
    net = torch.nn.Sequential(BayesianLinear(2, 16), torch.nn.Tanh(), BayesianLinear(16, outputs))
    return pyro_bbb.BNN(net, likelihood)


def binary():
    net = torch.nn.Sequential(BayesianLinear(3, 8), torch.nn.Tanh(), BayesianLinear(8, 1))
    return pyro_bbb.BNN(net, likelihoods.Bernoulli())


@pytest.mark.parametrize(
    "make, y",
    [(classifier, torch.randint(0, 3, (30,))), (regressor, torch.randn(30)), (binary, torch.randint(0, 2, (30,)))],
)
def test_vectorized_equals_looped_and_chunking_shares_the_draws(make, y):
    model = make()
    x = torch.randn(30, model.net[0].in_features)
    guide = fitted_guide(model, x, y)
    results = []
    for kwargs in [{"vectorize": True}, {"vectorize": False}, {"vectorize": True, "batch_size": 7}]:
        pyro.set_rng_seed(11)
        results.append(pyro_bbb.predict(model, guide, x, num_samples=25, **kwargs))
    reference = results[0]
    for other in results[1:]:
        for name, value in reference.distribution.__dict__.items():
            if isinstance(value, torch.Tensor) and name in ("loc", "scale", "logits"):
                torch.testing.assert_close(getattr(other.distribution, name), value, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(other.samples, reference.samples, rtol=1e-5, atol=1e-5)
    assert reference.samples.shape == (25, 30)
    if isinstance(reference, ClassificationPrediction):
        assert reference.predicted_class.shape == (30,) and reference.mutual_information.min() >= 0


def test_every_input_sees_the_same_weight_draws():
    bnn = pyro_bbb.BNN(BayesianLinear(1, 1, bias=False), likelihoods.Gaussian(scale=1.0))
    x = torch.ones(10, 1)
    guide = fitted_guide(bnn, x, torch.zeros(10), init_scale=1.0)
    pred = pyro_bbb.predict(bnn, guide, x, num_samples=50, batch_size=3)
    loc = pred.distribution.loc  # (S, 10): identical inputs, so identical columns under shared draws
    torch.testing.assert_close(loc, loc[:, :1].expand(50, 10))
    assert loc[:, 0].std() > 0.5


class Flattening(torch.nn.Module):
    """A deterministic layer that assumes exactly one batch dimension (cannot run leading draw dimensions)."""

    def forward(self, x):
        return x.reshape(x.shape[0], -1) if x.dim() == 2 else x.reshape(-1, 1)[: x.shape[-2]]


class FlatteningModel(PyroModule):
    """A hand-written model (no BNN, so no folding): draws reach ``Flattening`` as leading dimensions."""

    def __init__(self):
        super().__init__()
        self.fc = BayesianLinear(2, 4)
        self.flat = Flattening()
        self.out = PyroModule[torch.nn.Linear](4, 1)

    def forward(self, x, y=None):
        mean = self.out(self.flat(self.fc(x))).squeeze(-1)
        with pyro.plate("data", x.shape[0]):
            return pyro.sample("y", dist.Normal(mean, 1.0), obs=y)


def test_falls_back_to_a_loop_with_a_warning_when_the_model_cannot_be_vectorized():
    model = FlatteningModel()
    x = torch.randn(5, 2)
    guide = fitted_guide(model, x, torch.randn(5))
    with pytest.warns(UserWarning, match="falling back to one call per draw"):
        pred = pyro_bbb.predict(model, guide, x, num_samples=4)
    assert pred.mean.shape == (5,)
    with pytest.raises(ValueError, match="vectorize=True"):
        pyro_bbb.predict(model, guide, x, num_samples=4, vectorize=True)


def test_a_pyrosample_layer_inside_a_bnn_falls_back_with_a_warning_that_names_it():
    """A Pyro-tutorial layer (PyroModule[nn.Linear] with PyroSample weights) inside BNN gets its draws as extra
    leading dimensions, which torch's linear rejects: the fallback's warning names such layers and the fix, not only
    a hand-written model's code."""
    from pyro.nn import PyroSample

    pyro.clear_param_store()
    layer = PyroModule[torch.nn.Linear](2, 1)
    layer.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, 2]).to_event(2))
    layer.bias = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))
    bnn = pyro_bbb.BNN(layer, likelihoods.Gaussian(scale=1.0))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    x = torch.randn(6, 2)
    with torch.no_grad():
        guide(x, torch.randn(6))
    with pytest.warns(UserWarning, match=r"one call per draw.*PyroSample sites of its own.*pyro_bbb\.nn's layers"):
        assert pyro_bbb.predict(bnn, guide, x, num_samples=3).mean.shape == (6,)


def test_hand_written_model_reading_draws_as_batch_falls_back_to_the_right_answer():
    model = BatchCentred()
    x = torch.randn(20, 3)
    guide = fitted_guide(model, x, torch.randn(20), init_scale=0.3)
    pyro.set_rng_seed(0)
    with pytest.warns(UserWarning, match="other values"):
        vectorized = pyro_bbb.predict(model, guide, x, num_samples=8)
    pyro.set_rng_seed(0)
    loop = pyro_bbb.predict(model, guide, x, num_samples=8, vectorize=False)
    torch.testing.assert_close(vectorized.distribution.loc, loop.distribution.loc)


def test_batchnorm_left_in_train_mode_predicts_on_its_running_statistics():
    """BatchNorm in train mode would pool its statistics over all S * B folded rows (draws mixed); predict runs the
    model in evaluation mode, so every row stands alone: vectorized without a warning, the same predictive as after
    bnn.eval(), and the batch norm is back in train mode after."""
    net = torch.nn.Sequential(BayesianLinear(3, 4), torch.nn.BatchNorm1d(4), BayesianLinear(4, 1))
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.1))
    x = torch.randn(20, 3)
    guide = fitted_guide(bnn, x, torch.randn(20), init_scale=0.3)
    net[1].running_mean.normal_()  # statistics that differ from the batch's
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=UntrainedGuideWarning)  # the guides are random, on purpose
        pyro.set_rng_seed(0)
        left_in_train = pyro_bbb.predict(bnn, guide, x, num_samples=8)
    assert net[1].training
    bnn.eval()
    pyro.set_rng_seed(0)
    evaluated = pyro_bbb.predict(bnn, guide, x, num_samples=8)
    torch.testing.assert_close(left_in_train.distribution.loc, evaluated.distribution.loc)


def test_works_with_a_plain_pyro_model():
    model = Regression(in_features=3, sigma=0.5)
    x, y = torch.randn(10, 3), torch.randn(10)
    guide = fitted_guide(model, x, y)
    pred = pyro_bbb.predict(model, guide, x, num_samples=8)
    assert isinstance(pred, RegressionPrediction)
    torch.testing.assert_close(pred.aleatoric_std, torch.full((10,), 0.5))


def test_log_likelihood_is_log_mean_exp_over_draws():
    bnn = regressor(likelihoods.Gaussian(scale=0.3))
    x, y = torch.randn(12, 2), torch.randn(12)
    guide = fitted_guide(bnn, x, y)
    pred = pyro_bbb.predict(bnn, guide, x, num_samples=10)
    log_p = dist.Normal(pred.distribution.loc, 0.3).log_prob(y)
    expected = torch.log(log_p.exp().mean(0))
    torch.testing.assert_close(pred.log_likelihood(y), expected, rtol=1e-5, atol=1e-5)


def test_bad_arguments():
    bnn = classifier()
    x = torch.randn(5, 4)
    guide = fitted_guide(bnn, x, torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="num_samples"):
        pyro_bbb.predict(bnn, guide, x, num_samples=0)
    with pytest.raises(ValueError, match="NaN"):
        pyro_bbb.predict(bnn, guide, torch.full((2, 4), math.nan))
    with pytest.raises(ValueError, match="at least one input"):
        pyro_bbb.predict(bnn, guide, torch.zeros(0, 4))


class Subsampled(PyroModule):
    """Pyro's subsampling idiom: the net outside, ``mu[..., idx]`` inside a subsampling data plate."""

    def __init__(self, subsample_size=None):
        super().__init__()
        self.fc = BayesianLinear(2, 1)
        self.subsample_size = subsample_size

    def forward(self, x, y=None):
        mu = self.fc(x).squeeze(-1)
        with pyro.plate("data", len(x), subsample_size=self.subsample_size) as idx:
            return pyro.sample("y", dist.Normal(mu[..., idx], 0.5), obs=None if y is None else y[idx])


@pytest.mark.parametrize("vectorize", [None, False])
@pytest.mark.parametrize("batch_size", [None, 25])
def test_subsampling_data_plate_covers_every_input_in_order(vectorize, batch_size):
    x, y = torch.randn(60, 2), torch.randn(60)
    model = Subsampled(subsample_size=40)
    guide = fitted_guide(model, x, y, init_scale=0.3)
    pyro.set_rng_seed(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # vectorized without falling back, also for chunks smaller than the subsample
        warnings.filterwarnings("ignore", category=UntrainedGuideWarning)  # the guides are random, on purpose
        pred = pyro_bbb.predict(model, guide, x, num_samples=7, vectorize=vectorize, batch_size=batch_size)
    assert len(pred) == 60
    model.subsample_size = None  # the same guide and draws, without subsampling: the reference
    pyro.set_rng_seed(3)
    reference = pyro_bbb.predict(model, guide, x, num_samples=7, vectorize=vectorize, batch_size=batch_size)
    torch.testing.assert_close(pred.distribution.loc, reference.distribution.loc)


def test_export_of_a_subsampling_model_covers_every_input():
    x, y = torch.randn(60, 2), torch.randn(60)
    model = Subsampled(subsample_size=40)
    guide = fitted_guide(model, x, y)
    idata = pyro_bbb.evaluate.to_inference_data(model, guide, x, y, num_samples=5)
    assert idata.log_likelihood["y"].shape[-1] == 60


@pytest.mark.parametrize("vectorize", [None, False])
def test_a_weight_the_model_conditions_on_is_data_not_replaced_by_the_guides_draws(vectorize):
    """``predict(poutine.condition(bnn, {"net.weight": w}), guide, x)`` uses ``w``: with the bias's posterior a point
    (init_scale 1e-6) the predictive mean is ``x @ w.T + b`` and no weight draw varies it; the export treats the
    conditioned weight as data (no posterior draws for it)."""
    bnn = pyro_bbb.BNN(BayesianLinear(2, 1), likelihoods.Gaussian(scale=0.5))
    guide = pyro_bbb.MeanFieldGuide(bnn, init_scale=1e-6)
    x, y = torch.randn(6, 2), torch.randn(6)
    guide(x, y)
    w = torch.tensor([[3.0, -2.0]])
    conditioned = poutine.condition(bnn, data={"net.weight": w})
    pred, draws, _ = pyro_bbb.prediction.predictive.predict_with_draws(conditioned, guide, x, num_samples=8,
                                                                        vectorize=vectorize)
    expected = (x @ w.T).squeeze(-1) + bnn.net.bias_init
    torch.testing.assert_close(pred.mean, expected, atol=1e-4, rtol=0)
    assert float(pred.epistemic_std.max()) < 1e-4 and "net.weight" not in draws and "net.bias" in draws


def test_set_up_guide_takes_the_observation_not_a_nested_plates_index_site():
    from ..helpers import MultiOutput

    class Checked(MultiOutput):
        def forward(self, x, y=None):
            if y is not None and y.shape != (x.shape[0], self.outputs):
                raise ValueError(f"the model was given y of shape {tuple(y.shape)}")
            return super().forward(x, y)

    model = Checked()
    guide = pyro_bbb.MeanFieldGuide(model)
    pyro_bbb.prediction.set_up_guide(model, guide, torch.randn(4, 2))
    latent = {name for name, _ in guide.prototype_trace.iter_stochastic_nodes()}
    assert latent == {"fc.weight", "fc.bias"}  # the observation stayed an observation, the plate index no site
    pyro_bbb.fit(model, guide, (torch.randn(8, 2), torch.randn(8, 3)), epochs=1, progress=False)


def test_a_set_up_but_never_trained_guide_is_named_by_predict_check_posterior_and_a_new_guide():
    """The three traps of an untrained or borrowed posterior: ``predict`` on a guide set up by ``guide(x, y)`` but never
    stepped warns (and stops warning after one ``fit`` epoch); ``check_posterior`` says "not trained" instead of
    advising the KL weight; a second guide built without ``pyro.clear_param_store()`` over the same site names warns
    that it adopts the first one's trained posterior (and is then not "untrained")."""
    from pyro_bbb.evaluate.diagnostics import PosteriorWarning
    from pyro_bbb.infer.guide import AdoptedPosteriorWarning

    x, y = torch.randn(40, 3), torch.randn(40)
    bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.5))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    guide(x, y)
    assert guide.is_untrained
    with pytest.warns(UntrainedGuideWarning, match="never trained"):
        pyro_bbb.predict(bnn, guide, x, num_samples=4)
    with pytest.warns(PosteriorWarning, match="never trained") as caught:
        report = pyro_bbb.evaluate.diagnostics.check_posterior(bnn, guide)
    assert {entry["status"] for entry in report.values()} == {"not trained"}
    assert not any("kl_weight" in str(w.message) for w in caught)

    pyro_bbb.fit(bnn, guide, (x, y), epochs=1, progress=False)
    assert not guide.is_untrained
    with warnings.catch_warnings():
        warnings.simplefilter("error", UntrainedGuideWarning)
        pyro_bbb.predict(bnn, guide, x, num_samples=4)

    again = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.5))  # no clear_param_store()
    second = pyro_bbb.MeanFieldGuide(again)
    with pytest.warns(AdoptedPosteriorWarning,  # (a pretrained body's weights are taken from the store too: said)
                      match=r"'net.weight'.*deterministic parameters.*earlier model's too.*pyro.clear_param_store\(\)"):
        second(x, y)
    assert not second.is_untrained
    pyro.clear_param_store()
    fresh = pyro_bbb.MeanFieldGuide(pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.5)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", AdoptedPosteriorWarning)
        fresh(x, y)
    # a model with nothing latent (a deterministic net, fixed noise): its guide has nothing to train, no warning
    plain = pyro_bbb.BNN(torch.nn.Linear(3, 1), likelihoods.Gaussian(scale=0.5))
    empty = pyro_bbb.MeanFieldGuide(plain)
    empty(x, y)
    assert not empty.is_untrained


def test_predict_runs_the_model_in_evaluation_mode_and_fit_in_training_mode():
    """Dropout is off while predicting (the weight draws carry the uncertainty; the vectorized pass is then exact, no
    per-draw fallback), on while fitting, whatever mode the user left the model in; each module's mode comes back."""
    torch.manual_seed(0)
    seen = []

    class Recorder(torch.nn.Module):
        def forward(self, x):
            seen.append(self.training)
            return x

    net = torch.nn.Sequential(BayesianLinear(2, 16), torch.nn.ReLU(), torch.nn.Dropout(0.5), Recorder(),
                              BayesianLinear(16, 1))
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.1))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    x, y = torch.randn(32, 2), torch.randn(32)
    bnn.eval()
    pyro_bbb.fit(bnn, guide, (x, y), epochs=2, progress=False, kl_weight=1)  # (the selection predicts in eval mode)
    assert seen and all(seen)  # trained with dropout on
    assert not any(m.training for m in bnn.modules())  # and left as the user had it
    bnn.train()
    seen.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback from the vectorized pass
        first = pyro_bbb.predict(bnn, guide, x, num_samples=20, vectorize=True)
    assert seen and not any(seen)
    assert all(m.training for m in bnn.modules())
    # the predictive is the dropout-free network's: the same draws through the model in eval mode by hand
    pyro.set_rng_seed(3)
    again = pyro_bbb.predict(bnn, guide, x, num_samples=20)
    pyro.set_rng_seed(3)
    bnn.eval()
    by_hand = pyro_bbb.predict(bnn, guide, x, num_samples=20)
    torch.testing.assert_close(again.mean, by_hand.mean)
    assert first.mean.shape == (32,)


@pytest.mark.parametrize("outputs", [1, 3])
def test_a_plate_nested_in_the_data_plate_is_predicted_vectorized_as_one_draw_at_a_time(outputs):
    """Multi-output regression (a plate over the outputs at dim -1 inside the data plate at dim -2): all draws in one
    call, the same predictive as the per-draw loop, without a fallback."""
    from ..helpers import MultiOutput

    torch.manual_seed(0)
    model = MultiOutput(outputs=outputs)
    x, y = torch.randn(10, 2), torch.randn(10, outputs)
    guide = pyro_bbb.MeanFieldGuide(model, init_scale=0.2)
    pyro_bbb.fit(model, guide, (x, y), epochs=2, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pyro.set_rng_seed(0)
        vectorized = pyro_bbb.predict(model, guide, x, num_samples=7, vectorize=True)
    pyro.set_rng_seed(0)
    loop = pyro_bbb.predict(model, guide, x, num_samples=7, vectorize=False)
    assert vectorized.samples.shape == (7, 10, outputs)
    torch.testing.assert_close(vectorized.distribution.base_dist.loc, loop.distribution.base_dist.loc)


def test_predict_with_a_guide_not_yet_set_up_leaves_batch_norm_alone():
    """The set-up pass ran in training mode: it moved pretrained running statistics (and BatchNorm1d failed on its one
    row, with num_batches_tracked counted up all the same)."""
    norm = torch.nn.BatchNorm1d(4)
    with torch.no_grad():
        norm.running_mean.fill_(5.0)
        norm.num_batches_tracked.fill_(1000)
    net = torch.nn.Sequential(BayesianLinear(3, 4), norm, torch.nn.ReLU(), BayesianLinear(4, 2))
    bnn = pyro_bbb.BNN(net, likelihoods.Categorical())
    kept = {name: value.clone() for name, value in bnn.named_buffers()}
    with pytest.warns(UntrainedGuideWarning):
        pyro_bbb.predict(bnn, pyro_bbb.MeanFieldGuide(bnn), torch.randn(6, 3), num_samples=4)
    assert all(torch.equal(value, kept[name]) for name, value in bnn.named_buffers())
    assert bnn.training  # (the model's mode as it was)


def test_a_classifier_with_several_labels_per_row_is_a_clear_error():
    """A Categorical reinterpreted over tokens (.to_event(1)) gave a Prediction whose probs, log_likelihood and
    accuracy all failed with AttributeError: 'Independent' object has no attribute 'probs'."""

    class Tagger(PyroModule):
        def __init__(self):
            super().__init__()
            self.fc = BayesianLinear(4, 3)

        def forward(self, x, y=None):
            logits = self.fc(x)
            with pyro.plate("data", x.shape[0]):
                return pyro.sample("y", dist.Categorical(logits=logits).to_event(1), obs=y)

    model = Tagger()
    x = torch.randn(6, 5, 4)
    guide = pyro_bbb.MeanFieldGuide(model)
    guide(x, torch.zeros(6, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"one class label per row.*Categorical over \(5,\) labels per row"):
        pyro_bbb.predict(model, guide, x, num_samples=3)


def test_a_data_loader_is_predicted_row_by_row_in_its_order():
    """predict refused a DataLoader ("x must be a torch.Tensor or a numpy array"), though fit takes one. Its inputs,
    from (x, y) pairs or alone, give the predictions of the same rows as a tensor at the loader's batch size, the
    same draws; a loader that shuffles would give rows in an order nothing else has, and is refused."""
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    bnn = pyro_bbb.BNN(BayesianLinear(3, 2), likelihoods.Categorical())
    guide = pyro_bbb.MeanFieldGuide(bnn)
    x, y = torch.randn(37, 3), torch.randint(0, 2, (37,))
    pyro_bbb.fit(bnn, guide, (x, y), epochs=1, kl_weight=1, progress=False)
    pyro.set_rng_seed(1)
    expected = pyro_bbb.predict(bnn, guide, x, num_samples=8, batch_size=10).probs
    for loader in (DataLoader(TensorDataset(x, y), batch_size=10), DataLoader(x, batch_size=10)):
        pyro.set_rng_seed(1)
        assert torch.equal(pyro_bbb.predict(bnn, guide, loader, num_samples=8).probs, expected)
    for sampler in (torch.utils.data.RandomSampler(x), torch.utils.data.SubsetRandomSampler(range(37))):
        with pytest.raises(ValueError, match=rf"draws its rows with a {type(sampler).__name__}.*shuffle=False"):
            pyro_bbb.predict(bnn, guide, DataLoader(TensorDataset(x, y), batch_size=10, sampler=sampler))
    with pytest.raises(ValueError, match="draws its rows with its own batch_sampler"):
        pyro_bbb.predict(bnn, guide, DataLoader(x, batch_sampler=[[0, 1], [2, 3]]))
    with pytest.raises(ValueError, match=r"drops its last, partial batch \(drop_last=True\)"):  # (36 of 37 rows)
        pyro_bbb.predict(bnn, guide, DataLoader(x, batch_size=4, drop_last=True))
    with pytest.raises(ValueError, match=r"\(batch_size=None\) yields single rows"):
        pyro_bbb.predict(bnn, guide, DataLoader(x, batch_size=None))


def test_a_data_loader_of_triples_is_named_with_the_fix_and_a_net_of_three_inputs_takes_them():
    """(x, y, weights) batches were read as three inputs, and torch said only "forward() takes 2 positional
    arguments but 4 were given"; a net whose forward takes three inputs predicts from them as before."""
    from torch.utils.data import DataLoader, TensorDataset

    x, y = torch.randn(12, 3), torch.randn(12)
    bnn = pyro_bbb.BNN(torch.nn.Sequential(BayesianLinear(3, 1)), likelihoods.Gaussian(scale=1.0))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (x, y), epochs=1, kl_weight=1, progress=False)
    triples = DataLoader(TensorDataset(x, y, torch.ones(12)), batch_size=5)
    with pytest.raises(TypeError, match=r"list of 3 inputs.*takes 2 positional.*\(x, y, weights\).*TensorDataset"):
        pyro_bbb.predict(bnn, guide, triples, num_samples=2)

    class Hooked(torch.nn.Module):  # a pre-hook keeps the first input; forward's own TypeError is its own
        def __init__(self):
            super().__init__()
            self.layer = BayesianLinear(3, 1)
            self.register_forward_pre_hook(lambda module, args: args[:1])

        def forward(self, a):
            return self.layer(a) + None

    hooked = pyro_bbb.BNN(Hooked(), likelihoods.Gaussian(scale=1.0))
    with pytest.raises(TypeError, match="unsupported operand") as error:
        hooked.net(*triples.dataset.tensors)
    with pytest.raises(TypeError) as raised:
        pyro_bbb.predict(hooked, pyro_bbb.MeanFieldGuide(hooked), triples, num_samples=2)
    assert str(raised.value) == str(error.value)

    class Sum3(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = BayesianLinear(3, 1)

        def forward(self, a, b, c):
            return self.layer(a + b[:, None] + c[:, None])

    bnn = pyro_bbb.BNN(Sum3(), likelihoods.Gaussian(scale=1.0))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro.set_rng_seed(0)
    from_loader = pyro_bbb.predict(bnn, guide, triples, num_samples=2)
    pyro.set_rng_seed(0)
    assert torch.equal(from_loader.mean, pyro_bbb.predict(bnn, guide, (x, y, torch.ones(12)), num_samples=2).mean)


def test_a_data_loader_that_pads_each_batch_to_its_own_length_is_predicted_batch_by_batch():
    """A collate_fn that pads each batch to its longest sequence (text) made inputs that could not be joined; each
    batch runs as it comes, under the same draws as the batches given one at a time."""
    from torch.utils.data import DataLoader

    class MeanToken(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = BayesianLinear(4, 2)

        def forward(self, x):
            return self.fc(x).mean(1)

    torch.manual_seed(0)
    bnn = pyro_bbb.BNN(MeanToken(), likelihoods.Categorical())
    guide = pyro_bbb.MeanFieldGuide(bnn)
    sequences = [torch.randn(2 + i % 5, 4) for i in range(12)]
    guide(torch.stack([s[:2] for s in sequences]), torch.zeros(12, dtype=torch.long))
    loader = DataLoader(sequences, batch_size=4,
                        collate_fn=lambda batch: torch.nn.utils.rnn.pad_sequence(batch, batch_first=True))
    pyro.set_rng_seed(2)
    probs = pyro_bbb.predict(bnn, guide, loader, num_samples=6).probs
    assert probs.shape == (12, 2)
    pyro.set_rng_seed(2)
    first = pyro_bbb.predict(bnn, guide, next(iter(loader)), num_samples=6).probs
    torch.testing.assert_close(probs[:4], first, rtol=0, atol=1e-4)  # (draws run in blocks sized by the chunk)
    per_token = pyro_bbb.BNN(BayesianLinear(4, 1), likelihoods.Gaussian(scale=1.0),
                             output_adapter=lambda out: out.squeeze(-1))  # an output per position
    per_token_guide = pyro_bbb.MeanFieldGuide(per_token)
    per_token_guide(torch.randn(3, 2, 4), torch.randn(3, 2))
    with pytest.raises(ValueError, match="differ in shape past the batch dimension.*Pad every batch to one length"):
        pyro_bbb.predict(per_token, per_token_guide, loader, num_samples=4)


@pytest.mark.parametrize("likelihood, out", [(likelihoods.Categorical(), 3), (likelihoods.Bernoulli(), 1),
                                             (likelihoods.Gaussian(scale=0.5), 2)], ids=["categorical", "bernoulli",
                                                                                         "gaussian"])
def test_a_prediction_indexed_by_rows_is_the_prediction_of_those_rows(likelihood, out):
    """``prediction[mask]`` (scoring a subset: one class, the inputs a user flags) raised "'ClassificationPrediction'
    object is not subscriptable". It is the same draws at those rows: every result equals the full one's rows."""
    from pyro_bbb.evaluate import metrics

    torch.manual_seed(0)
    bnn = pyro_bbb.BNN(BayesianLinear(3, out), likelihood)
    guide = pyro_bbb.MeanFieldGuide(bnn)
    x = torch.randn(12, 3)
    y = torch.randn(12, out) if out == 2 else torch.randint(0, max(out, 2), (12,))
    guide(x, y)
    full = pyro_bbb.predict(bnn, guide, x, num_samples=6)
    mask = torch.arange(12) % 3 == 0
    for rows in (mask, slice(2, 7), torch.tensor([5, 0, 5]), [1, 2], 4, -1, torch.tensor(3), np.int64(2),
                 np.array(5)):
        part = full[rows]
        index = torch.arange(12)[int(rows) if isinstance(rows, np.integer | np.ndarray) else rows].reshape(-1)
        assert type(part) is type(full) and len(part) == len(index) and part.num_samples == 6
        torch.testing.assert_close(part.log_likelihood(y[index]), full.log_likelihood(y)[index])
        torch.testing.assert_close(part.samples, full.samples[:, index])
        if out == 2:
            torch.testing.assert_close(part.mean, full.mean[index])
            torch.testing.assert_close(part.interval(0.8)[0], full.interval(0.8)[0][index])
        else:
            torch.testing.assert_close(part.probs, full.probs[index])
            torch.testing.assert_close(part.mutual_information, full.mutual_information[index])
            assert metrics.accuracy(part, y[index]) == pytest.approx(
                float((full.predicted_class[index] == y[index]).float().mean()))
    with pytest.raises(IndexError):  # a float is no index, as for a tensor
        full[torch.tensor(1.7)]


@pytest.mark.parametrize("likelihood, outputs", [(likelihoods.Gaussian(scale=0.5), 1), (likelihoods.Categorical(), 3)])
def test_one_unbatched_row_to_a_guide_never_set_up_says_to_pass_a_batch_of_one(likelihood, outputs):
    """predict sets a guide that never saw the model up on the input's first row: of one unbatched row (3,) that was
    one feature, (1,), and the error named the layer's input width, not the fix. Now the likelihood's word, x[None],
    comes first, as for a trained guide, and the guide then predicts on the batch of one."""
    bnn = pyro_bbb.BNN(torch.nn.Sequential(BayesianLinear(3, 8), torch.nn.Tanh(), BayesianLinear(8, outputs)),
                       likelihood)
    guide = pyro_bbb.MeanFieldGuide(bnn)
    x = torch.randn(3)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UntrainedGuideWarning)
        with pytest.raises(ValueError, match=r"batch of one, x\[None\]"):
            pyro_bbb.predict(bnn, guide, x, num_samples=4)
        assert len(pyro_bbb.predict(bnn, guide, x[None], num_samples=4)) == 1


class _OutputsModel(PyroModule):
    """Three outputs per row: in a plate nested in the data plate, or one distribution ``.to_event(1)``."""

    def __init__(self, form: str, family: str = "normal"):
        super().__init__()
        self.form, self.family, self.fc = form, family, BayesianLinear(2, 3)

    def forward(self, x, y=None):
        out = self.fc(x) if self.form != "outer" else self.fc(x).T
        fn = dist.Normal(out, 0.5) if self.family == "normal" else dist.Bernoulli(logits=out)
        if self.form == "to_event":
            with pyro.plate("data", x.shape[0]):
                return pyro.sample("y", fn.to_event(1), obs=y)
        if self.form == "nested":
            with pyro.plate("data", x.shape[0], dim=-2), pyro.plate("outputs", 3, dim=-1):
                return pyro.sample("y", fn, obs=y)
        with pyro.plate("outputs", 3, dim=-2), pyro.plate("data", x.shape[0], dim=-1):  # the rows on dim -1
            return pyro.sample("y", fn, obs=None if y is None else y.T)


def test_outputs_in_a_plate_nested_in_the_data_plate_are_scored_per_row():
    """Three outputs in pyro.plate("outputs", dim=-1) inside the data plate were scored as rows of their own: a
    mixture over the draws per output, averaged over N * 3 -- log-likelihood -1.5 per "row" where the rows' is -4.5,
    and fit's val_log_likelihood (early stopping's default) with it. They are one row's outputs, scored together
    under each weight draw, as the same model's .to_event(1) is; a Bernoulli is refused as its .to_event form is; a
    plate outside the data plate is refused."""
    from pyro_bbb.evaluate import metrics

    x, y = torch.randn(40, 2), torch.randn(40, 3)
    torch.manual_seed(0)
    nested = _OutputsModel("nested")
    guide = pyro_bbb.MeanFieldGuide(nested, init_scale=0.3)
    pyro_bbb.fit(nested, guide, (x, y), epochs=2, kl_weight=1, progress=False)
    pyro.set_rng_seed(1)
    prediction = pyro_bbb.predict(nested, guide, x, num_samples=500)
    per_draw = dist.Normal(prediction.distribution.mean, 0.5).log_prob(y).sum(-1)  # (draws, rows)
    expected = (per_draw.logsumexp(0) - math.log(500)).mean()
    assert prediction.log_prob(y).shape == (500, 40)
    assert metrics.log_likelihood(prediction, y) == pytest.approx(float(expected), abs=1e-5)
    assert metrics.log_likelihood(prediction, y) < -3  # (not the per-output -1.5)
    to_event = _OutputsModel("to_event")
    to_event.fc.load_state_dict(nested.fc.state_dict())
    pyro.set_rng_seed(1)
    twin = pyro_bbb.predict(to_event, guide, x, num_samples=500)  # (the same sites, the same posterior)
    assert torch.equal(twin.mean, prediction.mean)
    assert metrics.log_likelihood(twin, y) == pytest.approx(metrics.log_likelihood(prediction, y), abs=1e-6)

    pyro.clear_param_store()
    bernoulli = _OutputsModel("nested", "bernoulli")
    with pytest.raises(ValueError, match=r"Bernoulli over \(3,\) labels per row \(.to_event or a plate inside"):
        pyro_bbb.predict(bernoulli, pyro_bbb.MeanFieldGuide(bernoulli), x, num_samples=2)
    class OneLabel(PyroModule):  # the data plate at dim -2 over (N, 1) logits, no plate inside: one label a row
        def __init__(self):
            super().__init__()
            self.fc = BayesianLinear(2, 1)

        def forward(self, x, y=None):
            logits = self.fc(x)
            with pyro.plate("data", x.shape[0], dim=-2):
                return pyro.sample("y", dist.Bernoulli(logits=logits), obs=y)

    pyro.clear_param_store()
    one_label = OneLabel()
    one = pyro_bbb.predict(one_label, pyro_bbb.MeanFieldGuide(one_label), x, num_samples=2)  # one label per row:
    assert one.samples.shape == (2, 40) and one.probs.shape == (40,)  # (N,), as the metrics read a classifier's
    pyro.clear_param_store()
    outer = _OutputsModel("outer")
    with warnings.catch_warnings(record=True) as caught:  # (refused from the plain pass: no vectorized attempt)
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=r"plate 'outputs' \(dim -2\) at a dim left of its data plate 'data'"):
            pyro_bbb.predict(outer, pyro_bbb.MeanFieldGuide(outer), x, num_samples=2)
    assert not [w for w in caught if "could not run several weight draws" in str(w.message)]


@pytest.mark.parametrize("mix", ["first row", "cumsum", "last row"])
def test_a_net_whose_rows_depend_on_earlier_rows_is_not_vectorized(mix):
    """Draws folded into the batch were checked at draw 0 alone, which a net reading earlier rows (h - h[:1], a cumsum
    over the batch) passes: every later draw read draw 0's rows, silently (row 0's epistemic std 1.0 where it is 0
    under every draw; a cumsum's last-row mean 370 against 1.07). The first block's last draw is checked too: the
    per-draw loop's answer, with a warning naming the cause; vectorize=True refuses."""

    class Relative(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = BayesianLinear(2, 1)

        def forward(self, x):
            h = self.layer(x)
            if mix == "cumsum":
                return h.cumsum(0)
            return h - (h[:1] if mix == "first row" else h[-1:])

    torch.manual_seed(0)
    x = torch.randn(12, 2)
    bnn = pyro_bbb.BNN(Relative(), likelihoods.Gaussian(scale=0.1))
    guide = fitted_guide(bnn, x, torch.randn(12), init_scale=0.5)
    pyro.set_rng_seed(1)
    with pytest.warns(UserWarning, match=r"other values.*rows depend on other rows.*vectorize=False"):
        vectorized = pyro_bbb.predict(bnn, guide, x, num_samples=50)
    pyro.set_rng_seed(1)
    loop = pyro_bbb.predict(bnn, guide, x, num_samples=50, vectorize=False)
    assert torch.equal(vectorized.mean, loop.mean) and torch.equal(vectorized.samples, loop.samples)
    with pytest.raises(ValueError, match=r"vectorize=True\): the vectorized draws gave other values"):
        pyro_bbb.predict(bnn, guide, x, num_samples=50, vectorize=True)


@pytest.mark.parametrize("kind", ["categorical", "bernoulli"])
def test_a_classifier_whose_data_plate_is_at_dim_minus_2_gets_one_label_per_row(kind):
    """pyro.plate("data", N, dim=-2) with a trailing dimension of 1 (a common Pyro idiom) gave probs of shape
    (N, 1, C): accuracy compared an (N, 1) argmax with (N,) labels as an N x N table (0.29 for 0.65), and the
    Bernoulli's log-likelihood refused both y and y[:, None]. Now (N, C), scored as by hand, with either labels."""
    from pyro.infer.autoguide import AutoNormal

    pyro.clear_param_store()
    torch.manual_seed(0)
    x = torch.randn(40, 2)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long() if kind == "categorical" else (x[:, 0] > 0).float()
    classes = 3 if kind == "categorical" else 1

    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(2, classes), 1.0).to_event(2))
        with pyro.plate("data", len(x), dim=-2):
            logits = (x @ w)[:, None] if kind == "categorical" else x @ w
            fn = dist.Categorical(logits=logits) if kind == "categorical" else dist.Bernoulli(logits=logits)
            pyro.sample("y", fn, obs=None if y is None else y[:, None])

    guide = AutoNormal(model)
    guide(x, y)
    pred = pyro_bbb.predict(model, guide, x, num_samples=8)
    assert pred.samples.shape == (8, 40)
    if kind == "categorical":
        assert pred.probs.shape == (40, 3)
        by_hand = (pred.probs.argmax(-1) == y).float().mean()
        brier = (pred.probs - torch.nn.functional.one_hot(y, 3)).square().sum(-1).mean()
        assert metrics.brier_score(pred, y) == pytest.approx(float(brier), rel=1e-6)
    else:
        by_hand = ((pred.probs > 0.5).float() == y).float().mean()
    log_likelihood = torch.logsumexp(pred.distribution.log_prob(y), 0).sub(math.log(8)).mean()
    for labels in (y, y[:, None]):
        assert metrics.accuracy(pred, labels) == pytest.approx(float(by_hand))
        assert metrics.log_likelihood(pred, labels) == pytest.approx(float(log_likelihood), rel=1e-6)
        metrics.expected_calibration_error(pred, labels)


class _OwnLikelihood(likelihoods.Likelihood):
    """A likelihood of one's own, as the Likelihood docstring shows: Poisson counts, LogNormal positive targets."""

    def __init__(self, family):
        super().__init__()
        self.family = family

    def distribution(self, output):
        if self.family == "poisson":
            return dist.Poisson(output.squeeze(-1).exp())
        if self.family == "lognormal":
            return dist.LogNormal(output.squeeze(-1), 0.5)
        return dist.TransformedDistribution(dist.Normal(output.squeeze(-1), 0.5), [dist.transforms.ExpTransform()])

    def prediction(self, distribution, samples):
        from pyro_bbb.prediction.results import Prediction

        return Prediction(distribution, samples)


@pytest.mark.parametrize("family", ["poisson", "lognormal"])
def test_a_likelihood_of_ones_own_predicts_and_is_scored_by_hand(family):
    """predict refused every family but Normal, Categorical and Bernoulli before the likelihood's own prediction()
    was called, though its error said to subclass Likelihood and Prediction: so fit's validation_data failed and
    kl_weight="auto" silently fell back to weight 1."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    x = torch.randn(60, 2)
    y = torch.poisson(x[:, 0].exp()) if family == "poisson" else (0.5 * x[:, 0] + 0.3 * torch.randn(60)).exp()
    bnn = pyro_bbb.BNN(BayesianLinear(2, 1), _OwnLikelihood(family))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    history = pyro_bbb.fit(bnn, guide, (x[:50], y[:50]), epochs=4, batch_size=25, progress=False, seed=0,
                           validation_data=(x[50:], y[50:]))
    assert history.kl_weight_choice.chosen_by == "validation" and "val_log_likelihood" in history.last
    pred = pyro_bbb.predict(bnn, guide, x, num_samples=10)
    assert pred.samples.shape == (10, 60) and type(pred.distribution) is type(bnn.likelihood.distribution(x[:1]))
    by_hand = torch.logsumexp(pred.distribution.log_prob(y), 0).sub(math.log(10)).mean()
    assert metrics.log_likelihood(pred, y) == pytest.approx(float(by_hand), rel=1e-6)


def test_a_distribution_predict_cannot_rebuild_is_named():
    pyro.clear_param_store()
    bnn = pyro_bbb.BNN(BayesianLinear(2, 1), _OwnLikelihood("transformed"))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    x = torch.randn(10, 2)
    guide(x, torch.rand(10) + 0.5)
    with pytest.raises(ValueError, match="cannot rebuild a TransformedDistribution.*arg_constraints"):
        pyro_bbb.predict(bnn, guide, x, num_samples=3)


def test_another_family_is_summarised_as_itself_by_a_model_or_a_likelihood_without_prediction():
    """A hand-written StudentT model reached ClassificationPrediction (an AttributeError on 'probs'), and a
    likelihood of one's own without prediction() an empty NotImplementedError: both are a plain Prediction now."""
    from pyro_bbb.prediction.results import ClassificationPrediction, Prediction

    class StudentT(PyroModule):
        def __init__(self):
            super().__init__()
            self.fc = BayesianLinear(3, 1)

        def forward(self, x, y=None):
            loc = self.fc(x).squeeze(-1)
            with pyro.plate("data", len(x)):
                return pyro.sample("obs", dist.StudentT(4.0, loc, 1.0), obs=y)

    class Poisson(likelihoods.Likelihood):
        def distribution(self, output):
            return dist.Poisson(output.squeeze(-1).exp())

    torch.manual_seed(0)
    x = torch.randn(30, 3)
    for model, y in ((StudentT(), torch.randn(30)), (pyro_bbb.BNN(BayesianLinear(3, 1), Poisson()),
                                                     torch.poisson(x[:, 0].exp()))):
        pyro.clear_param_store()
        guide = pyro_bbb.MeanFieldGuide(model)
        guide(x, y)
        pred = pyro_bbb.predict(model, guide, x, num_samples=5)
        assert type(pred) is Prediction and not isinstance(pred, ClassificationPrediction)
        by_hand = torch.logsumexp(pred.distribution.log_prob(y), 0).sub(math.log(5)).mean()
        assert metrics.log_likelihood(pred, y) == pytest.approx(float(by_hand), rel=1e-6)
