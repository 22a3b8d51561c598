"""The ELBO against ground truth: closed-form posteriors, hand-computed losses, Pyro's own reference ELBOs."""

import math

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from scipy import integrate, stats

from pyro_bbb import ELBO, MeanFieldGuide, priors
from pyro_bbb.infer.schedules import LinearWarmup
from pyro_bbb.nn import BayesianLinear

from ..helpers import MLP, Regression, regression_data


def guide_for(model, *args, **kwargs):
    guide = MeanFieldGuide(model, **kwargs)
    guide(*args)
    return guide


def minibatches(n, batch_size, generator):
    perm = torch.randperm(n, generator=generator)
    return [perm[i : i + batch_size] for i in range(0, n, batch_size)]


# ---------------------------------------------------------------------------------------------------------------
# 1. Bayesian linear regression: the optimal mean-field Gaussian is known in closed form
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("batch_size, steps, particles", [(32, 8000, 4), (100, 3000, 8)], ids=["minibatch", "full"])
def test_recovers_closed_form_mean_field_posterior(batch_size, steps, particles):
    N, D, sigma, alpha = 100, 3, 0.5, 2.0
    x, y = regression_data(N, D, sigma)
    # exact Gaussian posterior of (w, b): precision Lambda = alpha I + Phi'Phi / sigma^2; the optimal mean-field
    # Gaussian has the exact posterior mean and variances 1 / Lambda_ii.
    phi = torch.cat([x, torch.ones(N, 1)], 1).double()
    precision = alpha * torch.eye(D + 1, dtype=torch.double) + phi.T @ phi / sigma**2
    exact_mean = torch.linalg.solve(precision, phi.T @ y.double() / sigma**2)
    exact_std = precision.diagonal().rsqrt()

    model = Regression(D, prior=priors.Normal(0.0, alpha**-0.5), sigma=sigma)
    guide = MeanFieldGuide(model)
    # plain Adam (no gradient clipping) with a decaying learning rate reaches the optimum
    lr0, lr1 = 0.02 if batch_size < N else 0.05, 1e-5
    optim = pyro.optim.ClippedAdam({"lr": lr0, "lrd": (lr1 / lr0) ** (1 / steps), "clip_norm": 1e12})
    elbo = ELBO(num_data=N, num_particles=particles, vectorize_particles=True)
    svi = SVI(model, guide, optim, elbo)
    g = torch.Generator().manual_seed(1)
    step = 0
    seen_partial = False
    while step < steps:
        for idx in minibatches(N, batch_size, g):
            svi.step(x[idx], y[idx])
            seen_partial |= elbo.last_terms["batch_size"] == N % batch_size
            step += 1
    assert seen_partial or batch_size == N

    q = guide.site_posteriors()
    mean = torch.cat([q["fc.weight"].loc.flatten(), q["fc.bias"].loc]).double()
    std = torch.cat([q["fc.weight"].scale.flatten(), q["fc.bias"].scale]).double()
    assert torch.all((std / exact_std - 1).abs() < 0.05), (std / exact_std).tolist()
    assert torch.all(((mean - exact_mean) / exact_std).abs() < 0.1), ((mean - exact_mean) / exact_std).tolist()


# ---------------------------------------------------------------------------------------------------------------
# 2. For a fixed guide draw the loss is -(N/B sum log p(y|x,w) - KL), KL = sum of exact KLs
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [32, 4], ids=["full-minibatch", "partial-last-batch"])
def test_loss_equals_hand_computation(batch):
    N = 100
    x, y = regression_data(N)
    x, y = x[:batch], y[:batch]
    model = Regression(prior=priors.Normal(0.0, 0.7), sigma=0.5)
    guide = guide_for(model, x, y, init_scale=0.2)
    elbo = ELBO(num_data=N, kl_weight=1.0)

    pyro.set_rng_seed(5)
    loss = elbo.loss(model, guide, x, y)
    pyro.set_rng_seed(5)
    draw = poutine.trace(guide).get_trace(x, y)
    w, b = draw.nodes["fc.weight"]["value"], draw.nodes["fc.bias"]["value"]
    log_lik = torch.distributions.Normal(x @ w.T.squeeze(-1) + b, 0.5).log_prob(y).sum()
    kl_by_site = {name: torch.distributions.kl_divergence(q, torch.distributions.Normal(0.0, 0.7)).sum().item()
                  for name, q in guide.site_posteriors().items()}  # fmt: skip
    kl = sum(kl_by_site.values())
    expected = -(N / batch * log_lik.item() - kl)
    assert loss == pytest.approx(expected, rel=1e-5)

    terms = elbo.last_terms
    assert terms["kl"] == pytest.approx(kl, rel=1e-5)
    assert terms["kl_by_site"] == pytest.approx(kl_by_site, rel=1e-5)
    assert terms["nll"] == pytest.approx(-N / batch * log_lik.item(), rel=1e-5)
    assert terms["loss"] == pytest.approx(loss)
    assert terms["loss_per_datum"] == pytest.approx(loss / N)
    assert (terms["num_data"], terms["batch_size"], terms["kl_weight"]) == (N, batch, 1.0)


def test_without_num_data_nothing_is_scaled():
    x, y = regression_data(20)
    model = Regression()
    guide = guide_for(model, x, y)
    pyro.set_rng_seed(2)
    ours = ELBO().loss(model, guide, x, y)
    pyro.set_rng_seed(2)
    reference = TraceMeanField_ELBO().loss(model, guide, x, y)
    assert ours == pytest.approx(reference, rel=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# 3. Declared subsampling, Pyro's reference ELBO, and every error
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


def test_disagreeing_num_data_is_an_error():
    x, y = regression_data(100)
    model = Regression(num_data=100)
    idx = torch.arange(10)
    guide = guide_for(model, x[idx], y[idx], idx)
    with pytest.raises(ValueError, match=r"num_data=50 disagrees with pyro.plate\('data', size=100"):
        ELBO(num_data=50).loss(model, guide, x[idx], y[idx], idx=idx)


def test_observed_site_outside_the_data_plate_is_an_error_with_a_fix():
    layer = BayesianLinear(3, 1)

    def model(x, y):
        pyro.sample("y", dist.Normal(layer(x).squeeze(-1), 1.0).to_event(1), obs=y)

    x, y = regression_data(10)
    guide = guide_for(model, x, y)
    with pytest.raises(ValueError, match=r"'y' is not inside pyro.plate\('data', \.\.\.\).*with pyro.plate"):
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


def test_invalid_kl_weight():
    with pytest.raises(ValueError, match="`kl_weight`"):
        ELBO(kl_weight="warmup")
    with pytest.raises(ValueError, match=r"`weight` must be a finite number >= 0"):
        ELBO(kl_weight=-1.0)
    elbo = ELBO(kl_weight=lambda step: -0.5)
    with pytest.raises(ValueError, match="returned -0.5 at step 0"):
        elbo.current_kl_weight()


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


# ---------------------------------------------------------------------------------------------------------------
# 4. Closed-form and Monte Carlo KL agree in expectation; ScaleMixtureNormal trains
# ---------------------------------------------------------------------------------------------------------------
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


def _kl_normal_to_mixture(mu, s, pi, s1, s2):
    def integrand(w):
        log_p = math.log(pi * stats.norm(0, s1).pdf(w) + (1 - pi) * stats.norm(0, s2).pdf(w))
        return stats.norm(mu, s).pdf(w) * (stats.norm(mu, s).logpdf(w) - log_p)

    return integrate.quad(integrand, mu - 12 * s, mu + 12 * s, points=[0.0], limit=200)[0]


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


@pytest.mark.slow
def test_scale_mixture_prior_trains():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(128, 2, generator=g) * 4 - 2
    y = torch.sin(x[:, 0]) + 0.5 * x[:, 1] + 0.1 * torch.randn(128, generator=g)
    model = MLP(hidden=16, prior=priors.ScaleMixtureNormal())
    guide = MeanFieldGuide(model)
    elbo = ELBO(num_data=128)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.02}), elbo)
    losses = [svi.step(x, y) for _ in range(1500)]
    assert sum(losses[-100:]) < 0.3 * sum(losses[:100])
    with torch.no_grad():
        mean = torch.stack([_net(model, guide, x) for _ in range(20)])
    rmse = (mean.mean(0) - y).pow(2).mean().sqrt().item()
    assert rmse < 0.2, rmse  # noise 0.1; a net that ignored the data would sit near std(y) ~ 1.1


def _net(model, guide, x):
    """The network's output under one posterior draw."""
    return poutine.replay(lambda: model.fc2(model.act(model.fc1(x))).squeeze(-1), poutine.trace(guide).get_trace(x))()


# ---------------------------------------------------------------------------------------------------------------
# 5. A KL-weight schedule changes the KL term and nothing else
# ---------------------------------------------------------------------------------------------------------------
def test_kl_weight_scales_only_the_kl_term():
    x, y = regression_data(40)
    model = Regression()
    guide = guide_for(model, x, y, init_scale=0.2)
    results = {}
    for weight in (0.0, 0.5, 1.0):
        elbo = ELBO(num_data=200, kl_weight=weight)
        pyro.set_rng_seed(9)
        loss = elbo.differentiable_loss(model, guide, x, y)
        params = [p for _, p in sorted(pyro.get_param_store().named_parameters())]
        grads = torch.autograd.grad(loss, params)
        results[weight] = (loss.item(), dict(elbo.last_terms), torch.cat([g.flatten() for g in grads]))
    nll, kl = results[0.0][1]["nll"], results[0.0][1]["kl"]
    assert kl > 1.0
    for weight, (loss, terms, _) in results.items():
        assert terms["nll"] == pytest.approx(nll) and terms["kl"] == pytest.approx(kl)
        assert loss == pytest.approx(nll + weight * kl, rel=1e-6)
        assert terms["kl_weight"] == weight
    # gradients are linear in the weight: d(nll)/dtheta + w d(KL)/dtheta
    assert torch.allclose(results[0.5][2], (results[0.0][2] + results[1.0][2]) / 2, atol=1e-4)
    assert not torch.allclose(results[0.0][2], results[1.0][2])


def test_schedule_steps_once_per_loss_and_grads():
    x, y = regression_data(20)
    model = Regression()
    guide = guide_for(model, x, y)
    elbo = ELBO(num_data=20, kl_weight=LinearWarmup(4))
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), elbo)
    weights = []
    for _ in range(6):
        svi.step(x, y)
        weights.append(elbo.last_terms["kl_weight"])
    assert weights == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    svi.evaluate_loss(x, y)
    assert elbo.step == 6 and elbo.last_terms["kl_weight"] == 1.0


# ---------------------------------------------------------------------------------------------------------------
# 6. Vectorized particles: the same expected loss as the sequential loop
# ---------------------------------------------------------------------------------------------------------------
def test_vectorized_particles_match_sequential_in_expectation():
    x, y = regression_data(30)
    model = MLP(in_features=3)
    guide = guide_for(model, x, y, init_scale=0.3)
    sequential = ELBO(num_data=300, num_particles=5)
    vectorized = ELBO(num_data=300, num_particles=5, vectorize_particles=True)
    draws = {"sequential": [], "vectorized": []}
    for _ in range(200):
        draws["sequential"].append(sequential.loss(model, guide, x, y))
        draws["vectorized"].append(vectorized.loss(model, guide, x, y))
    seq, vec = torch.tensor(draws["sequential"]), torch.tensor(draws["vectorized"])
    standard_error = math.sqrt(seq.var() / len(seq) + vec.var() / len(vec))
    assert abs(seq.mean() - vec.mean()) < 4 * standard_error
    assert vec.std() > 0  # the draws vary: a test with power
    assert vectorized.last_terms["kl_by_site"].keys() == sequential.last_terms["kl_by_site"].keys()


@pytest.mark.parametrize("prior_loc, prior_scale", [(0.0, 1.0), (0.3, 0.5)])
def test_fast_normal_kl_equals_torchs_closed_form_and_its_gradient(prior_loc, prior_scale):
    from pyro.distributions.kl import kl_divergence

    from pyro_bbb.infer.kl import normal_kl_sum

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

    from pyro_bbb.infer.elbo import batched_normal_kls

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
        ]).to(batched.dtype)  # fmt: skip
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

# -- the KL reaches every prior parameter --------------------------------------------------------
def _grads_of(elbo, model, guide, x, y, seed=0):
    pyro.set_rng_seed(seed)
    loss = elbo.loss_and_grads(model, guide, x, y)
    store = pyro.get_param_store()
    grads = {name: p.grad.clone() for name, p in store.named_parameters()}
    for _, p in store.named_parameters():
        p.grad = None
    return loss, grads


def _assert_same_gradients_as_pyro(model, x, y):
    guide = MeanFieldGuide(model, init_scale=0.2)
    guide(x, y)
    ours = _grads_of(ELBO(num_data=len(x)), model, guide, x, y)
    reference = _grads_of(TraceMeanField_ELBO(), model, guide, x, y)
    assert ours[0] == pytest.approx(reference[0], rel=1e-5)
    assert ours[1].keys() == reference[1].keys()
    for name, grad in reference[1].items():
        torch.testing.assert_close(ours[1][name], grad, rtol=1e-4, atol=1e-5, msg=name)
    return ours[1]


def _data(n=12):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, generator=g), torch.randn(n, generator=g)


def test_learned_prior_scale_gets_pyros_gradient():
    def model(x, y=None):
        prior_sd = pyro.param("prior_sd", torch.tensor(1.5), constraint=dist.constraints.positive)
        w = pyro.sample("w", dist.Normal(0.0, prior_sd).expand([3]).to_event(1))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(x @ w, 0.5), obs=y)

    grads = _assert_same_gradients_as_pyro(model, *_data())
    assert grads["prior_sd"].abs() > 1e-3  # not the zero gradient of a prior frozen into Python floats


def test_learned_prior_loc_gets_pyros_gradient():
    def model(x, y=None):
        prior_loc = pyro.param("prior_loc", torch.tensor(0.7))
        w = pyro.sample("w", dist.Normal(prior_loc, 1.0).expand([3]).to_event(1))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(x @ w, 0.5), obs=y)

    grads = _assert_same_gradients_as_pyro(model, *_data())
    assert grads["prior_loc"].abs() > 1e-3


def test_centred_hierarchical_prior_gets_pyros_gradient():
    def model(x, y=None):
        tau = pyro.sample("tau", dist.LogNormal(0.0, 1.0))
        w = pyro.sample("w", dist.Normal(0.0, tau).expand([3]).to_event(1))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(x @ w, 0.5), obs=y)

    _assert_same_gradients_as_pyro(model, *_data())


def test_a_mutated_prior_is_not_served_from_a_stale_cache():
    prior = priors.Normal(0.0, 1.0)
    model = Regression(prior=prior)
    x, y = _data()
    guide = MeanFieldGuide(model, init_scale=0.2)
    elbo = ELBO(num_data=len(x))
    for scale in (1.0, 0.3, 2.0):
        prior.scale = scale  # a custom prior whose parameters change between steps
        elbo.loss(model, guide, x, y)
        q = guide.site_posteriors()
        expected = sum(
            float(torch.distributions.kl_divergence(q[name], dist.Normal(0.0, scale)).sum())
            for name in ("fc.weight", "fc.bias")
        )
        assert elbo.last_terms["kl"] == pytest.approx(expected, rel=1e-5)


def test_a_prior_tensor_changed_in_place_is_read_again():
    scale = torch.tensor(1.0)
    model = Regression(prior=dist.Normal(0.0, scale))
    x, y = _data()
    guide = MeanFieldGuide(model, init_scale=0.2)
    elbo = ELBO(num_data=len(x))
    elbo.loss(model, guide, x, y)
    scale.fill_(0.25)
    elbo.loss(model, guide, x, y)
    q = guide.site_posteriors()
    expected = sum(float(torch.distributions.kl_divergence(q[n], dist.Normal(0.0, 0.25)).sum())
                   for n in ("fc.weight", "fc.bias"))  # fmt: skip
    assert elbo.last_terms["kl"] == pytest.approx(expected, rel=1e-5)


# -- the replayed step -------------------------------------------------------------------------------------
def _replay_run(build, replay, steps=6, handler=None, kl_weight=1.0, data=None, **elbo_options):
    """Train ``build()`` -> (model, guide, x, y) for ``steps`` SVI steps; the losses, the final parameters, the ELBO
    and which steps were replayed."""
    import contextlib

    import pyro_bbb

    pyro.clear_param_store()
    torch.manual_seed(0)
    model, guide, x, y = build()
    elbo = ELBO(num_data=200, kl_weight=kl_weight, replay=replay, **elbo_options)
    svi = SVI(model, guide, pyro_bbb.optim.Adam(lr=1e-2), elbo)
    losses, replayed = [], []
    for _ in range(steps):
        with handler() if handler else contextlib.nullcontext():
            losses.append(svi.step(x, y))
        replayed.append(elbo.last_step_replayed)
    params = {name: p.detach().clone() for name, p in pyro.get_param_store().named_parameters()}
    return losses, params, elbo, replayed


def _regression_bnn():
    import pyro_bbb
    from pyro_bbb import likelihoods

    net = torch.nn.Sequential(BayesianLinear(3, 8), torch.nn.ReLU(), BayesianLinear(8, 1))
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian())  # a learned noise scale: a latent site with a Monte Carlo KL
    g = torch.Generator().manual_seed(1)
    return bnn, MeanFieldGuide(bnn, init_scale=0.1), torch.randn(20, 3, generator=g), torch.randn(20, 1, generator=g)


def _classifier_with_a_deterministic_layer():
    import pyro_bbb
    from pyro_bbb import likelihoods

    net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), BayesianLinear(6, 3, prior=priors.Normal(0.2, 2)))
    bnn = pyro_bbb.BNN(net, likelihoods.Categorical())
    g = torch.Generator().manual_seed(2)
    return bnn, MeanFieldGuide(bnn, init_scale=0.05), torch.randn(30, 4, generator=g), torch.randint(0, 3, (30,),
                                                                                                      generator=g)


def _regression_bnn_with_other_priors():
    """Priors without a Normal-Normal closed form of constant parameters: empirical Bayes (its scale computed from
    the posterior), a Laplace (closed-form KL to a Normal) and a scale mixture (Monte Carlo KL at the draw)."""
    import pyro_bbb
    from pyro_bbb import likelihoods

    net = torch.nn.Sequential(BayesianLinear(3, 8, prior=priors.EmpiricalBayesNormal()), torch.nn.ReLU(),
                              BayesianLinear(8, 8, prior=priors.Laplace(0.0, 0.5)), torch.nn.ReLU(),
                              BayesianLinear(8, 1, prior=priors.ScaleMixtureNormal()))  # fmt: skip
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian())
    g = torch.Generator().manual_seed(3)
    return bnn, MeanFieldGuide(bnn, init_scale=0.1), torch.randn(20, 3, generator=g), torch.randn(20, 1, generator=g)


@pytest.mark.parametrize("build", [_regression_bnn, _classifier_with_a_deterministic_layer,
                                   _regression_bnn_with_other_priors],
                         ids=["regression", "classifier", "other-priors"])  # fmt: skip
@pytest.mark.parametrize("kl_weight", [1.0, LinearWarmup(4)], ids=["kl", "warmup"])
def test_replayed_steps_equal_the_full_pyro_path_bit_for_bit(build, kl_weight):
    """Same draws, losses, KL terms and parameters after every step as Pyro's handlers compute them -- including a
    deterministic layer's weights (point estimates), which the replayed step must also hand to the optimizer, and a
    learned noise scale (a constrained latent site whose KL is the Monte Carlo log q - log p)."""
    fast = _replay_run(build, True, kl_weight=kl_weight)
    full = _replay_run(build, False, kl_weight=kl_weight)
    assert fast[3] == [False] + [True] * 5 and not any(full[3])  # the first call (validated) runs in full
    assert fast[0] == full[0]
    assert fast[2].last_terms == full[2].last_terms
    assert fast[1].keys() == full[1].keys() and len(fast[1]) > 4
    for name in fast[1]:
        assert torch.equal(fast[1][name], full[1][name]), name



@pytest.mark.parametrize("estimator", [None, "flipout", "local_reparameterization"])
def test_vectorized_particles_run_the_full_path_with_or_without_replay(estimator):
    """Several particles (vectorized) are not replayed: the step is Pyro's full path whether ``replay`` is on or off,
    with the same numbers -- the batched KL included, which there sees a particle dimension on every posterior."""
    import pyro_bbb

    handler = getattr(pyro_bbb, estimator) if estimator else None
    runs = [_replay_run(_classifier_with_a_deterministic_layer, replay, steps=4, handler=handler,
                        kl_weight=LinearWarmup(3), num_particles=3, vectorize_particles=True)
            for replay in (True, False)]  # fmt: skip
    (fast_losses, fast_params, fast_elbo, fast_replayed), (losses, params, elbo, _) = runs
    assert not any(fast_replayed) and fast_losses == losses and fast_elbo.last_terms == elbo.last_terms
    assert all(torch.equal(fast_params[name], params[name]) for name in params)
    assert fast_elbo.last_terms["kl"] > 0 and len(set(fast_losses)) == 4

def test_replay_equals_the_full_path_through_fit_history_included(monkeypatch):
    import functools

    import pyro_bbb
    from pyro_bbb.train import loop as training

    histories = []
    for replay in (True, False):
        monkeypatch.setattr(training, "ELBO", functools.partial(ELBO, replay=replay))
        pyro.clear_param_store()
        torch.manual_seed(0)
        model, guide, x, y = _classifier_with_a_deterministic_layer()
        histories.append(pyro_bbb.fit(model, guide, (x, y), epochs=4, batch_size=8, seed=3, progress=False,
                                      validation_data=(x, y)))  # fmt: skip
    for fast, full in zip(histories[0].records, histories[1].records, strict=True):
        assert {k: v for k, v in fast.items() if k != "seconds"} == {k: v for k, v in full.items() if k != "seconds"}


@pytest.mark.parametrize("estimator", ["flipout", "local_reparameterization"])
@pytest.mark.parametrize("build", [_regression_bnn, _classifier_with_a_deterministic_layer,
                                   _regression_bnn_with_other_priors],
                         ids=["regression", "classifier", "other-priors"])  # fmt: skip
def test_replay_under_flipout_and_local_reparameterization_equals_the_full_path(estimator, build):
    """The estimators' handlers stay active in a replayed step, told each weight's posterior as the guide's draw
    would tell them: same signs and noise in the same order, same numbers (with a KL warm-up)."""
    import pyro_bbb

    handler = getattr(pyro_bbb, estimator)
    fast = _replay_run(build, True, handler=handler, kl_weight=LinearWarmup(3))
    full = _replay_run(build, False, handler=handler, kl_weight=LinearWarmup(3))
    assert fast[3] == [False] + [True] * 5 and fast[0] == full[0]
    for name in fast[1]:
        assert torch.equal(fast[1][name], full[1][name]), name


def test_other_handlers_run_the_full_path_and_give_its_numbers():
    import contextlib

    import pyro_bbb

    @contextlib.contextmanager
    def two_estimators():
        with pyro_bbb.flipout(), pyro_bbb.local_reparameterization():
            yield

    for handler in (poutine.block, two_estimators):
        fast = _replay_run(_regression_bnn, True, handler=handler)
        full = _replay_run(_regression_bnn, False, handler=handler)
        assert not any(fast[3]) and fast[0] == full[0]


def test_a_model_whose_sites_change_falls_back_to_the_full_path():
    """A net that reads a layer only on wide batches, and one that emits a new sample site on some calls: the replayed
    step notices (an unread or a new site) and the step runs through Pyro's handlers, with that call's sites."""
    import pyro_bbb
    from pyro_bbb import likelihoods

    class Sometimes(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = BayesianLinear(2, 1), BayesianLinear(2, 1)

        def forward(self, x):
            return self.a(x) + (self.b(x) if x.shape[0] > 4 else 0.0)

    class Extra(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = BayesianLinear(2, 1)

        def forward(self, x):
            out = self.a(x)
            if x.shape[0] <= 4:
                out = out + pyro.sample("shift", dist.Normal(0.0, 1.0))
            return out

    for net, sites in ((Sometimes(), {"net.a.weight", "net.a.bias"}), (Extra(), {"net.a.weight", "net.a.bias"})):
        pyro.clear_param_store()
        bnn = pyro_bbb.BNN(net, likelihoods.Gaussian(1.0))
        guide = MeanFieldGuide(bnn)
        elbo = ELBO(num_data=50)
        svi = SVI(bnn, guide, pyro_bbb.optim.Adam(lr=1e-2), elbo)
        wide, narrow = torch.randn(8, 2), torch.randn(3, 2)
        for _ in range(2):
            svi.step(wide, torch.randn(8))
        assert elbo.last_step_replayed
        if isinstance(net, Extra):
            with pytest.raises(ValueError, match="'shift' has no posterior in the guide"):  # not a silent prior draw
                svi.step(narrow, torch.randn(3))
            continue
        loss = svi.step(narrow, torch.randn(3))
        assert not elbo.last_step_replayed and math.isfinite(loss)
        assert set(elbo.last_terms["kl_by_site"]) >= sites


def test_replay_is_off_for_what_it_does_not_cover():
    """Pruned guides, learned priors, a user's scale on the observation, several particles and a hand-written model
    run through Pyro's handlers."""
    import pyro_bbb
    from pyro_bbb import likelihoods

    pyro.clear_param_store()
    model, guide, x, y = _regression_bnn()
    elbo = ELBO(num_data=200)
    svi = SVI(model, guide, pyro_bbb.optim.Adam(lr=1e-2), elbo)
    svi.step(x, y)
    svi.step(x, y)
    assert elbo.last_step_replayed
    keep = {name: torch.ones_like(p.loc, dtype=torch.bool) for name, p in guide.site_posteriors().items()
            if name.startswith("net.")}  # fmt: skip
    with guide.pruned(keep):
        svi.step(x, y)
    assert not elbo.last_step_replayed

    class ScaledLikelihood(likelihoods.Gaussian):
        def forward(self, output, y=None, data_plate="data"):
            with poutine.scale(scale=0.5):  # a user's own scale on the observation
                return super().forward(output, y, data_plate)

    cases = [
        lambda: pyro_bbb.BNN(BayesianLinear(3, 1), ScaledLikelihood(1.0)),
        lambda: pyro_bbb.BNN(BayesianLinear(3, 1, prior=priors.LearnedNormal()), likelihoods.Gaussian(1.0)),
        lambda: Regression(),
    ]
    for make in cases:
        for particles in (1, 2):
            pyro.clear_param_store()
            model = make()
            guide = MeanFieldGuide(model)
            elbo = ELBO(num_data=200, num_particles=particles)
            svi = SVI(model, guide, pyro_bbb.optim.Adam(lr=1e-2), elbo)
            xs, ys = torch.randn(10, 3), torch.randn(10)
            for _ in range(3):
                svi.step(xs, ys if isinstance(model, pyro_bbb.BNN) else ys)
            assert not elbo.last_step_replayed


def test_replay_survives_a_cleared_param_store():
    """``pyro.clear_param_store()`` between steps: the guide registers its parameters anew on the full path, as it
    would without the replay, and the next steps replay again."""
    import pyro_bbb

    pyro.clear_param_store()
    model, guide, x, y = _regression_bnn()
    elbo = ELBO(num_data=200)
    svi = SVI(model, guide, pyro_bbb.optim.Adam(lr=1e-2), elbo)
    for _ in range(2):
        svi.step(x, y)
    assert elbo.last_step_replayed
    pyro.clear_param_store()
    assert math.isfinite(svi.step(x, y)) and not elbo.last_step_replayed
    assert math.isfinite(svi.step(x, y)) and elbo.last_step_replayed
