"""pyro_bbb: Bayes-by-Backprop Bayesian neural networks in Pyro, correct by construction.

The happy path (``model -> guide -> fit -> predict``) is at the top level, with what a user reaches for around it
(the estimators as effect handlers, checkpoints, the posterior summary and the evidence); everything else lives in
packages by role: :mod:`pyro_bbb.nn` (layers, ``bayesianize``), :mod:`pyro_bbb.infer` (guide, ELBO, estimators,
schedules), :mod:`pyro_bbb.optim`, :mod:`pyro_bbb.train` (``fit``, its history, early stopping, one training step),
:mod:`pyro_bbb.prediction`, :mod:`pyro_bbb.evaluate` (metrics, diagnostics, plots, export, model selection) and
:mod:`pyro_bbb.data`; the modules a model is written with (:mod:`~pyro_bbb.priors`, :mod:`~pyro_bbb.likelihoods`)
sit beside them. One name per thing: ``pyro_bbb.evaluate.metrics``, not an alias at the top.

Examples
--------
>>> x, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
>>> bnn = pyro_bbb.BNN(BayesianLinear(4, 3), likelihood=likelihoods.Categorical())
>>> guide = pyro_bbb.MeanFieldGuide(bnn)
>>> history = pyro_bbb.fit(bnn, guide, (x, y), epochs=2, batch_size=16, progress=False)
>>> pyro_bbb.predict(bnn, guide, x[:5], num_samples=10).probs.shape
torch.Size([5, 3])
"""

from . import data, evaluate, infer, likelihoods, nn, optim, prediction, priors, train
from ._version import __version__ as __version__
from .bnn import BNN
from .checkpoint import load, save
from .evaluate import evidence, summary
from .infer import ELBO, MeanFieldGuide, flipout, local_reparameterization, moment_propagation
from .nn import bayesianize
from .prediction import predict
from .train import EarlyStopping, TrainingDivergedError, fit

__all__ = [
    "BNN", "bayesianize", "MeanFieldGuide", "ELBO", "fit", "predict", "evidence", "summary", "save", "load",
    "flipout", "local_reparameterization", "moment_propagation", "EarlyStopping", "TrainingDivergedError",
    "nn", "infer", "optim", "train", "prediction", "evaluate", "data", "priors", "likelihoods",
]
