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
from pyro_bbb.infer.guide import site_loc_scale
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


def test_a_heavy_tailed_priors_width_is_the_normal_one_of_its_quartiles():
    """A Cauchy or a Student-t with df <= 2 has no finite std: check_posterior reported every layer "collapsed"
    (std ratio 0) and init_scale="prior" started every posterior at an infinite width."""
    from pyro_bbb.priors import prior_std

    iqr = 2 * stats.norm.ppf(0.75)
    assert float(prior_std(dist.Cauchy(0.0, 2.0))) == pytest.approx(2 * 2 / iqr, rel=1e-6)  # exact: its icdf
    torch.manual_seed(0)
    for df in (1.0, 2.0):  # from draws of the standard t (scipy's quartiles as the reference)
        width = prior_std(dist.StudentT(df, 0.0, 0.5).expand((30, 40)))
        assert width.shape == (30, 40) and torch.all(width == width[0, 0])
        assert float(width[0, 0]) == pytest.approx(0.5 * 2 * stats.t.ppf(0.75, df) / iqr, rel=0.05)
    assert float(prior_std(dist.StudentT(5.0, 0.0, 1.0))) == pytest.approx(math.sqrt(5 / 3))  # a finite std: as is
    bnn = pyro_bbb.BNN(BayesianLinear(3, 1, prior=dist.Cauchy(0.0, 1.0)), pyro_bbb.likelihoods.Gaussian(scale=0.5))
    guide = pyro_bbb.MeanFieldGuide(bnn, init_scale="prior")
    guide(torch.randn(4, 3), torch.randn(4))
    assert torch.allclose(guide.site_posteriors()["net.weight"].scale, torch.tensor(2 / iqr, dtype=torch.float32))
    assert pyro_bbb.summary(bnn, guide).loc["net", "prior_sigma"] == pytest.approx(2 / iqr, rel=1e-6)
    with pytest.warns(UserWarning, match="never trained"):
        layer = pyro_bbb.evaluate.diagnostics.check_posterior(bnn, guide)["net"]
    assert layer["std_ratio_geomean"] == pytest.approx(1.0, rel=1e-5)  # (it was 0: "collapsed")


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
                              BayesianLinear(hidden, 1, prior=prior))
    return pyro_bbb.BNN(net, pyro_bbb.likelihoods.Gaussian(scale=0.1))


def test_learned_normal_is_a_parameter_of_the_layer():
    layer = BayesianLinear(3, 2, prior=priors.LearnedNormal(init_scale=0.5, per="unit"))
    assert layer.weight_prior_scale.shape == (2, 1) and layer.bias_prior_scale.shape == (2,)
    assert torch.allclose(layer.weight_prior_scale, torch.tensor(0.5))
    assert {"weight_prior_scale_unconstrained", "bias_prior_scale_unconstrained"} <= dict(
        layer.named_parameters()).keys()
    d = layer.prior_distribution("weight")
    assert d.event_shape == (2, 3) and d.base_dist.scale.requires_grad
    layer.double()
    assert layer.prior_distribution("weight").base_dist.scale.dtype == torch.float64
    assert "LearnedNormal(init_scale=0.5, per='unit', min_scale=0.001)" in repr(layer)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"init_scale": 0.0}, "init_scale"), ({"per": "layer"}, "per"), ({"min_scale": -1.0}, "min_scale"),
     ({"init_scale": 0.01, "min_scale": 0.1}, "below")],
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
    history = pyro_bbb.fit(model, guide, (x, y), epochs=300, batch_size=100, lr=1e-2, progress=False, seed=0,
                           kl_weight=1)  # (the optimal prior scale given q does not depend on the weight)
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
                               prior=priors.LearnedNormal(init_scale=0.4))
    model = pyro_bbb.BNN(net, pyro_bbb.likelihoods.Gaussian(scale=0.1))
    guide = pyro_bbb.MeanFieldGuide(model)
    x, y = _regression()
    pyro_bbb.fit(model, guide, (x, y), epochs=5, batch_size=50, lr=1e-2, progress=False, seed=0)
    learned = float(net[0].weight_prior_scale.detach())
    assert learned != pytest.approx(0.4)
    pyro_bbb.save(tmp_path / "m.pt", model, guide)
    pyro.clear_param_store()
    net2 = pyro_bbb.bayesianize(torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)),
                                prior=priors.LearnedNormal(init_scale=0.4))
    model2 = pyro_bbb.BNN(net2, pyro_bbb.likelihoods.Gaussian(scale=0.1))
    guide2 = pyro_bbb.MeanFieldGuide(model2)
    pyro_bbb.load(tmp_path / "m.pt", model2, guide2)
    assert float(net2[0].weight_prior_scale.detach()) == pytest.approx(learned, rel=1e-6)


# --- empirical Bayes with a closed-form scale (Wu et al. 2019) --------------------------------------------------


def _eb_scale_by_hand(mu, sigma, dims, alpha, mode):
    """s^2 = (sum(mu^2 + sigma^2) + 2 beta) / (m + 2 alpha + 2), beta = (alpha + 1) mode^2; S/m without alpha."""
    second = (mu.double() ** 2 + sigma.double() ** 2).sum(dims, keepdim=True)
    m = math.prod(mu.shape[d] for d in dims)
    if alpha is None:
        return (second / m).sqrt()
    return ((second + 2 * (alpha + 1) * mode**2) / (m + 2 * alpha + 2)).sqrt()


@pytest.mark.parametrize("alpha", [4.4798, 1.0, None])
@pytest.mark.parametrize("per, dims", [("tensor", (0, 1, 2, 3)), ("unit", (1, 2, 3))])
def test_empirical_bayes_scale_is_the_closed_form_optimum(alpha, per, dims):
    """For a conv weight (5, 3, 2, 2), fan-in 12: the scale of each tensor (unit) is the optimum by hand."""
    g = torch.Generator().manual_seed(1)
    mu, sigma = torch.randn(5, 3, 2, 2, generator=g), torch.rand(5, 3, 2, 2, generator=g) + 0.1
    prior = priors.EmpiricalBayesNormal(gain=2.0, concentration=alpha, per=per)
    p = prior.distribution((5, 3, 2, 2), fan_in=12)
    in_force = priors.prior_in_force(p, dist.Normal(mu, sigma).to_event(4))
    expected = _eb_scale_by_hand(mu, sigma, dims, alpha, 2.0 / math.sqrt(12)).expand(5, 3, 2, 2)
    assert torch.allclose(in_force.base_dist.scale.double(), expected, rtol=1e-6)
    # ...and it maximises KL's negative plus the log-density of the inverse-gamma hyperprior (checked on a grid)
    if per == "tensor":
        s2 = torch.linspace(0.5, 2.0, 20001, dtype=torch.float64) * float(expected[0, 0, 0, 0]) ** 2
        second, n = float((mu.double() ** 2 + sigma.double() ** 2).sum()), mu.numel()
        objective = -(0.5 * n * s2.log() + second / (2 * s2))
        if alpha is not None:
            beta = (alpha + 1) * 4.0 / 12
            objective = objective - (alpha + 1) * s2.log() - beta / s2
        best = float(s2[objective.argmax()].sqrt())
        assert best == pytest.approx(float(expected[0, 0, 0, 0]), rel=1e-4)


def test_empirical_bayes_kl_value_and_gradient_are_those_of_the_maximised_objective():
    """Ground truth by finite differences: F(mu, sigma) = min over s of [KL(q || N(0, s^2)) - log IG(s^2)],
    minimised numerically (scipy). The registered KL's value is the KL at the optimal s; its gradient equals dF
    (the envelope theorem) -- not the gradient through s, which a naive implementation would follow."""
    from scipy import optimize

    alpha, mode = 4.4798, 0.5
    beta = (alpha + 1) * mode**2
    g = torch.Generator().manual_seed(2)
    mu = (0.3 * torch.randn(6, 4, generator=g, dtype=torch.float64)).requires_grad_()
    sigma = (0.2 + 0.1 * torch.rand(6, 4, generator=g, dtype=torch.float64)).requires_grad_()
    p = priors.EmpiricalBayesNormal(concentration=alpha).distribution((6, 4), fan_in=4, dtype=torch.float64)

    def objective(m, s):
        def f(log_s2):
            s2 = math.exp(log_s2)
            kl = float((0.5 * math.log(s2) - np.log(s) + (s**2 + m**2) / (2 * s2) - 0.5).sum())
            return kl - ((-alpha - 1) * log_s2 - beta / s2)  # minus log IG(s^2) up to its constant
        return optimize.minimize_scalar(f, bounds=(-10, 5), method="bounded", options={"xatol": 1e-12}).fun

    kl = torch.distributions.kl_divergence(dist.Normal(mu, sigma).to_event(2), p)
    s_star = priors.prior_in_force(p, dist.Normal(mu, sigma).to_event(2)).base_dist.scale
    by_hand = (s_star.log() - sigma.log() + (sigma**2 + mu**2) / (2 * s_star**2) - 0.5).sum()
    assert float(kl) == pytest.approx(float(by_hand), rel=1e-12)
    grad_mu, grad_sigma = torch.autograd.grad(kl, [mu, sigma])
    m0, s0 = mu.detach().numpy(), sigma.detach().numpy()
    h = 1e-5
    for (i, j) in [(0, 0), (3, 2), (5, 3)]:
        for grad, which in ((grad_mu, "mu"), (grad_sigma, "sigma")):
            plus, minus = [a.copy() for a in (m0, s0)], [a.copy() for a in (m0, s0)]
            k = 0 if which == "mu" else 1
            plus[k][i, j] += h
            minus[k][i, j] -= h
            fd = (objective(*plus) - objective(*minus)) / (2 * h)
            assert float(grad[i, j]) == pytest.approx(fd, rel=1e-4, abs=1e-7)


def test_empirical_bayes_kl_of_vectorized_particles_is_one_per_tensor():
    """Leading batch dimensions (vectorized particles) are separate tensors: each gets the scale of its own."""
    p = priors.EmpiricalBayesNormal().distribution((3, 4), fan_in=4)
    q = dist.Normal(torch.randn(3, 4), 0.3)
    alone = torch.distributions.kl_divergence(q.to_event(2), p)
    many = torch.distributions.kl_divergence(q.expand((5, 3, 4)).to_event(2), p.expand((5,)))
    assert many.shape == (5,) and torch.allclose(many, alone.expand(5))


def test_empirical_bayes_trains_with_fit_and_reports_the_scale_it_uses():
    """fit with pyro_bbb.ELBO: the ELBO's KL per site equals the closed form at the optimal scale; History, the
    layer summary, summary's table and plot_std_ratio show that scale (not the hyperprior's mode)."""
    pyro.clear_param_store()
    x, y = _regression(300)
    model = _learned_bnn(priors.EmpiricalBayesNormal())
    guide = pyro_bbb.MeanFieldGuide(model)
    history = pyro_bbb.fit(model, guide, (x, y), epochs=40, batch_size=100, lr=1e-2, progress=False, seed=0)
    mu, sigma = (t.detach() for t in site_loc_scale(guide, "net.0.weight"))
    s = _eb_scale_by_hand(mu, sigma, (0, 1), 4.4798, 1 / math.sqrt(3))
    elbo = pyro_bbb.ELBO(num_data=len(x))
    elbo.differentiable_loss(model, guide, x, y)
    expected = (s.log() - sigma.double().log() + (sigma.double() ** 2 + mu.double() ** 2) / (2 * s**2) - 0.5).sum()
    assert float(elbo.last_terms["kl_by_site"]["net.0.weight"]) == pytest.approx(float(expected), rel=1e-5)
    layer = pyro_bbb.evaluate.diagnostics.layer_summary(model, guide)["net.0"]
    mu_b, sigma_b = (t.detach() for t in site_loc_scale(guide, "net.0.bias"))
    s_b = _eb_scale_by_hand(mu_b, sigma_b, (0,), 4.4798, 1 / math.sqrt(3))
    mean_prior_std = (float(s) * mu.numel() + float(s_b) * mu_b.numel()) / (mu.numel() + mu_b.numel())
    assert layer["prior_std"] == pytest.approx(mean_prior_std, rel=1e-5)
    assert history.last["prior_std"]["net.0"] == pytest.approx(layer["prior_std"], rel=1e-5)
    assert pyro_bbb.summary(model, guide).loc["net.0", "prior_sigma"] == pytest.approx(layer["prior_std"], rel=1e-5)
    assert abs(layer["prior_std"] - 1 / math.sqrt(3)) > 0.05  # moved away from the hyperprior's mode


def test_empirical_bayes_with_a_hand_written_guide_autonormal_and_pyros_elbos():
    """A hand-written Normal guide with pyro_bbb.ELBO: every site's KL is the closed form at the optimal scale, and
    the same with Pyro's AutoNormal (its site is a Delta; the Normal it draws through is read instead). Pyro's
    Trace_ELBO and TraceMeanField_ELBO (both score the weight draw under the prior) are clear errors, raised before
    any parameter changes."""
    pyro.clear_param_store()
    x, y = _regression()
    model = _learned_bnn(priors.EmpiricalBayesNormal())
    shapes = {"net.0.weight": (16, 3), "net.0.bias": (16,), "net.2.weight": (1, 16), "net.2.bias": (1,)}
    fan_in = {"net.0": 3, "net.2": 16}

    def guide(x, y=None):
        for name, shape in shapes.items():
            loc = pyro.param(f"{name}_loc", lambda shape=shape: 0.3 * torch.randn(shape))
            scale = pyro.param(f"{name}_scale", torch.full(shape, 0.05), constraint=dist.constraints.positive)
            pyro.sample(name, dist.Normal(loc, scale).to_event(len(shape)))

    elbo = pyro_bbb.ELBO(num_data=len(x))
    elbo.differentiable_loss(model, guide, x, y)
    for name, shape in shapes.items():
        mu, sigma = pyro.param(f"{name}_loc").detach(), pyro.param(f"{name}_scale").detach()
        s = _eb_scale_by_hand(mu, sigma, tuple(range(len(shape))), 4.4798, 1 / math.sqrt(fan_in[name[:5]]))
        expected = (s.log() - sigma.double().log() + (sigma.double() ** 2 + mu.double() ** 2) / (2 * s**2) - 0.5)
        assert float(elbo.last_terms["kl_by_site"][name]) == pytest.approx(float(expected.sum()), rel=1e-5)
    for guide_, elbo in [(guide, Trace_ELBO()), (guide, pyro.infer.TraceMeanField_ELBO())]:
        pyro.clear_param_store()
        guide_(x, y)
        before = {k: v.detach().clone() for k, v in pyro.get_param_store().items()}
        svi = SVI(model, guide_, pyro.optim.Adam({"lr": 0.01}), elbo)
        with pytest.raises(ValueError, match="no log-density on its own"):
            svi.step(x, y)
        assert all(torch.equal(before[k], v.detach()) for k, v in pyro.get_param_store().items())

    # Pyro's AutoNormal draws each site through an auxiliary Normal: pyro_bbb.ELBO reads that Normal for the prior's
    # KL (the same closed form as above), and counts its log q once
    pyro.clear_param_store()
    auto = AutoNormal(model, init_scale=0.05)
    auto(x, y)
    elbo = pyro_bbb.ELBO(num_data=len(x))
    elbo.differentiable_loss(model, auto, x, y)
    assert not any(name.endswith("_unconstrained") for name in elbo.last_terms["kl_by_site"])
    for name, shape in shapes.items():
        mu, sigma = (t.detach() for t in auto._get_loc_and_scale(name))
        s = _eb_scale_by_hand(mu, sigma, tuple(range(len(shape))), 4.4798, 1 / math.sqrt(fan_in[name[:5]]))
        expected = (s.log() - sigma.double().log() + (sigma.double() ** 2 + mu.double() ** 2) / (2 * s**2) - 0.5)
        assert float(elbo.last_terms["kl_by_site"][name]) == pytest.approx(float(expected.sum()), rel=1e-5)
    losses = [SVI(model, auto, pyro.optim.Adam({"lr": 0.01}), elbo).step(x, y) for _ in range(20)]
    assert all(math.isfinite(loss) for loss in losses)


@pytest.mark.parametrize("kwargs, match", [({"gain": 0.0}, "gain"), ({"concentration": -1.0}, "concentration"),
                                           ({"per": "layer"}, "per")])
def test_empirical_bayes_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        priors.EmpiricalBayesNormal(**kwargs)


def test_empirical_bayes_draws_use_the_hyperprior_mode():
    p = priors.EmpiricalBayesNormal(gain=2.0).distribution((400, 100), fan_in=16)
    draws = p.sample()
    assert draws.shape == (400, 100) and float(draws.std()) == pytest.approx(0.5, rel=0.02)


def test_empirical_bayes_through_bayesianize_and_deterministic_vi():
    """bayesianize(prior=EmpiricalBayesNormal(per="unit")) of a small conv net trains with estimator="moments";
    plot_std_ratio marks each layer's prior at the scale in force (the layer summary's), not the hyperprior's mode."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    cnn = torch.nn.Sequential(torch.nn.Conv2d(1, 3, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(12, 1))
    net = pyro_bbb.bayesianize(cnn, prior=priors.EmpiricalBayesNormal(per="unit"))
    model = pyro_bbb.BNN(net, pyro_bbb.likelihoods.Gaussian(scale=0.1))
    guide = pyro_bbb.MeanFieldGuide(model)
    x = torch.randn(64, 1, 4, 4)
    y = x.mean((1, 2, 3))
    history = pyro_bbb.fit(model, guide, (x, y), epochs=20, batch_size=32, lr=1e-2, estimator="moments",
                           progress=False, seed=0)
    assert all(math.isfinite(v) for v in history["loss"])
    summary = pyro_bbb.evaluate.diagnostics.layer_summary(model, guide)
    mu, sigma = (t.detach() for t in site_loc_scale(guide, "net.0.weight"))
    per_unit = _eb_scale_by_hand(mu, sigma, (1, 2, 3), 4.4798, 1 / 3)  # fan-in 9
    assert per_unit.reshape(-1).unique().numel() == 3  # one scale per output channel
    fig = pyro_bbb.evaluate.plots.plot_std_ratio(model, guide)
    lines = [line.get_xdata()[0] for line in fig.axes[0].lines]
    assert any(math.isclose(10 ** v, summary["net.0"]["prior_std"], rel_tol=1e-4) for v in lines)
