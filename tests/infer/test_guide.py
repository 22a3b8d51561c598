import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import pytest
import torch
from pyro.nn import PyroModule

import pyro_bbb
from pyro_bbb import ELBO, MeanFieldGuide, likelihoods, priors
from pyro_bbb._checks import GuideNotSetUpError
from pyro_bbb.infer import DEFAULT_INIT_SCALE
from pyro_bbb.nn import BayesianLinear

from ..helpers import MLP


class NoisyRegression(PyroModule):
    """A Bayesian layer plus a constrained latent: the noise scale has a LogNormal prior."""

    def __init__(self):
        super().__init__()
        self.fc = BayesianLinear(2, 1)

    def forward(self, x, y=None):
        sigma = pyro.sample("sigma", dist.LogNormal(0.0, 1.0))
        mean = self.fc(x).squeeze(-1)
        with pyro.plate("data", x.shape[0]):
            return pyro.sample("y", dist.Normal(mean, sigma), obs=y)


def test_every_real_site_is_a_normal_at_its_own_name():
    model = MLP()
    guide = MeanFieldGuide(model)
    tr = poutine.trace(guide).get_trace(torch.randn(5, 2), torch.randn(5))
    sample_sites = {n: s for n, s in tr.nodes.items() if s["type"] == "sample" and n != "data"}
    assert set(sample_sites) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}  # no auxiliary sites
    for name, site in sample_sites.items():
        fn = site["fn"]
        assert isinstance(fn, dist.Independent) and isinstance(fn.base_dist, dist.Normal), name
        assert fn.event_shape == site["value"].shape


def test_closed_form_kl_makes_a_prior_only_elbo_deterministic():
    """With no data the ELBO is exactly -KL: identical for every draw iff the closed form is used."""

    layer = BayesianLinear(3, 2, prior=priors.Normal(0.0, 1.0))

    def prior_only(x):
        return layer(x)

    guide = MeanFieldGuide(prior_only, init_scale=0.3)
    elbo = ELBO()
    losses = {round(elbo.loss(prior_only, guide, torch.randn(4, 3)), 4) for _ in range(5)}
    assert len(losses) == 1
    posteriors = guide.site_posteriors()
    exact = sum(torch.distributions.kl_divergence(q, dist.Normal(0.0, 1.0)).sum() for q in posteriors.values())
    assert losses.pop() == pytest.approx(exact.item(), rel=1e-5)


def test_initial_means_are_the_layers_own_initialisation():
    model = MLP()
    guide = MeanFieldGuide(model)
    guide(torch.randn(3, 2), torch.randn(3))
    post = guide.site_posteriors()
    assert torch.equal(post["fc1.weight"].loc, model.fc1.weight_init)
    assert torch.equal(post["fc2.bias"].loc, model.fc2.bias_init)
    for q in post.values():
        assert isinstance(q, dist.Normal) and not q.loc.requires_grad and not q.scale.requires_grad
        assert torch.allclose(q.scale, torch.tensor(DEFAULT_INIT_SCALE))


def test_custom_init_loc_and_scale():
    model = MLP()
    guide = MeanFieldGuide(model, init_scale=0.2, init_loc_fn=pyro.infer.autoguide.init_to_mean)
    guide(torch.randn(3, 2), torch.randn(3))
    post = guide.site_posteriors()
    assert torch.equal(post["fc1.weight"].loc, torch.zeros(8, 2))
    assert torch.allclose(post["fc1.weight"].scale, torch.tensor(0.2))


def test_constrained_site_gets_a_transformed_normal_at_its_name():
    model = NoisyRegression()
    guide = MeanFieldGuide(model)
    x, y = torch.randn(20, 2), torch.randn(20)
    tr = poutine.trace(guide).get_trace(x, y)
    assert tr.nodes["sigma"]["value"] > 0
    assert isinstance(tr.nodes["sigma"]["fn"], dist.TransformedDistribution)
    q = guide.site_posteriors()["sigma"]
    assert isinstance(q, dist.TransformedDistribution)
    # starts near the prior median (Pyro's init_to_median: median of 15 prior draws; log-sigma ~ N(0, 1))
    assert abs(q.base_dist.loc.item()) < 1.5 and q.base_dist.scale.item() == pytest.approx(DEFAULT_INIT_SCALE)
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), ELBO(num_data=20))
    assert all(torch.isfinite(torch.tensor(svi.step(x, y))) for _ in range(5))


def test_a_sites_posterior_is_read_live_in_one_place():
    from pyro_bbb.infer.guide import site_loc_scale

    model = MLP()
    guide = MeanFieldGuide(model)
    guide(torch.randn(3, 2), torch.randn(3))
    loc, scale = site_loc_scale(guide, "fc1.weight")
    assert loc.requires_grad and scale.requires_grad
    with pytest.raises(KeyError, match="no latent site named 'fc9.weight'"):
        site_loc_scale(guide, "fc9.weight")


@pytest.mark.parametrize("bad", [0.0, -0.1, "small"])
def test_invalid_init_scale(bad):
    with pytest.raises(ValueError, match="`init_scale`"):
        MeanFieldGuide(MLP(), init_scale=bad)


def test_invalid_init_loc_and_unready_guide():
    with pytest.raises(ValueError, match="`init_loc_fn`"):
        MeanFieldGuide(MLP(), init_loc_fn="zeros")
    with pytest.raises(GuideNotSetUpError, match="has not seen the model yet"):
        MeanFieldGuide(MLP()).site_posteriors()


# -- local latent variables in subsampled plates, AutoNormal's constructor and accessors --------------
N_LOCAL, TAU, SIGMA = 40, 0.5, 0.3


class LocalLatent(PyroModule):
    """Global weights w ~ N(0, I) and one latent z_i ~ N(0, tau^2) per datum: y_i ~ N(x_i . w + z_i, sigma^2).

    The datum's index travels as the last column of ``x`` so that ``fit``'s shuffled minibatches can declare
    ``pyro.plate("data", N, subsample=idx)`` (Pyro's subsampling idiom)."""

    def __init__(self):
        super().__init__()
        self.fc = BayesianLinear(2, 1, bias=False, prior=priors.Normal(0.0, 1.0))

    def forward(self, x, y=None):
        idx = x[:, -1].long()
        mean = self.fc(x[:, :-1]).squeeze(-1)
        with pyro.plate("data", N_LOCAL, subsample=idx):
            z = pyro.sample("z", dist.Normal(0.0, TAU))
            return pyro.sample("y", dist.Normal(mean + z, SIGMA), obs=y)


def _local_data():
    g = torch.Generator().manual_seed(0)
    features = torch.randn(N_LOCAL, 2, generator=g)
    y = features @ torch.tensor([1.0, -0.5]) + TAU * torch.randn(N_LOCAL, generator=g)
    y = y + SIGMA * torch.randn(N_LOCAL, generator=g)
    return torch.cat([features, torch.arange(N_LOCAL).unsqueeze(-1).float()], -1), y


def _mean_field_optimum(x, y):
    """The target is Gaussian in theta = (w, z): its optimal mean-field Gaussian has the exact posterior means and
    variances 1 / Lambda_ii (Lambda the posterior precision)."""
    features = x[:, :-1].double()
    design = torch.cat([features, torch.eye(N_LOCAL, dtype=torch.double)], 1)
    prior_precision = torch.diag(torch.cat([torch.ones(2), torch.full((N_LOCAL,), TAU**-2)]).double())
    precision = prior_precision + design.T @ design / SIGMA**2
    mean = torch.linalg.solve(precision, design.T @ y.double() / SIGMA**2)
    std = precision.diagonal().rsqrt()
    return (mean[:2], std[:2]), (mean[2:], std[2:])


def _local_guide(model):
    return MeanFieldGuide(model, init_scale=0.05,
                          create_plates=lambda x, y=None: pyro.plate("data", N_LOCAL, subsample=x[:, -1].long()))


def _assert_matches_the_optimum(guide, x, y, std_rtol=0.1, mean_in_stds=0.3):
    """Stds within ``std_rtol`` and means within ``mean_in_stds`` posterior stds of the optimum (minibatch noise:
    a full-batch run lands within 0.02 and 0.12; an N/B scale error would put the local stds off by 2x)."""
    (w_mean, w_std), (z_mean, z_std) = _mean_field_optimum(x, y)
    q = guide.site_posteriors()
    w, z = q["fc.weight"], q["z"]
    assert z.loc.shape == (N_LOCAL,)  # full-size local parameters, as AutoNormal's
    torch.testing.assert_close(w.scale.reshape(-1).double(), w_std, rtol=std_rtol, atol=0)
    torch.testing.assert_close(z.scale.double(), z_std, rtol=std_rtol, atol=0)
    assert float(((w.loc.reshape(-1).double() - w_mean) / w_std).abs().max()) < mean_in_stds
    assert float(((z.loc.double() - z_mean) / z_std).abs().max()) < mean_in_stds


@pytest.mark.slow
def test_local_latents_in_a_subsampled_plate_reach_the_mean_field_optimum_with_svi_minibatches():
    x, y = _local_data()
    model = LocalLatent()
    guide = _local_guide(model)
    elbo = ELBO(num_data=N_LOCAL, num_particles=8, vectorize_particles=True)
    svi = pyro.infer.SVI(model, guide, pyro.optim.ClippedAdam({"lr": 0.02, "lrd": 0.9992}), elbo)
    pyro.set_rng_seed(0)
    first = torch.randperm(N_LOCAL)[:10]
    svi.step(x[first], y[first])  # the first call is subsampled: set-up with full-size parameters
    for _ in range(800):
        for idx in torch.randperm(N_LOCAL).split(10):
            svi.step(x[idx], y[idx])
    _assert_matches_the_optimum(guide, x, y)


@pytest.mark.slow
def test_local_latents_train_with_fit_on_minibatches():
    x, y = _local_data()
    model = LocalLatent()
    guide = _local_guide(model)
    pyro_bbb.fit(model, guide, (x, y), epochs=1000, batch_size=10, progress=False, seed=0, kl_weight=1,
                 optimizer=pyro.optim.ClippedAdam({"lr": 0.02, "lrd": 0.9993}))
    _assert_matches_the_optimum(guide, x, y, std_rtol=0.12, mean_in_stds=0.5)  # one particle: noisier


def test_local_kl_is_scaled_with_the_likelihood_and_the_global_kl_counted_once():
    x, y = _local_data()
    model = LocalLatent()
    guide = _local_guide(model)
    idx = torch.arange(10)
    guide(x[idx], y[idx])
    elbo = ELBO(num_data=N_LOCAL)
    elbo.loss(model, guide, x[idx], y[idx])
    q = guide.site_posteriors()
    kl_z = torch.distributions.kl_divergence(dist.Normal(q["z"].loc[idx], q["z"].scale[idx]), dist.Normal(0.0, TAU))
    kl_w = torch.distributions.kl_divergence(q["fc.weight"], dist.Normal(0.0, 1.0))
    assert elbo.last_terms["kl_by_site"]["z"] == pytest.approx(float(kl_z.sum()) * N_LOCAL / 10, rel=1e-5)
    assert elbo.last_terms["kl_by_site"]["fc.weight"] == pytest.approx(float(kl_w.sum()), rel=1e-5)


def test_a_full_size_call_then_a_subsampled_one():
    x, y = _local_data()
    model = LocalLatent()
    guide = _local_guide(model)
    guide(x, y)  # full size first
    trace = poutine.trace(guide).get_trace(x[5:25], y[5:25])  # then a subsample of 20: the plate slices
    assert trace.nodes["z"]["value"].shape == (20,)
    loc = guide.site_posteriors()["z"].loc
    assert trace.nodes["z"]["fn"].loc.tolist() == loc[5:25].tolist()


def test_autonormal_keywords_and_accessors():
    from pyro.infer.autoguide import AutoNormal
    from pyro.infer.autoguide.initialization import init_to_value

    model = NoisyRegression()
    x = torch.randn(6, 2)
    y = torch.randn(6)
    values = {"fc.weight": torch.tensor([[0.3, -0.2]]), "fc.bias": torch.tensor([0.1]), "sigma": torch.tensor(0.7)}
    ours = MeanFieldGuide(model, init_loc_fn=init_to_value(values=values), init_scale=0.2)
    ours(x, y)
    pyro.clear_param_store()
    reference = AutoNormal(model, init_loc_fn=init_to_value(values=values), init_scale=0.2)
    reference(x, y)
    for name, value in reference.median().items():
        torch.testing.assert_close(ours.median()[name], value)
    for name, value in reference.quantiles([0.1, 0.5, 0.9]).items():
        torch.testing.assert_close(ours.quantiles([0.1, 0.5, 0.9])[name], value)


def test_a_part_built_on_a_blocked_model_starts_from_its_layers_init_and_prior_widths():
    """MeanFieldGuide(poutine.block(bnn, expose=...)), as an AutoGuideList's part is built, read neither the layers'
    initial weights nor init_scale="prior": the module inside the handler was not seen, and the head started at the
    prior median with width 1e-4."""
    pyro.clear_param_store()
    net = torch.nn.Sequential(BayesianLinear(3, 8), torch.nn.Tanh(), BayesianLinear(8, 2))
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.5))
    part = MeanFieldGuide(poutine.block(bnn, expose=["net.2.weight"]), init_scale="prior")
    part(torch.randn(4, 3), torch.randn(4, 2))
    loc, scale = part.loc_and_scale("net.2.weight")
    torch.testing.assert_close(loc.detach(), net[2].weight_init)
    prior_std = net[2].prior_distribution("weight").base_dist.scale
    torch.testing.assert_close(scale.detach(), prior_std.expand_as(scale))
