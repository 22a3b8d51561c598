"""pyro_bbb: Bayes-by-Backprop Bayesian neural networks in Pyro, correct by construction.

The happy path (``model -> guide -> fit -> predict``) is at the top level; the rest lives in packages by role:
:mod:`pyro_bbb.nn` (layers, moment propagation, ``bayesianize``), :mod:`pyro_bbb.infer` (guide, ELBO, estimators,
schedules), :mod:`pyro_bbb.train` (``fit`` and what goes with it), :mod:`pyro_bbb.prediction`,
:mod:`pyro_bbb.evaluate` (metrics, diagnostics, plots, export) and :mod:`pyro_bbb.data`; the modules a model is
written with (:mod:`~pyro_bbb.priors`, :mod:`~pyro_bbb.likelihoods`, :mod:`~pyro_bbb.optim`) sit beside them.
``pyro_bbb.schedules``, ``metrics``, ``plots``, ``diagnostics`` and ``datasets`` name the modules of those
packages that a script reaches for most.

Examples
--------
>>> x, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
>>> bnn = pyro_bbb.BNN(BayesianLinear(4, 3), likelihood=likelihoods.Categorical())
>>> guide = pyro_bbb.MeanFieldGuide(bnn)
>>> history = pyro_bbb.fit(bnn, guide, (x, y), epochs=2, batch_size=16, progress=False)
>>> pyro_bbb.predict(bnn, guide, x[:5], num_samples=10).probs.shape
torch.Size([5, 3])
"""

from . import data, distributions, evaluate, infer, likelihoods, nn, optim, plates, prediction, priors, train
from ._version import __version__
from .bnn import BNN
from .checkpoint import load, save
from .data import DataError
from .data import datasets as datasets
from .evaluate import diagnostics, evidence, metrics, plots, summary, to_inference_data
from .infer import (
    DEFAULT_INIT_SCALE,
    ELBO,
    FlipoutMessenger,
    LocalReparameterizationMessenger,
    MeanFieldGuide,
    MomentPropagationMessenger,
    flipout,
    local_reparameterization,
    moment_propagation,
    schedules,
)
from .nn import bayesianize
from .prediction import ClassificationPrediction, Prediction, RegressionPrediction, predict, set_up_guide
from .train import EarlyStopping, History, TrainingDivergedError, fit

__all__ = [
    "BNN", "bayesianize", "ELBO", "MeanFieldGuide", "DEFAULT_INIT_SCALE", "flipout", "local_reparameterization",
    "moment_propagation", "FlipoutMessenger", "LocalReparameterizationMessenger", "MomentPropagationMessenger",
    "fit", "EarlyStopping", "History", "TrainingDivergedError", "DataError", "set_up_guide", "predict",
    "Prediction", "RegressionPrediction", "ClassificationPrediction", "save", "load", "summary",
    "to_inference_data", "evidence", "data", "distributions", "evaluate", "infer", "likelihoods", "nn", "optim",
    "plates", "prediction", "priors", "train", "datasets", "diagnostics", "metrics", "plots", "schedules",
    "__version__",
]
