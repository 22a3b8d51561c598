"""The KL arithmetic against torch's closed forms and Monte Carlo references, values and gradients."""


import math

import pyro.distributions as dist
import pytest
import torch
from pyro.infer import Trace_ELBO
from scipy import integrate, stats

from pyro_bbb import ELBO, priors
from pyro_bbb._kl import normal_kl_floor
from pyro_bbb.nn import BayesianLinear

from .helpers import guide_for


@pytest.mark.parametrize("prior_loc, prior_scale", [(0.0, 1.0), (0.3, 0.5)])
def test_fast_normal_kl_equals_torchs_closed_form_and_its_gradient(prior_loc, prior_scale):
    from pyro.distributions.kl import kl_divergence

    from pyro_bbb._kl import normal_kl_sum

    loc = torch.randn(4, 3, requires_grad=True)
    raw = torch.randn(4, 3, requires_grad=True)
    q = dist.Normal(loc, torch.nn.functional.softplus(raw)).to_event(2)
    p = dist.Normal(torch.tensor(prior_loc), torch.tensor(prior_scale)).expand((4, 3)).to_event(2)
    fast = normal_kl_sum(q.base_dist.loc, q.base_dist.scale, p)
    reference = kl_divergence(q, p)
    torch.testing.assert_close(fast, reference, rtol=1e-5, atol=1e-5)
    fast_grads = torch.autograd.grad(fast, (loc, raw), retain_graph=True)
    reference_grads = torch.autograd.grad(reference, (loc, raw))
    for a, b in zip(fast_grads, reference_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # a prior with a different scale per weight takes the general path
    varying = dist.Normal(torch.zeros(4, 3), torch.rand(4, 3) + 0.5).to_event(2)
    assert normal_kl_sum(q.base_dist.loc, q.base_dist.scale, varying) is None



def test_batched_normal_kls_equal_torchs_closed_form_per_site_and_its_gradients():
    """Every site's KL against its own N(0, t) from one batched computation: values and gradients as
    torch's kl_divergence gives them site by site; mixed dtypes take the per-site path with the same results."""
    from pyro.distributions.kl import kl_divergence

    from pyro_bbb._kl import batched_normal_kls

    torch.manual_seed(0)
    shapes, ts = [(5, 3), (5,), (1, 5), (1,)], [1.0, 0.5, 2.0, 0.1]
    for dtypes in ([torch.float64] * 4, [torch.float64, torch.float32, torch.float64, torch.float32]):
        locs = [torch.randn(s, dtype=d, requires_grad=True) for s, d in zip(shapes, dtypes)]
        raws = [torch.randn(s, dtype=d, requires_grad=True) for s, d in zip(shapes, dtypes)]
        scales = [torch.nn.functional.softplus(r) for r in raws]
        batched = batched_normal_kls(list(zip(locs, scales, ts)))
        reference = torch.stack([
            kl_divergence(dist.Normal(m, s), dist.Normal(torch.zeros_like(m), torch.full_like(m, t))).sum()
            for m, s, t in zip(locs, scales, ts)
        ]).to(batched.dtype)
        torch.testing.assert_close(batched, reference, rtol=1e-5, atol=1e-5)
        weights = torch.arange(1.0, 5.0, dtype=batched.dtype)  # a different weight per site: no cancellation
        grads = torch.autograd.grad((batched * weights).sum(), locs + raws, retain_graph=True)
        expected = torch.autograd.grad((reference * weights).sum(), locs + raws)
        for a, b in zip(grads, expected):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    with torch.inference_mode():  # the per-site constants made here are reused by later differentiable steps
        batched_normal_kls([(torch.zeros(2), torch.ones(2), 3.0)])
    loc = torch.zeros(2, requires_grad=True)
    batched_normal_kls([(loc, torch.ones(2), 3.0)]).sum().backward()
    assert loc.grad is not None


@pytest.mark.parametrize("prior", [priors.Normal(0.3, 0.7), priors.Laplace(0.0, 0.5)], ids=repr)
def test_closed_form_kl_equals_monte_carlo_reference(prior):
    """Prior-only model: our loss is the exact KL; Pyro's Trace_ELBO estimates it by sampling."""
    layer = BayesianLinear(3, 2, prior=prior)

    def model(x):
        layer(x)

    x = torch.randn(4, 3)
    guide = guide_for(model, x, init_scale=0.4)
    exact = ELBO().loss(model, guide, x)
    mc = Trace_ELBO(num_particles=2000, vectorize_particles=True, max_plate_nesting=1)
    estimates = torch.tensor([mc.loss(model, guide, x) for _ in range(30)])
    standard_error = estimates.std().item() / math.sqrt(len(estimates))
    assert abs(estimates.mean().item() - exact) < 4 * standard_error + 1e-6
    assert standard_error < 0.05 * abs(exact)  # the check has power


def test_scale_mixture_monte_carlo_kl_is_unbiased():
    prior = priors.ScaleMixtureNormal(pi=0.5, sigma1=1.0, sigma2=0.05)
    layer = BayesianLinear(2, 2, prior=prior)

    def model(x):
        layer(x)

    x = torch.randn(4, 2)
    guide = guide_for(model, x, init_scale=0.2)
    exact = sum(
        _kl_normal_to_mixture(m, s, prior.pi, prior.sigma1, prior.sigma2)
        for q in guide.site_posteriors().values()
        for m, s in zip(q.loc.flatten().tolist(), q.scale.flatten().tolist())
    )
    elbo = ELBO(num_particles=2000, vectorize_particles=True, max_plate_nesting=1)
    estimates = []
    for _ in range(20):
        elbo.loss(model, guide, x)
        estimates.append(elbo.last_terms["kl"])
    estimates = torch.tensor(estimates)
    standard_error = estimates.std().item() / math.sqrt(len(estimates))
    assert abs(estimates.mean().item() - exact) < 4 * standard_error + 1e-6
    assert standard_error < 0.05 * abs(exact)


def _kl_normal_to_mixture(mu, s, pi, s1, s2):
    def integrand(w):
        log_p = math.log(pi * stats.norm(0, s1).pdf(w) + (1 - pi) * stats.norm(0, s2).pdf(w))
        return stats.norm(mu, s).pdf(w) * (stats.norm(mu, s).logpdf(w) - log_p)

    return integrate.quad(integrand, mu - 12 * s, mu + 12 * s, points=[0.0], limit=200)[0]


@pytest.mark.parametrize("guide_class", ["AutoNormal", "AutoDiagonalNormal"])
def test_a_constrained_latent_under_pyros_autoguides_counts_its_jacobian_as_trace_elbo_does(guide_class):
    """AutoNormal and AutoDiagonalNormal put a Delta at each latent whose log_density is the Jacobian of the map to a
    constrained support; Pyro's registered KL(Delta, p) leaves it out (the posterior of a LogNormal scale the data
    ignore sat at e^-1 of the prior's median). The same draws give Trace_ELBO's loss and gradients."""
    import pyro
    from pyro.infer import autoguide

    def model(y):
        s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
        r = pyro.sample("r", dist.Gamma(2.0, 3.0))
        with pyro.plate("data", y.shape[0]):
            pyro.sample("y", dist.Normal(0.0, s + r), obs=y)

    pyro.clear_param_store()
    y = torch.randn(10)
    guide = getattr(autoguide, guide_class)(model)
    guide(y)
    for seed in range(3):
        losses, grads = [], []
        for elbo in (ELBO(num_data=10), Trace_ELBO()):
            pyro.set_rng_seed(seed)
            params = list(guide.parameters())
            loss = elbo.differentiable_loss(model, guide, y)
            losses.append(float(loss))
            grads.append(torch.autograd.grad(loss, params))
        assert losses[0] == pytest.approx(losses[1], rel=1e-5, abs=1e-5)
        for ours, pyros in zip(*grads):
            torch.testing.assert_close(ours, pyros, rtol=1e-5, atol=1e-5)


def test_an_empty_prior_has_no_constants_to_read():
    """A prior over no weights (an expanded Normal of shape (0, 3)) has no number to read: the closed forms' fast path
    stands aside (it raised IndexError) and the general one sums nothing."""
    from pyro_bbb._kl import constant_normal

    empty = dist.Normal(0.0, 0.5).expand([0, 3]).to_event(2)
    assert constant_normal(empty) is None
    assert constant_normal(dist.Normal(0.0, 0.5).expand([2, 3]).to_event(2)) == (0.0, 0.5)


def test_the_kl_floor_is_the_least_kl_a_normal_has_against_the_prior_by_quadrature_and_closed_form():
    """The default scale mixture: min over widths of KL(N(0, s) || p) by scipy's quadrature (the least of two local
    minima, at the slab's width and at the spike's); a Laplace: -log(2 pi e s^2)/2 + log 2 + s sqrt(2 / pi) at its
    least, s = sqrt(pi / 2); a Normal: 0."""
    prior = priors.ScaleMixtureNormal()

    def log_normal(w, s):
        return -0.5 * (w / s) ** 2 - math.log(s * math.sqrt(2 * math.pi))

    def kl(s):
        def integrand(w):
            a = math.log(prior.pi) + log_normal(w, prior.sigma1)
            b = math.log(1 - prior.pi) + log_normal(w, prior.sigma2)
            log_p = max(a, b) + math.log1p(math.exp(-abs(a - b)))
            return math.exp(log_normal(w, s)) * (log_normal(w, s) - log_p)

        return integrate.quad(integrand, -12 * s, 12 * s, points=[0.0], limit=200)[0]

    exact = min(kl(s) for s in torch.logspace(-4, 0.6, 400).tolist())
    assert 0.6 < exact < 0.7
    assert normal_kl_floor(prior.distribution((30, 20), fan_in=20)) == pytest.approx(exact, abs=0.01)
    assert normal_kl_floor(prior.distribution((3,), fan_in=20)) == pytest.approx(exact, abs=0.01)  # fewer weights
    s = math.sqrt(math.pi / 2)
    laplace = -0.5 * math.log(2 * math.pi * math.e * s**2) + math.log(2.0) + s * math.sqrt(2 / math.pi)
    assert normal_kl_floor(dist.Laplace(0.5, 1.0).expand([4, 4]).to_event(2)) == pytest.approx(laplace, abs=0.005)
    assert normal_kl_floor(dist.Normal(0.0, 2.0).expand([4])) == 0.0
    assert normal_kl_floor(dist.Laplace(torch.randn(4), 1.0)) == 0.0  # elements differ: the KL itself is read
