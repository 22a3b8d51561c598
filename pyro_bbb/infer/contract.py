"""What objective computed the gradients an optimizer is about to apply: a record on the parameters themselves.

An optimizer whose update *assumes* an objective -- :class:`pyro_bbb.optim.IVON` reads the likelihood's curvature
off gradients of the ELBO at KL weight ``N / ess`` with its own ``N`` -- cannot see that objective in a plain
``pyro.infer.SVI`` loop: SVI hands it parameters with gradients, nothing more. So :class:`pyro_bbb.ELBO`, each time
it computes gradients (``loss_and_grads`` and ``differentiable_loss``), marks every parameter it reached with an
:class:`ObjectiveRun`: the training-set size it scaled the batch to and the KL weight it used -- its own, the one
owner of both. The optimizer :func:`takes <take_objective_run>` the mark off the parameters it is about to update: a
parameter with a gradient and no mark (Pyro's ``Trace_ELBO`` or ``TraceMeanField_ELBO``, which mark nothing, or
gradients it already applied) means another objective computed it, and a run with the wrong ``N`` or KL weight is
named, with its fix, before any parameter changes. The marks belong to the parameters (held by identity, dropped
with them), so two models trained alternately in one process, a guide wrapped in a handler and a checkpoint restored
into new parameters are each checked against the objective that computed *their* gradients. A mark that is still
on a parameter with a nonzero gradient tells the next call that its backward adds onto that run's gradient (neither
applied nor zeroed in between, whether clipped or replaced by a rescaled copy: :class:`KeptGradients`,
:func:`watch_backward`): it marks that parameter's gradient as summed (:func:`gradients_summed`), the run as
``summed``.

Examples
--------
>>> bnn = pyro_bbb.BNN(BayesianLinear(2, 1), likelihoods.Gaussian(scale=0.5))
>>> guide = pyro_bbb.MeanFieldGuide(bnn)
>>> elbo = pyro_bbb.ELBO(num_data=100)
>>> _ = elbo.loss_and_grads(bnn, guide, torch.randn(10, 2), torch.randn(10))
>>> params = [p for _, p in pyro.get_param_store().named_parameters()]
>>> run = take_objective_run(params)
>>> run.num_data, run.kl_weight
(100, Constant(weight=1.0))
>>> take_objective_run(params) is None  # taken: the next step needs new gradients
True
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from .._internals import current_backward_id, queue_after_backward, tensor_version

__all__ = ["ObjectiveRun", "KeptGradients", "mark_objective_run", "watch_backward", "gradients_summed",
           "take_objective_run", "objective_gradient_kept"]


class _MarkTable:
    """Unconstrained parameter (by identity, weakly: an entry goes with its parameter) -> :class:`_Mark`. Every
    gradient computation re-marks every parameter it reached, so replacing a parameter's mark is one dictionary
    write, with the weak reference made once per parameter (torch's ``WeakIdKeyDictionary`` makes one at every
    write)."""

    def __init__(self):
        self._entries: dict[int, tuple[weakref.ref, _Mark]] = {}  # id(param) -> (weak reference to it, mark)

    def _entry(self, param: torch.Tensor) -> tuple[weakref.ref, _Mark] | None:
        entry = self._entries.get(id(param))
        return entry if entry is not None and entry[0]() is param else None  # (an id a dead parameter left)

    def get(self, param: torch.Tensor, default: _Mark | None = None) -> _Mark | None:
        entry = self._entry(param)
        return default if entry is None else entry[1]

    def __getitem__(self, param: torch.Tensor) -> _Mark:
        entry = self._entry(param)
        if entry is None:
            raise KeyError("this parameter carries no mark")
        return entry[1]

    def __setitem__(self, param: torch.Tensor, mark: _Mark) -> None:
        entry = self._entry(param)
        key = id(param)
        ref = entry[0] if entry is not None else weakref.ref(param, self._dropper(key))
        self._entries[key] = (ref, mark)

    def _dropper(self, key: int) -> Callable[[weakref.ref], None]:
        entries = self._entries

        def drop(ref: weakref.ref) -> None:  # the parameter is gone: its entry (not a newer one under its id) goes
            entry = entries.get(key)
            if entry is not None and entry[0] is ref:
                del entries[key]
        return drop

    def pop(self, param: torch.Tensor, default: _Mark | None = None) -> _Mark | None:
        entry = self._entry(param)
        if entry is None:
            return default
        del self._entries[id(param)]
        return entry[1]

    def items(self) -> list[tuple[torch.Tensor, _Mark]]:
        return [(param, mark) for param, mark in ((ref(), mark) for ref, mark in list(self._entries.values()))
                if param is not None]

    def __len__(self) -> int:
        return len(self._entries)


class _Mark(NamedTuple):
    run: ObjectiveRun
    wrote: bool  # its backward wrote the gradient there (False: none, pending, or returned by torch.autograd.grad)
    pending_in: int | None = None  # the backward (its id) still computing this run's gradient
    summed: bool = False  # the run's backward added onto this parameter's gradient from another ELBO call

    @staticmethod
    def on(param: torch.Tensor, run: ObjectiveRun, summed: bool = False) -> _Mark:
        return _Mark(run, param.grad is not None, summed=summed)


def _gradients_kept(marked: list[tuple[torch.Tensor, _Mark | None]]) -> list[bool]:
    """For each ``(param, mark)``: whether a backward now adds onto gradients the mark's (finished) run left, neither
    applied (an optimizer that reads the marks takes them) nor zeroed since: ``param`` has a gradient and it is not
    all zeros (zeroed in place, through ``.data``, or replaced by zeros as Pyro's ``zero_grads`` does). Whether it is
    the tensor that run left or another put in its place does not matter: clipped or unscaled between accumulated
    backwards, in place or out of place (``p.grad = p.grad / k``), it still holds that run's gradient. The "not all
    zeros" reads take one device sync per device, not one per parameter."""
    by_device: dict[torch.device, list[int]] = {}
    for i, (param, mark) in enumerate(marked):
        if mark is not None and mark.pending_in is None and param.grad is not None:
            by_device.setdefault(param.grad.device, []).append(i)
    kept = [False] * len(marked)
    for indices in by_device.values():
        nonzero = torch.stack([marked[i][0].grad.any() for i in indices]).tolist()
        for i, value in zip(indices, nonzero):
            kept[i] = value
    return kept


# unconstrained parameter -> the run that last computed its gradient and was not yet applied, with the gradient
# tensor as that run's backward left it
_marks = _MarkTable()


def _gradient_state(param: torch.Tensor) -> tuple[weakref.ref | None, int]:
    """``param``'s gradient as it is now: the tensor (weakly) and torch's count of its in-place changes."""
    grad = param.grad
    return (None, -1) if grad is None else (weakref.ref(grad), tensor_version(grad))


def _unchanged(param: torch.Tensor, state: tuple[weakref.ref | None, int]) -> bool:
    """Whether ``param``'s gradient is still as :func:`_gradient_state` saw it (``None`` then: still ``None``)."""
    ref, version = state
    grad = param.grad
    return grad is None if ref is None else grad is not None and ref() is grad and tensor_version(grad) == version


@dataclass(eq=False)
class ObjectiveRun:
    """One gradient computation of :class:`pyro_bbb.ELBO`: the training-set size ``num_data`` its minibatch was scaled
    to (``None`` when it could not tell), its KL weight (a schedule; :class:`~pyro_bbb.infer.schedules.Constant` for
    a number), the ``scale`` a handler multiplied the whole loss by (``poutine.scale`` around the model and the guide;
    ``None`` when they were scaled unalike), and whether its backward was ``summed`` onto gradients an earlier run
    left, neither applied nor zeroed (gradient accumulation, or a loop that forgot to zero them: :meth:`adds_onto`),
    on any of the parameters it reached (:func:`gradients_summed` tells for given ones).
    ``take_back`` undoes what the calls behind these gradients recorded as a step (:meth:`refused`): per thing
    recorded (a schedule's step, a guide's trained weight; the key), the value before the oldest of those calls, as
    ``(order, action)`` -- bounded however many calls a never-zeroed gradient sums. ``model_call`` is the call's
    ``(model, args, kwargs)``, for an optimizer that must read the model's structure (IVON: which priors depend on
    other latent sites). Two runs are the same only when they are one object.

    Examples
    --------
    >>> ObjectiveRun(num_data=50, kl_weight=1.0).num_data
    50
    """

    num_data: int | None
    kl_weight: Any
    scale: float | None = 1.0
    summed: bool = False
    take_back: dict[Any, tuple[int, Callable[[], None]]] = field(default_factory=dict)
    model_call: tuple | None = None

    def adds_onto(self, earlier: list[ObjectiveRun]) -> None:
        """Note that this run's backward added onto the gradients of the ``earlier`` runs (none: nothing noted).

        Examples
        --------
        >>> first, second = ObjectiveRun(50, 1.0), ObjectiveRun(50, 1.0)
        >>> second.adds_onto([first])
        >>> second.summed
        True
        """
        if earlier:
            self.summed = True
            for run in earlier:  # per key, the oldest call's value is the one before them all
                for key, (order, action) in run.take_back.items():
                    if key not in self.take_back or order < self.take_back[key][0]:
                        self.take_back[key] = (order, action)

    def refused(self) -> None:
        """Take back what the calls that computed these gradients recorded as a training step (a KL schedule's step,
        the weight the guide is noted as trained at): the optimizer refused to apply them, so nothing was trained.

        Examples
        --------
        >>> steps = [3]
        >>> ObjectiveRun(50, 1.0, take_back={"step": (0, lambda: steps.__setitem__(0, 2))}).refused()
        >>> steps
        [2]
        """
        for _, action in self.take_back.values():
            action()


def mark_objective_run(params: Iterable[torch.Tensor], run: ObjectiveRun,
                       onto: KeptGradients | None = None) -> ObjectiveRun:
    """Mark each of ``params`` (unconstrained, as Pyro's optimizers get them) as having its gradient, as it is now,
    from ``run``, summed where the run's backward added onto ``onto``'s kept gradients (a loss whose backward is the
    caller's is marked when that backward runs: :func:`watch_backward`).

    Examples
    --------
    >>> p = torch.zeros(2, requires_grad=True)
    >>> mark_objective_run([p], ObjectiveRun(200, 1.0)).num_data
    200
    """
    holds = onto.holds if onto else None  # (none kept, as nearly always: nothing to look up)
    for param in params:
        _marks[param] = _Mark.on(param, run, summed=holds is not None and holds(param))
    return run


class KeptGradients:
    """The gradients earlier runs left on the parameters that nobody has applied, zeroed or released since, seen
    when a gradient computation starts: a backward into them adds onto them (:meth:`holds`, :meth:`runs_under`).

    Examples
    --------
    >>> p = torch.zeros(2, requires_grad=True)
    >>> p.sum().backward()
    >>> run = mark_objective_run([p], ObjectiveRun(200, 1.0))
    >>> KeptGradients().runs_under([p]) == [run]
    True
    >>> p.grad.zero_()  # zeroed: the next backward starts afresh
    tensor([0., 0.])
    >>> KeptGradients().runs_under([p])
    []
    """

    def __init__(self):
        # (none to scan where IVON took every mark it applied; a released gradient is not read further)
        marked = [(param, mark) for param, mark in _marks.items() if param.grad is not None] if len(_marks) else []
        self._kept = {id(param): (weakref.ref(param), mark)
                      for (param, mark), kept in zip(marked, _gradients_kept(marked)) if kept}

    def __bool__(self) -> bool:
        return bool(self._kept)

    def holds(self, param: torch.Tensor) -> bool:
        """Whether ``param``'s gradient is one an earlier run left and kept."""
        ref, _ = self._kept.get(id(param), (None, None))
        return ref is not None and ref() is param

    def runs_under(self, params: Iterable[torch.Tensor]) -> list[ObjectiveRun]:
        """The runs whose kept gradients are on ``params``."""
        if not self._kept:
            return []
        return list(dict.fromkeys(self._kept[id(param)][1].run for param in params if self.holds(param)))


def watch_backward(loss: torch.Tensor, run: ObjectiveRun, params: list[torch.Tensor]) -> None:
    """Mark ``params`` as ``run``'s when the caller's backward of ``loss`` (``differentiable_loss``) runs, not before:
    a loss only looked at leaves the marks as they were, and so does ``torch.autograd.grad`` (which writes no
    ``.grad``) where an earlier run's gradient is kept there. The backward is ``summed`` onto the runs whose kept
    gradients it added to (an earlier run's, or this run's from an earlier backward of the same loss), and onto
    another loss's in the same backward, and so are those parameters' gradients (:func:`gradients_summed`); one that
    raised part-way leaves nothing that the next one counts.

    Examples
    --------
    >>> p = torch.ones(2, requires_grad=True)
    >>> run = ObjectiveRun(200, 1.0)
    >>> loss = (3 * p).sum()
    >>> watch_backward(loss, run, [p])
    >>> loss.backward(retain_graph=True)
    >>> run.summed
    False
    >>> loss.backward()  # twice: the second adds onto the first
    >>> run.summed
    True
    """
    refs = [weakref.ref(param) for param in params]

    def at_backward(grad: torch.Tensor) -> torch.Tensor:
        backward = current_backward_id()
        marked = [(param, _marks.get(param)) for param in (ref() for ref in refs) if param is not None]
        entries = []  # per parameter: its mark, whether that mark's gradient was kept, whether another loss of this
        # backward reaches it too, the gradient now
        for (param, mark), kept in zip(marked, _gradients_kept(marked)):
            shared = mark is not None and mark.pending_in == backward and mark.run is not run  # another loss, this pass
            if shared:
                run.adds_onto([mark.run])
                mark.run.adds_onto([run])
            entries.append((weakref.ref(param), mark, kept, shared, _gradient_state(param)))
            _marks[param] = _Mark(run, False, pending_in=backward)

        def left() -> None:
            under = []
            for ref, mark, kept, shared, state in entries:
                param = ref()
                now = None if param is None else _marks.get(param)
                if now is None or now.run is not run:
                    continue
                written = not _unchanged(param, state)
                if written and kept:  # added onto the kept gradient of an earlier run
                    under.append(mark.run)
                # not written (torch.autograd.grad) onto a kept gradient an earlier backward left (clipped or
                # rescaled since, perhaps): .grad is still that run's; else this run's (written; or returned for the
                # caller to set, as a functional loop does: the gradient there now, e.g. the earlier step's, which
                # the caller set, is not one this run left)
                if kept and not written and mark.wrote:
                    _marks[param] = mark
                else:
                    _marks[param] = _Mark.on(param, run, summed=kept or shared) if written else _Mark(run, False)
            run.adds_onto(list(dict.fromkeys(under)))
        queue_after_backward(left)
        return grad

    loss.register_hook(at_backward)


def gradients_summed(params: Iterable[torch.Tensor]) -> bool:
    """Whether the gradient of one of ``params`` is summed over more than one gradient call of the ELBO: a backward
    added onto what an earlier call left there, neither applied nor zeroed (:class:`ObjectiveRun`'s ``summed`` says
    it of any parameter the run reached: a deterministic body's, say, that its own optimizer trains with a penalty).

    Examples
    --------
    >>> p = torch.ones(2, requires_grad=True)
    >>> loss = (3 * p).sum()
    >>> watch_backward(loss, ObjectiveRun(200, 1.0), [p])
    >>> loss.backward(retain_graph=True)
    >>> gradients_summed([p])
    False
    >>> loss.backward()  # twice: the second adds onto the first
    >>> gradients_summed([p])
    True
    """
    return any(mark is not None and mark.summed and param.grad is not None
               for param, mark in ((param, _marks.get(param)) for param in params))


def take_objective_run(params: Iterable[torch.Tensor]) -> ObjectiveRun | None:
    """The run that computed the gradients of ``params`` (those with a gradient), taking its mark off all of them;
    ``None`` when one of them has no mark, when they were marked by different runs, or when none has a gradient.

    Examples
    --------
    >>> p, q = torch.zeros(2, requires_grad=True), torch.zeros(1, requires_grad=True)
    >>> p.grad, q.grad = torch.ones(2), torch.ones(1)
    >>> _ = mark_objective_run([p], ObjectiveRun(200, 1.0))
    >>> take_objective_run([p, q]) is None  # q's gradient came from elsewhere
    True
    """
    runs = set()  # runs compare (and hash) by identity; None stands for a gradient without a mark
    for param in params:
        mark = _marks.pop(param, None)
        if param.grad is not None:
            runs.add(None if mark is None else mark.run)
    return runs.pop() if len(runs) == 1 else None


def objective_gradient_kept(param: torch.Tensor) -> bool:
    """Whether ``param`` holds a gradient a :class:`pyro_bbb.ELBO` run left, neither applied nor zeroed since (a
    backward now adds onto it: an auxiliary loss of one's own, computed apart).

    Examples
    --------
    >>> p = torch.ones(2, requires_grad=True)
    >>> loss = (3 * p).sum()
    >>> watch_backward(loss, ObjectiveRun(200, 1.0), [p])
    >>> objective_gradient_kept(p)
    False
    >>> loss.backward()
    >>> objective_gradient_kept(p)
    True
    """
    mark = _marks.get(param)
    return mark is not None and _gradients_kept([(param, mark)])[0]
