"""Data in and out of a model: the inputs a network takes (:mod:`~pyro_bbb.data._inputs`), ``fit``'s checked
minibatches (:mod:`~pyro_bbb.data.batches`) and the data sets the tutorials and tests use
(:mod:`~pyro_bbb.data.datasets`).

Examples
--------
>>> x, y = pyro_bbb.data.toy_regression(n=20, seed=0)
>>> x.shape, y.shape
(torch.Size([20, 1]), torch.Size([20]))
"""

from .batches import DataError
from .datasets import digits, embedded_reber, heteroscedastic_regression, toy_regression

__all__ = ["DataError", "toy_regression", "heteroscedastic_regression", "digits", "embedded_reber"]
