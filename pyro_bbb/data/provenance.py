"""Which inputs a guide was trained on: ``fit`` records a fingerprint of every training row, and a method that must
not see the training data (post-hoc temperature scaling fits on held-out data) asks whether given rows are among
them.

Only tensor inputs are fingerprinted, and those of a DataLoader whose rows can be read
(:func:`~pyro_bbb.data.batches.loader_rows`); other DataLoaders, and a tuple or dict of inputs, are not: nothing is
known about them. A fingerprint is the hash of a row's bytes, so equal rows match whatever tensor holds them.

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

import torch

__all__ = ["remember_training_inputs", "fraction_seen_in_training"]

_seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _fingerprints(x: torch.Tensor) -> list[int]:
    """One hash per row of ``x``, of its bytes."""
    rows = x.detach().to("cpu").contiguous().reshape(x.shape[0], -1).numpy()
    return [hash(row.tobytes()) for row in rows]


def remember_training_inputs(guide: Any, x: Any) -> None:
    """Record the rows of ``x`` (a tensor; anything else is not recorded) as training inputs of ``guide``, besides
    those of earlier fits.

    Examples
    --------
    See the module example.
    """
    if isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[0]:
        try:
            _seen.setdefault(guide, set()).update(_fingerprints(x))
        except TypeError:  # a guide that cannot be weakly referenced is not recorded
            pass


def fraction_seen_in_training(guide: Any, x: torch.Tensor) -> float | None:
    """The fraction of the rows of ``x`` that ``guide`` was trained on (``None``: nothing known of its training).

    Examples
    --------
    >>> fraction_seen_in_training(object.__new__(pyro_bbb.MeanFieldGuide), torch.zeros(2, 3)) is None
    True
    """
    try:
        seen = _seen.get(guide)
    except TypeError:
        return None
    if seen is None or not isinstance(x, torch.Tensor) or not x.shape[0]:
        return None
    return sum(fingerprint in seen for fingerprint in _fingerprints(x)) / x.shape[0]
