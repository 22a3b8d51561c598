"""Bayesian layers: ``PyroModule`` twins of ``torch.nn`` layers whose weights are sample sites; what travels
through them under moment propagation (:mod:`~pyro_bbb.nn.moments`); ``bayesianize`` (:mod:`~pyro_bbb.nn.convert`),
which turns a ``torch.nn`` model into one.

Examples
--------
>>> from pyro.nn import PyroModule
>>> class Net(PyroModule):
...     def __init__(self):
...         super().__init__()
...         self.fc1 = BayesianLinear(2, 8)
...         self.act = torch.nn.Tanh()
...         self.fc2 = BayesianLinear(8, 1)
...     def forward(self, x):
...         return self.fc2(self.act(self.fc1(x)))
>>> Net()(torch.randn(5, 2)).shape
torch.Size([5, 1])
"""

from .conv import (
    BayesianConv1d,
    BayesianConv2d,
    BayesianConv3d,
    BayesianConvTranspose1d,
    BayesianConvTranspose2d,
    BayesianConvTranspose3d,
)
from .convert import bayesianize
from .functional import batched_conv, batched_linear
from .linear import BayesianLinear
from .module import BayesianModule
from .recurrent import DEFAULT_RECURRENT_PRIOR, BayesianGRU, BayesianGRUCell, BayesianLSTM, BayesianLSTMCell

__all__ = [
    "BayesianModule",
    "BayesianLinear",
    "BayesianConv1d",
    "BayesianConv2d",
    "BayesianConv3d",
    "BayesianConvTranspose1d",
    "BayesianConvTranspose2d",
    "BayesianConvTranspose3d",
    "BayesianLSTMCell",
    "BayesianGRUCell",
    "BayesianLSTM",
    "BayesianGRU",
    "DEFAULT_RECURRENT_PRIOR",
    "batched_linear",
    "batched_conv",
    "bayesianize",
]
