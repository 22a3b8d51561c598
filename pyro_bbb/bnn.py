"""``BNN``: a network and a likelihood joined into a Pyro model, weights outside the data plate."""

from __future__ import annotations

import math

import torch
from pyro.nn import PyroModule
from pyro.nn.module import to_pyro_module_
from pyro.poutine.runtime import get_plates

from .likelihoods import Likelihood
from .nn.draws import fold_draws
from .nn.module import DATA_PLATE, data_plate_named

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
        Maps a batch of inputs ``(batch, ...)`` to outputs ``(batch, features)``. It always sees ordinary batches:
        S weight draws (a vectorized ``predict`` or vectorized particles) arrive as ``S * batch`` rows, block ``s``
        belonging to draw ``s`` (see :mod:`pyro_bbb.nn.draws`), so indexing, ``view``, ``cat``, ``nn.Flatten`` and
        pooling behave as without pyro_bbb.
    likelihood : Likelihood
        E.g. :class:`pyro_bbb.likelihoods.Gaussian`, ``Categorical``.
    data_plate : str
        Name of the plate over data points.

    Example
    -------
    >>> net = torch.nn.Sequential(BayesianLinear(4, 16), torch.nn.ReLU(), BayesianLinear(16, 3))
    >>> bnn = BNN(net, likelihoods.Categorical())
    >>> bnn(torch.randn(5, 4)).shape                 # without a guide: a prior predictive draw
    torch.Size([5])
    >>> trace = poutine.trace(bnn).get_trace(torch.randn(5, 4))
    >>> [name for name, site in trace.iter_stochastic_nodes() if name != "data"]   # "data" is the plate
    ['net.0.weight', 'net.0.bias', 'net.2.weight', 'net.2.bias', 'y']
    """

    def __init__(self, net: torch.nn.Module, likelihood: Likelihood, data_plate: str = DATA_PLATE):
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
        with data_plate_named(self.data_plate):
            output = self._run_net(x)
        return self.likelihood(output, y, data_plate=self.data_plate)

    def _run_net(self, x: torch.Tensor) -> torch.Tensor:
        """The net on an ordinary batch: S weight draws (from the sample plates around this call) are folded into
        ``S * B`` rows, and the output is unfolded to ``(*draw_shape, B, ...)`` for the likelihood."""
        draw_shape = _draw_shape(self.data_plate)
        num_draws = math.prod(draw_shape)
        if not draw_shape or x.dim() == 0:
            return self.net(x)
        folded = x.unsqueeze(0).expand(num_draws, *x.shape).reshape(num_draws * x.shape[0], *x.shape[1:])
        with fold_draws(num_draws):
            output = self.net(folded)
        if not isinstance(output, torch.Tensor) or output.dim() == 0 or output.shape[0] != folded.shape[0]:
            shape = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
            raise ValueError(
                f"the net returned {shape} for a batch of {folded.shape[0]} rows; BNN needs one output row per input "
                "row (the batch dimension first)."
            )
        return output.reshape(*draw_shape, x.shape[0], *output.shape[1:])


def _draw_shape(data_plate: str) -> tuple[int, ...]:
    """The batch shape of a global site under the vectorized plates around this call (weight draws), left of the
    data plate's dimension -1: ``(S,)`` under one sample plate at dim -2; ``()`` when there is none."""
    frames = [f for f in get_plates() if f.vectorized and f.dim is not None and f.name != data_plate]
    if not frames:
        return ()
    if any(f.dim == -1 for f in frames):
        raise ValueError(
            f"pyro.plate({next(f.name for f in frames if f.dim == -1)!r}) occupies dimension -1, where BNN puts its "
            f"data plate {data_plate!r}; give the outer plate dim=-2 (or lower)."
        )
    shape = [1] * (-min(f.dim for f in frames) - 1)
    for f in frames:
        shape[f.dim + 1] = f.size
    return tuple(shape)
