"""The effect handlers of a prediction pass: observation placeholders, and subsample plates that cover the data.

Examples
--------
>>> bnn = BNN(BayesianLinear(2, 1), likelihoods.Gaussian(scale=1.0))
>>> observation_placeholder(bnn)(torch.ones(3, 2)).shape   # the observation's zeros, no draw
torch.Size([3])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from pyro.poutine.messenger import Messenger

from .._plates import DATA_PLATE, data_plate_frame

__all__ = ["ObservationPlaceholderMessenger", "observation_placeholder", "SubsampleCoverMessenger", "cover_subsample"]


class ObservationPlaceholderMessenger(Messenger):
    """Fills unobserved sites in the data plate with zeros instead of sampling them: a prediction pass reads the
    observation's distribution, not a draw (no random numbers are used, so every pass, whatever its chunk size,
    leaves the generator where it was).

    Examples
    --------
    >>> def model(x):
    ...     with pyro.plate("data", len(x)):
    ...         return pyro.sample("y", dist.Normal(x, 1.0))
    >>> observation_placeholder(model)(torch.ones(3))
    tensor([0., 0., 0.])
    """

    def __init__(self, data_plate: str = DATA_PLATE, device: torch.device | None = None):
        super().__init__()
        self.data_plate = data_plate
        self.device = device

    def _pyro_sample(self, msg: dict[str, Any]) -> None:
        if msg["value"] is None and data_plate_frame(msg, self.data_plate) is not None and hasattr(msg["fn"], "shape"):
            msg["value"] = torch.zeros(msg["fn"].shape(), device=self.device)  # (a nested plate's index site has none)


def observation_placeholder(
    fn: Callable | None = None, data_plate: str = DATA_PLATE, device: torch.device | None = None
) -> ObservationPlaceholderMessenger | Callable:
    """Factory of :class:`ObservationPlaceholderMessenger` (``observation_placeholder(model)`` or a context).

    Examples
    --------
    >>> with observation_placeholder():
    ...     pass
    """
    messenger = ObservationPlaceholderMessenger(data_plate, device)
    return messenger(fn) if fn is not None else messenger


class SubsampleCoverMessenger(Messenger):
    """Replaces the random subsample of a subsampling data plate (``pyro.plate(name, n, subsample_size=m)``) by the
    indices ``piece * m ... piece * m + m - 1`` (wrapping around, also when there are fewer than ``m`` data), so
    that successive pieces cover every datum once; records ``n`` and ``m`` (:attr:`size`, :attr:`subsample_size`).
    Plates that do not subsample, or get explicit ``subsample=`` indices, are left alone.

    Examples
    --------
    >>> def model():
    ...     with pyro.plate("data", 5, subsample_size=2) as idx:
    ...         return idx
    >>> [SubsampleCoverMessenger("data", piece)(model)().tolist() for piece in range(3)]
    [[0, 1], [2, 3], [4, 0]]
    """

    def __init__(self, data_plate: str = DATA_PLATE, piece: int = 0):
        super().__init__()
        self.data_plate, self.piece = data_plate, piece
        self.size: int | None = None
        self.subsample_size: int | None = None

    def _pyro_sample(self, msg: dict[str, Any]) -> None:
        fn = msg["fn"]
        if msg["name"] != self.data_plate or msg["value"] is not None or not hasattr(fn, "subsample_size"):
            return
        size, subsample_size = fn.size, fn.subsample_size
        if subsample_size is None or subsample_size == size:
            return
        self.size, self.subsample_size = size, subsample_size
        start = self.piece * subsample_size
        msg["value"] = torch.arange(start, start + subsample_size, device=fn.device) % size


def cover_subsample(fn: Callable | None = None, data_plate: str = DATA_PLATE,
                    piece: int = 0) -> SubsampleCoverMessenger | Callable:
    """Factory of :class:`SubsampleCoverMessenger` (``cover_subsample(model, piece=1)`` or a context).

    Examples
    --------
    >>> def model():
    ...     with pyro.plate("data", 5, subsample_size=2) as idx:
    ...         return idx
    >>> cover_subsample(model, piece=1)().tolist()
    [2, 3]
    """
    messenger = SubsampleCoverMessenger(data_plate, piece)
    return messenger(fn) if fn is not None else messenger
