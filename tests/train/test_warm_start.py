"""The MAP warm start: its objective against closed forms, what it trains and leaves alone, and fit's use of it."""

import math
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide import AutoDiagonalNormal, AutoNormal
from pyro.nn import PyroModule, PyroSample

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb.data.batches import Batches
from pyro_bbb.infer.tempering import KLWeightChoice
from pyro_bbb.nn import BayesianLinear
from pyro_bbb.priors import Normal as NormalPrior
from pyro_bbb.train import loop, warm_start
from pyro_bbb.train.selection import SelectKLWeight, validation_split
from pyro_bbb.train.warm_start import can_warm_start, map_loss, map_warm_start, posterior_mean

from ..helpers import params

SIGMA, PRIOR_SCALE = 0.5, 0.7


def linear_regression(n=48, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    y = x @ torch.tensor([1.5, -2.0, 0.5]) + 0.3 + SIGMA * torch.randn(n, generator=g)
    net = BayesianLinear(d, 1, prior=NormalPrior(0.0, PRIOR_SCALE))
    model = pyro_bbb.BNN(net, likelihoods.Gaussian(scale=SIGMA))
    return x, y, model


def ridge(x, y, prior_weight):
    """The MAP of weights and bias under N(0, PRIOR_SCALE^2) priors (weighted) and Gaussian noise SIGMA: a ridge."""
    design = torch.cat([x, torch.ones(len(x), 1)], 1).double()
    precision = design.T @ design / SIGMA**2 + prior_weight * torch.eye(design.shape[1]).double() / PRIOR_SCALE**2
    return torch.linalg.solve(precision, design.T @ y.double() / SIGMA**2)


# -- the objective ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("prior_weight", [1.0, 0.01])
def test_the_loss_is_the_negative_log_joint_per_row_with_the_batch_scaled_by_n_over_b(prior_weight):
    pyro.clear_param_store()
    x, y, model = linear_regression()
    guide = pyro_bbb.MeanFieldGuide(model)
    guide(x, y)
    post = guide.site_posteriors()
    w, b = post["net.weight"].loc, post["net.bias"].loc
    batch = slice(0, 16)
    log_lik = dist.Normal(x[batch] @ w.T.squeeze(-1) + b, SIGMA).log_prob(y[batch]).sum() * 48 / 16
    log_prior = dist.Normal(0.0, PRIOR_SCALE).log_prob(torch.cat([w.flatten(), b])).sum()
    expected = -(log_lik + prior_weight * log_prior) / 48
    got = map_loss(model, guide, x[batch], y[batch], num_data=48, prior_weight=prior_weight)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("prior_weight", [1.0, 0.001])
def test_the_warm_start_reaches_the_closed_form_map_a_ridge_regression(prior_weight):
    pyro.clear_param_store()
    torch.manual_seed(0)
    x, y, model = linear_regression()
    guide = pyro_bbb.MeanFieldGuide(model)
    guide(x, y)
    scales = {k: v.scale.clone() for k, v in guide.site_posteriors().items()}
    map_warm_start(model, guide, Batches((x, y), None, model.likelihood, None), epochs=800, lr=0.03,
                   prior_weight=prior_weight)
    post = guide.site_posteriors()
    got = torch.cat([post["net.weight"].loc.flatten(), post["net.bias"].loc]).double()
    torch.testing.assert_close(got, ridge(x, y, prior_weight), rtol=0, atol=2e-3)
    for name, scale in scales.items():  # the posterior widths are not touched
        torch.testing.assert_close(post[name].scale, scale, rtol=0, atol=0)
    # nothing left for the next step
    assert all(p.unconstrained().grad is None for p in pyro.get_param_store().values())


def test_minibatches_reach_the_same_map_as_the_full_batch():
    pyro.clear_param_store()
    torch.manual_seed(0)
    x, y, model = linear_regression()
    guide = pyro_bbb.MeanFieldGuide(model)
    guide(x, y)
    map_warm_start(model, guide, Batches((x, y), 12, model.likelihood, None), epochs=250, lr=0.02)
    post = guide.site_posteriors()
    got = torch.cat([post["net.weight"].loc.flatten(), post["net.bias"].loc]).double()
    torch.testing.assert_close(got, ridge(x, y, 1.0), rtol=0, atol=2e-2)


# -- the messenger ---------------------------------------------------------------------------------------------------
class Positive(PyroModule):
    """A hand-written model with a constrained latent (a noise scale) beside a real one."""

    def __init__(self):
        super().__init__()
        self.w = PyroSample(dist.Normal(0.0, 1.0).expand([3]).to_event(1))
        self.noise = PyroSample(dist.LogNormal(0.0, 1.0))

    def forward(self, x, y=None):
        w, noise = self.w, self.noise  # drawn outside the data plate: global latents
        with pyro.plate("data", x.shape[0]):
            return pyro.sample("y", dist.Normal(x @ w, noise), obs=y)


@pytest.mark.parametrize("guide_type", [pyro_bbb.MeanFieldGuide, AutoNormal])
def test_posterior_mean_gives_every_site_its_mean_as_handler_and_as_context(guide_type):
    pyro.clear_param_store()
    x, y = torch.randn(8, 3), torch.randn(8)
    guide = guide_type(Positive(), init_scale=0.3)
    guide(x, y)
    loc_w, _ = pyro_bbb.infer.guide.site_loc_scale(guide, "w")
    loc_noise, _ = pyro_bbb.infer.guide.site_loc_scale(guide, "noise")
    with posterior_mean():
        first = guide(x, y)
    second = posterior_mean(guide)(x, y)
    for draw in (first, second):
        torch.testing.assert_close(draw["w"], loc_w)
        torch.testing.assert_close(draw["noise"], loc_noise.exp())  # the positive site's transform of its loc
    assert draw["w"].requires_grad  # differentiable in the loc


def test_a_hand_written_model_with_pyros_autonormal_warm_starts_every_site():
    pyro.clear_param_store()
    torch.manual_seed(0)
    x = torch.randn(200, 3)
    y = x @ torch.tensor([1.0, -1.0, 2.0]) + 0.2 * torch.randn(200)
    model = Positive()
    guide = AutoNormal(model)
    guide(x, y)
    assert can_warm_start(guide)
    widths = {site: pyro_bbb.infer.guide.site_loc_scale(guide, site)[1].detach().clone() for site in ("w", "noise")}
    map_warm_start(model, guide, Batches((x, y), 50, None, None), epochs=300, lr=0.03, prior_weight=1.0)
    w = pyro_bbb.infer.guide.site_loc_scale(guide, "w")[0]
    noise = pyro_bbb.infer.guide.site_loc_scale(guide, "noise")[0].exp()
    torch.testing.assert_close(w, torch.tensor([1.0, -1.0, 2.0]), rtol=0, atol=0.05)
    assert 0.15 < float(noise.detach()) < 0.25
    for site, width in widths.items():  # AutoNormal's scales are not stepped either
        assert torch.equal(pyro_bbb.infer.guide.site_loc_scale(guide, site)[1], width)


def test_deterministic_layers_of_a_partly_bayesian_net_train_with_the_means():
    pyro.clear_param_store()
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = torch.sin(x.sum(-1))
    net = pyro_bbb.bayesianize(torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)),
                               include="2")
    model = pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.1))
    guide = pyro_bbb.MeanFieldGuide(model)
    guide(x, y)
    before = params()
    map_warm_start(model, guide, Batches((x, y), 16, model.likelihood, None), epochs=3, lr=0.01)
    after = params()
    moved = {name for name in before if not torch.equal(before[name], after[name])}
    assert any("scales" in name for name in before) and not any("scales" in name for name in moved)
    assert any("locs" in name for name in moved) and any(name.endswith("0.weight") for name in moved)


def test_module_local_parameters_warm_start_and_keep_the_selection():
    pyro.settings.set(module_local_params=True)  # every guide keeps its own parameters, none in the param store
    try:
        pyro.clear_param_store()
        x, y, model = classification()
        guide = pyro_bbb.MeanFieldGuide(model)
        guide(x, y)
        locs = {k: v.loc.clone() for k, v in guide.site_posteriors().items()}
        map_warm_start(model, guide, Batches((x, y), 16, model.likelihood, None), epochs=1, lr=0.01)
        assert all(not torch.equal(guide.site_posteriors()[k].loc, v) for k, v in locs.items())
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback
            history = pyro_bbb.fit(model, pyro_bbb.MeanFieldGuide(model), (x, y), epochs=4, progress=False, seed=0)
        assert history.kl_weight_choice.chosen_by == "validation"
    finally:
        pyro.settings.set(module_local_params=False)


@pytest.mark.parametrize("path", ["traced", "replayed"])
def test_a_non_finite_loss_raises_before_the_step_that_would_apply_it(monkeypatch, path):
    pyro.clear_param_store()
    x, y, model = linear_regression()
    guide = pyro_bbb.MeanFieldGuide(model)
    guide(x, y)
    before = params()
    if path == "traced":  # the first step (traced): a NaN that reaches every mean's gradient, were it applied
        real = warm_start._traced_map_loss
        monkeypatch.setattr(warm_start, "_traced_map_loss", lambda *a: (real(*a)[0] * math.nan, real(*a)[1]))
    else:  # a later, replayed step
        real = warm_start.ReplayBackend.map_loss
        monkeypatch.setattr(warm_start.ReplayBackend, "map_loss",
                            lambda *a: None if (loss := real(*a)) is None else loss * math.nan)
    with pytest.raises(FloatingPointError, match="lower lr"):
        map_warm_start(model, guide, Batches((x, y), 16, model.likelihood, None), epochs=1)
    after = params()
    if path == "traced":
        assert all(torch.equal(value, before[name]) for name, value in after.items())
    else:  # one step was applied, the NaN's was not
        assert all(torch.isfinite(value).all() for value in after.values())


def partly_bayesian(n=64):
    torch.manual_seed(0)
    x = torch.randn(n, 4)
    net = pyro_bbb.bayesianize(torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)),
                               include="2")
    return x, torch.sin(x.sum(-1)), pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.1))


def learned_noise():
    x, y, model = linear_regression()
    return x, y, pyro_bbb.BNN(model.net, likelihoods.Gaussian())  # a latent noise scale (LogNormal prior)


@pytest.mark.parametrize("make", ["linear_regression", "learned_noise", "classification", "partly_bayesian"])
def test_the_replayed_steps_are_the_traced_ones_bit_for_bit(monkeypatch, make):
    """After one step through Pyro's handlers the warm start replays its loss without them: the same parameters
    after every step as the traced loss gives, bit for bit (a last, partial batch included: 48 or 80 or 64 rows in
    batches of 20)."""
    pyro.clear_param_store()
    x, y, model = globals()[make]()
    guide = pyro_bbb.MeanFieldGuide(model)
    guide(x, y)
    start, before = pyro_bbb.train.selection.ParameterSnapshot(model, guide), params()
    traced_calls = []
    real = warm_start._traced_map_loss
    monkeypatch.setattr(warm_start, "_traced_map_loss", lambda *a: traced_calls.append(1) or real(*a))
    batches = Batches((x, y), 20, model.likelihood, None)
    torch.manual_seed(1)  # the same batches
    map_warm_start(model, guide, batches, epochs=3, lr=0.01, prior_weight=0.1)
    replayed = params() | {k: v.detach().clone() for k, v in model.named_parameters()}
    assert len(traced_calls) == 1  # the rest were replayed
    start.restore()
    monkeypatch.setattr(warm_start.ReplayBackend, "map_loss", lambda *a: None)  # every step traced
    torch.manual_seed(1)
    map_warm_start(model, guide, batches, epochs=3, lr=0.01, prior_weight=0.1)
    traced = params() | {k: v.detach().clone() for k, v in model.named_parameters()}
    assert len(traced_calls) == 1 + 3 * len(list(batches))
    assert replayed.keys() == traced.keys()
    assert all(torch.equal(replayed[name], traced[name]) for name in traced)
    assert any(not torch.equal(traced[name], before[name]) for name in before if "locs" in name)  # it trained


def test_an_empirical_bayes_prior_is_not_replayed_but_traced_every_step(monkeypatch):
    pyro.clear_param_store()
    x, y, _ = linear_regression()
    model = pyro_bbb.BNN(BayesianLinear(3, 1, prior=pyro_bbb.priors.EmpiricalBayesNormal()),
                         likelihoods.Gaussian(scale=SIGMA))
    guide = pyro_bbb.MeanFieldGuide(model)
    guide(x, y)
    traced_calls = []
    real = warm_start._traced_map_loss
    monkeypatch.setattr(warm_start, "_traced_map_loss", lambda *a: traced_calls.append(1) or real(*a))
    batches = Batches((x, y), 16, model.likelihood, None)
    map_warm_start(model, guide, batches, epochs=2, lr=0.01)
    assert len(traced_calls) == 2 * len(list(batches))  # its prior is taken given the posterior: the traced loss


# -- fit's use of it -------------------------------------------------------------------------------------------------
def spy(monkeypatch):
    calls = []
    real = loop.map_warm_start

    def recording(model, guide, batches, **kwargs):
        calls.append({"rows": batches.num_data, "x": batches.x.clone(), **kwargs})
        return real(model, guide, batches, **kwargs)

    monkeypatch.setattr(loop, "map_warm_start", recording)
    return calls


def classification(n=80):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    torch.manual_seed(0)
    net = torch.nn.Sequential(BayesianLinear(4, 16), torch.nn.ReLU(), BayesianLinear(16, 2))
    return x, y, pyro_bbb.BNN(net, likelihoods.Categorical())


def test_fit_auto_warm_starts_on_the_training_part_of_the_split_only(monkeypatch):
    calls = spy(monkeypatch)
    pyro.clear_param_store()
    x, y, model = classification()
    guide = pyro_bbb.MeanFieldGuide(model)
    history = pyro_bbb.fit(model, guide, (x, y), epochs=8, batch_size=16, progress=False, seed=3)
    choice = history.kl_weight_choice
    assert choice.warm_start_epochs == 8 and "after a 8-epoch MAP warm start" in choice.describe()  # (all 8: short)
    assert KLWeightChoice.from_dict(choice.to_dict()) == choice
    old_record = {k: v for k, v in choice.to_dict().items() if k != "warm_start_epochs"}  # a checkpoint from before
    assert KLWeightChoice.from_dict(old_record).warm_start_epochs == 0
    train_rows, held_out = validation_split(y, 0.1, stratify=True, generator=torch.Generator().manual_seed(3))
    assert len(calls) == 1 and calls[0]["rows"] == len(train_rows) == 72
    assert calls[0]["epochs"] == 8 and calls[0]["prior_weight"] == min(SelectKLWeight().candidates)
    seen = {tuple(row.tolist()) for row in calls[0]["x"]}
    assert not seen & {tuple(row.tolist()) for row in x[held_out]}  # the rows that score the weights stay unseen


@pytest.mark.parametrize("optimizer, rate", [(None, 0.003), (pyro_bbb.optim.Adam(lr=0.02), 0.02),
                                             (pyro.optim.Adam({"lr": 0.05}), 0.05)])
def test_the_warm_start_steps_at_the_optimizers_own_rate(monkeypatch, optimizer, rate):
    calls = spy(monkeypatch)
    pyro.clear_param_store()
    x, y, model = classification()
    rate_of_fit = {"lr": 0.003} if optimizer is None else {}  # (an optimizer brings its own: lr beside it is refused)
    pyro_bbb.fit(model, pyro_bbb.MeanFieldGuide(model), (x, y), epochs=4, progress=False, seed=0, optimizer=optimizer,
                 **rate_of_fit)
    assert calls[0]["lr"] == rate


def test_an_empirical_bayes_prior_warm_starts_and_keeps_the_selection():
    pyro.clear_param_store()
    torch.manual_seed(0)
    x, y, _ = classification()
    net = torch.nn.Sequential(BayesianLinear(4, 16, prior=pyro_bbb.priors.EmpiricalBayesNormal()), torch.nn.ReLU(),
                              BayesianLinear(16, 2, prior=pyro_bbb.priors.EmpiricalBayesNormal()))
    model = pyro_bbb.BNN(net, likelihoods.Categorical())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning
        history = pyro_bbb.fit(model, pyro_bbb.MeanFieldGuide(model), (x, y), epochs=8, progress=False, seed=0)
    assert history.kl_weight_choice.chosen_by == "validation" and history.kl_weight_choice.warm_start_epochs == 8


def test_a_model_whose_data_plate_has_its_own_name_warm_starts_and_chooses_as_one_called_data():
    """The warm start scales the model's own plate, whatever it is called: the same choice and posterior."""
    chosen = {}
    for plate in ("data", "rows"):
        pyro.clear_param_store()
        x, y, _ = linear_regression()
        torch.manual_seed(0)
        model = pyro_bbb.BNN(BayesianLinear(3, 1, prior=NormalPrior(0.0, PRIOR_SCALE)),
                             likelihoods.Gaussian(scale=SIGMA), data_plate=plate)
        guide = pyro_bbb.MeanFieldGuide(model)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback warning
            history = pyro_bbb.fit(model, guide, (x, y), epochs=8, batch_size=16, progress=False, seed=0)
        choice = history.kl_weight_choice
        assert choice.chosen_by == "validation" and choice.warm_start_epochs == 8
        chosen[plate] = choice.validation_nll, guide.site_posteriors()["net.weight"].loc
    assert chosen["rows"][0] == chosen["data"][0]
    torch.testing.assert_close(chosen["rows"][1], chosen["data"][1], rtol=0, atol=0)


class WithMaskedSite(Positive):
    """``Positive`` plus, when asked, an impossible observation (log-density -inf) that a mask removes."""

    impossible = False

    def forward(self, x, y=None):
        w, noise = self.w, self.noise
        with pyro.plate("data", x.shape[0]):
            if self.impossible:
                with pyro.poutine.mask(mask=torch.tensor(False)):
                    pyro.sample("impossible", dist.Normal(0.0, 1.0), obs=torch.full((x.shape[0],), math.inf))
            return pyro.sample("y", dist.Normal(x @ w, noise), obs=y)


def test_a_masked_out_impossible_observation_does_not_poison_the_loss():
    pyro.clear_param_store()
    x, y = torch.randn(8, 3), torch.randn(8)
    model = WithMaskedSite()
    guide = pyro_bbb.MeanFieldGuide(model)
    guide(x, y)
    plain = map_loss(model, guide, x, y, num_data=16)
    model.impossible = True
    torch.testing.assert_close(map_loss(model, guide, x, y, num_data=16), plain)


@pytest.mark.parametrize("kl_weight", [1.0, SelectKLWeight(warm_start=0)])
def test_no_warm_start_at_weight_one_or_when_switched_off(monkeypatch, kl_weight):
    calls = spy(monkeypatch)
    pyro.clear_param_store()
    x, y, model = classification()
    history = pyro_bbb.fit(model, pyro_bbb.MeanFieldGuide(model), (x, y), epochs=4, progress=False, seed=0,
                           kl_weight=kl_weight)
    assert calls == [] and history.kl_weight_choice.warm_start_epochs == 0


def test_a_guide_without_per_site_normals_chooses_without_a_warm_start(monkeypatch):
    calls = spy(monkeypatch)
    pyro.clear_param_store()
    x, y, model = classification()
    with pytest.warns(UserWarning, match="no Normal posterior per weight"):
        history = pyro_bbb.fit(model, AutoDiagonalNormal(model), (x, y), epochs=4, progress=False, seed=0)
    assert calls == [] and history.kl_weight_choice.chosen_by == "validation"


def test_a_failing_warm_start_puts_everything_back_and_trains_at_weight_one(monkeypatch):
    pyro.clear_param_store()
    x, y, model = classification()
    guide = pyro_bbb.MeanFieldGuide(model)
    with torch.no_grad():
        guide(x, y)
    before = params()

    def diverging(*args, **kwargs):
        for value in pyro.get_param_store().values():
            value.data.add_(1.0)  # moved, then fails
        raise FloatingPointError("the MAP warm start's loss became nan; lower lr.")

    monkeypatch.setattr(loop, "map_warm_start", diverging)
    seen = {}
    real_fit_train = loop._train

    def first_epoch_params(step, batches, record, epochs, *args, **kwargs):
        seen.update(params())
        return real_fit_train(step, batches, record, epochs, *args, **kwargs)

    monkeypatch.setattr(loop, "_train", first_epoch_params)
    with pytest.warns(UserWarning, match="lower lr.*put back; training at KL weight 1"):
        history = pyro_bbb.fit(model, guide, (x, y), epochs=2, progress=False, seed=0)
    assert history.kl_weight_choice.chosen_by == "fallback" and history.kl_weight_choice.kl_weight == 1.0
    for name, value in before.items():  # the final fit started from the parameters as they were
        assert torch.equal(seen[name], value)


@pytest.mark.parametrize("epochs, expected", [(1, 1), (4, 4), (10, 10), (20, 10), (39, 10), (40, 10), (42, 10),
                                             (50, 12), (100, 25)])
def test_a_short_fit_gets_the_warm_start_of_a_40_epoch_one(epochs, expected):
    """A quarter of the epochs, at least 10 (never more than the fit's own): from 40 epochs on (every benchmark's
    fit) the share alone, as before the minimum."""
    assert SelectKLWeight().warm_start_epochs(epochs) == expected
    plain = SelectKLWeight(min_warm_start_epochs=1)  # the share alone
    assert plain.warm_start_epochs(epochs) == max(1, round(epochs * 0.25))
    assert SelectKLWeight(warm_start=0).warm_start_epochs(epochs) == 0  # off stays off


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "10"])
def test_a_bad_least_warm_start_is_refused(bad):
    with pytest.raises(ValueError, match="min_warm_start_epochs must be a whole number >= 1"):
        SelectKLWeight(min_warm_start_epochs=bad)


@pytest.mark.parametrize("bad", [-0.1, math.inf, math.nan, True, "0.25"])
def test_a_bad_warm_start_share_is_refused(bad):
    with pytest.raises(ValueError, match="warm_start must be a share of the epochs"):
        SelectKLWeight(warm_start=bad)
