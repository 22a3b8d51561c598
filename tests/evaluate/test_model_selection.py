"""``evidence`` and ``compare_evidence`` against closed forms: the ELBO of a linear-Gaussian model at a given
mean-field Gaussian, and the log marginal likelihood where the mean-field family holds the exact posterior."""

import math
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide import AutoNormal

import pyro_bbb
from pyro_bbb import MeanFieldGuide, likelihoods, priors
from pyro_bbb._checks import GuideNotSetUpError
from pyro_bbb.evaluate import compare_evidence, evidence
from pyro_bbb.infer.guide import AdoptedPosteriorWarning
from pyro_bbb.nn import BayesianLinear
from tests.helpers import Regression, params

NOISE = 0.5


def _orthogonal_design(n=64, d=3, seed=0):
    """Columns orthogonal (``X^T X = n I``): the exact posterior of a linear-Gaussian model with an isotropic prior
    factorises, so the optimal mean-field Gaussian is the posterior and the ELBO there is the log evidence."""
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, d, generator=g, dtype=torch.float64))
    x = q * math.sqrt(n)
    y = x @ torch.tensor([0.8, -0.3, 0.1], dtype=torch.float64)[:d] + NOISE * torch.randn(n, generator=g,
                                                                                           dtype=torch.float64)
    return x, y


def _linear_model(prior_scale):
    layer = BayesianLinear(3, 1, bias=False, prior=priors.Normal(0.0, prior_scale), dtype=torch.float64)
    return pyro_bbb.BNN(layer, likelihoods.Gaussian(scale=NOISE))


def _set_guide(guide, x, y, loc, scale):
    guide(x, y)
    to_raw = torch.distributions.transform_to(guide.scale_constraint).inv
    with torch.no_grad():
        for name, value in pyro.get_param_store().named_parameters():
            value.copy_((loc if ".locs." in name else to_raw(scale)).view(value.shape))


def _posterior(x, y, prior_scale):
    precision = x.T @ x / NOISE**2 + torch.eye(x.shape[1], dtype=x.dtype) / prior_scale**2
    mean = torch.linalg.solve(precision, x.T @ y / NOISE**2)
    return mean, 1.0 / precision.diagonal().sqrt()


def _log_evidence(x, y, prior_scale):
    covariance = prior_scale**2 * x @ x.T + NOISE**2 * torch.eye(len(x), dtype=x.dtype)
    return float(dist.MultivariateNormal(torch.zeros(len(x), dtype=x.dtype), covariance).log_prob(y))


def _closed_form_elbo(x, y, loc, scale, prior_scale):
    residual = y - x @ loc
    expected = (-0.5 * math.log(2 * math.pi * NOISE**2) * len(y)
                - float((residual**2).sum() + (x**2 @ scale**2).sum()) / (2 * NOISE**2))
    kl = float(torch.distributions.kl_divergence(dist.Normal(loc, scale), dist.Normal(0.0, prior_scale)).sum())
    return expected - kl


@pytest.mark.parametrize("prior_scale", [0.1, 1.0, 10.0])
def test_at_the_exact_posterior_the_elbo_is_the_log_evidence(prior_scale):
    """Within 4 standard errors of the closed-form log marginal likelihood, for a prior that fits and two that do
    not; the ranking of the three follows the log evidence (what model selection by the ELBO relies on)."""
    x, y = _orthogonal_design()
    pyro.clear_param_store()
    bnn = _linear_model(prior_scale)
    guide = MeanFieldGuide(bnn)
    _set_guide(guide, x, y, *_posterior(x, y, prior_scale))
    result = evidence(bnn, guide, (x, y), num_draws=400)
    exact = _log_evidence(x, y, prior_scale)
    assert 0 < result.standard_error < 1.0
    assert abs(result.elbo - exact) < 4 * result.standard_error, (result, exact)
    assert result.elbo == pytest.approx(result.expected_log_likelihood - result.kl)


def test_the_elbo_of_a_correlated_posterior_matches_its_closed_form_and_stays_below_the_log_evidence():
    x = torch.randn(80, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x[:, 1] += 2.0 * x[:, 0]  # correlated columns: the mean-field optimum is not the posterior
    y = x @ torch.tensor([0.5, -0.5, 1.0], dtype=torch.float64) + NOISE * torch.randn(
        80, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    loc, scale = _posterior(x, y, 1.0)
    pyro.clear_param_store()
    bnn = _linear_model(1.0)
    guide = MeanFieldGuide(bnn)
    _set_guide(guide, x, y, loc, scale)
    result = evidence(bnn, guide, (x, y), num_draws=400)
    exact = _closed_form_elbo(x, y, loc, scale, 1.0)
    assert abs(result.elbo - exact) < 4 * result.standard_error, (result, exact)
    assert exact < _log_evidence(x, y, 1.0) - 0.5  # a real gap, which the estimate reports
    assert result.kl == pytest.approx(
        float(torch.distributions.kl_divergence(dist.Normal(loc, scale), dist.Normal(0.0, 1.0)).sum()), rel=1e-9)


def test_batches_and_a_data_loader_estimate_the_same_elbo_and_nothing_changes():
    x, y = _orthogonal_design(n=70)
    pyro.clear_param_store()
    bnn = _linear_model(1.0)
    guide = MeanFieldGuide(bnn)
    _set_guide(guide, x, y, *_posterior(x, y, 1.0))
    exact = _log_evidence(x, y, 1.0)
    before = params()
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    batched = evidence(bnn, guide, (x, y), num_draws=300, batch_size=17)
    assert torch.equal(torch.rand(3), expected_next)  # the generators are left as they were
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    from_loader = evidence(bnn, guide, loader, num_draws=300)
    for result in (batched, from_loader):
        assert result.num_data == 70
        assert abs(result.elbo - exact) < 4 * result.standard_error, (result, exact)
    assert all(torch.equal(v, before[k]) for k, v in params().items())
    assert evidence(bnn, guide, (x, y), num_draws=20, seed=5) == evidence(bnn, guide, (x, y), num_draws=20, seed=5)


def test_a_data_loader_that_skips_rows_is_refused_not_summed_in_part():
    """drop_last=True yielded 64 of 70 rows, and the batches' shares of N added up to 0.91: the expected
    log-likelihood and the KL both came out 9% small, without a word."""
    x, y = _orthogonal_design(n=70)
    pyro.clear_param_store()
    bnn = _linear_model(1.0)
    guide = MeanFieldGuide(bnn)
    _set_guide(guide, x, y, *_posterior(x, y, 1.0))
    dataset = torch.utils.data.TensorDataset(x, y)
    for loader in (torch.utils.data.DataLoader(dataset, batch_size=32, drop_last=True),
                   torch.utils.data.DataLoader(dataset, batch_size=32,
                                               sampler=torch.utils.data.RandomSampler(dataset, num_samples=40))):
        with pytest.raises(ValueError, match=r"yielded (64|40) of its 70 rows.*drop_last=False"):
            evidence(bnn, guide, loader, num_draws=3)


def test_another_guide_a_hand_written_model_and_targets_of_shape_n_by_1():
    x, y = _orthogonal_design(n=40)
    x, y = x.float(), y.float()
    pyro.clear_param_store()
    model = Regression(prior=priors.Normal(0.0, 1.0), sigma=NOISE)
    guide = AutoNormal(model, init_scale=0.05)
    pyro_bbb.fit(model, guide, (x, y), epochs=30, lr=1e-2, progress=False, seed=0)
    result = evidence(model, guide, (x, y), num_draws=200)
    reference = -pyro_bbb.ELBO(num_data=40, num_particles=2000, vectorize_particles=True).loss(model, guide, x, y)
    assert abs(result.elbo - reference) < 4 * result.standard_error + 0.1, (result, reference)

    pyro.clear_param_store()
    bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=NOISE))
    guide = MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (x, y.unsqueeze(-1)), epochs=5, progress=False, seed=0)
    column, flat = evidence(bnn, guide, (x, y.unsqueeze(-1)), num_draws=50), evidence(bnn, guide, (x, y), num_draws=50)
    assert column.elbo == pytest.approx(flat.elbo, rel=1e-6)


def test_bad_calls_are_clear_errors():
    x, y = torch.randn(10, 3), torch.randn(10)
    pyro.clear_param_store()
    bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian())
    guide = MeanFieldGuide(bnn)
    with pytest.raises(GuideNotSetUpError, match="evidence needs its parameters"):
        evidence(bnn, guide, (x, y))
    guide(x, y)
    with pytest.raises(ValueError, match="num_draws must be at least 2"):
        evidence(bnn, guide, (x, y), num_draws=1)
    with pytest.raises(ValueError, match="x has 10 rows but y has shape"):
        evidence(bnn, guide, (x, y[:5]))
    with pytest.raises(ValueError, match="at least one"):
        compare_evidence({}, (x, y))
    with pyro_bbb.moment_propagation(), pytest.raises(ValueError, match="inside an estimator's handler"):
        evidence(bnn, guide, (x, y))


def test_a_point_estimate_guide_has_no_elbo_to_report_and_its_rng_is_left_alone():
    """AutoDelta's finite "ELBO" is the log joint, which outranked a real posterior's bound: refused, by name."""
    from pyro.infer.autoguide import AutoDelta, AutoGuideList, AutoLaplaceApproximation

    x, y = torch.randn(20, 3), torch.randn(20)
    pyro.clear_param_store()
    bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.5))

    def point_guide(x, y):  # hand-written: a point mass per site
        pyro.sample("net.weight", dist.Delta(pyro.param("w_map", torch.zeros(1, 3))).to_event(2))
        pyro.sample("net.bias", dist.Delta(pyro.param("b_map", torch.zeros(1))).to_event(1))

    def normal_guide(x, y):  # hand-written: a density per site, not refused
        scale = pyro.param("s", torch.full((1, 3), 0.1), constraint=dist.constraints.positive)
        pyro.sample("net.weight", dist.Normal(pyro.param("w_loc", torch.zeros(1, 3)), scale).to_event(2))
        pyro.sample("net.bias", dist.Normal(pyro.param("b_loc", torch.zeros(1)), 0.1).to_event(1))

    for guide in (AutoDelta(bnn), AutoLaplaceApproximation(bnn), AutoGuideList(bnn), point_guide):
        if isinstance(guide, AutoGuideList):  # a point mass for one site, inside a list of guides
            guide.append(AutoDelta(pyro.poutine.block(bnn, expose=["net.bias"])))
            guide.append(AutoNormal(pyro.poutine.block(bnn, hide=["net.bias"])))
        guide(x, y)
        state = pyro.util.get_rng_state()
        with pytest.raises(ValueError, match=r"gives the sites \[.*'net.bias'.*\] a point mass"):
            evidence(bnn, guide, (x, y))
        assert torch.equal(pyro.util.get_rng_state()["torch"], state["torch"])
    assert math.isfinite(evidence(bnn, normal_guide, (x, y), num_draws=4).elbo)


def test_a_classifier_with_integer_labels_matches_pyro_bbbs_elbo_with_many_particles():
    g = torch.Generator().manual_seed(3)
    x, labels = torch.randn(60, 4, generator=g), torch.randint(0, 3, (60,), generator=g)
    pyro.clear_param_store()
    bnn = pyro_bbb.BNN(BayesianLinear(4, 3), likelihoods.Categorical())
    guide = MeanFieldGuide(bnn, init_scale=0.3)
    pyro_bbb.fit(bnn, guide, (x, labels), epochs=20, lr=1e-2, progress=False, seed=0)
    result = evidence(bnn, guide, (x, labels), num_draws=300)
    reference = -pyro_bbb.ELBO(num_data=60, num_particles=4000, vectorize_particles=True).loss(bnn, guide, x, labels)
    assert abs(result.elbo - reference) < 4 * result.standard_error + 0.05, (result, reference)


def test_compare_ranks_by_the_elbo_and_refuses_candidates_that_share_one_posterior():
    x, y = _orthogonal_design(n=64)
    x, y = x.float(), y.float()
    trained = {}
    with pyro.settings.context(module_local_params=True):
        for name, noise in {"noise 0.5 (the truth)": NOISE, "noise 3": 3.0}.items():
            bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=noise))
            guide = MeanFieldGuide(bnn)
            pyro_bbb.fit(bnn, guide, (x, y), epochs=100, lr=1e-2, progress=False, seed=0, kl_weight=1)
            trained[name] = (bnn, guide)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (one weight: nothing to say)
            ranked = compare_evidence(trained, (x, y), num_draws=50)
        assert list(ranked) == ["noise 0.5 (the truth)", "noise 3"]
        assert ranked["noise 0.5 (the truth)"].elbo > ranked["noise 3"].elbo + 10
        bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=NOISE))  # the truth, at weight 0.01
        guide = MeanFieldGuide(bnn)
        pyro_bbb.fit(bnn, guide, (x, y), epochs=5, lr=1e-2, progress=False, seed=0, kl_weight=0.01)
        with pytest.warns(UserWarning, match=r"different KL weights \('noise 0.5 \(the truth\)': 1, 'noise 3': 1, "
                                             r"'tempered': 0.01\).*kl_weight=1"):
            compare_evidence({**trained, "tempered": (bnn, guide)}, (x, y), num_draws=5)

    pyro.clear_param_store()
    shared = {}
    for name in ("a", "b"):
        bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=NOISE))
        guide = MeanFieldGuide(bnn)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AdoptedPosteriorWarning)  # b adopts a's posterior: what is refused below
            guide(x, y)
        shared[name] = (bnn, guide)
    with pytest.raises(ValueError, match="module_local_params=True"):
        compare_evidence(shared, (x, y))


def test_init_scale_prior_starts_every_weight_at_its_prior_width():
    pyro.clear_param_store()
    prior_by_layer = [priors.FanInNormal(), priors.EmpiricalBayesNormal(gain=2.0)]
    net = torch.nn.Sequential(BayesianLinear(16, 4, prior=prior_by_layer[0]), torch.nn.ReLU(),
                              BayesianLinear(4, 1, prior=prior_by_layer[1]))
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian())
    guide = MeanFieldGuide(bnn, init_scale="prior")
    guide(torch.randn(5, 16), torch.randn(5))
    q = guide.site_posteriors()
    assert torch.allclose(q["net.0.weight"].scale, torch.tensor(0.25))
    assert torch.allclose(q["net.2.bias"].scale, torch.tensor(1.0))  # the hyperprior's mode, 2 / sqrt(4)
    with pytest.raises(ValueError, match='a number > 0 or "prior"'):
        MeanFieldGuide(bnn, init_scale="wide")


def test_compare_evidence_leaves_the_callers_random_stream_alone():
    """A hand-written guide's parameters were found by a trace drawn from the caller's stream."""
    x, y = torch.randn(20, 3), torch.randn(20)
    pyro.clear_param_store()
    bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.5))

    def normal_guide(x, y):
        scale = pyro.param("s", torch.full((1, 3), 0.1), constraint=dist.constraints.positive)
        pyro.sample("net.weight", dist.Normal(pyro.param("w_loc", torch.zeros(1, 3)), scale).to_event(2))
        pyro.sample("net.bias", dist.Normal(pyro.param("b_loc", torch.zeros(1)), 0.1).to_event(1))

    normal_guide(x, y)
    state = torch.get_rng_state()
    compare_evidence({"m": (bnn, normal_guide)}, (x, y), num_draws=3)
    assert torch.equal(torch.get_rng_state(), state)
