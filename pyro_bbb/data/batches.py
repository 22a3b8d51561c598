"""The training data of ``fit``: checked ``(x, y)`` pairs, an epoch's minibatches from tensors or a DataLoader.

Examples
--------
>>> batches = Batches((torch.randn(10, 2), torch.randn(10)), batch_size=4, likelihood=None, device=None)
>>> batches.num_data, [len(y) for _, y in batches]
(10, [4, 4, 2])
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import default_collate

from .._inputs import (
    Inputs,
    as_tensor,
    cast_inputs,
    check_finite_inputs,
    input_shapes,
    inputs_to,
    num_rows,
    select_rows,
)
from .._rng import rng_untouched
from .._warnings import warn_at_caller

__all__ = ["DataError", "Batches", "check_batch", "loader_rows", "loader_batches", "model_device", "likelihood_of"]


class DataError(ValueError):
    """A batch that ``fit`` read during training was invalid (NaN, a bad label, not an ``(x, y)`` pair); the
    parameters were restored to their state at the start of ``fit``.

    Examples
    --------
    >>> issubclass(DataError, ValueError)
    True
    """


def check_batch(x: Any, y: Any, likelihood, what: str = "the data",
                 dtype: torch.dtype | None = None) -> tuple[Inputs, torch.Tensor]:
    """``(x, y)`` as tensors (numpy arrays converted, floating ``x`` cast to the model's ``dtype``), checked; ``x``
    may be a tuple or dict of tensors with a common first dimension."""
    try:
        x, y = cast_inputs(x, dtype), as_tensor(y, "y")
    except TypeError as error:
        raise TypeError(
            f"{what} must be a pair (x, y) of tensors or numpy arrays (x may be a tuple or dict of tensors), got "
            f"({type(x).__name__}, {type(y).__name__}): {error}"
        ) from None
    try:
        rows = num_rows(x)
    except ValueError as error:
        raise ValueError(f"{what}: {error}") from None
    if rows == 0:
        raise ValueError(f"{what} is empty ({input_shapes(x)}); fit needs at least one datum.")
    if y.dim() == 0 or y.shape[0] != rows:
        raise ValueError(
            f"{what}: x has {rows} rows but y has shape {tuple(y.shape)}; x and y need the same number of rows."
        )
    check_finite_inputs(x, what)
    if likelihood is not None:
        y = likelihood.check_targets(y)
    elif y.is_floating_point() and not bool(torch.isfinite(y).all()):
        raise ValueError(f"{what}: y contains NaN or infinite values.")
    return x, y


def _sampler(loader: torch.utils.data.DataLoader):
    """The sampler that picks the loader's data: inside its batch sampler, when it has one, and inside a
    ``BatchSampler`` given as the sampler (``batch_size=None``, each index a batch); ``None`` for a batch sampler of
    the user's own that keeps none (the dataset's size is then N)."""
    sampler = loader.sampler if loader.batch_sampler is None else getattr(loader.batch_sampler, "sampler", None)
    while isinstance(sampler, torch.utils.data.BatchSampler):
        sampler = sampler.sampler
    return sampler


#: torch's samplers of single indices (a loader without batching reads one row per index from them)
_INDEX_SAMPLERS = (torch.utils.data.SequentialSampler, torch.utils.data.RandomSampler,
                   torch.utils.data.SubsetRandomSampler, torch.utils.data.WeightedRandomSampler,
                   torch.utils.data.DistributedSampler)


def _first_index(sampler):
    """The first thing a sampler of one's own yields (an index, or a list of them), drawing nothing from the caller's
    random numbers; ``None`` for an empty one, or for a one-pass iterator (peeking would lose what it yields)."""
    if sampler is None or isinstance(sampler, Iterator):
        return None
    with rng_untouched():  # (torch's, numpy's and Python's: a sampler may draw with any of them)
        return next(iter(sampler), None)


def _unbatched_reads(loader: torch.utils.data.DataLoader) -> str | None:
    """What each index of a loader without batching (``batch_size=None``) over a map-style dataset reads: ``"rows"``
    through one of torch's index samplers or a sampler of one's own whose first item is a single index, ``"batches"``
    through a sampler of one's own that yields lists (numpy arrays, ranges) of indices; ``None`` otherwise (batching,
    an iterable dataset, which may yield batches itself, or a ``BatchSampler`` given as the sampler)."""
    if (loader.batch_size is not None or loader.batch_sampler is not None
            or isinstance(loader.dataset, torch.utils.data.IterableDataset)
            or isinstance(loader.sampler, torch.utils.data.BatchSampler)):
        return None
    if isinstance(loader.sampler, _INDEX_SAMPLERS):
        return "rows"
    first = _first_index(loader.sampler)
    dims = getattr(first, "ndim", None)  # (a tensor's or a numpy array's)
    if isinstance(first, numbers.Integral) or dims == 0:  # (numpy's integers too)
        return "rows"
    if (isinstance(first, Sequence) and not isinstance(first, str)) or dims == 1:  # a list, tuple or range of them
        return "batches"
    return None


def _own_index_batches(loader: torch.utils.data.DataLoader, reads: str | None):
    """The batches of indices a sampler of one's own picks for the loader: its ``batch_sampler`` when that keeps no
    sampler inside, or a sampler yielding lists of indices to a loader without batching (``reads``, what
    :func:`_unbatched_reads` says); ``None`` for torch's samplers."""
    if reads == "batches":
        return loader.sampler
    if loader.batch_sampler is not None and _sampler(loader) is None:
        return loader.batch_sampler
    return None


def _num_data(loader: torch.utils.data.DataLoader, reads: str | None) -> int:
    """N: the number of data one epoch of the loader draws from -- its sampler's, so that a ``SubsetRandomSampler``
    over part of the dataset counts only that part; a ``DistributedSampler`` counts its dataset, every rank's data
    (not the rows it pads its ranks' shares with, nor those ``drop_last`` cuts); a
    ``RandomSampler`` or ``WeightedRandomSampler`` with its own ``num_samples`` (the draws per epoch, not the data)
    counts the rows it draws from (those of positive weight); a sampler of one's own that yields lists of indices to a
    loader without batching (its len() counts batches), or a ``batch_sampler`` of one's own, counts the dataset (a
    warning after its first epoch says when it drew fewer rows; ``reads``: what :func:`_unbatched_reads` says of the
    loader)."""
    sampler = None if _own_index_batches(loader, reads) is not None else _sampler(loader)
    if isinstance(sampler, torch.utils.data.DistributedSampler):  # (not total_size: padded, or cut by drop_last)
        return len(sampler.dataset)
    if isinstance(sampler, torch.utils.data.RandomSampler):
        return len(sampler.data_source)
    if isinstance(sampler, torch.utils.data.WeightedRandomSampler):
        return int((torch.as_tensor(sampler.weights) > 0).sum())
    for source in (sampler, loader.dataset):
        try:
            return len(source)
        except TypeError:
            continue
    raise ValueError(
        "fit takes the training-set size N from the DataLoader's sampler or dataset, neither of which has a len(); "
        "use a sized dataset (e.g. TensorDataset), or give your IterableDataset a __len__ that returns the number "
        "of rows (data) one pass yields, not of batches: the ELBO weighs each batch's likelihood by N / its rows."
    )


def _tensor_rows(loader: torch.utils.data.DataLoader) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The ``(x, y)`` rows of a DataLoader over a ``TensorDataset`` of two tensors (or a ``Subset`` of one), narrowed
    to a ``SubsetRandomSampler``'s indices; ``None`` for any other dataset."""
    dataset, indices = loader.dataset, None
    if isinstance(dataset, torch.utils.data.Subset):
        dataset, indices = dataset.dataset, torch.as_tensor(list(dataset.indices), dtype=torch.long)
    if not isinstance(dataset, torch.utils.data.TensorDataset) or len(dataset.tensors) != 2:
        return None
    sampler = _sampler(loader)
    if isinstance(sampler, torch.utils.data.SubsetRandomSampler):
        chosen = torch.as_tensor(list(sampler.indices), dtype=torch.long)
        indices = chosen if indices is None else indices[chosen]
    x, y = dataset.tensors
    return (x, y) if indices is None else (x[indices], y[indices])


def loader_rows(loader: torch.utils.data.DataLoader) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The ``(x, y)`` rows one epoch of ``loader`` draws, each once, when they can be read without iterating it: a
    ``TensorDataset`` of two tensors (or a ``Subset`` of one), read in order, shuffled or through a
    ``SubsetRandomSampler``, in batches of a ``batch_size`` put together by the default ``collate_fn``; ``None``
    otherwise (another dataset, a weighted or custom sampler, a batch sampler, a ``collate_fn`` of its own, which may
    change the rows). ``fit(kl_weight="auto")`` carves its validation split from these rows.

    Examples
    --------
    >>> from torch.utils.data import DataLoader, TensorDataset
    >>> x, y = torch.randn(10, 2), torch.randn(10)
    >>> loader_rows(DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True))[1].shape
    torch.Size([10])
    """
    uniform = (torch.utils.data.RandomSampler, torch.utils.data.SequentialSampler, torch.utils.data.SubsetRandomSampler)
    sampler = _sampler(loader)
    if loader.batch_size is None or type(sampler) not in uniform or loader.collate_fn is not default_collate:
        return None
    if isinstance(sampler, torch.utils.data.RandomSampler) and (
            sampler.replacement or sampler.num_samples != len(sampler.data_source)):
        return None  # draws with replacement or another number of rows: not each row once
    return _tensor_rows(loader)


def _check_loader_upfront(loader: torch.utils.data.DataLoader, likelihood) -> None:
    """Check every datum a DataLoader over a ``TensorDataset`` (or a ``Subset`` of one) will yield, before training;
    other datasets are checked batch by batch (and ``fit`` restores the parameters on a bad batch)."""
    rows = _tensor_rows(loader)
    if rows is not None:
        check_batch(*rows, likelihood, what="the DataLoader's data")


def _check_loader_batches(loader: torch.utils.data.DataLoader, num_data: int, reads: str | None) -> None:
    """A loader that yields no batch at all (a whole epoch without a step), or single rows, is an error naming the
    fix (``reads``: what :func:`_unbatched_reads` says of the loader)."""
    if reads == "rows":
        own = not isinstance(loader.sampler, _INDEX_SAMPLERS)
        fix = f"DataLoader(dataset, batch_size=..., {'sampler=your_sampler' if own else 'shuffle=True'})"
        raise ValueError(
            "fit trains on batches of rows; this DataLoader (batch_size=None) reads its dataset one index at a time, "
            f"which yields single rows, whose features would be read as rows. Pass {fix}. (A dataset whose items are "
            "whole batches would have its batches counted as the training set's size N: serve them from an "
            "IterableDataset whose len() is its number of rows.)")
    try:
        empty = len(loader) == 0
    except TypeError:  # (an iterable dataset: its batches are counted as they come)
        return
    if not empty:
        return
    try:  # the rows one epoch of this loader draws (one rank's share under a DistributedSampler), not N
        rows = len(_sampler(loader))
    except TypeError:
        rows = num_data
    if loader.drop_last:
        raise ValueError(f"the DataLoader yields no batch: drop_last=True drops the only, partial batch of the "
                         f"{rows} rows it draws an epoch (batch_size={loader.batch_size}); use a smaller batch_size "
                         "or drop_last=False.")
    raise ValueError(f"the DataLoader yields no batch from the {rows} rows it draws an epoch (its batch sampler is "
                     "empty).")


class Batches:
    """An epoch's minibatches from an ``(x, y)`` pair (reshuffled every epoch) or from a DataLoader (``distributed``:
    one process's loader in a distributed fit)."""

    def __init__(self, data, batch_size: int | None, likelihood, device, dtype: torch.dtype | None = None,
                 distributed: bool = False):
        self.likelihood, self.device, self.dtype = likelihood, device, dtype
        if isinstance(data, torch.utils.data.DataLoader):
            if batch_size is not None:
                raise ValueError("pass batch_size to the DataLoader, not to fit, when data is a DataLoader.")
            reads = _unbatched_reads(data)  # (once: a sampler of one's own is peeked at)
            self.loader, self.num_data = data, _num_data(data, reads)
            if self.num_data == 0:
                raise ValueError("the DataLoader's dataset is empty; fit needs at least one datum.")
            _check_loader_batches(data, self.num_data, reads)
            # (N is its dataset's: checked below, but in a distributed fit, where each process draws its share)
            self._own_batches = not distributed and _own_index_batches(data, reads) is not None
            _check_loader_upfront(data, likelihood)
        elif isinstance(data, Sequence) and len(data) == 2:
            x, y = data
            self.x, self.y = check_batch(x, y, likelihood, dtype=dtype)
            self.loader, self.num_data = None, num_rows(self.x)
            self.batch_size = batch_size or self.num_data
        else:
            raise TypeError(f"data must be an (x, y) pair of tensors or a DataLoader, got {_what(data)}"
                            + _pair_hint(data))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.loader is None:
            for idx in torch.randperm(self.num_data).split(self.batch_size):
                yield inputs_to(select_rows(self.x, idx), self.device), self.y[idx].to(self.device)
            return
        rows, largest = 0, 0
        for number, batch in enumerate(self.loader, 1):
            if not isinstance(batch, Sequence) or len(batch) != 2:
                raise DataError(f"the DataLoader must yield (x, y) pairs; batch {number} is {_what(batch)}"
                                + _pair_hint(batch))
            try:
                x, y = check_batch(*batch, self.likelihood, what=f"DataLoader batch {number}", dtype=self.dtype)
            except (ValueError, TypeError) as error:
                raise DataError(str(error)) from error
            rows, largest = rows + len(y), max(largest, len(y))
            yield inputs_to(x, self.device), y.to(self.device)
        if self._own_batches:
            self._own_batches = False  # (said once)
            _warn_if_own_batches_draw_part(self.num_data, rows, largest)


def _warn_if_own_batches_draw_part(num_data: int, rows: int, largest: int) -> None:
    """A batch sampler of one's own whose epoch drew more than a batch fewer rows than the dataset holds (N, read
    from the dataset: nothing says which rows the sampler draws from without drawing an epoch) is said, with the
    fix: training indices of a dataset shared with a validation split would have their likelihood weighed
    ``N / rows`` times too much against the KL."""
    if num_data - rows <= largest:  # (every row, but for a dropped last batch)
        return
    warn_at_caller(
        f"N = {num_data}, the DataLoader's dataset's size, weighs the likelihood against the KL, but its batch "
        f"sampler of your own drew {rows} rows in an epoch. If it draws from part of the dataset (e.g. the training "
        f"indices of a dataset shared with a validation split), the likelihood is weighed {num_data / rows:.3g} "
        "times too much: give the DataLoader torch.utils.data.Subset(dataset, indices), or "
        "sampler=SubsetRandomSampler(indices) with batch_size=..., whose rows are N. If each epoch draws a sample "
        "of the whole dataset, N is right."
    )


def loader_batches(loader: torch.utils.data.DataLoader, caller: str = "predict") -> list[Any]:
    """The inputs of every batch a DataLoader yields, in its order: its batches are ``(x, y)`` pairs (as
    :func:`pyro_bbb.fit` takes them; ``y`` is not read) or inputs alone (a tensor, a dict). A loader that does not
    read its dataset in order (shuffle=True, a random, weighted or own sampler) is refused, naming ``caller``: its
    rows would come in an order nothing else has. The caller's random stream is left as it was.

    Examples
    --------
    >>> data = torch.utils.data.TensorDataset(torch.arange(5.0)[:, None], torch.zeros(5))
    >>> [x.flatten().tolist() for x in loader_batches(torch.utils.data.DataLoader(data, batch_size=2))]
    [[0.0, 1.0], [2.0, 3.0], [4.0]]
    """
    sampler = _sampler(loader)
    if not isinstance(loader.dataset, torch.utils.data.IterableDataset) and not isinstance(
            sampler, torch.utils.data.SequentialSampler):
        what = "its own batch_sampler" if sampler is None else f"a {type(sampler).__name__}"
        raise ValueError(
            f"{caller} reads a DataLoader's inputs in the dataset's order and returns one prediction per row in that "
            f"order; this loader draws its rows with {what} (shuffle=True, a random, weighted or own sampler), so "
            "the predictions would line up with nothing you hold. Pass DataLoader(dataset, batch_size=..., "
            "shuffle=False) (for a sampler of your own whose order you know, pass the inputs in that order)."
        )
    if _unbatched_reads(loader) == "rows":
        raise ValueError(f"{caller} needs batches of rows; this DataLoader (batch_size=None) yields single rows. Pass "
                         "DataLoader(dataset, batch_size=...).")
    if loader.drop_last:
        raise ValueError(f"{caller} returns one prediction per row; this DataLoader drops its last, partial batch "
                         "(drop_last=True). Pass DataLoader(dataset, batch_size=..., drop_last=False).")
    with rng_untouched(torch_only=True):  # (an iterator draws its workers' seed: the caller's draws stay theirs)
        batches = [batch[0] if isinstance(batch, tuple | list) and len(batch) == 2 else batch for batch in loader]
    if not batches:
        raise ValueError(f"{caller} got a DataLoader that yields no batches (its dataset is empty).")
    return batches


def _what(data) -> str:
    """What ``data`` is, in a few words: its type, and its length for a tuple or list."""
    if isinstance(data, tuple | list):
        return f"a {type(data).__name__} of {len(data)}"
    return type(data).__name__


def _pair_hint(data) -> str:
    """How to make ``data`` an ``(x, y)`` pair, for the kinds users pass."""
    if isinstance(data, tuple | list) and len(data) > 2:
        return (f". Several inputs go in one tuple, the targets last: ((x1, ..., x{len(data) - 1}), y) (a DataLoader's "
                "collate_fn can return that).")
    if isinstance(data, Mapping):
        return ". A dict of inputs goes in a pair with the targets: (inputs, y) (a collate_fn can return it)."
    if isinstance(data, torch.utils.data.Dataset):
        return ". Wrap a Dataset in a DataLoader: DataLoader(dataset, batch_size=64, shuffle=True)."
    if hasattr(data, "to_numpy"):
        return ". Pass tensors (or numpy arrays): (frame[features].to_numpy(), frame[target].to_numpy())."
    return "."


def model_device(model) -> torch.device | None:
    if isinstance(model, torch.nn.Module):
        for tensor in (*model.buffers(), *model.parameters()):
            return tensor.device
    return None


def likelihood_of(model):
    likelihood = getattr(model, "likelihood", None)
    return likelihood if hasattr(likelihood, "check_targets") else None
