"""Choosing the KL weight from the data: a split carved from the training set, candidates compared by their
validation NLL, weight 1 (the Bayes posterior) kept whenever it predicts as well.

``fit(kl_weight="auto")`` (the default) runs :class:`SelectKLWeight`'s path: it holds out ``validation_fraction`` of
the training rows (stratified by class for a classifier), trains on the rest through the candidate weights from the
smallest to the largest, each warm-started from the one before for a share of the epochs, and scores each on the
held-out rows. It keeps the weight with the best NLL -- or weight 1 when its NLL is within one standard error of
the best (paired over the held-out rows) -- restores the parameters it had at that weight, and trains on *all* the
data at that weight for ``fit``'s epochs (the ``final_epochs`` share of them). Small weights first: the means are
learnt where the objective is nearly the likelihood (as a MAP warm start), and a larger weight then only widens the
posterior, which its KL does within a few epochs.

Examples
--------
>>> y = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
>>> train_rows, held_out = validation_split(y, 0.2, stratify=True, generator=torch.Generator().manual_seed(0))
>>> sorted(y[held_out].tolist()), len(train_rows)
([0, 1], 8)
>>> choose_weight({1.0: torch.tensor([-0.50, -0.52, -0.49]), 0.1: torch.tensor([-0.49, -0.51, -0.50])})[0]
1.0
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from numbers import Integral

import pyro
import torch

from .._checks import check_positive, is_number
from .step import OptimizerSnapshot

__all__ = ["SelectKLWeight", "DEFAULT_CANDIDATES", "validation_split", "validation_splits", "choose_weight",
           "every_parameter", "ParameterSnapshot"]

#: The candidate KL weights of ``fit(kl_weight="auto")``: the Bayes posterior and two tempered ones, a factor of 10
#: apart (VOGN and noisy K-FAC temper by 0.1-0.5; ``docs/concepts.md``). 0.001 was a candidate before the MAP warm
#: start; from that start, trained as long as ``fit``'s final run, it never had a lower validation NLL than 0.01 on
#: the development tasks and overfit the longest (digits MLP 0.055 against 0.037, mnist1d 1.50 against 1.49).
DEFAULT_CANDIDATES = (1.0, 0.1, 0.01)


@dataclass(frozen=True)
class SelectKLWeight:
    """How ``fit`` chooses the KL weight (``kl_weight="auto"`` is ``SelectKLWeight()``).

    Parameters
    ----------
    candidates : sequence of float
        Weights to compare, each in ``(0, 1]``; 1 (the Bayes posterior) is always one of them.
    validation_fraction : float
        Share of the training rows held out to score the candidates (stratified by class for a classifier).
    selection_epochs : float
        Share of ``fit``'s ``epochs`` spent on the path, split evenly among the candidates (at least one epoch
        each); ``fit`` then trains ``epochs`` more on all the data at the chosen weight.
    warm_start : float
        Share of ``fit``'s ``epochs`` spent first training the posterior means alone as a deterministic net (MAP, at
        the smallest candidate's prior weight; :mod:`pyro_bbb.train.warm_start`) on the training part of the split,
        before the path; ``0`` starts the path from the initial posterior. Needs a Normal posterior per site
        (``MeanFieldGuide``, ``AutoNormal``); skipped for other guides.
    min_warm_start_epochs : int
        The warm start's least length, capped at ``fit``'s ``epochs``: with the default share, a fit under 40 epochs
        (where a quarter is under 10) gets the warm start of a 40-epoch one. From a shorter start the path scores
        candidates that have not yet learnt, so the last (largest) weight, trained longest, looks best: digits MLP at
        ``epochs=10`` chose weight 1 on one seed of three (test NLL 0.34; median 0.097), where a 10-epoch start
        chooses 0.1 on all three (median 0.076); ``benchmarks/README.md``. 1 gives a plain share of the epochs.
    final_epochs : float
        Share of ``fit``'s ``epochs`` the final fit trains on all the data at the chosen weight, from the chosen
        candidate's parameters (at least one epoch). 1 (the default): ``epochs`` more after the path.
    folds : int
        Disjoint held-out splits, each ``validation_fraction`` of the rows (cross-fitting): the warm start and the
        path run once per split, each from the same start, and the candidates are compared on every held-out row
        together (``folds`` times the rows scored, ``folds`` times the path's cost; the final fit starts from the
        last split's run). 1 (the default): one split.

    Examples
    --------
    >>> SelectKLWeight(candidates=(0.1, 0.01)).candidates
    (1.0, 0.1, 0.01)
    """

    candidates: Sequence[float] = DEFAULT_CANDIDATES
    validation_fraction: float = 0.1
    selection_epochs: float = 0.5
    warm_start: float = 0.25
    folds: int = 1
    min_warm_start_epochs: int = 10
    final_epochs: float = 1.0

    def __post_init__(self):
        if isinstance(self.candidates, str | bytes) or not isinstance(self.candidates, Iterable):
            raise ValueError(f"candidates must be a sequence of KL weights in (0, 1] (1 is always added), e.g. "
                             f"(0.1, 0.01), got {self.candidates!r}.")
        weights = []
        for weight in self.candidates:
            if not is_number(weight) or not 0.0 < weight <= 1.0:
                raise ValueError(f"every candidate KL weight must be a number in (0, 1], got {weight!r}.")
            weights.append(float(weight))
        object.__setattr__(self, "candidates", tuple(sorted(set(weights) | {1.0}, reverse=True)))
        if len(self.candidates) == 1:
            raise ValueError("SelectKLWeight has no candidate but weight 1 (always one of them) to choose from: give "
                             "weights in (0, 1), e.g. candidates=(0.1, 0.01), or train the Bayes posterior with "
                             "fit(..., kl_weight=1) and no selection.")
        if not is_number(self.validation_fraction) or not 0.0 < self.validation_fraction < 0.5:
            raise ValueError(
                f"validation_fraction must be in (0, 0.5) (a share of the training rows), got "
                f"{self.validation_fraction!r}."
            )
        check_positive("selection_epochs", self.selection_epochs)
        check_positive("final_epochs", self.final_epochs)
        if not is_number(self.warm_start) or not 0.0 <= self.warm_start < math.inf:
            raise ValueError(f"warm_start must be a share of the epochs >= 0 (0: no warm start), got "
                             f"{self.warm_start!r}.")
        if isinstance(self.min_warm_start_epochs, bool) or not isinstance(self.min_warm_start_epochs, Integral) or (
                self.min_warm_start_epochs < 1):
            raise ValueError(f"min_warm_start_epochs must be a whole number >= 1, got {self.min_warm_start_epochs!r}.")
        if isinstance(self.folds, bool) or not isinstance(self.folds, Integral) or self.folds < 1 or (
                self.folds * self.validation_fraction >= 1.0):
            raise ValueError(f"folds must be a whole number >= 1 with folds * validation_fraction < 1 (disjoint "
                             f"held-out splits), got folds={self.folds!r} with validation_fraction="
                             f"{self.validation_fraction!r}.")
        object.__setattr__(self, "folds", int(self.folds))  # (numpy's integers too)
        object.__setattr__(self, "min_warm_start_epochs", int(self.min_warm_start_epochs))

    def warm_start_epochs(self, epochs: int) -> int:
        """Epochs of the MAP warm start before the path, for a ``fit`` of ``epochs`` (0 without one): the
        ``warm_start`` share of them, and at least ``min_warm_start_epochs`` (at most ``epochs``).

        Examples
        --------
        >>> SelectKLWeight().warm_start_epochs(100), SelectKLWeight().warm_start_epochs(20)
        (25, 10)
        >>> SelectKLWeight().warm_start_epochs(4), SelectKLWeight(warm_start=0).warm_start_epochs(100)
        (4, 0)
        """
        if self.warm_start == 0:
            return 0
        return max(round(epochs * self.warm_start), min(epochs, self.min_warm_start_epochs))

    def final_fit_epochs(self, epochs: int) -> int:
        """Epochs of the final fit on all the data at the chosen weight, for a ``fit`` of ``epochs``.

        Examples
        --------
        >>> SelectKLWeight().final_fit_epochs(100), SelectKLWeight(final_epochs=0.5).final_fit_epochs(100)
        (100, 50)
        """
        return max(1, round(epochs * self.final_epochs))

    def epochs_per_candidate(self, epochs: int) -> int:
        """Epochs of the path at each candidate, for a ``fit`` of ``epochs``.

        Examples
        --------
        >>> SelectKLWeight().epochs_per_candidate(100)
        17
        """
        return max(1, round(epochs * self.selection_epochs / len(self.candidates)))


def validation_split(y: torch.Tensor, fraction: float, *, stratify: bool,
                     generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Row indices ``(train, held_out)`` holding out ``round(fraction * n)`` rows; with ``stratify`` (integer labels,
    one per row), that share of every class, rounded by largest remainder so that every class of two or more rows is
    held out first (a class keeps at least one training row), so the held-out split has the training set's balance.

    Examples
    --------
    >>> train_rows, held_out = validation_split(torch.arange(10.0), 0.3, stratify=False,
    ...                                         generator=torch.Generator().manual_seed(0))
    >>> len(train_rows), len(held_out)
    (7, 3)
    """
    n = y.shape[0]
    if not stratify:
        order = torch.randperm(n, generator=generator)
        size = min(n - 1, max(1, round(fraction * n)))
        return order[size:].sort().values, order[:size].sort().values
    labels = y.reshape(n).long().cpu()
    classes = labels.unique()
    counts = torch.stack([(labels == label).sum() for label in classes]).double()
    quota = fraction * counts
    sizes = quota.floor().long()
    # the rest of round(fraction * n) by largest remainder, first to classes of 2 or more rows that would have none
    order = sorted(range(len(classes)), key=lambda c: (not (sizes[c] == 0 and counts[c] >= 2),
                                                       -float(quota[c] - sizes[c])))
    for c in order[: max(0, round(fraction * n) - int(sizes.sum()))]:
        sizes[c] += 1
    held = []
    for label, size, count in zip(classes, sizes.tolist(), counts.tolist()):
        rows = (labels == label).nonzero().flatten()
        rows = rows[torch.randperm(len(rows), generator=generator)]
        held.append(rows[: min(size, int(count) - 1)])  # a class keeps at least one training row
    held_out = torch.cat(held).sort().values
    keep = torch.ones(n, dtype=torch.bool)
    keep[held_out] = False
    return keep.nonzero().flatten(), held_out


def validation_splits(y: torch.Tensor, fraction: float, folds: int, *, stratify: bool,
                      generator: torch.Generator | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``folds`` splits ``(train, held_out)`` whose held-out rows are disjoint, each ``round(fraction * n)`` rows
    (each class's share with ``stratify``) and each ``train`` every other row; the first is
    :func:`validation_split`'s.

    Examples
    --------
    >>> splits = validation_splits(torch.arange(10.0), 0.2, 2, stratify=False,
    ...                            generator=torch.Generator().manual_seed(0))
    >>> [len(held) for _, held in splits], bool(set(splits[0][1].tolist()) & set(splits[1][1].tolist()))
    ([2, 2], False)
    """
    n = y.shape[0]
    rest = torch.arange(n)
    splits = []
    for _ in range(folds):
        share = min(1.0, fraction * n / len(rest))  # of the rows no earlier split held out
        _, held = validation_split(y[rest], share, stratify=stratify, generator=generator)
        held_out = rest[held]
        keep = torch.ones(n, dtype=torch.bool)
        keep[held_out] = False
        splits.append((keep.nonzero().flatten(), held_out))
        rest = rest[~torch.isin(rest, held_out)]
    return splits


def choose_weight(log_likelihoods: dict[float, torch.Tensor]) -> tuple[float, dict[float, float], dict[float, float]]:
    """The weight with the best validation NLL, except that weight 1 (the Bayes posterior) is kept whenever its NLL
    is within one standard error of the best's (the standard error of the mean per-row difference, paired over the
    held-out rows); with every weight's NLL and that standard error.

    ``log_likelihoods`` maps each weight to the log predictive density of every held-out row.

    Examples
    --------
    >>> weight, nll, se = choose_weight({1.0: torch.tensor([-0.9, -1.1]), 0.1: torch.tensor([-0.1, -0.2])})
    >>> weight, round(nll[1.0], 3), round(nll[0.1], 3)
    (0.1, 1.0, 0.15)
    """
    nll = {w: -float(ll.mean()) for w, ll in log_likelihoods.items()}
    nll = {w: math.inf if math.isnan(v) else v for w, v in nll.items()}  # a NaN score is never the best
    best = min(nll, key=nll.get)
    se = {}
    for weight, ll in log_likelihoods.items():
        difference = (log_likelihoods[best] - ll).double()
        se[weight] = float(difference.std() / math.sqrt(len(difference))) if len(difference) > 1 else 0.0
    if 1.0 in nll and nll[1.0] <= nll[best] + se[1.0]:
        return 1.0, nll, se
    return best, nll, se


def every_parameter(*modules) -> list[torch.Tensor]:
    """Every (unconstrained) parameter of ``modules`` and of Pyro's param store, once each (by identity): with Pyro's
    ``module_local_params`` a module's parameters live nowhere else, and a hand-written model's ``pyro.param`` lives
    only in the store.

    Examples
    --------
    >>> pyro.clear_param_store()
    >>> layer = torch.nn.Linear(2, 1)
    >>> p = pyro.param("p", torch.zeros(2))
    >>> len(every_parameter(layer)), len(every_parameter(layer, layer))
    (3, 3)
    """
    store = pyro.get_param_store()
    found = [*(param for module in modules if isinstance(module, torch.nn.Module) for param in module.parameters()),
             *(store[name].unconstrained() for name in store.keys())]
    return list({id(param): param for param in found}.values())


class ParameterSnapshot:
    """Every parameter of the modules and of Pyro's store (and the modules' buffers) as they are now, to put back
    later: the path keeps one per candidate, and ``fit`` restores the chosen one.

    Examples
    --------
    >>> pyro.clear_param_store()
    >>> p = pyro.param("p", torch.zeros(2))
    >>> snapshot = ParameterSnapshot()
    >>> with torch.no_grad():
    ...     _ = p.add_(1.0)
    >>> snapshot.restore()
    >>> pyro.param("p").tolist()
    [0.0, 0.0]
    """

    def __init__(self, *modules: torch.nn.Module, optimizer=None):
        self.params = [(param, param.detach().clone()) for param in every_parameter(*modules)]
        self.buffers = [(buffer, buffer.detach().clone()) for module in modules if isinstance(module, torch.nn.Module)
                        for buffer in module.buffers()]
        self.optimizer_state = OptimizerSnapshot(optimizer)

    @torch.no_grad()
    def restore(self) -> None:
        for param, value in self.params:
            param.copy_(value)
        for buffer, value in self.buffers:
            buffer.copy_(value)
        self.optimizer_state.restore()


def run_path(selection: SelectKLWeight, train_at: Callable[[float, int], None],
             score: Callable[[], torch.Tensor], snapshot: Callable[[], ParameterSnapshot],
             epochs: int, report: Callable[[float, float], None] | None = None):
    """The path on one split: for every candidate from the smallest to the largest, ``train_at(weight, epochs)``
    (warm-started from the one before), ``score()`` the held-out rows' log densities and keep a ``snapshot()``.
    Returns ``(log densities by weight, snapshot by weight)``; :func:`choose_weight` picks from the log densities (of
    every split together, with ``folds``).

    Examples
    --------
    >>> trained = []
    >>> scores, _ = run_path(SelectKLWeight(candidates=(0.1,)), lambda w, e: trained.append((w, e)),
    ...                      lambda: torch.tensor([-1.0, -1.0]), lambda: None, epochs=4)
    >>> choose_weight(scores)[0], trained
    (1.0, [(0.1, 1), (1.0, 1)])
    """
    per_candidate = selection.epochs_per_candidate(epochs)
    scores, snapshots = {}, {}
    for weight in sorted(selection.candidates):
        train_at(weight, per_candidate)
        scores[weight] = score()
        snapshots[weight] = snapshot()
        if report is not None:
            report(weight, -float(scores[weight].mean()))
    return {w: scores[w] for w in selection.candidates}, snapshots
