"""pyro_bbb: Bayes-by-Backprop Bayesian neural networks in Pyro, correct by construction.

Example
-------
>>> import pyro_bbb
>>> from pyro_bbb.nn import BayesianLinear
>>> guide = pyro_bbb.MeanFieldGuide(BayesianLinear(2, 1))
>>> pyro_bbb.ELBO(num_data=100)
ELBO(num_data=100, kl_weight=Constant(weight=1.0), num_particles=1, vectorize_particles=False, data_plate='data')
"""

from . import nn, priors, schedules
from .elbo import ELBO, DataPlateScaleMessenger
from .guide import DEFAULT_INIT_SCALE, MeanFieldGuide

__version__ = "0.1.0"

__all__ = [
    "ELBO",
    "DataPlateScaleMessenger",
    "MeanFieldGuide",
    "DEFAULT_INIT_SCALE",
    "nn",
    "priors",
    "schedules",
    "__version__",
]
