"""``ELBO``: Pyro's mean-field ELBO with the minibatch scale applied through the data plate -- the whole objective.

Read top to bottom: :class:`ELBO` overrides :class:`pyro.infer.TraceMeanField_ELBO`'s hooks under Pyro's own names
(``_get_trace``: one guide draw and the model replayed against it, the data plate scaled by ``N/B``; ``_get_traces``:
the particles; ``_differentiable_loss_particle``: one particle's NLL and KL), then keeps each call's terms
(:class:`CallTerms`, read out as ``last_terms``) and marks the parameters it computed gradients for with its ``N``
and KL weight (:mod:`~pyro_bbb.infer.contract`); :class:`PairStates` holds what it learns about each (model, guide)
pair. The one thing elsewhere is the replayed fast path (:mod:`~pyro_bbb.infer._replay`), a backend that hands back a
step's terms or ``None`` and is proven equal to this path.

Examples
--------
>>> bnn = BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.1))
>>> elbo = ELBO(num_data=1000)
>>> _ = elbo.loss_and_grads(bnn, MeanFieldGuide(bnn), torch.randn(32, 3), torch.randn(32))
>>> elbo.last_terms["num_data"], elbo.last_terms["batch_size"]
(1000, 32)
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from types import MethodType
from typing import Any

import pyro
import pyro.poutine as poutine
import torch
from pyro.infer import TraceMeanField_ELBO
from pyro.infer.autoguide import AutoGuide, AutoGuideList
from pyro.infer.util import is_validation_enabled, torch_item
from pyro.poutine.util import prune_subsample_sites, site_is_subsample
from pyro.util import check_model_guide_match, warn_if_nan

from .._checks import check_count
from .._draws import UnfoldableRowsError
from .._internals import (
    active_param_trace,
    check_mean_field_requirement,
    is_tracing,
    unconstrained_param,
    unwrap_handlers,
    vectorized_model,
    without_trace_shapes,
)
from .._kl import latent_site_kl, log_prob_sum, sum_site_kls
from .._plates import DATA_PLATE, data_plate_frame, data_plate_named, data_plate_of, trace_data_plate_frame
from .._rng import rng_untouched
from .._warnings import warn_at_caller
from ..nn.module import buffer_restorer
from ._replay import ReplayBackend
from .contract import KeptGradients, ObjectiveRun, mark_objective_run, watch_backward
from .estimators import check_estimators_reached, started_estimators
from .outside_training import objective_of_record, watch_objective_backward
from .scaling import scale_data_plate
from .schedules import as_schedule, weight_at
from .tempering import kl_weight_of, note_trained_weight, record_kl_weight

__all__ = ["ELBO", "CallTerms", "PairStates"]


class Frame:
    """The data plate's size this call and the size it declared (what ``last_terms`` reads from a plate frame).

    Examples
    --------
    >>> Frame(8, None).size
    8
    """

    def __init__(self, size: int, full_size: int | None):
        self.size, self.full_size = size, full_size


class CallTerms:
    """A running mean over particles of the scaled NLL, the KL (total and by site) and the loss, with the call's KL
    weight, data-plate frame and whether it ``trains`` (computes gradients).

    Examples
    --------
    >>> CallTerms(kl_weight=0.5).kl_weight
    0.5
    """

    def __init__(self, kl_weight: float, trains: bool = False):
        self.kl_weight, self.trains = kl_weight, trains
        self.scale: float | None = 1.0  # a handler's factor on the whole loss (loss_scale)
        self.nll, self.kl, self.loss, self.frame = 0.0, 0.0, 0.0, None
        self.kl_by_site: dict[str, Any] = {}

    def add(self, nll, kl: torch.Tensor, kl_by_site: dict[str, torch.Tensor], loss: float,
            num_particles: int) -> None:
        """Add one particle's terms (each divided by ``num_particles``)."""
        self.nll = _add_share(self.nll, nll.detach() if isinstance(nll, torch.Tensor) else nll, num_particles)
        self.kl = _add_share(self.kl, kl.detach(), num_particles)
        self.loss += loss / num_particles
        for name, value in kl_by_site.items():
            self.kl_by_site[name] = _add_share(self.kl_by_site.get(name, 0.0), value.detach(), num_particles)

    def finish(self, num_data: int | None) -> dict[str, Any]:
        """The call's ``last_terms`` (one device sync); ``num_data`` is the ELBO's own (else the plate's declared
        size)."""
        site_names = list(self.kl_by_site)
        values = [self.nll, self.kl, *self.kl_by_site.values()]
        values = [v.detach() if isinstance(v, torch.Tensor) else torch.tensor(float(v)) for v in values]
        if any(v.dtype != values[0].dtype or v.device != values[0].device for v in values):
            values = [v.to(values[0].device, torch.float64) for v in values]
        floats = torch.stack(values).tolist()  # a float32 value is exact as a Python float
        # a handler's factor on the whole loss (poutine.scale on model and guide, e.g. 1 / N): the terms as the
        # objective defines them, the loss as the step returns it
        factor = self.scale if self.scale is not None else 1.0
        if factor != 1.0:
            floats = [value / factor for value in floats]
        frame = self.frame  # the data plate as the model declared it: the batch, and a subsampled plate's N
        batch_size = None if frame is None else frame.size
        declared = None if frame is None or (frame.full_size or frame.size) == frame.size else frame.full_size
        num_data = num_data if num_data is not None else declared
        loss = float(self.loss)
        return {
            "loss": loss,
            "nll": floats[0],
            "kl": floats[1],
            "kl_by_site": dict(zip(site_names, floats[2:], strict=True)),
            "kl_weight": self.kl_weight,
            "num_data": num_data,
            "batch_size": batch_size,
            "loss_scale": self.scale,
            "loss_per_datum": loss / factor / (num_data or batch_size or 1),
        }


def _add_share(total, value, num_particles: int):
    """``total + value / num_particles``: a running mean over particles (the value itself for one particle)."""
    if num_particles == 1 and isinstance(total, float) and total == 0.0:
        return value
    return total + value / num_particles


class ELBO(TraceMeanField_ELBO):
    """The Bayes-by-Backprop objective: a :class:`pyro.infer.TraceMeanField_ELBO` that scales minibatches.

    ``loss = N/B * (negative log-likelihood of the batch) + kl_weight * KL(q || p)``: the KL closed-form wherever one
    is registered (Normal posterior vs Normal or Laplace prior; those against zero-mean Normal priors computed together)
    and a Monte Carlo estimate from the guide's draw otherwise. The ``N/B`` scale is applied to every site inside
    ``pyro.plate(data_plate, B)`` (:mod:`~pyro_bbb.infer.scaling`): the user never divides by the dataset size. Works
    unchanged with ``pyro.infer.SVI``; each gradient computation marks the parameters it reached with this ELBO's ``N``
    and KL weight (:mod:`~pyro_bbb.infer.contract`), so :class:`pyro_bbb.optim.IVON` refuses gradients of another
    objective.

    Parameters
    ----------
    num_data : int, optional
        Size N of the training set. ``None`` leaves scales as the model declares them.
    kl_weight : float or callable
        Weight of the KL, or a schedule ``step -> weight`` (:mod:`pyro_bbb.infer.schedules`) whose :attr:`step`
        advances once per :meth:`loss_and_grads` or :meth:`differentiable_loss` (a training step, whose weight
        is recorded on the guide: :mod:`~pyro_bbb.infer.tempering`; not per :meth:`loss`, nor per
        ``differentiable_loss`` under ``torch.no_grad()``), for each (model, guide) pair apart.
    num_particles, vectorize_particles, **kwargs :
        As in :class:`pyro.infer.TraceMeanField_ELBO` (a vectorized model that reads the particle dimension as its
        batch is found at the first call and run one particle at a time, with a warning).
    data_plate : str, optional
        Name of the plate over data points; by default the model's own (its ``data_plate`` attribute, as a
        :class:`~pyro_bbb.BNN` built with ``data_plate=`` has, else ``"data"``).
    revalidate : bool
        Pyro's validation runs on a pair's first call with inputs of each shape only (a batch of another size, or
        targets of another shape, is validated again); ``True`` validates every call.
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
        ``num_data``, ``batch_size``, ``loss`` and ``loss_per_datum`` (means over particles), and ``loss_scale``:
        the factor a handler put on the whole loss (``poutine.scale`` of the model and guide; 1 without one,
        ``None`` where they were scaled unalike), which ``loss`` carries (as the step returns it) and the other
        terms do not.

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
                 num_particles: int = 1, vectorize_particles: bool = False, data_plate: str | None = None,
                 revalidate: bool = False, replay: bool = True, **kwargs: Any):
        super().__init__(num_particles=num_particles, vectorize_particles=vectorize_particles, **kwargs)
        self.num_data = num_data
        self.kl_weight, self.revalidate = as_schedule(kl_weight), revalidate
        self._validation_skipped = False  # (this call's: set by recording)
        self._guide_by_position = False  # (this call's guide is an autoguide: set by recording)
        self.data_plate = data_plate
        self.pairs, self.backend = PairStates(), ReplayBackend(enabled=replay)
        self.last_terms: dict[str, Any] = {}
        self.last_step_replayed = False
        self._awaiting_backward = None  # (run, params) of a differentiable_loss whose backward is the caller's
        self.current_call: CallTerms | None = None

    @property
    def data_plate(self) -> str:
        """The data plate's name: the one given, else the model's own (read at each call, ``"data"`` before any).

        Examples
        --------
        >>> ELBO().data_plate, ELBO(data_plate="rows").data_plate
        ('data', 'rows')
        """
        return self._plate_now

    @data_plate.setter
    def data_plate(self, name: str | None) -> None:
        self._given_plate, self._plate_now = name, name or DATA_PLATE

    @property
    def kl_weight(self) -> Callable[[int], float]:
        """The KL weight as a schedule of :attr:`step` (:class:`~pyro_bbb.infer.schedules.Constant` for a number);
        a number or schedule set later is checked and wrapped the same way.

        Examples
        --------
        >>> elbo = ELBO(num_data=10)
        >>> elbo.kl_weight = 0.5
        >>> elbo.kl_weight, elbo.current_kl_weight()
        (Constant(weight=0.5), 0.5)
        """
        return self._kl_weight

    @kl_weight.setter
    def kl_weight(self, value: float | Callable[[int], float]) -> None:
        self._kl_weight = as_schedule(value)

    @property
    def num_data(self) -> int | None:
        """N, the training-set size each batch's likelihood is scaled to (``None``: the model's data plate's size).

        Examples
        --------
        >>> elbo = ELBO()
        >>> elbo.num_data = 500
        >>> elbo.num_data
        500
        """
        return self._num_data

    @num_data.setter
    def num_data(self, value: int | None) -> None:
        self._num_data = check_count("num_data", value, optional=True)  # (an int: numpy integers too)

    # -- Pyro's hooks, under Pyro's names ------------------------------------------------------------------------------
    def _get_trace(self, model, guide, args, kwargs):
        """One guide draw and the model replayed against it, the data plate scaled; no log-density is computed up
        front (the loss evaluates only the ones it needs)."""
        estimators = started_estimators()
        with data_plate_named(self.data_plate):
            guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
            model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args, **kwargs)
        frame = trace_data_plate_frame(model_trace, self.data_plate)
        check_estimators_reached(estimators, guide_trace, frame)
        if self.current_call is not None and self.current_call.frame is None:  # (the call's first particle)
            self.current_call.frame = frame
            self.current_call.scale = loss_scale(model_trace, guide_trace, self.num_data, self.data_plate)
            self._watch_for_minibatches(model_trace)
        if is_validation_enabled():
            check_model_guide_match(model_trace, guide_trace, self.max_plate_nesting)
        guide_trace, model_trace = prune_subsample_sites(guide_trace), prune_subsample_sites(model_trace)
        if is_validation_enabled():
            check_mean_field_requirement(model_trace, guide_trace)
        if self.current_call is not None:
            self.backend.keep_traces((model_trace, guide_trace))
        return model_trace, guide_trace

    def _watch_for_minibatches(self, model_trace) -> None:
        """A warning when a pair's data plate calls each batch all the data (no ``num_data``, a plate of the batch's
        size) and its training calls keep seeing other observations (minibatches): the batch's likelihood is then
        weighed against the whole KL, a posterior too wide, in silence. The first :data:`MINIBATCH_WATCH` calls that
        compute gradients note their observed values as sorted multisets (a reshuffled full batch is the same data);
        :data:`MINIBATCH_DISTINCT` different ones make the warning (a training set with a held-out set or two scored
        between steps, or a second data set after the first, are fewer). A set scored with :meth:`loss`, or under
        ``torch.no_grad()``, is not watched."""
        pair, frame = self.pairs.current, self.current_call.frame
        if (self.num_data is not None or not self.current_call.trains or pair.watched >= MINIBATCH_WATCH
                or frame is None or frame.full_size not in (None, frame.size)):
            return
        pair.watched += 1
        pair.seen.add(_observations_key(model_trace, frame))
        if pair.watched >= MINIBATCH_WATCH or len(pair.seen) >= MINIBATCH_DISTINCT:
            pair.watched, many, pair.seen = MINIBATCH_WATCH, len(pair.seen) >= MINIBATCH_DISTINCT, set()
            if many:
                warn_at_caller(
                    f"pyro_bbb.ELBO: the model's data plate {frame.name!r} declares each call's {frame.size} rows as "
                    "all the data (pyro_bbb.ELBO has no num_data, and the plate no subsample), and its observations "
                    f"change from step to step: on minibatches the likelihood of {frame.size} rows is weighed against "
                    "the whole KL, and the posterior stays too wide. Pass pyro_bbb.ELBO(num_data=N) with N the number "
                    f"of training rows, or declare pyro.plate({frame.name!r}, N, subsample=idx) in the model.")

    def _get_traces(self, model, guide, args, kwargs):
        """Pyro's particles, the data plate scaled inside the particle plate; vectorized particles are checked once
        against particle 0 and the last run alone (and run one by one where they differ, or where a batch's rows
        cannot be split among them)."""
        unscaled = model
        model, guide = (scale_data_plate(fn, self.num_data, self.data_plate) for fn in (model, guide))
        if self.vectorize_particles and self.num_particles > 1:
            yield from self._checked_vectorized_traces(model, guide, unscaled, args, kwargs)
            return
        yield from super()._get_traces(model, guide, args, kwargs)

    def _differentiable_loss_particle(self, model_trace, guide_trace):
        """One particle's ``(loss, surrogate loss)``: the observed sites' NLL and each latent site's KL."""
        validate = is_validation_enabled()
        nll, kl_by_site, closed_form, drawn_through = 0.0, {}, {}, set()
        for name, model_site in model_trace.nodes.items():
            if model_site["type"] != "sample":
                continue
            if model_site["is_observed"]:
                if validate:
                    self._check_scaled_once(name, model_site)
                nll = nll - log_prob_sum(model_site, self.max_plate_nesting if validate else None)
                continue
            if validate:
                self._check_not_per_position(name, model_site)
            kl_by_site[name], normal, drawn = latent_site_kl(name, model_site, guide_trace, validate)
            if normal is not None:
                closed_form[name] = normal  # (its KL computed with the others in _account)
            drawn_through.add(drawn)
        for name, guide_site in guide_trace.nodes.items():  # auxiliary guide sites contribute log q
            if guide_site["type"] == "sample" and name not in model_trace.nodes and name not in drawn_through:
                kl_by_site[name] = log_prob_sum(guide_site)
        return self.account(nll, kl_by_site, closed_form)

    def _check_scaled_once(self, name: str, site: dict) -> None:
        """A warning for an observation in the data plate scaled by ``(N / B)^2``: by this ELBO, which scales the
        minibatch to ``num_data``, and again by the model (the ``poutine.scale(scale=N / B)`` of Pyro's older
        minibatch recipe)."""
        frame = data_plate_frame(site, self.data_plate)
        if frame is None:
            return
        num_data = self.num_data or frame.full_size  # (this ELBO's N, else the one the plate declares)
        if not num_data or frame.size in (0, num_data):
            return
        once, scale = num_data / frame.size, torch.as_tensor(site["scale"])
        if scale.numel() == 1 and math.isclose(float(scale), once * once, rel_tol=1e-6):
            scaler = (f"this ELBO scales the batch of {frame.size} rows to N={num_data} itself" if self.num_data else
                      f"the data plate declares N={num_data} (pyro.plate(..., N, subsample=...), or BNN(num_data=N)), "
                      f"which scales the batch of {frame.size} rows to N")
            warn_at_caller(
                f"pyro_bbb.ELBO({'num_data=' + str(self.num_data) if self.num_data else ''}): the observation "
                f"{name!r} is scaled by (N / B)^2 = {once * once:g}: {scaler}, and the model scales it by N / B = "
                f"{once:g} again (poutine.scale, Pyro's older minibatch recipe): the posterior comes out too narrow. "
                "Drop the model's own scale.")

    def _check_not_per_position(self, name: str, site: dict) -> None:
        """A clear error, before any step, for a latent site inside a data plate of the batch's own rows, that this ELBO
        scales to ``num_data``, under an autoguide: the guide would learn one value per batch position, not per datum,
        every minibatch's rows sharing them (a weight read inside ``with pyro.plate``; a local latent needs a plate
        subsampled by row indices)."""
        frame = data_plate_frame(site, self.data_plate)
        if (frame is None or frame.full_size != frame.size or self.num_data in (None, frame.size)
                or not self._guide_by_position):
            return
        raise ValueError(
            f"pyro_bbb.ELBO(num_data={self.num_data}): the latent site {name!r} is sampled inside the data plate "
            f"{self.data_plate!r} of this batch's {frame.size} rows, so the autoguide would learn one value per "
            "batch position, not per datum, every minibatch's rows sharing them. Read a weight before the data "
            "plate (self.weight outside `with pyro.plate(...)`); a local latent per datum needs the plate subsampled "
            f"by row indices, pyro.plate({self.data_plate!r}, N, subsample=idx), and a guide built with "
            "create_plates. Nothing was changed."
        )

    def account(self, nll, kl_by_site: dict[str, torch.Tensor | None], closed_form: dict[str, tuple]):
        """``(loss, surrogate loss)`` from a particle's scaled NLL and KL by site (``closed_form``'s sites, ``(loc,
        scale, t)`` against Normal(0, t), computed together), added to this call's terms; a replayed step's
        terms go through it too."""
        kl = sum_site_kls(kl_by_site, closed_form)
        weight = self.current_call.kl_weight if self.current_call is not None else self.current_kl_weight()
        surrogate_loss = nll + (kl if weight == 1.0 else weight * kl)  # 1.0 * kl is kl, in value and gradient
        loss = surrogate_loss.detach() if is_tracing() else torch_item(surrogate_loss)
        if self.current_call is not None:
            self.current_call.add(nll, kl, kl_by_site, loss, self.num_particles)
        return loss, surrogate_loss

    def loss(self, model, guide, *args, **kwargs):
        with without_trace_shapes(), self.recording(model, guide, (args, kwargs), gradients=False), torch.no_grad():
            return super().loss(model, guide, *args, **kwargs)  # (a number: no graph, no step, no word from BNN)

    def differentiable_loss(self, model, guide, *args, **kwargs):
        self._awaiting_backward = None
        with without_trace_shapes(), self.recording(model, guide, (args, kwargs), gradients=True, backward_ours=False):
            loss = super().differentiable_loss(model, guide, *args, **kwargs)
        if self._awaiting_backward is not None and getattr(loss, "requires_grad", False):
            watch_backward(loss, *self._awaiting_backward)  # marked by the caller's backward, if one comes
            watch_objective_backward(loss)  # (and the guide's record not taken for another objective's)
            _note_weight_at_backward(loss, guide, self.last_terms["kl_weight"])
        self._awaiting_backward = None
        if torch.is_grad_enabled():  # a training step's objective (Pyro's recipe for a torch optimizer): the schedule
            self.step += 1  # advances (under no_grad, a validation loss: nothing trains)
        return loss

    def loss_and_grads(self, model, guide, *args, **kwargs):
        with without_trace_shapes(), self.recording(model, guide, (args, kwargs), gradients=True):
            validating = is_validation_enabled() and not self._validation_skipped
            replayed = self.backend.terms(model, guide, args, kwargs, self.num_data, self.data_plate, validating)
            self.last_step_replayed = replayed is not None
            if replayed is None:
                loss = super().loss_and_grads(model, guide, *args, **kwargs)
                self.backend.after_full_step(model, guide, self.num_data, self.data_plate, self.num_particles)
            else:
                nll, kl_by_site, closed_form, batch_size, declared = replayed
                self.current_call.frame = Frame(batch_size, declared)  # (the plate as the model declares it)
                loss, surrogate_loss = self.account(nll, kl_by_site, closed_form)
                if getattr(surrogate_loss, "requires_grad", False):
                    (surrogate_loss / self.num_particles).backward(retain_graph=self.retain_graph)
                warn_if_nan(loss, "loss")
        self.step += 1
        note_trained_weight(guide, self.last_terms["kl_weight"])  # what summary, evidence, export and save report
        return loss

    # -- the bookkeeping of a call -------------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        """The KL schedule's step for the latest (model, guide) pair: its ``loss_and_grads`` and
        ``differentiable_loss`` calls so far (those with gradients enabled).

        Examples
        --------
        >>> pyro_bbb.ELBO(num_data=10).step
        0
        """
        return self.pairs.current.step

    @step.setter
    def step(self, value: int) -> None:
        self.pairs.current.step = value

    def current_kl_weight(self) -> float:
        """The KL weight at the current :attr:`step`; e.g. ``0.0`` at first with ``kl_weight=LinearWarmup(4)``.

        Examples
        --------
        >>> pyro_bbb.ELBO(num_data=10, kl_weight=0.5).current_kl_weight()
        0.5
        """
        return weight_at(self.kl_weight, self.step)

    @contextmanager
    def recording(self, model, guide, inputs: tuple, gradients: bool, backward_ours: bool = True):
        """One call = one set of terms (and, when it computes gradients -- by its own backward, or by the caller's
        when not ``backward_ours`` -- a mark on every parameter it reached, for the optimizer:
        :mod:`~pyro_bbb.infer.contract`); Pyro's validation on the pair's first call with ``inputs`` (``(args,
        kwargs)``) of these shapes."""
        pair = self.pairs.select(model, guide)
        self._plate_now = self._given_plate or data_plate_of(model)
        # an autoguide's values are parameters, not computed from the inputs (a list may hold an amortized part)
        self._guide_by_position = isinstance(guide, AutoGuide) and not isinstance(guide, AutoGuideList)
        self.current_call = CallTerms(self.current_kl_weight(), trains=gradients and torch.is_grad_enabled())
        validating = is_validation_enabled()
        shapes = _shapes_of(inputs) if validating else None
        try:
            skip = self._validation_skipped = validating and shapes in pair.validated_shapes and not self.revalidate
            # the parameters this call reaches: those of SVI's (or fit's) own capture of the step, else one of ours
            outer = active_param_trace() if gradients else None
            capture = poutine.trace(param_only=True) if gradients and outer is None else nullcontext()
            gradients = gradients and torch.is_grad_enabled()  # (under no_grad: no graph, no gradient to mark)
            kept = KeptGradients() if gradients and backward_ours else None  # a backward now would add onto these
            take_back = self._taking_back(pair, guide) if gradients else None
            with pyro.validation_enabled(False) if skip else nullcontext(), capture, objective_of_record():
                yield
            self.last_terms = self.current_call.finish(self.num_data)
            pair.validated = pair.validated or validating
            if validating:
                pair.validated_shapes.add(shapes)
            if gradients:
                sites = (outer or capture).trace.nodes.values()
                reached = {id(p): p for p in (unconstrained_param(site["value"]) for site in sites)}
                params = list(reached.values())
                run = ObjectiveRun(self.last_terms["num_data"] or self.last_terms["batch_size"], self.kl_weight,
                                   scale=self.current_call.scale, take_back=take_back, model_call=(model, *inputs))
                if backward_ours:  # its backward has run: onto the gradients kept when it started, if any
                    run.adds_onto(kept.runs_under(params))
                    mark_objective_run(params, run, onto=kept)
                else:  # marked by the caller's backward, if one comes
                    self._awaiting_backward = (run, params)
        finally:
            self.current_call = None

    @staticmethod
    def _taking_back(pair: PairState, guide) -> dict[Any, tuple[int, Callable[[], None]]]:
        """What undoes the training step a gradient call is about to record, should the optimizer refuse its
        gradients: the schedule's step and the guide's trained weight as they are now (keyed by what they restore,
        ordered by the call: see :class:`~pyro_bbb.infer.contract.ObjectiveRun`). It holds the pair and the guide
        weakly: the marks it rides on outlive a step whose optimizer takes none (Adam), and must not keep a dead
        model alive."""
        step, record = pair.step, kl_weight_of(guide)
        pair_ref, guide_ref = weakref.ref(pair), _reference(guide)
        order = next(_CALLS)

        def step_back() -> None:
            if (pair_now := pair_ref()) is not None:
                pair_now.step = step

        def record_back() -> None:
            if (guide_now := guide_ref()) is not None:
                record_kl_weight(guide_now, record)
        return {("step", id(pair)): (order, step_back), ("record", id(guide)): (order, record_back)}

    def _checked_vectorized_traces(self, model, guide, unscaled_model, args, kwargs):
        """The vectorized particles' traces, or the particles one at a time where those are not right: the first call
        compares particle 0 and the last with their draws run alone (:func:`particle_matches_alone`); where they
        differ (the model's code reads the particle dimension as its batch, or its rows read other rows), or the
        vectorized model raises (a layer that takes no draw dimensions), and at any call where a Bayesian layer gets
        rows it cannot split among the particles (:class:`~pyro_bbb._draws.UnfoldableRowsError`: a batch's rows
        selected by a mixture's gate), a warning, and the particles one at a time from then on."""
        pair = self.pairs.current
        if pair.vectorized_ok is not False:
            # torch's shape errors (e.g. its linear on a weight with draws) at the first call; at any call, a batch's
            # rows that a layer cannot split among the particles (another ValueError is a check's: the model's or
            # pyro_bbb's own, raised as it is)
            cannot_fold = (UnfoldableRowsError,) if pair.vectorized_ok else (UnfoldableRowsError, RuntimeError,
                                                                             IndexError)
            advice = (". Build the model with pyro_bbb.BNN of pyro_bbb.nn's layers, whose network sees ordinary "
                      "batches and whose layers apply every draw at once (a PyroModule with PyroSample weights of its "
                      "own gets them with extra leading dimensions), or index from the right (out[..., -1, :]).")
            put_back = buffer_restorer(unscaled_model, running_statistics_only=True)  # (an aborted pass: no update)
            try:
                traces = next(super()._get_traces(model, guide, args, kwargs))
            except cannot_fold as error:
                first_line = str(error).strip().split("\n")[0]  # (without Pyro's table of trace shapes)
                if isinstance(error, UnfoldableRowsError):  # (its message says why, in full)
                    advice = ", which is slower but right."
                else:
                    first_line = first_line[:200]
                traces, what = None, f"the vectorized model raised {type(error).__name__}: {first_line.rstrip('.')}"
            else:
                what = ("particle 0 or the last of the vectorized model differs from the same weight draw run alone "
                        "(the model's code reads the particle dimension as its batch, or its rows read other rows, "
                        "e.g. h - h[:1], a cumsum or statistics over the batch)")
            pair.vectorized_ok = traces is not None and (pair.vectorized_ok or particle_matches_alone(
                vectorized_model(self, unscaled_model), unscaled_model, traces[1], self.max_plate_nesting, args,
                kwargs))
            if pair.vectorized_ok:
                yield traces
                return
            put_back()
            warn_at_caller(f"pyro_bbb.ELBO(vectorize_particles=True): {what}; running the {self.num_particles} "
                           f"particles one at a time instead{advice}")
        for _ in range(self.num_particles):
            yield self._get_trace(model, guide, args, kwargs)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_data={self.num_data}, kl_weight={self.kl_weight!r}, "
                f"num_particles={self.num_particles}, vectorize_particles={self.vectorize_particles}, "
                f"data_plate={self.data_plate!r})")


def _note_weight_at_backward(loss: torch.Tensor, guide: Any, weight: float) -> None:
    """The guide is trained at ``weight`` when the caller's backward of ``loss`` (or ``torch.autograd.grad``) runs:
    a loss only looked at, with gradients on, trains nothing."""
    guide_ref = _reference(guide)

    def at_backward(grad: torch.Tensor) -> torch.Tensor:
        if (guide_now := guide_ref()) is not None:
            note_trained_weight(guide_now, weight)
        return grad
    loss.register_hook(at_backward)


# -- what the ELBO keeps for each (model, guide) pair ------------------------------------------------------------------
#: How many first training calls of a (model, guide) pair note their observations for minibatches without an N,
#: and how many different sets of observations among them make the warning.
MINIBATCH_WATCH, MINIBATCH_DISTINCT = 20, 4


def _observations_key(trace, frame) -> int:
    """A key of the values observed inside the data plate ``frame`` in ``trace``, as a multiset: a hash of their
    sorted values (float64, NaN as one value), equal for the same rows in any order."""
    values = [torch.as_tensor(site["value"]).detach().reshape(-1).double().cpu() for site in trace.nodes.values()
              if site["type"] == "sample" and site["is_observed"] and frame in site["cond_indep_stack"]]
    if not values:
        return 0
    observed = torch.cat(values).sort().values + 0.0  # (-0.0 as 0.0: they sort as equals, in either order)
    return hash((observed.nan_to_num(nan=0.0).numpy().tobytes(), observed.isnan().numpy().tobytes()))


def _shapes_of(inputs: Any) -> tuple:
    """The shapes and dtypes of the tensors in ``inputs`` (nested tuples, lists and dicts; anything else by type):
    what decides whether a call needs Pyro's validation again."""
    if isinstance(inputs, torch.Tensor):
        return (tuple(inputs.shape), inputs.dtype)
    if isinstance(inputs, tuple | list):
        return tuple(_shapes_of(item) for item in inputs)
    if isinstance(inputs, dict):
        return tuple((key, _shapes_of(value)) for key, value in inputs.items())
    return (type(inputs).__name__,)


class PairState:
    """One pair's KL schedule ``step``, whether it was ``validated`` (and for inputs of which ``validated_shapes``),
    ``vectorized_ok`` (``None``: not checked), and
    what the minibatch watch saw (``watched`` calls, the keys of the observations ``seen``).

    Examples
    --------
    >>> PairState(None, None).validated
    False
    """

    def __init__(self, model, guide):
        self.step, self.validated, self.vectorized_ok = 0, False, None
        self.validated_shapes: set[tuple] = set()
        self.watched, self.seen = 0, set()
        parts = pair_identity(model, guide)
        self._refs = tuple(_reference(obj) for obj in parts)
        self._held = tuple(ref for ref, obj in zip(self._refs, parts) if obj is not None)

    def holds(self, model, guide) -> bool:
        """Whether this is the state of ``(model, guide)``."""
        return all(ref() is obj for ref, obj in zip(self._refs, pair_identity(model, guide), strict=True))

    def alive(self) -> bool:
        """Whether its model and guide still exist."""
        return all(ref() is not None for ref in self._held)


class PairStates:
    """The states of the pairs an ELBO has seen, and the current one (a fresh state before any call): what one pair
    learned never stands for another's.

    Examples
    --------
    >>> PairStates().current.step
    0
    """

    def __init__(self):
        self._states: dict[tuple[int, int], PairState] = {}
        self.current = PairState(None, None)

    def select(self, model, guide) -> PairState:
        """Make ``(model, guide)``'s state current (a new one for a new pair) and return it."""
        key = tuple(id(obj) for obj in pair_identity(model, guide))
        state = self._states.get(key)
        if state is None or not state.holds(model, guide):
            self._states = {k: v for k, v in self._states.items() if v.alive()}
            state = self._states[key] = PairState(model, guide)
        self.current = state
        return state


_CALLS = itertools.count()  # the order of gradient calls, for what a refused step takes back


def pair_identity(model, guide) -> tuple:
    """The objects that say which ``(model, guide)`` a call is for, alike from call to call: a bound method's
    object and function (``self.model`` is a new method object at every access) and the function inside Pyro's
    handlers (``poutine.scale(model, 0.5)`` made anew each step). With the method objects, a KL schedule never left
    its first step.

    Examples
    --------
    >>> def model():
    ...     pass
    >>> pair_identity(poutine.scale(model, 0.5), model) == (model, None, model, None)
    True
    """
    parts = []
    for obj in (model, guide):
        obj = unwrap_handlers(obj)
        parts.extend((obj.__self__, obj.__func__) if isinstance(obj, MethodType) else (obj, None))
    return tuple(parts)


def loss_scale(model_trace, guide_trace, num_data: int | None = None, data_plate: str = DATA_PLATE) -> float | None:
    """The factor a handler such as ``poutine.scale(model, s)`` with ``poutine.scale(guide, s)`` multiplies the whole
    loss by: the scale every global latent site has in both traces (``1.0`` without a handler: the observed sites'
    own weights, per datum or tempering, are then the likelihood's business). Where it is not 1, every observed site
    must carry it too beyond the data plate's own ``N / B``; ``None`` where they differ (the model and the guide
    scaled unalike, or a KL annealed by ``poutine.scale`` around the weights alone): a KL weight nobody chose.

    Examples
    --------
    >>> def model():
    ...     pyro.sample("w", pyro.distributions.Normal(0.0, 1.0))
    >>> trace = poutine.trace(poutine.scale(model, 0.5)).get_trace()
    >>> loss_scale(trace, trace), loss_scale(trace, poutine.trace(model).get_trace())
    (0.5, None)
    """
    def numbers(sites, data_scale) -> list[float | None]:
        return [float(site["scale"]) / data_scale(site)
                if not isinstance(site["scale"], torch.Tensor) or site["scale"].numel() == 1 else None
                for site in sites]

    def plate_scale(site) -> float:  # what the data plate (or the ELBO's N / B) puts on an observed site
        frame = data_plate_frame(site, data_plate)
        if frame is None:
            return 1.0
        if (frame.full_size or frame.size) != frame.size:
            return frame.full_size / frame.size
        return num_data / frame.size if num_data is not None else 1.0

    latent = numbers([site for trace in (model_trace, guide_trace) for site in trace.nodes.values()
                      if site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(site)
                      and data_plate_frame(site, data_plate) is None], lambda site: 1.0)
    if not latent:
        return 1.0
    first = latent[0]
    if first is None or not all(value is not None and math.isclose(value, first, rel_tol=1e-6) for value in latent):
        return None
    if first == 1.0:
        return 1.0
    observed = numbers([site for site in model_trace.nodes.values()
                        if site["type"] == "sample" and site["is_observed"]], plate_scale)
    if all(value is not None and math.isclose(value, first, rel_tol=1e-6) for value in observed):
        return first
    return None


def _reference(obj) -> Callable[[], Any]:
    """A weak reference where the object allows one (a module, a function), else a strong one."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _particle(value: torch.Tensor, index: int, event_dim: int, max_plate_nesting: int) -> torch.Tensor:
    """A vectorized site's value at particle ``index`` (-1: the last), without the particle dimension or leading
    singletons."""
    batch_dims = value.dim() - event_dim
    if batch_dims >= max_plate_nesting:
        value = value.select(batch_dims - max_plate_nesting, index)
    while value.dim() > event_dim and value.shape[0] == 1:
        value = value[0]
    return value


@torch.no_grad()
def particle_matches_alone(vectorized_model, model, guide_trace, max_plate_nesting, args, kwargs) -> bool:
    """Whether the observed log-densities of particle 0, and of the last particle, equal those of their weight draws
    run without the plate (both with the estimators' handlers hidden: Flipout's signs are not part of the draw): a
    model whose rows read earlier rows (and so the particles folded before them) differs at the last. The runs start
    from one state of the random generators, left as it was: a minibatch the model draws (a subsampled
    ``pyro.plate``, ``torch.randperm``) is the same rows in each, and training draws what it would have drawn
    without the check.

    Examples
    --------
    >>> import pyro
    >>> def model():
    ...     pyro.sample("y", pyro.distributions.Normal(0.0, 1.0), obs=torch.tensor(0.5))
    >>> trace = poutine.trace(lambda: None).get_trace()
    >>> particle_matches_alone(model, model, trace, 1, (), {})
    True
    """
    draws = {name: site["value"] for name, site in guide_trace.iter_stochastic_nodes()}
    try:
        with poutine.block(hide_types=["bayesian_affine", "bayesian_affine_map"]), poutine.block():
            with rng_untouched():
                together = poutine.trace(poutine.condition(vectorized_model, data=draws)).get_trace(*args, **kwargs)
            alone = {}
            for index in (0, -1):
                particle = {name: _particle(value, index, guide_trace.nodes[name]["fn"].event_dim, max_plate_nesting)
                            for name, value in draws.items()}
                with rng_untouched():
                    alone[index] = poutine.trace(poutine.condition(model, data=particle)).get_trace(*args, **kwargs)
    except (RuntimeError, ValueError, IndexError):
        return False
    for name, site in together.nodes.items():
        if site["type"] != "sample" or not site["is_observed"]:
            continue
        for index, trace in alone.items():
            vectorized = _particle(site["fn"].log_prob(site["value"]), index, 0, max_plate_nesting)
            single = trace.nodes[name]["fn"].log_prob(trace.nodes[name]["value"])
            if vectorized.numel() != single.numel() or not torch.allclose(
                vectorized.reshape(-1), single.reshape(-1), rtol=1e-4, atol=1e-4
            ):
                return False
    return True
