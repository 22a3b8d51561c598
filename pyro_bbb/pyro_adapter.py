"""The few private Pyro helpers pyro_bbb relies on, behind one small adapter: a Pyro release that moves one of them
breaks this module only.

Examples
--------
>>> site_name("net.0", "weight")
'net.0.weight'
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import pyro
import torch
from pyro.infer.trace_mean_field_elbo import _check_mean_field_requirement
from pyro.nn.module import _is_module_local_param_enabled, _make_name
from pyro.poutine.runtime import _PYRO_STACK
from pyro.poutine.trace_messenger import TraceMessenger
from torch.distributions import transform_to

__all__ = [
    "site_name", "module_local_params_enabled", "check_mean_field_requirement", "autonormal_loc_and_scale",
    "set_up_autoguide", "autonormal_event_dim", "param_captures", "ParamReader", "preset_samples", "sample_priors",
]


def site_name(prefix: str, name: str) -> str:
    """The Pyro site (or parameter) name of attribute ``name`` of a ``PyroModule`` named ``prefix``.

    Examples
    --------
    >>> site_name("", "weight")
    'weight'
    """
    return _make_name(prefix, name)


def module_local_params_enabled() -> bool:
    """Whether ``pyro.settings`` keeps ``PyroModule`` parameters local to the module (not in the global store).

    Examples
    --------
    >>> module_local_params_enabled()
    False
    """
    return _is_module_local_param_enabled()


def check_mean_field_requirement(model_trace: Any, guide_trace: Any) -> None:
    """Pyro's warning for guides whose sites are not in the model's order (what ``TraceMeanField_ELBO`` checks).

    Examples
    --------
    ::

        check_mean_field_requirement(model_trace, guide_trace)
    """
    _check_mean_field_requirement(model_trace, guide_trace)


def autonormal_loc_and_scale(guide: Any, name: str):
    """The live ``(loc, scale)`` of Pyro's ``AutoNormal`` at site ``name`` (its private accessor).

    Examples
    --------
    ::

        loc, scale = autonormal_loc_and_scale(AutoNormal(model), "fc.weight")
    """
    return guide._get_loc_and_scale(name)


def set_up_autoguide(guide: Any, *args: Any, **kwargs: Any) -> None:
    """Create an autoguide's parameters from one run of its model on ``args`` (no draw from the guide), as its
    first call would.

    Examples
    --------
    ::

        set_up_autoguide(guide, x_first, y_first)   # e.g. before broadcasting the parameters to other ranks
    """
    guide._setup_prototype(*args, **kwargs)


def autonormal_event_dim(guide: Any, name: str) -> int:
    """How many rightmost dimensions of site ``name`` an ``AutoNormal`` treats as one event.

    Examples
    --------
    ::

        normal = dist.Normal(loc, scale).to_event(autonormal_event_dim(guide, "fc.weight"))
    """
    return guide._event_dims[name]


def param_captures(allowed: tuple[type, ...] = ()) -> tuple[list, list] | None:
    """The traces of the active ``poutine.trace(param_only=True)`` handlers (how ``SVI.step`` and ``fit`` learn which
    parameters a step used) and the active handlers of the ``allowed`` types, when nothing else is active; ``None``
    when any other handler is.

    Examples
    --------
    >>> param_captures()
    ([], [])
    >>> with pyro.poutine.trace(param_only=True):
    ...     len(param_captures()[0])
    1
    >>> with pyro.poutine.block():
    ...     param_captures() is None
    True
    """
    captures, others = [], []
    for messenger in _PYRO_STACK:
        if type(messenger) is TraceMessenger and messenger.param_only:
            captures.append(messenger.trace)
        elif type(messenger) in allowed:
            others.append(messenger)
        else:
            return None
    return captures, others


class ParamReader:
    """Reads named parameters of Pyro's param store in their constrained form, as ``pyro.param(name)`` returns them
    (the same tensors, with the ``unconstrained`` back-reference the optimizers follow), without a message per
    parameter; :meth:`read` also records them in the given ``param_only`` traces, as the messages would have.

    Examples
    --------
    >>> _ = pyro.param("reader_example", torch.ones(2), constraint=pyro.distributions.constraints.positive)
    >>> reader = ParamReader(["reader_example"])
    >>> [value] = reader.read([])
    >>> torch.equal(value, pyro.param("reader_example")), value.unconstrained() is not None
    (True, True)
    """

    def __init__(self, names: list[str]):
        self.names = list(names)
        self._transforms: dict[str, Any] = {}

    def read(self, captures: list, start: int = 0, stop: int | None = None) -> list[torch.Tensor]:
        """The values of ``names[start:stop]``, recorded in ``captures``."""
        store = pyro.get_param_store()
        values = []
        for name in self.names[start:stop]:
            unconstrained = store._params[name]
            transform = self._transforms.get(name)
            if transform is None or transform[0] is not store._constraints[name]:
                transform = self._transforms[name] = (store._constraints[name], transform_to(store._constraints[name]))
            value = transform[1](unconstrained)
            value.unconstrained = weakref.ref(unconstrained)
            for trace in captures:
                trace.add_node(name, type="param", name=name, value=value, args=(), kwargs={}, infer={},
                               scale=1.0, mask=None, cond_indep_stack=(), done=True, stop=False, continuation=None,
                               is_observed=False, fn=None)  # fmt: skip
            values.append(value)
        return values


class _ReadNames(dict):
    """A ``PyroModule`` context cache that remembers which names were read."""

    def __init__(self, values: dict[str, torch.Tensor]):
        super().__init__(values)
        self.read: set[str] = set()

    def get(self, name, default=None):
        if name in self:
            self.read.add(name)
        return super().get(name, default)


@contextmanager
def preset_samples(module: torch.nn.Module, values: dict[str, torch.Tensor]) -> Iterator[set[str]]:
    """Within the block, ``module``'s ``PyroSample`` attributes named in ``values`` (by full site name) return those
    values without a ``pyro.sample`` message -- the cache ``PyroModule`` keeps for one model run, filled up front.
    Yields the set of the names read so far (filled as the block runs).

    Examples
    --------
    >>> from pyro_bbb.nn import BayesianLinear
    >>> layer = BayesianLinear(2, 1)
    >>> with preset_samples(layer, {"weight": torch.ones(1, 2), "bias": torch.zeros(1)}) as read:
    ...     output = layer(torch.ones(3, 2))
    >>> output.squeeze(-1), sorted(read)
    (tensor([2., 2., 2.]), ['bias', 'weight'])
    """
    context = module._pyro_context
    context.__enter__()
    saved, context.cache = context.cache, _ReadNames(values)
    try:
        yield context.cache.read
    finally:
        context.cache = saved
        context.__exit__(None, None, None)


def _emitted_prior(module: torch.nn.Module, prior: Any):
    return prior if hasattr(prior, "sample") else prior(module)


def sample_priors(model: torch.nn.Module) -> dict[str, Callable[[], Any]]:
    """Site name -> a function returning the prior that a ``PyroModule``'s ``PyroSample`` attribute emits at that
    moment (a callable prior is called with its module, as ``PyroModule`` does), for every such attribute in
    ``model``.

    Examples
    --------
    >>> from pyro_bbb import BNN, likelihoods
    >>> from pyro_bbb.nn import BayesianLinear
    >>> bnn = BNN(BayesianLinear(2, 1), likelihoods.Gaussian())   # a learned (latent) noise scale
    >>> type(sample_priors(bnn)["likelihood.scale"]()).__name__
    'LogNormal'
    """
    found = {}
    for module in model.modules():
        samples = module.__dict__.get("_pyro_samples") or {}
        prefix = module.__dict__.get("_pyro_name", "")
        for attr, prior in samples.items():
            found[site_name(prefix, attr)] = partial(_emitted_prior, module, prior)
    return found
