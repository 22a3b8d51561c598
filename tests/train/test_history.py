"""History: the records, the drift of a trace, the plot."""

import math

import pytest

import pyro_bbb

from ..helpers import regression_model, small_data


def test_history_plot_writes_a_png_with_labelled_axes_and_the_kl_weight_only_when_it_changes(tmp_path):
    model = regression_model()
    history = pyro_bbb.fit(model, pyro_bbb.MeanFieldGuide(model), small_data(), epochs=2, progress=False)
    fig = history.plot(tmp_path / "history.png")
    assert (tmp_path / "history.png").stat().st_size > 1000
    assert len(fig.axes) == 3 and all(ax.get_ylabel() for ax in fig.axes)  # a constant weight: no flat panel
    assert f"KL weight {history.kl_weight_choice.kl_weight:g}" in fig.axes[1].get_title()  # the chosen one
    warmed = pyro_bbb.fit(model, pyro_bbb.MeanFieldGuide(model), small_data(), epochs=3, progress=False,
                          kl_weight=pyro_bbb.infer.schedules.LinearWarmup(4))
    assert [ax.get_title() for ax in warmed.plot().axes][-1] == "KL weight (schedule)"


def test_history_drift_is_the_share_of_progress_made_over_the_last_tail():
    history = pyro_bbb.train.History()
    for epoch in range(1, 101):  # exponential convergence, then a steady linear trace
        history.append({"epoch": epoch, "loss": math.exp(-epoch / 5), "nll": -epoch, "std_ratio": {"a": 1.0}})
    assert history.drift("loss") < 1e-6
    assert history.drift("nll") == pytest.approx(10 / 90)  # still improving at a steady rate: tail / (1 - tail)
    assert history.drift("nll", tail=0.2) == pytest.approx(20 / 80)
    assert history.drift("std_ratio") == {"a": 0.0}
    short = pyro_bbb.train.History()
    for epoch in (1, 2):
        short.append({"epoch": epoch, "loss": 1.0})
    assert math.isnan(short.drift())
    with pytest.raises(ValueError, match="tail"):
        history.drift(tail=0.5)


def test_a_key_no_epoch_has_is_a_key_error_naming_the_keys():
    """history["val_acc"] (a typo), or "val_rmse" on a classifier, gave a list of None: a callback or stopping rule
    then compared Nones (drift raised "must be real number, not NoneType"), far from the typo. A key some epochs have
    (an interrupted epoch's mark) is None where absent; keys() lists every record's keys."""
    from pyro_bbb.train.history import History

    history = History()
    history.append({"epoch": 1, "loss": 3.0, "val_log_likelihood": -1.0})
    history.append({"epoch": 2, "loss": 2.0, "val_log_likelihood": -0.5, "interrupted": True})
    with pytest.raises(KeyError, match=r"no epoch of this History has 'val_acc'; its keys are \['epoch', 'loss', "
                                       r"'val_log_likelihood', 'interrupted'\]"):
        history["val_acc"]
    with pytest.raises(KeyError, match="val_acc"):
        history.drift("val_acc")
    assert history["interrupted"] == [None, True]
    assert History()["loss"] == []  # (no epoch yet: nothing to say a key is wrong)
