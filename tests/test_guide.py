import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import pytest
import torch
from pyro.nn import PyroModule

from pyro_bbb import DEFAULT_INIT_SCALE, ELBO, MeanFieldGuide
from pyro_bbb.nn import BayesianLinear

from .models import MLP


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

    layer = BayesianLinear(3, 2)

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
    guide = MeanFieldGuide(model, init_scale=0.2, init_loc=pyro.infer.autoguide.init_to_mean)
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


def test_posterior_params_are_live():
    model = MLP()
    guide = MeanFieldGuide(model)
    guide(torch.randn(3, 2), torch.randn(3))
    loc, scale = guide.posterior_params("fc1.weight")
    assert loc.requires_grad and scale.requires_grad
    with pytest.raises(KeyError, match="no latent site named 'fc9.weight'"):
        guide.posterior_params("fc9.weight")


@pytest.mark.parametrize("bad", [0.0, -0.1, "small"])
def test_invalid_init_scale(bad):
    with pytest.raises(ValueError, match="`init_scale`"):
        MeanFieldGuide(MLP(), init_scale=bad)


def test_invalid_init_loc_and_unready_guide():
    with pytest.raises(ValueError, match="`init_loc`"):
        MeanFieldGuide(MLP(), init_loc="zeros")
    with pytest.raises(RuntimeError, match="has not seen the model yet"):
        MeanFieldGuide(MLP()).site_posteriors()
