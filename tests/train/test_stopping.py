import math

import pyro
import pytest
import torch
from pyro.infer import autoguide
from torch.utils.data import DataLoader, TensorDataset

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb.nn import BayesianLinear
from pyro_bbb.train.stopping import EarlyStopping

from ..helpers import params, regression_model, small_data


def data():
    return small_data(n=80)


def fit_recording(model, guide, train, **kwargs):
    """fit, with every epoch's parameter values kept (callbacks run after the epoch's record)."""
    seen = {}

    def keep(epoch, history):
        seen[epoch] = params()

    kwargs.setdefault("progress", False)
    history = pyro_bbb.fit(model, guide, train, callbacks=[keep], **kwargs)
    return history, seen


def assert_params_equal(a, b):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)


def test_improvement_patience_and_mode():
    stop = EarlyStopping(patience=2)
    values = [-1.0, -0.5, -0.5, math.nan, -0.4]
    assert [stop.improved(e, {"val_log_likelihood": v}) for e, v in enumerate(values, 1)] == [
        True, True, False, False, True]
    assert stop.best_epoch == 5 and stop.best_value == -0.4
    assert not stop.should_stop(6) and stop.should_stop(7) and stop.stopped_epoch == 7
    loss = EarlyStopping(patience=1, monitor="loss", min_delta=0.5)
    assert loss.mode == "min"
    assert [loss.improved(e, {"loss": v}) for e, v in enumerate([10.0, 9.7, 9.4], 1)] == [True, False, True]
    stop.reset()
    assert stop.best_epoch is None and stop.stopped_epoch is None and stop.best_value == -math.inf


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"patience": 0}, "patience"),
        ({"patience": 2, "monitor": "val_loglik"}, "monitor must be one of"),
        ({"patience": 2, "mode": "up"}, "mode"),
        ({"patience": 2, "min_delta": -1.0}, "min_delta"),
    ],
)
def test_bad_settings_are_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EarlyStopping(**kwargs)


def test_fit_stops_after_patience_and_returns_the_best_epochs_parameters():
    x, y = data()
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    # validation targets of the opposite sign: the better the net fits, the worse it validates, so it must stop
    stop = EarlyStopping(patience=3)
    history, seen = fit_recording(model, guide, (x[:60], y[:60]), epochs=100, batch_size=16, lr=3e-2, seed=0,
                                  validation_data=(x[60:], -y[60:]), early_stopping=stop)
    values = history["val_log_likelihood"]
    best = max(range(len(values)), key=values.__getitem__) + 1
    assert history.best_epoch == stop.best_epoch == best
    assert history.stopped_epoch == stop.stopped_epoch == len(history) == best + 3 < 100
    assert history.to_dict()["best_epoch"] == best and history.to_dict()["stopped_epoch"] == best + 3
    assert_params_equal(params(), seen[best])
    assert any(not torch.equal(seen[best][k], seen[len(history)][k]) for k in seen[best])  # the rewind mattered


def test_all_epochs_run_still_return_the_best_and_restore_best_false_keeps_the_last():
    x, y = data()
    for restore_best in (True, False):
        pyro.clear_param_store()
        model = regression_model()
        stop = EarlyStopping(patience=100, restore_best=restore_best)
        history, seen = fit_recording(model, pyro_bbb.MeanFieldGuide(model), (x[:60], y[:60]), epochs=8,
                                      batch_size=16, lr=3e-2, seed=1, validation_data=(x[60:], -y[60:]),
                                      early_stopping=stop)
        assert len(history) == 8 and history.stopped_epoch is None
        assert history.best_epoch == 1 + max(range(8), key=history["val_log_likelihood"].__getitem__)
        assert_params_equal(params(), seen[history.best_epoch if restore_best else 8])


def test_the_historys_repr_shows_the_kl_weight_of_the_epoch_it_restored():
    """Under a warm-up, the restored best epoch's weight (the guide's record) beside its number: the last epoch's
    alone was not the weight of the parameters fit returned."""
    from pyro_bbb.infer.schedules import LinearWarmup
    from pyro_bbb.infer.tempering import kl_weight_of

    x, y = data()
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    history = pyro_bbb.fit(model, guide, (x[:60], y[:60]), epochs=8, batch_size=16, lr=3e-2, seed=1, progress=False,
                           validation_data=(x[60:], -y[60:]), early_stopping=EarlyStopping(patience=100),
                           kl_weight=LinearWarmup(30))
    best = history.best_epoch
    assert best < 8 and history["kl_weight"][best - 1] < history["kl_weight"][-1]
    assert kl_weight_of(guide).kl_weight == history["kl_weight"][best - 1]
    assert repr(history).endswith(f"kl_weight={history['kl_weight'][-1]:.3g}, best epoch {best} at "
                                  f"kl_weight={history['kl_weight'][best - 1]:.3g})")


def test_monitoring_the_training_loss_needs_no_validation_data():
    x, y = data()
    model = regression_model()
    history, seen = fit_recording(model, pyro_bbb.MeanFieldGuide(model), (x, y), epochs=6, batch_size=16, seed=0,
                                  early_stopping=EarlyStopping(patience=50, monitor="loss"))
    assert history.best_epoch == 1 + min(range(6), key=history["loss"].__getitem__)
    assert_params_equal(params(), seen[history.best_epoch])


def test_one_instance_serves_a_second_fit_afresh():
    x, y = data()
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    stop = EarlyStopping(patience=3)
    kwargs = dict(batch_size=16, lr=3e-2, progress=False, validation_data=(x[60:], -y[60:]), early_stopping=stop)
    pyro_bbb.fit(model, guide, (x[:60], y[:60]), epochs=30, seed=0, **kwargs)
    history = pyro_bbb.fit(model, guide, (x[:60], y[:60]), epochs=2, seed=1, **kwargs)
    assert stop.stopped_epoch is None and stop.best_epoch in (1, 2) and history.best_epoch == stop.best_epoch


def test_with_a_dataloader_and_pyros_autonormal():
    x, y = data()
    model = regression_model()
    guide = autoguide.AutoNormal(model)
    loader = DataLoader(TensorDataset(x[:60], y[:60]), batch_size=16, shuffle=True)
    history, seen = fit_recording(model, guide, loader, epochs=40, seed=0, lr=3e-2,
                                  validation_data=(x[60:], -y[60:]), early_stopping=EarlyStopping(patience=2))
    assert history.stopped_epoch == len(history) == history.best_epoch + 2
    assert_params_equal(params(), seen[history.best_epoch])


def test_a_validation_metric_without_validation_data_is_an_error_before_anything_changes():
    x, y = data()
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    with pytest.raises(ValueError, match="validation_data"):
        pyro_bbb.fit(model, guide, (x, y), epochs=3, progress=False, early_stopping=EarlyStopping(patience=2))
    assert len(pyro.get_param_store()) == 0


def test_a_metric_the_model_does_not_record_is_an_error_with_the_parameters_restored():
    x = torch.randn(60, 2)
    labels = (x[:, 0] > 0).long()
    model = pyro_bbb.BNN(BayesianLinear(2, 2), likelihoods.Categorical())
    guide = pyro_bbb.MeanFieldGuide(model)
    pyro_bbb.fit(model, guide, (x, labels), epochs=1, progress=False, seed=0)
    before = params()
    with pytest.raises(ValueError, match="watches a regression's metric, but the model is a classifier"):
        pyro_bbb.fit(model, guide, (x, labels), epochs=3, progress=False, validation_data=(x, labels),
                     early_stopping=EarlyStopping(patience=2, monitor="val_rmse"))  # (a BNN: known before training)
    assert_params_equal(params(), before)
    # a hand-written model's kind is known only from what predict returns: after the first epoch, put back
    from ..helpers import Regression

    pyro.clear_param_store()
    model = Regression(in_features=2)
    guide = pyro_bbb.MeanFieldGuide(model)
    y = x.sum(-1)
    pyro_bbb.fit(model, guide, (x, y), epochs=1, progress=False, seed=0, kl_weight=1)
    before = params()
    with pytest.raises(ValueError, match="val_accuracy.*restored to their state at the start of fit"):
        pyro_bbb.fit(model, guide, (x, y), epochs=3, progress=False, validation_data=(x, y),
                     early_stopping=EarlyStopping(patience=2, monitor="val_accuracy"))
    assert_params_equal(params(), before)


def test_not_an_early_stopping_object_is_a_type_error():
    x, y = data()
    model = regression_model()
    with pytest.raises(TypeError, match="EarlyStopping"):
        pyro_bbb.fit(model, pyro_bbb.MeanFieldGuide(model), (x, y), epochs=1, progress=False, early_stopping=5)


def test_the_progress_bar_shows_the_best_epoch(capsys):
    x, y = data()
    model = regression_model()
    pyro_bbb.fit(model, pyro_bbb.MeanFieldGuide(model), (x[:60], y[:60]), epochs=3, validation_data=(x[60:], y[60:]),
                 early_stopping=EarlyStopping(patience=5))
    assert "best=" in capsys.readouterr().err


def test_a_training_loss_is_not_watched_across_a_kl_schedule_and_nothing_changes():
    """Under a warm-up the loss rises with the KL weight: monitor='loss' stopped at epoch 3 and put back epoch 1's
    parameters, a posterior at weight 0.075, without a word. Refused before anything trains; a held-out metric, or
    a training loss at one weight, stays allowed."""
    from pyro_bbb.infer.schedules import Constant, LinearWarmup

    x, y = data()
    model = regression_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    guide(x, y)
    before = params()
    for monitor in ("loss", "nll", "kl", "loss_per_datum"):
        with pytest.raises(ValueError, match=rf"monitor='{monitor}'.*LinearWarmup.*val_log_likelihood"):
            pyro_bbb.fit(model, guide, (x, y), epochs=4, batch_size=20, progress=False, kl_weight=LinearWarmup(40),
                         early_stopping=EarlyStopping(2, monitor=monitor))
    assert_params_equal(params(), before)
    pyro_bbb.fit(model, guide, (x, y), epochs=2, batch_size=20, progress=False, kl_weight=Constant(0.5),
                 early_stopping=EarlyStopping(2, monitor="loss"))
    pyro_bbb.fit(model, guide, (x[:60], y[:60]), epochs=2, batch_size=20, progress=False,
                 kl_weight=LinearWarmup(6), validation_data=(x[60:], y[60:]), early_stopping=EarlyStopping(2))


def test_min_delta_takes_numpy_numbers():
    np = pytest.importorskip("numpy")
    assert EarlyStopping(3, min_delta=np.float32(0.25)).min_delta == 0.25
