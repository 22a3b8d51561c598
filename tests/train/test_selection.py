"""fit(kl_weight="auto"): the split, the rule, the path, and every way it can fall back or fail."""

import math
import signal
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import SVI
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroSample
from pyro.optim import Adam
from torch.utils.data import DataLoader, TensorDataset

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb.infer.schedules import LinearWarmup
from pyro_bbb.infer.tempering import KLWeightChoice, kl_weight_of
from pyro_bbb.nn import BayesianLinear
from pyro_bbb.optim import IVON
from pyro_bbb.train.selection import SelectKLWeight, choose_weight, validation_split, validation_splits

from ..helpers import params, regression_model, small_data


def classification_data(n=240, d=5, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    logits = x[:, :classes] * 3.0
    y = torch.distributions.Categorical(logits=logits).sample()
    return x, y


def classifier(d=5, classes=3):
    torch.manual_seed(0)
    net = torch.nn.Sequential(BayesianLinear(d, 32), torch.nn.ReLU(), BayesianLinear(32, classes))
    return pyro_bbb.BNN(net, likelihoods.Categorical())


def set_up_regression():
    """Data, a set-up regression model and guide, and the parameters as they are before any training."""
    x, y = small_data(64)
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    with torch.no_grad():
        guide(x, y)
    return (x, y), model, guide, params()


def training_sizes(monkeypatch) -> list:
    """The N of every ELBO gradient call from here on, in order."""
    sizes = []
    original = pyro_bbb.ELBO.loss_and_grads

    def spy(self, *args, **kwargs):
        sizes.append(self.num_data)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(pyro_bbb.ELBO, "loss_and_grads", spy)
    return sizes


def assert_params_unchanged(before):
    for name, value in params().items():
        torch.testing.assert_close(value, before[name], rtol=0, atol=0)


# -- the split -------------------------------------------------------------------------------------------------------
def test_a_stratified_split_holds_out_the_share_of_every_class_and_is_a_partition():
    y = torch.cat([torch.zeros(100), torch.ones(50), torch.full((20,), 2.0), torch.full((1,), 3.0)]).long()
    train, held = validation_split(y, 0.1, stratify=True, generator=torch.Generator().manual_seed(0))
    assert sorted(torch.cat([train, held]).tolist()) == list(range(len(y)))  # disjoint, and every row somewhere
    counts = torch.bincount(y[held], minlength=4).tolist()
    assert counts == [10, 5, 2, 0]  # the share of each class; a class of one row stays in training
    again = validation_split(y, 0.1, stratify=True, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again[1], held)  # the same seed, the same split


@pytest.mark.parametrize("shape", ["(N,)", "(N, 1)"])
def test_fit_holds_out_every_classs_share_also_for_labels_of_shape_n_by_1(monkeypatch, shape):
    x = torch.randn(200, 5, generator=torch.Generator().manual_seed(0))
    y = (torch.arange(200) % 10 == 0).long()  # 180 of class 0, 20 of class 1
    labels = y if shape == "(N,)" else y[:, None]
    torch.manual_seed(0)
    net = torch.nn.Sequential(BayesianLinear(5, 8), torch.nn.ReLU(), BayesianLinear(8, 1))
    bnn = pyro_bbb.BNN(net, likelihoods.Bernoulli())
    seen = []
    original = validation_split

    def spy(y, fraction, *, stratify, generator=None):
        train, held = original(y, fraction, stratify=stratify, generator=generator)
        seen.append((stratify, y.reshape(-1)[held].long().bincount(minlength=2).tolist()))
        return train, held

    monkeypatch.setattr("pyro_bbb.train.selection.validation_split", spy)
    pyro_bbb.fit(bnn, pyro_bbb.MeanFieldGuide(bnn), (x, labels.float()), epochs=1, batch_size=64, progress=False,
                 seed=0)
    assert seen == [(True, [18, 2])]  # 10% of each class, whatever the labels' shape


def test_an_unstratified_split_holds_out_the_share_of_the_rows():
    train, held = validation_split(torch.randn(31, 2), 0.1, stratify=False, generator=torch.Generator().manual_seed(1))
    assert len(held) == 3 and len(train) == 28 and set(train.tolist()).isdisjoint(held.tolist())


# -- the rule --------------------------------------------------------------------------------------------------------
def test_the_rule_keeps_the_best_weight_and_weight_one_only_within_a_standard_error():
    g = torch.Generator().manual_seed(0)
    base = -torch.rand(400, generator=g)
    clearly_worse = {1.0: base - 0.5, 0.1: base}
    assert choose_weight(clearly_worse)[0] == 0.1
    noise = 0.05 * torch.randn(400, generator=g)
    noise -= noise.mean()
    as_good = {1.0: base + noise, 0.1: base - noise + 0.001}  # 0.1 better by 0.001 nats, with a large spread
    weight, nll, se = choose_weight(as_good)
    assert weight == 1.0 and nll[1.0] > nll[0.1] and nll[1.0] <= nll[0.1] + se[1.0]
    # between two tempered weights there is no preference: the best NLL wins
    assert choose_weight({1.0: base - 1.0, 0.1: base - 0.001, 0.01: base})[0] == 0.01


def test_a_candidate_with_infinite_or_nan_validation_nll_is_never_chosen():
    good = -torch.rand(50)
    weight, nll, _ = choose_weight({1.0: good, 0.1: torch.full((50,), -math.inf)})
    assert weight == 1.0 and nll[0.1] == math.inf


def test_selection_settings_are_checked_and_weight_one_is_always_a_candidate():
    assert SelectKLWeight(candidates=[0.5]).candidates == (1.0, 0.5)
    for bad in ([0.0], [2.0], [math.nan], ["0.1"]):
        with pytest.raises(ValueError, match=r"in \(0, 1\]"):
            SelectKLWeight(candidates=bad)
    with pytest.raises(ValueError, match="validation_fraction"):
        SelectKLWeight(validation_fraction=0.7)
    with pytest.raises(ValueError, match="kl_weight must be \"auto\""):
        pyro_bbb.fit(regression_model(), pyro_bbb.MeanFieldGuide(regression_model()), small_data(), epochs=1,
                     kl_weight="automatic", progress=False)


def test_the_final_fits_share_of_the_epochs_is_checked_and_rounded_to_at_least_one():
    for bad in (0, -0.5, math.inf, math.nan, True, "1"):
        with pytest.raises(ValueError, match="final_epochs"):
            SelectKLWeight(final_epochs=bad)
    assert SelectKLWeight(final_epochs=0.5).final_fit_epochs(9) == 4  # (round half to even)
    assert SelectKLWeight(final_epochs=0.01).final_fit_epochs(10) == 1
    assert SelectKLWeight(final_epochs=2).final_fit_epochs(10) == 20


# -- fit ---------------------------------------------------------------------------------------------------------------
def test_fit_chooses_a_weight_on_a_held_out_split_and_then_trains_on_all_the_data(monkeypatch):
    x, y = classification_data()
    bnn = classifier()
    guide = pyro_bbb.MeanFieldGuide(bnn)
    sizes = training_sizes(monkeypatch)
    history = pyro_bbb.fit(bnn, guide, (x, y), epochs=8, batch_size=64, lr=1e-2, progress=False, seed=0)
    choice = history.kl_weight_choice
    assert choice.chosen_by == "validation" and choice.num_validation == 24  # 10% of the rows, every class's share
    assert sorted(choice.validation_nll) == [0.01, 0.1, 1.0]
    assert all(math.isfinite(v) for v in choice.validation_nll.values())
    best = min(choice.validation_nll, key=choice.validation_nll.get)
    assert choice.kl_weight in (best, 1.0)
    # the path trained on the other rows (1 epoch at each of the 3 weights: 4 batches each; the MAP warm start before
    # it is not an ELBO), the final fit on all 240 for 8 epochs; the records are the final fit's, at the chosen weight
    assert sizes == [240 - choice.num_validation] * 12 + [240] * 32
    assert len(history) == 8 and {r["kl_weight"] for r in history.records} == {choice.kl_weight}
    assert {r["num_data"] for r in history.records} == {240}
    assert kl_weight_of(guide) is choice
    assert "chosen by validation" in repr(history) and history.to_dict()["kl_weight_choice"]["kl_weight"] == \
        choice.kl_weight


@pytest.mark.parametrize("lr_final", [None, 1e-3])
def test_the_final_fit_trains_its_share_of_the_epochs_from_the_chosen_candidate(monkeypatch, lr_final):
    x, y = classification_data()
    bnn = classifier()
    guide = pyro_bbb.MeanFieldGuide(bnn)
    sizes = training_sizes(monkeypatch)
    rates = []
    set_rate = pyro_bbb.optim.Adam.set_learning_rate
    monkeypatch.setattr(pyro_bbb.optim.Adam, "set_learning_rate", lambda self, lr: (rates.append(lr),
                                                                                     set_rate(self, lr)))
    history = pyro_bbb.fit(bnn, guide, (x, y), epochs=8, batch_size=64, lr=1e-2, lr_final=lr_final, progress=False,
                           seed=0, kl_weight=SelectKLWeight(final_epochs=0.5))
    assert history.kl_weight_choice.chosen_by == "validation"
    assert sizes == [216] * 12 + [240] * 16 and len(history) == 4  # the path as before, then 4 epochs, not 8
    if lr_final is not None:  # the schedule runs over the final fit's own 4 epochs, to lr_final at its last
        final = rates[-5:-1]  # (then fit gives the optimizer back the rate it was given)
        assert final[0] == pytest.approx(1e-2) and final[-1] == pytest.approx(1e-3) and rates[-1] == 1e-2


def test_a_fit_that_cannot_choose_trains_all_its_epochs_whatever_the_final_share(recwarn):
    x, y = small_data(64)
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    data = DataLoader([(xi, yi) for xi, yi in zip(x, y)], batch_size=16)
    history = pyro_bbb.fit(model, guide, data, epochs=4, progress=False, kl_weight=SelectKLWeight(final_epochs=0.5))
    assert history.kl_weight_choice.chosen_by == "fallback" and len(history) == 4


def test_a_guide_trained_before_on_these_rows_trains_on_at_its_weight_and_says_why(monkeypatch, tmp_path):
    """fit's default "auto" on a guide whose weight was chosen by validation (fitting again trains longer; also after
    save/load), or that an earlier fit trained on most of these rows: a selection would score the candidates on rows
    it has seen, so it trains on at that weight with a warning naming the fix. An explicit SelectKLWeight() chooses
    again."""
    x, y = classification_data()
    bnn = classifier()
    guide = pyro_bbb.MeanFieldGuide(bnn)
    chosen = pyro_bbb.fit(bnn, guide, (x, y), epochs=2, batch_size=64, progress=False, seed=0).kl_weight_choice
    assert chosen.chosen_by == "validation"
    sizes = training_sizes(monkeypatch)
    with pytest.warns(UserWarning, match=r"did not choose the KL weight again: its KL weight was chosen by validation "
                                         r"before.*kl_weight=pyro_bbb\.train\.SelectKLWeight\(\)"):
        again = pyro_bbb.fit(bnn, guide, (x, y), epochs=2, batch_size=64, progress=False, seed=0).kl_weight_choice
    assert sizes == [240] * 8  # no path: the final fit alone, on all the rows
    assert again.kl_weight == chosen.kl_weight and again.validation_nll == chosen.validation_nll
    assert "trained on at it by a later fit" in again.describe() and kl_weight_of(guide) is again
    path = tmp_path / "trained.pt"
    pyro_bbb.save(path, bnn, guide)
    pyro.clear_param_store()
    bnn_b = classifier()
    loaded = pyro_bbb.MeanFieldGuide(bnn_b)
    pyro_bbb.load(path, bnn_b, loaded)
    with pytest.warns(UserWarning, match="chosen by validation before"):  # the checkpoint's rows are not known
        assert pyro_bbb.fit(bnn_b, loaded, (x, y), epochs=1, batch_size=64, progress=False,
                            seed=0).kl_weight_choice.kl_weight == chosen.kl_weight
    with pytest.warns(UserWarning, match="chosen by validation before") as caught:  # also from a DataLoader that
        unread = DataLoader([(xi, yi) for xi, yi in zip(x, y)], batch_size=64)  # cannot be split (it fell back to 1)
        history = pyro_bbb.fit(bnn_b, loaded, unread, epochs=1, progress=False, seed=0)
    assert history.kl_weight_choice.kl_weight == chosen.kl_weight and len(caught) == 1  # (no "pass tensors" word)
    sizes.clear()
    with warnings.catch_warnings():  # asked for explicitly: chosen again
        warnings.simplefilter("error")
        explicit = pyro_bbb.fit(bnn_b, loaded, (x, y), epochs=1, batch_size=64, progress=False, seed=0,
                                kl_weight=SelectKLWeight()).kl_weight_choice
    assert explicit.chosen_by == "validation" and not explicit.reason and 216 in sizes

    # an earlier fit at a weight of one's own, on half of these rows
    pyro.clear_param_store()
    bnn_c = classifier()
    own = pyro_bbb.MeanFieldGuide(bnn_c)
    pyro_bbb.fit(bnn_c, own, (x[:120], y[:120]), epochs=2, batch_size=64, progress=False, seed=0, kl_weight=0.1)
    sizes.clear()
    with pytest.warns(UserWarning, match=r"an earlier fit trained it on 50% of these rows.*KL weight 0\.1"):
        half = pyro_bbb.fit(bnn_c, own, (x, y), epochs=2, batch_size=64, progress=False, seed=0).kl_weight_choice
    assert (half.chosen_by, half.kl_weight, sizes) == ("fallback", 0.1, [240] * 8)


def test_a_second_auto_fit_checks_its_arguments_before_it_warns_and_fingerprints_no_rows_it_need_not(monkeypatch):
    """A weight chosen by validation decides alone (the rows are not hashed, O(N) on a large set); a bad
    ``early_stopping`` is refused before the "did not choose again" warning, which would otherwise precede the error."""
    import pyro_bbb.train.loop as loop

    x, y = classification_data()
    bnn = classifier()
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (x, y), epochs=1, batch_size=64, progress=False, seed=0)
    monkeypatch.setattr(loop, "fraction_seen_in_training", lambda *a: pytest.fail("fingerprinted the rows"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError, match="early_stopping must be a pyro_bbb.EarlyStopping"):
            pyro_bbb.fit(bnn, guide, (x, y), epochs=1, batch_size=64, progress=False, early_stopping=20)
    with pytest.warns(UserWarning, match="chosen by validation before"):
        pyro_bbb.fit(bnn, guide, (x, y), epochs=1, batch_size=64, progress=False, seed=0)


@pytest.mark.parametrize("before", ["a fit on other rows", "a fit put back by its callback's error",
                                    "a loop of one's own", "a KL warm-up's first step"])
def test_a_guide_not_trained_on_these_rows_chooses(before):
    """Rows an earlier fit did not train on, a fit that put the parameters back (it trained nothing), a user's own
    loop at a weight of theirs (its rows unknown), a warm-up's first step (weight 0): "auto" chooses as for a new
    guide."""
    x, y = classification_data()
    bnn = classifier()
    guide = pyro_bbb.MeanFieldGuide(bnn)
    if before == "a fit on other rows":
        pyro_bbb.fit(bnn, guide, (x[:120], y[:120]), epochs=1, batch_size=64, progress=False, kl_weight=1)
    elif before == "a fit put back by its callback's error":
        def failing(epoch, history):
            raise ValueError("my callback failed")

        with pytest.raises(ValueError, match="my callback failed"):
            pyro_bbb.fit(bnn, guide, (x, y), epochs=1, batch_size=64, progress=False, kl_weight=0.1,
                         callbacks=[failing])
    else:
        weight = 0.5 if before == "a loop of one's own" else LinearWarmup(100)
        SVI(bnn, guide, Adam({"lr": 1e-3}), pyro_bbb.ELBO(num_data=240, kl_weight=weight)).step(x[:64], y[:64])
    rows = slice(120, None) if before == "a fit on other rows" else slice(None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        choice = pyro_bbb.fit(bnn, guide, (x[rows], y[rows]), epochs=1, batch_size=64, progress=False,
                              seed=0).kl_weight_choice
    assert choice.chosen_by == "validation"


def test_the_same_seed_gives_the_same_choice_and_the_same_parameters():
    x, y = classification_data()
    results = []
    for _ in range(2):
        pyro.clear_param_store()
        bnn = classifier()
        history = pyro_bbb.fit(bnn, pyro_bbb.MeanFieldGuide(bnn), (x, y), epochs=4, batch_size=64, progress=False,
                               seed=3)
        results.append((history.kl_weight_choice, params()))
    assert results[0][0] == results[1][0]
    for name, value in results[0][1].items():
        torch.testing.assert_close(value, results[1][1][name], rtol=0, atol=0)


def test_kl_weight_one_is_the_bayes_posterior_and_reproduces_a_plain_training_run():
    x, y = small_data(64)
    runs = []
    for kl_weight in (1, 1.0):
        pyro.clear_param_store()
        torch.manual_seed(0)
        model = regression_model()
        history = pyro_bbb.fit(model, pyro_bbb.MeanFieldGuide(model), (x, y), epochs=3, batch_size=16,
                               kl_weight=kl_weight, progress=False, seed=0)
        runs.append((history, params()))
    # a hand-written loop at weight 1: the same numbers
    pyro.clear_param_store()
    torch.manual_seed(0)
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    pyro.set_rng_seed(0)
    svi = pyro.infer.SVI(model, guide, pyro_bbb.optim.Adam(lr=1e-3), pyro_bbb.ELBO(num_data=64))
    from pyro_bbb.data.batches import Batches

    for _ in range(3):
        for xb, yb in Batches((x, y), 16, None, None):
            svi.step(xb, yb)
    for history, fitted in runs:
        assert history.kl_weight_choice.chosen_by == "user" and not history.kl_weight_choice.tempered
        for name, value in params().items():
            torch.testing.assert_close(fitted[name], value, rtol=0, atol=0)


@pytest.mark.parametrize("how", ["dataloader", "ivon", "tiny"])
def test_where_selection_cannot_run_fit_trains_at_weight_one_and_says_why(how, recwarn):
    x, y = small_data(64) if how != "tiny" else small_data(12)
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    options = {}
    data = (x, y)
    if how == "dataloader":  # a dataset fit cannot read without iterating it (any Dataset but a TensorDataset)
        data = DataLoader([(xi, yi) for xi, yi in zip(x, y)], batch_size=16)
    if how == "ivon":
        options = {"optimizer": IVON(guide, num_data=64)}
    history = pyro_bbb.fit(model, guide, data, epochs=2, progress=False, **options)
    choice = history.kl_weight_choice
    assert choice.chosen_by == "fallback" and choice.kl_weight == 1.0 and choice.reason
    assert {"dataloader": "DataLoader", "ivon": "IVON", "tiny": "too few"}[how] in choice.reason
    assert "selection not run" in choice.describe()
    # a word where the default could not do its job; none for IVON, whose weight is the user's own ess
    said = [str(w.message) for w in recwarn if "did not choose the KL weight" in str(w.message)]
    assert len(said) == (how != "ivon") and all(choice.reason.rstrip(".") in text for text in said)
    assert all(w.filename == __file__ for w in recwarn if "did not choose" in str(w.message))  # points at fit's call
    recwarn.clear()
    pyro_bbb.fit(model, guide, data, epochs=1, progress=False, kl_weight=1.0, **options)
    assert not [w for w in recwarn if "did not choose" in str(w.message)]  # kl_weight=1 says so: silent


class FullPlate(PyroModule):
    """A hand-written model with a latent per datum (inside its data plate, which is the whole batch): its guide has a
    parameter per training row, so it cannot follow a split of the rows."""

    def __init__(self):
        super().__init__()
        self.w = PyroSample(dist.Normal(0.0, 1.0).expand([3]).to_event(1))

    def forward(self, x, y=None):
        with pyro.plate("data", x.shape[0]):
            return pyro.sample("y", dist.Normal((x * self.w).sum(-1), 0.5), obs=y)


def test_a_model_the_split_breaks_trains_at_weight_one_with_a_warning_and_nothing_lost():
    x = torch.randn(40, 3)
    y = x @ torch.tensor([1.0, -1.0, 0.5]) + 0.5 * torch.randn(40)
    model = FullPlate()
    guide = pyro_bbb.MeanFieldGuide(model)
    with pytest.warns(UserWarning, match="put back; training at KL weight 1"):
        history = pyro_bbb.fit(model, guide, (x, y), epochs=100, lr=0.05, progress=False, seed=0)
    assert history.kl_weight_choice.chosen_by == "fallback" and "36 of the 40 rows" in history.kl_weight_choice.reason
    assert "\n" not in history.kl_weight_choice.reason  # one line, without Pyro's shape table
    assert guide.site_posteriors()["w"].loc.shape == (40, 3) and len(history) == 100  # trained on all the rows
    assert history["nll"][-1] < 0.5 * history["nll"][0]


class SubsamplesItsRows(PyroModule):
    """A hand-written model that draws its own minibatch from the 40 rows it must be given (an IndexError on fewer)
    or adds a per-row offset of 40 (a RuntimeError of torch on fewer): the split breaks it, all the data does not."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.w = PyroSample(dist.Normal(0.0, 1.0).expand([3]).to_event(1))
        self.offset = torch.nn.Parameter(torch.zeros(40))

    def forward(self, x, y=None):
        mean = x @ self.w
        if self.how == "index":
            with pyro.plate("data", 40, subsample=torch.arange(32, 40)) as idx:  # (its last rows, say)
                return pyro.sample("obs", dist.Normal(mean[..., idx], 0.5), obs=None if y is None else y[idx])
        with pyro.plate("data", x.shape[0]):
            return pyro.sample("obs", dist.Normal(mean + self.offset, 0.5), obs=y)


@pytest.mark.parametrize("how", ["index", "offset"])
def test_a_model_the_split_breaks_with_an_index_or_torch_error_falls_back_with_a_warning(how):
    pyro.clear_param_store()
    torch.manual_seed(0)
    x = torch.randn(40, 3)
    y = x @ torch.tensor([1.0, -1.0, 0.5]) + 0.5 * torch.randn(40)
    model = SubsamplesItsRows(how)
    guide = AutoNormal(model)
    with pytest.warns(UserWarning, match="put back; training at KL weight 1"):
        history = pyro_bbb.fit(model, guide, (x, y), epochs=30, lr=0.05, progress=False, seed=0)
    assert history.kl_weight_choice.chosen_by == "fallback" and "36 of the 40 rows" in history.kl_weight_choice.reason
    assert len(history) == 30 and history["loss"][-1] < history["loss"][0]


def test_a_model_that_fails_on_all_the_data_raises_its_error_at_once_without_a_fallback_warning():
    """An error of the model or the estimator, not of the split (Flipout needs a Bayesian layer's operation), is
    raised as ``kl_weight=1`` raises it, with the parameters as they were; no warning promises a fallback first."""
    x = torch.randn(40, 3)
    y = x @ torch.tensor([1.0, -1.0, 0.5]) + 0.5 * torch.randn(40)
    model = FullPlate()
    guide = pyro_bbb.MeanFieldGuide(model)
    guide(x, y)
    before = {name: value.detach().clone() for name, value in pyro.get_param_store().items()}
    for kl_weight in ("auto", 1):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(ValueError, match=r"no Bayesian layer operation for the weight sites \['w'\]"):
                pyro_bbb.fit(model, guide, (x, y), epochs=5, estimator="flipout", progress=False, kl_weight=kl_weight)
        assert all(torch.equal(before[name], value) for name, value in pyro.get_param_store().items())


def test_ctrl_c_while_choosing_returns_an_interrupted_history_with_the_parameters_as_they_were():
    (x, y), model, guide, before = set_up_regression()
    calls = []

    class Interrupting(torch.nn.Module):
        def forward(self, h):
            calls.append(1)
            if len(calls) == 4:
                signal.raise_signal(signal.SIGINT)
            return h

    model.net.insert(1, Interrupting())
    # the 4th forward is in the MAP warm start, where Ctrl-C is Python's KeyboardInterrupt at once; it is honoured
    # also in a process started with SIGINT ignored (a background job), as the path and the final fit honour it
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        history = pyro_bbb.fit(model, guide, (x, y), epochs=10, batch_size=16, progress=False, seed=0)
        after = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert history.interrupted and len(history) == 0
    assert history.kl_weight_choice.reason.startswith("interrupted")
    assert_params_unchanged(before)
    assert after is signal.SIG_IGN  # fit put the process's own handling back


def test_an_error_in_the_final_fit_puts_back_the_parameters_of_the_start_of_fit():
    (x, y), model, guide, before = set_up_regression()
    def failing(epoch, history):  # (an error of the final fit: callbacks run there only)
        raise ValueError("my callback failed")

    with pytest.raises(ValueError, match="my callback failed"):
        pyro_bbb.fit(model, guide, (x, y), epochs=3, batch_size=16, progress=False, callbacks=[failing])
    assert_params_unchanged(before)


def test_a_progress_bar_shows_the_candidates_while_choosing_and_a_log_gets_a_line_each(capsys, monkeypatch):
    x, y = classification_data()
    bnn = classifier()
    monkeypatch.setattr("pyro_bbb.train.loop._live_display", lambda: True)  # as in a terminal
    pyro_bbb.fit(bnn, pyro_bbb.MeanFieldGuide(bnn), (x, y), epochs=1, batch_size=64, seed=0)
    err = capsys.readouterr().err
    assert "choosing kl_weight" in err and "MAP warm start, 1 epoch" in err and "0.01=" in err
    monkeypatch.undo()  # captured output is not a terminal: one line per candidate, no carriage returns
    pyro.clear_param_store()
    bnn = classifier()
    pyro_bbb.fit(bnn, pyro_bbb.MeanFieldGuide(bnn), (x, y), epochs=2, batch_size=64, seed=0)
    lines = capsys.readouterr().err.splitlines()
    assert "\r" not in "".join(lines)
    assert sum(line.startswith("choosing kl_weight: validation NLL") for line in lines) == 3
    assert sum(line.startswith("choosing kl_weight: MAP warm start") for line in lines) == 1


@pytest.mark.parametrize("kl_weight", [SelectKLWeight(candidates=(0.01,)), 0.01, 1.0], ids=["chosen", "given", "bayes"])
def test_the_tempering_is_shown_wherever_the_posterior_is(tmp_path, kl_weight, monkeypatch):
    if isinstance(kl_weight, SelectKLWeight):  # the rule is tested above; here the tempered choice's every display
        rule = pyro_bbb.train.selection.choose_weight
        monkeypatch.setattr("pyro_bbb.train.loop.choose_weight",
                            lambda scores: (0.01,) + tuple(rule(scores)[1:]))
    x, y = classification_data()
    bnn = classifier()
    guide = pyro_bbb.MeanFieldGuide(bnn)
    history = pyro_bbb.fit(bnn, guide, (x, y), epochs=8, batch_size=64, lr=1e-2, progress=False, seed=0,
                           kl_weight=kl_weight)
    choice = history.kl_weight_choice
    assert choice.tempered == (kl_weight != 1.0)  # both branches of every display below are exercised
    table = pyro_bbb.summary(bnn, guide)
    assert set(table["kl_weight"]) == {choice.kl_weight} and table.attrs["kl_weight"] is choice
    candidates = [column for column in table.columns if column.startswith("val_nll@")]  # what it was chosen on
    assert candidates == ([f"val_nll@{w:g}" for w in (1.0, 0.01)] if choice.chosen_by == "validation" else [])
    assert all(set(table[f"val_nll@{w:g}"]) == {nll} for w, nll in choice.validation_nll.items())
    assert "val_nll@0.01" in str(table) or choice.chosen_by != "validation"
    assert pyro_bbb.evaluate.diagnostics.parameter_summary(bnn, guide).attrs["kl_weight"] is choice
    figure = pyro_bbb.evaluate.plots.plot_std_ratio(bnn, guide)
    title = figure._suptitle.get_text() if figure._suptitle is not None else ""
    assert ("tempered" in title) == choice.tempered
    assert ("chosen by validation NLL (" in repr(history)) == (choice.chosen_by == "validation")
    idata = pyro_bbb.evaluate.to_inference_data(bnn, guide, x[:10], y[:10], num_samples=5, container="DataTree")
    assert idata["posterior"].attrs["kl_weight"] == choice.kl_weight
    assert idata["posterior"].attrs["tempered_posterior"] == int(choice.tempered)
    result = pyro_bbb.evidence(bnn, guide, (x, y), num_draws=4)
    assert result.trained_kl_weight == choice.kl_weight
    assert ("tempered" in str(result)) == choice.tempered
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = pyro_bbb.evaluate.diagnostics.check_posterior(bnn, guide)
    assert all(entry["kl_weight"] == choice.kl_weight for entry in report.values())
    path = tmp_path / "bnn.pt"
    pyro_bbb.save(path, bnn, guide)
    pyro.clear_param_store()
    bnn2 = classifier()
    guide2 = pyro_bbb.load(path, bnn2, pyro_bbb.MeanFieldGuide(bnn2))
    assert kl_weight_of(guide2) == choice


def test_a_tempered_posterior_that_looks_collapsed_is_named_as_tempered():
    x, y = classification_data()
    bnn = classifier()
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (x, y), epochs=1, batch_size=64, progress=False, seed=0, kl_weight=1e-6)
    with pytest.warns(pyro_bbb.evaluate.diagnostics.PosteriorWarning, match="trained at KL weight 1e-06"):
        pyro_bbb.evaluate.diagnostics.check_posterior(bnn, guide, collapsed_std_ratio=10.0)


def test_lightning_and_a_plain_elbo_refuse_auto_with_the_fix():
    with pytest.raises(ValueError, match="runs in pyro_bbb.fit only"):
        pyro_bbb.ELBO(num_data=10, kl_weight="auto")


def test_with_ivon_auto_trains_at_the_weight_its_ess_sets():
    x, y = small_data(64)
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    history = pyro_bbb.fit(model, guide, (x, y), epochs=2, progress=False,
                           optimizer=IVON(guide, num_data=64, ess=640))
    assert history.kl_weight_choice.kl_weight == pytest.approx(0.1) and history.last["kl_weight"] == pytest.approx(0.1)
    assert "ess" in history.kl_weight_choice.reason


def test_a_checkpoint_with_a_damaged_kl_weight_record_is_refused_with_nothing_changed(tmp_path):
    x, y = classification_data()
    bnn = classifier()
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (x, y), epochs=1, batch_size=64, progress=False, seed=0, kl_weight=0.1)
    path = tmp_path / "bnn.pt"
    pyro_bbb.save(path, bnn, guide)
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["kl_weight_choice"] = {"weight": 0.1}
    torch.save(checkpoint, path)
    before = params()
    with pytest.raises(ValueError, match="'kl_weight'"):
        pyro_bbb.load(path, bnn, guide)
    assert_params_unchanged(before)
    assert kl_weight_of(guide).kl_weight == 0.1


def test_the_split_rounds_by_largest_remainder_and_holds_out_small_classes_first():
    y = torch.arange(10).repeat_interleave(4)  # 10 classes of 4 rows: round(0.1 * 40) = 4 rows, from 4 classes
    train, held = validation_split(y, 0.1, stratify=True, generator=torch.Generator().manual_seed(0))
    assert len(held) == 4 and len(set(y[held].tolist())) == 4
    y = torch.cat([torch.zeros(95), torch.ones(5)]).long()  # 95 / 5: the minority class is held out too
    train, held = validation_split(y, 0.1, stratify=True, generator=torch.Generator().manual_seed(0))
    assert len(held) == 10 and 1 in y[held].tolist() and 1 in y[train].tolist()


def test_a_nan_score_is_never_the_best():
    weight, nll, _ = choose_weight({1.0: torch.tensor([math.nan, -1.0]), 0.1: torch.tensor([-0.1, -0.1])})
    assert weight == 0.1 and nll[1.0] == math.inf


def test_a_pyro_optimizers_state_is_put_back_by_the_snapshot():
    from pyro_bbb.train.selection import ParameterSnapshot

    x, y = small_data(64)
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    optimizer = pyro.optim.Adam({"lr": 1e-2})
    svi = pyro.infer.SVI(model, guide, optimizer, pyro_bbb.ELBO(num_data=64))
    svi.step(x, y)
    snapshot = ParameterSnapshot(model, guide, optimizer=optimizer)
    kept = {name: {k: v.clone() if torch.is_tensor(v) else v for k, v in state["state"][0].items()}
            for name, state in optimizer.get_state().items()}
    for _ in range(3):
        svi.step(x, y)
    snapshot.restore()
    svi.step(x, y)  # the torch optimizers are put back with their state: step 2 of Adam, not step 5
    for name, state in optimizer.get_state().items():
        assert int(state["state"][0]["step"]) == int(kept[name]["step"]) + 1


@pytest.mark.parametrize("optimizer", ["pyro.optim.Adam", "default"])
@pytest.mark.parametrize("deterministic_layer", [False, True])
def test_module_local_parameters_choose_and_train_as_with_the_global_store(optimizer, deterministic_layer):
    """Pyro's ``get_state`` keys a Pyro optimizer's states by the param store's names, which module-local parameters
    do not have (all ``None``: restoring them loaded one parameter's Adam state into another's, a shape error in the
    final fit); the snapshot keys them by parameter: the same choice and the same posterior as with the store. The
    default Adam's ``get_state`` lost them too (the final fit restarted their moments: weights 0.009 off), and a
    deterministic layer's own ``nn.Parameter`` (no ``unconstrained()`` back-reference) was an AttributeError in fit."""
    x, y = classification_data()
    runs = []
    for local in (False, True):
        pyro.clear_param_store()
        pyro.settings.set(module_local_params=local)
        try:
            torch.manual_seed(0)
            head = torch.nn.Linear(32, 3) if deterministic_layer else BayesianLinear(32, 3)
            bnn = pyro_bbb.BNN(torch.nn.Sequential(BayesianLinear(5, 32), torch.nn.ReLU(), head),
                               likelihoods.Categorical())
            guide = pyro_bbb.MeanFieldGuide(bnn)
            history = pyro_bbb.fit(bnn, guide, (x, y), epochs=8, progress=False, seed=0,
                                   optimizer=pyro.optim.Adam({"lr": 1e-3}) if optimizer != "default" else None)
            runs.append((history.kl_weight_choice, {k: v.detach().clone() for k, v in
                                                    [*guide.named_parameters(), *head.named_parameters()]}))
        finally:
            pyro.settings.set(module_local_params=False)
    (store_choice, store_params), (local_choice, local_params) = runs
    assert store_choice.chosen_by == local_choice.chosen_by == "validation"
    assert local_choice.validation_nll == store_choice.validation_nll
    assert local_params.keys() == store_params.keys()
    assert all(torch.equal(local_params[k], store_params[k]) for k in store_params)


def test_a_model_without_latent_weights_skips_the_selection():
    x, y = classification_data()
    torch.manual_seed(0)
    bnn = pyro_bbb.BNN(torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)),
                       likelihoods.Categorical())
    sizes = []
    original = pyro_bbb.ELBO.loss_and_grads

    def spy(self, *args, **kwargs):
        sizes.append(self.num_data)
        return original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pyro_bbb.ELBO, "loss_and_grads", spy)
        history = pyro_bbb.fit(bnn, pyro_bbb.MeanFieldGuide(bnn), (x, y), epochs=2, batch_size=64, progress=False)
    assert history.kl_weight_choice.chosen_by == "fallback" and "no latent weights" in history.kl_weight_choice.reason
    assert sizes == [240] * 8  # no path: only the fit on all the data


def test_the_snapshot_puts_back_module_local_parameters():
    from pyro_bbb.train.selection import ParameterSnapshot

    pyro.settings.set(module_local_params=True)  # the guide's parameters live in the module, none in the param store
    try:
        pyro.clear_param_store()
        x, y = small_data(64)
        model = regression_model()
        guide = pyro_bbb.MeanFieldGuide(model)
        guide(x, y)
        assert len(pyro.get_param_store().keys()) == 0 and len(list(guide.parameters())) > 0
        kept = {name: param.detach().clone() for name, param in guide.named_parameters()}
        snapshot = ParameterSnapshot(model, guide)
        with torch.no_grad():
            for param in guide.parameters():
                param.add_(1.0)
        snapshot.restore()
        assert all(torch.equal(param, kept[name]) for name, param in guide.named_parameters())
    finally:
        pyro.settings.set(module_local_params=False)


def test_a_point_estimate_guide_is_recorded_as_one_not_as_a_tempered_posterior(tmp_path):
    """AutoDelta's "KL" is the prior's negative log density: the weight sets the prior's strength for a MAP estimate."""
    from pyro.infer.autoguide import AutoDelta

    x, y = classification_data()
    bnn = classifier()
    guide = AutoDelta(bnn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (no per-layer history for a point estimate)
        history = pyro_bbb.fit(bnn, guide, (x, y), epochs=2, batch_size=64, progress=False, seed=0, kl_weight=0.1)
    choice = history.kl_weight_choice
    assert choice.point_estimate and kl_weight_of(guide) == choice
    assert choice.describe() == "KL weight 0.1 (given): a MAP point estimate, prior weighted by 0.1"
    assert "posterior" not in choice.describe()
    assert pyro_bbb.infer.tempering.KLWeightChoice.from_dict(choice.to_dict()) == choice


def test_a_dataloader_over_tensors_chooses_as_the_tensors_do_and_trains_on_the_loader(monkeypatch):
    """A DataLoader whose rows can be read (a TensorDataset, shuffled or not): the same held-out rows and path as the
    tensors with the loader's batch size (the scores differ only by the draws: the loader's shuffle takes its own
    seed from the global stream); the final fit reads the loader."""
    x, y = classification_data()
    runs, held_out = [], []
    original = validation_split

    def spy(*args, **kwargs):
        split = original(*args, **kwargs)
        held_out.append(split[1])
        return split

    monkeypatch.setattr("pyro_bbb.train.selection.validation_split", spy)
    for data, batch_size in (((x, y), 32), (DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True), None)):
        bnn = classifier()
        guide = pyro_bbb.MeanFieldGuide(bnn)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # it chose: no fallback warning
            history = pyro_bbb.fit(bnn, guide, data, epochs=4, batch_size=batch_size, lr=1e-2, progress=False, seed=0)
        runs.append(history)
        pyro.clear_param_store()
    tensors, loader = (history.kl_weight_choice for history in runs)
    assert loader.chosen_by == "validation" and loader.num_validation == tensors.num_validation == 24
    assert torch.equal(held_out[0], held_out[1])
    assert loader.validation_nll.keys() == tensors.validation_nll.keys()
    for weight, nll in tensors.validation_nll.items():
        assert loader.validation_nll[weight] == pytest.approx(nll, abs=0.05)
    assert {r["num_data"] for r in runs[1].records} == {240} and len(runs[1]) == 4


@pytest.mark.parametrize("sampler", ["weighted", "with replacement", "collate_fn", "subset"])
def test_a_dataloader_whose_epoch_is_not_each_row_once_falls_back_and_a_subset_is_split(sampler, recwarn):
    x, y = classification_data()
    bnn = classifier()
    options = {"weighted": {"sampler": torch.utils.data.WeightedRandomSampler(torch.ones(240), 240)},
               "with replacement": {"sampler": torch.utils.data.RandomSampler(range(240), replacement=True)},
               "collate_fn": {"collate_fn": lambda rows: torch.utils.data.default_collate(rows)},  # may change rows
               "subset": {"sampler": torch.utils.data.SubsetRandomSampler(range(100))}}[sampler]
    data = DataLoader(TensorDataset(x, y), batch_size=32, **options)
    history = pyro_bbb.fit(bnn, pyro_bbb.MeanFieldGuide(bnn), data, epochs=2, progress=False, seed=0)
    choice = history.kl_weight_choice
    if sampler == "subset":  # the 100 rows the sampler draws from, 10 of them held out
        assert choice.chosen_by == "validation" and choice.num_validation == 10
    else:
        assert choice.chosen_by == "fallback" and "sampler" in choice.reason and "collate_fn" in choice.reason
        assert any("did not choose the KL weight" in str(w.message) for w in recwarn)


# -- cross-fitting (folds) -----------------------------------------------------------------------------------------
def test_splits_for_cross_fitting_are_disjoint_stratified_and_the_first_is_the_single_split():
    y = torch.arange(300) % 3
    splits = validation_splits(y, 0.1, 3, stratify=True, generator=torch.Generator().manual_seed(0))
    single = validation_split(y, 0.1, stratify=True, generator=torch.Generator().manual_seed(0))
    assert torch.equal(splits[0][0], single[0]) and torch.equal(splits[0][1], single[1])
    held = [set(h.tolist()) for _, h in splits]
    assert all(not (a & b) for i, a in enumerate(held) for b in held[i + 1:])  # disjoint
    for train, held_out in splits:
        assert y[held_out].bincount().tolist() == [10, 10, 10]  # 10% of the rows, every class's share
        assert sorted(train.tolist() + held_out.tolist()) == list(range(300))  # train is every other row


def test_fold_settings_are_checked():
    for folds in (0, 1.5, True):
        with pytest.raises(ValueError, match="folds"):
            SelectKLWeight(folds=folds)
    with pytest.raises(ValueError, match="folds \\* validation_fraction < 1"):
        SelectKLWeight(folds=3, validation_fraction=0.4)


def test_fit_with_folds_runs_the_path_once_per_split_and_compares_on_every_held_out_row(monkeypatch):
    x, y = classification_data()
    bnn = classifier()
    guide = pyro_bbb.MeanFieldGuide(bnn)
    sizes, chosen_from = [], []
    original, rule = pyro_bbb.ELBO.loss_and_grads, pyro_bbb.train.loop.choose_weight

    def spy(self, *args, **kwargs):
        sizes.append(self.num_data)
        return original(self, *args, **kwargs)

    def spy_rule(scores):
        chosen_from.append({w: len(v) for w, v in scores.items()})
        return rule(scores)

    monkeypatch.setattr(pyro_bbb.ELBO, "loss_and_grads", spy)
    monkeypatch.setattr("pyro_bbb.train.loop.choose_weight", spy_rule)
    history = pyro_bbb.fit(bnn, guide, (x, y), epochs=8, batch_size=64, lr=1e-2, progress=False, seed=0,
                           kl_weight=SelectKLWeight(folds=2))
    choice = history.kl_weight_choice
    assert choice.chosen_by == "validation" and choice.num_validation == 48
    assert chosen_from == [{1.0: 48, 0.1: 48, 0.01: 48}]  # one choice, on both splits' rows together
    assert sizes == [216] * 12 * 2 + [240] * 32  # two paths on 216 rows each, then the final fit on all 240
    assert len(history) == 8 and {r["kl_weight"] for r in history.records} == {choice.kl_weight}


@pytest.mark.parametrize("stop", [KeyboardInterrupt, MemoryError])
def test_a_fit_stopped_while_choosing_keeps_the_weight_record_it_found(monkeypatch, stop):
    """The path's training steps record each candidate's weight; a stop that puts the parameters back (Ctrl-C, an
    error from the choice) put back the record too (it said 0.01 for a guide trained at 0.5)."""
    (x, y), model, guide, _ = set_up_regression()
    pyro_bbb.fit(model, guide, (x + 10.0, y), epochs=1, progress=False, kl_weight=0.5)  # on other rows: it chooses
    found, before = kl_weight_of(guide), params()

    def stopping(*args, **kwargs):
        raise stop()

    monkeypatch.setattr("pyro_bbb.train.loop.predict", stopping)  # scoring the first candidate, after its steps
    if stop is KeyboardInterrupt:  # its History says what the guide is (it said "KL weight 1 ... interrupted")
        history = pyro_bbb.fit(model, guide, (x, y), epochs=8, batch_size=16, progress=False, seed=0)
        assert history.interrupted and history.kl_weight_choice is found
    else:
        with pytest.raises(MemoryError):
            pyro_bbb.fit(model, guide, (x, y), epochs=8, batch_size=16, progress=False, seed=0)
    assert kl_weight_of(guide) is found
    assert_params_unchanged(before)


def test_a_gradient_computation_is_a_training_step_that_keeps_fits_record_at_fits_weight():
    """differentiable_loss is Pyro's recipe for a torch optimizer's loop: when its loss's gradients are computed
    (backward, or torch.autograd.grad), it records the weight it computes at (a guide trained that way had no record,
    or fit's stale one), keeping fit's record, with its scores, at fit's weight; a loss only looked at trains
    nothing."""
    (x, y), model, guide, _ = set_up_regression()
    history = pyro_bbb.fit(model, guide, (x, y), epochs=2, batch_size=16, progress=False, kl_weight=0.01)
    loss = pyro_bbb.ELBO(num_data=len(y), kl_weight=0.01).differentiable_loss(model, guide, x, y)
    torch.autograd.grad(loss, list(guide.parameters()))
    assert kl_weight_of(guide) is history.kl_weight_choice
    loss = pyro_bbb.ELBO(num_data=len(y)).differentiable_loss(model, guide, x, y)
    assert kl_weight_of(guide) is history.kl_weight_choice  # (looked at)
    loss.backward()
    assert kl_weight_of(guide) == KLWeightChoice(kl_weight=1.0)


def test_selection_settings_take_numpy_numbers_and_name_a_bad_candidates_argument():
    """A numpy array of weights (its float32 items) was refused as "not a number"; a lone number failed in a bare
    "'float' object is not iterable"; weight 1 alone ran a warm start and a path that had nothing to choose."""
    np = pytest.importorskip("numpy")
    selection = SelectKLWeight(candidates=np.array([0.1, 0.01], dtype=np.float32), folds=np.int64(2),
                               min_warm_start_epochs=np.int64(3), validation_fraction=np.float64(0.2))
    assert selection.candidates == pytest.approx((1.0, 0.1, 0.01)) and type(selection.folds) is int
    with pytest.raises(ValueError, match=r"candidates must be a sequence of KL weights.*\(0.1, 0.01\), got 0.1"):
        SelectKLWeight(candidates=0.1)
    for alone in ([], [1.0], (1,)):
        with pytest.raises(ValueError, match="no candidate but weight 1.*kl_weight=1"):
            SelectKLWeight(candidates=alone)


@pytest.mark.parametrize("how", ["fraction", "classes"])
def test_too_few_held_out_rows_name_the_fraction_or_the_classes(how):
    """Both warned "40 training rows are too few": the cause was the fraction (one row held out), or forty classes
    of one row each, which a stratified split cannot take a row from."""
    x = torch.randn(40, 2)
    if how == "classes":
        model = pyro_bbb.BNN(BayesianLinear(2, 40), likelihoods.Categorical())
        data, selection = (x, torch.arange(40)), "auto"
    else:
        model, data, selection = regression_model(), (x, x.sum(-1)), SelectKLWeight(validation_fraction=0.02)
    with pytest.warns(UserWarning, match="did not choose") as record:
        history = pyro_bbb.fit(model, pyro_bbb.MeanFieldGuide(model), data, epochs=1, kl_weight=selection,
                               progress=False)
    reason = history.kl_weight_choice.reason
    assert f"validation_fraction={0.02 if how == 'fraction' else 0.1:g}" in reason and "hold out" in reason
    assert ("stratified" in reason) == (how == "classes") and reason.rstrip(".") in str(record[0].message)
