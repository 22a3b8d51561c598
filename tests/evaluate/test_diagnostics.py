import math
import warnings

import pyro
import pytest
import torch
from pyro.distributions.kl import kl_divergence

import pyro_bbb
from pyro_bbb import likelihoods, priors
from pyro_bbb._kl import elementwise_kl
from pyro_bbb.evaluate import diagnostics
from pyro_bbb.nn import BayesianLinear

from ..helpers import digits_fit, fitted_3_5_1


def test_kl_by_layer_is_the_closed_form_and_matches_the_elbo():
    bnn, guide, x, y = fitted_3_5_1(priors.Normal(0.0, 0.7))
    q = guide.site_posteriors()
    by_hand = {}
    for site, post in q.items():
        layer = site.rsplit(".", 1)[0]
        by_hand[layer] = by_hand.get(layer, 0.0) + float(
            kl_divergence(post, torch.distributions.Normal(0.0, 0.7)).sum()
        )
    ours = diagnostics.kl_by_layer(bnn, guide)
    assert ours.keys() == by_hand.keys()
    for layer in ours:
        assert ours[layer] == pytest.approx(by_hand[layer], rel=1e-5)
    elbo = pyro_bbb.ELBO(num_data=10)
    elbo.loss(bnn, guide, x, y)
    assert elbo.last_terms["kl"] == pytest.approx(sum(ours.values()), rel=1e-5)


def test_monte_carlo_kl_for_a_scale_mixture_prior():
    torch.manual_seed(0)
    prior = priors.ScaleMixtureNormal(0.5, 1.0, 0.01)
    bnn, guide, _, _ = fitted_3_5_1(prior, init_scale=0.05)
    q = guide.site_posteriors()["net.0.weight"]
    p = bnn.net[0].prior_distribution("weight")
    draws = q.sample((20000,))
    reference = float((q.log_prob(draws).sum((-1, -2)) - p.log_prob(draws)).mean())
    summary = diagnostics.layer_summary(bnn, guide)["net.0"]
    weight_kl = summary["kl"] - float(elementwise_kl(guide.site_posteriors()["net.0.bias"],
                                                                   bnn.net[0].prior_distribution("bias")).sum())
    # 256 draws per estimate for 15 weights: the total's Monte Carlo error is well under 2%
    assert weight_kl == pytest.approx(reference, rel=0.02)


def test_a_monte_carlo_summary_is_the_same_every_call_and_leaves_the_random_stream_alone():
    # a user's own loop that looks at the posterior between steps must train as it would without looking
    torch.manual_seed(0)
    bnn, guide, x, y = fitted_3_5_1(priors.ScaleMixtureNormal(0.5, 1.0, 0.01), init_scale=0.05)
    state = pyro.util.get_rng_state()
    first = diagnostics.layer_summary(bnn, guide)
    after = pyro.util.get_rng_state()
    assert torch.equal(after["torch"], state["torch"]) and after["random"] == state["random"]
    assert (after["numpy"][1] == state["numpy"][1]).all()
    assert diagnostics.layer_summary(bnn, guide) == first
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (an untrained guide: check_posterior says its layers sit on the prior)
        diagnostics.check_posterior(bnn, guide)
    assert torch.equal(pyro.util.get_rng_state()["torch"], state["torch"])
    # a learned noise scale (a constrained site) is summarised from draws
    pyro.clear_param_store()
    noisy = pyro_bbb.BNN(torch.nn.Sequential(BayesianLinear(3, 1)), likelihoods.Gaussian())
    noisy_guide = pyro_bbb.MeanFieldGuide(noisy)
    noisy_guide(x, y)
    state = pyro.util.get_rng_state()
    table = diagnostics.parameter_summary(noisy, noisy_guide)
    assert torch.equal(pyro.util.get_rng_state()["torch"], state["torch"])
    assert diagnostics.parameter_summary(noisy, noisy_guide).equals(table)


def test_a_constrained_sites_interval_is_the_highest_density_one_arviz_finds():
    """The columns say hdi: for a skewed posterior (a learned noise scale) the equal-tailed interval was given, wider
    than ArviZ's HDI of the same draws ([0.216, 2.034] against [0.116, 1.674])."""
    import arviz as az
    import numpy as np

    draws = torch.distributions.LogNormal(0.0, 0.8).sample((4000, 3)).double()
    low, high = diagnostics._hdi(draws, 0.94)
    expected = np.stack([az.hdi(draws[:, i].numpy(), hdi_prob=0.94) for i in range(3)])
    np.testing.assert_allclose(np.stack([low.numpy(), high.numpy()], 1), expected, rtol=0, atol=0)
    pyro.clear_param_store()
    x, y = torch.randn(20, 3), torch.randn(20)
    noisy = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian())
    guide = pyro_bbb.MeanFieldGuide(noisy, init_scale=0.5)
    guide(x, y)
    row = diagnostics.parameter_summary(noisy, guide).loc["likelihood.scale"]
    q = guide.site_posteriors()["likelihood.scale"]  # (a Normal pushed into the positive reals: exp of it)
    equal_tailed = [float(q.icdf(torch.tensor(p))) for p in (0.03, 0.97)]
    assert row["hdi_3%"] < equal_tailed[0] and row["hdi_97%"] < equal_tailed[1]  # shifted towards the mode


def test_posterior_to_prior_std_uses_each_layers_prior():
    bnn, guide, _, _ = fitted_3_5_1(priors.FanInNormal(), init_scale=0.1)
    ratios = diagnostics.posterior_to_prior_std(bnn, guide)
    # FanInNormal: prior std 1/sqrt(fan_in); both layers' weights and biases have fan_in 3 and 5
    assert ratios["net.0"] == pytest.approx(0.1 * 3**0.5, rel=1e-4)
    assert ratios["net.2"] == pytest.approx(0.1 * 5**0.5, rel=1e-4)


def test_check_posterior_needs_a_fitted_guide():
    bnn = fitted_3_5_1()[0]
    with pytest.raises(ValueError, match="fit"):
        diagnostics.check_posterior(bnn, pyro_bbb.MeanFieldGuide(bnn))


def test_a_posterior_at_the_scale_mixtures_nearest_normal_sits_on_its_prior():
    """No Normal comes within 0.66 nats of the default mixture: counted from 0, "on prior" could never fire."""
    layer = BayesianLinear(20, 30, prior=priors.ScaleMixtureNormal())
    guide = pyro_bbb.MeanFieldGuide(layer, init_scale=1.0, init_loc_fn=lambda site: torch.zeros(site["fn"].shape()))
    svi = pyro.infer.SVI(layer, guide, pyro.optim.SGD({"lr": 1e-12}), pyro_bbb.ELBO(num_data=4))
    svi.step(torch.randn(4, 20))  # (trained: a step taken, too small to move) every weight at N(0, 1): the slab
    with pytest.warns(diagnostics.PosteriorWarning, match="sits on its prior"):
        report = diagnostics.check_posterior(layer, guide)
    assert report["(root)"]["status"] == "on prior" and report["(root)"]["kl_q99"] < 0.1
    assert report["(root)"]["kl_per_weight"] == pytest.approx(0.665, abs=0.02)  # (the KL itself is unchanged)
    with torch.no_grad():  # the data moved a few weights: 2 nats each above the floor
        pyro.get_param_store()["MeanFieldGuide.locs.weight"].unconstrained()[:2] = 2.0
    assert diagnostics.check_posterior(layer, guide)["(root)"]["status"] == "ok"


def statuses(kl_weight, epochs):
    bnn, guide, _, _ = digits_fit(kl_weight, epochs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = diagnostics.check_posterior(bnn, guide)
    messages = [str(w.message) for w in caught if issubclass(w.category, diagnostics.PosteriorWarning)]
    return {layer: entry["status"] for layer, entry in report.items()}, messages


@pytest.mark.slow
def test_check_posterior_fires_on_an_over_weighted_kl():
    status, messages = statuses(1000.0, 200)
    assert set(status.values()) == {"on prior"}
    assert len(messages) == 2 and "over-weighted" in messages[0] and "nats" in messages[0]


@pytest.mark.slow
def test_check_posterior_fires_on_an_under_weighted_kl():
    status, messages = statuses(1e-6, 100)
    assert set(status.values()) == {"collapsed"}
    assert len(messages) == 2 and "under-weighted" in messages[0]


@pytest.mark.slow
def test_check_posterior_is_silent_on_a_correct_fit():
    status, messages = statuses(1.0, 300)
    assert set(status.values()) == {"ok"} and messages == []


@pytest.mark.parametrize("kl_weight", [1.0, 0.01])
def test_a_collapsed_layer_s_advice_follows_the_weight_it_was_trained_at(kl_weight):
    """"Raise kl_weight towards 1" only where it was below 1: at weight 1 the advice is num_data or training longer."""
    pyro.clear_param_store()
    x, y = torch.randn(30, 3), torch.randn(30)
    bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian())
    guide = pyro_bbb.MeanFieldGuide(bnn, init_scale=1e-6)  # far narrower than the prior, one short epoch
    pyro_bbb.fit(bnn, guide, (x, y), epochs=1, kl_weight=kl_weight, progress=False, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = diagnostics.check_posterior(bnn, guide)
    (message,) = [str(w.message) for w in caught if issubclass(w.category, diagnostics.PosteriorWarning)]
    assert report["net"]["status"] == "collapsed"
    assert ("raise kl_weight towards 1" in message) == (kl_weight < 1)
    assert ("Trained at KL weight 1" in message) == (kl_weight == 1)


def test_summary_by_layer_and_by_parameter():
    from scipy import stats

    bnn, guide, _, _ = fitted_3_5_1(priors.Normal(0.0, 0.7), init_scale=0.2)
    table = diagnostics.summary(bnn, guide)
    q = guide.site_posteriors()
    w0, b0 = q["net.0.weight"], q["net.0.bias"]
    scale = torch.cat([w0.scale.reshape(-1), b0.scale])
    loc = torch.cat([w0.loc.reshape(-1), b0.loc])
    row = table.loc["net.0"]
    assert row["num_weights"] == 20
    assert row["sigma_mean"] == pytest.approx(float(scale.mean()), rel=1e-5)
    assert row["mean_abs_mu"] == pytest.approx(float(loc.abs().mean()), rel=1e-5)
    assert row["prior_sigma"] == pytest.approx(0.7, rel=1e-5)
    assert row["kl"] == pytest.approx(diagnostics.kl_by_layer(bnn, guide)["net.0"], rel=1e-6)
    assert row["snr_q50"] == pytest.approx(float((loc.abs() / scale).median()), rel=0.2)
    per_weight = diagnostics.parameter_summary(bnn, guide)
    entry = per_weight.loc["net.0.weight[1, 2]"]
    z = stats.norm.ppf(0.97)
    m, s = float(w0.loc[1, 2]), float(w0.scale[1, 2])
    assert (entry["mean"], entry["sd"]) == (pytest.approx(m, rel=1e-6), pytest.approx(s, rel=1e-6))
    assert entry["hdi_3%"] == pytest.approx(m - z * s, rel=1e-5) and entry["hdi_97%"] == pytest.approx(m + z * s)
    assert len(per_weight) == 3 * 5 + 5 + 5 + 1


def test_layer_summary_without_tails_is_the_summary_less_its_percentile():
    bnn, guide, _, _ = fitted_3_5_1(priors.Normal(0.0, 0.7), init_scale=0.2)
    full, light = diagnostics.layer_summary(bnn, guide), diagnostics.layer_summary(bnn, guide, tails=False)
    assert full.keys() == light.keys()
    for layer, entry in full.items():
        assert {"kl_q99", "std_ratio_geomean"} <= entry.keys()
        # (without tails: sums of closed forms, no per-weight tensors; the same numbers by another route)
        assert light[layer] == pytest.approx({k: v for k, v in entry.items() if k != "kl_q99"}, rel=1e-6)


def test_layer_summary_of_pruned_weights_is_finite_and_the_same_by_both_routes():
    """Inside guide.pruned(...) a pruned weight's width is 1e-37: the per-weight route (tails=True) squared it to 0
    in float32 and reported an infinite KL, where the summed route (tails=False, float64) gave 763 nats."""
    from pyro_bbb.evaluate.pruning import prune_by_snr

    bnn, guide, _, _ = fitted_3_5_1(priors.Normal(0.0, 0.7), init_scale=0.2)
    pruned, _ = prune_by_snr(guide, 0.5)
    with guide.pruned(pruned.keep_masks):
        full, light = diagnostics.layer_summary(bnn, guide), diagnostics.layer_summary(bnn, guide, tails=False)
    for layer, entry in full.items():
        assert math.isfinite(entry["kl"]) and math.isfinite(entry["kl_q99"])
        assert light[layer] == pytest.approx({k: v for k, v in entry.items() if k != "kl_q99"}, rel=1e-6)


def test_the_summed_route_holds_a_bounded_number_of_widths_at_once(monkeypatch):
    """Each site's width is a new tensor (the param store's transform): the summed route sums its pending sites once
    they reach _JOINED_WEIGHTS weights, instead of holding every site's until the end (a large network's widths all
    at once, beside training's own memory)."""
    calls = []
    sums = diagnostics._site_sums
    monkeypatch.setattr(diagnostics, "_JOINED_WEIGHTS", 8)
    monkeypatch.setattr(diagnostics, "_site_sums", lambda pending: calls.append(
        [loc.numel() for _, loc, *_ in pending]) or sums(pending))
    bnn, guide, _, _ = fitted_3_5_1(priors.Normal(0.0, 0.7))
    light = diagnostics.layer_summary(bnn, guide, tails=False)
    assert [size for call in calls for size in call] == [15, 5, 5, 1]  # every site, once
    assert max(sum(call) for call in calls) <= 8 - 1 + 15  # under the bound, then at most one more site
    for layer, entry in diagnostics.layer_summary(bnn, guide).items():
        assert light[layer] == pytest.approx({k: v for k, v in entry.items() if k != "kl_q99"}, rel=1e-6)


def test_what_fit_records_after_every_epoch_reads_layers_of_two_dtypes():
    """The summed route joins every site's weights into one float64 array: a float64 layer beside a float32 one."""
    from pyro.nn import PyroModule

    class TwoPrecisions(PyroModule):
        def __init__(self):
            super().__init__()
            self.wide = BayesianLinear(3, 4, prior=priors.Normal(0.0, 0.5), dtype=torch.float64)
            self.head = BayesianLinear(4, 2, prior=priors.Normal(0.2, 1.5))

        def forward(self, x):
            return self.head(self.wide(x).float())

    net = TwoPrecisions()
    guide = pyro_bbb.MeanFieldGuide(net, init_scale=0.3)
    guide(torch.randn(5, 3, dtype=torch.float64))
    light = diagnostics.layer_summary(net, guide, tails=False)
    for layer, (m, t) in {"wide": (0.0, 0.5), "head": (0.2, 1.5)}.items():
        posteriors = [q for name, q in guide.site_posteriors().items() if name.startswith(layer + ".")]
        prior = torch.distributions.Normal(torch.tensor(m, dtype=torch.float64), t)
        kl = sum(float(kl_divergence(torch.distributions.Normal(q.loc.double(), q.scale.double()), prior).sum())
                 for q in posteriors)
        assert light[layer]["kl"] == pytest.approx(kl, rel=1e-6)
        assert light[layer]["posterior_std"] == pytest.approx(0.3, rel=1e-6)


@pytest.mark.parametrize("joined", [1 << 20, 16], ids=["sites joined", "a site alone"])
def test_what_fit_records_after_every_epoch_is_each_layers_kl_and_widths_by_hand(joined, monkeypatch):
    monkeypatch.setattr(diagnostics, "_JOINED_WEIGHTS", joined)  # 16: the 15 weights alone, then 5 + 5 + 1 joined
    bnn, guide, _, _ = fitted_3_5_1(priors.Normal(0.3, 0.7), init_scale=0.2)
    with torch.no_grad():
        pyro.param("MeanFieldGuide.locs.net.0.weight").add_(torch.linspace(-1.0, 1.0, 15).reshape(5, 3))
    light = diagnostics.layer_summary(bnn, guide, tails=False)
    for layer in ("net.0", "net.2"):
        posteriors = [q for name, q in guide.site_posteriors().items() if name.startswith(layer + ".")]
        prior = torch.distributions.Normal(torch.tensor(0.3, dtype=torch.float64), 0.7)
        kl = sum(float(kl_divergence(torch.distributions.Normal(q.loc.double(), q.scale.double()), prior).sum())
                 for q in posteriors)
        scales = torch.cat([q.scale.reshape(-1).double() for q in posteriors])
        expected = {"kl": kl, "num_weights": len(scales), "kl_per_weight": kl / len(scales),
                    "posterior_std": float(scales.mean()), "prior_std": 0.7, "std_ratio": float(scales.mean() / 0.7),
                    "std_ratio_geomean": float((scales / 0.7).log().mean().exp())}
        assert light[layer] == pytest.approx(expected, rel=1e-7)  # (the prior's 0.3 and 0.7 in float32)


@pytest.mark.parametrize("normal_part", ["AutoNormal", "MeanFieldGuide"])
def test_a_guide_list_with_a_point_estimate_body_summarises_its_normal_head(normal_part):
    """Pyro's way to make part of a net Bayesian: AutoGuideList([AutoDelta(body), AutoNormal(head)]). The diagnostics
    refused it outright; they now read the head's Normal posteriors (KL against the closed form read off the param
    store), leave the point-estimate body out and name it; a list of point estimates only is still refused."""
    import pyro.poutine as poutine
    from pyro.infer.autoguide import AutoDelta, AutoGuideList, AutoNormal

    pyro.clear_param_store()
    torch.manual_seed(0)
    head_sites = ["net.2.weight", "net.2.bias"]
    net = torch.nn.Sequential(BayesianLinear(3, 8), torch.nn.Tanh(), BayesianLinear(8, 2))
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.5))
    guide = AutoGuideList(bnn)
    guide.append(AutoDelta(poutine.block(bnn, hide=head_sites)))
    make = AutoNormal if normal_part == "AutoNormal" else pyro_bbb.MeanFieldGuide
    guide.append(make(poutine.block(bnn, expose=head_sites), init_scale=0.3))
    x, y = torch.randn(64, 3), torch.randn(64, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no word that the History lacks per-layer columns)
        history = pyro_bbb.fit(bnn, guide, (x, y), epochs=2, progress=False, kl_weight=1)
    store = dict(pyro.get_param_store().named_parameters())
    expected = 0.0
    for site, attr in zip(head_sites, ["weight", "bias"]):
        loc = pyro.param(next(n for n in store if n.endswith(f"locs.{site}"))).detach()
        scale = pyro.param(next(n for n in store if n.endswith(f"scales.{site}"))).detach()
        prior = net[2].prior_distribution(attr).base_dist
        expected += float(kl_divergence(torch.distributions.Normal(loc, scale), prior).sum())
    layers = diagnostics.layer_summary(bnn, guide)
    assert list(layers) == ["net.2"] and layers["net.2"]["num_weights"] == 18
    assert layers["net.2"]["kl"] == pytest.approx(expected, rel=1e-6)
    assert diagnostics.kl_by_layer(bnn, guide)["net.2"] == pytest.approx(expected, rel=1e-6)
    assert history.records[-1]["kl_by_layer"]["net.2"] == pytest.approx(expected, rel=1e-6)
    table = pyro_bbb.summary(bnn, guide)
    assert list(table.index) == ["net.2"] and table.attrs["point_estimates"] == ["net.0.weight", "net.0.bias"]
    rows = diagnostics.parameter_summary(bnn, guide)
    assert len(rows) == 18 and all(index.startswith("net.2.") for index in rows.index)
    assert diagnostics.check_posterior(bnn, guide)["net.2"]["status"] in {"ok", "on prior"}

    points = AutoGuideList(bnn)
    points.append(AutoDelta(bnn))
    points(x, y)
    with pytest.raises(ValueError, match="Normal posterior at some weights.*part of an AutoGuideList"):
        pyro_bbb.summary(bnn, points)


def _list_guide(bnn, body, head):
    import pyro.poutine as poutine
    from pyro.infer.autoguide import AutoGuideList

    head_sites = ["net.2.weight", "net.2.bias"]
    guide = AutoGuideList(bnn)
    guide.append(body(poutine.block(bnn, hide=head_sites)))
    guide.append(head(poutine.block(bnn, expose=head_sites)))
    return guide


def test_a_guide_lists_parts_the_diagnostics_do_not_read_are_named_and_an_untrained_list_is_said_to_be():
    """A body with a joint posterior (AutoDiagonalNormal) is not a point estimate: summary names its sites as not
    summarised and fit says the per-layer columns leave them out; a list whose MeanFieldGuide head never trained is
    'not trained' for check_posterior, not 'collapsed'."""
    from pyro.infer.autoguide import AutoDiagonalNormal

    pyro.clear_param_store()
    torch.manual_seed(0)
    bnn = pyro_bbb.BNN(torch.nn.Sequential(BayesianLinear(3, 8), torch.nn.Tanh(), BayesianLinear(8, 1)),
                       likelihoods.Gaussian(scale=0.5))
    x, y = torch.randn(32, 3), torch.randn(32, 1)
    guide = _list_guide(bnn, AutoDiagonalNormal, lambda model: pyro_bbb.MeanFieldGuide(model, init_scale=1e-4))
    guide(x, y)
    with pytest.warns(diagnostics.PosteriorWarning, match="never trained"):
        report = diagnostics.check_posterior(bnn, guide)
    assert report["net.2"]["status"] == "not trained"
    with pytest.warns(UserWarning, match=r"AutoDiagonalNormal part\(s\) have a posterior these do not read"):
        pyro_bbb.fit(bnn, guide, (x, y), epochs=1, progress=False, kl_weight=1)
    table = pyro_bbb.summary(bnn, guide)
    assert table.attrs["not_summarised"] == ["net.0.weight", "net.0.bias"] and "point_estimates" not in table.attrs


def test_a_pyro_sample_weights_prior_is_read_as_the_model_builds_it_now():
    """A PyroSample weight whose prior scale is learned (a PyroParam): summary and the History's per-layer KL read
    the prior of the guide's first call (scale 5, KL 10.57) where the ELBO and evidence used the learned one (1.55,
    KL 9.12). Also a prior given anew after training."""
    import pyro.distributions as dist
    from pyro.nn import PyroModule, PyroParam, PyroSample

    class Model(PyroModule):
        def __init__(self):
            super().__init__()
            self.prior_scale = PyroParam(torch.tensor(5.0), constraint=dist.constraints.positive)
            self.lin = PyroModule[torch.nn.Linear](2, 1)
            self.lin.weight = PyroSample(lambda lin: dist.Normal(0.0, self.prior_scale).expand([1, 2]).to_event(2))
            self.lin.bias = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))

        def forward(self, x, y=None):
            mean = self.lin(x).squeeze(-1)
            with pyro.plate("data", x.shape[0]):
                pyro.sample("y", dist.Normal(mean, 0.5), obs=y)

    pyro.clear_param_store()
    torch.manual_seed(0)
    x = torch.randn(40, 2)
    y = x @ torch.tensor([1.0, -2.0]) + 0.5 * torch.randn(40)
    model = Model()
    guide = pyro_bbb.MeanFieldGuide(model, init_scale=0.05)
    history = pyro_bbb.fit(model, guide, (x, y), epochs=60, lr=0.05, kl_weight=1.0, progress=False)
    learned = float(model.prior_scale)
    assert learned < 3.0
    exact = pyro_bbb.evidence(model, guide, (x, y), num_draws=2).kl
    table = pyro_bbb.summary(model, guide)
    assert float(table["kl"].sum()) == pytest.approx(exact, rel=1e-4)
    assert history.last["prior_std"]["lin"] == pytest.approx((2 * learned + 1.0) / 3, rel=1e-4)
    model.lin.weight = PyroSample(dist.Normal(0.0, 0.1).expand([1, 2]).to_event(2))  # a prior given anew
    assert float(pyro_bbb.summary(model, guide)["kl"].sum()) == pytest.approx(
        pyro_bbb.evidence(model, guide, (x, y), num_draws=2).kl, rel=1e-4)
