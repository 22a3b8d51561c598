"""The record of the KL weight a posterior was trained at."""

import numpy as np
import pytest
import torch

import pyro_bbb
from pyro_bbb.infer.tempering import KLWeightChoice, kl_weight_of, record_kl_weight
from pyro_bbb.nn import BayesianLinear


def test_a_choice_round_trips_through_plain_values_and_describes_itself():
    choice = KLWeightChoice(kl_weight=0.01, chosen_by="validation", validation_nll={1.0: 0.3, 0.1: 0.06, 0.01: 0.03},
                            validation_nll_se={1.0: 0.02, 0.1: 0.01, 0.01: 0.0}, num_validation=130)
    plain = choice.to_dict()
    assert all(isinstance(v, float | int | str | list | type(None)) for v in plain.values())
    assert KLWeightChoice.from_dict(plain) == choice
    assert choice.tempered and choice.describe() == (
        "KL weight 0.01, chosen by validation NLL (1: 0.3, 0.1: 0.06, 0.01: 0.03; weight 1 13.5 SE behind): tempered")
    assert choice.weight_one_gap_se == pytest.approx((0.3 - 0.03) / 0.02)
    bayes = KLWeightChoice(kl_weight=1.0)
    assert not bayes.tempered and bayes.describe().endswith("the Bayes posterior")
    assert bayes.weight_one_gap_se is None  # weight 1 kept: no gap to report
    kept = KLWeightChoice(kl_weight=1.0, chosen_by="validation", validation_nll={1.0: 0.31, 0.1: 0.3},
                          validation_nll_se={1.0: 0.02, 0.1: 0.0})
    assert kept.weight_one_gap_se is None and "SE behind" not in kept.describe()
    narrow = KLWeightChoice(kl_weight=0.1, chosen_by="validation", validation_nll={1.0: 0.3205, 0.1: 0.3},
                            validation_nll_se={1.0: 0.02, 0.1: 0.0})
    assert "weight 1 1.03 SE behind" in narrow.describe()  # not "1.0", which reads as within the one-SE rule
    narrower = KLWeightChoice(kl_weight=0.1, chosen_by="validation", validation_nll={1.0: 0.30008, 0.1: 0.3},
                              validation_nll_se={1.0: 0.0001, 0.1: 0.0})
    assert "weight 1 0.800 SE behind" not in narrower.describe() and "weight 1 0.8 SE behind" in narrower.describe()
    closest = KLWeightChoice(kl_weight=0.1, chosen_by="validation", validation_nll={1.0: 0.3010040, 0.1: 0.3},
                             validation_nll_se={1.0: 0.001, 0.1: 0.0})
    assert "weight 1 1.004 SE behind" in closest.describe()
    fallback = KLWeightChoice(kl_weight=1.0, chosen_by="fallback", reason="a DataLoader")
    assert "selection not run: a DataLoader" in fallback.describe()


def test_a_bad_record_is_a_clear_error():
    with pytest.raises(ValueError, match="'kl_weight'"):
        KLWeightChoice.from_dict({"weight": 0.1})
    with pytest.raises(TypeError, match="KLWeightChoice"):
        record_kl_weight(pyro_bbb.MeanFieldGuide(BayesianLinear(2, 1)), 0.1)
    for weight in (float("nan"), float("inf"), -0.5, True, "0.1"):  # (a record "KL weight -0.5 ... tempered")
        with pytest.raises(ValueError, match="a KL weight must be a finite number >= 0"):
            KLWeightChoice(kl_weight=weight)
    with pytest.raises(ValueError, match="chosen_by must be one of 'validation', 'user', 'fallback'"):
        KLWeightChoice(kl_weight=0.1, chosen_by="by hand")
    for entry in ({"kl_weight": 0.1, "validation_nll": [[1.0]]}, {"kl_weight": "x"},
                  {"kl_weight": 0.1, "num_validation": "many"}):
        with pytest.raises(ValueError, match="a malformed KL weight record"):
            KLWeightChoice.from_dict(entry)
    assert KLWeightChoice(kl_weight=0).kl_weight == 0  # a warm-up's first weight
    for weight in (torch.tensor(0.5), torch.tensor([0.5]), np.float32(0.5), 1):  # (a schedule's weight), stored as
        assert type(KLWeightChoice(kl_weight=weight).kl_weight) is float  # a float
    with pytest.raises(ValueError, match="a KL weight must be"):
        KLWeightChoice(kl_weight=torch.tensor([0.5, 0.1]))


def test_each_guide_has_its_own_record():
    first, second = (pyro_bbb.MeanFieldGuide(BayesianLinear(2, 1)) for _ in range(2))
    record_kl_weight(first, KLWeightChoice(kl_weight=0.1))
    assert kl_weight_of(first).kl_weight == 0.1 and kl_weight_of(second) is None
    record_kl_weight(first, KLWeightChoice(kl_weight=1.0))  # a later fit replaces it
    assert kl_weight_of(first).kl_weight == 1.0
    assert kl_weight_of(object()) is None  # a guide that cannot be weakly referenced: nothing known


def test_a_users_own_svi_loop_records_the_weight_it_trains_at():
    """evidence, summary, the export and save read the record: after fit at 0.01 and 50 steps of a user's loop at
    weight 1 it said 0.01, and a guide trained only in a user's loop at 0.01 had none."""
    import pyro

    from pyro_bbb import likelihoods

    x, y = torch.randn(40, 3), torch.randn(40)
    pyro.clear_param_store()
    bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(0.5))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    history = pyro_bbb.fit(bnn, guide, (x, y), epochs=1, kl_weight=0.01, progress=False)
    assert kl_weight_of(guide) is history.kl_weight_choice
    svi = pyro.infer.SVI(bnn, guide, pyro_bbb.optim.Adam({"lr": 0.01}), pyro_bbb.ELBO(num_data=40))
    svi.step(x, y)
    assert kl_weight_of(guide) == KLWeightChoice(kl_weight=1.0)
    fresh_guide = pyro_bbb.MeanFieldGuide(bnn)
    tempered = pyro_bbb.ELBO(num_data=40, kl_weight=0.01)
    tempered.loss(bnn, fresh_guide, x, y)  # evaluating is not training: nothing recorded
    assert kl_weight_of(fresh_guide) is None
    pyro.infer.SVI(bnn, fresh_guide, pyro_bbb.optim.Adam({"lr": 0.01}), tempered).step(x, y)
    assert kl_weight_of(fresh_guide) == KLWeightChoice(kl_weight=0.01)
    same = KLWeightChoice(kl_weight=0.01, chosen_by="validation", validation_nll={1.0: 0.5, 0.01: 0.4})
    record_kl_weight(fresh_guide, same)
    pyro.infer.SVI(bnn, fresh_guide, pyro_bbb.optim.Adam({"lr": 0.01}), tempered).step(x, y)
    assert kl_weight_of(fresh_guide) is same  # a record at the same weight, with its scores, is kept


@pytest.mark.parametrize("guide_kind, optimizer", [("MeanFieldGuide", "pyro Adam"), ("AutoNormal", "pyro Adam"),
                                                   ("MeanFieldGuide", "pyro_bbb Adam"),
                                                   ("AutoNormal", "ClippedAdam")])
def test_training_on_with_pyros_own_elbo_after_fit_is_said_wherever_the_record_is_read(tmp_path, guide_kind,
                                                                                        optimizer):
    """fit at 0.05, then Pyro's Trace_ELBO loop (weight 1): summary, the export and save said "KL weight 0.05,
    tempered" of a posterior trained on since at weight 1. Now the record says the guide was trained outside
    pyro_bbb.ELBO, takes the weight as 1, keeps the earlier record in its reason, and survives save/load; calls that
    train nothing (predict, a trace of the guide with gradients on) leave the record as it was, and pyro_bbb.ELBO's
    next training step records its own weight again."""
    import pyro
    from pyro.infer.autoguide import AutoNormal

    from pyro_bbb import likelihoods

    x, y = torch.randn(40, 3), torch.randn(40)
    pyro.clear_param_store()
    bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(0.5), num_data=40)
    guide = pyro_bbb.MeanFieldGuide(bnn) if guide_kind == "MeanFieldGuide" else AutoNormal(bnn)
    history = pyro_bbb.fit(bnn, guide, (x, y), epochs=2, kl_weight=0.05, progress=False)
    given = history.kl_weight_choice
    pyro_bbb.predict(bnn, guide, x)
    pyro.poutine.trace(guide).get_trace(x, y)  # (gradients on, nothing trained)
    assert kl_weight_of(guide) is given
    # (pyro_bbb's Adam runs torch's fused kernel, ClippedAdam writes .data: neither moves torch's version counter)
    optim = {"pyro Adam": pyro.optim.Adam, "pyro_bbb Adam": pyro_bbb.optim.Adam,
             "ClippedAdam": pyro.optim.ClippedAdam}[optimizer]({"lr": 0.01})
    svi = pyro.infer.SVI(bnn, guide, optim, pyro.infer.Trace_ELBO())
    svi.loss_and_grads(bnn, guide, x, y)  # gradients, no step yet: nothing trained
    assert kl_weight_of(guide) is given
    for _ in range(3):
        svi.step(x, y)
    choice = kl_weight_of(guide)
    assert choice.chosen_by == "outside" and choice.kl_weight == 1.0 and not choice.tempered
    assert choice.describe().startswith("KL weight 1 assumed (trained outside pyro_bbb.ELBO since its record")
    assert choice.describe().endswith("the Bayes posterior if so")
    assert "trained outside pyro_bbb.ELBO" in choice.describe() and "'KL weight 0.05 (given): tempered'" in \
        choice.reason
    assert kl_weight_of(guide) is choice  # said once, kept until a new record
    svi.step(x, y)
    assert kl_weight_of(guide) is choice  # (no reason nested in a reason)
    assert pyro_bbb.summary(bnn, guide)["kl_weight"].eq(1.0).all()
    pyro_bbb.save(tmp_path / "m.pt", bnn, guide)
    pyro.clear_param_store()
    bnn2 = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(0.5), num_data=40)
    guide2 = pyro_bbb.load(tmp_path / "m.pt", bnn2, pyro_bbb.MeanFieldGuide(bnn2) if guide_kind == "MeanFieldGuide"
                           else AutoNormal(bnn2))
    assert kl_weight_of(guide2) == choice
    tempered = pyro_bbb.ELBO(num_data=40, kl_weight=0.05)
    pyro.infer.SVI(bnn2, guide2, pyro.optim.Adam({"lr": 0.01}), tempered).step(x, y)
    assert kl_weight_of(guide2) == KLWeightChoice(kl_weight=0.05)  # pyro_bbb.ELBO's own training records again


def test_a_fit_that_fails_puts_back_the_record_it_found():
    import pyro

    from pyro_bbb import likelihoods

    x, y = torch.randn(40, 3), torch.randn(40)
    pyro.clear_param_store()
    bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(0.5))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (x, y), epochs=1, kl_weight=0.01, progress=False)
    before = kl_weight_of(guide)
    with pytest.raises(ValueError, match="restored"):  # the validation data's error comes after the training steps
        pyro_bbb.fit(bnn, guide, (x, y), epochs=1, kl_weight=1.0, progress=False,
                     validation_data=(torch.randn(5, 2, 4), torch.randn(5)))
    assert kl_weight_of(guide) is before


def test_every_point_estimate_guide_is_recorded_as_one_and_described_so():
    """AutoLaplaceApproximation (a MAP estimate until its laplace_approximation()) and a list of point estimates were
    described as 'tempered' posteriors; a list with a real posterior in it is not a point estimate."""
    from pyro.infer.autoguide import AutoDelta, AutoGuideList, AutoLaplaceApproximation, AutoNormal
    from pyro.poutine import block

    model = BayesianLinear(2, 1)
    both = AutoGuideList(model)
    both.append(AutoDelta(block(model, expose=["weight"])))
    both.append(AutoLaplaceApproximation(block(model, expose=["bias"])))
    mixed = AutoGuideList(model)
    mixed.append(AutoDelta(block(model, expose=["weight"])))
    mixed.append(AutoNormal(block(model, expose=["bias"])))
    for guide, point in [(AutoLaplaceApproximation(model), True), (both, True), (mixed, False),
                         (AutoDelta(model), True), (pyro_bbb.MeanFieldGuide(model), False)]:
        record_kl_weight(guide, KLWeightChoice(kl_weight=0.1))
        assert kl_weight_of(guide).point_estimate is point
        assert ("MAP point estimate" in kl_weight_of(guide).describe()) is point
