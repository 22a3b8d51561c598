"""Model selection by the evidence: the ELBO of a trained guide on the training data, with its standard error.

The ELBO, ``sum over the N training data of E_q[log p(y | x, w)] - KL(q || p)``, is a lower bound on the log
evidence ``log p(y | x)`` of the model; of two models trained on the same data, the one with the larger converged
ELBO is the one the data support (up to the bound's gap). It needs no held-out data, so it can choose a model's
prior, noise model and initial posterior without ever looking at a test score: the rule pyro_bbb follows for its own
defaults (``benchmarks/evidence.py``). :func:`evidence` estimates it by Monte Carlo with plain reparameterization
(one weight draw per draw, shared by all the data: an unbiased estimate whatever estimator trained the guide) and
reports the standard error over the draws; :func:`compare_evidence` ranks several trained candidates.

Examples
--------
>>> x, y = torch.randn(64, 3), torch.randn(64)
>>> bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian())
>>> guide = pyro_bbb.MeanFieldGuide(bnn)
>>> _ = pyro_bbb.fit(bnn, guide, (x, y), epochs=2, progress=False)
>>> result = evidence(bnn, guide, (x, y), num_draws=20)
>>> result.num_data, result.num_draws
(64, 20)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pyro
import pyro.poutine as poutine
import torch
from pyro.infer.autoguide import AutoGuide

from .._checks import check_count, require_set_up
from .._inputs import model_dtype
from .._internals import active_messengers
from .._plates import data_plate_of
from .._rng import rng_untouched
from .._warnings import warn_at_caller
from ..data.batches import Batches, likelihood_of, model_device
from ..infer.elbo import ELBO
from ..infer.estimators import PosteriorReader
from ..infer.guide import point_estimate_parts
from ..infer.tempering import kl_weight_of
from ..nn.module import buffers_kept, training_mode
from ..priors import strip_independent
from .pruning import PrunedGuide

__all__ = ["Evidence", "evidence", "compare_evidence"]


@dataclass(frozen=True)
class Evidence:
    """A Monte Carlo estimate of a trained guide's ELBO on its training data (nats; larger is better).

    Attributes
    ----------
    elbo : float
        The ELBO over all ``num_data`` data: ``expected_log_likelihood - kl``.
    standard_error : float
        Standard error of ``elbo`` over the draws (0 when every draw gives the same value).
    expected_log_likelihood, kl : float
        The two terms (the KL closed-form where one is registered, else estimated from the same draws).
    num_data, num_draws : int
        Data points and weight draws the estimate used.
    trained_kl_weight : float, optional
        The KL weight the guide was trained at (:mod:`pyro_bbb.infer.tempering`; ``None``: not known). The ELBO
        here is always the weight-1 ELBO, a lower bound on the log evidence for any guide; a guide trained at
        another weight is a tempered posterior, which this bound scores but which did not maximise it.

    Examples
    --------
    >>> e = Evidence(elbo=-130.0, standard_error=0.5, expected_log_likelihood=-100.0, kl=30.0, num_data=100,
    ...              num_draws=200)
    >>> e.per_datum, e.per_datum_standard_error
    (-1.3, 0.005)
    """

    elbo: float
    standard_error: float
    expected_log_likelihood: float
    kl: float
    num_data: int
    num_draws: int
    trained_kl_weight: float | None = None

    @property
    def per_datum(self) -> float:
        """The ELBO per training datum (comparable between data sets of different sizes)."""
        return self.elbo / self.num_data

    @property
    def per_datum_standard_error(self) -> float:
        """The standard error of :attr:`per_datum`."""
        return self.standard_error / self.num_data

    def __str__(self) -> str:
        return (f"ELBO {self.elbo:.2f} ± {self.standard_error:.2f} nats ({self.per_datum:.4f} per datum; expected "
                f"log-likelihood {self.expected_log_likelihood:.2f}, KL {self.kl:.2f}; {self.num_draws} draws)"
                + self.tempering_note)

    @property
    def tempering_note(self) -> str:
        """A sentence when the guide was trained at a KL weight other than 1 (else empty)."""
        weight = self.trained_kl_weight
        if weight is None or math.isclose(weight, 1.0):
            return ""
        return (f"; the guide was trained at KL weight {weight:g} (a tempered posterior): this is the KL-weight-1 "
                "ELBO, still a lower bound on the evidence, but the guide did not maximise it, so compare it only "
                "with models trained at the same weight")


def evidence(
    model: Callable,
    guide: Callable,
    data: tuple[torch.Tensor, torch.Tensor] | torch.utils.data.DataLoader,
    *,
    num_draws: int = 200,
    batch_size: int | None = None,
    seed: int | None = 0,
) -> Evidence:
    """Estimate the ELBO of a trained ``guide`` for ``model`` on ``data`` (all of it: the training data).

    Each draw is an unbiased estimate of the ELBO: the whole data's log-likelihood under one weight draw from the
    guide (in batches of ``batch_size`` if given, each batch with its own draw, weighted by its share of the data),
    less the KL (closed-form where Pyro has one). The model runs in training mode, as :func:`pyro_bbb.fit` trains
    it, and without any estimator handler: Flipout, local reparameterization and moment propagation change how a
    guide is trained, not the objective it is scored by (moment propagation's objective is an approximation, so a
    guide trained with it is scored by the exact ELBO here). Nothing is changed: no parameter and no
    schedule moves.

    Parameters
    ----------
    model, guide : callable
        A model (e.g. :class:`pyro_bbb.BNN`, any Pyro model with a data plate) and a trained guide for it (any Pyro
        guide).
    data : (x, y) or DataLoader
        The data the guide was trained on (the ELBO of other data is not a bound on this model's evidence for them).

    The ELBO is always computed at KL weight 1 (the bound on the evidence). A guide that :func:`pyro_bbb.fit` trained
    at another weight (chosen by ``kl_weight="auto"``, or given) is a tempered posterior: :attr:`Evidence.
    trained_kl_weight` and the printed result say so, since such a guide was not trained to maximise this bound.
    num_draws : int
        Weight draws; the standard error falls as ``1 / sqrt(num_draws)``.
    batch_size : int, optional
        Evaluate the data in batches of this size (memory); ``None``: all at once.
    seed : int, optional
        Seeds the draws (the same seed gives the same estimate; ``None`` draws from the generators as they are).
        Every generator (torch's on CPU and CUDA, Python's, numpy's) is as it was afterwards either way.

    Returns
    -------
    Evidence

    Raises
    ------
    GuideNotSetUpError
        The guide has not been trained (its parameters do not exist yet).
    ValueError
        Called inside :func:`pyro_bbb.flipout`, :func:`pyro_bbb.local_reparameterization` or
        :func:`pyro_bbb.moment_propagation`, for a guide with a point mass (``AutoDelta``,
        ``AutoLaplaceApproximation``, a hand-written guide of ``Delta`` sites: no ELBO to report), or with bad
        arguments or data.

    Examples
    --------
    >>> x = torch.randn(100, 2)
    >>> y = x.sum(-1) + 0.1 * torch.randn(100)
    >>> bnn = pyro_bbb.BNN(BayesianLinear(2, 1), likelihoods.Gaussian())
    >>> guide = pyro_bbb.MeanFieldGuide(bnn)
    >>> _ = pyro_bbb.fit(bnn, guide, (x, y), epochs=50, batch_size=25, lr=1e-2, progress=False)
    >>> result = evidence(bnn, guide, (x, y), num_draws=50)
    >>> result.standard_error > 0, abs(result.elbo - (result.expected_log_likelihood - result.kl)) < 1e-6
    (True, True)
    """
    require_set_up(guide, "evidence")
    active = [reader.estimator for reader in active_messengers(PosteriorReader)]
    if active:
        raise ValueError(
            f"evidence scores the exact ELBO with plain weight draws, but it was called inside an estimator's handler "
            f"({', '.join(active)}), which would change what is computed (moment propagation's ELBO is an "
            "approximation). Call it outside the `with` block."
        )
    check_count("num_draws", num_draws)
    if num_draws < 2:
        raise ValueError(f"num_draws must be at least 2 (the standard error needs two draws), got {num_draws}.")
    check_count("batch_size", batch_size, optional=True)
    batches = Batches(data, batch_size, likelihood_of(model), model_device(model), model_dtype(model))
    elbo = ELBO(num_data=batches.num_data, data_plate=data_plate_of(model), replay=False)
    with rng_untouched(seed), torch.no_grad(), training_mode(model, True), buffers_kept(model):  # (batch norm's too)
        _refuse_point_estimates(guide, batches)
        draws = torch.tensor([_one_draw(elbo, model, guide, batches) for _ in range(num_draws)], dtype=torch.float64)
    values = -draws.sum(1)  # the ELBO of each draw: -(nll + kl)
    standard_error = float(values.std() / math.sqrt(num_draws))
    return Evidence(elbo=float(values.mean()), standard_error=standard_error,
                    expected_log_likelihood=float(-draws[:, 0].mean()), kl=float(draws[:, 1].mean()),
                    num_data=batches.num_data, num_draws=num_draws,
                    trained_kl_weight=getattr(kl_weight_of(guide), "kl_weight", None))


def _point_mass_sites(guide, batches: Batches) -> list[str]:
    """The latent sites a guide gives a point mass: every site of an ``AutoDelta`` or ``AutoLaplaceApproximation``
    (a MAP estimate until its ``laplace_approximation()``), also inside an ``AutoGuideList``; of a hand-written guide,
    every site when all it samples is a ``Delta``. (Pyro's other autoguides emit ``Delta`` sites too, drawn through
    an auxiliary site with a density.)"""
    if isinstance(guide, AutoGuide):  # Pyro's autoguides: the sites of their point-estimate parts
        return [name for part in point_estimate_parts(guide)
                for name, site in part.prototype_trace.iter_stochastic_nodes() if not site["is_observed"]]
    with torch.no_grad(), poutine.block():  # a hand-written guide, traced once (the caller keeps the RNG)
        sites = list(poutine.trace(guide).get_trace(*next(iter(batches))).iter_stochastic_nodes())
    deltas = [name for name, site in sites if isinstance(strip_independent(site["fn"]), pyro.distributions.Delta)]
    return deltas if sites and len(deltas) == len(sites) else []


def _refuse_point_estimates(guide, batches: Batches) -> None:
    """A guide with a point mass for a latent site has no ELBO to report: the KL of a point mass from a continuous
    prior is infinite, and what Pyro's ELBOs compute for it is a MAP objective, not a bound."""
    if isinstance(guide, PrunedGuide) and guide.fraction > 0:
        raise ValueError(
            f"evidence bounds the evidence of a posterior, and this PrunedGuide gives {guide.fraction:.0%} of the "
            "weights a point mass at zero (the smallest positive scale): the KL of a point from a continuous prior is "
            "infinite, and the finite number computed for it depends on the dtype (about 87 nats a pruned weight in "
            "float32, 708 in float64). Compare a pruned model by held-out log-likelihood (pyro_bbb.predict(model, "
            "pruned, x_val)), or take the evidence of the guide it wraps (pruned.guide)."
        )
    points = _point_mass_sites(guide, batches)
    if points:
        raise ValueError(
            f"evidence bounds the evidence of a posterior, and {type(guide).__name__} gives the sites {points[:5]} a "
            "point mass (a MAP estimate): its ELBO is minus infinity (the KL of a point from a continuous prior), and "
            "the finite number Pyro's ELBO returns for it is the log joint, which would outrank every real "
            "posterior. Compare models with a posterior per weight (MeanFieldGuide, AutoNormal), or compare point "
            "estimates by held-out log-likelihood (pyro_bbb.predict on validation data)."
        )


def _one_draw(elbo: ELBO, model, guide, batches: Batches) -> tuple[float, float]:
    """``(nll, kl)`` of one draw over all the data: each batch's estimate weighted by its share of it."""
    nll = kl = 0.0
    seen = 0
    for x, y in batches:
        share = len(y) / batches.num_data
        seen += len(y)
        elbo.loss(model, guide, x, y)
        nll += share * float(elbo.last_terms["nll"])
        kl += share * float(elbo.last_terms["kl"])
    if seen != batches.num_data:  # (the shares would not add up to one: the ELL and the KL both off)
        raise ValueError(
            f"evidence sums over every training row once per draw, and this DataLoader yielded {seen} of its "
            f"{batches.num_data} rows (drop_last=True, or a sampler that draws part of them, or some twice). Pass "
            "DataLoader(dataset, batch_size=..., drop_last=False) over all the training rows, or the tensors (x, y)."
        )
    return nll, kl


def compare_evidence(candidates: Mapping[str, tuple[Callable, Callable]], data, **options) -> dict[str, Evidence]:
    """The :func:`evidence` of several trained ``(model, guide)`` candidates on the same data, best first.

    Parameters
    ----------
    candidates : mapping
        ``name -> (model, guide)``, each guide trained on ``data``.
    data : (x, y) or DataLoader
        The training data they share.
    **options
        Passed to :func:`evidence` (``num_draws``, ``batch_size``, ``seed``).

    Returns
    -------
    dict
        ``name -> Evidence``, ordered from the largest ELBO to the smallest.

    Warns
    -----
    UserWarning
        The candidates were trained at different KL weights: their KL-weight-1 ELBOs do not compare the models.

    Raises
    ------
    ValueError
        Two candidates' guides read the same entries of Pyro's global param store (models whose sites have the same
        names, trained one after the other, share one posterior: the second continued the first's training), so
        their ELBOs would be one guide's. Train each with its own parameters
        (``pyro.settings.set(module_local_params=True)``, as in the example) or name their sites apart.

    Examples
    --------
    >>> pyro.settings.set(module_local_params=True)       # every guide keeps its own parameters
    >>> x, y = torch.randn(64, 3), torch.randn(64)
    >>> trained = {}
    >>> for name, prior in {"N(0, 1)": priors.Normal(0.0, 1.0), "fan-in": priors.FanInNormal()}.items():
    ...     bnn = pyro_bbb.BNN(BayesianLinear(3, 1, prior=prior), likelihoods.Gaussian())
    ...     guide = pyro_bbb.MeanFieldGuide(bnn)
    ...     _ = pyro_bbb.fit(bnn, guide, (x, y), epochs=2, progress=False)
    ...     trained[name] = (bnn, guide)
    >>> ranked = compare_evidence(trained, (x, y), num_draws=10)
    >>> sorted(ranked)
    ['N(0, 1)', 'fan-in']
    >>> pyro.settings.set(module_local_params=False)
    """
    if not candidates:
        raise ValueError("compare_evidence needs at least one (model, guide) candidate.")
    _check_own_parameters(candidates, data)
    results = {name: evidence(model, guide, data, **options) for name, (model, guide) in candidates.items()}
    weights = {name: 1.0 if result.trained_kl_weight is None else result.trained_kl_weight
               for name, result in results.items()}
    if len({round(weight, 12) for weight in weights.values()}) > 1:
        shown = ", ".join(f"{name!r}: {weight:g}" for name, weight in weights.items())
        warn_at_caller(
            f"compare_evidence ranks candidates trained at different KL weights ({shown}): each ELBO is the "
            "KL-weight-1 bound on its evidence, which a tempered guide did not maximise, so the ranking favours the "
            "ones trained at weight 1 whatever their models. Train every candidate at one weight "
            "(fit(..., kl_weight=1)) to compare the models.")
    return dict(sorted(results.items(), key=lambda item: -item[1].elbo))


def _check_own_parameters(candidates: Mapping[str, tuple[Callable, Callable]], data) -> None:
    """An error naming the fix where two candidates' guides train the same parameter tensors."""
    owners: dict[int, str] = {}
    for name, (model, guide) in candidates.items():
        require_set_up(guide, "evidence")
        if isinstance(guide, PrunedGuide):  # (it shares its wrapped guide's parameters: said as what it is)
            continue
        for tensor in _guide_parameters(model, guide, data):
            if owners.setdefault(id(tensor), name) != name:
                raise ValueError(
                    f"candidates {owners[id(tensor)]!r} and {name!r} share their guide's parameters (Pyro's global "
                    "param store keeps one parameter per name: the later one's training continued the earlier "
                    "one's), so both would be scored with one posterior. Train each candidate with its own parameters "
                    "(pyro.settings.set(module_local_params=True) before building them) or give their sites "
                    "different names."
                )


def _guide_parameters(model, guide, data) -> list[torch.Tensor]:
    """The tensors a guide trains: a ``PyroModule`` guide's parameters, else the param-store entries it reads."""
    if isinstance(guide, torch.nn.Module):
        return list(guide.parameters())
    with torch.no_grad(), rng_untouched(), poutine.block():  # (a look at the guide: nothing drawn for the caller)
        x, y = next(iter(Batches(data, None, likelihood_of(model), model_device(model), model_dtype(model))))
        trace = poutine.trace(guide).get_trace(x, y)
    names = {site for site, node in trace.nodes.items() if node["type"] == "param"}
    return [tensor for site, tensor in pyro.get_param_store().named_parameters() if site in names]
