"""Scaling the data plate: every site inside ``pyro.plate(data_plate, B)`` weighs ``N / B``, so a minibatch's
likelihood stands for the whole training set.

Examples
--------
>>> bnn = BNN(BayesianLinear(2, 1), likelihoods.Gaussian(scale=1.0))
>>> trace = poutine.trace(scale_data_plate(bnn, num_data=8)).get_trace(torch.zeros(2, 2), torch.zeros(2))
>>> trace.nodes["y"]["scale"], trace.nodes["net.weight"]["scale"]   # the likelihood scaled, the weights not
(4.0, 1.0)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._internals import is_deterministic_site
from .._plates import DATA_PLATE, DataPlateScaler, data_plate_frame
from ..nn.module import is_layer_prior

__all__ = ["DataPlateScaleMessenger", "scale_data_plate"]


class DataPlateScaleMessenger(DataPlateScaler):
    """Scales every sample site inside the plate named ``data_plate`` by ``num_data / B``.

    ``B`` is the plate's size in this call, so a last, partial batch is scaled right. A plate declared with
    ``pyro.plate(name, size=N, subsample_size=B)`` (or ``subsample=idx``) already carries the ``N / B`` scale;
    it is left alone, and ``num_data`` must equal ``N``. With ``num_data`` set, an observed site outside the data
    plate is an error (its likelihood could not be scaled) unless it is a Bayesian layer's weight the user
    conditioned on. :class:`pyro_bbb.ELBO` applies it to the model and the guide.

    Examples
    --------
    >>> def model(y):
    ...     with pyro.plate("data", len(y)):
    ...         pyro.sample("y", dist.Normal(0.0, 1.0), obs=y)
    >>> with DataPlateScaleMessenger(num_data=100):
    ...     tr = poutine.trace(model).get_trace(torch.zeros(4))
    >>> tr.nodes["y"]["scale"]
    25.0
    """

    def __init__(self, num_data: int | None, data_plate: str = DATA_PLATE):
        super().__init__()
        self.num_data = num_data
        self.data_plate = data_plate

    def _pyro_sample(self, msg: dict[str, Any]) -> None:
        if is_deterministic_site(msg):
            return
        frame = data_plate_frame(msg, self.data_plate)
        if frame is None:
            self._check_outside(msg)
        elif (frame.full_size or frame.size) != frame.size:  # the plate subsamples and already scales by N / B
            self._check_declared(frame)
        elif self.num_data is not None:
            msg["scale"] = msg["scale"] * self.batch_scale(self.num_data, frame.size, self.data_plate)

    @staticmethod
    def batch_scale(num_data: int, batch_size: int, data_plate: str = DATA_PLATE) -> float:
        """``num_data / batch_size``, the scale of a batch's log-likelihood; an error when the batch is larger.

        Examples
        --------
        >>> DataPlateScaleMessenger.batch_scale(1000, 32)
        31.25
        """
        if num_data < batch_size:
            raise ValueError(
                f"num_data={num_data} is smaller than the batch of {batch_size} data in pyro.plate({data_plate!r}); "
                "num_data must be the size of the whole training set."
            )
        return num_data / batch_size

    def _check_outside(self, msg: dict[str, Any]) -> None:
        # an observed site outside the plate is a likelihood that cannot be scaled -- unless it is a layer's
        # global weight the user conditioned on (poutine.condition(model, {"fc1.weight": w}))
        if msg["is_observed"] and self.num_data is not None and not is_layer_prior(msg["fn"]):
            raise ValueError(
                f"observed site {msg['name']!r} is not inside pyro.plate({self.data_plate!r}, ...), so "
                f"pyro_bbb.ELBO(num_data={self.num_data}) cannot scale its likelihood to the full data. Wrap the "
                f"likelihood in `with pyro.plate({self.data_plate!r}, x.shape[0]): pyro.sample(..., obs=y)` "
                "(a data plate of another name: give the model a `data_plate` attribute naming it, which pyro_bbb.fit "
                "and pyro_bbb.ELBO read, or pass pyro_bbb.ELBO(data_plate=...))."
            )

    def _check_declared(self, frame) -> None:
        if self.num_data is not None and self.num_data != frame.full_size:
            raise ValueError(
                f"num_data={self.num_data} disagrees with pyro.plate({self.data_plate!r}, size={frame.full_size}, "
                f"subsample_size={frame.size}) in the model; the plate already scales the likelihood by "
                f"{frame.full_size}/{frame.size}. Drop num_data or make it equal to the plate's size (pyro_bbb.fit "
                "passes the number of training rows as num_data: declare the plate over all of them, or drop its "
                "subsample_size and let fit's batch_size make the minibatches)."
            )


def scale_data_plate(fn: Callable | None = None, num_data: int | None = None,
                     data_plate: str = DATA_PLATE) -> DataPlateScaleMessenger | Callable:
    """Scale the data plate of ``fn`` to ``num_data`` data (see :class:`DataPlateScaleMessenger`); without ``fn``
    the messenger, for ``with scale_data_plate(num_data=N):``.

    Examples
    --------
    >>> def model(y):
    ...     with pyro.plate("data", len(y)):
    ...         pyro.sample("y", dist.Normal(0.0, 1.0), obs=y)
    >>> poutine.trace(scale_data_plate(model, num_data=10)).get_trace(torch.zeros(5)).nodes["y"]["scale"]
    2.0
    """
    messenger = DataPlateScaleMessenger(num_data, data_plate)
    return messenger(fn) if fn is not None else messenger
