"""``BNN``: a network and a likelihood joined into a Pyro model, weights outside the data plate."""

from __future__ import annotations

import torch
from pyro.nn import PyroModule
from pyro.nn.module import to_pyro_module_

from .likelihoods import Likelihood

__all__ = ["BNN"]


class BNN(PyroModule):
    """The model ``y ~ likelihood(net(x))`` with the likelihood inside ``pyro.plate(data_plate)``.

    ``net`` may mix :mod:`pyro_bbb.nn` layers with ordinary ``torch.nn`` layers; the ordinary ones are converted
    in place to :class:`~pyro.nn.PyroModule` so their parameters are trained as point estimates by SVI. The net
    runs outside the data plate (its weights are global); the observation is emitted inside it, so the model
    trains with :class:`pyro_bbb.ELBO` (``num_data=N``), with plain :class:`pyro.infer.SVI`, or with
    :func:`pyro_bbb.fit`.

    Parameters
    ----------
    net : torch.nn.Module
        Maps a batch of inputs ``(batch, ...)`` to outputs ``(batch, features)`` (leading weight-draw dimensions
        pass through Bayesian layers).
    likelihood : Likelihood
        E.g. :class:`pyro_bbb.likelihoods.Gaussian`, ``Categorical``.
    data_plate : str
        Name of the plate over data points.

    Example
    -------
    >>> import torch
    >>> from pyro_bbb import likelihoods
    >>> from pyro_bbb.nn import BayesianLinear
    >>> net = torch.nn.Sequential(BayesianLinear(4, 16), torch.nn.ReLU(), BayesianLinear(16, 3))
    >>> bnn = BNN(net, likelihoods.Categorical())
    >>> bnn(torch.randn(5, 4)).shape                 # without a guide: a prior predictive draw
    torch.Size([5])
    >>> import pyro.poutine as poutine
    >>> trace = poutine.trace(bnn).get_trace(torch.randn(5, 4))
    >>> [name for name, site in trace.iter_stochastic_nodes() if name != "data"]   # "data" is the plate
    ['net.0.weight', 'net.0.bias', 'net.2.weight', 'net.2.bias', 'y']
    """

    def __init__(self, net: torch.nn.Module, likelihood: Likelihood, data_plate: str = "data"):
        super().__init__()
        if not isinstance(net, torch.nn.Module):
            raise TypeError(f"`net` must be a torch.nn.Module, got {type(net).__name__}.")
        if not isinstance(likelihood, Likelihood):
            raise TypeError(
                f"`likelihood` must be a pyro_bbb.likelihoods.Likelihood (e.g. likelihoods.Gaussian()), got "
                f"{type(likelihood).__name__}."
            )
        to_pyro_module_(net)
        self.net = net
        self.likelihood = likelihood
        self.data_plate = data_plate

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}.")
        if y is not None and y.shape[:1] != x.shape[:1]:
            raise ValueError(
                f"x has {x.shape[0] if x.dim() else 0} rows but y has {y.shape[0] if y.dim() else 0}; every input "
                "needs exactly one target."
            )
        return self.likelihood(self.net(x), y, data_plate=self.data_plate)
