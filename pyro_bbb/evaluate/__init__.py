"""Looking at a trained posterior: metrics of predictions (:mod:`~pyro_bbb.evaluate.metrics`), per-layer diagnostics
and summaries (:mod:`~pyro_bbb.evaluate.diagnostics`), pruning by signal-to-noise (:mod:`~pyro_bbb.evaluate.pruning`),
figures (:mod:`~pyro_bbb.evaluate.plots`), model selection by the ELBO
(:mod:`~pyro_bbb.evaluate.model_selection`), post-hoc temperature scaling (:mod:`~pyro_bbb.evaluate.calibration`)
and the ArviZ export (:mod:`~pyro_bbb.evaluate.export`).

Examples
--------
>>> layer = BayesianLinear(3, 2)
>>> guide = MeanFieldGuide(layer, init_scale=0.1)
>>> _ = guide(torch.randn(4, 3))
>>> sorted(pyro_bbb.evaluate.layer_summary(layer, guide)["(root)"])[:3]
['kl', 'kl_per_weight', 'kl_q99']
"""

from . import calibration, diagnostics, metrics, model_selection, plots, pruning
from .calibration import TemperatureScaling, fit_temperature
from .diagnostics import check_posterior, layer_summary, parameter_summary, summary
from .export import to_inference_data
from .model_selection import Evidence, compare_evidence, evidence

__all__ = [
    "diagnostics", "metrics", "plots", "pruning", "summary", "parameter_summary", "layer_summary", "check_posterior",
    "to_inference_data", "model_selection", "Evidence", "evidence", "compare_evidence", "calibration",
    "TemperatureScaling", "fit_temperature",
]
