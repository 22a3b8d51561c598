"""``History``: what ``fit`` saw, one record per epoch, and how much a trace still moves.

Examples
--------
>>> h = History()
>>> h.append({"epoch": 1, "loss": 2.0})
>>> h["loss"]
[2.0]
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..evaluate.plots import plot_history

__all__ = ["History"]


class History:
    """What :func:`fit` saw, one record per epoch, plus the loss of every step.

    Each record has ``epoch``, ``loss`` (negative ELBO, nats), ``loss_per_datum``, ``nll``, ``kl`` (unweighted),
    ``kl_weight`` (the weight of the epoch's last step: ``loss = nll + kl_weight * kl`` at a fixed weight; under a KL
    schedule each step's loss is at its own weight, so the epoch's mean differs), per-layer dicts ``kl_by_layer``,
    ``posterior_std``, ``prior_std`` (which a :class:`~pyro_bbb.priors.LearnedNormal` prior learns), ``std_ratio``
    (posterior std / prior std, mean per layer) and ``std_ratio_geomean`` (its geometric mean, which
    ``check_posterior`` judges collapse by), ``seconds``, and ``val_*`` metrics when validation data was given.
    ``history["kl"]`` is the list over epochs; ``history["kl_by_layer"]`` a dict of lists.

    Examples
    --------
    >>> h = History()
    >>> h.append({"epoch": 1, "loss": 3.0, "kl_by_layer": {"fc": 1.0}})
    >>> h.append({"epoch": 2, "loss": 2.0, "kl_by_layer": {"fc": 1.5}})
    >>> h["loss"], h["kl_by_layer"]
    ([3.0, 2.0], {'fc': [1.0, 1.5]})
    """

    def __init__(self):
        self.records: list[dict[str, Any]] = []
        self.step_loss: list[float] = []
        #: True when fit was stopped by Ctrl-C (after finishing the step it was in); the last record is then the
        #: partial epoch, marked ``"interrupted": True``.
        self.interrupted = False
        #: With ``fit(early_stopping=...)``: the epoch whose monitored value was best (whose parameters fit returned
        #: with, under ``restore_best=True``), and the epoch after which it stopped for want of improvement (``None``
        #: when it ran all epochs).
        self.best_epoch: int | None = None
        self.stopped_epoch: int | None = None
        #: The KL weight the posterior was trained at and how it was chosen (a
        #: :class:`~pyro_bbb.infer.tempering.KLWeightChoice`; with ``kl_weight="auto"``, every candidate's validation
        #: NLL).
        self.kl_weight_choice = None

    def append(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def __len__(self) -> int:
        return len(self.records)

    @property
    def last(self) -> dict[str, Any]:
        """The latest epoch's record."""
        if not self.records:
            raise IndexError("the history is empty: no epoch has finished yet.")
        return self.records[-1]

    def keys(self) -> list[str]:
        """Every key the records hold, in the order they first appear."""
        return list(dict.fromkeys(key for record in self.records for key in record))

    def __getitem__(self, key: str) -> list | dict[str, list]:
        if self.records and not any(key in record for record in self.records):
            raise KeyError(f"no epoch of this History has {key!r}; its keys are {self.keys()} (val_* metrics need "
                           "fit(validation_data=...); per-layer ones a guide with Normal posteriors).")
        values = [record.get(key) for record in self.records]
        if values and all(isinstance(v, dict) for v in values):
            names = dict.fromkeys(name for v in values for name in v)
            return {name: [v.get(name, math.nan) for v in values] for name in names}
        return values

    def drift(self, key: str = "loss", tail: float = 0.1) -> float | dict[str, float]:
        """How much a trace still moves at the end: the change of its mean over the last ``tail`` of the epochs
        (against the ``tail`` before), as a share of its change since the first ``tail``.

        A converged run has a drift near 0 (e.g. below 0.02); a trace still improving at a steady rate has about
        ``tail / (1 - tail)``. Unlike the last epoch against an earlier one, it is insensitive to epoch-to-epoch
        jitter and to a loss near zero. A per-layer key (``"std_ratio"``, ``"kl_by_layer"``) gives a dict by layer.
        NaN when there are fewer than three tails of epochs.

        Examples
        --------
        >>> h = History()
        >>> for e, loss in enumerate([10.0, 8.0, 7.0, 6.5, 6.2, 6.1, 6.05, 6.0, 6.0, 6.0], 1):
        ...     h.append({"epoch": e, "loss": loss, "std_ratio": {"fc": 1.0 / e}})
        >>> h.drift("loss"), round(h.drift("std_ratio")["fc"], 3)
        (0.0, 0.012)
        """
        if not 0 < tail < 1 / 3:
            raise ValueError(f"tail must be in (0, 1/3) (a fraction of the epochs), got {tail!r}.")
        values = self[key]
        if isinstance(values, dict):
            return {name: _drift(trace, tail) for name, trace in values.items()}
        return _drift(values, tail)

    def to_dict(self) -> dict[str, Any]:
        """Plain lists and dicts (JSON-serialisable)."""
        return {key: self[key] for key in self.keys()} | {
            "step_loss": list(self.step_loss), "interrupted": self.interrupted, "best_epoch": self.best_epoch,
            "stopped_epoch": self.stopped_epoch,
            "kl_weight_choice": None if self.kl_weight_choice is None else self.kl_weight_choice.to_dict()}

    def __repr__(self) -> str:
        if not self.records:
            return "History(epochs=0)"
        r = self.last
        choice = self.kl_weight_choice
        chosen = ""
        if getattr(choice, "chosen_by", None) == "validation":  # every candidate's validation NLL, as summary shows
            scores = ", ".join(f"{w:g}: {nll:.3g}" for w, nll in sorted(choice.validation_nll.items()))
            chosen = f" chosen by validation NLL ({scores})"
        best = ""  # (early stopping's best epoch: under a schedule, its weight is not the last epoch's)
        if self.best_epoch not in (None, len(self)):
            best = f", best epoch {self.best_epoch} at kl_weight={self.records[self.best_epoch - 1]['kl_weight']:.3g}"
        return (f"History(epochs={len(self)}, loss_per_datum={r['loss_per_datum']:.4g}, nll={r['nll']:.4g}, "
                f"kl={r['kl']:.4g}, kl_weight={r['kl_weight']:.3g}{chosen}{best})")

    def plot(self, path: str | Path | None = None):
        """Loss, KL per layer, KL weight and posterior/prior std per layer against the epoch (see
        :func:`pyro_bbb.evaluate.plots.plot_history`); saved when ``path`` is given. Returns the matplotlib figure."""
        return plot_history(self, path)


def _drift(values: list[float], tail: float) -> float:
    n = len(values)
    width = max(1, int(n * tail))
    if n < 3 * width:
        return math.nan
    first, before, last = (math.fsum(values[i : i + width]) / width for i in (0, n - 2 * width, n - width))
    progress, moved = abs(first - last), abs(before - last)
    if progress == 0:
        return 0.0 if moved == 0 else math.inf
    return moved / progress
