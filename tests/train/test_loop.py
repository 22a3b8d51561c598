import contextlib
import json
import math
import re
import warnings

import pyro
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb.data.batches import Batches, DataError
from pyro_bbb.data.datasets import heteroscedastic_regression
from pyro_bbb.evaluate import metrics
from pyro_bbb.infer.tempering import kl_weight_of
from pyro_bbb.nn import BayesianLinear

from ..helpers import digits_fit, params, regression_model, small_data


def fit(model, guide, d, **kwargs):
    kwargs.setdefault("progress", False)
    kwargs.setdefault("epochs", 1)
    return pyro_bbb.fit(model, guide, d, **kwargs)


def test_num_data_comes_from_the_data_and_the_partial_batch_is_scaled(monkeypatch):
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    seen = []
    original = pyro_bbb.ELBO.loss_and_grads

    def spy(self, *args, **kwargs):
        loss = original(self, *args, **kwargs)
        seen.append((self.last_terms["num_data"], self.last_terms["batch_size"]))
        return loss

    monkeypatch.setattr(pyro_bbb.ELBO, "loss_and_grads", spy)
    fit(model, guide, small_data(50), batch_size=16, kl_weight=1)
    assert seen == [(50, 16), (50, 16), (50, 16), (50, 2)]


def test_dataloader_input():
    x, y = small_data(40)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = regression_model()
    history = fit(model, pyro_bbb.MeanFieldGuide(model), loader, epochs=2)
    assert len(history) == 2 and history.last["num_data"] == 40
    assert len(history.step_loss) == 6
    with pytest.raises(ValueError, match="DataLoader"):
        fit(model, pyro_bbb.MeanFieldGuide(model), loader, batch_size=8)


@pytest.mark.parametrize("kl_weight", ["auto", 1])
def test_a_dataloader_that_yields_no_batch_is_an_error_naming_drop_last(kl_weight):
    x, y = small_data(30)
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, drop_last=True)
    with pytest.raises(ValueError, match=r"yields no batch: drop_last=True drops the only, partial batch of the 30 "
                                         r"rows it draws an epoch \(batch_size=32\)"):
        fit(model, guide, loader, epochs=2, kl_weight=kl_weight)
    assert len(pyro.get_param_store()) == 0


def test_an_empty_distributed_shard_names_this_ranks_rows_not_every_ranks():
    from torch.utils.data import DistributedSampler

    x, y = small_data(60)
    sampler = DistributedSampler(TensorDataset(x, y), num_replicas=2, rank=0, shuffle=False)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, sampler=sampler, drop_last=True)
    model = regression_model()
    with pytest.raises(ValueError, match=r"partial batch of the 30 rows it draws an epoch"):  # (N is 60)
        fit(model, pyro_bbb.MeanFieldGuide(model), loader, epochs=1, kl_weight=1)


def test_history_records_everything_per_epoch():
    model = regression_model(likelihoods.Gaussian())
    guide = pyro_bbb.MeanFieldGuide(model)
    x, y = small_data(60)
    history = fit(model, guide, (x, y), epochs=3, batch_size=20, validation_data=small_data(30, seed=1))
    record = history.last
    for key in ("loss", "loss_per_datum", "nll", "kl", "kl_weight", "kl_by_layer", "posterior_std", "std_ratio",
                "val_log_likelihood", "val_rmse", "seconds"):
        assert key in record, key
    assert set(record["kl_by_layer"]) == {"net.0", "net.2", "likelihood.scale"}
    assert set(record["std_ratio"]) == set(record["std_ratio_geomean"]) == {"net.0", "net.2"}
    summary = pyro_bbb.evaluate.diagnostics.layer_summary(model, guide)  # the guide as the last record saw it
    for layer, ratio in record["std_ratio_geomean"].items():
        assert ratio == pytest.approx(summary[layer]["std_ratio_geomean"], rel=1e-12)
        assert ratio <= record["std_ratio"][layer]  # a geometric mean never exceeds the arithmetic one
    assert record["kl"] == pytest.approx(sum(record["kl_by_layer"].values()), rel=0.05)
    assert history["kl_by_layer"]["net.0"] == [r["kl_by_layer"]["net.0"] for r in history.records]
    assert record["loss_per_datum"] == pytest.approx(record["loss"] / 60)
    assert math.isfinite(record["val_log_likelihood"])
    assert json.loads(json.dumps(history.to_dict()))["kl_by_layer"]["net.0"] == history["kl_by_layer"]["net.0"]


@pytest.mark.parametrize("terminal", [True, False])
def test_progress_bar_shows_the_terms(capsys, monkeypatch, terminal):
    """A terminal gets a bar; a log file (not a terminal) a line every tenth of the epochs, with the same terms."""
    monkeypatch.setattr("pyro_bbb.train.loop._live_display", lambda: terminal)
    model = regression_model()
    fit(model, pyro_bbb.MeanFieldGuide(model), small_data(), epochs=2, progress=True, kl_weight=1)
    err = capsys.readouterr().err
    assert "fit" in err and "kl_w" in err and "loss/datum" in err
    assert ("\r" in err) == terminal
    # the last bar's terms are all per datum: they add up as the loss does
    terms = dict(re.findall(r"([\w/]+)=([-\d.e+]+)", err.strip().split("\r")[-1]))
    loss, nll, kl, weight = (float(terms[k]) for k in ("loss/datum", "nll/datum", "kl/datum", "kl_w"))
    assert loss == pytest.approx(nll + weight * kl, rel=2e-3, abs=2e-3)
    pyro.clear_param_store()
    model = regression_model()
    fit(model, pyro_bbb.MeanFieldGuide(model), small_data(), epochs=2, progress=False)
    assert capsys.readouterr().err == ""


def test_a_log_file_gets_a_line_every_tenth_of_the_epochs(capsys, monkeypatch):
    monkeypatch.setattr("pyro_bbb.train.loop._live_display", lambda: False)
    model = regression_model()
    fit(model, pyro_bbb.MeanFieldGuide(model), small_data(), epochs=25, progress=True, kl_weight=1)
    lines = capsys.readouterr().err.splitlines()
    epochs = [line.split(":")[1].strip() for line in lines]
    assert epochs == [f"epoch {e}/25" for e in (3, 6, 9, 12, 15, 18, 21, 24, 25)]


def test_same_seed_same_result():
    results = []
    for _ in range(2):
        pyro.clear_param_store()
        torch.manual_seed(5)
        model = regression_model()
        fit(model, pyro_bbb.MeanFieldGuide(model), small_data(), epochs=3, batch_size=16, seed=7)
        results.append(params())
    for name in results[0]:
        torch.testing.assert_close(results[0][name], results[1][name], rtol=0, atol=0)


def test_same_seed_same_result_with_gradient_clipping():
    """clip_norm divides by the global gradient norm, a sum over parameters: fit must sum them in a fixed order. It
    iterated a set of tensors (ordered by memory address), so two runs with the same seed rounded that norm
    differently and drifted apart (an Embedded Reber LSTM ended 6 points apart); here three runs of a 20-tensor net
    with the norm clipped at every step must agree bit for bit."""
    results = []
    for _ in range(3):
        pyro.clear_param_store()
        torch.manual_seed(5)
        layers = [BayesianLinear(2, 8)] + [BayesianLinear(8, 8) for _ in range(8)] + [BayesianLinear(8, 1)]
        net = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.Tanh())][:-1])
        model = pyro_bbb.BNN(net, likelihoods.Gaussian(0.1))
        fit(model, pyro_bbb.MeanFieldGuide(model), small_data(), epochs=4, batch_size=16, lr=1e-2, clip_norm=0.05,
            seed=7,
            progress=False)
        results.append(params())
    for other in results[1:]:
        for name in results[0]:
            torch.testing.assert_close(results[0][name], other[name], rtol=0, atol=0)


def test_callbacks_run_every_epoch_and_can_stop():
    model = regression_model()
    calls = []

    def stop_at_two(epoch, history):
        calls.append(("a", epoch))
        return epoch == 2

    def record(epoch, history):
        calls.append(("b", epoch))

    history = fit(model, pyro_bbb.MeanFieldGuide(model), small_data(), epochs=10, callbacks=[stop_at_two, record])
    assert len(history) == 2 and calls == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]


def test_a_callback_answering_neither_a_bool_nor_none_is_said_and_does_not_stop():
    """A logging callback that returns the loss stopped training after its first epoch without a word; one that
    returns a DataFrame failed in bool() and put every parameter back to the start of fit."""
    import numpy as np

    model = regression_model()

    def log_loss(epoch, history):
        return history.last["loss"]

    def table(epoch, history):
        return pyro_bbb.summary(model, guide)

    guide = pyro_bbb.MeanFieldGuide(model)
    with pytest.warns(UserWarning, match=r"callback log_loss returned float '.*', not True, False or None.*went "
                                         r"on") as w:
        history = fit(model, guide, small_data(), epochs=4, callbacks=[log_loss, table])
    assert len(history) == 4
    assert sum("not True, False or None" in str(warning.message) for warning in w) == 2  # (once per callback)
    history = fit(model, guide, small_data(), epochs=4, callbacks=[lambda epoch, h: np.bool_(epoch == 3)])
    assert len(history) == 3  # numpy's True stops too
    history = fit(model, guide, small_data(), epochs=4, callbacks=[lambda epoch, h: torch.tensor(epoch) >= 2])
    assert len(history) == 2  # and a one-element bool tensor's


def test_numpy_counts_and_seeds_are_taken_and_a_bad_seed_is_named():
    """batch_size=np.int64(8) passed the check and reached torch's split raw ('must be tuple of ints'); a seed of -1
    or 1.5 failed inside numpy's or Python's seeding."""
    import numpy as np

    x, y = small_data(40)
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    history = fit(model, guide, (x, y), epochs=np.int64(2), batch_size=np.int64(8), seed=np.int64(3), kl_weight=1)
    assert len(history) == 2 and len(history.step_loss) == 10
    for seed in (-1, 1.5, 2**32, True):
        with pytest.raises(ValueError, match=r"`seed` must be a whole number from 0 to 2\*\*32 - 1"):
            fit(model, guide, (x, y), epochs=1, seed=seed)


def test_clip_norm_bounds_the_global_update():
    """With SGD(lr) one step moves the parameters by lr * gradient; clipped, its global norm is at most lr * clip."""
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    x, y = small_data()
    guide(x, y)
    before = params()
    fit(model, guide, (x, y), optimizer=pyro.optim.SGD({"lr": 0.1}), clip_norm=0.01, kl_weight=1)
    after = params()
    step = torch.cat([(after[k] - before[k]).reshape(-1) for k in before])
    # the param store holds constrained values: scales move through exp, which is ~linear for small steps
    assert 0.0005 < float(step.norm()) <= 0.1 * 0.01 * 1.01


class Poison(torch.nn.Module):
    """Outputs NaN from its `at`-th call on."""

    def __init__(self, at):
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, x):
        self.calls += 1
        return x * math.nan if self.calls >= self.at else x


def poisoned_model(at):
    torch.manual_seed(0)
    net = torch.nn.Sequential(BayesianLinear(2, 4), Poison(at), BayesianLinear(4, 1))
    return pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.5))


def test_nan_loss_stops_and_restores_the_last_finite_parameters():
    x, y = small_data()
    model = poisoned_model(at=5)  # call 1 sets the guide up, so calls 2, 3, 4 are steps 1-3 and step 4 is NaN
    with pytest.raises(pyro_bbb.TrainingDivergedError, match=r"step 4 .* last finite loss was \d"):
        fit(model, pyro_bbb.MeanFieldGuide(model), (x, y), epochs=10, lr=0.01, seed=0, kl_weight=1)
    restored = params()
    # The loss of step 3 was the last finite one; it was computed at the parameters after 2 updates.
    pyro.clear_param_store()
    model = poisoned_model(at=100)
    fit(model, pyro_bbb.MeanFieldGuide(model), (x, y), epochs=2, lr=0.01, seed=0, kl_weight=1)
    reference = params()
    assert restored.keys() == reference.keys()
    for name in reference:
        torch.testing.assert_close(restored[name], reference[name], rtol=0, atol=0)


@pytest.mark.parametrize("kl_weight", [1.0, "auto"])
def test_a_fit_that_diverges_leaves_the_record_of_the_parameters_it_leaves(kl_weight):
    """A fit whose first step diverges changes no parameter, so it changes no record either: a guide trained at 0.01
    was reported as "the Bayes posterior" (weight 1, the diverged fit's own). One that diverges after some updates
    keeps them (the last finite state): their weight is recorded and their rows remembered."""
    from pyro_bbb.data.provenance import fraction_seen_in_training

    x, y = small_data()
    model = poisoned_model(at=10**6)
    guide = pyro_bbb.MeanFieldGuide(model)
    fit(model, guide, (x, y), epochs=2, kl_weight=0.01, seed=0)
    before = params()
    poison = model.net[1]
    other_x = x + 10.0  # rows the guide has not seen: "auto" would choose on them
    if kl_weight != "auto":
        poison.at = poison.calls + 1  # NaN from the next call: the first step diverges
    extreme = torch.full_like(y, 1e20)  # ("auto": the selection's path diverges, and falls back to weight 1)
    with pytest.warns(UserWarning, match="path .* failed") if kl_weight == "auto" else contextlib.nullcontext():
        with pytest.raises(pyro_bbb.TrainingDivergedError, match="step 1 .*no step had a finite loss"):
            fit(model, guide, (other_x, extreme if kl_weight == "auto" else y), epochs=2, batch_size=10,
                kl_weight=kl_weight, seed=0)
    poison.at = 10**6
    assert kl_weight_of(guide).kl_weight == 0.01 and fraction_seen_in_training(guide, other_x) == 0.0
    after = params()
    assert all(torch.equal(before[name], after[name]) for name in before)
    poison.at = poison.calls + 4  # steps 1-3 finite, step 4 NaN: the parameters after 2 updates at weight 1 kept
    with pytest.raises(pyro_bbb.TrainingDivergedError, match="step 4 .*last finite loss was"):
        fit(model, guide, (other_x, y), epochs=2, batch_size=10, kl_weight=1.0, seed=0)
    assert kl_weight_of(guide).kl_weight == 1.0 and fraction_seen_in_training(guide, other_x) == 1.0


@pytest.mark.parametrize(
    "make_data, match",
    [
        (lambda x, y: (x, y[:-1]), "same number of rows"),
        (lambda x, y: (torch.where(x > 1, math.nan, x), y), "NaN"),
        (lambda x, y: (x, torch.where(y > 1, math.nan, y)), "NaN"),
        (lambda x, y: (x[:0], y[:0]), "empty"),
    ],
)
def test_bad_regression_data_is_rejected_before_any_parameter_changes(make_data, match):
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    x, y = small_data()
    fit(model, guide, (x, y))
    before = params()
    with pytest.raises(ValueError, match=match):
        fit(model, guide, make_data(x, y))
    after = params()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize(
    "labels, match", [(lambda y: y.float(), "integer class labels"), (lambda y: y + 1, r"label is 3 .* 3 logits")]
)
def test_bad_labels_are_rejected_before_any_parameter_changes(labels, match, recwarn):
    net = torch.nn.Sequential(BayesianLinear(2, 4), torch.nn.ReLU(), BayesianLinear(4, 3))
    model = pyro_bbb.BNN(net, likelihoods.Categorical())
    guide = pyro_bbb.MeanFieldGuide(model)
    x = torch.randn(60, 2)
    y = torch.randint(0, 3, (60,))
    fit(model, guide, (x[:30], y[:30]), kl_weight=1)
    before = params()
    recwarn.clear()
    with pytest.raises(ValueError, match=match):  # (rows it was not trained on, at a weight given: it chooses)
        fit(model, guide, (x[30:], labels(y[30:])))
    assert all(torch.equal(before[k], v) for k, v in params().items())
    assert not [w for w in recwarn if "did not choose" in str(w.message)]  # the data's error, not a fallback


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"epochs": 0}, "epochs"),
        ({"batch_size": 0}, "batch_size"),
        ({"lr": -1.0}, "lr"),
        ({"clip_norm": 0.0}, "clip_norm"),
        ({"estimator": "flipout-ish"}, "unknown estimator"),
    ],
)
def test_bad_settings(kwargs, match):
    model = regression_model()
    with pytest.raises(ValueError, match=match):
        fit(model, pyro_bbb.MeanFieldGuide(model), small_data(), **kwargs)


def test_stale_parameters_of_another_model_are_a_clear_error():
    model = regression_model(hidden=8)
    fit(model, pyro_bbb.MeanFieldGuide(model), small_data())
    other = regression_model(hidden=5)
    with pytest.raises(ValueError, match="clear_param_store"):
        fit(other, pyro_bbb.MeanFieldGuide(other), small_data())


@pytest.mark.slow
def test_heteroscedastic_intervals_cover_and_epistemic_std_grows_away_from_the_data():
    torch.manual_seed(0)
    x, y = heteroscedastic_regression(2000, seed=0)  # x in [-2, 2]
    net = torch.nn.Sequential(BayesianLinear(1, 32), torch.nn.ReLU(), BayesianLinear(32, 32), torch.nn.ReLU(),
                              BayesianLinear(32, 2))
    bnn = pyro_bbb.BNN(net, likelihoods.HeteroscedasticGaussian())
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (x, y), epochs=300, batch_size=200, lr=1e-2, progress=False, seed=0)
    x_test, y_test = heteroscedastic_regression(2000, seed=1)
    pred = pyro_bbb.predict(bnn, guide, x_test, num_samples=200)
    coverage = metrics.interval_coverage(pred, y_test, level=0.9)
    assert 0.85 <= coverage <= 0.95
    # the noise is learned: the aleatoric std tracks 0.1 + 0.2 |x| inside the data
    inside = pyro_bbb.predict(bnn, guide, torch.tensor([[0.0], [1.5]]), num_samples=200)
    assert inside.aleatoric_std[1] > 2 * inside.aleatoric_std[0]
    grid = torch.tensor([[-4.0], [-3.0], [-1.0], [0.0], [1.0], [3.0], [4.0]])
    epistemic = pyro_bbb.predict(bnn, guide, grid, num_samples=200).epistemic_std
    assert epistemic[[0, 1, 5, 6]].min() > 3 * epistemic[[2, 3, 4]].max()


@pytest.mark.slow
def test_digits_accuracy_and_calibration():
    bnn, guide, history, (_, _, x_test, y_test) = digits_fit(1.0, 300)
    pyro.set_rng_seed(0)
    pred = pyro_bbb.predict(bnn, guide, x_test, num_samples=100)
    assert metrics.accuracy(pred, y_test) >= 0.95
    assert metrics.expected_calibration_error(pred, y_test) <= 0.05
    # the uncertainty is informative: wrong answers carry more epistemic uncertainty than right ones
    wrong = pred.predicted_class != y_test
    assert pred.mutual_information[wrong].mean() > 2 * pred.mutual_information[~wrong].mean()


# -- any Pyro guide ------------------------------------------------------------------------------
def _guide_list(model):
    from pyro.infer import autoguide

    guide = autoguide.AutoGuideList(model)
    guide.append(autoguide.AutoNormal(pyro.poutine.block(model, expose=["net.0.weight", "net.0.bias"])))
    guide.append(autoguide.AutoDelta(pyro.poutine.block(model, hide=["net.0.weight", "net.0.bias"])))
    return guide


def _pyro_guides():
    from pyro.infer import autoguide

    return {
        "AutoNormal": autoguide.AutoNormal,
        "AutoDiagonalNormal": autoguide.AutoDiagonalNormal,
        "AutoLowRankMultivariateNormal": autoguide.AutoLowRankMultivariateNormal,
        "AutoDelta": autoguide.AutoDelta,
        "AutoGuideList": _guide_list,
    }


@pytest.mark.parametrize("name", list(_pyro_guides()))
def test_fit_predict_save_load_work_with_any_pyro_guide(name, tmp_path):
    import warnings

    make_guide = _pyro_guides()[name]
    x, y = small_data()
    model = regression_model()
    guide = make_guide(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = fit(model, guide, (x, y), epochs=3, batch_size=16, seed=0)
    per_layer = name in ("AutoNormal", "AutoGuideList")  # (the list's: its Normal part's layers)
    assert ("kl_by_layer" in history.keys()) == per_layer
    assert per_layer or any("no Normal posterior per weight" in str(w.message) for w in caught)
    history.plot(tmp_path / "history.png")
    pyro.set_rng_seed(1)
    before = pyro_bbb.predict(model, guide, x, num_samples=5).mean
    pyro_bbb.save(tmp_path / "model.pt", model, guide)
    pyro.clear_param_store()
    model2 = regression_model()
    guide2 = pyro_bbb.load(tmp_path / "model.pt", model2, make_guide(model2))
    pyro.set_rng_seed(1)
    torch.testing.assert_close(pyro_bbb.predict(model2, guide2, x, num_samples=5).mean, before)
    if per_layer:
        layers = {"net.0", "net.2"} if name == "AutoNormal" else {"net.0"}
        assert set(pyro_bbb.summary(model, guide).index) == layers
        assert set(history.last["kl_by_layer"]) == layers
    else:
        with pytest.raises(ValueError, match="independent Normal posterior"):
            pyro_bbb.summary(model, guide)


def test_elbo_with_autonormal_equals_pyros_trace_elbo():
    from pyro.infer import Trace_ELBO
    from pyro.infer.autoguide import AutoNormal

    x, y = small_data(20)
    model = regression_model()
    guide = AutoNormal(model, init_scale=0.2)
    guide(x, y)
    pyro.set_rng_seed(4)
    ours = pyro_bbb.ELBO(num_data=20).loss(model, guide, x, y)
    pyro.set_rng_seed(4)
    assert ours == pytest.approx(Trace_ELBO().loss(model, guide, x, y), rel=1e-5)


@pytest.mark.parametrize("estimator", ["flipout", "local_reparam"])
def test_flipout_and_local_reparameterization_need_meanfieldguide_before_the_first_step(estimator):
    from pyro.infer.autoguide import AutoNormal

    model = regression_model()
    guide = AutoNormal(model)
    with pytest.raises(ValueError, match="MeanFieldGuide"):
        fit(model, guide, small_data(), estimator=estimator)
    assert len(pyro.get_param_store()) == 0  # nothing set up, nothing changed


# -- data checked before any parameter changes, DataLoaders too -----------------------------------
class ListDataset(torch.utils.data.Dataset):
    """An indexable dataset that is not a TensorDataset: checked batch by batch."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def _classifier():
    net = torch.nn.Sequential(BayesianLinear(2, 4), torch.nn.ReLU(), BayesianLinear(4, 3))
    return pyro_bbb.BNN(net, likelihoods.Categorical())


@pytest.mark.parametrize("dataset", [TensorDataset, ListDataset])
@pytest.mark.parametrize("poison", ["nan", "label"])
def test_bad_datum_in_a_later_dataloader_batch_leaves_the_parameters_as_they_were(dataset, poison):
    x, y = small_data(64)
    labels = (y > 0).long()
    if poison == "nan":
        x[60, 0] = math.nan
    else:
        labels[60] = 3  # only 3 logits
    model = _classifier()
    guide = pyro_bbb.MeanFieldGuide(model)
    fit(model, guide, (x[:8], labels[:8].clamp_max(2)))  # an earlier fit: parameters exist
    before = params()
    loader = DataLoader(dataset(x, labels), batch_size=16, shuffle=False)  # the bad datum is in batch 4
    with pytest.raises(ValueError, match="NaN|label is 3") as error:
        fit(model, guide, loader, epochs=2)
    if dataset is ListDataset:
        assert "restored" in str(error.value)
    after = params()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_num_data_is_what_the_sampler_draws_from():
    from torch.utils.data import SubsetRandomSampler

    x, y = small_data(200)
    loader = DataLoader(TensorDataset(x, y), batch_size=25, sampler=SubsetRandomSampler(range(100)))
    model = regression_model()
    history = fit(model, pyro_bbb.MeanFieldGuide(model), loader)
    assert history.last["num_data"] == 100  # not the dataset's 200: the likelihood is not doubled


def test_num_data_of_a_batch_sampler_is_the_rows_it_batches():
    """A BatchSampler given as the sampler (batch_size=None: each index a batch, the fast way over a TensorDataset)
    counted its 25 batches as N (the likelihood scaled by 25 / 8 instead of 200 / 8); a batch sampler of one's own
    with no inner sampler counts the dataset."""
    from torch.utils.data import BatchSampler, RandomSampler

    class Buckets:  # a bucketing batch sampler: no .sampler
        def __iter__(self):
            return iter(torch.randperm(200).split(8))

        def __len__(self):
            return 25

    x, y = small_data(200)
    data = TensorDataset(x, y)
    for loader in (DataLoader(data, sampler=BatchSampler(RandomSampler(range(200)), 8, False), batch_size=None),
                   DataLoader(data, batch_sampler=Buckets())):
        model = regression_model()
        history = fit(model, pyro_bbb.MeanFieldGuide(model), loader, epochs=1, kl_weight=1)
        assert history.last["num_data"] == 200 and len(history.step_loss) == 25


@pytest.mark.parametrize("given_as", ["batch_sampler", "sampler without batching"])
@pytest.mark.parametrize("draws, warned", [("training rows", True), ("every row", False),
                                           ("every row but a dropped batch", False), ("a stream", True)])
def test_a_batch_sampler_of_ones_own_drawing_part_of_the_dataset_is_said(given_as, draws, warned):
    """A batch sampler of one's own over the training indices of a dataset shared with a validation split weighed
    the likelihood of its 120 rows as the dataset's 200, silently (N is the dataset's size: nothing says which
    rows such a sampler draws from without drawing an epoch). The first epoch's rows are counted as it trains: the
    warning names the factor and the fix. Nothing is peeked: a sampler with its own generator, or one that can be
    read once, trains on the batches it would have given anyway."""

    class OwnBatches(torch.utils.data.Sampler):  # no .sampler inside
        def __init__(self):
            self.generator = torch.Generator().manual_seed(0)
            self.stream = iter(torch.arange(120).split(16))

        def __iter__(self):
            if draws == "a stream":  # (one pass, then nothing)
                return (b.tolist() for b in self.stream)
            rows = 120 if draws == "training rows" else 200
            order = torch.randperm(rows, generator=self.generator)[:192 if "dropped" in draws else rows]
            return iter([b.numpy() if given_as == "batch_sampler" else b.tolist() for b in order.split(16)])

        def __len__(self):
            return 8

    if draws == "a stream" and given_as != "batch_sampler":
        pytest.skip("a sampler of one's own without batching is peeked at (single indices are refused before any "
                    "draw): a one-pass stream behind it loses its first batch")
    x, y = small_data(200)
    data = TensorDataset(x, y)
    sampler = OwnBatches()
    loader = (DataLoader(data, batch_sampler=sampler) if given_as == "batch_sampler"
              else DataLoader(data, sampler=sampler, batch_size=None))
    model = regression_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = fit(model, pyro_bbb.MeanFieldGuide(model), loader, epochs=2, kl_weight=1, progress=False)
    ours = [w for w in caught if "batch sampler of your own" in str(w.message)]
    said = [str(w.message) for w in ours]
    assert all(w.filename == __file__ for w in ours)  # (at the user's line)
    assert history.last["num_data"] == 200
    assert said == (["N = 200, the DataLoader's dataset's size, weighs the likelihood against the KL, but its batch "
                     "sampler of your own drew 120 rows in an epoch. If it draws from part of the dataset (e.g. the "
                     "training indices of a dataset shared with a validation split), the likelihood is weighed "
                     "1.67 times too much: give the DataLoader torch.utils.data.Subset(dataset, indices), or "
                     "sampler=SubsetRandomSampler(indices) with batch_size=..., whose rows are N. If each epoch "
                     "draws a sample of the whole dataset, N is right."] if warned else [])
    if draws == "a stream":
        assert len(history.step_loss) == 8  # (its one pass trained: nothing read it before)
    else:
        assert len(history.step_loss) == 2 * {"training rows": 8, "every row": 13}.get(draws, 12)
        expected = torch.Generator().manual_seed(0)
        # one permutation an epoch; a sampler of one's own without batching also gives its first item to a peek
        # (whether it yields single indices, refused before any draw of the caller's), a batch sampler none
        for _ in range(2 if given_as == "batch_sampler" else 3):
            torch.randperm(120 if draws == "training rows" else 200, generator=expected)
        assert torch.equal(sampler.generator.get_state(), expected.get_state())


def test_a_batch_sampler_of_ones_own_drawing_its_share_in_a_distributed_fit_is_not_said():
    """In a distributed fit each process's batch sampler draws its share of the dataset (as a DistributedSampler
    does), and N is the dataset's: a share is no sign of a wrong N."""
    class Share:
        def __iter__(self):
            return iter(torch.arange(0, 200, 2).split(10))

        def __len__(self):
            return 10

    x, y = small_data(200)
    loader = DataLoader(TensorDataset(x, y), batch_sampler=Share())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert sum(len(y) for _, y in Batches(loader, None, None, None, distributed=True)) == 100
        assert not caught
        list(Batches(loader, None, None, None))
    assert ["drew 100 rows" in str(w.message) for w in caught] == [True]


@pytest.mark.parametrize("make_sampler, expected", [
    (lambda data: torch.utils.data.RandomSampler(data, replacement=True, num_samples=60), 200),
    (lambda data: torch.utils.data.RandomSampler(data, num_samples=60), 200),
    (lambda data: torch.utils.data.WeightedRandomSampler(torch.ones(200), num_samples=60), 200),
    (lambda data: torch.utils.data.WeightedRandomSampler(torch.cat([torch.ones(150), torch.zeros(50)]), 60), 150),
], ids=["with replacement", "without", "weighted", "weighted, some never drawn"])
def test_num_data_of_a_sampler_with_its_own_num_samples_is_the_rows_it_draws_from(make_sampler, expected):
    """A sampler's num_samples is the draws per epoch, not N: the likelihood was scaled to 60 rows instead of 200."""
    x, y = small_data(200)
    data = TensorDataset(x, y)
    loader = DataLoader(data, batch_size=20, sampler=make_sampler(data))
    model = regression_model()
    history = fit(model, pyro_bbb.MeanFieldGuide(model), loader)
    assert history.last["num_data"] == expected and len(history.step_loss) == 3  # 60 draws an epoch


@pytest.mark.parametrize("rows, ranks, drop_last", [(50, 2, False), (10, 4, False), (10, 4, True)])
def test_num_data_of_a_distributed_sampler_is_its_datasets_size(rows, ranks, drop_last):
    """Not the sampler's total_size: 10 rows on 4 ranks are padded to 12 (or cut to 8 by drop_last), which put the
    likelihood 20% off against the KL."""
    from torch.utils.data import DistributedSampler

    x, y = small_data(rows)
    sampler = DistributedSampler(TensorDataset(x, y), num_replicas=ranks, rank=0, shuffle=False, drop_last=drop_last)
    loader = DataLoader(TensorDataset(x, y), batch_size=10, sampler=sampler)
    model = regression_model()
    history = fit(model, pyro_bbb.MeanFieldGuide(model), loader)
    assert history.last["num_data"] == rows and len(history.step_loss) == (3 if rows == 50 else 1)  # this rank's


def test_a_dataloader_of_single_rows_is_named():
    """DataLoader(batch_size=None) yields single rows: "x has 3 rows but y has shape ()", the 3 its features."""
    x, y = small_data(40)
    model = regression_model()
    refusal = r"\(batch_size=None\) reads its dataset one index at a time.*single rows.*IterableDataset"
    with pytest.raises(ValueError, match=refusal):
        fit(model, pyro_bbb.MeanFieldGuide(model), DataLoader(TensorDataset(x, y), batch_size=None))

    class Batches(torch.utils.data.IterableDataset):  # yields batches itself: batch_size=None is how it is read
        def __iter__(self):
            return iter(zip(x.split(8), y.split(8)))

        def __len__(self):
            return 40

    model = regression_model()
    history = fit(model, pyro_bbb.MeanFieldGuide(model), DataLoader(Batches(), batch_size=None), epochs=1,
                  kl_weight=1, progress=False)
    assert history.last["num_data"] == 40 and len(history.step_loss) == 5


def test_an_iterable_dataset_without_a_len_is_told_how_to_give_n():
    """A stream (IterableDataset) has no size to take N from: the error named only a sized dataset, where a __len__
    counting rows (not batches) is all a stream needs, as the test above trains."""
    x, y = small_data(40)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(zip(x, y))

    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    with pytest.raises(ValueError, match=r"IterableDataset a __len__ that returns the number of rows.*not of batches"):
        fit(model, guide, DataLoader(Stream(), batch_size=8), epochs=1, kl_weight=1, progress=False)


@pytest.mark.parametrize("yields", ["indices", "numpy indices", "lists of indices", "numpy arrays of indices",
                                    "ranges"])
def test_a_sampler_of_ones_own_without_batching_is_named_when_it_yields_single_indices(yields):
    """A sampler of one's own (not one of torch's) under batch_size=None: one yielding single indices gave single rows
    and a shape error later ("x has 3 rows"); one yielding lists (numpy arrays, ranges) of indices yields batches,
    and trains, its N the dataset's (its len() counted 5 batches as N). Peeking at its first index draws nothing from
    the caller's random numbers, numpy's included."""
    import numpy as np

    x, y = small_data(40)

    class Shuffled(torch.utils.data.Sampler):
        def __iter__(self):
            order = np.random.permutation(40)
            batches = [order[i:i + 8] for i in range(0, 40, 8)]
            return iter({"indices": order.tolist(), "numpy indices": order, "lists of indices":
                         [b.tolist() for b in batches], "numpy arrays of indices": batches,
                         "ranges": [range(i, i + 8) for i in range(0, 40, 8)]}[yields])

        def __len__(self):
            return 40 if "indices" in yields and "of" not in yields else 5

    model = regression_model()
    loader = DataLoader(TensorDataset(x, y), sampler=Shuffled(), batch_size=None)
    if "of" not in yields and yields != "ranges":
        guide = pyro_bbb.MeanFieldGuide(model)
        torch.manual_seed(0)
        np.random.seed(0)
        expected = torch.rand(3), np.random.rand(3)
        torch.manual_seed(0)
        np.random.seed(0)
        with pytest.raises(ValueError, match=r"one index at a time.*single rows.*sampler=your_sampler"):
            fit(model, guide, loader)
        assert torch.equal(torch.rand(3), expected[0]) and np.array_equal(np.random.rand(3), expected[1])
    else:
        history = fit(model, pyro_bbb.MeanFieldGuide(model), loader, epochs=1, kl_weight=1, progress=False)
        assert history.last["num_data"] == 40 and len(history.step_loss) == 5


def test_a_last_batch_of_one_row_at_a_batch_norm_layer_is_named_and_changes_nothing():
    """33 rows in batches of 16 leave a batch of one, which BatchNorm1d cannot normalise in training mode: torch's
    "Expected more than 1 value per channel" named neither the batch nor the fix. drop_last=True trains."""
    from pyro_bbb.nn import BayesianLinear

    net = torch.nn.Sequential(BayesianLinear(2, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), BayesianLinear(8, 1))
    model = pyro_bbb.BNN(net, pyro_bbb.likelihoods.Gaussian(scale=0.5))
    guide = pyro_bbb.MeanFieldGuide(model)
    x, y = small_data(33)
    fit(model, guide, (x[:32], y[:32]), epochs=1, batch_size=16, kl_weight=1, progress=False)
    before = {name: value.detach().clone() for name, value in pyro.get_param_store().items()}
    with pytest.raises(ValueError, match=r"a batch of one row reached a batch norm layer.*drop_last=True"):
        fit(model, guide, (x, y), epochs=2, batch_size=16, kl_weight=1, progress=False)
    assert all(torch.equal(value, before[name]) for name, value in pyro.get_param_store().items())
    history = fit(model, guide, DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, drop_last=True),
                  epochs=1, kl_weight=1, progress=False)
    assert len(history.step_loss) == 2

    class TwoInputs(torch.nn.Module):  # (x a dict: its length is not the rows')
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(BayesianLinear(2, 8), torch.nn.BatchNorm1d(8), BayesianLinear(8, 1))

        def forward(self, features, mask):
            return self.body(features * mask)

    model = pyro_bbb.BNN(TwoInputs(), pyro_bbb.likelihoods.Gaussian(scale=0.5))
    with pytest.raises(ValueError, match=r"a batch of one row reached a batch norm layer"):
        fit(model, pyro_bbb.MeanFieldGuide(model), ({"features": x, "mask": torch.ones_like(x)}, y), epochs=1,
            batch_size=16, kl_weight=1, progress=False)


# -- fit gives back what it learned when it stops early -------------------------------------------
def test_diverged_error_carries_the_history_so_far():
    x, y = small_data()
    model = poisoned_model(at=9)  # call 1 sets the guide up; step 8 (full batches: epoch 8) is NaN
    with pytest.raises(pyro_bbb.TrainingDivergedError) as error:
        fit(model, pyro_bbb.MeanFieldGuide(model), (x, y), epochs=20, seed=0, kl_weight=1)
    history = error.value.history
    assert len(history) == 7 and len(history.step_loss) == 7
    assert all(math.isfinite(v) for v in history["loss"])


def test_ctrl_c_finishes_the_step_and_returns_the_history_marked_interrupted():
    import signal

    x, y = small_data(64)
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    calls = []

    class Interrupting(torch.nn.Module):
        def forward(self, h):
            calls.append(1)
            if len(calls) == 6:  # during step 5 (the first call sets the guide up)
                signal.raise_signal(signal.SIGINT)
            return h

    model.net.insert(1, Interrupting())
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN in a background job
    history = fit(model, guide, (x, y), epochs=10, batch_size=16, seed=0, kl_weight=1)
    assert history.interrupted
    assert len(history.step_loss) == 5  # step 5 was finished, no step after it
    assert len(history) == 2 and history.last["interrupted"]  # epoch 1 (4 steps) and the partial epoch 2
    assert all(torch.isfinite(v).all() for v in params().values())
    assert signal.getsignal(signal.SIGINT) is before  # the handler is given back


def test_lr_beside_an_optimizer_of_ones_own_is_refused_before_anything_changes():
    """fit(optimizer=IVON(...), lr=0.5) trained at IVON's own 0.1, and optimizer=Adam({"lr": 1e-3}) at 1e-3, the
    lr given ignored, silently."""
    x, y = small_data(40)
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    fit(model, guide, (x, y), epochs=1, kl_weight=1)
    before = params()
    for optimizer in (pyro_bbb.optim.IVON(guide, num_data=40), pyro_bbb.optim.Adam({"lr": 1e-3})):
        with pytest.raises(ValueError, match=r"lr=0.5 is the learning rate of fit's own Adam.*Set it there"):
            fit(model, guide, (x, y), epochs=1, kl_weight=1, optimizer=optimizer, lr=0.5)
    assert all(torch.equal(value, before[name]) for name, value in params().items())


def test_lr_final_decays_the_learning_rate_geometrically_epoch_by_epoch(monkeypatch):
    rates = []
    set_rate = pyro_bbb.optim.Adam.set_learning_rate

    def recording(self, lr):
        rates.append(lr)
        set_rate(self, lr)

    monkeypatch.setattr(pyro_bbb.optim.Adam, "set_learning_rate", recording)
    model = pyro_bbb.BNN(BayesianLinear(2, 1), likelihoods.Gaussian(0.5))
    x, y = torch.randn(20, 2), torch.randn(20)
    pyro_bbb.fit(model, pyro_bbb.MeanFieldGuide(model), (x, y), epochs=4, lr=1e-2, lr_final=1e-5, progress=False)
    torch.testing.assert_close(torch.tensor(rates, dtype=torch.float64),  # the schedule, then the rate given back
                               torch.tensor([1e-2, 1e-3, 1e-4, 1e-5, 1e-2], dtype=torch.float64))
    guide = pyro_bbb.MeanFieldGuide(model)
    with pytest.raises(ValueError, match="give your optimizer its own schedule"):
        pyro_bbb.fit(model, guide, (x, y), epochs=2, lr_final=1e-4, optimizer=pyro.optim.Adam({"lr": 1e-2}))
    with pytest.raises(ValueError, match="lr_final"):
        pyro_bbb.fit(model, guide, (x, y), epochs=2, lr_final=0.0)


@pytest.mark.parametrize("kl_weight", ["auto", 1])
def test_validation_data_the_model_cannot_score_is_an_error_with_everything_put_back(kl_weight):
    """Integer inputs (allowed: token ids) or the wrong width of a sequence (a table's is refused up front) are found
    only when the model scores them, after the first epoch: the parameters, the optimizer's state and lr_final's rate
    go back to the start of fit."""
    pyro.clear_param_store()
    x, y = torch.randn(40, 3), torch.randn(40)
    model = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(0.5))
    guide = pyro_bbb.MeanFieldGuide(model)
    guide(x, y)
    optimizer = pyro_bbb.optim.Adam(lr=0.05)
    before = {name: value.detach().clone() for name, value in pyro.get_param_store().items()}
    for bad_x in (torch.randint(0, 3, (8, 3)), torch.randn(8, 2, 4)):
        with pytest.raises(DataError, match=r"(?s)validation_data could not be scored after epoch 1: .*restored"):
            pyro_bbb.fit(model, guide, (x, y), epochs=3, batch_size=16, optimizer=optimizer, lr_final=1e-4,
                         validation_data=(bad_x, torch.randn(8)), kl_weight=kl_weight, progress=False, seed=0)
        assert all(torch.equal(before[name], value) for name, value in pyro.get_param_store().items())
        assert optimizer.defaults["lr"] == 0.05 and optimizer.get_state() == {}
    pyro_bbb.fit(model, guide, (x, y), epochs=3, batch_size=16, optimizer=optimizer, lr_final=1e-4,
                 kl_weight=kl_weight, progress=False, seed=0)
    assert optimizer.defaults["lr"] == 0.05  # the next fit's schedule starts where this one's did


def test_the_gradient_check_finds_any_non_finite_element_and_leaves_finite_gradients_as_they_are():
    from pyro_bbb._internals import all_finite

    big = torch.full((4,), 3e38)  # finite, though its sum overflows float32
    grads = [torch.randn(3, 2), big.clone(), torch.randn(5, dtype=torch.float64)]
    before = [g.clone() for g in grads]
    assert all_finite(grads) and all_finite([])
    assert all(torch.equal(a, b) for a, b in zip(grads, before))
    for bad in (float("nan"), float("inf"), -float("inf")):
        broken = [g.clone() for g in grads]
        broken[2][3] = bad
        assert not all_finite(broken)
    assert not all_finite([torch.tensor([1.0, float("nan")], dtype=torch.float16)])


def test_the_gradient_check_falls_back_to_sums_without_torchs_amp_kernel(monkeypatch):
    from pyro_bbb._internals import all_finite

    def missing(*args):
        raise NotImplementedError("no kernel for this backend")

    monkeypatch.setattr(torch, "_amp_foreach_non_finite_check_and_unscale_", missing)
    assert all_finite([torch.ones(3), torch.zeros(2)])
    assert not all_finite([torch.ones(3), torch.tensor([0.0, float("inf")])])




def test_an_error_raised_inside_the_model_reaches_the_user_once_without_pyros_shape_table():
    """Pyro's trace re-raises a model's ValueError with its shape table appended, once per nested trace; fit, SVI
    through pyro_bbb.ELBO and predict give the user the error as it was raised."""
    bnn = pyro_bbb.BNN(BayesianLinear(3, 2), likelihoods.Bernoulli())  # two logits for a Bernoulli: a clear error
    guide = pyro_bbb.MeanFieldGuide(bnn)
    x, y = torch.randn(20, 3), torch.randint(0, 2, (20,)).float()
    svi = pyro.infer.SVI(bnn, guide, pyro_bbb.optim.Adam(), pyro_bbb.ELBO(num_data=20))
    for run in (lambda: pyro_bbb.fit(bnn, guide, (x, y), epochs=1, progress=False), lambda: svi.step(x, y),
                lambda: pyro_bbb.predict(bnn, guide, x, num_samples=2)):
        with pytest.raises(ValueError, match="expects the network to output shape") as caught:
            run()
        assert "Trace Shapes" not in str(caught.value) and caught.value.__cause__ is None


def test_a_bad_dataloader_batch_also_gives_back_a_pyro_bbb_optimizers_state():
    """The optimizer a user passes keeps its moments from before this fit when a later batch is bad: resuming then
    continues the earlier run, not one with the failed epochs' moments."""
    x, y = small_data(64)
    labels = (y > 0).long()
    labels[60] = 3  # only 3 logits
    model = _classifier()
    guide = pyro_bbb.MeanFieldGuide(model)
    optimizer = pyro_bbb.optim.Adam(lr=1e-2)
    fit(model, guide, (x[:8], labels[:8].clamp_max(2)), optimizer=optimizer, epochs=2)
    before = optimizer.get_state()
    loader = DataLoader(ListDataset(x, labels), batch_size=16, shuffle=False)
    with pytest.raises(ValueError, match="label is 3"):
        fit(model, guide, loader, epochs=2, optimizer=optimizer)
    after = optimizer.get_state()
    assert before.keys() == after.keys() and all(
        torch.equal(before[name][key], after[name][key]) for name in before for key in before[name]
    )


@pytest.mark.parametrize("restore_best", [True, False])
def test_early_stopping_records_the_kl_weight_of_the_epochs_it_keeps(restore_best):
    """A warm-up with early stopping put back epoch 1 (weight 0.25) and recorded the last epoch's weight 1: 'the
    Bayes posterior' in summary, the export and save. Without restore_best the last epoch's parameters stay, and
    its weight is the one recorded."""
    from pyro_bbb.infer.schedules import LinearWarmup

    pyro.clear_param_store()
    torch.manual_seed(0)
    x = torch.randn(120, 2)
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(120)
    model = pyro_bbb.BNN(torch.nn.Sequential(BayesianLinear(2, 32), torch.nn.Tanh(), BayesianLinear(32, 1)),
                         likelihoods.Gaussian(scale=0.1))
    guide = pyro_bbb.MeanFieldGuide(model)
    history = pyro_bbb.fit(model, guide, (x[:100], y[:100]), epochs=10, batch_size=25, lr=0.03, progress=False,
                           seed=0, kl_weight=LinearWarmup(12), validation_data=(x[100:], y[100:]),
                           early_stopping=pyro_bbb.EarlyStopping(patience=3, restore_best=restore_best))
    weights, best = history["kl_weight"], history.best_epoch
    assert len(history) == best + 3 < 10 and weights[best - 1] < weights[-1]  # stopped after three worse epochs
    kept = weights[best - 1] if restore_best else weights[-1]
    assert history.kl_weight_choice.kl_weight == kept
    assert pyro_bbb.infer.tempering.kl_weight_of(guide).kl_weight == kept


@pytest.mark.parametrize("kl_weight", [1.0, "auto"])
def test_a_callbacks_value_error_puts_the_parameters_and_the_record_back_whatever_the_weight(kl_weight):
    x, y = small_data(60)
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    fit(model, guide, (x, y), epochs=1, kl_weight=0.5)
    record = pyro_bbb.infer.tempering.kl_weight_of(guide)
    before = params()

    def failing(epoch, history):
        if epoch == 2:
            raise ValueError("my callback failed")

    with pytest.raises(ValueError, match="my callback failed"):
        fit(model, guide, (x, y), epochs=4, kl_weight=kl_weight, callbacks=[failing])
    after = params()
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert pyro_bbb.infer.tempering.kl_weight_of(guide) is record


@pytest.mark.parametrize("kl_weight", [1.0, "auto"])
def test_a_rollback_puts_back_batch_norms_statistics_too(kl_weight):
    """restore_initial put back the parameters only: after a callback's ValueError (or a bad batch) with a number as
    the weight, batch norm kept the running statistics of the steps that were undone; with "auto" the guide's set-up
    pass (before the snapshot) moved them."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    x, y = torch.randn(60, 3), torch.randn(60)
    net = torch.nn.Sequential(BayesianLinear(3, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), BayesianLinear(8, 1))
    model = pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.5))
    guide = pyro_bbb.MeanFieldGuide(model)
    statistics = {name: value.clone() for name, value in net[1].named_buffers()}

    def failing(epoch, history):
        raise ValueError("my callback failed")

    with pytest.raises(ValueError, match="my callback failed"):
        pyro_bbb.fit(model, guide, (x * 3 + 2, y), epochs=2, batch_size=20, progress=False, kl_weight=kl_weight,
                     callbacks=[failing])
    for name, value in net[1].named_buffers():
        assert torch.equal(value, statistics[name]), name


def test_callbacks_see_the_chosen_weight_as_the_posteriors_while_the_final_fit_trains():
    """They saw history.kl_weight_choice None and a guide record chosen_by 'user': a save in a callback (per-epoch
    checkpoints) wrote the wrong provenance."""
    pyro.clear_param_store()
    x, y = small_data(80)
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    seen = []
    history = fit(model, guide, (x, y), epochs=12, seed=0,
                  callbacks=[lambda epoch, h: seen.append((h.kl_weight_choice, kl_weight_of(guide)))])
    assert len(seen) == 12
    for shown, recorded in seen:
        assert shown == recorded == history.kl_weight_choice and shown.chosen_by == "validation"


@pytest.mark.parametrize("callbacks", [lambda epoch, history: None, [None], 3])
def test_callbacks_that_are_not_a_list_of_callables_are_refused_before_anything_trains(callbacks):
    pyro.clear_param_store()
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    x, y = small_data(40)
    guide(x, y)
    before = params()
    with pytest.raises(TypeError, match=r"callbacks must be a list of callables"):
        fit(model, guide, (x, y), epochs=2, callbacks=callbacks)
    assert all(torch.equal(value, before[name]) for name, value in params().items())
    assert kl_weight_of(guide) is None


def test_a_pyro_optimizers_state_is_rolled_back_with_the_parameters_at_a_number_too():
    """Only pyro_bbb's optimizers were rolled back with a number as the weight: Pyro's Adam kept the undone steps'
    moments and counts (with "auto" it was rolled back)."""
    pyro.clear_param_store()
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    x, y = small_data(40)
    optimizer = pyro.optim.Adam({"lr": 1e-2})
    fit(model, guide, (x, y), epochs=1, batch_size=20, optimizer=optimizer, kl_weight=1.0)
    states = {p: {k: v.clone() if torch.is_tensor(v) else v for k, v in obj.state_dict()["state"][0].items()}
              for p, obj in optimizer.optim_objs.items()}
    with pytest.raises(DataError, match="validation_data"):
        fit(model, guide, (x, y), epochs=1, batch_size=20, optimizer=optimizer, kl_weight=1.0,
            validation_data=(torch.randn(10, 3, 4), torch.randn(10)))  # (found after the first epoch)
    for p, obj in optimizer.optim_objs.items():
        for key, value in obj.state_dict()["state"][0].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(states[p][key])), key


def test_data_that_is_not_an_x_y_pair_is_named_with_the_fix():
    x, y = small_data(20)
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    with pytest.raises(TypeError, match=r"got a tuple of 3.*\(\(x1, \.\.\., x2\), y\)"):
        fit(model, guide, (x, x, y), epochs=1, kl_weight=1)
    with pytest.raises(TypeError, match=r"got TensorDataset.*DataLoader\(dataset, batch_size=64"):
        fit(model, guide, TensorDataset(x, y), epochs=1, kl_weight=1)
    three = DataLoader(TensorDataset(x, x, y), batch_size=5)
    with pytest.raises(DataError, match=r"batch 1 is a list of 3.*\(\(x1, \.\.\., x2\), y\)"):
        fit(model, guide, three, epochs=1, kl_weight=1)


def test_a_validation_set_or_monitor_that_cannot_work_is_refused_before_training():
    """Both were found after the selection and a first epoch."""
    pyro.clear_param_store()
    x, y = small_data(40)
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    with pytest.raises(ValueError, match="validation_data's x has 4 features, the training data's 2"):
        fit(model, guide, (x, y), epochs=2, validation_data=(torch.randn(10, 4), torch.randn(10)))
    with pytest.raises(ValueError, match="watches a classifier's metric, but the model is a regression: monitor "
                                         "val_rmse"):
        fit(model, guide, (x, y), epochs=2, validation_data=(x[:10], y[:10]),
            early_stopping=pyro_bbb.EarlyStopping(patience=3, monitor="val_accuracy", mode="max"))
    assert not pyro.get_param_store().keys()  # nothing trained, nothing made



@pytest.mark.parametrize("kl_weight", [1.0, "auto"])
def test_validation_data_leaves_the_training_run_as_it_was(kl_weight):
    """Scoring validation_data after each epoch draws weights from the random stream that the next epoch's shuffle
    and weight draws read: the same seeded fit ended elsewhere with validation_data than without (1.5e-3 in a
    parameter). It draws from a fork now: the same parameters, bit for bit."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 3, generator=g), torch.randint(0, 3, (40,), generator=g)
    x_val, y_val = torch.randn(20, 3, generator=g), torch.randint(0, 3, (20,), generator=g)

    def run(validation):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        bnn = pyro_bbb.BNN(torch.nn.Sequential(BayesianLinear(3, 8), torch.nn.Tanh(), BayesianLinear(8, 3)),
                           likelihoods.Categorical())
        guide = pyro_bbb.MeanFieldGuide(bnn)
        history = pyro_bbb.fit(bnn, guide, (x, y), epochs=3, batch_size=10, kl_weight=kl_weight,
                               validation_data=(x_val, y_val) if validation else None, progress=False)
        return params(), history

    (without, _), (with_validation, history) = run(False), run(True)
    assert "val_log_likelihood" in history.last
    assert without.keys() == with_validation.keys()
    for name in without:
        assert torch.equal(without[name], with_validation[name]), name


def test_a_guide_list_whose_normal_part_reaches_no_site_is_said_to_give_no_per_layer_columns():
    """A misspelt expose= leaves the Normal part without sites: the History says it has no per-layer columns."""
    import warnings

    from pyro.infer import autoguide

    x, y = small_data()
    model = regression_model()
    guide = autoguide.AutoGuideList(model)
    guide.append(autoguide.AutoNormal(pyro.poutine.block(model, expose=["net.0.weights"])))  # (sic)
    guide.append(autoguide.AutoDelta(pyro.poutine.block(model, hide=["net.0.weights"])))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = fit(model, guide, (x, y), epochs=2, batch_size=16, seed=0)
    assert "kl_by_layer" not in history.keys()
    assert sum("hold no latent site" in str(w.message) for w in caught) == 1


def test_a_warm_up_longer_than_training_says_the_posterior_is_tempered():
    """LinearWarmup(100) over a fit of 12 steps ended at weight 0.11 and was recorded as given, without a word."""
    from pyro_bbb.infer.schedules import LinearWarmup

    x, y = small_data(64)
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    with pytest.warns(UserWarning, match=r"12 steps into LinearWarmup.*tempered at KL weight 0.11, not 1"):
        history = pyro_bbb.fit(model, guide, (x, y), epochs=3, batch_size=16, progress=False,
                               kl_weight=LinearWarmup(100))
    assert history["kl_weight"][-1] == pytest.approx(0.11)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a ramp the fit finishes: not a word
        pyro_bbb.fit(model, guide, (x, y), epochs=3, batch_size=16, progress=False, kl_weight=LinearWarmup(12))


@pytest.mark.parametrize("kl_weight", [1.0, "auto"])
def test_a_pyro_learning_rate_scheduler_steps_once_per_epoch(kl_weight):
    """fit never stepped a pyro.optim.ExponentialLR (its rate stayed 0.01 over every epoch, without a word), though
    the lr_final error tells users to give their optimizer its own schedule. ReduceLROnPlateau gets its metric."""
    x, y = small_data(64)
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    scheduler = pyro.optim.ExponentialLR({"optimizer": torch.optim.Adam, "optim_args": {"lr": 0.01}, "gamma": 0.5})
    pyro_bbb.fit(model, guide, (x, y), epochs=3, batch_size=16, optimizer=scheduler, kl_weight=kl_weight,
                 progress=False)
    rates = [group["lr"] for s in scheduler.optim_objs.values() for group in s.optimizer.param_groups]
    assert rates and rates == pytest.approx([0.01 * 0.5 ** 3] * len(rates))
    plateau = pyro.optim.ReduceLROnPlateau({"optimizer": torch.optim.Adam, "optim_args": {"lr": 0.01},
                                            "patience": 0, "factor": 0.5})
    fresh = regression_model()
    pyro_bbb.fit(fresh, pyro_bbb.MeanFieldGuide(fresh), (x[:48], -y[:48]), epochs=3, batch_size=16,
                 optimizer=plateau, kl_weight=1.0, progress=False, validation_data=(x[48:], y[48:]))
    assert all(s.last_epoch == 3 for s in plateau.optim_objs.values())  # (stepped with a metric each epoch)
