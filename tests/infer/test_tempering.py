"""The record of the KL weight a posterior was trained at."""

import pytest

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


def test_each_guide_has_its_own_record():
    first, second = (pyro_bbb.MeanFieldGuide(BayesianLinear(2, 1)) for _ in range(2))
    record_kl_weight(first, KLWeightChoice(kl_weight=0.1))
    assert kl_weight_of(first).kl_weight == 0.1 and kl_weight_of(second) is None
    record_kl_weight(first, KLWeightChoice(kl_weight=1.0))  # a later fit replaces it
    assert kl_weight_of(first).kl_weight == 1.0
    assert kl_weight_of(object()) is None  # a guide that cannot be weakly referenced: nothing known
