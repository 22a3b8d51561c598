"""Which inputs a guide was trained on: ``fit`` records a fingerprint of every training row, and a method that must
not see the training data (post-hoc temperature scaling fits on held-out data) asks whether given rows are among
them.

Only tensor (or numpy) inputs are fingerprinted, and those of a DataLoader whose rows can be read
(:func:`~pyro_bbb.data.batches.loader_rows`); other DataLoaders, and a tuple or dict of inputs, are not: nothing is
known about them. A fingerprint is a hash of a row's bytes in float32 (a floating row; an integer row in int64),
so equal rows match whatever holds them: a numpy array, a float64 copy of rows ``fit`` cast to the model's float32.
The hash is the same in every process (BLAKE2b, 8 bytes), so ``pyro_bbb.save(..., training_rows=True)`` can keep
the fingerprints with the posterior (:func:`training_fingerprints`) and :func:`pyro_bbb.load` give them back
(:func:`restore_training_fingerprints`).

Examples
--------
>>> guide, x = object.__new__(pyro_bbb.MeanFieldGuide), torch.arange(6.0).reshape(3, 2)
>>> remember_training_inputs(guide, x)
>>> fraction_seen_in_training(guide, x[1:]), fraction_seen_in_training(guide, torch.cat([x[:1], x[:1] + 10]))
(1.0, 0.5)
"""

from __future__ import annotations

import hashlib
import weakref
from typing import Any

import numpy as np
import torch

__all__ = ["remember_training_inputs", "fraction_seen_in_training", "training_fingerprints",
           "restore_training_fingerprints", "records_holder"]

_seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def records_holder(guide: Any) -> Any:
    """The guide whose records speak for ``guide`` -- the rows it was trained on (here) and the KL weight it was
    trained at (:mod:`pyro_bbb.infer.tempering`): the guide a view of one wraps (its ``records_of``, e.g. a
    :class:`~pyro_bbb.evaluate.pruning.PrunedGuide`'s), else ``guide`` itself.

    Examples
    --------
    >>> guide = object.__new__(pyro_bbb.MeanFieldGuide)
    >>> class View:
    ...     records_of = guide
    >>> records_holder(guide) is guide, records_holder(View()) is guide
    (True, True)
    """
    return getattr(guide, "records_of", guide)


def _as_rows(x: Any) -> list[torch.Tensor] | None:
    """``x`` as the parts of its rows -- one tensor, or each tensor of a tuple or dict of inputs (a dict's in the
    order of its keys), all with the same first dimension -- in the dtype fingerprints are taken in (``None``:
    anything else)."""
    if isinstance(x, dict):
        x = [x[key] for key in sorted(x, key=str)]
    parts = list(x) if isinstance(x, tuple | list) else [x]
    rows = [_as_part(part) for part in parts]
    if not rows or any(part is None for part in rows) or len({part.shape[0] for part in rows}) > 1:
        return None
    return rows


def _as_part(x: Any) -> torch.Tensor | None:
    """One tensor (or numpy array) of rows in the dtype fingerprints are taken in (``None``: not one)."""
    if isinstance(x, np.ndarray) and x.dtype.kind in "biuf":
        x = torch.from_numpy(np.ascontiguousarray(x))
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or not x.shape[0]:
        return None
    canonical = torch.float32 if x.is_floating_point() else torch.int64 if not x.is_complex() else x.dtype
    rows = x.detach().to("cpu", canonical)
    return rows + 0 if rows.is_floating_point() or rows.is_complex() else rows  # (-0.0 + 0 is 0.0: equal rows alike)


def _fingerprints(parts: list[torch.Tensor]) -> list[int]:
    """One hash per row of the parts (from :func:`_as_rows`), of its bytes in every part: a signed 64-bit number,
    the same in every process (Python's own ``hash`` of bytes is salted per process)."""
    arrays = [part.contiguous().reshape(part.shape[0], -1).numpy() for part in parts]
    return [int.from_bytes(hashlib.blake2b(b"".join(array[i].tobytes() for array in arrays), digest_size=8).digest(),
                           "little", signed=True) for i in range(arrays[0].shape[0])]


def _seen_by(guide: Any) -> set[int] | None:
    """The fingerprints recorded for ``guide`` (``None``: none, or a guide that cannot be weakly referenced)."""
    guide = records_holder(guide)
    try:
        return _seen.get(guide)
    except TypeError:
        return None


def remember_training_inputs(guide: Any, x: Any) -> None:
    """Record the rows of ``x`` (a tensor or numpy array, or a tuple or dict of them; anything else is not recorded)
    as training inputs of ``guide``, besides those of earlier fits.

    Examples
    --------
    See the module example.
    """
    guide = records_holder(guide)
    rows = _as_rows(x)
    if rows is not None:
        try:
            _seen.setdefault(guide, set()).update(_fingerprints(rows))
        except TypeError:  # a guide that cannot be weakly referenced is not recorded
            pass


def fraction_seen_in_training(guide: Any, x: Any) -> float | None:
    """The fraction of the rows of ``x`` (a tensor or numpy array, or a tuple or dict of them) that ``guide`` was
    trained on (``None``: nothing known of its training, or of ``x``).

    Examples
    --------
    >>> fraction_seen_in_training(object.__new__(pyro_bbb.MeanFieldGuide), torch.zeros(2, 3)) is None
    True
    """
    seen = _seen_by(guide)
    rows = _as_rows(x)
    if seen is None or rows is None:
        return None
    return sum(fingerprint in seen for fingerprint in _fingerprints(rows)) / rows[0].shape[0]


def training_fingerprints(guide: Any) -> torch.Tensor | None:
    """The fingerprints of the rows ``guide`` was trained on, sorted, as an ``int64`` tensor (``None``: nothing
    known), for a checkpoint read with ``weights_only=True``.

    Examples
    --------
    >>> guide = object.__new__(pyro_bbb.MeanFieldGuide)
    >>> remember_training_inputs(guide, torch.zeros(3, 2))  # three equal rows: one fingerprint
    >>> training_fingerprints(guide).shape
    torch.Size([1])
    """
    seen = _seen_by(guide)
    return None if seen is None else torch.tensor(sorted(seen), dtype=torch.int64)


def restore_training_fingerprints(guide: Any, fingerprints: torch.Tensor | None) -> None:
    """Make ``fingerprints`` (from :func:`training_fingerprints`) the rows ``guide`` was trained on, in place of
    any it had; ``None`` forgets them (a checkpoint that holds none).

    Examples
    --------
    >>> guide, x = object.__new__(pyro_bbb.MeanFieldGuide), torch.arange(6.0).reshape(3, 2)
    >>> remember_training_inputs(guide, x)
    >>> other = object.__new__(pyro_bbb.MeanFieldGuide)
    >>> restore_training_fingerprints(other, training_fingerprints(guide))
    >>> fraction_seen_in_training(other, x)
    1.0
    """
    guide = records_holder(guide)
    try:
        if fingerprints is None:
            _seen.pop(guide, None)
        else:
            _seen[guide] = set(fingerprints.tolist())
    except TypeError:  # a guide that cannot be weakly referenced is not recorded
        pass
