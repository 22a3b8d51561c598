"""The terms of one :class:`pyro_bbb.ELBO` call, gathered particle by particle and read out once as ``last_terms``.

Examples
--------
>>> call = CallTerms(kl_weight=1.0)
>>> call.add(torch.tensor(3.0), torch.tensor(1.0), {"w": torch.tensor(1.0)}, loss=4.0, num_particles=1)
>>> call.finish(num_data=None)["loss_per_datum"]
4.0
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any

import pyro
import pyro.poutine as poutine
import torch
from pyro.infer.util import is_validation_enabled

from .contract import ObjectiveRun, mark_objective_run
from .schedules import weight_at

__all__ = ["CallTerms", "Frame", "CallBookkeeping"]


class Frame:
    """The data plate's size this call and the size it declared (what ``last_terms`` reads from a plate frame).

    Examples
    --------
    >>> Frame(8, None).size
    8
    """

    def __init__(self, size: int, full_size: int | None):
        self.size, self.full_size = size, full_size


class CallTerms:
    """A running mean over particles of the scaled NLL, the KL (total and by site) and the loss, with the call's KL
    weight and data-plate frame.

    Examples
    --------
    >>> CallTerms(kl_weight=0.5).kl_weight
    0.5
    """

    def __init__(self, kl_weight: float):
        self.kl_weight = kl_weight
        self.nll, self.kl, self.loss, self.frame = 0.0, 0.0, 0.0, None
        self.kl_by_site: dict[str, Any] = {}

    def add(self, nll, kl: torch.Tensor, kl_by_site: dict[str, torch.Tensor], loss: float,
            num_particles: int) -> None:
        """Add one particle's terms (each divided by ``num_particles``)."""
        self.nll = _add_share(self.nll, nll.detach() if isinstance(nll, torch.Tensor) else nll, num_particles)
        self.kl = _add_share(self.kl, kl.detach(), num_particles)
        self.loss += loss / num_particles
        for name, value in kl_by_site.items():
            self.kl_by_site[name] = _add_share(self.kl_by_site.get(name, 0.0), value.detach(), num_particles)

    def finish(self, num_data: int | None) -> dict[str, Any]:
        """The call's ``last_terms`` (one device sync); ``num_data`` is the ELBO's own (else the plate's declared
        size)."""
        site_names = list(self.kl_by_site)
        values = [self.nll, self.kl, *self.kl_by_site.values()]
        values = [v.detach() if isinstance(v, torch.Tensor) else torch.tensor(float(v)) for v in values]
        if any(v.dtype != values[0].dtype or v.device != values[0].device for v in values):
            values = [v.to(values[0].device, torch.float64) for v in values]
        floats = torch.stack(values).tolist()  # a float32 value is exact as a Python float
        frame = self.frame  # the data plate as the model declared it: the batch, and a subsampled plate's N
        batch_size = None if frame is None else frame.size
        declared = None if frame is None or (frame.full_size or frame.size) == frame.size else frame.full_size
        num_data = num_data if num_data is not None else declared
        loss = float(self.loss)
        return {
            "loss": loss,
            "nll": floats[0],
            "kl": floats[1],
            "kl_by_site": dict(zip(site_names, floats[2:], strict=True)),
            "kl_weight": self.kl_weight,
            "num_data": num_data,
            "batch_size": batch_size,
            "loss_per_datum": loss / (num_data or batch_size or 1),
        }


def _add_share(total, value, num_particles: int):
    """``total + value / num_particles``: a running mean over particles (the value itself for one particle)."""
    if num_particles == 1 and isinstance(total, float) and total == 0.0:
        return value
    return total + value / num_particles


class CallBookkeeping:
    """What :class:`pyro_bbb.ELBO` keeps around each call, apart from the objective itself: the KL schedule's step of
    the (model, guide) pair (its ``pairs``), Pyro's validation once per pair, the call's terms (``last_terms``), and
    the note for the optimizer (:mod:`~pyro_bbb.infer.contract`) when a call computes gradients.

    Examples
    --------
    >>> pyro_bbb.ELBO(num_data=10).step
    0
    """

    @property
    def step(self) -> int:
        """The KL schedule's step for the latest (model, guide) pair: its ``loss_and_grads`` calls so far.

        Examples
        --------
        >>> pyro_bbb.ELBO(num_data=10).step
        0
        """
        return self.pairs.current.step

    @step.setter
    def step(self, value: int) -> None:
        self.pairs.current.step = value

    def current_kl_weight(self) -> float:
        """The KL weight at the current :attr:`step`; e.g. ``0.0`` at first with ``kl_weight=LinearWarmup(4)``.

        Examples
        --------
        >>> pyro_bbb.ELBO(num_data=10, kl_weight=0.5).current_kl_weight()
        0.5
        """
        return weight_at(self.kl_weight, self.step)

    @contextmanager
    def recording(self, model, guide, gradients: bool):
        """One call = one set of terms (and, when it computes gradients, a mark on every parameter it reached, for
        the optimizer: :mod:`~pyro_bbb.infer.contract`)."""
        pair = self.pairs.select(model, guide)
        self.current_call = CallTerms(self.current_kl_weight())
        validating = is_validation_enabled()
        try:
            skip = validating and pair.validated and not self.revalidate
            capture = poutine.trace(param_only=True) if gradients else nullcontext()
            with pyro.validation_enabled(False) if skip else nullcontext(), capture:
                yield
            self.last_terms = self.current_call.finish(self.num_data)
            pair.validated = pair.validated or validating
            if gradients:
                reached = {id(p): p for p in (site["value"].unconstrained() for site in capture.trace.nodes.values())}
                run = ObjectiveRun(self.last_terms["num_data"] or self.last_terms["batch_size"], self.kl_weight)
                mark_objective_run(reached.values(), run)
        finally:
            self.current_call = None

