"""The few private Pyro helpers pyro_bbb relies on, behind one small adapter: a Pyro release that moves one of them
breaks this module only.

Examples
--------
>>> site_name("net.0", "weight")
'net.0.weight'
"""

from __future__ import annotations

from typing import Any

from pyro.infer.trace_mean_field_elbo import _check_mean_field_requirement
from pyro.nn.module import _is_module_local_param_enabled, _make_name

__all__ = [
    "site_name", "module_local_params_enabled", "check_mean_field_requirement", "autonormal_loc_and_scale",
    "set_up_autoguide", "autonormal_event_dim",
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
