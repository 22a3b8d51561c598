"""The KL weight a posterior was trained at, and how it was chosen: every place that shows a posterior says so.

A KL weight ``lambda`` other than 1 makes ``fit`` find the best mean-field approximation of the *generalized* (or
tempered) posterior ``p_lambda(w | D) ∝ p(D | w)^(1 / lambda) p(w)``: the likelihood counts ``1 / lambda`` times
(``lambda < 1`` sharpens the posterior towards the data). ``fit`` records the weight on the guide as a
:class:`KLWeightChoice`, with every candidate's validation score when it chose the weight itself, and
:func:`pyro_bbb.summary`, :func:`~pyro_bbb.evaluate.diagnostics.check_posterior`, the ArviZ export,
:func:`pyro_bbb.evidence` and :func:`pyro_bbb.save` / :func:`~pyro_bbb.load` read it back from here. A guide
module trained on by another objective since its record (Pyro's ``Trace_ELBO`` in an ``SVI`` loop, seen by
:mod:`~pyro_bbb.infer.outside_training`) is read back as ``chosen_by="outside"``, weight 1 assumed.

Examples
--------
>>> choice = KLWeightChoice(kl_weight=0.01, chosen_by="validation", validation_nll={1.0: 0.31, 0.01: 0.04})
>>> choice.tempered, choice.describe()
(True, 'KL weight 0.01, chosen by validation NLL (1: 0.31, 0.01: 0.04): tempered')
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field, replace
from numbers import Real
from typing import Any

import torch

from ..data.provenance import records_holder
from .guide import is_point_estimate
from .outside_training import forget_outside_training, trained_outside, watch_guide

__all__ = ["KLWeightChoice", "record_kl_weight", "note_trained_weight", "kl_weight_of"]

_records: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: How a weight came to be (:attr:`KLWeightChoice.chosen_by`)
_HOW_CHOSEN = ("validation", "user", "fallback", "outside")


@dataclass(frozen=True)
class KLWeightChoice:
    """The KL weight a guide was trained at and how it came to be.

    Parameters
    ----------
    kl_weight : float
        The weight of the KL in the objective the posterior was trained on (a schedule's last weight).
    chosen_by : str
        ``"validation"`` (``fit`` compared candidates on a split carved from the training data), ``"user"`` (a
        number or schedule was passed), ``"fallback"`` (selection was asked for but could not run: ``reason`` says
        why, and the weight is 1, ``num_data / ess`` with :class:`~pyro_bbb.optim.IVON`, or the weight of the last
        fit of a guide that was already trained on the rows) or ``"outside"`` (the guide was trained since its
        record by an objective other than :class:`pyro_bbb.ELBO`, e.g. Pyro's ``Trace_ELBO``, which trains at weight
        1: the weight is assumed to be 1, and ``reason`` keeps the earlier record).
    validation_nll : dict, optional
        Candidate weight -> negative log predictive density per validation datum, when chosen by validation.
    validation_nll_se : dict, optional
        Candidate weight -> standard error of its NLL difference from the best candidate (paired over the rows).
    num_validation : int, optional
        Rows of the carved validation split.
    reason : str
        Why selection could not run, or (chosen by validation) why a later fit trained on at this weight instead of
        choosing again (empty otherwise).
    warm_start_epochs : int
        Epochs of the MAP warm start (the posterior means trained as a deterministic net) before the candidates were
        compared; 0 without one.
    point_estimate : bool
        The guide is a point estimate (``AutoDelta``, ``AutoLaplaceApproximation``, or a list of them: set by
        :func:`record_kl_weight`): its "KL" is the prior's negative log density, so the weight sets the prior's
        strength for a MAP estimate, not a posterior's temperature.

    Examples
    --------
    >>> KLWeightChoice(kl_weight=1.0).tempered
    False
    """

    kl_weight: float
    chosen_by: str = "user"
    validation_nll: dict[float, float] = field(default_factory=dict)
    validation_nll_se: dict[float, float] = field(default_factory=dict)
    num_validation: int | None = None
    reason: str = ""
    warm_start_epochs: int = 0
    point_estimate: bool = False

    def __post_init__(self):
        weight = self.kl_weight
        if not isinstance(weight, Real) and hasattr(weight, "item"):  # a one-element tensor (a schedule's weight)
            try:
                weight = weight.item()
            except (ValueError, RuntimeError):  # (more than one element)
                pass
        if isinstance(weight, bool) or not isinstance(weight, Real) or not (math.isfinite(weight) and weight >= 0):
            raise ValueError(f"a KL weight must be a finite number >= 0, got {self.kl_weight!r}.")
        object.__setattr__(self, "kl_weight", float(weight))  # (frozen)
        if self.chosen_by not in _HOW_CHOSEN:
            raise ValueError(f"chosen_by must be one of {', '.join(map(repr, _HOW_CHOSEN))}, got {self.chosen_by!r}.")

    @property
    def tempered(self) -> bool:
        """Whether the posterior is a tempered one (KL weight other than 1), not the Bayes posterior."""
        return not math.isclose(self.kl_weight, 1.0)

    @property
    def weight_one_gap_se(self) -> float | None:
        """How many standard errors weight 1's validation NLL trailed the chosen tempered weight's (just over 1 is a
        narrow win, which a small split can get wrong); ``None`` when weight 1 was kept or nothing was scored.

        Examples
        --------
        >>> choice = KLWeightChoice(kl_weight=0.1, chosen_by="validation", validation_nll={1.0: 0.5, 0.1: 0.4},
        ...                         validation_nll_se={1.0: 0.05, 0.1: 0.0})
        >>> round(choice.weight_one_gap_se, 2)
        2.0
        """
        if not self.tempered or 1.0 not in self.validation_nll or self.kl_weight not in self.validation_nll:
            return None
        se = self.validation_nll_se.get(1.0, 0.0)
        gap = self.validation_nll[1.0] - self.validation_nll[self.kl_weight]
        return gap / se if se > 0 else math.inf

    def describe(self) -> str:
        """One line for a user: the weight, how it was chosen, and whether the posterior is the Bayes one.

        Examples
        --------
        >>> KLWeightChoice(kl_weight=1.0).describe()
        'KL weight 1 (given): the Bayes posterior'
        """
        how = {"user": " (given)", "fallback": f" (selection not run: {self.reason})",
               "outside": f" assumed ({self.reason})"}.get(self.chosen_by, "")
        if self.chosen_by == "validation":
            scores = ", ".join(f"{w:g}: {nll:.3g}" for w, nll in self.validation_nll.items())
            gap = self.weight_one_gap_se
            if gap is not None and math.isfinite(gap):
                digits = 1
                while round(gap, digits) == 1.0 and gap != 1.0 and digits < 4:  # (which side of the one-SE rule)
                    digits += 1
                scores += f"; weight 1 {gap:.{digits}f} SE behind"
            warm = f" after a {self.warm_start_epochs}-epoch MAP warm start" if self.warm_start_epochs else ""
            how = f", chosen by validation NLL ({scores}){warm}" + (f"; {self.reason}" if self.reason else "")
        kind = "tempered" if self.tempered else "the Bayes posterior"
        if self.point_estimate:  # no posterior to temper: the weight scales the prior's log density
            kind = "a MAP point estimate" + (f", prior weighted by {self.kl_weight:g}" if self.tempered else "")
        if self.chosen_by == "outside":  # (what trained it is not known: Pyro's own ELBOs train at weight 1)
            kind += " if so"
        return f"KL weight {self.kl_weight:g}{how}: {kind}"

    def to_dict(self) -> dict[str, Any]:
        """Plain numbers, strings and lists (for a checkpoint read with ``weights_only=True``, or JSON).

        Examples
        --------
        >>> KLWeightChoice.from_dict(KLWeightChoice(kl_weight=0.1).to_dict()).kl_weight
        0.1
        """
        return {"kl_weight": float(self.kl_weight), "chosen_by": self.chosen_by,
                "validation_nll": [[float(w), float(v)] for w, v in self.validation_nll.items()],
                "validation_nll_se": [[float(w), float(v)] for w, v in self.validation_nll_se.items()],
                "num_validation": self.num_validation, "reason": self.reason,
                "warm_start_epochs": int(self.warm_start_epochs), "point_estimate": bool(self.point_estimate)}

    @classmethod
    def from_dict(cls, entry: dict[str, Any]) -> KLWeightChoice:
        """The inverse of :meth:`to_dict`.

        Examples
        --------
        >>> KLWeightChoice.from_dict({"kl_weight": 0.5}).chosen_by
        'user'
        """
        if not isinstance(entry, dict) or "kl_weight" not in entry:
            raise ValueError(f"a KL weight record needs a 'kl_weight' entry, got {entry!r}.")
        try:
            num_validation = entry.get("num_validation")
            return cls(kl_weight=float(entry["kl_weight"]), chosen_by=str(entry.get("chosen_by", "user")),
                       validation_nll={float(w): float(v) for w, v in entry.get("validation_nll", [])},
                       validation_nll_se={float(w): float(v) for w, v in entry.get("validation_nll_se", [])},
                       num_validation=None if num_validation is None else int(num_validation),
                       reason=str(entry.get("reason", "")), warm_start_epochs=int(entry.get("warm_start_epochs", 0)),
                       point_estimate=bool(entry.get("point_estimate", False)))
        except (TypeError, ValueError) as error:  # (a number that is not one, a pair that is not two)
            raise ValueError(f"a malformed KL weight record: {error}") from None


def record_kl_weight(guide: Any, choice: KLWeightChoice | None) -> None:
    """Record that ``guide`` was trained at ``choice.kl_weight`` (``fit`` and :func:`pyro_bbb.load` call it);
    ``None`` forgets the record (a checkpoint that holds none). A point-estimate guide
    (:func:`~pyro_bbb.infer.guide.is_point_estimate`) is recorded as one (:attr:`KLWeightChoice.point_estimate`).

    Examples
    --------
    >>> guide = pyro_bbb.MeanFieldGuide(BayesianLinear(2, 1))
    >>> record_kl_weight(guide, KLWeightChoice(kl_weight=0.1))
    >>> kl_weight_of(guide).kl_weight
    0.1
    """
    guide = records_holder(guide)
    if choice is None:
        try:
            _records.pop(guide, None)
        except TypeError:
            pass
        return
    if not isinstance(choice, KLWeightChoice):
        raise TypeError(f"record_kl_weight takes a KLWeightChoice, got {type(choice).__name__}.")
    if _store(guide, choice) and isinstance(guide, torch.nn.Module):
        watch_guide(guide)


def _store(guide: Any, choice: KLWeightChoice) -> bool:
    """Keep ``choice`` as ``guide``'s record, forgetting any outside training noted before it (``False``: a guide
    that cannot be weakly referenced is not recorded)."""
    if is_point_estimate(guide) and not choice.point_estimate:
        choice = replace(choice, point_estimate=True)
    try:
        _records[guide] = choice
    except TypeError:
        return False
    forget_outside_training(guide)
    return True


def note_trained_weight(guide: Any, weight: float) -> None:
    """Record that ``guide`` is being trained at ``weight`` (``pyro_bbb.ELBO``'s gradient computations call it, the
    Lightning module's among them: each is taken for a training step), keeping a record at the same weight (``fit``'s,
    with its candidates' scores).

    Examples
    --------
    >>> guide = pyro_bbb.MeanFieldGuide(BayesianLinear(2, 1))
    >>> record_kl_weight(guide, KLWeightChoice(kl_weight=0.1, chosen_by="validation"))
    >>> note_trained_weight(guide, 0.1)
    >>> kl_weight_of(guide).chosen_by
    'validation'
    >>> note_trained_weight(guide, 1.0)
    >>> kl_weight_of(guide).describe()
    'KL weight 1 (given): the Bayes posterior'
    """
    guide = records_holder(guide)
    held = kl_weight_of(guide)
    if held is None:
        record_kl_weight(guide, KLWeightChoice(kl_weight=float(weight)))
    elif held.kl_weight != weight or held.chosen_by == "outside":  # (a schedule's next weight: watched already)
        _store(guide, KLWeightChoice(kl_weight=float(weight)))
    else:
        forget_outside_training(guide)  # (gradients from outside since, no change: this step trains it)


def kl_weight_of(guide: Any) -> KLWeightChoice | None:
    """How ``guide`` was trained (``None``: not by ``fit``, nor loaded from a checkpoint that says); a guide module
    trained on outside :class:`pyro_bbb.ELBO` since its record reads ``chosen_by="outside"``, weight 1 (the first
    read that sees it makes that the record: :mod:`~pyro_bbb.infer.outside_training`).

    Examples
    --------
    >>> kl_weight_of(pyro_bbb.MeanFieldGuide(BayesianLinear(2, 1))) is None
    True
    """
    guide = records_holder(guide)
    try:
        choice = _records.get(guide)
    except TypeError:
        return None
    if choice is None or not isinstance(guide, torch.nn.Module) or not trained_outside(guide):
        return choice
    if choice.chosen_by == "outside":  # (said already: no reason nested in another)
        forget_outside_training(guide)
    else:  # from now on, until a new record
        choice = KLWeightChoice(
            kl_weight=1.0, chosen_by="outside", point_estimate=choice.point_estimate,
            reason=f"trained outside pyro_bbb.ELBO since its record '{choice.describe()}', e.g. by Pyro's Trace_ELBO, "
                   "which trains at weight 1; record_kl_weight(guide, KLWeightChoice(kl_weight=...)) says what you "
                   "did")
        record_kl_weight(guide, choice)
    return choice
