"""KL-weight schedules: callables from the optimisation step (0, 1, 2, ...) to the weight of the KL term.

Pass one as ``pyro_bbb.ELBO(num_data=N, kl_weight=schedule)``; the ELBO's step counter advances once per
``loss_and_grads`` (that is, once per ``SVI.step``) or ``differentiable_loss`` (a torch optimizer's step), not per
``loss`` nor per ``differentiable_loss`` under ``torch.no_grad()`` (a validation loss). A weight of 1 is the true
ELBO; smaller weights during a warm-up let the network fit the data before the KL pulls the posterior towards the
prior.

Examples
--------
>>> w = LinearWarmup(warmup_steps=4)
>>> [w(step) for step in range(6)]
[0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Real

from .._checks import check_count, check_nonnegative

__all__ = ["Schedule", "Constant", "LinearWarmup", "Cyclical", "as_schedule", "weight_at"]


class Schedule:
    """Base class of KL-weight schedules: ``schedule(step) -> float``.

    Examples
    --------
    >>> class Halving(Schedule):
    ...     def __call__(self, step):
    ...         return 0.5 ** step
    >>> Halving()(2)
    0.25
    """

    def __call__(self, step: int) -> float:
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class Constant(Schedule):
    """The same weight at every step.

    Examples
    --------
    >>> Constant(0.1)(1000)
    0.1
    """

    def __init__(self, weight: float = 1.0):
        self.weight = check_nonnegative("weight", weight)

    def __call__(self, step: int) -> float:
        return self.weight


class LinearWarmup(Schedule):
    """Linear ramp from ``start`` to ``end`` over ``warmup_steps`` steps, then ``end``.

    Examples
    --------
    >>> LinearWarmup(10, start=0.5)(5)
    0.75
    """

    def __init__(self, warmup_steps: int, start: float = 0.0, end: float = 1.0):
        self.warmup_steps = check_count("warmup_steps", warmup_steps)
        self.start = check_nonnegative("start", start)
        self.end = check_nonnegative("end", end)

    def __call__(self, step: int) -> float:
        fraction = min(max(step, 0) / self.warmup_steps, 1.0)
        return self.start + (self.end - self.start) * fraction


class Cyclical(Schedule):
    """Cyclical annealing (Fu et al. 2019): in each cycle of ``period`` steps the weight rises linearly from 0
    to 1 over the first ``ratio * period`` steps and stays at 1 for the rest.

    Examples
    --------
    >>> c = Cyclical(period=4, ratio=0.5)
    >>> [c(step) for step in range(8)]
    [0.0, 0.5, 1.0, 1.0, 0.0, 0.5, 1.0, 1.0]
    """

    def __init__(self, period: int, ratio: float = 0.5):
        self.period = check_count("period", period)
        if self.period < 2:
            raise ValueError("`period` must be at least 2 steps: a cycle of one step stays at its start, weight 0 "
                             "(no KL at all).")
        if not isinstance(ratio, Real) or not 0.0 < ratio <= 1.0:
            raise ValueError(f"`ratio` must lie in (0, 1], got {ratio!r}.")
        self.ratio = float(ratio)

    def __call__(self, step: int) -> float:
        tau = (max(step, 0) % self.period) / self.period
        return min(tau / self.ratio, 1.0)


def as_schedule(kl_weight) -> Callable[[int], float]:
    """``kl_weight`` as a schedule: a number becomes :class:`Constant`, a callable stays as it is.

    Examples
    --------
    >>> as_schedule(0.5)
    Constant(weight=0.5)
    """
    if isinstance(kl_weight, Real) and not isinstance(kl_weight, bool):
        return Constant(kl_weight)
    if callable(kl_weight):
        return kl_weight
    if kl_weight == "auto" or hasattr(kl_weight, "candidates"):
        raise ValueError(
            "kl_weight='auto' (choosing the weight on a split of the training data) runs in pyro_bbb.fit only; here "
            "pass a number: 1 for the Bayes posterior, or the weight fit chose (history.kl_weight_choice.kl_weight)."
        )
    raise ValueError(f"`kl_weight` must be a number >= 0 or a schedule (step -> weight), got {kl_weight!r}.")


def weight_at(schedule: Callable[[int], float], step: int) -> float:
    """The schedule's weight at ``step``, checked: a clear error for a weight that is not a finite number >= 0.

    Examples
    --------
    >>> weight_at(LinearWarmup(4), 1)
    0.25
    """
    weight = schedule(step)
    weight = weight.item() if hasattr(weight, "item") else weight
    if not isinstance(weight, Real) or not math.isfinite(weight) or weight < 0:
        raise ValueError(f"kl_weight schedule {schedule!r} returned {weight!r} at step {step}; a KL weight must be a "
                         "finite number >= 0.")
    return float(weight)
