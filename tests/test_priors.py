import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from scipy import integrate, stats

import pyro_bbb
from pyro_bbb import priors
from pyro_bbb.guide import site_loc_scale
from pyro_bbb.nn import BayesianConv2d, BayesianLinear


@pytest.mark.parametrize(
    "prior",
    [priors.Normal(0.5, 2.0), priors.Laplace(0.0, 0.3), priors.ScaleMixtureNormal(), priors.FanInNormal(2.0)],
    ids=repr,
)
def test_prior_covers_whole_tensor(prior):
    d = prior.distribution((4, 3), fan_in=3)
    assert d.event_shape == (4, 3) and d.batch_shape == ()
    x = torch.randn(4, 3)
    assert d.log_prob(x).shape == ()


def test_normal_and_laplace_log_prob_match_scipy():
    x = torch.randn(5, 2, dtype=torch.float64)
    got = priors.Normal(0.5, 2.0).distribution((5, 2), 2, dtype=torch.float64).log_prob(x)
    assert got.item() == pytest.approx(stats.norm(0.5, 2.0).logpdf(x.numpy()).sum(), rel=1e-10)
    got = priors.Laplace(-0.2, 0.3).distribution((5, 2), 2, dtype=torch.float64).log_prob(x)
    assert got.item() == pytest.approx(stats.laplace(-0.2, 0.3).logpdf(x.numpy()).sum(), rel=1e-10)


def test_fan_in_normal_std_per_layer():
    linear = BayesianLinear(16, 4, prior=priors.FanInNormal(gain=2.0))
    assert torch.allclose(linear.prior_distribution("weight").base_dist.scale, torch.tensor(0.5))
    assert torch.allclose(linear.prior_distribution("bias").base_dist.scale, torch.tensor(0.5))
    conv = BayesianConv2d(6, 4, kernel_size=3, groups=2, prior=priors.FanInNormal())
    # fan_in = in_channels / groups * kh * kw = 3 * 9
    assert torch.allclose(conv.prior_distribution("weight").base_dist.scale, torch.tensor(1 / math.sqrt(27)))


def test_scale_mixture_log_prob_and_moments():
    pi, s1, s2 = 0.3, 1.0, 0.05
    d = priors.ScaleMixtureNormal(pi, s1, s2).distribution((200_000,), fan_in=1, dtype=torch.float64)
    x = torch.linspace(-3, 3, 7, dtype=torch.float64)
    expected = np.log(pi * stats.norm(0, s1).pdf(x) + (1 - pi) * stats.norm(0, s2).pdf(x))
    small = priors.ScaleMixtureNormal(pi, s1, s2).distribution((7,), fan_in=1, dtype=torch.float64)
    assert small.log_prob(x).item() == pytest.approx(expected.sum(), rel=1e-10)
    draws = d.sample()
    var = pi * s1**2 + (1 - pi) * s2**2
    # sample variance of 200k draws: relative standard error ~ sqrt(2/n * kurtosis-ish) < 1%
    assert draws.var().item() == pytest.approx(var, rel=0.03)
    assert draws.mean().abs().item() < 4 * math.sqrt(var / 200_000)


@pytest.mark.parametrize(
    "make, arg",
    [
        (lambda: priors.Normal(scale=0.0), "scale"),
        (lambda: priors.Normal(scale=-1.0), "scale"),
        (lambda: priors.Normal(loc=float("inf")), "loc"),
        (lambda: priors.Laplace(scale=0.0), "scale"),
        (lambda: priors.ScaleMixtureNormal(pi=0.0), "pi"),
        (lambda: priors.ScaleMixtureNormal(pi=1.0), "pi"),
        (lambda: priors.ScaleMixtureNormal(sigma1=-1.0), "sigma1"),
        (lambda: priors.ScaleMixtureNormal(sigma2=0.0), "sigma2"),
        (lambda: priors.FanInNormal(gain=0.0), "gain"),
    ],
)
def test_invalid_hyperparameters_name_the_argument(make, arg):
    with pytest.raises(ValueError, match=f"`{arg}`"):
        make()


def test_plain_distribution_is_accepted():
    layer = BayesianLinear(3, 2, prior=dist.StudentT(3.0, 0.0, 1.0))
    d = layer.prior_distribution("weight")
    assert d.event_shape == (2, 3)
    assert "StudentT" in repr(layer)
    shaped = priors.as_prior(dist.Normal(torch.zeros(2, 3), 1.0))
    assert shaped.distribution((2, 3), 3).event_shape == (2, 3)
    with pytest.raises(ValueError, match="does not fit a parameter of shape"):
        shaped.distribution((2,), 3)


def test_bad_priors_are_rejected():
    with pytest.raises(ValueError, match="real support"):
        BayesianLinear(3, 2, prior=dist.Gamma(1.0, 1.0))
    with pytest.raises(TypeError, match="prior must be"):
        BayesianLinear(3, 2, prior="normal")


@pytest.mark.parametrize("mu, s, m, b", [(0.3, 0.2, 0.0, 1.0), (-1.0, 0.05, 0.5, 0.1), (0.0, 2.0, 0.0, 0.5)])
def test_normal_to_laplace_kl_is_exact(mu, s, m, b):
    """The closed-form KL used for Laplace priors agrees with numerical integration."""
    q = dist.Normal(torch.tensor(mu, dtype=torch.float64), torch.tensor(s, dtype=torch.float64))
    p = priors.Laplace(m, b).distribution((), 1, dtype=torch.float64)
    closed = torch.distributions.kl_divergence(q, p).item()

    def integrand(w):
        return stats.norm(mu, s).pdf(w) * (stats.norm(mu, s).logpdf(w) - stats.laplace(m, b).logpdf(w))

    numeric, _ = integrate.quad(integrand, mu - 12 * s, mu + 12 * s, points=[m], limit=200)
    assert closed == pytest.approx(numeric, rel=1e-6, abs=1e-9)


# -- empirical Bayes: LearnedNormal ------------------------------------------------------------------------------
def _regression(n=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    y = x @ torch.tensor([0.4, -0.3, 0.2]) + 0.1 * torch.randn(n, generator=g)
    return x, y


def _learned_bnn(prior=None, hidden=16):
    prior = prior or priors.LearnedNormal()
    net = torch.nn.Sequential(BayesianLinear(3, hidden, prior=prior), torch.nn.ReLU(),
                              BayesianLinear(hidden, 1, prior=prior))  # fmt: skip
    return pyro_bbb.BNN(net, pyro_bbb.likelihoods.Gaussian(scale=0.1))


def test_learned_normal_is_a_parameter_of_the_layer():
    layer = BayesianLinear(3, 2, prior=priors.LearnedNormal(init_scale=0.5, per="unit"))
    assert layer.weight_prior_scale.shape == (2, 1) and layer.bias_prior_scale.shape == (2,)
    assert torch.allclose(layer.weight_prior_scale, torch.tensor(0.5))
    assert {"weight_prior_scale_unconstrained", "bias_prior_scale_unconstrained"} <= dict(
        layer.named_parameters()).keys()  # fmt: skip
    d = layer.prior_distribution("weight")
    assert d.event_shape == (2, 3) and d.base_dist.scale.requires_grad
    layer.double()
    assert layer.prior_distribution("weight").base_dist.scale.dtype == torch.float64
    assert "LearnedNormal(init_scale=0.5, per='unit', min_scale=0.001)" in repr(layer)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"init_scale": 0.0}, "init_scale"), ({"per": "layer"}, "per"), ({"min_scale": -1.0}, "min_scale"),
     ({"init_scale": 0.01, "min_scale": 0.1}, "below")],  # fmt: skip
)
def test_learned_normal_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        priors.LearnedNormal(**kwargs)


@pytest.mark.parametrize("per", ["tensor", "unit"])
def test_learned_prior_kl_and_its_gradient_are_exact(per):
    """The ELBO's KL at a learned scale s is sum log(s/sigma) + (sigma^2 + mu^2)/(2 s^2) - 1/2, and its gradient
    reaches s: d/du with s = min + exp(u) is (s - min) * sum(1/s - (sigma^2 + mu^2)/s^3)."""
    pyro.clear_param_store()
    x, y = _regression()
    model = _learned_bnn(priors.LearnedNormal(init_scale=0.3, min_scale=0.01, per=per))
    guide = pyro_bbb.MeanFieldGuide(model, init_scale=0.05)
    elbo = pyro_bbb.ELBO(num_data=len(x))
    elbo.differentiable_loss(model, guide, x, y)
    layer = model.net[0]
    kl = elbo.last_terms["kl_by_site"]["net.0.weight"]
    mu, sigma = (t.detach().double() for t in site_loc_scale(guide, "net.0.weight"))
    s = 0.3
    expected = (math.log(s) - sigma.log() + (sigma**2 + mu**2) / (2 * s * s) - 0.5).sum()
    assert float(kl) == pytest.approx(float(expected), rel=1e-5)
    # gradient of the loss (only the KL depends on the prior scale)
    loss = elbo.differentiable_loss(model, guide, x, y)
    (grad,) = torch.autograd.grad(loss, [layer.weight_prior_scale_unconstrained])
    expected_grad = (s - 0.01) * (1 / s - (sigma**2 + mu**2) / s**3)
    expected_grad = expected_grad.sum() if per == "tensor" else expected_grad.sum(1, keepdim=True)
    assert torch.allclose(grad.double(), expected_grad, rtol=1e-4, atol=1e-6)


def test_fit_learns_the_closed_form_optimum_and_reports_it():
    """Trained jointly with the posterior, each scale ends at argmax_s ELBO = sqrt(mean(mu^2 + sigma^2)) of the
    weights that share it (to 3%); History and summary show the learned scale."""
    pyro.clear_param_store()
    x, y = _regression(500)
    model = _learned_bnn()
    guide = pyro_bbb.MeanFieldGuide(model)
    history = pyro_bbb.fit(model, guide, (x, y), epochs=300, batch_size=100, lr=1e-2, progress=False, seed=0)
    for site, layer, attr in [("net.0.weight", model.net[0], "weight"), ("net.2.weight", model.net[2], "weight")]:
        mu, sigma = (t.detach() for t in site_loc_scale(guide, site))
        optimum = float((mu**2 + sigma**2).mean().sqrt())
        learned = float(getattr(layer, f"{attr}_prior_scale").detach())
        assert learned == pytest.approx(optimum, rel=0.03)
        assert learned < 0.5  # moved far from its initial 1.0
    first, last = history["prior_std"]["net.0"][0], history.last["prior_std"]["net.0"]
    assert last < 0.5 and first > last
    table = pyro_bbb.summary(model, guide)
    assert table.loc["net.0", "prior_sigma"] == pytest.approx(history.last["prior_std"]["net.0"], rel=1e-6)


def test_learned_prior_trains_with_pyros_own_svi_and_guide():
    """Plain Pyro: AutoNormal, Trace_ELBO (a Monte Carlo KL), pyro.optim.Adam -- the scale is a pyro.param of the
    model and moves towards the optimum."""
    pyro.clear_param_store()
    x, y = _regression()
    model = _learned_bnn()
    guide = AutoNormal(model, init_scale=0.05)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.02}), Trace_ELBO())
    pyro.set_rng_seed(0)
    for _ in range(300):
        svi.step(x, y)
    assert "net.0.weight_prior_scale" in pyro.get_param_store()
    assert float(model.net[0].weight_prior_scale.detach()) < 0.6


def test_learned_prior_round_trips_through_save_and_bayesianize(tmp_path):
    pyro.clear_param_store()
    net = pyro_bbb.bayesianize(torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)),
                               prior=priors.LearnedNormal(init_scale=0.4))  # fmt: skip
    model = pyro_bbb.BNN(net, pyro_bbb.likelihoods.Gaussian(scale=0.1))
    guide = pyro_bbb.MeanFieldGuide(model)
    x, y = _regression()
    pyro_bbb.fit(model, guide, (x, y), epochs=5, batch_size=50, lr=1e-2, progress=False, seed=0)
    learned = float(net[0].weight_prior_scale.detach())
    assert learned != pytest.approx(0.4)
    pyro_bbb.save(tmp_path / "m.pt", model, guide)
    pyro.clear_param_store()
    net2 = pyro_bbb.bayesianize(torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)),
                                prior=priors.LearnedNormal(init_scale=0.4))  # fmt: skip
    model2 = pyro_bbb.BNN(net2, pyro_bbb.likelihoods.Gaussian(scale=0.1))
    guide2 = pyro_bbb.MeanFieldGuide(model2)
    pyro_bbb.load(tmp_path / "m.pt", model2, guide2)
    assert float(net2[0].weight_prior_scale.detach()) == pytest.approx(learned, rel=1e-6)
