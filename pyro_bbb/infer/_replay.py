"""The ELBO's fast path: after one step through Pyro's handlers, later steps of the same model and guide replay the
step's tensor program directly (the same draws in the same order, the same loss and gradients), without a Pyro
message per parameter and site.

It must stay equal to the Pyro path of :class:`pyro_bbb.ELBO` (the reference), bit for bit;
``tests/infer/test_replay.py`` runs every case against it. The ELBO sees one object, :class:`ReplayBackend`, which
holds every rule of when a step is replayed: :meth:`ReplayBackend.after_full_step` records a plan after a step
through Pyro's handlers (or finds the model and guide cannot be replayed), and :meth:`ReplayBackend.terms` computes a
later step's terms -- or returns ``None``, and the ELBO takes its own path. It asks the ELBO nothing: the ELBO adds
the terms up and differentiates them as it does its own. A model that no longer matches the plan (a new site, a
cleared param store) drops the plan. The MAP warm start (:mod:`pyro_bbb.train.warm_start`) replays its loss the same
way, bit for bit (:meth:`ReplayBackend.after_map_step`, :meth:`ReplayBackend.map_loss`;
``tests/train/test_warm_start.py``).

Examples
--------
>>> bnn = BNN(BayesianLinear(2, 1), likelihoods.Gaussian(scale=0.1))
>>> elbo, guide, x = pyro_bbb.ELBO(num_data=8), MeanFieldGuide(bnn), torch.randn(8, 2)
>>> for step in range(2):
...     _ = elbo.loss_and_grads(bnn, guide, x, x.sum(-1))
...     print(step, elbo.last_step_replayed)
0 False
1 True
"""

from __future__ import annotations

from numbers import Real
from typing import Any

import torch
from pyro.distributions.util import scale_and_mask
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import prune_subsample_sites

from .._internals import ParamReader, is_tracing, param_captures, preset_samples, sample_priors
from .._kl import has_trainable_parameters, is_unscaled, needs_posterior, site_kl, zero_mean_prior_scale
from .._plates import data_plate_frame
from ..bnn import BNN
from ..nn.module import BayesianModule, is_layer_prior
from .estimators import FlipoutMessenger, LocalReparameterizationMessenger
from .guide import MeanFieldGuide, drawn_posterior, normal_mean
from .scaling import DataPlateScaleMessenger

__all__ = ["ReplayBackend"]


class ReplayBackend:
    """The replayed step behind :meth:`pyro_bbb.ELBO.loss_and_grads`, and the one place that decides when it runs: a
    plan was recorded (``enabled``, one particle, a replayable model and guide: see :func:`_plan_replay`), Pyro's
    validation is not due, and the call follows the plan (see :func:`_replay_captures`).

    Examples
    --------
    >>> ReplayBackend(enabled=False).plan is None
    True
    """

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.plan: ReplayPlan | None = None
        self._traces: tuple | None = None

    def keep_traces(self, traces: tuple) -> None:
        """The ``(model_trace, guide_trace)`` of the full step now running: what a plan is made from."""
        self._traces = traces

    def after_full_step(self, model, guide, num_data: int | None, data_plate: str, num_particles: int) -> None:
        """Record the plan of the full step just run, or none when it cannot be replayed."""
        traces, self._traces = self._traces, None
        self.plan = None
        if self.enabled and traces is not None and num_particles == 1:
            self.plan = _plan_replay(model, guide, traces, num_data, data_plate)

    def after_map_step(self, model, guide, traces: tuple, num_data: int, data_plate: str) -> None:
        """Record the plan of a MAP step just run through Pyro's handlers (:func:`pyro_bbb.train.warm_start.map_loss`:
        its ``(model_trace, guide_trace)``, every latent site at its posterior mean), or none -- also none when a
        prior needs the posterior (an empirical-Bayes prior, which the MAP loss takes at its value given ``q``)."""
        self.plan = None
        traces = tuple(prune_subsample_sites(trace) for trace in traces)  # as the ELBO's (a plate's own site)
        latent_priors = [site["fn"] for site in traces[0].nodes.values()
                         if site["type"] == "sample" and not site["is_observed"]]
        if self.enabled and not any(needs_posterior(prior) for prior in latent_priors):
            self.plan = _plan_replay(model, guide, traces, num_data, data_plate)

    def map_loss(self, model, guide, x, y, num_data: int, data_plate: str, prior_weight: float) -> torch.Tensor | None:
        """A replayed MAP step's loss, :func:`pyro_bbb.train.warm_start.map_loss` bit for bit (the same graph, so the
        same gradients), after :meth:`after_map_step` recorded a plan; ``None`` when the traced loss must run.

        Examples
        --------
        ::

            loss = backend.map_loss(model, guide, x, y, num_data, DATA_PLATE, prior_weight=0.01)
        """
        if self.plan is None:
            return None
        captured = _replay_captures(self.plan, model, guide, (x, y), {})
        if captured is None:
            return None
        try:
            return _replay_map_loss(self.plan, captured[0], x, y, num_data, data_plate, prior_weight)
        except ReplayMismatch:
            self.plan = None
            return None

    def terms(self, model, guide, args: tuple, kwargs: dict, num_data: int | None, data_plate: str,
              validating: bool) -> tuple | None:
        """A replayed step's ``(nll, kl_by_site, closed_form, batch_size, declared)``, the terms the ELBO's own path
        adds up for one particle (``declared``: the data plate's size as the model declares it, or ``None``);
        ``None`` when the full path must run (no plan, validation due, a call off the plan; a model that changed also
        drops the plan).

        Examples
        --------
        ::

            terms = elbo.backend.terms(model, guide, (x, y), {}, elbo.num_data, elbo.data_plate, validating=False)
        """
        if self.plan is None or validating:
            return None
        captured = _replay_captures(self.plan, model, guide, args, kwargs)
        if captured is None:
            return None
        try:
            return _replay_terms(self.plan, *captured, *args, num_data, data_plate)
        except ReplayMismatch:  # the model changed: the full path from now on (and a plan, if it allows)
            self.plan = None
            return None


class ReplayMismatch(Exception):
    """The model no longer matches the recorded plan (a new or unread site, a cleared param store)."""


class ReplayPlan:
    """What a replayed step needs: the model and guide it was recorded for, the guide's prototype (a new set-up
    invalidates it), the latent sites in the guide's order (name, prior reader, whether it is a layer's weight, whose
    posterior an estimator is told), the parameter reader, and the model's own ``num_data`` (its plate's size, which
    the recorded scale of the likelihood followed: a model told another N later is traced again), and the model's
    modules (a layer replaced by another, under the same site names, brings its own prior: traced again)."""

    def __init__(self, model, guide, prototype, sites: list, reader: ParamReader):
        self.model, self.guide, self.prototype, self.sites, self.reader = model, guide, prototype, sites, reader
        self.model_num_data = getattr(model, "num_data", None)
        self.modules = tuple(model.modules())


class _SampleGuard(Messenger):
    """Stops a replayed step at the first ``pyro.sample`` the model emits: the plan presets every site it knows."""

    def _pyro_sample(self, msg: dict[str, Any]) -> None:
        raise ReplayMismatch(f"the model emitted a new sample site {msg['name']!r}")


def _site(fn, value) -> dict[str, Any]:
    """A trace site's fields :func:`~pyro_bbb._kl.site_kl` reads, for a replayed latent site (unscaled,
    unmasked)."""
    return {"fn": fn, "value": value, "scale": 1.0, "mask": None, "args": (), "kwargs": {}}


def _plan_replay(model, guide, traces: tuple, num_data: int | None, data_plate: str) -> ReplayPlan | None:
    """The plan of a replayable model and guide from a full step's ``(model_trace, guide_trace)``, else ``None``:
    a :class:`~pyro_bbb.BNN` whose latent sites are all global sites of a :class:`~pyro_bbb.MeanFieldGuide` (weights
    under a prior without trainable parameters, and e.g. a learned noise scale), observed only at its likelihood's
    site inside an unsubsampled data plate, scaled by ``num_data / B`` and nothing else."""
    if not isinstance(model, BNN) or not isinstance(guide, MeanFieldGuide) or guide.is_pruned:
        return None
    model_trace, guide_trace = traces
    latent = [n for n, site in guide_trace.nodes.items() if site["type"] == "sample"]
    priors = sample_priors(model)  # site -> the prior its module emits (a layer's weight, a noise scale, ...)
    for module in model.modules():  # a layer's own reader: what it emits, without a model run's plate check
        if isinstance(module, BayesianModule):
            priors.update(module.site_priors())
    sites = []
    for name in latent:
        site, model_site = guide_trace.nodes[name], model_trace.nodes.get(name)
        if site["cond_indep_stack"] or site["mask"] is not None or not is_unscaled(site["scale"]):
            return None  # a local latent, or a mask or poutine.scale in the guide
        if model_site is None or model_site["is_observed"] or name not in priors:
            return None
        if guide.posterior_param_names(name) is None:
            return None
        weight = drawn_posterior(site) is not None
        if weight:  # a layer's weight
            if not is_layer_prior(model_site["fn"]) or has_trainable_parameters(model_site["fn"]):
                return None  # a learned prior's parameters would escape the replayed step's parameter capture
        elif model_site["mask"] is not None or not is_unscaled(model_site["scale"]):  # e.g. a learned noise scale
            return None
        sites.append((name, priors[name], weight))
    model_sites = [n for n, site in model_trace.nodes.items() if site["type"] == "sample"]
    observed = [n for n in model_sites if model_trace.nodes[n]["is_observed"]]
    if observed != [model.likelihood.site] or [n for n in model_sites if n not in observed] != latent:
        return None
    obs = model_trace.nodes[observed[0]]
    frame = data_plate_frame(obs, data_plate)
    if frame is None or (frame.full_size or frame.size) != frame.size:
        return None
    expected = 1.0 if num_data is None else num_data / frame.size
    if obs["mask"] is not None or not isinstance(obs["scale"], Real) or obs["scale"] != expected:
        return None  # a mask, or a scale of the user's own (poutine.scale around the likelihood): not replayed
    names = [n for site in latent for n in guide.posterior_param_names(site)]
    return ReplayPlan(model, guide, guide.prototype_trace, sites, ParamReader(names))


def _replay_captures(plan: ReplayPlan, model, guide, args: tuple, kwargs: dict) -> tuple[list, list] | None:
    """``(parameter-capture traces, estimator handlers)`` when a call ``(model, guide, *args, **kwargs)`` can follow
    ``plan``: the same model and guide, ``(x, y)`` with targets, the same prototype, no pruning, no JIT trace, and no
    handler active but ``SVI``'s / ``fit``'s parameter capture and at most one of Flipout and local
    reparameterization. Else ``None``."""
    if plan.model is not model or plan.guide is not guide or kwargs or len(args) != 2 or args[1] is None:
        return None
    if guide.prototype_trace is not plan.prototype or guide.is_pruned or is_tracing():
        return None
    if getattr(model, "num_data", None) != plan.model_num_data:  # e.g. bnn.num_data = N set between steps
        return None
    modules = tuple(model.modules())  # e.g. bnn.net[2] = BayesianLinear(..., prior=...) replaced a layer
    if len(modules) != len(plan.modules) or any(a is not b for a, b in zip(modules, plan.modules)):
        return None
    stack = param_captures(allowed=(FlipoutMessenger, LocalReparameterizationMessenger))
    if stack is None or len(stack[1]) > 1:
        return None
    return stack


def _replay_terms(plan: ReplayPlan, captures: list, estimators: list, x, y, num_data: int | None,
                 data_plate: str) -> tuple[torch.Tensor, dict, dict, int, int | None]:
    """One step's terms as the ELBO's own path computes them, from the same draws in the same order, without the
    handlers but the estimator's (told each site's posterior as the guide's draw would): ``(scaled negative
    log-likelihood, KL by site (``None`` for the closed-form sites), closed-form sites' ``(loc, scale, t)``, batch
    size, the data plate's size as the model declares it (its own ``num_data`` when the ELBO has none; else
    ``None``))``. Raises :class:`ReplayMismatch` when the model no longer matches the plan."""
    priors_now = {name: _prior_now(prior_of) for name, prior_of, _ in plan.sites}  # before any draw
    draws, posteriors, kl_by_site = {}, {}, {}
    for i, (name, _, weight) in enumerate(plan.sites):
        try:
            loc, scale = plan.reader.read(captures, 2 * i, 2 * i + 2)  # site by site, in the guide's order
        except KeyError as missing:  # the param store was cleared or replaced: the guide registers them anew
            raise ReplayMismatch(f"parameter {missing} is not in Pyro's param store") from None
        if weight:  # a layer's weight: Normal(loc, scale).rsample()'s own arithmetic, without the distribution
            # (noise laid out as rsample lays it out, contiguous, whatever the memory format of loc)
            draws[name] = loc + torch.empty(loc.shape, dtype=loc.dtype, device=loc.device).normal_() * scale
            for estimator in estimators:
                estimator.remember_posterior(name, loc, scale)
            posteriors[name] = (loc, scale)
        else:  # what the guide samples from (e.g. a Normal pushed into a positive support): the same draw
            fn = plan.guide.posterior_at(name, loc, scale)
            draws[name] = fn.rsample()
            posteriors[name] = fn
    with preset_samples(plan.model, draws) as read, _SampleGuard():
        fn, y = plan.model.observation(x, y)
    if read != set(draws):
        raise ReplayMismatch("the model did not read every weight site")
    batch = fn.batch_shape[-1] if fn.batch_shape else 1
    scale = 1.0
    # the ELBO's N, else the model's own (BNN(num_data=N) declares its data plate with it: N / B, as the full path)
    declared = plan.model_num_data if num_data is None else None
    scaled_to = num_data if num_data is not None else declared
    if scaled_to is not None:
        if num_data is None and batch > scaled_to:
            raise ReplayMismatch("a batch larger than the model's num_data")  # (the full path: BNN's own error)
        scale = scale * DataPlateScaleMessenger.batch_scale(scaled_to, batch, data_plate)
    # the terms in the order the full path computes them (the autograd graph, and so the gradients, alike)
    nll = 0.0 - scale_and_mask(fn.log_prob(y), scale, None).sum()
    closed_form = {}
    for name, fn in posteriors.items():  # the full path's own KL of each site
        prior = priors_now[name]
        t = zero_mean_prior_scale(fn[0], prior) if isinstance(fn, tuple) else None
        if t is not None:
            closed_form[name] = (*fn, t)
            kl_by_site[name] = None  # (computed with the others, in this place)
            continue
        if isinstance(fn, tuple):  # another prior: the guide's Normal, as the full path sees it
            fn = plan.guide.posterior_at(name, *fn)
        kl_by_site[name] = site_kl(_site(fn, draws[name]), _site(prior, draws[name]))
    return nll, kl_by_site, closed_form, batch, declared


def _prior_now(prior_of) -> Any:
    """A site's prior as its module emits it now; raises :class:`ReplayMismatch` for one with trainable parameters
    (a layer given a learned prior since the plan: they would escape the replayed step's parameter capture)."""
    prior = prior_of()
    if has_trainable_parameters(prior):
        raise ReplayMismatch("a prior with trainable parameters")
    return prior


def _replay_map_loss(plan: ReplayPlan, captures: list, x, y, num_data: int, data_plate: str,
                     prior_weight: float) -> torch.Tensor:
    """The MAP loss per row at the posterior means, ``-(1/N)[(N/B) sum log p(y|x, w) + prior_weight log p(w)]``, in
    the order the traced loss computes it (its sites' log densities summed in the model's order, each scaled and
    masked as :func:`~pyro_bbb._kl.log_prob_sum` does). Raises :class:`ReplayMismatch` when the model no longer
    matches the plan."""
    values = {}
    for i, (name, _, _) in enumerate(plan.sites):
        try:
            loc, scale = plan.reader.read(captures, 2 * i, 2 * i + 2)
        except KeyError as missing:
            raise ReplayMismatch(f"parameter {missing} is not in Pyro's param store") from None
        values[name] = normal_mean(plan.guide.posterior_at(name, loc, scale))
    with preset_samples(plan.model, values) as read, _SampleGuard():
        fn, y = plan.model.observation(x, y)
    if read != set(values):
        raise ReplayMismatch("the model did not read every weight site")
    batch = fn.batch_shape[-1] if fn.batch_shape else 1
    log_likelihood = 0.0 + scale_and_mask(fn.log_prob(y), DataPlateScaleMessenger.batch_scale(num_data, batch,
                                                                                              data_plate), None).sum()
    log_prior = 0.0
    for name, prior_of, _ in plan.sites:
        log_prior = log_prior + scale_and_mask(_prior_now(prior_of).log_prob(values[name]), 1.0, None).sum()
    return -(log_likelihood + prior_weight * log_prior) / num_data
