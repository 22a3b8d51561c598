"""What users naturally pass, normalised in one place: numpy arrays, float64 inputs, ``(N, 1)`` regression targets.

``fit``, ``predict``, the metrics and the ArviZ export all read their inputs through these helpers, so that a numpy
array works everywhere (or nowhere), a float64 input meets a float32 model as float32, and targets shaped like
torch's ``MSELoss`` convention (``(N, 1)`` for an ``(N, 1)`` output) mean what they mean.

Example
-------
>>> import numpy as np
>>> as_tensor(np.zeros((2, 3)), "x").shape
torch.Size([2, 3])
>>> targets_like(torch.zeros(5, 1), torch.Size([5])).shape
torch.Size([5])
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["as_tensor", "targets_like", "targets_of_shape", "model_dtype", "cast_inputs"]


def as_tensor(value: Any, name: str) -> torch.Tensor:
    """A tensor as it is, a numpy array (or numpy scalar) as a tensor; anything else is a ``TypeError`` naming it.

    Example
    -------
    >>> as_tensor([1, 2], "x")
    Traceback (most recent call last):
    ...
    TypeError: x must be a torch.Tensor or a numpy array, got list.
    """
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray | np.generic):
        return torch.as_tensor(np.asarray(value))
    raise TypeError(f"{name} must be a torch.Tensor or a numpy array, got {type(value).__name__}.")


def targets_like(y: torch.Tensor, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
    """``y`` reshaped to ``shape`` when it only adds a trailing dimension of 1 (``(N, 1)`` targets for ``(N,)``
    predictions); otherwise unchanged, for the caller's own shape check.

    Example
    -------
    >>> targets_like(torch.zeros(4, 1), (4,)).shape, targets_like(torch.zeros(4, 2), (4,)).shape
    (torch.Size([4]), torch.Size([4, 2]))
    """
    if tuple(y.shape) == (*shape, 1):
        return y.reshape(shape)
    return y


def targets_of_shape(y: Any, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
    """Targets for predictions of ``shape``: a tensor (numpy converted), ``(N, 1)`` read as ``(N,)``, or a
    ``ValueError`` naming both shapes.

    Example
    -------
    >>> targets_of_shape(np.zeros((3, 1)), (3,)).shape
    torch.Size([3])
    >>> targets_of_shape(torch.zeros(4), (3,))
    Traceback (most recent call last):
    ...
    ValueError: the prediction covers 3 inputs and needs targets of shape (3,), but y has shape (4,).
    """
    shape = tuple(shape)
    y = targets_like(as_tensor(y, "y"), shape)
    if tuple(y.shape) != shape:
        raise ValueError(
            f"the prediction covers {shape[0]} inputs and needs targets of shape {shape}, but y has shape "
            f"{tuple(y.shape)}."
        )
    return y


def model_dtype(model: Any) -> torch.dtype | None:
    """The floating dtype of a model's first floating parameter or buffer (``None`` for a plain function).

    Example
    -------
    >>> model_dtype(torch.nn.Linear(2, 1).double())
    torch.float64
    """
    if isinstance(model, torch.nn.Module):
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.is_floating_point():
                return tensor.dtype
    return None


def cast_inputs(x: Any, dtype: torch.dtype | None, name: str = "x") -> torch.Tensor:
    """``x`` as a tensor; floating inputs in another floating dtype than the model's are cast to it (integer inputs
    stay integers: they may be token ids or labels).

    Example
    -------
    >>> cast_inputs(np.zeros(3), torch.float32).dtype
    torch.float32
    """
    x = as_tensor(x, name)
    if dtype is not None and x.is_floating_point() and x.dtype != dtype:
        return x.to(dtype)
    return x
