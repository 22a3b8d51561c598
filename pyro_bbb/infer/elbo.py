"""``ELBO``: Pyro's mean-field ELBO with the minibatch scale applied through the data plate.

This module is the reference path (scale the data plate, draw, add NLL and KL); outside it: per-pair state
(``_pairs``), a call's terms (``_terms``), the replayed backend (``_replay``, proven equal to this path).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyro.poutine as poutine
import torch
from pyro.infer.util import is_validation_enabled, torch_item
from pyro.poutine.util import prune_subsample_sites
from pyro.util import check_model_guide_match

from .._checks import check_count
from .._internals import TraceMeanFieldHooks, check_mean_field_requirement, is_tracing, without_trace_shapes
from .._kl import latent_site_kl, log_prob_sum, sum_site_kls
from .._plates import DATA_PLATE, data_plate_named, trace_data_plate_frame
from ._pairs import PairStates, checked_vectorized_particles
from ._replay import ReplayBackend
from ._terms import CallBookkeeping, CallTerms
from .estimators import check_estimators_reached, started_estimators
from .scaling import scale_data_plate
from .schedules import as_schedule

__all__ = ["ELBO"]


class ELBO(CallBookkeeping, TraceMeanFieldHooks):
    """The Bayes-by-Backprop objective: a :class:`pyro.infer.TraceMeanField_ELBO` that scales minibatches.

    ``loss = N/B * (negative log-likelihood of the batch) + kl_weight * KL(q || p)``: the KL closed-form wherever one
    is registered (Normal posterior vs Normal or Laplace prior; those against zero-mean Normal priors computed together)
    and a Monte Carlo estimate from the guide's draw otherwise. The ``N/B`` scale is applied to every site inside
    ``pyro.plate(data_plate, B)`` (:mod:`~pyro_bbb.infer.scaling`): the user never divides by the dataset size. Works
    unchanged with ``pyro.infer.SVI``; each gradient computation is noted for the optimizer
    (:mod:`~pyro_bbb.infer.contract`), so :class:`pyro_bbb.optim.IVON` refuses gradients of another objective.

    Parameters
    ----------
    num_data : int, optional
        Size N of the training set. ``None`` leaves scales as the model declares them.
    kl_weight : float or callable
        Weight of the KL, or a schedule ``step -> weight`` (:mod:`pyro_bbb.infer.schedules`) whose :attr:`step`
        advances once per :meth:`loss_and_grads`, for each (model, guide) pair apart.
    num_particles, vectorize_particles, **kwargs :
        As in :class:`pyro.infer.TraceMeanField_ELBO` (a vectorized model that reads the particle dimension as its
        batch is found at the first call and run one particle at a time, with a warning).
    data_plate : str
        Name of the plate over data points.
    revalidate : bool
        Pyro's validation runs on a pair's first call only; ``True`` validates every call.
    replay : bool
        Let :meth:`loss_and_grads` replay a step's tensor program where that is the same computation (a
        :class:`pyro_bbb.BNN` and :class:`pyro_bbb.MeanFieldGuide`, one particle; ``pyro_bbb.infer._replay`` has
        the rules): the same draws, loss and gradients, faster. ``False`` always runs this module's path.

    Attributes
    ----------
    last_step_replayed : bool
        Whether the last :meth:`loss_and_grads` call was replayed.
    last_terms : dict
        After each call: ``nll`` (scaled to the full data), ``kl`` (unweighted), ``kl_by_site``, ``kl_weight``,
        ``num_data``, ``batch_size``, ``loss`` and ``loss_per_datum`` (means over particles).

    Examples
    --------
    >>> bnn = BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.1))
    >>> elbo = ELBO(num_data=1000)
    >>> svi = pyro.infer.SVI(bnn, MeanFieldGuide(bnn), pyro.optim.Adam({"lr": 1e-2}), elbo)
    >>> loss = svi.step(torch.randn(32, 3), torch.randn(32))   # scales the 32 data by 1000 / 32
    >>> sorted(elbo.last_terms["kl_by_site"])
    ['net.bias', 'net.weight']
    """

    def __init__(self, num_data: int | None = None, kl_weight: float | Callable[[int], float] = 1.0,
                 num_particles: int = 1, vectorize_particles: bool = False, data_plate: str = DATA_PLATE,
                 revalidate: bool = False, replay: bool = True, **kwargs: Any):
        check_count("num_data", num_data, optional=True)
        super().__init__(num_particles=num_particles, vectorize_particles=vectorize_particles, **kwargs)
        self.num_data = None if num_data is None else int(num_data)  # numpy integers too
        self.kl_weight, self.data_plate, self.revalidate = as_schedule(kl_weight), data_plate, revalidate
        self.pairs, self.backend = PairStates(), ReplayBackend(enabled=replay)
        self.last_terms: dict[str, Any] = {}
        self.last_step_replayed = False
        self.current_call: CallTerms | None = None

    def trace_pair(self, model, guide, args, kwargs):
        """One guide draw and the model replayed against it, the data plate scaled; no log-density is computed up
        front (the loss evaluates only the ones it needs)."""
        estimators = started_estimators()
        with data_plate_named(self.data_plate):
            guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
            model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args, **kwargs)
        check_estimators_reached(estimators, guide_trace)
        if self.current_call is not None and self.current_call.frame is None:
            self.current_call.frame = trace_data_plate_frame(model_trace, self.data_plate)
        if is_validation_enabled():
            check_model_guide_match(model_trace, guide_trace, self.max_plate_nesting)
        guide_trace, model_trace = prune_subsample_sites(guide_trace), prune_subsample_sites(model_trace)
        if is_validation_enabled():
            check_mean_field_requirement(model_trace, guide_trace)
        if self.current_call is not None:
            self.backend.keep_traces((model_trace, guide_trace))
        return model_trace, guide_trace

    def particle_traces(self, model, guide, args, kwargs):
        """Pyro's particles, the data plate scaled inside the particle plate; vectorized particles are checked once
        against particle 0 run alone (and run one by one where they differ)."""
        unscaled = model
        model, guide = (scale_data_plate(fn, self.num_data, self.data_plate) for fn in (model, guide))
        if self.vectorize_particles and self.num_particles > 1 and not self.pairs.current.vectorized_ok:
            yield from checked_vectorized_particles(self, self.pairs.current, model, guide, unscaled, args, kwargs)
            return
        yield from self.pyro_particle_traces(model, guide, args, kwargs)

    def particle_loss(self, model_trace, guide_trace):
        """One particle's ``(loss, surrogate loss)``: the observed sites' NLL and each latent site's KL."""
        validate = is_validation_enabled()
        nll, kl_by_site, closed_form, drawn_through = 0.0, {}, {}, set()
        for name, model_site in model_trace.nodes.items():
            if model_site["type"] != "sample":
                continue
            if model_site["is_observed"]:
                nll = nll - log_prob_sum(model_site, self.max_plate_nesting if validate else None)
                continue
            kl_by_site[name], normal, drawn = latent_site_kl(name, model_site, guide_trace, validate)
            if normal is not None:
                closed_form[name] = normal  # (its KL computed with the others in _account)
            drawn_through.add(drawn)
        for name, guide_site in guide_trace.nodes.items():  # auxiliary guide sites contribute log q
            if guide_site["type"] == "sample" and name not in model_trace.nodes and name not in drawn_through:
                kl_by_site[name] = log_prob_sum(guide_site)
        return self.account(nll, kl_by_site, closed_form)

    def account(self, nll, kl_by_site: dict[str, torch.Tensor | None], closed_form: dict[str, tuple]):
        """``(loss, surrogate loss)`` from a particle's scaled NLL and KL by site (``closed_form``'s sites, ``(loc,
        scale, t)`` against Normal(0, t), computed together), added to this call's terms; the replay backend's
        terms go through it too."""
        kl = sum_site_kls(kl_by_site, closed_form)
        weight = self.current_call.kl_weight if self.current_call is not None else self.current_kl_weight()
        surrogate_loss = nll + (kl if weight == 1.0 else weight * kl)  # 1.0 * kl is kl, in value and gradient
        loss = surrogate_loss.detach() if is_tracing() else torch_item(surrogate_loss)
        if self.current_call is not None:
            self.current_call.add(nll, kl, kl_by_site, loss, self.num_particles)
        return loss, surrogate_loss

    def loss(self, model, guide, *args, **kwargs):
        with without_trace_shapes(), self.recording(model, guide, gradients=False):
            return super().loss(model, guide, *args, **kwargs)

    def differentiable_loss(self, model, guide, *args, **kwargs):
        with without_trace_shapes(), self.recording(model, guide, gradients=True):
            return super().differentiable_loss(model, guide, *args, **kwargs)

    def loss_and_grads(self, model, guide, *args, **kwargs):
        with without_trace_shapes(), self.recording(model, guide, gradients=True):
            validating = is_validation_enabled() and (self.revalidate or not self.pairs.current.validated)
            loss = self.backend.loss_and_grads(self, self.current_call, model, guide, args, kwargs, validating)
            self.last_step_replayed = loss is not None
            if loss is None:
                loss = super().loss_and_grads(model, guide, *args, **kwargs)
                self.backend.after_full_step(model, guide, self.num_data, self.data_plate, self.num_particles)
        self.step += 1
        return loss

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_data={self.num_data}, kl_weight={self.kl_weight!r}, "
                f"num_particles={self.num_particles}, vectorize_particles={self.vectorize_particles}, "
                f"data_plate={self.data_plate!r})")
