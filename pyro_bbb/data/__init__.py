"""Data in and out of a model: ``fit``'s checked minibatches (:mod:`~pyro_bbb.data.batches`), the data sets the
tutorials and tests use (:mod:`~pyro_bbb.data.datasets`) and what a guide saw in training
(:mod:`~pyro_bbb.data.provenance`).

Examples
--------
>>> x, y = pyro_bbb.data.toy_regression(n=20, seed=0)
>>> x.shape, y.shape
(torch.Size([20, 1]), torch.Size([20]))
"""

from .batches import DataError
from .datasets import digits, embedded_reber, heteroscedastic_regression, toy_regression

__all__ = ["DataError", "toy_regression", "heteroscedastic_regression", "digits", "embedded_reber"]
