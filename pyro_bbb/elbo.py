"""``ELBO``: Pyro's mean-field ELBO with the minibatch scale applied through the data plate."""

from __future__ import annotations

import functools
import math
import warnings
import weakref
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from numbers import Real
from typing import Any

import pyro
import pyro.poutine as poutine
import torch
from pyro.distributions import Normal
from pyro.distributions.kl import kl_divergence
from pyro.distributions.util import scale_and_mask
from pyro.infer import TraceMeanField_ELBO
from pyro.infer.util import is_validation_enabled, torch_item
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import prune_subsample_sites
from pyro.util import check_model_guide_match, check_site_shape, warn_if_nan

from .bnn import BNN
from .checks import check_count
from .guide import POSTERIOR_KEY, MeanFieldGuide
from .handlers import (
    DataPlateScaleMessenger,
    FlipoutMessenger,
    LocalReparameterizationMessenger,
    data_plate_frame,
    scale_data_plate,
)
from .nn.module import DATA_PLATE, BayesianModule, data_plate_named, is_layer_prior
from .priors import strip_independent
from .pyro_adapter import ParamReader, check_mean_field_requirement, param_captures, preset_samples, sample_priors
from .schedules import Constant

__all__ = ["ELBO", "DataPlateScaleMessenger"]  # the messenger lives in pyro_bbb.handlers


def _check_kl_weight(kl_weight: float | Callable[[int], float]) -> Callable[[int], float]:
    if callable(kl_weight):
        return kl_weight
    if isinstance(kl_weight, Real) and not isinstance(kl_weight, bool):
        return Constant(kl_weight)
    raise ValueError(f"`kl_weight` must be a number >= 0 or a schedule (step -> weight), got {kl_weight!r}.")


class ELBO(TraceMeanField_ELBO):
    """The Bayes-by-Backprop objective: a :class:`pyro.infer.TraceMeanField_ELBO` that scales minibatches.

    ``loss = N/B * (negative log-likelihood of the batch) + kl_weight * KL(q || p)`` where the KL is closed-form
    wherever one is registered (Normal posterior vs Normal or Laplace prior) and a Monte Carlo estimate from the
    guide's draw otherwise (e.g. :class:`pyro_bbb.priors.ScaleMixtureNormal`); the closed-form KLs against
    zero-mean Normal priors of all sites are computed together, in a fixed number of operations (a small
    network's step time is the number of operations it runs). The ``N/B`` scale is applied by
    :class:`DataPlateScaleMessenger` to every site inside ``pyro.plate(data_plate, B)``, so the user never
    divides by the dataset size. Works unchanged with ``pyro.infer.SVI``.

    Parameters
    ----------
    num_data : int, optional
        Size N of the training set. ``None`` leaves scales as the model declares them.
    kl_weight : float or callable
        Weight of the KL term, or a schedule ``step -> weight`` (see :mod:`pyro_bbb.schedules`). The step counter
        :attr:`step` advances once per :meth:`loss_and_grads`.
    num_particles, vectorize_particles :
        As in :class:`pyro.infer.ELBO`.
    data_plate : str
        Name of the plate over data points.
    revalidate : bool
        Pyro's validation (distribution arguments, plate shapes, model/guide agreement) runs on the first call; the
        model's structure does not change between steps, so later calls skip it (it costs a pass over every
        weight). ``True`` validates every call.
    replay : bool
        After a first call through Pyro's handlers, :meth:`loss_and_grads` replays the step's tensor program
        directly when that is the same computation: a :class:`pyro_bbb.BNN` whose latent sites are all global sites
        of a :class:`pyro_bbb.MeanFieldGuide` (weights under a prior without trainable parameters -- fixed, or
        :class:`~pyro_bbb.priors.EmpiricalBayesNormal` -- and e.g. a learned noise scale), one
        particle, and no handler active but ``SVI``'s /
        ``fit``'s parameter capture and :func:`pyro_bbb.flipout` or :func:`pyro_bbb.local_reparameterization`
        (the estimators' own work runs as before). Same draws, loss and gradients (tested), without
        a Pyro message per parameter and site -- most of a small network's step. Any other case, or a model whose
        sites change, runs the full Pyro path. ``False`` always runs it.
    **kwargs :
        Passed to :class:`pyro.infer.TraceMeanField_ELBO` (e.g. ``max_plate_nesting``).

    Attributes
    ----------
    last_step_replayed : bool
        Whether the last :meth:`loss_and_grads` call was a replayed step (see ``replay``).
    last_terms : dict
        After each ``loss`` / ``loss_and_grads`` / ``differentiable_loss``: ``nll`` (expected negative
        log-likelihood scaled to the full data), ``kl`` (total, unweighted), ``kl_by_site``, ``kl_weight``,
        ``num_data``, ``batch_size``, ``loss`` and ``loss_per_datum`` (all averaged over particles).

    Examples
    --------
    >>> from pyro.nn import PyroModule
    >>> class Regression(PyroModule):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc = BayesianLinear(3, 1)
    ...     def forward(self, x, y=None):
    ...         mean = self.fc(x).squeeze(-1)
    ...         with pyro.plate("data", x.shape[0]):
    ...             return pyro.sample("y", dist.Normal(mean, 0.1), obs=y)
    >>> model = Regression()
    >>> guide = MeanFieldGuide(model)
    >>> elbo = ELBO(num_data=1000)
    >>> svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), elbo)
    >>> loss = svi.step(torch.randn(32, 3), torch.randn(32))   # scales the 32 data by 1000 / 32
    >>> sorted(elbo.last_terms["kl_by_site"])
    ['fc.bias', 'fc.weight']
    """

    def __init__(
        self,
        num_data: int | None = None,
        kl_weight: float | Callable[[int], float] = 1.0,
        num_particles: int = 1,
        vectorize_particles: bool = False,
        data_plate: str = DATA_PLATE,
        revalidate: bool = False,
        replay: bool = True,
        **kwargs: Any,
    ):
        check_count("num_data", num_data, optional=True)  # the training-set size
        num_data = None if num_data is None else int(num_data)  # numpy integers too
        super().__init__(num_particles=num_particles, vectorize_particles=vectorize_particles, **kwargs)
        self.num_data = num_data
        self.kl_weight = _check_kl_weight(kl_weight)
        self.data_plate = data_plate
        self.step = 0
        self.revalidate = revalidate
        self._validated = False
        self.last_terms: dict[str, Any] = {}
        self._current_call: dict[str, Any] | None = None
        self._vectorized_ok: bool | None = None  # vectorized particles checked against one particle alone
        self.replay = replay
        self.last_step_replayed = False
        self._plan: _ReplayPlan | None = None
        self._last_traces: tuple | None = None

    # -- the schedule -------------------------------------------------------------------------------------------
    def current_kl_weight(self) -> float:
        """The KL weight at the current :attr:`step`.

        Examples
        --------
        >>> from pyro_bbb.schedules import LinearWarmup
        >>> ELBO(num_data=10, kl_weight=LinearWarmup(4)).current_kl_weight()
        0.0
        """
        weight = self.kl_weight(self.step)
        if isinstance(weight, torch.Tensor):
            weight = weight.item()
        if not isinstance(weight, Real) or not math.isfinite(weight) or weight < 0:
            raise ValueError(f"kl_weight schedule {self.kl_weight!r} returned {weight!r} at step {self.step}; "
                             "a KL weight must be a finite number >= 0.")  # fmt: skip
        return float(weight)

    # -- one call = one set of terms ----------------------------------------------------------------------------
    @contextmanager
    def _recording(self):
        self._current_call = {"weight": self.current_kl_weight(), "nll": 0.0, "kl": 0.0, "kl_by_site": {},
                      "loss": 0.0, "frame": None}  # fmt: skip
        validating = is_validation_enabled()
        skip = validating and self._validated and not self.revalidate
        try:
            with pyro.validation_enabled(False) if skip else nullcontext():
                yield
            self._finish_call()
            self._validated = self._validated or validating
        finally:
            self._current_call = None

    def _finish_call(self) -> None:
        call = self._current_call
        site_names = list(call["kl_by_site"])
        values = [call["nll"], call["kl"], *call["kl_by_site"].values()]
        values = [v.detach() if isinstance(v, torch.Tensor) else torch.tensor(float(v)) for v in values]
        if any(v.dtype != values[0].dtype or v.device != values[0].device for v in values):
            values = [v.to(values[0].device, torch.float64) for v in values]
        floats = torch.stack(values).tolist()  # one device sync; a float32 value is exact as a Python float
        frame = call["frame"]  # the data plate as the model declared it: the batch, and a subsampled plate's N
        batch_size = None if frame is None else frame.size
        declared = None if frame is None or (frame.full_size or frame.size) == frame.size else frame.full_size
        num_data = self.num_data if self.num_data is not None else declared
        loss = float(call["loss"])
        self.last_terms = {
            "loss": loss,
            "nll": floats[0],
            "kl": floats[1],
            "kl_by_site": dict(zip(site_names, floats[2:], strict=True)),
            "kl_weight": call["weight"],
            "num_data": num_data,
            "batch_size": batch_size,
            "loss_per_datum": loss / (num_data or batch_size or 1),
        }

    # -- the replayed step --------------------------------------------------------------------------------------
    def _replayable(self, model, guide, args, kwargs) -> tuple | None:
        """The plan and the parameter-capture traces when this call can be replayed, else ``None``."""
        plan = self._plan
        if plan is None or plan.model is not model or plan.guide is not guide or kwargs or len(args) != 2:
            return None
        if args[1] is None or guide.prototype_trace is not plan.prototype or guide.is_pruned:
            return None
        if is_validation_enabled() and (self.revalidate or not self._validated):
            return None
        if torch._C._get_tracing_state():
            return None
        stack = param_captures(allowed=(FlipoutMessenger, LocalReparameterizationMessenger))
        if stack is None or len(stack[1]) > 1:
            return None
        return plan, *stack

    def _replay_loss_and_grads(self, plan: _ReplayPlan, captures: list, estimators: list, x, y) -> float:
        """One step as :meth:`_differentiable_loss_particle` and Pyro's ``loss_and_grads`` compute it, from the same
        draws in the same order, without the handlers but the estimator's (Flipout's or local reparameterization's,
        told each site's posterior as the guide's draw would); :class:`_ReplayMismatch` when the model no longer
        matches."""
        draws, posteriors, kl_by_site = {}, {}, {}
        for i, (name, prior_of, weight) in enumerate(plan.sites):
            try:
                loc, scale = plan.reader.read(captures, 2 * i, 2 * i + 2)  # site by site, in the guide's order
            except KeyError as missing:  # the param store was cleared or replaced: the guide registers them anew
                raise _ReplayMismatch(f"parameter {missing} is not in Pyro's param store") from None
            if weight:  # a layer's weight: Normal(loc, scale).rsample()'s own arithmetic, without the distribution
                # (noise laid out as rsample lays it out, contiguous, whatever the memory format of loc)
                draws[name] = loc + torch.empty(loc.shape, dtype=loc.dtype, device=loc.device).normal_() * scale
                for estimator in estimators:
                    estimator.remember_posterior(name, loc, scale)
                posteriors[name] = ((loc, scale), prior_of)
            else:  # what the guide samples from (e.g. a Normal pushed into a positive support): the same draw
                fn = plan.guide.posterior_at(name, loc, scale)
                draws[name] = fn.rsample()
                posteriors[name] = (fn, prior_of)
        with preset_samples(plan.model, draws) as read, _SampleGuard():
            fn, y = plan.model.observation(x, y)
        if read != set(draws):
            raise _ReplayMismatch("the model did not read every weight site")
        batch = fn.batch_shape[-1] if fn.batch_shape else 1
        scale = 1.0
        if self.num_data is not None:
            scale = scale * DataPlateScaleMessenger.batch_scale(self.num_data, batch, self.data_plate)
        # the terms in the order the full path computes them (the autograd graph, and so the gradients, alike)
        nll = 0.0 - scale_and_mask(fn.log_prob(y), scale, None).sum()
        closed_form = {}
        for name, (fn, prior_of) in posteriors.items():  # the full path's own KL of each site
            prior = prior_of()
            t = _zero_mean_prior_scale(fn[0], prior) if isinstance(fn, tuple) else None
            if t is not None:
                closed_form[name] = (*fn, t)
                kl_by_site[name] = None  # (computed with the others below, in this place)
                continue
            if isinstance(fn, tuple):  # another prior: the guide's Normal, as the full path sees it
                fn = plan.guide.posterior_at(name, *fn)
            kl_by_site[name] = _site_kl(_site(fn, draws[name]), _site(prior, draws[name]))
        self._current_call["frame"] = _Frame(batch, None)
        loss, surrogate_loss = self._account(nll, kl_by_site, closed_form)
        if getattr(surrogate_loss, "requires_grad", False):
            (surrogate_loss / self.num_particles).backward(retain_graph=self.retain_graph)
        warn_if_nan(loss, "loss")
        return loss

    def _record_plan(self, model, guide) -> None:
        """After a full call: the plan of a replayable model and guide (see ``replay``), else none."""
        traces, self._last_traces = self._last_traces, None
        self._plan = None
        if not self.replay or traces is None or self.num_particles != 1:
            return
        if not isinstance(model, BNN) or not isinstance(guide, MeanFieldGuide) or guide.is_pruned:
            return
        model_trace, guide_trace = traces
        latent = [n for n, site in guide_trace.nodes.items() if site["type"] == "sample"]
        priors = sample_priors(model)  # site -> the prior its module emits (a layer's weight, a noise scale, ...)
        for module in model.modules():  # a layer's own reader: what it emits, without a model run's plate check
            if isinstance(module, BayesianModule):
                priors.update(module.site_priors())
        sites = []
        for name in latent:
            site, model_site = guide_trace.nodes[name], model_trace.nodes.get(name)
            if site["cond_indep_stack"] or site["mask"] is not None or not _is_one(site["scale"]):
                return  # a local latent, or a mask or poutine.scale in the guide
            if model_site is None or model_site["is_observed"] or name not in priors:
                return
            if guide.posterior_param_names(name) is None:
                return
            if POSTERIOR_KEY in site["infer"]:  # a layer's weight
                if not is_layer_prior(model_site["fn"]) or _has_trainable_parameters(model_site["fn"]):
                    return  # a learned prior's parameters would escape the replayed step's parameter capture
            elif model_site["mask"] is not None or not _is_one(model_site["scale"]):  # e.g. a learned noise scale
                return
            sites.append((name, priors[name], POSTERIOR_KEY in site["infer"]))
        model_sites = [n for n, site in model_trace.nodes.items() if site["type"] == "sample"]
        observed = [n for n in model_sites if model_trace.nodes[n]["is_observed"]]
        if observed != [model.likelihood.site] or [n for n in model_sites if n not in observed] != latent:
            return
        frame = data_plate_frame(model_trace.nodes[observed[0]], self.data_plate)
        if frame is None or (frame.full_size or frame.size) != frame.size:
            return
        obs = model_trace.nodes[observed[0]]
        expected = 1.0 if self.num_data is None else self.num_data / frame.size
        if obs["mask"] is not None or not isinstance(obs["scale"], Real) or obs["scale"] != expected:
            return  # a mask, or a scale of the user's own (poutine.scale around the likelihood): not replayed
        names = [n for site in latent for n in guide.posterior_param_names(site)]
        self._plan = _ReplayPlan(model, guide, guide.prototype_trace, sites, ParamReader(names))

    def _get_trace(self, model, guide, args, kwargs):
        """One guide draw and the model replayed against it, the data plate scaled.

        Unlike Pyro's ``get_importance_trace`` this computes no log-densities up front: the loss evaluates only
        the ones it needs (observed sites, and latent sites whose KL has no closed form), which saves two full
        passes over every weight tensor per step.
        """
        with data_plate_named(self.data_plate):
            guide_trace = poutine.trace(scale_data_plate(guide, self.num_data, self.data_plate)).get_trace(
                *args, **kwargs
            )
            model = scale_data_plate(model, self.num_data, self.data_plate)
            model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args, **kwargs)
        if self._current_call is not None and self._current_call["frame"] is None:
            self._current_call["frame"] = _data_plate_frame(model_trace, self.data_plate)
        if is_validation_enabled():
            check_model_guide_match(model_trace, guide_trace, self.max_plate_nesting)
        guide_trace = prune_subsample_sites(guide_trace)
        model_trace = prune_subsample_sites(model_trace)
        if is_validation_enabled():
            check_mean_field_requirement(model_trace, guide_trace)
        if self._current_call is not None:
            self._last_traces = (model_trace, guide_trace)
        return model_trace, guide_trace

    def _get_traces(self, model, guide, args, kwargs):
        """Pyro's particles; the first vectorized call checks that particle 0 equals the same draw run alone (a
        model whose code reads the particle dimension as its batch gives other numbers) and otherwise falls back,
        with a warning, to one particle at a time."""
        if not (self.vectorize_particles and self.num_particles > 1) or self._vectorized_ok:
            yield from super()._get_traces(model, guide, args, kwargs)
            return
        if self._vectorized_ok is None:
            traces = next(super()._get_traces(model, guide, args, kwargs))
            self._vectorized_ok = _particle_matches_alone(self._vectorized_num_particles(model), model, traces[1],
                                                          self.max_plate_nesting, args, kwargs)  # fmt: skip
            if self._vectorized_ok:
                yield traces
                return
            warnings.warn(
                "pyro_bbb.ELBO(vectorize_particles=True): particle 0 of the vectorized model differs from the same "
                "weight draw run alone (the model's code reads the particle dimension as its batch); running the "
                f"{self.num_particles} particles one at a time instead. Build the model with pyro_bbb.BNN, whose "
                "network sees ordinary batches, or index from the right (out[..., -1, :]).",
                stacklevel=4,
            )
        for _ in range(self.num_particles):
            yield self._get_trace(model, guide, args, kwargs)

    def _differentiable_loss_particle(self, model_trace, guide_trace):
        validate = is_validation_enabled()
        nll = 0.0
        kl_by_site: dict[str, torch.Tensor | None] = {}
        closed_form: dict[str, tuple] = {}
        for name, model_site in model_trace.nodes.items():
            if model_site["type"] != "sample":
                continue
            if model_site["is_observed"]:
                nll = nll - _log_prob_sum(model_site, self.max_plate_nesting if validate else None)
                continue
            guide_site = guide_trace.nodes.get(name)
            if guide_site is None:
                raise ValueError(
                    f"the model's latent site {name!r} has no posterior in the guide: the guide was set up from an "
                    "earlier call whose model had no such site (a site the model emits only for some inputs). Emit "
                    "the same latent sites on every call, or observe this one."
                )
            if validate and not guide_site["fn"].has_rsample:
                raise NotImplementedError(
                    f"guide site {name!r} ({type(guide_site['fn']).__name__}) is not reparameterizable; "
                    "pyro_bbb.ELBO needs reparameterized guide draws (MeanFieldGuide's are)."
                )
            q = _base_normal(guide_site["fn"]) if guide_site["mask"] is None and _is_one(guide_site["scale"]) else None
            t = None if q is None else _zero_mean_prior_scale(q.loc, model_site["fn"])
            if t is not None:
                closed_form[name] = (q.loc, q.scale, t)
                kl_by_site[name] = None  # (computed with the others in _account, in this place)
            else:
                kl_by_site[name] = _site_kl(guide_site, model_site)
        for name, guide_site in guide_trace.nodes.items():  # auxiliary guide sites contribute log q
            if guide_site["type"] == "sample" and name not in model_trace.nodes:
                kl_by_site[name] = _log_prob_sum(guide_site)
        return self._account(nll, kl_by_site, closed_form)

    def _account(self, nll, kl_by_site: dict[str, torch.Tensor | None], closed_form: dict[str, tuple] | None = None):
        """``(loss, surrogate loss)`` from the scaled negative log-likelihood and the KL per site; the sites of
        ``closed_form`` (``(loc, scale, t)`` against a Normal(0, t) prior; ``None`` in ``kl_by_site``) are computed
        together. The terms are added to this call's record."""
        kl = torch.zeros(())
        if closed_form:
            kls = _batched_normal_kls(list(closed_form.values()))
            kl = sum((v for name, v in kl_by_site.items() if name not in closed_form), kl + kls.sum())
            kl_by_site.update(zip(closed_form, kls.detach().unbind()))
        else:
            kl = sum(kl_by_site.values(), kl)
        weight = self._current_call["weight"] if self._current_call is not None else self.current_kl_weight()
        surrogate_loss = nll + (kl if weight == 1.0 else weight * kl)  # 1.0 * kl is kl, in value and gradient
        loss = surrogate_loss.detach() if torch._C._get_tracing_state() else torch_item(surrogate_loss)

        if self._current_call is not None:
            n = self.num_particles
            call = self._current_call
            call["nll"] = _add_share(call["nll"], _detach(nll), n)
            call["kl"] = _add_share(call["kl"], kl.detach(), n)
            call["loss"] += loss / n
            by_site = call["kl_by_site"]
            for name, value in kl_by_site.items():
                by_site[name] = _add_share(by_site.get(name, 0.0), value.detach(), n)
        return loss, surrogate_loss

    def loss(self, model, guide, *args, **kwargs):
        with self._recording():
            return super().loss(model, guide, *args, **kwargs)

    def differentiable_loss(self, model, guide, *args, **kwargs):
        with self._recording():
            return super().differentiable_loss(model, guide, *args, **kwargs)

    def loss_and_grads(self, model, guide, *args, **kwargs):
        with self._recording():
            replayable = self._replayable(model, guide, args, kwargs)
            loss = None
            if replayable is not None:
                try:
                    loss = self._replay_loss_and_grads(*replayable, *args)
                except _ReplayMismatch:  # the model changed: the full path from now on (and a plan, if it allows)
                    self._plan = None
                    self._current_call.update(nll=0.0, kl=0.0, kl_by_site={}, loss=0.0, frame=None)
            self.last_step_replayed = loss is not None
            if loss is None:
                loss = super().loss_and_grads(model, guide, *args, **kwargs)
                self._record_plan(model, guide)
        self.step += 1
        return loss

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_data={self.num_data}, kl_weight={self.kl_weight!r}, "
                f"num_particles={self.num_particles}, vectorize_particles={self.vectorize_particles}, "
                f"data_plate={self.data_plate!r})")  # fmt: skip


def _first_particle(value: torch.Tensor, event_dim: int, max_plate_nesting: int) -> torch.Tensor:
    """A vectorized site's value at particle 0, without the particle dimension or leading singletons."""
    batch_dims = value.dim() - event_dim
    if batch_dims >= max_plate_nesting:
        value = value.select(batch_dims - max_plate_nesting, 0)
    while value.dim() > event_dim and value.shape[0] == 1:
        value = value[0]
    return value


@torch.no_grad()
def _particle_matches_alone(vectorized_model, model, guide_trace, max_plate_nesting, args, kwargs) -> bool:
    """Whether the observed log-densities of particle 0 equal those of its weight draw run without the plate
    (both with the estimators' handlers hidden: Flipout's signs are not part of the draw)."""
    draws = {name: site["value"] for name, site in guide_trace.iter_stochastic_nodes()}
    first = {name: _first_particle(value, guide_trace.nodes[name]["fn"].event_dim, max_plate_nesting)
             for name, value in draws.items()}  # fmt: skip
    try:
        with poutine.block(hide_types=["bayesian_affine", "bayesian_affine_map"]), poutine.block():
            together = poutine.trace(poutine.condition(vectorized_model, data=draws)).get_trace(*args, **kwargs)
            alone = poutine.trace(poutine.condition(model, data=first)).get_trace(*args, **kwargs)
    except (RuntimeError, ValueError, IndexError):
        return False
    for name, site in together.nodes.items():
        if site["type"] != "sample" or not site["is_observed"]:
            continue
        vectorized = _first_particle(site["fn"].log_prob(site["value"]), 0, max_plate_nesting)
        single = alone.nodes[name]["fn"].log_prob(alone.nodes[name]["value"])
        if vectorized.numel() != single.numel() or not torch.allclose(
            vectorized.reshape(-1), single.reshape(-1), rtol=1e-4, atol=1e-4
        ):
            return False
    return True


def _data_plate_frame(trace, data_plate: str):
    """The data plate's frame in a trace (its size this call and the size it declared), or ``None``."""
    return next((f for f in (data_plate_frame(site, data_plate) for site in trace.nodes.values()) if f), None)


def _detach(value):
    return value.detach() if isinstance(value, torch.Tensor) else value


def _add_share(total, value, num_particles: int):
    """``total + value / num_particles``: a running mean over particles (the value itself for one particle)."""
    if num_particles == 1 and isinstance(total, float) and total == 0.0:
        return value
    return total + value / num_particles


def _log_prob_sum(site: dict, max_plate_nesting: float | None = None) -> torch.Tensor:
    """Scaled and masked log-density of a site's value, summed; checks plate shapes when given the nesting."""
    log_prob = site["fn"].log_prob(site["value"], *site["args"], **site["kwargs"])
    if max_plate_nesting is not None:
        site["log_prob"] = log_prob
        check_site_shape(site, max_plate_nesting)
    return scale_and_mask(log_prob, site["scale"], site["mask"]).sum()


def _base_normal(d) -> Normal | None:
    d = strip_independent(d)
    return d if type(d) is Normal else None


def _has_trainable_parameters(d) -> bool:
    """Whether a distribution's parameters carry gradients (a learned or hierarchical prior)."""
    return any(isinstance(v, torch.Tensor) and v.requires_grad for v in vars(strip_independent(d)).values())


def _is_constant(t: torch.Tensor) -> bool:
    """A tensor expanded from one number (every stride 0)."""
    return all(stride == 0 for stride in t.stride()) or t.numel() == 1


#: Per prior distribution (layers cache theirs): the versions of its loc and scale, and ``(m, t)`` as Python numbers
#: or None when the fast path does not apply. Read once per prior (and again after an in-place change), so the step
#: does not synchronise with the device to look at them.
_PRIOR_CONSTANTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _prior_constants(p) -> tuple[float, float] | None:
    """``(m, t)`` of a Normal prior with one constant loc and scale; None when the prior's parameters vary, or carry
    gradients (a learned or hierarchical prior: the KL must reach them, so it is computed in torch)."""
    base = _base_normal(p)
    if base is None or base.loc.requires_grad or base.scale.requires_grad:
        return None
    versions = (base.loc._version, base.scale._version)
    cached = _PRIOR_CONSTANTS.get(p)
    if cached is not None and cached[0] == versions:
        return cached[1]
    constants = None
    if _is_constant(base.loc) and _is_constant(base.scale):
        constants = (float(base.loc.reshape(-1)[0]), float(base.scale.reshape(-1)[0]))
    _PRIOR_CONSTANTS[p] = (versions, constants)
    return constants


def _learned_scale_constants(p) -> tuple[float, torch.Tensor] | None:
    """``(m, t)`` of a Normal prior with one constant loc and one *learned* scale (a scalar tensor carrying gradients,
    expanded over the weights: :class:`pyro_bbb.priors.LearnedNormal` with one scale per tensor); else None."""
    base = _base_normal(p)
    if base is None or base.loc.requires_grad or not base.scale.requires_grad:
        return None
    if not (_is_constant(base.loc) and _is_constant(base.scale)):
        return None
    return float(base.loc.reshape(-1)[0]), base.scale.reshape(-1)[0]


def _normal_kl_sum(mu: torch.Tensor, s: torch.Tensor, p) -> torch.Tensor | None:
    """``sum KL(Normal(mu, s) || Normal(m, t))`` over a whole weight tensor when the prior ``p`` has one ``(m, t)``.

    ``n (log t - 1/2) - sum log s + (sum s^2 + sum (mu - m)^2) / (2 t^2)``: three reductions instead of the ten
    elementwise passes of the general formula (the KL is the costliest part of a step after the matrix products).
    ``t`` may be a learned scalar tensor, which the KL's gradient then reaches.
    """
    constants = _prior_constants(p) or _learned_scale_constants(p)
    if constants is None or mu.shape != _base_normal(p).loc.shape:
        return None
    return _normal_kl_of(mu, s, *constants)


def _normal_kl_of(mu: torch.Tensor, s: torch.Tensor, m: float, t: float | torch.Tensor) -> torch.Tensor:
    """:func:`_normal_kl_sum` given the prior's ``(m, t)``."""
    n = mu.numel()
    squares = torch.linalg.vector_norm(s).square() + torch.linalg.vector_norm(mu).square()
    if m != 0.0:  # sum (mu - m)^2 = |mu|^2 - 2 m sum(mu) + n m^2, without an elementwise pass
        squares = squares - 2 * m * mu.sum() + n * m * m
    log_t = t.log() if isinstance(t, torch.Tensor) else math.log(t)
    return squares * (0.5 / (t * t)) - s.log().sum() + n * (log_t - 0.5)


def _zero_mean_prior_scale(mu: torch.Tensor, p) -> float | None:
    """``t`` when ``p`` is a Normal(0, t) prior with number parameters over a tensor of ``mu``'s shape (the KLs that
    :func:`_batched_normal_kls` computes together), else None."""
    constants = _prior_constants(p)
    if constants is None or constants[0] != 0.0 or mu.shape != _base_normal(p).loc.shape:
        return None
    return constants[1]


def _batched_normal_kls(sites: list[tuple[torch.Tensor, torch.Tensor, float]]) -> torch.Tensor:
    """``sum KL(Normal(mu, s) || Normal(0, t))`` over each site's tensor, one entry per ``(mu, s, t)``.

    ``(|s|^2 + |mu|^2) / (2 t^2) - sum log s + n (log t - 1/2)``, as :func:`_normal_kl_sum`, with every site's norms
    in one foreach call and the rest on vectors of one entry per site: about ten operations for any number of sites
    instead of ten per site (a small network's step is bounded by how many operations it runs, not their size).
    """
    locs, scales, ts = zip(*sites)
    if len({(s.dtype, s.device) for s in (*locs, *scales)}) > 1:  # mixed precision or devices: one site at a time
        return torch.stack([_normal_kl_of(mu, s, 0.0, t) for mu, s, t in sites])
    norms = torch.stack(torch._foreach_norm([*scales, *locs])).square()
    squares = norms[: len(sites)] + norms[len(sites) :]
    log_sums = torch.stack([s.log().sum() for s in scales])
    factor, offset = _kl_constants(ts, tuple(mu.numel() for mu in locs), locs[0].dtype, locs[0].device)
    return squares * factor - log_sums + offset


@functools.lru_cache(maxsize=64)
def _kl_constants(ts: tuple, sizes: tuple, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    """``1 / (2 t^2)`` and ``n (log t - 1/2)`` per site, as vectors (made once per model, not every step)."""
    factor = [0.5 / (t * t) for t in ts]
    offset = [n * (math.log(t) - 0.5) for n, t in zip(sizes, ts)]
    with torch.inference_mode(False):  # kept for later steps: never an inference tensor, which autograd refuses
        return torch.tensor(factor, dtype=dtype, device=device), torch.tensor(offset, dtype=dtype, device=device)


def _site_kl(guide_site: dict, model_site: dict) -> torch.Tensor:
    """KL(q || p) of one latent site: closed form where registered, else log q(w) - log p(w) at the draw."""
    q = _base_normal(guide_site["fn"]) if guide_site["mask"] is None else None
    if q is not None:
        kl = _normal_kl_sum(q.loc, q.scale, model_site["fn"])
        if kl is not None:
            return kl * guide_site["scale"]
    try:
        kl = kl_divergence(guide_site["fn"], model_site["fn"])
    except NotImplementedError:
        return _log_prob_sum(guide_site) - _log_prob_sum(model_site)
    kl = scale_and_mask(kl, scale=guide_site["scale"], mask=guide_site["mask"])
    if torch.is_tensor(kl):
        return kl.sum()
    return torch.as_tensor(kl * torch.Size(guide_site["fn"].batch_shape).numel())


class _ReplayMismatch(Exception):
    """The model no longer matches the recorded plan (a new or unread site, a cleared param store)."""


class _SampleGuard(Messenger):
    """Stops a replayed step at the first ``pyro.sample`` the model emits: the plan presets every site it knows."""

    def _pyro_sample(self, msg: dict[str, Any]) -> None:
        raise _ReplayMismatch(f"the model emitted a new sample site {msg['name']!r}")


def _is_one(scale) -> bool:
    return isinstance(scale, Real) and scale == 1.0


def _site(fn, value) -> dict[str, Any]:
    """A trace site's fields :func:`_site_kl` reads, for a replayed latent site (unscaled, unmasked)."""
    return {"fn": fn, "value": value, "scale": 1.0, "mask": None, "args": (), "kwargs": {}}


class _Frame:
    """The data plate's size this call and the size it declared (what ``last_terms`` reads from a plate frame)."""

    def __init__(self, size: int, full_size: int | None):
        self.size, self.full_size = size, full_size


class _ReplayPlan:
    """What a replayed step needs: the model and guide it was recorded for, the guide's prototype (a new set-up
    invalidates it), the latent sites in the guide's order (name, prior reader, whether it is a layer's weight, whose
    posterior an estimator is told), and the parameter reader."""

    def __init__(self, model, guide, prototype, sites: list, reader: ParamReader):
        self.model, self.guide, self.prototype, self.sites, self.reader = model, guide, prototype, sites, reader
