import math

import numpy as np
import pyro.distributions as dist
import pytest
import torch
from scipy import integrate, stats

from pyro_bbb import priors
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
