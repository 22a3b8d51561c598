"""The ELBO against ground truth: closed-form posteriors, hand-computed losses, Pyro's own reference ELBOs."""

import math

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import SVI, TraceMeanField_ELBO

import pyro_bbb
from pyro_bbb import ELBO, MeanFieldGuide, likelihoods, priors
from pyro_bbb.infer.estimators import estimator as estimator_by_name
from pyro_bbb.infer.schedules import LinearWarmup
from pyro_bbb.infer.tempering import KLWeightChoice, kl_weight_of, record_kl_weight

from ..helpers import MLP, Regression, Routed, guide_for, minibatches, regression_data


# ---------------------------------------------------------------------------------------------------------------
# Bayesian linear regression: the optimal mean-field Gaussian is known in closed form
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
# For a fixed guide draw the loss is -(N/B sum log p(y|x,w) - KL), KL = sum of exact KLs
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
                  for name, q in guide.site_posteriors().items()}
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


@pytest.mark.slow
def test_a_handlers_factor_on_the_whole_loss_is_reported_once():
    """poutine.scale(model, 1 / N) with poutine.scale(guide, 1 / N) (a per-datum loss): ``loss`` is the scaled one the
    step returns; the NLL, the KL and the loss per datum are the objective's own (the KL came out 1 / N of itself,
    and the loss per datum was divided by N twice)."""
    x, y = regression_data(40)
    model = Regression()
    guide = guide_for(model, x, y, init_scale=0.2)
    terms = {}
    for factor in (1.0, 1 / 200):
        elbo = ELBO(num_data=200)
        pyro.set_rng_seed(3)
        loss = elbo.loss(poutine.scale(model, factor), poutine.scale(guide, factor), x, y)
        terms[factor] = loss, dict(elbo.last_terms)
    (plain, plain_terms), (scaled, scaled_terms) = terms[1.0], terms[1 / 200]
    assert scaled == pytest.approx(plain / 200, rel=1e-5) and scaled_terms["loss"] == pytest.approx(scaled)
    for name in ("nll", "kl", "loss_per_datum"):
        assert scaled_terms[name] == pytest.approx(plain_terms[name], rel=1e-5), name
    assert scaled_terms["kl_by_site"] == pytest.approx(plain_terms["kl_by_site"], rel=1e-5)
    assert (plain_terms["loss_scale"], scaled_terms["loss_scale"]) == (1.0, pytest.approx(1 / 200))


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
# A KL-weight schedule changes the KL term and nothing else
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


def test_schedule_steps_once_per_differentiable_loss_in_a_torch_optimizer_loop():
    """Pyro's recipe for a torch optimizer (loss = elbo.differentiable_loss(...); loss.backward(); opt.step()): the
    warm-up stayed at its first weight, 0, forever -- no KL at all."""
    x, y = regression_data(20)
    model = Regression()
    guide = guide_for(model, x, y)
    elbo = ELBO(num_data=20, kl_weight=LinearWarmup(4))
    optimizer = torch.optim.Adam(guide.parameters(), lr=0.01)
    weights = []
    for step in range(6):
        optimizer.zero_grad()
        elbo.differentiable_loss(model, guide, x, y).backward()
        optimizer.step()
        weights.append(elbo.last_terms["kl_weight"])
        with torch.no_grad():  # a validation loss, as a torch loop computes one: not a step, nothing trained
            elbo.differentiable_loss(model, guide, x[:5], y[:5])
        assert elbo.step == step + 1 and kl_weight_of(guide).kl_weight == weights[-1]
    assert weights == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0] and elbo.step == 6
    elbo.loss(model, guide, x, y)  # evaluating is not a step
    assert elbo.step == 6
    record_kl_weight(guide, KLWeightChoice(kl_weight=0.1))  # nor does a no-grad loss at another weight re-record it
    with torch.no_grad():
        ELBO(num_data=20).differentiable_loss(model, guide, x, y)
    assert kl_weight_of(guide).kl_weight == 0.1


def test_schedule_steps_with_a_model_and_guide_made_anew_at_each_call():
    """Methods (``self.model`` is a new method object at each access, as in a LightningModule's training_step) and a
    handler made at each step (``poutine.scale(model, ...)``): the ELBO took each call for a new pair, and the
    warm-up never left its first weight, 0 (no KL, in silence). A different model or guide is still a new pair."""
    x, y = regression_data(20)

    class Task:
        def __init__(self):
            self.net = Regression()
            self.posterior = guide_for(self.net, x, y)

        def model(self, x, y):
            return self.net(x, y)

        def guide(self, x, y):
            return self.posterior(x, y)

    task = Task()
    elbo = ELBO(num_data=20, kl_weight=LinearWarmup(4))
    weights = []
    for _ in range(3):
        elbo.differentiable_loss(task.model, task.guide, x, y)
        weights.append(elbo.last_terms["kl_weight"])
    for _ in range(3):
        elbo.differentiable_loss(poutine.scale(task.net, 1.0), task.posterior, x, y)
        weights.append(elbo.last_terms["kl_weight"])
    assert weights == [0.0, 0.25, 0.5, 0.0, 0.25, 0.5]  # two pairs: each its own schedule
    elbo.differentiable_loss(task.model, task.guide, x, y)
    assert elbo.last_terms["kl_weight"] == 0.75
    other = Task()
    elbo.differentiable_loss(other.model, other.guide, x, y)
    assert elbo.last_terms["kl_weight"] == 0.0


# ---------------------------------------------------------------------------------------------------------------
# Vectorized particles: the same expected loss as the sequential loop
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


def test_vectorized_particles_of_a_net_whose_rows_read_earlier_rows_run_one_at_a_time():
    """Particles folded into the batch were checked at particle 0 alone, which a net reading earlier rows (h - h[:1])
    passes: every later particle read particle 0's rows, a wrong loss, silently. The last particle is checked too;
    the particles then run one at a time, as the warning says, and the loss is the sequential ELBO's in
    expectation."""
    from pyro_bbb.nn import BayesianLinear

    class Relative(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = BayesianLinear(3, 1)

        def forward(self, x):
            h = self.layer(x)
            return h - h[:1]

    x, y = regression_data(30)
    bnn = pyro_bbb.BNN(Relative(), likelihoods.Gaussian(scale=0.5))
    guide = guide_for(bnn, x, y, init_scale=0.3)
    vectorized = ELBO(num_data=30, num_particles=4, vectorize_particles=True)
    with pytest.warns(UserWarning, match=r"particle 0 or the last .* differs .* rows read other rows"):
        vectorized.loss(bnn, guide, x, y)
    sequential = ELBO(num_data=30, num_particles=4)
    vec = torch.tensor([vectorized.loss(bnn, guide, x, y) for _ in range(100)])
    seq = torch.tensor([sequential.loss(bnn, guide, x, y) for _ in range(100)])
    assert abs(vec.mean() - seq.mean()) < 4 * math.sqrt(vec.var() / 100 + seq.var() / 100)


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
                   for n in ("fc.weight", "fc.bias"))
    assert elbo.last_terms["kl"] == pytest.approx(expected, rel=1e-5)


def test_invalid_kl_weight():
    with pytest.raises(ValueError, match="`kl_weight`"):
        ELBO(kl_weight="warmup")
    with pytest.raises(ValueError, match=r"`weight` must be a finite number >= 0"):
        ELBO(kl_weight=-1.0)
    elbo = ELBO(kl_weight=lambda step: -0.5)
    with pytest.raises(ValueError, match="returned -0.5 at step 0"):
        elbo.current_kl_weight()


def test_one_elbo_reused_for_another_model_checks_and_schedules_that_model_afresh():
    """An ELBO keeps its particle check, its validation and its KL schedule's step per (model, guide) pair: a second
    model whose code reads the particle dimension as its batch is caught (and run one particle at a time, matching
    the sequential estimator) even after a first model passed the check, and its KL warm-up starts at step 0."""
    import warnings

    import pyro_bbb
    from pyro_bbb.infer.schedules import LinearWarmup
    from pyro_bbb.nn import BayesianLinear

    from ..helpers import BatchCentred

    x, y = torch.randn(20, 3), torch.randn(20)
    good = pyro_bbb.BNN(BayesianLinear(3, 1), pyro_bbb.likelihoods.Gaussian(scale=0.5))
    good_guide = MeanFieldGuide(good)
    elbo = ELBO(num_data=20, num_particles=4, vectorize_particles=True, kl_weight=LinearWarmup(4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            elbo.loss_and_grads(good, good_guide, x, y)
    assert elbo.step == 3 and elbo.current_kl_weight() == 0.75
    bad = BatchCentred()
    bad_guide = MeanFieldGuide(bad, init_scale=1e-6)
    with pytest.warns(UserWarning, match="one at a time"):
        vectorized = elbo.loss(bad, bad_guide, x, y)
    assert elbo.step == 0 and elbo.last_terms["kl_weight"] == 0.0  # the second pair's own schedule
    sequential = ELBO(num_data=20, num_particles=4, kl_weight=0.0).loss(bad, bad_guide, x, y)
    assert vectorized == pytest.approx(sequential, rel=1e-4)
    elbo.loss_and_grads(good, good_guide, x, y)  # back to the first pair: its own step goes on
    assert elbo.step == 4


class _SubsamplingModel(pyro.nn.PyroModule):
    """A hand-written model that draws its own minibatch of the N rows it is given: with ``torch.randperm`` before
    the network, or with a subsampled ``pyro.plate`` over the network's output."""

    def __init__(self, how: str):
        super().__init__()
        from pyro_bbb.nn import BayesianLinear

        self.how, self.fc = how, BayesianLinear(3, 1)

    def forward(self, x, y):
        n = len(x)
        if self.how == "randperm":
            idx = torch.randperm(n)[:8]
            mean = self.fc(x[idx]).squeeze(-1)
        else:
            mean = self.fc(x).squeeze(-1)
        with pyro.plate("data", n, subsample=idx if self.how == "randperm" else None, subsample_size=8) as rows:
            pyro.sample("y", dist.Normal(mean if self.how == "randperm" else mean[..., rows], 0.5), obs=y[rows])


@pytest.mark.parametrize("how", ["randperm", "plate"])
def test_vectorized_particles_of_a_model_that_draws_its_minibatch_are_not_mistaken_for_batch_readers(how):
    """The particle check compared particle 0 with a run that drew another minibatch, so every model drawing its own
    rows was told it read the particle dimension as its batch and ran one particle at a time. Both runs now draw the
    same rows, and the check leaves the random stream where the step alone leaves it."""
    import warnings

    x, y = torch.randn(40, 3), torch.randn(40)
    model = _SubsamplingModel(how)
    guide = MeanFieldGuide(model)
    elbo = ELBO(num_particles=4, vectorize_particles=True, max_plate_nesting=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        elbo.loss_and_grads(model, guide, x, y)
    assert elbo.pairs.current.vectorized_ok
    pyro.set_rng_seed(3)
    elbo.loss(model, guide, x, y)  # checked: the step alone
    after_checked_step = torch.rand(3)
    fresh = ELBO(num_particles=4, vectorize_particles=True, max_plate_nesting=1)
    pyro.set_rng_seed(3)
    fresh.loss(model, guide, x, y)  # first step: the step and the check
    assert torch.equal(torch.rand(3), after_checked_step)


def test_vectorized_particles_of_a_pyro_tutorial_model_that_raises_run_one_at_a_time_with_a_warning():
    """Pyro's regression tutorial (PyroModule[nn.Linear] with PyroSample weights): torch's linear rejects the particles'
    extra dimensions, so the vectorized pass raises; the ELBO says so and runs the particles one at a time, giving
    the sequential ELBO's loss (before: torch's raw error from the first step)."""
    pyro.clear_param_store()

    class BayesianRegression(pyro.nn.PyroModule):
        def __init__(self):
            super().__init__()
            self.linear = pyro.nn.PyroModule[torch.nn.Linear](3, 1)
            self.linear.weight = pyro.nn.PyroSample(dist.Normal(0.0, 1.0).expand([1, 3]).to_event(2))
            self.linear.bias = pyro.nn.PyroSample(dist.Normal(0.0, 10.0).expand([1]).to_event(1))

        def forward(self, x, y=None):
            mean = self.linear(x).squeeze(-1)
            with pyro.plate("data", x.shape[0]):
                return pyro.sample("obs", dist.Normal(mean, 0.5), obs=y)

    x, y = torch.randn(16, 3), torch.randn(16)
    model = BayesianRegression()
    guide = MeanFieldGuide(model)
    vectorized = ELBO(num_data=64, num_particles=4, vectorize_particles=True)
    with pytest.warns(UserWarning, match=r"the vectorized model raised RuntimeError.*one at a time"):
        pyro.set_rng_seed(0)
        loss = vectorized.loss(model, guide, x, y)
    assert vectorized.pairs.current.vectorized_ok is False
    pyro.set_rng_seed(0)
    assert loss == pytest.approx(ELBO(num_data=64, num_particles=4).loss(model, guide, x, y), rel=1e-4)
    SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), vectorized).step(x, y)  # and it trains


@pytest.mark.parametrize("estimator", ["reparam", "flipout"])
def test_vectorized_particles_run_one_at_a_time_once_a_later_batch_is_routed_apart(estimator):
    """A mixture's expert on the rows its Bayesian gate selects (x[mask]): each particle routes rows of its own (3
    or 4 of the 8 here), which folded particles cannot split among them. A first batch that routes no row passes
    the check; a later one warns and runs the particles one at a time, and trains (before: the rows split into equal
    blocks, a wrong loss in silence, or an error about the batch dimension after earlier steps had trained)."""
    bnn = pyro_bbb.BNN(Routed(), likelihoods.Gaussian(scale=1.0))
    guide = MeanFieldGuide(bnn, init_scale=1.0)
    elbo = ELBO(num_data=64, num_particles=4, vectorize_particles=True)
    svi = SVI(bnn, guide, pyro.optim.Adam({"lr": 1e-2}), elbo)
    with estimator_by_name(estimator)():
        svi.step(torch.zeros(8, 1), torch.zeros(8))  # the gate routes no row: vectorized, and checked
        assert elbo.pairs.current.vectorized_ok
        x = torch.arange(-4.0, 4.0).unsqueeze(1)
        with pytest.warns(UserWarning, match="selected some of its rows.*one at a time instead, which is slower"):
            loss = svi.step(x, x.squeeze(-1))
        assert elbo.pairs.current.vectorized_ok is False and math.isfinite(loss)
        svi.step(x, x.squeeze(-1))  # one at a time from then on


def test_a_vectorized_pass_that_falls_back_leaves_no_batch_norm_update_of_its_own():
    """A batch norm ahead of a routed expert: the aborted vectorized pass ran it in training mode before the expert
    refused the rows. Its running statistics are as the particles run one at a time leave them (4 updates, and the
    mean they give), not with one update more from the aborted pass."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.BatchNorm1d(1), Routed())
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian(scale=1.0))
    guide = MeanFieldGuide(bnn, init_scale=1.0)
    elbo = ELBO(num_data=64, num_particles=4, vectorize_particles=True)
    svi = SVI(bnn, guide, pyro.optim.Adam({"lr": 1e-2}), elbo)
    svi.step(torch.zeros(8, 1), torch.zeros(8))
    norm = net[0]
    tracked, running_mean = int(norm.num_batches_tracked), norm.running_mean.clone()
    x = torch.arange(-4.0, 4.0).unsqueeze(1) + 1.0
    with pytest.warns(UserWarning, match="one at a time instead"):
        svi.step(x, x.squeeze(-1))
    assert int(norm.num_batches_tracked) == tracked + 4
    expected = running_mean
    for _ in range(4):  # what four passes over this batch do to the running mean (momentum 0.1)
        expected = 0.9 * expected + 0.1 * x.mean(0)
    torch.testing.assert_close(norm.running_mean, expected)


def test_a_call_with_inputs_of_a_new_shape_is_validated_again():
    """Pyro's validation runs on a pair's first call only, for speed; a later call whose targets have another shape
    ((B, 1) where the plate is (B,): the log-likelihood would broadcast to (B, B), 16 times the data) is validated
    again, and refused as Pyro's Trace_ELBO refuses it, before any step; a batch of another size is validated once."""
    pyro.clear_param_store()

    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(w * x, 0.5), obs=y)

    x, y = torch.randn(64), torch.randn(64)
    guide = MeanFieldGuide(model)
    elbo = ELBO(num_data=64)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), elbo)
    svi.step(x[:16], y[:16])
    before = {name: value.detach().clone() for name, value in pyro.get_param_store().items()}
    with pytest.raises(ValueError, match="shape"):
        svi.step(x[:16], y[:16, None])
    assert all(torch.equal(value, before[name]) for name, value in pyro.get_param_store().items())
    svi.step(x[:8], y[:8])  # another batch size: validated, and fine
    assert len(elbo.pairs.current.validated_shapes) == 2


@pytest.mark.parametrize("read", ["inside the plate", "before the plate", "inside, on all the rows"])
def test_a_weight_read_inside_the_data_plate_of_a_minibatch_is_refused_before_any_step(read):
    """A PyroSample weight first read inside ``with pyro.plate("data", B)`` is a latent per batch position: on
    minibatches scaled to N the autoguide learned B per-position copies, and predict failed later with a broadcast
    error. Refused at the first step with the fix; read before the plate, or on all the rows at once, it trains."""
    pyro.clear_param_store()

    class Model(pyro.nn.PyroModule):
        def __init__(self):
            super().__init__()
            self.w = pyro.nn.PyroSample(dist.Normal(0.0, 1.0))

        def forward(self, x, y=None):
            w = self.w if read == "before the plate" else None
            with pyro.plate("data", x.shape[0]):
                w = self.w if w is None else w
                return pyro.sample("y", dist.Normal(w * x, 0.5), obs=y)

    x, y = torch.randn(64), torch.randn(64)
    model = Model()
    guide = MeanFieldGuide(model)
    rows = 64 if read == "inside, on all the rows" else 16
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), ELBO(num_data=64))
    if read == "inside the plate":
        with pytest.raises(ValueError, match=r"'w' is sampled inside the data plate 'data' of this batch's 16 rows.*"
                                             r"outside `with pyro\.plate"):
            svi.step(x[:rows], y[:rows])
    else:
        svi.step(x[:rows], y[:rows])


@pytest.mark.parametrize("plate", ["the batch's", "subsampled"])
def test_a_model_that_scales_its_minibatch_itself_is_warned_of_the_double_scale(plate):
    """Pyro's older minibatch recipe scales the likelihood by N / B in the model; this ELBO scales the batch to N
    itself, so the likelihood would count (N / B)^2 times: a warning naming both. Without the model's scale, none."""
    import warnings

    pyro.clear_param_store()
    x, y = torch.randn(64), torch.randn(64)

    def model(x, y=None, scaled=True):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        size = dict(size=64, subsample=torch.arange(len(x))) if plate == "subsampled" else dict(size=len(x))
        with pyro.plate("data", **size), poutine.scale(scale=64 / len(x) if scaled else 1.0):
            pyro.sample("y", dist.Normal(w * x, 0.5), obs=y)

    guide = MeanFieldGuide(model)
    with pytest.warns(UserWarning, match=r"'y' is scaled by \(N / B\)\^2 = 16.*N / B = 4 again"):
        ELBO(num_data=64).loss(model, guide, x[:16], y[:16])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ELBO(num_data=64).loss(model, guide, x[:16], y[:16], scaled=False)


def test_a_double_scale_is_warned_of_when_the_plate_declares_n_and_the_elbo_has_none():
    """BNN(num_data=N) (or pyro.plate('data', N, subsample=idx)) under pyro_bbb.ELBO() with the model also scaled by
    N / B: the likelihood counted (N / B)^2 times and the posterior std came out half the exact one, without a
    word (only ELBO(num_data=N) warned)."""
    import warnings

    from pyro_bbb import likelihoods
    from pyro_bbb.bnn import BNN
    from pyro_bbb.nn import BayesianLinear

    pyro.clear_param_store()
    x, y = torch.randn(40, 2), torch.randn(40)
    bnn = BNN(BayesianLinear(2, 1), likelihoods.Gaussian(scale=0.5), num_data=40)
    guide = MeanFieldGuide(bnn)
    with pytest.warns(UserWarning, match=r"pyro_bbb.ELBO\(\): the observation 'y' is scaled by \(N / B\)\^2 = 25.*"
                                         r"the data plate declares N=40.*N / B = 5 again"):
        ELBO().loss(poutine.scale(bnn, scale=40 / 8), guide, x[:8], y[:8])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ELBO().loss(bnn, guide, x[:8], y[:8])


class _PlateOfTheBatch(pyro.nn.PyroModule):
    """A hand-written model whose data plate is as long as the rows it is given (Pyro's tutorials' way)."""

    def __init__(self):
        super().__init__()
        from pyro_bbb.nn import BayesianLinear

        self.fc = BayesianLinear(2, 1)

    def forward(self, x, y=None):
        mean = self.fc(x).squeeze(-1)
        with pyro.plate("data", len(x)):
            pyro.sample("obs", dist.Normal(mean, 0.3), obs=y)


def test_minibatches_of_a_plate_that_calls_each_batch_all_the_data_are_named_in_a_pyro_loop():
    """A Pyro user's own SVI loop on minibatches, with pyro_bbb.ELBO() and a plate of the batch's size: each batch of
    8 was weighed against the whole KL as if it were all the data (posterior stds 1.5 times too wide after 300 steps),
    in silence. The changing observations give it away: a warning names num_data. A reshuffled full batch, a held-out
    set scored between steps, two data sets one after the other, a given N or a subsampled plate are not minibatches
    without an N."""
    import warnings

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 2, generator=g)
    y = x @ torch.tensor([1.0, -2.0]) + 0.3 * torch.randn(64, generator=g)
    model = _PlateOfTheBatch()
    guide = MeanFieldGuide(model)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), ELBO())
    with pytest.warns(UserWarning, match=r"declares each call's 8 rows as all the data .*ELBO\(num_data=N\)") as record:
        for _ in range(30):
            rows = torch.randperm(64, generator=g)[:8]
            svi.step(x[rows], y[rows])
    assert sum("declares each call" in str(w.message) for w in record) == 1  # once
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for elbo in (ELBO(), ELBO(num_data=64)):
            pyro.clear_param_store()
            model = _PlateOfTheBatch()
            svi = SVI(model, MeanFieldGuide(model), pyro.optim.Adam({"lr": 0.01}), elbo)
            for _ in range(30):
                rows = torch.randperm(64, generator=g)[: 64 if elbo.num_data is None else 8]
                svi.step(x[rows], y[rows])  # full batch reshuffled, or minibatches with their N
                svi.evaluate_loss(x[:16], y[:16] + 1)  # a held-out set scored between steps
                with torch.no_grad():  # and as a torch loop scores it
                    elbo.differentiable_loss(model, svi.guide, x[:16], y[:16] + 1)
                elbo.differentiable_loss(model, svi.guide, x[16:32], y[16:32] - 1).item()  # or, without no_grad
        pyro.clear_param_store()
        model = _PlateOfTheBatch()
        svi = SVI(model, MeanFieldGuide(model), pyro.optim.Adam({"lr": 0.01}), ELBO())
        for fold in range(2):  # one ELBO, model and guide over two full-batch data sets: one change, not minibatches
            for _ in range(8):
                svi.step(x[32 * fold: 32 * fold + 32], y[32 * fold: 32 * fold + 32])
        pyro.clear_param_store()
        model = _SubsamplingModel("plate")  # pyro.plate("data", 64, subsample_size=8): it declares its N
        svi = SVI(model, MeanFieldGuide(model), pyro.optim.Adam({"lr": 0.01}), ELBO())
        for _ in range(30):
            svi.step(torch.cat([x, y[:, None]], -1), y)


def test_a_kl_weight_or_n_set_after_construction_is_checked_and_used_as_the_constructors():
    """elbo.kl_weight = 0.5 between steps raised "'float' object is not callable" at the next step."""
    pyro.clear_param_store()
    x, y = regression_data(20)
    model = Regression()
    guide = guide_for(model, x, y)
    later = ELBO(num_data=40)
    later.kl_weight, later.num_data = 0.5, 80
    pyro.set_rng_seed(0)
    set_later = later.loss(model, guide, x, y)
    pyro.set_rng_seed(0)
    assert set_later == ELBO(num_data=80, kl_weight=0.5).loss(model, guide, x, y)
    with pytest.raises(ValueError, match="kl_weight='auto'"):
        later.kl_weight = "auto"
    with pytest.raises(ValueError, match="num_data"):
        later.num_data = 2.5
    assert later.kl_weight(0) == 0.5 and later.num_data == 80  # a refused value changes nothing
