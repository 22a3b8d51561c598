"""``Adam``: Pyro's Adam with one torch optimizer for all parameters instead of one per parameter.

``pyro.optim.Adam`` creates a separate ``torch.optim.Adam`` for every parameter and calls each one every step;
for a Bayesian network (a mean and a scale per weight tensor) that per-call overhead is a quarter of a small
network's step (``benchmarks/step_time.py``). Adam is elementwise, so one optimizer over all parameters makes
the same updates (to the last bit or two: it runs torch's fused Adam kernel, one pass per tensor, where torch has
one for the device). Use it wherever a :class:`pyro.optim.PyroOptim` goes (``SVI``, :func:`pyro_bbb.fit`).

Examples
--------
>>> p = torch.nn.Parameter(torch.zeros(3))
>>> p.grad = torch.ones(3)
>>> optimizer = Adam(lr=0.1)
>>> optimizer([p])
>>> p.data
tensor([-0.1000, -0.1000, -0.1000])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pyro
import torch
from pyro.optim import PyroOptim

from .._checks import check_nonnegative
from .._internals import fused_adam_step, optimizer_has_step_hooks

__all__ = ["Adam"]


class Adam(PyroOptim):
    """Adam over every parameter SVI hands it, in one ``torch.optim.Adam`` (new parameters join as they appear).

    A step updates only the parameters passed to that call, like ``pyro.optim.Adam``; the others keep their
    state untouched. The gradients it used are released (set to ``None``, as ``zero_grad(set_to_none=True)``), so
    the next backward pass writes new ones instead of adding to zeros that Pyro's ``SVI`` would allocate.

    Parameters
    ----------
    lr, betas, eps, weight_decay :
        As in :class:`torch.optim.Adam`. Pyro's form, one dict of them (``Adam({"lr": 1e-2})``, as
        ``pyro.optim.Adam`` takes), works too.

    Examples
    --------
    >>> Adam(lr=1e-2)
    Adam(lr=0.01, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.0)
    >>> Adam({"lr": 1e-2, "betas": (0.9, 0.99)})
    Adam(lr=0.01, betas=(0.9, 0.99), eps=1e-08, weight_decay=0.0)
    """

    def __init__(
        self, lr: float | Mapping[str, Any] = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        if isinstance(lr, Mapping):  # pyro.optim.Adam's form: one dict of torch.optim.Adam's arguments
            unknown = set(lr) - {"lr", "betas", "eps", "weight_decay"}
            if unknown:
                raise ValueError(
                    f"pyro_bbb.optim.Adam takes lr, betas, eps and weight_decay; got {sorted(unknown)} as well. "
                    "Drop them (amsgrad and per-parameter arguments are not supported) or use pyro.optim.Adam."
                )
            args = {"lr": 1e-3, "betas": betas, "eps": eps, "weight_decay": weight_decay} | dict(lr)
            lr, betas, eps, weight_decay = args["lr"], args["betas"], args["eps"], args["weight_decay"]
        elif callable(lr):
            raise TypeError(
                "pyro_bbb.optim.Adam takes its arguments as numbers or one dict, not a function of the parameter "
                "name (per-parameter arguments): use pyro.optim.Adam for those."
            )
        lr, eps, weight_decay = (check_nonnegative(n, v) for n, v in (("lr", lr), ("eps", eps),
                                                                      ("weight_decay", weight_decay)))
        self.defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(torch.optim.Adam, dict(self.defaults))
        self.optimizer: torch.optim.Adam | None = None
        self._known: set[torch.Tensor] = set()
        self._fused_step: _FusedStep | None = None
        self._pending: dict[str, dict[str, torch.Tensor]] = {}  # restored state, by parameter name, not yet attached
        # restored state of parameters without a name in the param store (module-local ones), by the parameter itself
        self._pending_by_param: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def __call__(self, params: Iterable[torch.Tensor], *args, **kwargs) -> None:
        params = list(dict.fromkeys(params))  # the caller's order (Pyro's SVI passes a set; fit passes the store's)
        if not params:  # nothing to step (a torch optimizer cannot be built over no parameters)
            return
        if self._fused_step is None or not self._fused_step(params, self.optimizer):
            self._torch_step(params)
        for p in params:  # spent: as zero_grad(set_to_none=True); the next backward writes fresh ones, adding nothing
            p.grad = None

    def _torch_step(self, params: list[torch.Tensor]) -> None:
        """The torch optimizer's own step over ``params`` (new ones join it), then the direct call for the next."""
        new = [p for p in params if p not in self._known]
        if new:
            restored = self._restored_state(new)  # checked before anything changes
            if self.optimizer is None:
                self.optimizer = _joint_adam(new, self.defaults)
            else:
                self.optimizer.add_param_group({"params": new, "lr": self.defaults["lr"], **_kernel_options(new)})
            self._known.update(new)
            self.optimizer.state.update(restored)
        # parameters not in this step keep their state: hide their gradients from the joint step
        hidden = {p: p.grad for p in self._known.difference(params) if p.grad is not None}
        for p in hidden:
            p.grad = None
        self.optimizer.step()
        self._fused_step = _FusedStep.for_step(params, self.optimizer)  # the next steps on the same parameters
        for p, grad in hidden.items():
            p.grad = grad

    def set_learning_rate(self, lr: float) -> None:
        """Use learning rate ``lr`` from the next step on (for every parameter, also those that join later).

        Examples
        --------
        >>> optimizer = Adam(lr=1e-2)
        >>> optimizer.set_learning_rate(1e-3)
        >>> optimizer
        Adam(lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.0)
        """
        lr = check_nonnegative("lr", lr)  # (as built; torch's optimizer, once built, takes any number: -lr climbs)
        self.defaults["lr"] = lr
        if self.optimizer is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = lr

    def get_state(self) -> dict[str, dict[str, torch.Tensor]]:
        """Each parameter's moments and step count, keyed by its name in Pyro's param store (as
        :class:`pyro.optim.PyroOptim` keys its state), so that :meth:`set_state` can give them back to whichever
        tensors carry those names then.

        Examples
        --------
        >>> p = pyro.param("state_example", torch.zeros(2))
        >>> optimizer = Adam(lr=0.1)
        >>> p.unconstrained().grad = torch.ones(2)
        >>> optimizer([p.unconstrained()])
        >>> sorted(optimizer.get_state()["state_example"])
        ['exp_avg', 'exp_avg_sq', 'step']
        """
        store = pyro.get_param_store()
        state = {name: {key: value.detach().clone() for key, value in entry.items()}
                 for name, entry in self._pending.items()}
        if self.optimizer is not None:
            for p, entry in self.optimizer.state.items():
                name = store.param_name(p)
                if name is not None and entry:
                    state[name] = {key: value.detach().clone() for key, value in entry.items()}
        return state

    def set_state(self, state_dict: dict[str, dict[str, torch.Tensor]]) -> None:
        """Resume from :meth:`get_state`: each saved moment goes to the parameter that carries its name when that
        parameter next steps (after ``pyro.get_param_store().set_state(...)``, or in a new process), so a restored run
        continues as the uninterrupted one would.

        Examples
        --------
        >>> optimizer = Adam(lr=0.1)
        >>> moments = {"exp_avg": torch.ones(2), "exp_avg_sq": torch.ones(2), "step": torch.tensor(3.0)}
        >>> optimizer.set_state({"w": moments})
        >>> sorted(optimizer.get_state())
        ['w']
        """
        keys = {"exp_avg", "exp_avg_sq", "step"}
        if not isinstance(state_dict, dict) or not all(
            isinstance(entry, dict) and keys <= entry.keys() for entry in state_dict.values()
        ):
            raise ValueError(
                "set_state takes what pyro_bbb.optim.Adam.get_state returned: parameter name -> {'exp_avg', "
                "'exp_avg_sq', 'step'}."
            )
        self._pending, self._pending_by_param = {name: dict(entry) for name, entry in state_dict.items()}, {}
        # the next step starts a fresh torch optimizer: restored tensors are new objects, their state attaches by name
        self.optimizer, self._known, self._fused_step = None, set(), None

    def has_unnamed_moments(self) -> bool:
        """Whether it holds moments of parameters that have no name in Pyro's param store (a module's own under
        ``pyro.settings.set(module_local_params=True)``), which :meth:`get_state` cannot key and so leaves out.

        Examples
        --------
        >>> p = torch.nn.Parameter(torch.zeros(2))
        >>> optimizer = Adam(lr=0.1)
        >>> p.grad = torch.ones(2)
        >>> optimizer([p])
        >>> optimizer.has_unnamed_moments()
        True
        """
        store = pyro.get_param_store()
        stepped = self.optimizer.state.items() if self.optimizer is not None else ()
        return bool(self._pending_by_param) or any(entry and store.param_name(p) is None for p, entry in stepped)

    def snapshot(self) -> Callable[[], None]:
        """A function that puts this optimizer's state back as it is now, within this process: as
        :meth:`set_state` of :meth:`get_state`, and also for the parameters that have no name in Pyro's param store
        (a module's own under ``pyro.settings.set(module_local_params=True)``), which it keeps by the parameter
        itself. A parameter first stepped after the snapshot starts afresh.

        Examples
        --------
        >>> p = torch.nn.Parameter(torch.zeros(2))      # (no name in the param store)
        >>> optimizer = Adam(lr=0.1)
        >>> p.grad = torch.ones(2)
        >>> optimizer([p])
        >>> restore = optimizer.snapshot()
        >>> p.grad = torch.ones(2)
        >>> optimizer([p])
        >>> restore()
        >>> with torch.no_grad():
        ...     _ = p.fill_(-0.1)                      # the parameter as it was after the first step
        >>> p.grad = torch.ones(2)
        >>> optimizer([p])                             # the second step again, from the same moments
        >>> p.tolist()
        [-0.2000000..., -0.2000000...]
        """
        by_name, by_param = self.get_state(), {p: dict(entry) for p, entry in self._pending_by_param.items()}
        if self.optimizer is not None:
            store = pyro.get_param_store()
            by_param |= {p: {key: value.detach().clone() for key, value in entry.items()}
                         for p, entry in self.optimizer.state.items() if entry and store.param_name(p) is None}

        def restore() -> None:
            self.set_state(by_name)
            self._pending_by_param = {p: dict(entry) for p, entry in by_param.items()}
        return restore

    def _restored_state(self, params: list[torch.Tensor]) -> dict[torch.Tensor, dict[str, torch.Tensor]]:
        """The state :meth:`set_state` gave for ``params`` (by name), each moment checked against its parameter's
        shape, and taken from the pending state only when all fit (torch's fused kernel does not check)."""
        if not self._pending and not self._pending_by_param:
            return {}
        store = pyro.get_param_store()
        found = {p: (name, self._pending[name]) for p in params
                 if (name := store.param_name(p)) in self._pending}
        found |= {p: (None, self._pending_by_param[p]) for p in params
                  if p not in found and p in self._pending_by_param}
        for p, (name, entry) in found.items():
            for key in ("exp_avg", "exp_avg_sq"):
                value = entry[key]
                if not isinstance(value, torch.Tensor) or value.shape != p.shape:
                    shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                    raise ValueError(
                        f"The optimizer state given to set_state holds {key!r} of shape {shape} for parameter "
                        f"{name!r}, whose shape is {tuple(p.shape)}: it was saved from another model. Restore the "
                        "optimizer state saved with these parameters, or start a fresh optimizer."
                    )
        for p, (name, _) in found.items():
            if name is None:
                del self._pending_by_param[p]
            else:
                del self._pending[name]
        return {p: {key: value.detach().clone().to(device=p.device, dtype=p.dtype if key != "step" else None)
                    for key, value in entry.items()} for p, (_, entry) in found.items()}

    def __repr__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.defaults.items()).join((f"{type(self).__name__}(", ")"))



#: Device types with a fused Adam kernel (CPU from torch 2.4); a type torch refuses is dropped (see `_joint_adam`).
_FUSED_DEVICES = {"cpu", "cuda", "mps", "xpu"}


def _kernel_options(params: list[torch.Tensor]) -> dict[str, bool]:
    """torch's fused Adam (one kernel a tensor) where every parameter is a floating tensor on a device torch fuses
    for; ``foreach`` otherwise."""
    fusable = all(torch.is_floating_point(p) and p.device.type in _FUSED_DEVICES for p in params)
    return {"fused": True, "foreach": False} if fusable else {"fused": False, "foreach": True}


def _joint_adam(params: list[torch.Tensor], defaults: dict) -> torch.optim.Adam:
    """One torch Adam over ``params``, fused where the installed torch can."""
    try:
        return torch.optim.Adam(params, **defaults, **_kernel_options(params))
    except RuntimeError:  # an older torch without a fused kernel for these devices
        _FUSED_DEVICES.difference_update(p.device.type for p in params)
        return torch.optim.Adam(params, **defaults, **_kernel_options(params))


class _FusedStep:
    """torch's fused Adam kernel called directly on the parameters of one step and their optimizer state, as
    ``torch.optim.Adam(fused=True).step()`` calls it (the same updates, bit for bit), without its per-call Python
    bookkeeping -- a tenth of a small network's step. Stands aside (returns False) for other parameters, a missing
    gradient, replaced optimizer state, hooks, or settings the plain kernel call does not cover."""

    def __init__(self, params: list[torch.Tensor], optimizer: torch.optim.Adam, buckets: list):
        self.params = params  # (held: their ids stay theirs)
        self.key = frozenset(map(id, params))
        self.state = optimizer.state
        self.buckets = buckets  # (param group, params, exp_avgs, exp_avg_sqs, steps) per group, device and dtype

    @classmethod
    def for_step(cls, params: list[torch.Tensor], optimizer: torch.optim.Adam) -> _FusedStep | None:
        group_of = {id(p): group for group in optimizer.param_groups for p in group["params"]}
        buckets: dict[tuple, tuple] = {}
        for p in params:
            group, state = group_of.get(id(p)), optimizer.state.get(p, {})
            if group is None or not _plain_fused(group) or not {"exp_avg", "exp_avg_sq", "step"} <= state.keys():
                return None
            bucket = buckets.setdefault((id(group), p.device, p.dtype), (group, [], [], [], []))
            for values, value in zip(bucket[1:], (p, state["exp_avg"], state["exp_avg_sq"], state["step"])):
                values.append(value)
        return cls(params, optimizer, list(buckets.values()))

    @torch.no_grad()
    def __call__(self, params: list[torch.Tensor], optimizer: torch.optim.Adam) -> bool:
        if frozenset(map(id, params)) != self.key or optimizer.state is not self.state:
            return False
        if optimizer_has_step_hooks(optimizer):
            return False
        if any(p.grad is None for p in params) or not all(_plain_fused(bucket[0]) for bucket in self.buckets):
            return False
        for group, bucket_params, exp_avgs, exp_avg_sqs, steps in self.buckets:
            fused_adam_step(bucket_params, exp_avgs, exp_avg_sqs, steps, group)
        return True


def _plain_fused(group: dict) -> bool:
    """A param group the direct kernel call covers: fused, number hyperparameters, no variant flags."""
    flags = ("amsgrad", "maximize", "capturable", "differentiable", "decoupled_weight_decay")
    numbers = (group.get("lr"), *group.get("betas", (None, None)), group.get("eps"), group.get("weight_decay"))
    return bool(group.get("fused")) and not any(group.get(flag) for flag in flags) and \
        all(isinstance(x, float | int) and not isinstance(x, bool) for x in numbers)



