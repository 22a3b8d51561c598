"""Pruning by signal-to-noise (pyro_bbb.evaluate.pruning)."""

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
