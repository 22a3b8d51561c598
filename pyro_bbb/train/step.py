"""``TrainingStep``: one training step -- objective, optimizer, estimator, clipping -- and the check that they fit.

Examples
--------
>>> bnn = BNN(BayesianLinear(2, 1), likelihoods.Gaussian(scale=0.5))
>>> step = TrainingStep(bnn, MeanFieldGuide(bnn), pyro_bbb.optim.Adam(lr=1e-2), num_data=50)
>>> isinstance(step(torch.randn(5, 2), torch.randn(5)), float)
True
"""

from __future__ import annotations

import math
import operator

import pyro
import pyro.poutine as poutine
import torch
from pyro.infer.util import zero_grads
from pyro.optim import PyroOptim

from .._checks import is_set_up
from .._inputs import num_rows
from .._internals import (
    PyroOptimizerState,
    all_finite,
    foreach_copy_,
    set_up_autoguide,
    unconstrained_param,
    unwrap_handlers,
)
from .._plates import data_plate_of
from ..infer.contract import ObjectiveRun, mark_objective_run
from ..infer.elbo import ELBO
from ..infer.estimators import estimator as estimator_named
from ..infer.guide import MeanFieldGuide
from ..optim import IVON
from ..optim import Adam as JointAdam
from . import distributed as distributed_

__all__ = ["TrainingStep", "TrainingDivergedError", "OptimizerSnapshot", "default_adam_rate"]

#: The learning rate of the Adam that ``fit`` and the Lightning module train with when given no optimizer
DEFAULT_LR = 1e-3


def default_adam_rate(lr: float | None, optimizer, owner: str) -> float:
    """``lr``, the learning rate of ``owner``'s own Adam (:data:`DEFAULT_LR` when ``None``); given beside an
    ``optimizer``, whose own rate would train instead, silently, it is an error naming the fix.

    Examples
    --------
    >>> default_adam_rate(None, None, "fit's")
    0.001
    >>> default_adam_rate(0.5, IVON.__new__(IVON), "fit's")
    Traceback (most recent call last):
    ...
    ValueError: lr=0.5 is the learning rate of fit's own Adam; optimizer= brings its own rate, ...
    """
    if optimizer is not None and lr is not None:
        raise ValueError(
            f"lr={lr!r} is the learning rate of {owner} own Adam; optimizer= brings its own rate, which would train "
            "instead, silently. Set it there (pyro_bbb.optim.IVON(guide, num_data=N, lr=...), "
            "pyro_bbb.optim.Adam({'lr': ...})), or drop optimizer=."
        )
    return DEFAULT_LR if lr is None else lr


class TrainingDivergedError(FloatingPointError):
    """The loss (or a gradient) became NaN or infinite; the parameters were restored to the last finite state.
    Its ``history`` attribute holds the :class:`~pyro_bbb.train.History` up to the failing step.

    Examples
    --------
    >>> issubclass(TrainingDivergedError, FloatingPointError)   # ``except FloatingPointError`` catches it
    True
    """


class OptimizerSnapshot:
    """An optimizer's state as it is now, put back by :meth:`restore`: a pyro_bbb optimizer's own copy
    (``get_state``), a Pyro optimizer's per-parameter torch optimizers and their states (a parameter first stepped
    since starts afresh); nothing to keep for any other.

    Examples
    --------
    >>> optimizer = pyro.optim.Adam({"lr": 0.1})
    >>> snapshot = OptimizerSnapshot(optimizer)
    >>> p = torch.zeros(2, requires_grad=True)
    >>> p.grad = torch.ones(2)
    >>> optimizer([p])
    >>> snapshot.restore()
    >>> len(optimizer.optim_objs)                       # as it was: p had not been stepped
    0
    """

    def __init__(self, optimizer):
        self.optimizer, self.state = optimizer, None
        if isinstance(optimizer, JointAdam):  # also the moments of parameters outside the param store
            self.state = optimizer.snapshot()
        elif isinstance(optimizer, IVON):  # its get_state copies
            self.state = optimizer.get_state()
        elif isinstance(optimizer, PyroOptim):  # by parameter, not by name (module-local parameters have none)
            self.state = PyroOptimizerState(optimizer)

    def restore(self) -> None:
        if isinstance(self.state, PyroOptimizerState):
            self.state.restore()
        elif callable(self.state):
            self.state()
        elif self.state is not None:
            self.optimizer.set_state(self.state)


def _one_row_at_batch_norm(error: Exception) -> ValueError | None:
    """Torch's refusal of a batch of one row at a batch norm layer in training mode, said with its cause and fix;
    ``None`` for any other error."""
    if "Expected more than 1 value per channel when training" not in str(error):
        return None
    return ValueError(
        f"a batch of one row reached a batch norm layer in training mode, which needs more than one ({error}). An "
        "epoch's last batch holds one row when the rows trained on (less kl_weight='auto''s validation split, or "
        "this process's share of them) leave 1 after whole batches: pass another batch_size, or a DataLoader with "
        "drop_last=True.")


class TrainingStep:
    """One training step, and the check that its parts fit together: the objective (a :class:`pyro_bbb.ELBO` built
    here from ``num_data``, ``kl_weight`` and ``num_particles``, with its KL schedule's counter), the optimizer, the
    gradient estimator and global gradient clipping. :func:`pyro_bbb.fit` and
    :class:`~pyro_bbb.train.lightning.BayesianLightningModule` drive it; any pairing that is not right (an estimator
    the guide cannot serve; :class:`~pyro_bbb.optim.IVON` with another guide or ``N``, a KL weight other than its
    ``num_data / ess``, or clipped gradients) is a clear error when it is built, before any parameter changes. A step
    whose loss or gradients are not finite restores the last parameters that gave a finite loss
    (:class:`~pyro_bbb.train.TrainingDivergedError`).

    A plain ``pyro.infer.SVI`` loop gets the same check from the optimizer itself at every step (see
    :mod:`pyro_bbb.infer.contract`).

    Parameters
    ----------
    model, guide :
        E.g. :class:`pyro_bbb.BNN` and :class:`pyro_bbb.MeanFieldGuide`.
    optimizer : pyro.optim.PyroOptim
        E.g. :class:`pyro_bbb.optim.Adam` or :class:`pyro_bbb.optim.IVON`.
    num_data : int
        Size of the training set.
    kl_weight, num_particles :
        As in :class:`pyro_bbb.ELBO`.
    estimator : str
        One of :data:`~pyro_bbb.infer.estimators.ESTIMATORS`.
    clip_norm : float, optional
        Clip the global gradient norm to this value.
    distributed : bool
        Data-parallel steps over the ranks of a ``torch.distributed`` process group (see ``fit(distributed=True)``).
    clipping_option : str
        How the caller names its gradient clipping, in error messages.

    Examples
    --------
    >>> bnn = BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.5))
    >>> guide = MeanFieldGuide(bnn)
    >>> step = TrainingStep(bnn, guide, pyro_bbb.optim.Adam(lr=1e-2), num_data=100, estimator="flipout")
    >>> loss = step(torch.randn(10, 3), torch.randn(10))
    >>> step.elbo.step
    1
    >>> TrainingStep(bnn, guide, pyro_bbb.optim.IVON(guide, num_data=100), num_data=100, kl_weight=0.5)
    Traceback (most recent call last):
    ...
    ValueError: kl_weight=Constant(weight=0.5): IVON sets each width from the likelihood's curvature and the ...
    """

    def __init__(self, model, guide, optimizer: PyroOptim, *, num_data: int, kl_weight=1.0, num_particles: int = 1,
                 estimator: str = "reparam", clip_norm: float | None = None, distributed: bool = False,
                 clipping_option: str = "clip_norm"):
        estimator_context = estimator_named(estimator)
        if estimator != "reparam" and not isinstance(guide, MeanFieldGuide):
            raise ValueError(
                f"estimator={estimator!r} reads each weight's posterior mean and scale, which only "
                f"pyro_bbb.MeanFieldGuide provides; {type(guide).__name__} does not. Use estimator='reparam' with "
                "this guide, or a MeanFieldGuide."
            )
        if estimator == "moments" and num_particles != 1:
            raise ValueError(
                f"estimator='moments' computes the expected log-likelihood exactly, so num_particles={num_particles} "
                "would repeat the same computation; use num_particles=1."
            )
        self.elbo = ELBO(num_data=num_data, kl_weight=kl_weight, num_particles=num_particles,
                         data_plate=data_plate_of(model))  # the one owner of N and the KL weight
        if isinstance(optimizer, IVON):
            optimizer.check_training(guide, self.elbo, clip_norm, clipping_option=clipping_option)
        self.model, self.guide, self.optimizer = model, guide, optimizer
        self.clip_norm, self.estimator, self.distributed = clip_norm, estimator_context, distributed
        self.snapshot: dict[torch.Tensor, torch.Tensor] = {}
        self._last_copy: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])  # a step's parameters, their copies
        self.initial: dict[torch.Tensor, torch.Tensor] = {}  # each parameter as this fit first saw it
        # and the model's buffers (batch norm's running statistics) as they are now
        self.initial_buffers = [(b, b.detach().clone()) for b in model.buffers()] \
            if isinstance(model, torch.nn.Module) else []
        self.last_finite_loss: float | None = None
        self.global_loss = math.nan
        self.steps = 0
        #: optimizer updates the parameters now carry (a diverged step puts them back to fewer: :meth:`_diverged`)
        self.updates, self._updates_remembered = 0, 0
        self._error: BaseException | None = None
        # the optimizer's state, to give back with the parameters on a bad batch
        self.initial_optimizer_state = OptimizerSnapshot(optimizer)

    def set_up_everywhere(self, batches) -> None:
        """Distributed: create the guide's parameters from a first batch, then give every rank rank 0's values."""
        error = None
        try:
            if not is_set_up(self.guide):
                x, y = next(iter(batches))
                set_up_autoguide(self.guide, x, y)
        except (ValueError, TypeError, StopIteration) as caught:
            error = caught
        distributed_.raise_if_any_rank_failed(error)
        distributed_.synchronise_parameters()
        if isinstance(self.model, torch.nn.Module):
            distributed_.synchronise_buffers(self.model)

    def guarded(self, batches):
        """Batches; in distributed mode an error while reading or checking one is kept for the next step, where
        every rank learns of it together (a rank raising alone would leave the others waiting)."""
        if not self.distributed:
            yield from batches
            return
        iterator = iter(batches)
        while True:
            try:
                batch = next(iterator)
            except StopIteration:
                return
            except (ValueError, TypeError) as error:
                self._error = error
                batch = (torch.zeros(0), torch.zeros(0))
            yield batch

    @property
    def schedule_step(self) -> int:
        """The KL schedule's step for this model and guide: the objective's training calls on them so far. Set it
        to continue a run from a checkpoint at its step's weight.

        Examples
        --------
        >>> bnn = pyro_bbb.BNN(pyro_bbb.nn.BayesianLinear(2, 1), pyro_bbb.likelihoods.Gaussian(scale=0.5))
        >>> step = TrainingStep(bnn, pyro_bbb.MeanFieldGuide(bnn), pyro_bbb.optim.Adam(), num_data=8,
        ...                     kl_weight=pyro_bbb.infer.schedules.LinearWarmup(10))
        >>> step.schedule_step = 5
        >>> step.elbo.current_kl_weight()
        0.5
        """
        return self.elbo.pairs.select(self.model, self.guide).step

    @schedule_step.setter
    def schedule_step(self, value: int) -> None:
        self.elbo.pairs.select(self.model, self.guide).step = int(value)

    def differentiable_loss(self, x, y) -> torch.Tensor:
        """The objective on a batch under the estimator, as a tensor to differentiate (for a loop that runs backward
        and the optimizer itself, e.g. Lightning); the KL schedule advances one step (in the ELBO's call; not under
        ``torch.no_grad()``, a validation loss)."""
        with self.estimator():
            return self.elbo.differentiable_loss(self.model, self.guide, x, y)

    def check(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Raise what a step on the batch ``(x, y)`` would raise, changing nothing: the loss under the estimator,
        without gradients, without the optimizer, the KL schedule not advanced (the random draws it takes are the
        caller's to put back)."""
        with torch.no_grad(), self.estimator():
            self.elbo.loss(self.model, self.guide, x, y)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One step on the batch ``(x, y)``: loss and gradients, clipping, the optimizer; returns the loss."""
        self.steps += 1
        if self.steps == 1:  # gradients the caller's own calls left (a look at their norms) are not this run's
            for _, param in pyro.get_param_store().named_parameters():  # (a pyro.module body's too)
                param.grad = None
            for part in (unwrap_handlers(self.model), unwrap_handlers(self.guide)):
                for param in part.parameters() if isinstance(part, torch.nn.Module) else ():
                    param.grad = None
        if self.distributed:
            return self._distributed_step(x, y)
        try:
            with poutine.trace(param_only=True) as capture, self.estimator():
                loss = self.elbo.loss_and_grads(self.model, self.guide, x, y)
        except ValueError as error:
            refusal = _one_row_at_batch_norm(error)
            if refusal is not None:
                raise refusal from None
            # torch's argument validation: a NaN reached a distribution's parameters before the loss
            if "found invalid values" not in str(error):
                raise
            self._diverged("a distribution's parameters", str(error).split(":")[0])
        # in the trace's order, not a set's (which follows memory addresses): the global gradient norm that clip_norm
        # divides by is a sum over parameters, and another order rounds differently -- the same seed would not give
        # the same training run
        params = list(dict.fromkeys(unconstrained_param(site["value"]) for site in capture.trace.nodes.values()))
        return self._apply(params, loss)

    def _distributed_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Local loss and gradients, then (collectively) failures, the weighted gradient sum, one update."""
        error, loss = self._error, 0.0
        self._error = None
        if error is None and num_rows(x) > 0:
            try:
                with self.estimator():
                    loss = self.elbo.loss_and_grads(self.model, self.guide, x, y)
            except (ValueError, FloatingPointError) as caught:
                error = _one_row_at_batch_norm(caught) or caught
        elif error is None:  # an empty shard: keep the KL schedule and the random streams in step with the others
            self.elbo.step += 1
            with torch.no_grad(), poutine.block():
                for _ in range(self.elbo.num_particles):
                    self.guide(x, y)
        distributed_.raise_if_any_rank_failed(error)
        self.global_loss, _ = distributed_.combine_gradients(num_rows(x), loss if math.isfinite(loss) else math.inf)
        params = [p for _, p in pyro.get_param_store().named_parameters()]  # a fixed order, as above
        # every rank's ELBO (this one's settings) computed the combined gradients, an empty shard's included
        mark_objective_run(params, ObjectiveRun(self.elbo.num_data, self.elbo.kl_weight))
        loss = self._apply(params, self.global_loss)
        if isinstance(self.model, torch.nn.Module):  # running statistics follow rank 0, as under DDP
            distributed_.synchronise_buffers(self.model)
        return loss

    def _apply(self, params: list[torch.Tensor], loss: float) -> float:
        grads = [p.grad for p in params if p.grad is not None]
        if not math.isfinite(loss) or not all_finite(grads):
            zero_grads(params)
            self._diverged("the loss" if not math.isfinite(loss) else "a gradient", f"loss {loss}")
        self._remember(params)
        self.last_finite_loss = loss
        if self.clip_norm is not None:
            torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], self.clip_norm, foreach=True)
        self.optimizer(params)
        self.updates += 1
        zero_grads(params)
        return loss

    @torch.no_grad()
    def _remember(self, params: list[torch.Tensor]) -> None:
        """Copy the parameters that just gave a finite loss (one foreach copy once every parameter is known; the
        same parameters as the step before, as nearly every step has, are not looked up again)."""
        self._updates_remembered = self.updates
        last, copies = self._last_copy
        if last and len(params) == len(last) and all(map(operator.is_, params, last)):
            foreach_copy_(copies, params)
            return
        known = [p for p in params if p in self.snapshot]  # tensors hash by identity
        if known:
            foreach_copy_([self.snapshot[p] for p in known], known)
        for p in params:
            if p not in self.snapshot:
                self.snapshot[p] = p.detach().clone()
                self.initial[p] = self.snapshot[p].clone()
        self._last_copy = (list(params), [self.snapshot[p] for p in params])

    @torch.no_grad()
    def restore_initial(self) -> None:
        """Every parameter back to its value when this fit first used it, the model's buffers and the optimizer's
        state to what they were at the start of fit."""
        for param, value in self.initial.items():
            param.copy_(value)
        for buffer, value in self.initial_buffers:
            buffer.copy_(value)
        self.initial_optimizer_state.restore()

    def _diverged(self, what: str, detail: str):
        with torch.no_grad():
            for param, value in self.snapshot.items():
                param.copy_(value)
        self.updates = self._updates_remembered
        restored = ("no step had a finite loss, so none was applied" if self.last_finite_loss is None else
                    f"the last finite loss was {self.last_finite_loss}, and the parameters were restored to the state "
                    "that gave it")
        raise TrainingDivergedError(
            f"{what} became NaN or infinite at step {self.steps} ({detail}); {restored}. Lower the learning rate, set "
            "clip_norm (e.g. 5.0), standardise x and y, or check the data for extreme values."
        )
