"""Which inputs a guide was trained on: ``fit`` records a fingerprint of every training row, and a method that must
not see the training data (post-hoc temperature scaling fits on held-out data) asks whether given rows are among
them.

Only tensor (or numpy) inputs are fingerprinted, and those of a DataLoader whose rows can be read
(:func:`~pyro_bbb.data.batches.loader_rows`); other DataLoaders, and a tuple or dict of inputs, are not: nothing is
known about them. A fingerprint is the hash of a row's bytes in float32 (a floating row; an integer row in int64),
so equal rows match whatever holds them: a numpy array, a float64 copy of rows ``fit`` cast to the model's float32.

Examples
--------
>>> guide, x = object.__new__(pyro_bbb.MeanFieldGuide), torch.arange(6.0).reshape(3, 2)
>>> remember_training_inputs(guide, x)
>>> fraction_seen_in_training(guide, x[1:]), fraction_seen_in_training(guide, torch.cat([x[:1], x[:1] + 10]))
(1.0, 0.5)
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch

__all__ = ["remember_training_inputs", "fraction_seen_in_training"]

_seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _as_rows(x: Any) -> torch.Tensor | None:
    """``x`` as a tensor of rows, in the dtype fingerprints are taken in (``None``: not a tensor or an array)."""
    if isinstance(x, np.ndarray) and x.dtype.kind in "biuf":
        x = torch.from_numpy(np.ascontiguousarray(x))
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or not x.shape[0]:
        return None
    canonical = torch.float32 if x.is_floating_point() else torch.int64 if not x.is_complex() else x.dtype
    return x.detach().to("cpu", canonical)


def _fingerprints(x: torch.Tensor) -> list[int]:
    """One hash per row of ``x`` (from :func:`_as_rows`), of its bytes."""
    rows = x.contiguous().reshape(x.shape[0], -1).numpy()
    return [hash(row.tobytes()) for row in rows]


def remember_training_inputs(guide: Any, x: Any) -> None:
    """Record the rows of ``x`` (a tensor or numpy array; anything else is not recorded) as training inputs of
    ``guide``, besides those of earlier fits.

    Examples
    --------
    See the module example.
    """
    rows = _as_rows(x)
    if rows is not None:
        try:
            _seen.setdefault(guide, set()).update(_fingerprints(rows))
        except TypeError:  # a guide that cannot be weakly referenced is not recorded
            pass


def fraction_seen_in_training(guide: Any, x: Any) -> float | None:
    """The fraction of the rows of ``x`` (a tensor or numpy array) that ``guide`` was trained on (``None``: nothing
    known of its training, or of ``x``).

    Examples
    --------
    >>> fraction_seen_in_training(object.__new__(pyro_bbb.MeanFieldGuide), torch.zeros(2, 3)) is None
    True
    """
    try:
        seen = _seen.get(guide)
    except TypeError:
        return None
    rows = _as_rows(x)
    if seen is None or rows is None:
        return None
    return sum(fingerprint in seen for fingerprint in _fingerprints(rows)) / rows.shape[0]
