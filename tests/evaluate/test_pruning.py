"""Pruning by signal-to-noise (pyro_bbb.evaluate.pruning)."""

import math

import pyro
import pytest
import torch

import pyro_bbb
from pyro_bbb.evaluate import pruning

from ..helpers import digits_fit, fitted_3_5_1


def test_signal_to_noise_and_pruning():
    bnn, guide, x, _ = fitted_3_5_1(init_scale=0.1)
    snr = pruning.signal_to_noise(guide)
    flat = torch.cat([v.reshape(-1) for v in snr.values()])
    pruned, achieved = pruning.prune_by_snr(guide, 0.3)
    n = flat.numel()
    assert achieved == pytest.approx(round(0.3 * n) / n)
    kept = torch.cat([pruned.keep_masks[name].reshape(-1) for name in snr])
    assert flat[~kept].max() <= flat[kept].min()  # the lowest signal-to-noise weights went
    values = pyro.poutine.trace(pruned).get_trace(x).nodes
    for name, keep in pruned.keep_masks.items():
        assert torch.all(values[name]["value"][~keep].abs() < 1e-30)
        assert torch.all(values[name]["value"][keep] != 0)
    # the original guide is untouched
    assert all(torch.all(v["value"] != 0) for k, v in pyro.poutine.trace(guide).get_trace(x).nodes.items()
               if k in snr)
    pred = pyro_bbb.predict(bnn, pruned, x, num_samples=5)
    assert torch.isfinite(pred.mean).all()


@pytest.mark.slow
def test_pruning_half_the_weights_keeps_the_accuracy():
    """Blundell et al. 2015, table 2: removing the low signal-to-noise half of the weights costs little."""
    bnn, guide, _, (_, _, x_test, y_test) = digits_fit(1.0, 300)
    pyro.set_rng_seed(0)
    full = pyro_bbb.evaluate.metrics.accuracy(pyro_bbb.predict(bnn, guide, x_test), y_test)
    pruned, achieved = pruning.prune_by_snr(guide, 0.5)
    half = pyro_bbb.evaluate.metrics.accuracy(pyro_bbb.predict(bnn, pruned, x_test), y_test)
    assert achieved == pytest.approx(0.5, abs=1e-3)
    assert half >= full - 0.02


def test_pruning_a_guide_that_cannot_predict_pruned_is_refused_up_front():
    """AutoNormal was accepted, and the pruned guide failed at predict (no .pruned)."""
    from pyro.infer.autoguide import AutoNormal

    pyro.clear_param_store()
    layer = pyro_bbb.nn.BayesianLinear(3, 2)
    guide = AutoNormal(layer)
    guide(torch.randn(4, 3))
    with pytest.raises(TypeError, match="needs a pyro_bbb.MeanFieldGuide; got AutoNormal"):
        pruning.prune_by_snr(guide, 0.5)
    assert set(pruning.signal_to_noise(guide)) == {"weight", "bias"}  # (the ratios themselves are read from any guide)


def test_a_pruned_guide_keeps_its_guides_records_and_has_no_evidence():
    """PrunedGuide is a new object: the KL weight the guide was trained at and the rows it was trained on were lost
    (the export had no kl_weight attribute, fit_temperature accepted the training rows it refuses for the guide), and
    evidence reported the KL of point masses at zero, a number of the dtype (-570 nats in float32, -4295 in
    float64, against -60 unpruned)."""
    from pyro_bbb import likelihoods
    from pyro_bbb.evaluate import calibration, export, model_selection
    from pyro_bbb.infer.tempering import kl_weight_of
    from pyro_bbb.nn import BayesianLinear

    torch.manual_seed(0)
    pyro.clear_param_store()
    x = torch.randn(30, 2)
    y = (x[:, 0] > 0).long()
    bnn = pyro_bbb.BNN(torch.nn.Sequential(BayesianLinear(2, 4), torch.nn.Tanh(), BayesianLinear(4, 2)),
                       likelihoods.Categorical())
    guide = pyro_bbb.MeanFieldGuide(bnn, init_scale=0.1)
    pyro_bbb.fit(bnn, guide, (x, y), epochs=5, progress=False, kl_weight=0.1)
    pruned, _ = pruning.prune_by_snr(guide, 0.25)
    assert kl_weight_of(pruned) == kl_weight_of(guide) and kl_weight_of(pruned).kl_weight == 0.1
    with pytest.warns(UserWarning, match="tempered"):
        idata = export.to_inference_data(bnn, pruned, x, y, num_samples=5)
    assert idata.posterior.attrs["kl_weight"] == 0.1
    with pytest.raises(ValueError, match="trained on"):
        calibration.fit_temperature(bnn, pruned, (x, y))
    with pytest.raises(ValueError, match=r"PrunedGuide gives \d+% of the weights a point mass.*pruned.guide"):
        model_selection.evidence(bnn, pruned, (x, y), num_draws=2)
    with pytest.raises(ValueError, match=r"PrunedGuide gives \d+%"):
        model_selection.compare_evidence({"full": (bnn, guide), "pruned": (bnn, pruned)}, (x, y), num_draws=2)
    assert math.isfinite(model_selection.evidence(bnn, guide, (x, y), num_draws=2).elbo)
    from pyro_bbb.infer.tempering import KLWeightChoice, record_kl_weight

    record_kl_weight(pruned, KLWeightChoice(kl_weight=0.5))  # written through the view, read the same way
    assert kl_weight_of(pruned).kl_weight == kl_weight_of(guide).kl_weight == 0.5
