"""What objective computed the gradients an optimizer is about to apply.

An optimizer whose update *assumes* an objective -- :class:`pyro_bbb.optim.IVON` reads the likelihood's curvature
off gradients of the ELBO at KL weight 1 with its own ``N`` -- cannot see that objective in a plain
``pyro.infer.SVI`` loop: SVI hands it parameters with gradients, nothing more. So :class:`pyro_bbb.ELBO` notes, each
time it computes gradients (``loss_and_grads`` and ``differentiable_loss``), an :class:`ObjectiveRun`: the
training-set size it scaled the batch to and the KL weight it used. The optimizer reads the latest run at its step:
none since its last step (or since it was built), or one for another guide, means another objective computed these
gradients (Pyro's ``Trace_ELBO`` or
``TraceMeanField_ELBO``, which note nothing), and a run with the wrong ``N`` or KL weight is named, with its fix,
before any parameter changes. One record per process: a step computes its gradients and applies them before the
next step's objective runs.

Examples
--------
>>> bnn = pyro_bbb.BNN(BayesianLinear(2, 1), likelihoods.Gaussian(scale=0.5))
>>> guide = pyro_bbb.MeanFieldGuide(bnn)
>>> elbo = pyro_bbb.ELBO(num_data=100)
>>> _ = elbo.loss_and_grads(bnn, guide, torch.randn(10, 2), torch.randn(10))
>>> run = latest_objective_run()
>>> run.num_data, run.kl_weight
(100, Constant(weight=1.0))
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ObjectiveRun", "note_objective_run", "latest_objective_run"]

_counter = itertools.count(1)
_latest: ObjectiveRun | None = None


@dataclass(frozen=True)
class ObjectiveRun:
    """One gradient computation of :class:`pyro_bbb.ELBO`: the training-set size ``num_data`` its minibatch was scaled
    to (``None`` when it could not tell), its KL weight (a schedule; :class:`~pyro_bbb.infer.schedules.Constant` for a
    number), a number that grows with every run, and the ``id`` of the guide when the guide is a module (``None``
    for a guide wrapped in a handler: then any optimizer may take the run as its own).

    Examples
    --------
    >>> ObjectiveRun(num_data=50, kl_weight=1.0, number=1, guide_id=None).num_data
    50
    """

    num_data: int | None
    kl_weight: Any
    number: int
    guide_id: int | None

    def is_for(self, guide: Any) -> bool:
        """Whether these gradients may be ``guide``'s (the same module, or a guide the run could not identify)."""
        return self.guide_id is None or self.guide_id == id(guide)


def note_objective_run(num_data: int | None, kl_weight: Any, guide: Any = None) -> ObjectiveRun:
    """Record that an objective has just computed gradients of ``guide`` with this ``num_data`` and KL weight.

    Examples
    --------
    >>> note_objective_run(200, 1.0).num_data
    200
    """
    global _latest
    guide_id = id(guide) if isinstance(guide, torch.nn.Module) else None
    _latest = ObjectiveRun(num_data, kl_weight, next(_counter), guide_id)
    return _latest


def latest_objective_run() -> ObjectiveRun | None:
    """The latest :class:`ObjectiveRun` of this process (``None`` before any).

    Examples
    --------
    >>> note_objective_run(10, 1.0) is latest_objective_run()
    True
    """
    return _latest
