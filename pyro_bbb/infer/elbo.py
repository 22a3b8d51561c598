"""``ELBO``: Pyro's mean-field ELBO with the minibatch scale applied through the data plate."""

from __future__ import annotations

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
from pyro.infer.util import is_validation_enabled, torch_item
from pyro.poutine.util import prune_subsample_sites
from pyro.util import check_model_guide_match, warn_if_nan

from .._checks import check_count
from .._internals import (
    TraceMeanFieldHooks,
    active_messengers,
    autonormal_draw_site,
    check_mean_field_requirement,
    is_tracing,
    without_trace_shapes,
)
from ..plates import DATA_PLATE, data_plate_named, trace_data_plate_frame
from ._replay import ReplayMismatch, ReplayPlan, plan_replay, replay_captures, replay_terms
from .estimators import PosteriorReader
from .guide import POSTERIOR_KEY
from .kl import (
    base_normal,
    batched_normal_kls,
    is_unscaled,
    log_prob_sum,
    needs_posterior,
    site_kl,
    zero_mean_prior_scale,
)
from .scaling import scale_data_plate
from .schedules import Constant

__all__ = ["ELBO"]


def _check_kl_weight(kl_weight: float | Callable[[int], float]) -> Callable[[int], float]:
    if callable(kl_weight):
        return kl_weight
    if isinstance(kl_weight, Real) and not isinstance(kl_weight, bool):
        return Constant(kl_weight)
    raise ValueError(f"`kl_weight` must be a number >= 0 or a schedule (step -> weight), got {kl_weight!r}.")


class ELBO(TraceMeanFieldHooks):
    """The Bayes-by-Backprop objective: a :class:`pyro.infer.TraceMeanField_ELBO` that scales minibatches.

    ``loss = N/B * (negative log-likelihood of the batch) + kl_weight * KL(q || p)`` where the KL is closed-form
    wherever one is registered (Normal posterior vs Normal or Laplace prior) and a Monte Carlo estimate from the
    guide's draw otherwise (e.g. :class:`pyro_bbb.priors.ScaleMixtureNormal`); the closed-form KLs against
    zero-mean Normal priors of all sites are computed together, in a fixed number of operations (a small
    network's step time is the number of operations it runs). The ``N/B`` scale is applied by
    :class:`~pyro_bbb.infer.scaling.DataPlateScaleMessenger` to every site inside ``pyro.plate(data_plate, B)``, so
    the user never divides by the dataset size. Works unchanged with ``pyro.infer.SVI``.

    Parameters
    ----------
    num_data : int, optional
        Size N of the training set. ``None`` leaves scales as the model declares them.
    kl_weight : float or callable
        Weight of the KL term, or a schedule ``step -> weight`` (see :mod:`pyro_bbb.infer.schedules`). The step counter
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
        self._pairs: dict[tuple[int, int], _PairState] = {}
        self._pair = _PairState(None, None)  # the pair of the latest call (a fresh one before any)
        self.revalidate = revalidate
        self.last_terms: dict[str, Any] = {}
        self._current_call: dict[str, Any] | None = None
        self.replay = replay
        self.last_step_replayed = False
        self._plan: ReplayPlan | None = None
        self._last_traces: tuple | None = None

    # -- per (model, guide) pair: the schedule step, validation, the vectorized-particle check ------------------
    @property
    def step(self) -> int:
        """The KL schedule's step for the latest (model, guide) pair: ``loss_and_grads`` calls made with it so far.

        Examples
        --------
        >>> ELBO(num_data=10).step
        0
        """
        return self._pair.step

    @step.setter
    def step(self, value: int) -> None:
        self._pair.step = value

    def _select_pair(self, model, guide) -> None:
        """Make ``(model, guide)``'s state current: what one pair learned (its structure validated, its vectorized
        particles checked, its schedule step) never stands for another's."""
        key = (id(model), id(guide))
        state = self._pairs.get(key)
        if state is None or not state.holds(model, guide):
            self._pairs = {k: v for k, v in self._pairs.items() if v.alive()}
            state = self._pairs[key] = _PairState(model, guide)
        self._pair = state

    # -- the schedule -------------------------------------------------------------------------------------------
    def current_kl_weight(self) -> float:
        """The KL weight at the current :attr:`step`.

        Examples
        --------
        >>> from pyro_bbb.infer.schedules import LinearWarmup
        >>> ELBO(num_data=10, kl_weight=LinearWarmup(4)).current_kl_weight()
        0.0
        """
        weight = self.kl_weight(self.step)
        if isinstance(weight, torch.Tensor):
            weight = weight.item()
        if not isinstance(weight, Real) or not math.isfinite(weight) or weight < 0:
            raise ValueError(f"kl_weight schedule {self.kl_weight!r} returned {weight!r} at step {self.step}; "
                             "a KL weight must be a finite number >= 0.")
        return float(weight)

    # -- one call = one set of terms ----------------------------------------------------------------------------
    @contextmanager
    def _recording(self, model, guide):
        self._select_pair(model, guide)
        self._current_call = {"weight": self.current_kl_weight(), "nll": 0.0, "kl": 0.0, "kl_by_site": {},
                      "loss": 0.0, "frame": None}
        validating = is_validation_enabled()
        skip = validating and self._pair.validated and not self.revalidate
        try:
            with pyro.validation_enabled(False) if skip else nullcontext():
                yield
            self._finish_call()
            self._pair.validated = self._pair.validated or validating
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

    # -- the replayed step (pyro_bbb.infer._replay) ----------------------------------------------------------------
    def _replayable(self, model, guide, args, kwargs) -> tuple | None:
        """The parameter-capture traces and estimators when this call can be replayed, else ``None``."""
        if self._plan is None or (is_validation_enabled() and (self.revalidate or not self._pair.validated)):
            return None
        return replay_captures(self._plan, model, guide, args, kwargs)

    def _replay_loss_and_grads(self, captures: list, estimators: list, x, y) -> float:
        """One replayed step: the plan's terms, accounted for and differentiated as on the full path."""
        nll, kl_by_site, closed_form, batch = replay_terms(self._plan, captures, estimators, x, y, self.num_data,
                                                           self.data_plate)
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
        if self.replay and traces is not None and self.num_particles == 1:
            self._plan = plan_replay(model, guide, traces, self.num_data, self.data_plate)

    def trace_pair(self, model, guide, args, kwargs):
        """One guide draw and the model replayed against it, the data plate scaled.

        Unlike Pyro's ``get_importance_trace`` this computes no log-densities up front: the loss evaluates only
        the ones it needs (observed sites, and latent sites whose KL has no closed form), which saves two full
        passes over every weight tensor per step.
        """
        estimators = active_messengers(PosteriorReader)
        for estimator in estimators:
            estimator.start_run()
        with data_plate_named(self.data_plate):
            guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
            model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args, **kwargs)
        if estimators:  # a weight the estimator never saw would silently stay on plain reparameterization
            weights = [n for n, site in guide_trace.nodes.items() if site["type"] == "sample" and POSTERIOR_KEY in
                       site["infer"]]
            for estimator in estimators:
                estimator.check_reached(weights)
        if self._current_call is not None and self._current_call["frame"] is None:
            self._current_call["frame"] = trace_data_plate_frame(model_trace, self.data_plate)
        if is_validation_enabled():
            check_model_guide_match(model_trace, guide_trace, self.max_plate_nesting)
        guide_trace = prune_subsample_sites(guide_trace)
        model_trace = prune_subsample_sites(model_trace)
        if is_validation_enabled():
            check_mean_field_requirement(model_trace, guide_trace)
        if self._current_call is not None:
            self._last_traces = (model_trace, guide_trace)
        return model_trace, guide_trace

    def particle_traces(self, model, guide, args, kwargs):
        """Pyro's particles; the first vectorized call checks that particle 0 equals the same draw run alone (a
        model whose code reads the particle dimension as its batch gives other numbers) and otherwise falls back,
        with a warning, to one particle at a time. The data plate is scaled inside Pyro's particle plate, so the
        scaling sees each site's own distribution (a conditioned layer weight is recognised as one)."""
        unscaled = model
        model, guide = (scale_data_plate(fn, self.num_data, self.data_plate) for fn in (model, guide))
        if not (self.vectorize_particles and self.num_particles > 1) or self._pair.vectorized_ok:
            yield from self.pyro_particle_traces(model, guide, args, kwargs)
            return
        if self._pair.vectorized_ok is None:
            traces = next(self.pyro_particle_traces(model, guide, args, kwargs))
            self._pair.vectorized_ok = _particle_matches_alone(self.vectorized_model(unscaled), unscaled, traces[1],
                                                          self.max_plate_nesting, args, kwargs)
            if self._pair.vectorized_ok:
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
            yield self.trace_pair(model, guide, args, kwargs)

    def particle_loss(self, model_trace, guide_trace):
        validate = is_validation_enabled()
        nll = 0.0
        kl_by_site: dict[str, torch.Tensor | None] = {}
        closed_form: dict[str, tuple] = {}
        drawn_through: dict[str, str] = {}  # AutoNormal's auxiliary draws whose log q a site's closed-form KL holds
        for name, model_site in model_trace.nodes.items():
            if model_site["type"] != "sample":
                continue
            if model_site["is_observed"]:
                nll = nll - log_prob_sum(model_site, self.max_plate_nesting if validate else None)
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
            draw = autonormal_draw_site(guide_trace, name) if needs_posterior(model_site["fn"]) else None
            if draw is not None:  # AutoNormal's site is a Delta: the prior's KL reads the Normal it draws through
                guide_site, drawn_through[draw["name"]] = draw, name
            plain = guide_site["mask"] is None and is_unscaled(guide_site["scale"])
            q = base_normal(guide_site["fn"]) if plain else None
            t = None if q is None else zero_mean_prior_scale(q.loc, model_site["fn"])
            if t is not None:
                closed_form[name] = (q.loc, q.scale, t)
                kl_by_site[name] = None  # (computed with the others in _account, in this place)
            else:
                kl_by_site[name] = site_kl(guide_site, model_site)
        for name, guide_site in guide_trace.nodes.items():  # auxiliary guide sites contribute log q
            if guide_site["type"] == "sample" and name not in model_trace.nodes and name not in drawn_through:
                kl_by_site[name] = log_prob_sum(guide_site)
        return self._account(nll, kl_by_site, closed_form)

    def _account(self, nll, kl_by_site: dict[str, torch.Tensor | None], closed_form: dict[str, tuple] | None = None):
        """``(loss, surrogate loss)`` from the scaled negative log-likelihood and the KL per site; the sites of
        ``closed_form`` (``(loc, scale, t)`` against a Normal(0, t) prior; ``None`` in ``kl_by_site``) are computed
        together. The terms are added to this call's record."""
        kl = torch.zeros(())
        if closed_form:
            kls = batched_normal_kls(list(closed_form.values()))
            kl = sum((v for name, v in kl_by_site.items() if name not in closed_form), kl + kls.sum())
            kl_by_site.update(zip(closed_form, kls.detach().unbind()))
        else:
            kl = sum(kl_by_site.values(), kl)
        weight = self._current_call["weight"] if self._current_call is not None else self.current_kl_weight()
        surrogate_loss = nll + (kl if weight == 1.0 else weight * kl)  # 1.0 * kl is kl, in value and gradient
        loss = surrogate_loss.detach() if is_tracing() else torch_item(surrogate_loss)

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
        with without_trace_shapes(), self._recording(model, guide):
            return super().loss(model, guide, *args, **kwargs)

    def differentiable_loss(self, model, guide, *args, **kwargs):
        with without_trace_shapes(), self._recording(model, guide):
            return super().differentiable_loss(model, guide, *args, **kwargs)

    def loss_and_grads(self, model, guide, *args, **kwargs):
        with without_trace_shapes(), self._recording(model, guide):
            replayable = self._replayable(model, guide, args, kwargs)
            loss = None
            if replayable is not None:
                try:
                    loss = self._replay_loss_and_grads(*replayable, *args)
                except ReplayMismatch:  # the model changed: the full path from now on (and a plan, if it allows)
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
                f"data_plate={self.data_plate!r})")


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
             for name, value in draws.items()}
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


def _detach(value):
    return value.detach() if isinstance(value, torch.Tensor) else value


def _add_share(total, value, num_particles: int):
    """``total + value / num_particles``: a running mean over particles (the value itself for one particle)."""
    if num_particles == 1 and isinstance(total, float) and total == 0.0:
        return value
    return total + value / num_particles


class _Frame:
    """The data plate's size this call and the size it declared (what ``last_terms`` reads from a plate frame)."""

    def __init__(self, size: int, full_size: int | None):
        self.size, self.full_size = size, full_size


class _PairState:
    """What an :class:`ELBO` keeps for one (model, guide) pair: the KL schedule's step, whether Pyro's validation has
    checked the pair once, and whether its vectorized particles equal one particle alone (``None``: not checked)."""

    def __init__(self, model, guide):
        self.step, self.validated, self.vectorized_ok = 0, False, None
        self._refs = tuple(_reference(obj) for obj in (model, guide))

    def holds(self, model, guide) -> bool:
        return all(ref() is obj for ref, obj in zip(self._refs, (model, guide)))

    def alive(self) -> bool:
        return all(ref() is not None for ref in self._refs)


def _reference(obj) -> Callable[[], Any]:
    """A weak reference where the object allows one (a module, a function), else a strong one."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj
