"""Argument checks shared by the package, each with one meaning and one message.

Examples
--------
>>> check_count("epochs", 3)
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

from .nn.module import DATA_PLATE

__all__ = ["check_count", "check_positive", "data_plate_of", "is_set_up", "require_set_up", "GuideNotSetUpError"]


class GuideNotSetUpError(ValueError, RuntimeError):
    """A guide that has not seen the model yet was asked for what only a fitted guide has (a ``ValueError``, and a
    ``RuntimeError`` as :meth:`pyro_bbb.MeanFieldGuide.site_posteriors` raised before).

    Examples
    --------
    >>> issubclass(GuideNotSetUpError, ValueError) and issubclass(GuideNotSetUpError, RuntimeError)
    True
    """


def check_count(name: str, value: Any, optional: bool = False) -> None:
    """A positive integer (numpy integers too, ``bool`` not), or ``None`` when ``optional``.

    Examples
    --------
    >>> check_count("num_samples", 0)
    Traceback (most recent call last):
    ...
    ValueError: `num_samples` must be a positive integer, got 0.
    """
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer{' or None' if optional else ''}, got {value!r}.")


def check_positive(name: str, value: Any, optional: bool = False) -> None:
    """A finite number > 0 (not ``bool``), or ``None`` when ``optional``.

    Examples
    --------
    >>> check_positive("clip_norm", None, optional=True)
    """
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"`{name}` must be a finite number > 0{' or None' if optional else ''}, got {value!r}.")


def data_plate_of(model: Any) -> str:
    """The name of a model's data plate: its ``data_plate`` attribute, else :data:`~pyro_bbb.nn.module.DATA_PLATE`.

    Examples
    --------
    >>> data_plate_of(lambda x: x)
    'data'
    """
    return getattr(model, "data_plate", DATA_PLATE)


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
    pyro_bbb.checks.GuideNotSetUpError: the guide has not seen the model yet (it has not been fitted), and summary ...
    """
    if not is_set_up(guide):
        raise GuideNotSetUpError(
            f"the guide has not seen the model yet (it has not been fitted), and {what} needs its parameters: fit it "
            "(pyro_bbb.fit, or one SVI step with the targets) first."
        )
