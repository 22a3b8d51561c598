"""What users naturally pass, normalised in one place: numpy arrays, float64 inputs, ``(N, 1)`` regression targets,
and inputs that are more than one tensor.

``fit``, ``predict``, the metrics and the ArviZ export all read their inputs through these helpers, so that a numpy
array works everywhere (or nowhere), a float64 input meets a float32 model as float32, and targets shaped like
torch's ``MSELoss`` convention (``(N, 1)`` for an ``(N, 1)`` output) mean what they mean.

**Inputs** ``x`` are a tensor, a tuple (or list) of tensors, or a mapping from names to tensors (a ``dict``, a
transformers ``BatchEncoding``), every tensor with the same first dimension: the data. :func:`map_inputs`,
:func:`num_rows`, :func:`select_rows` and :func:`split_rows` treat all three alike; :class:`pyro_bbb.BNN` calls
its net as ``net(x)``, ``net(*x)`` or ``net(**x)``.

Examples
--------
>>> import numpy as np
>>> as_tensor(np.zeros((2, 3)), "x").shape
torch.Size([2, 3])
>>> targets_like(torch.zeros(5, 1), torch.Size([5])).shape
torch.Size([5])
>>> x = {"input_ids": torch.zeros(4, 7, dtype=torch.long), "attention_mask": torch.ones(4, 7)}
>>> num_rows(x), select_rows(x, torch.tensor([0, 2]))["input_ids"].shape
(4, torch.Size([2, 7]))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import numpy as np
import torch

__all__ = [
    "Inputs", "as_tensor", "targets_like", "targets_of_shape", "model_dtype", "cast_inputs", "map_inputs",
    "input_tensors", "num_rows", "select_rows", "split_rows", "first_tensor", "inputs_to",
    "check_finite_inputs", "input_shapes", "class_labels",
]

#: What ``x`` may be: one tensor, a tuple/list of tensors, or a mapping from names to tensors.
Inputs: TypeAlias = torch.Tensor | tuple[torch.Tensor, ...] | list[torch.Tensor] | Mapping[str, torch.Tensor]


def map_inputs(fn: Callable[[Any], Any], x: Any) -> Any:
    """``fn`` applied to every tensor of ``x`` (a tensor, a tuple/list, or a mapping -- returned as a ``dict``).

    Examples
    --------
    >>> map_inputs(lambda t: t * 2, (torch.ones(2), torch.zeros(2)))
    (tensor([2., 2.]), tensor([0., 0.]))
    """
    if isinstance(x, Mapping):
        return {key: fn(value) for key, value in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # a namedtuple takes its fields as arguments
        return type(x)(*(fn(value) for value in x))
    if isinstance(x, tuple | list):
        return type(x)(fn(value) for value in x)
    return fn(x)


def input_tensors(x: Any, name: str = "x") -> dict[str, torch.Tensor]:
    """Every tensor of ``x`` by a readable name (``x``, ``x[0]``, ``x['input_ids']``); anything that is not a tensor
    or a numpy array is a ``TypeError`` naming it.

    Examples
    --------
    >>> list(input_tensors({"ids": torch.zeros(2), "mask": torch.ones(2)}))
    ["x['ids']", "x['mask']"]
    """
    if isinstance(x, Mapping):
        items = [(f"{name}[{key!r}]", value) for key, value in x.items()]
    elif isinstance(x, tuple | list):
        items = [(f"{name}[{i}]", value) for i, value in enumerate(x)]
    else:
        return {name: as_tensor(x, name)}
    if not items:
        raise ValueError(f"{name} is an empty {type(x).__name__}; it needs at least one tensor.")
    tensors = {}
    for label, value in items:
        if not isinstance(value, torch.Tensor | np.ndarray | np.generic):
            raise TypeError(
                f"{label} is a {type(value).__name__}; inputs must be a tensor, a tuple of tensors, or a dict of "
                "tensors (numpy arrays are converted)."
            )
        tensors[label] = as_tensor(value, label)
    return tensors


def num_rows(x: Any, name: str = "x") -> int:
    """The number of data in ``x``: the common first dimension of its tensors, or a ``ValueError`` naming them.

    Examples
    --------
    >>> num_rows((torch.zeros(3, 2), torch.zeros(4)))
    Traceback (most recent call last):
    ...
    ValueError: the tensors of x must share their first dimension (the data), got x[0]: (3, 2), x[1]: (4,).
    """
    if isinstance(x, torch.Tensor) and x.dim():  # the common case, on every training step
        return x.shape[0]
    tensors = input_tensors(x, name)
    if any(t.dim() == 0 for t in tensors.values()):
        raise ValueError(f"{name} needs a first dimension over the data; got {input_shapes(x, name)}.")
    rows = {t.shape[0] for t in tensors.values()}
    if len(rows) != 1:
        raise ValueError(
            f"the tensors of {name} must share their first dimension (the data), got {input_shapes(x, name)}."
        )
    return rows.pop()


def input_shapes(x: Any, name: str = "x") -> str:
    """The shape of every tensor of ``x``, for error messages: ``"x[0]: (3, 2), x[1]: (4,)"``.

    Examples
    --------
    >>> input_shapes({"ids": torch.zeros(2, 5)})
    "x['ids']: (2, 5)"
    """
    return ", ".join(f"{label}: {tuple(t.shape)}" for label, t in input_tensors(x, name).items())


def select_rows(x: Any, index: Any) -> Any:
    """The rows ``index`` (an index tensor, a slice) of every tensor of ``x``.

    Examples
    --------
    >>> select_rows((torch.arange(4), torch.arange(4) * 10), slice(1, 3))
    (tensor([1, 2]), tensor([10, 20]))
    """
    return map_inputs(lambda t: t[index], x)


def split_rows(x: Any, size: int) -> list[Any]:
    """``x`` in consecutive chunks of ``size`` rows (the last may be smaller), like ``Tensor.split``.

    Examples
    --------
    >>> [chunk["a"].tolist() for chunk in split_rows({"a": torch.arange(5)}, 2)]
    [[0, 1], [2, 3], [4]]
    """
    total = num_rows(x)
    return [select_rows(x, slice(start, start + size)) for start in range(0, total, size)]


def inputs_to(x: Any, device: torch.device | str | None) -> Any:
    """Every tensor of ``x`` moved to ``device`` (``None``: left where it is).

    Examples
    --------
    >>> inputs_to((torch.zeros(1),), "cpu")[0].device
    device(type='cpu')
    """
    return x if device is None else map_inputs(lambda t: t.to(device), x)


def check_finite_inputs(x: Any, what: str = "x") -> None:
    """A ``ValueError`` naming the tensor of ``x`` that holds NaN or infinite values, and how many.

    Examples
    --------
    >>> check_finite_inputs((torch.zeros(2), torch.tensor([1.0, float("nan")])), "the data")
    Traceback (most recent call last):
    ...
    ValueError: the data: x[1] contains 1 NaN or infinite value(s).
    """
    for name, tensor in input_tensors(x).items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            count = int((~torch.isfinite(tensor)).sum())
            raise ValueError(f"{what}: {name} contains {count} NaN or infinite value(s).")


def first_tensor(x: Any) -> torch.Tensor:
    """The first tensor of ``x`` (its device is the inputs' device).

    Examples
    --------
    >>> first_tensor({"ids": torch.zeros(2, dtype=torch.long)}).dtype
    torch.int64
    """
    return next(iter(input_tensors(x).values()))


def as_tensor(value: Any, name: str) -> torch.Tensor:
    """A tensor as it is, a numpy array (or numpy scalar) as a tensor; anything else is a ``TypeError`` naming it.

    Examples
    --------
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

    Examples
    --------
    >>> targets_like(torch.zeros(4, 1), (4,)).shape, targets_like(torch.zeros(4, 2), (4,)).shape
    (torch.Size([4]), torch.Size([4, 2]))
    """
    if tuple(y.shape) == (*shape, 1):
        return y.reshape(shape)
    return y


def targets_of_shape(y: Any, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
    """Targets for predictions of ``shape``: a tensor (numpy converted), ``(N, 1)`` read as ``(N,)``, or a
    ``ValueError`` naming both shapes.

    Examples
    --------
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


def class_labels(y: Any, rows: int, num_classes: int) -> torch.Tensor:
    """Class labels ``(rows,)`` as ``long`` from what a user has: integer, boolean or float labels (``(N,)`` or
    ``(N, 1)``) or one-hot rows ``(N, C)``; a ``ValueError`` naming the problem and the fix for anything else
    (probabilities as targets, fractional or out-of-range labels, another number of rows).

    Examples
    --------
    >>> class_labels(torch.tensor([[1.0], [0.0]]), 2, 2)
    tensor([1, 0])
    >>> class_labels(torch.tensor([[0, 0, 1], [0, 1, 0]]), 2, 3)   # one-hot
    tensor([2, 1])
    >>> class_labels(torch.tensor([0, 3]), 2, 3)
    Traceback (most recent call last):
    ...
    ValueError: class labels must lie in 0..2 for 3 classes, but y holds 3. Pass labels 0..C-1 (a Bernoulli's 0 or 1).
    """
    y = as_tensor(y, "y")
    if y.dim() == 2 and y.shape[1] == num_classes > 1 and y.shape[0] == rows:
        if not bool(((y == 0) | (y == 1)).all() and (y.sum(-1) == 1).all()):  # (booleans too)
            raise ValueError(
                f"y has shape {tuple(y.shape)}, one row per input and class, but its rows are not one-hot (a single "
                "1 in each): class probabilities or soft labels are not targets. Pass the labels (y.argmax(-1)) "
                "or one-hot rows."
            )
        return y.long().argmax(-1)
    y = targets_of_shape(y, (rows,))
    if y.is_floating_point() and not bool((y == y.round()).all()):
        raise ValueError(
            "y holds fractional values, but class labels are whole numbers 0..C-1; pass the labels (for "
            "probabilities of class 1, threshold them: (p > 0.5).long())."
        )
    y, classes = y.long(), max(num_classes, 2)
    if y.numel():
        low, high = int(y.min()), int(y.max())
        if low < 0 or high >= classes:
            raise ValueError(
                f"class labels must lie in 0..{classes - 1} for {classes} classes, but y holds "
                f"{low if low < 0 else high}. Pass labels 0..C-1 (a Bernoulli's 0 or 1)."
            )
    return y


def model_dtype(model: Any) -> torch.dtype | None:
    """The floating dtype of a model's first floating parameter or buffer (``None`` for a plain function).

    Examples
    --------
    >>> model_dtype(torch.nn.Linear(2, 1).double())
    torch.float64
    """
    if isinstance(model, torch.nn.Module):
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.is_floating_point():
                return tensor.dtype
    return None


def cast_inputs(x: Any, dtype: torch.dtype | None, name: str = "x") -> Inputs:
    """``x`` with every part a tensor (numpy converted); floating tensors in another floating dtype than the
    model's are cast to it (integer inputs stay integers: they may be token ids or labels). A tuple stays a tuple
    (a list a list), a mapping becomes a ``dict``.

    Examples
    --------
    >>> cast_inputs(np.zeros(3), torch.float32).dtype
    torch.float32
    >>> cast_inputs({"ids": np.zeros(2, dtype=np.int64)}, torch.float32)["ids"].dtype
    torch.int64
    """
    tensors = iter(input_tensors(x, name).values())  # converted and checked, in the order map_inputs visits

    def cast(_: Any) -> torch.Tensor:
        tensor = next(tensors)
        if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
            return tensor.to(dtype)
        return tensor

    return map_inputs(cast, x)
