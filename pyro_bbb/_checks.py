"""Argument checks and the error types they raise, each check with one meaning and one message.

Examples
--------
>>> check_count("epochs", 3)
3
>>> check_count("batch_size", None, optional=True)
>>> check_positive("lr", 0.0)
Traceback (most recent call last):
...
ValueError: `lr` must be a finite number > 0, got 0.0.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

__all__ = [
    "is_number", "check_count", "check_positive", "check_nonnegative", "check_finite", "is_set_up", "require_set_up",
    "GuideNotSetUpError",
]


class GuideNotSetUpError(ValueError):
    """A guide that has not seen the model yet was asked for what only a fitted guide has.

    Examples
    --------
    >>> issubclass(GuideNotSetUpError, ValueError)
    True
    """


def is_number(value: Any) -> bool:
    """A real number: Python's or numpy's (``np.float32(0.1)``), not ``bool`` nor a tensor.

    Examples
    --------
    >>> is_number(0.1), is_number(True), is_number("0.1")
    (True, False, False)
    """
    return isinstance(value, Real) and not isinstance(value, bool)


def check_count(name: str, value: Any, optional: bool = False) -> int | None:
    """A positive integer (numpy integers too, ``bool`` not), returned as an ``int``; or ``None`` when ``optional``.

    Examples
    --------
    >>> check_count("num_samples", 0)
    Traceback (most recent call last):
    ...
    ValueError: `num_samples` must be a positive integer, got 0.
    """
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer{' or None' if optional else ''}, got {value!r}.")
    return int(value)


def check_positive(name: str, value: Any, optional: bool = False) -> float | None:
    """A finite number > 0 (not ``bool``), returned as a ``float``; or ``None`` when ``optional``.

    Examples
    --------
    >>> check_positive("clip_norm", None, optional=True)
    >>> check_positive("scale", 2)
    2.0
    """
    if optional and value is None:
        return None
    if not is_number(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"`{name}` must be a finite number > 0{' or None' if optional else ''}, got {value!r}.")
    return float(value)


def check_nonnegative(name: str, value: Any) -> float:
    """A finite number >= 0 (not ``bool``), returned as a ``float``.

    Examples
    --------
    >>> check_nonnegative("weight", -1.0)
    Traceback (most recent call last):
    ...
    ValueError: `weight` must be a finite number >= 0, got -1.0.
    """
    if not is_number(value) or not math.isfinite(value) or value < 0:
        raise ValueError(f"`{name}` must be a finite number >= 0, got {value!r}.")
    return float(value)


def check_finite(name: str, value: Any) -> float:
    """A finite number (not ``bool``), returned as a ``float``.

    Examples
    --------
    >>> check_finite("loc", float("nan"))
    Traceback (most recent call last):
    ...
    ValueError: `loc` must be a finite number, got nan.
    """
    if not is_number(value) or not math.isfinite(value):
        raise ValueError(f"`{name}` must be a finite number, got {value!r}.")
    return float(value)


def is_set_up(guide: Any) -> bool:
    """Whether a guide has its parameters: an autoguide after its first call; a hand-written guide always.

    Examples
    --------
    >>> is_set_up(lambda x, y=None: None)
    True
    """
    return getattr(guide, "prototype_trace", True) is not None


def require_set_up(guide: Any, what: str) -> None:
    """A :class:`GuideNotSetUpError` saying that ``what`` needs a guide that has seen the model, and how to get one.

    Examples
    --------
    >>> require_set_up(MeanFieldGuide(BayesianLinear(2, 1)), "summary")
    Traceback (most recent call last):
    ...
    pyro_bbb._checks.GuideNotSetUpError: the guide has not seen the model yet (it has not been fitted), and summary ...
    """
    if not is_set_up(guide):
        raise GuideNotSetUpError(
            f"the guide has not seen the model yet (it has not been fitted), and {what} needs its parameters: fit it "
            "(pyro_bbb.fit, or one SVI step with the targets) first."
        )
