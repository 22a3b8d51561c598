"""The data plate: the ``pyro.plate`` over data points whose sites the ELBO scales by ``N / B``, its name, and
where a site or trace meets it.

Examples
--------
>>> data_plate_of(pyro_bbb.BNN(pyro_bbb.nn.BayesianLinear(2, 1), pyro_bbb.likelihoods.Gaussian(), data_plate="rows"))
'rows'
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from pyro.poutine.messenger import Messenger

from ._internals import active_messengers

__all__ = [
    "DATA_PLATE", "data_plate_named", "current_data_plate", "data_plate_of", "data_plate_frame",
    "trace_data_plate_frame", "DataPlateScaler", "active_data_plate_scalers",
]

#: The name of the plate over data points unless a model says otherwise (``BNN(data_plate=...)``,
#: ``ELBO(data_plate=...)``).
DATA_PLATE = "data"


_CURRENT_DATA_PLATE: ContextVar[str] = ContextVar("pyro_bbb_data_plate", default=DATA_PLATE)


@contextmanager
def data_plate_named(name: str) -> Iterator[None]:
    """Within the block, the plate called ``name`` is the data plate (the one weights must not be drawn in).

    Examples
    --------
    >>> with data_plate_named("batch"):
    ...     current_data_plate()
    'batch'
    """
    token = _CURRENT_DATA_PLATE.set(name)
    try:
        yield
    finally:
        _CURRENT_DATA_PLATE.reset(token)


def current_data_plate() -> str:
    """The data plate's name here (see :func:`data_plate_named`); ``"data"`` by default.

    Examples
    --------
    >>> current_data_plate()
    'data'
    """
    return _CURRENT_DATA_PLATE.get()

def data_plate_of(model: Any) -> str:
    """The name of a model's data plate: its ``data_plate`` attribute, else :data:`DATA_PLATE`.

    Examples
    --------
    >>> data_plate_of(lambda x: x)
    'data'
    """
    return getattr(model, "data_plate", DATA_PLATE)


def data_plate_frame(site: dict[str, Any], data_plate: str = DATA_PLATE):
    """The frame of the plate called ``data_plate`` around a message or trace site (its size this call and the size
    it declared), or ``None`` when the site is not inside it.

    Examples
    --------
    >>> def model():
    ...     with pyro.plate("data", 10, subsample_size=4):
    ...         pyro.sample("y", dist.Normal(0.0, 1.0))
    >>> frame = data_plate_frame(poutine.trace(model).get_trace().nodes["y"])
    >>> frame.size, frame.full_size
    (4, 10)
    """
    return next((f for f in site.get("cond_indep_stack", ()) if f.name == data_plate), None)


def trace_data_plate_frame(trace, data_plate: str):
    """The data plate's frame in a trace (its size this call and the size it declared), or ``None``."""
    return next((f for f in (data_plate_frame(site, data_plate) for site in trace.nodes.values()) if f), None)


class DataPlateScaler(Messenger):
    """The base of a handler that scales the data plate to the training set's size ``num_data`` itself
    (:class:`pyro_bbb.infer.scaling.DataPlateScaleMessenger`, what :class:`pyro_bbb.ELBO` runs a model under). A
    :class:`~pyro_bbb.BNN` that knows its ``num_data`` declares its data plate with that size only where no such
    handler with a ``num_data`` is active: the objective's N wins, and Pyro's own ELBOs get the model's.

    Examples
    --------
    >>> with DataPlateScaler():
    ...     [scaler.num_data for scaler in active_data_plate_scalers()]
    [None]
    """

    num_data: int | None = None


def active_data_plate_scalers() -> list[DataPlateScaler]:
    """The :class:`DataPlateScaler` handlers active now, outermost first.

    Examples
    --------
    >>> active_data_plate_scalers()
    []
    """
    return active_messengers(DataPlateScaler)
