"""Weight draws folded into the batch: the network sees ordinary batches, whatever the number of draws.

Under a vectorized predictive or ``vectorize_particles=True`` every weight site carries S draws. Instead of sending
them through the network as extra leading dimensions (which ordinary torch code such as ``out[:, -1]``,
``x.view(x.size(0), -1)``, ``nn.Flatten()`` or ``nn.BatchNorm2d`` reads wrongly or rejects), :class:`pyro_bbb.BNN`
repeats the batch S times -- ``S * B`` rows, the block of rows ``s * B ... (s + 1) * B - 1`` belonging to draw ``s``
-- and runs the network inside :func:`fold_draws`. Each Bayesian layer then applies draw ``s`` to its own block of
rows (one batched product, no per-row weights are materialised), and the likelihood unfolds the output again.
Everything between the Bayesian layers sees a plain ``(S * B, ...)`` batch.

Examples
--------
>>> layer = BayesianLinear(3, 2)
>>> x = torch.randn(5, 3)
>>> with pyro.plate("draws", 4, dim=-2):                  # four weight draws
...     with fold_draws(4):
...         out = layer(x.repeat(4, 1))                    # (4 * 5, 3): the batch once per draw
>>> out.shape
torch.Size([20, 2])
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

__all__ = [
    "fold_draws", "folded_draws", "fold_rows", "unfold_rows", "draws_leading", "unfold_affine_input",
    "fold_affine_output", "batch_rows", "known_batch_rows", "example_draw_shape", "output_batch",
    "known_output_batch", "UnfoldableRowsError",
]


class UnfoldableRowsError(ValueError):
    """A Bayesian layer inside :func:`fold_draws` got rows that are not ``S`` equal blocks of the batch's rows (nor of
    a whole multiple of them): the network selected some of its rows -- an expert applied to ``x[mask]`` -- or made
    rows of its own, and which rows belong to which weight draw is lost (each draw may select a different number).
    The vectorized paths then run one draw at a time (:func:`pyro_bbb.predict`, :class:`pyro_bbb.ELBO`). Rows of
    the net's own in a whole multiple of the batch's (``torch.cat([x, x2])`` along the rows) or rows reordered are
    not seen: such a net must index its rows from the right, or run unvectorized.

    Examples
    --------
    >>> issubclass(UnfoldableRowsError, ValueError)
    True
    """


_FOLDED: ContextVar[int | None] = ContextVar("pyro_bbb_folded_draws", default=None)
_ROWS: ContextVar[int | None] = ContextVar("pyro_bbb_batch_rows", default=None)
_OUTPUT_BATCH: ContextVar[tuple[int, ...] | None] = ContextVar("pyro_bbb_output_batch", default=None)


@contextmanager
def output_batch(shape: tuple[int, ...] | None) -> Iterator[None]:
    """While a likelihood reads a network's output: the dimensions that output starts with, ``(*draw shape, rows)``
    (``None``: not known), so that an output with nothing after its rows -- ``(batch,)`` logits, which S weight
    draws make ``(S, batch)`` -- is told apart from ``(batch, 1)`` (:func:`known_output_batch`).

    Examples
    --------
    >>> with output_batch((4, 32)):
    ...     known_output_batch()
    (4, 32)
    """
    token = _OUTPUT_BATCH.set(None if shape is None else tuple(int(n) for n in shape))
    try:
        yield
    finally:
        _OUTPUT_BATCH.reset(token)


def known_output_batch() -> tuple[int, ...] | None:
    """The dimensions the output a likelihood reads here starts with (:func:`output_batch`), or ``None`` when not
    known (a likelihood called outside :class:`pyro_bbb.BNN`).

    Examples
    --------
    >>> known_output_batch() is None
    True
    """
    return _OUTPUT_BATCH.get()


@contextmanager
def batch_rows(rows: int | None) -> Iterator[None]:
    """Within the block the network runs on a batch of ``rows`` examples (per weight draw): what
    :func:`example_draw_shape` checks a layer's first dimension against (``None``: not known).

    Examples
    --------
    >>> with batch_rows(4):
    ...     example_draw_shape((4, 7, 3), 1, None)
    (torch.Size([4, 1]), torch.Size([4, 7]))
    """
    token = _ROWS.set(None if rows is None else int(rows))
    try:
        yield
    finally:
        _ROWS.reset(token)


def known_batch_rows() -> int | None:
    """The examples per weight draw the network runs on here (:func:`batch_rows`), or ``None`` when not known (a
    hand-written model outside :class:`pyro_bbb.BNN`).

    Examples
    --------
    >>> with batch_rows(32):
    ...     known_batch_rows()
    32
    >>> known_batch_rows() is None
    True
    """
    return _ROWS.get()


def example_draw_shape(input_shape: tuple[int, ...], feature_dims: int,
                       num_draws: int | None) -> tuple[torch.Size, torch.Size] | None:
    """Where an estimator's per-example draws (Flipout's signs) go for a layer input of ``input_shape`` (rows first,
    ``num_draws`` folded into them or ``None``): ``(examples, grid)``, draws of shape ``examples + features``
    expanded to ``grid + features`` and reshaped to the leading dimensions the layer passes on (``(S, B * P)``
    folded, ``(B, *positions)`` plain). One draw per row (and weight draw), shared by the row's positions -- tokens,
    time steps: the dimensions between the row and the features, which share the example's weights -- or one per
    weight draw for all rows when the first dimension is not the batch's rows (a net that reshaped or transposed
    them: one shared perturbation is exact, a wrong one per row is not), also when a position dimension is as long
    as the rows (``T == B``: the rows might be positions, which no check of the row count against the batch can tell
    -- :func:`batch_rows`'s or, in a hand-written model, the data plate's). ``None`` when each row is one example
    with no positions (every leading element its own example, as before).

    Examples
    --------
    >>> example_draw_shape((2, 8, 3), 1, None)                       # 2 examples of 8 tokens: a draw per example
    (torch.Size([2, 1]), torch.Size([2, 8]))
    >>> example_draw_shape((6, 8, 3), 1, 3)                          # 3 draws folded into 3 * 2 rows
    (torch.Size([3, 2, 1]), torch.Size([3, 2, 8]))
    >>> example_draw_shape((5, 3), 1, None) is None                  # one row per example
    True
    >>> example_draw_shape((8, 8, 3), 1, None)                       # (T, B) or (B, T) at T == B: one draw for all
    (torch.Size([1, 1]), torch.Size([8, 8]))
    """
    if len(input_shape) <= feature_dims:
        return None
    rows, positions = input_shape[0], input_shape[1 : len(input_shape) - feature_dims]
    draws = num_draws or 1
    expected = _ROWS.get()
    per_row = expected is None or rows == expected * draws
    if per_row and math.prod(positions) == 1:  # one row per example (a (B, 1, F) input too)
        return None
    if per_row and rows in positions:  # as many positions as rows, the batch known or not (a hand-written model):
        per_row = False  # (T, B, F) of a sequence-first net at T == B is not per row, and (B, B, F) might not be
    count = math.prod(positions)
    if num_draws is None:
        examples = (rows if per_row else 1,) + (1,) * len(positions)
        return torch.Size(examples), torch.Size((rows, *positions))
    return torch.Size((draws, rows // draws if per_row else 1, 1)), torch.Size((draws, rows // draws, count))


@contextmanager
def fold_draws(num_draws: int) -> Iterator[None]:
    """Within the block, Bayesian layers read the first dimension of their input as ``num_draws`` blocks of rows,
    block ``s`` belonging to weight draw ``s``.

    Examples
    --------
    >>> with fold_draws(8):
    ...     folded_draws()
    8
    >>> folded_draws() is None
    True
    """
    token = _FOLDED.set(int(num_draws))
    try:
        yield
    finally:
        _FOLDED.reset(token)


def folded_draws() -> int | None:
    """The number of draws folded into the batch here, or ``None`` outside :func:`fold_draws`.

    Examples
    --------
    >>> folded_draws() is None
    True
    """
    return _FOLDED.get()


def fold_rows(t: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """``(S, B, ...)`` -> ``(S * B, ...)`` (at ``dim``).

    Examples
    --------
    >>> fold_rows(torch.zeros(3, 4, 2)).shape
    torch.Size([12, 2])
    """
    return t.flatten(dim, dim + 1)


def unfold_rows(t: torch.Tensor, num_draws: int, dim: int = 0) -> torch.Tensor:
    """``(S * B, ...)`` -> ``(S, B, ...)`` (at ``dim``); a clear error when the rows are not a multiple of S, or,
    the batch's rows known (:func:`batch_rows`), of ``S`` times them (:class:`UnfoldableRowsError`).

    Examples
    --------
    >>> unfold_rows(torch.zeros(12, 2), 3).shape
    torch.Size([3, 4, 2])
    """
    rows, expected = t.shape[dim], _ROWS.get()
    if expected is not None and rows % (num_draws * expected):  # (a whole multiple: positions folded into the rows)
        raise UnfoldableRowsError(
            f"a Bayesian layer received {rows} rows along dimension {dim} while {num_draws} weight draws of the "
            f"batch's {expected} rows are folded into {num_draws * expected}: the network selected some of its rows "
            "(e.g. a mixture's expert applied to x[mask]) or made rows of its own, so its rows cannot be told apart "
            "by weight draw (each draw may select a different number). Run one draw at a time: "
            "pyro_bbb.predict(..., vectorize=False), pyro_bbb.ELBO(vectorize_particles=False)."
        )
    if rows % num_draws:
        raise ValueError(
            f"a Bayesian layer received {rows} rows along dimension {dim} while {num_draws} weight draws are folded "
            "into the batch; the network must keep the batch dimension first (and the time dimension of a "
            "recurrent layer where torch.nn puts it)."
        )
    return t.unflatten(dim, (num_draws, rows // num_draws))


def draws_leading(param: torch.Tensor | None, param_dims: int, num_draws: int) -> torch.Tensor | None:
    """A parameter's draws as ``(S, *param_shape)``; a parameter without draws (a point estimate, the same for every
    row) keeps its plain shape.

    Examples
    --------
    >>> draws_leading(torch.zeros(5, 1, 4, 3), 2, 5).shape, draws_leading(torch.zeros(4, 3), 2, 5).shape
    (torch.Size([5, 4, 3]), torch.Size([4, 3]))
    """
    if param is None or param.dim() <= param_dims:
        return param
    lead = param.shape[:-param_dims]
    count = math.prod(lead)
    if count == 1:
        return param.reshape(param.shape[-param_dims:])
    if count != num_draws:
        raise ValueError(
            f"a weight carries {count} draws (leading shape {tuple(lead)}) but {num_draws} are folded into the "
            "batch; every weight site must be drawn under the same sample plates."
        )
    return param.reshape((num_draws, *param.shape[-param_dims:]))


def unfold_affine_input(input: torch.Tensor, num_draws: int, feature_dims: int) -> torch.Tensor:
    """Folded rows ``(S * B, *mid, *features)`` as ``(S, B * mid, *features)``: the shape a batched affine map
    with weights ``(S, 1, *param)`` takes.

    Examples
    --------
    >>> unfold_affine_input(torch.zeros(6, 5, 3), 2, feature_dims=1).shape
    torch.Size([2, 15, 3])
    """
    if input.dim() <= feature_dims:
        raise ValueError(
            f"a Bayesian layer received an input of shape {tuple(input.shape)} without a batch dimension while "
            f"{num_draws} weight draws are folded into the batch."
        )
    unfold_rows(input, num_draws)  # the divisibility check, with its message
    return input.reshape((num_draws, -1, *input.shape[input.dim() - feature_dims :]))


def fold_affine_output(output: torch.Tensor, input: torch.Tensor, feature_dims: int) -> torch.Tensor:
    """The inverse of :func:`unfold_affine_input` for the output: ``(S, B * mid, *out)`` -> ``(S * B, *mid, *out)``.

    Examples
    --------
    >>> fold_affine_output(torch.zeros(2, 15, 4), torch.zeros(6, 5, 3), feature_dims=1).shape
    torch.Size([6, 5, 4])
    """
    mid = input.shape[1 : input.dim() - feature_dims]
    return output.reshape((input.shape[0], *mid, *output.shape[2:]))
