"""``fit``: minibatch Bayes-by-Backprop with the KL scaled for you, a progress bar, and a per-layer history.

Examples
--------
>>> x, y = torch.randn(100, 3), torch.randn(100)
>>> bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian())
>>> guide = pyro_bbb.MeanFieldGuide(bnn)
>>> history = pyro_bbb.fit(bnn, guide, (x, y), epochs=2, batch_size=32, progress=False, seed=0)
>>> len(history), sorted(history.last["kl_by_layer"])
(2, ['likelihood.scale', 'net'])
"""

from __future__ import annotations

import math
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from numbers import Integral
from typing import Any

import numpy as np
import pyro
import pyro.poutine as poutine
import torch
from pyro.infer.autoguide import AutoGuideList
from pyro.optim import PyroOptim
from pyro.optim.lr_scheduler import PyroLRScheduler
from tqdm.auto import tqdm
from tqdm.notebook import tqdm_notebook

from .._checks import check_count, check_positive, is_set_up
from .._inputs import input_tensors, inputs_to, model_dtype, num_rows, select_rows
from .._internals import without_trace_shapes
from .._rng import rng_untouched
from .._warnings import warn_at_caller
from ..data.batches import Batches, DataError, check_batch, likelihood_of, loader_rows, model_device
from ..data.provenance import fraction_seen_in_training, remember_training_inputs
from ..evaluate import metrics
from ..evaluate.diagnostics import layer_summary
from ..infer.elbo import ELBO
from ..infer.guide import has_site_posteriors, normal_site_parts, point_estimate_parts
from ..infer.outside_training import objective_of_record
from ..infer.schedules import Constant, LinearWarmup, Schedule
from ..infer.tempering import KLWeightChoice, kl_weight_of, record_kl_weight
from ..likelihoods import Bernoulli, Categorical, TargetError
from ..nn.module import buffers_kept, parts_trained_in_evaluation_mode, training_mode
from ..optim import IVON
from ..optim import Adam as JointAdam
from ..prediction.predictive import predict
from ..prediction.results import ClassificationPrediction, RegressionPrediction
from . import distributed as distributed_
from .history import History
from .selection import ParameterSnapshot, SelectKLWeight, choose_weight, run_path, validation_splits
from .step import TrainingDivergedError, TrainingStep, default_adam_rate
from .stopping import EarlyStopping
from .warm_start import can_warm_start, map_warm_start

__all__ = ["fit"]


def _check_guide_saw_the_targets(model, guide) -> None:
    """A guide first called without ``y`` took the observation for a latent variable: say so before training."""
    site = getattr(getattr(model, "likelihood", None), "site", None)
    prototype = getattr(guide, "prototype_trace", None)
    if site is None or prototype is None or site not in prototype.nodes:
        return
    if not prototype.nodes[site]["is_observed"]:
        raise ValueError(
            f"the guide was set up by a call without targets (guide(x) or predict before fit), so Pyro made the "
            f"observation {site!r} a latent variable of the guide. Build a new guide (e.g. "
            f"pyro_bbb.MeanFieldGuide(model)) and let fit set it up with the targets."
        )


def _validation_metrics(model, guide, data, num_samples: int) -> dict[str, float]:
    x, y = data
    pred = predict(model, guide, x, num_samples=num_samples)
    y = y.to(pred.samples.device)
    out = {"val_log_likelihood": metrics.log_likelihood(pred, y)}
    if isinstance(pred, RegressionPrediction):
        out["val_rmse"] = metrics.rmse(pred, y)
    elif isinstance(pred, ClassificationPrediction):
        out["val_accuracy"] = metrics.accuracy(pred, y)
        out["val_ece"] = metrics.expected_calibration_error(pred, y)
    return out


@objective_of_record()  # (its MAP warm start's backward passes too: they train the posterior it records)
def fit(
    model: Callable,
    guide: Callable,
    data: tuple[torch.Tensor, torch.Tensor] | torch.utils.data.DataLoader,
    *,
    epochs: int,
    batch_size: int | None = None,
    optimizer: PyroOptim | None = None,
    lr: float | None = None,
    lr_final: float | None = None,
    kl_weight: float | Callable[[int], float] | str | SelectKLWeight = "auto",
    num_particles: int = 1,
    clip_norm: float | None = None,
    estimator: str = "reparam",
    validation_data: tuple[torch.Tensor, torch.Tensor] | None = None,
    callbacks: Iterable[Callable[[int, History], bool | None]] = (),
    progress: bool = True,
    seed: int | None = None,
    num_validation_samples: int = 32,
    distributed: bool = False,
    early_stopping: EarlyStopping | None = None,
) -> History:
    """Train ``guide`` on ``model`` by minibatch variational inference; the KL is scaled to the data for you.

    The training-set size ``N`` is read from ``data``, and :class:`pyro_bbb.ELBO` scales every minibatch
    (including a last, partial one) by ``N / B``: nothing is divided by hand. The data is checked first (equal
    lengths, no NaN, labels the likelihood accepts): a bad input raises ``ValueError`` before any parameter
    changes. A NaN or infinite loss stops training with :class:`TrainingDivergedError` and restores the
    parameters to the last state whose loss was finite. A model (or a BNN's net) left in evaluation mode trains in
    training mode (dropout on); a part put in evaluation mode by hand in a net in training mode (a pretrained body,
    its batch norm statistics frozen) stays in it. Each module gets its own mode back after.

    Parameters
    ----------
    model, guide : callable
        E.g. :class:`pyro_bbb.BNN` and :class:`pyro_bbb.MeanFieldGuide`; called as ``model(x, y)``.
    data : (x, y) or DataLoader
        Training data; a pair is reshuffled into batches of ``batch_size`` every epoch (``None``: full batch).
        ``x`` may be a tensor, a tuple of tensors or a dict of tensors (a transformers ``BatchEncoding``) with a
        common first dimension (each row one datum); a DataLoader yields ``(x, y)`` pairs of those. A DataLoader's
        N is the rows its sampler draws from (a ``SubsetRandomSampler``'s indices); with a ``batch_sampler`` of your
        own, the dataset's size (a warning says so when an epoch draws fewer rows: use a ``Subset``).
    epochs : int
        Passes over the data.
    optimizer : pyro.optim.PyroOptim, optional
        Defaults to :class:`pyro_bbb.optim.Adam` with ``lr`` (the same updates as ``pyro.optim.Adam``, one
        optimizer call per step). A Pyro learning-rate scheduler (``pyro.optim.ExponentialLR``, ...) is stepped
        once per epoch, as in Pyro's examples (``ReduceLROnPlateau`` on the validation NLL, else the loss per datum):
        do not step it in a callback too.
    lr : float, optional
        The default Adam's learning rate, 1e-3 (the first epoch's, with ``lr_final``); an ``optimizer`` brings its
        own (giving both is an error).
    lr_final : float, optional
        Decay the learning rate geometrically, epoch by epoch, from ``lr`` (a :mod:`pyro_bbb.optim` optimizer's own
        rate) in the first epoch to ``lr_final`` in the last. A converged ELBO needs it with minibatches (their
        noise keeps a constant step from settling), and a heteroscedastic likelihood needs it to stay stable: as the
        learned noise shrinks, a constant step moves the predictions by more than the noise. A given optimizer has
        its own rate back when ``fit`` returns or raises.
    kl_weight : "auto", SelectKLWeight, float or schedule
        Weight of the KL. ``"auto"`` (the default, :class:`~pyro_bbb.train.selection.SelectKLWeight` with its
        defaults) chooses it from the data: candidates 1, 0.1 and 0.01 are compared on a split carved from
        the training data (10%, stratified by class) after a MAP warm start of the posterior means on the rest
        (:mod:`pyro_bbb.train.warm_start`), weight 1 is kept whenever it predicts as well (within a standard
        error), and the model is then trained on all the data at the chosen weight (see
        :mod:`pyro_bbb.train.selection`; the warm start and the path cost about 0.6 of ``epochs`` more, and
        more for a fit under 40 epochs, whose warm start is at least 10 epochs; ``SelectKLWeight(final_epochs=...)``
        shortens the final fit, and the History holds its epochs).
        ``kl_weight=1`` trains the Bayes posterior (the ELBO); another number or a schedule
        (:mod:`pyro_bbb.infer.schedules`) is used as given (a schedule from its step 0 in every ``fit`` call: to
        continue a warm-up, give the second call the weight it reached, or a schedule shifted by the steps taken).
        The weight used is recorded on the guide (:mod:`pyro_bbb.infer.tempering`) and in
        ``history.kl_weight_choice``. Selection needs rows it can split: tensors, or a DataLoader over a
        ``TensorDataset`` drawing each row once per epoch (:func:`~pyro_bbb.data.batches.loader_rows`; the path
        runs on its rows at its batch size, the final fit on the loader). With another DataLoader,
        ``distributed=True`` or too few rows, ``"auto"`` warns and trains at weight 1; with
        :class:`~pyro_bbb.optim.IVON` at the weight its ``ess`` sets (``num_data / ess``);
        ``history.kl_weight_choice.reason`` says why; so does a path that fails on the split but not on all the
        data (a model whose data plate must see every row). A guide trained before, at a weight chosen by
        validation or by an earlier ``fit`` on most of these rows, trains on at that weight with a warning (a
        selection would score it on rows it has seen; also from a DataLoader it could not split, not distributed);
        ``SelectKLWeight()`` chooses again. An error a step on all
        the data raises too is raised at once, with the parameters as they were.
    num_particles : int
        Weight draws per step.
    clip_norm : float, optional
        Clip the global gradient norm (all parameters together) to this value.
    estimator : str
        Gradient estimator, one of :data:`~pyro_bbb.infer.estimators.ESTIMATORS`: ``"reparam"`` (one weight draw
        per step, shared by the batch), ``"flipout"``, ``"local_reparam"`` or ``"moments"`` (deterministic
        variational inference) (see :mod:`pyro_bbb.infer.estimators`; these three need a
        :class:`~pyro_bbb.MeanFieldGuide`).
    validation_data : (x, y), optional
        Evaluated after every epoch with :func:`pyro_bbb.predict` (``num_validation_samples`` draws):
        ``val_log_likelihood`` and ``val_rmse`` or ``val_accuracy`` / ``val_ece``.
    callbacks : iterable of callables
        ``callback(epoch, history)`` after every epoch; returning ``True`` stops training (any other answer but
        ``False`` or ``None`` is said, and does not).
    progress : bool
        Show a progress bar with the loss, NLL and KL per datum (``loss = nll + kl_w * kl`` at a fixed weight; a
        schedule's steps each at their own) and the KL weight.
    seed : int, optional
        Seeds Pyro's and torch's random number generators (shuffling, weight draws).
    distributed : bool
        Data-parallel training over the ranks of an initialised ``torch.distributed`` process group (launch with
        ``torchrun``): ``batch_size`` is per rank, each rank reads its part of every global batch (a DataLoader
        should use a ``DistributedSampler``), and the update equals one process's on the global batch (see
        :mod:`pyro_bbb.train.distributed`). Use the same ``seed`` on every rank.

    Returns
    -------
    History
        Also when Ctrl-C stopped training: the current step is finished first, and ``history.interrupted`` is True.

    Raises
    ------
    ValueError, TypeError
        Bad arguments or data, before any parameter changes. A bad batch found during training (a DataLoader over a
        dataset that cannot be checked up front), or ``validation_data`` the model cannot score (found after the
        first epoch), raises :class:`DataError` with the parameters restored to their state at the start of ``fit``.
        A ``ValueError`` raised by a callback is raised the same way, the parameters (and the guide's KL-weight
        record) put back to the start of ``fit``; any other error leaves them as its step left them.
    TrainingDivergedError
        A NaN or infinite loss or gradient; the parameters are restored to the last finite state and the error's
        ``history`` holds the epochs so far.

    Examples
    --------
    See the module example; ``history.plot("history.png")`` draws the KL and posterior-std traces.
    """
    lr = default_adam_rate(lr, optimizer, "fit's")
    epochs, batch_size, num_particles, num_validation_samples, seed = _check_settings(
        epochs, batch_size, num_particles, num_validation_samples, lr, clip_norm, optimizer, seed)
    callbacks = _checked_callbacks(callbacks)
    selection = _selection_asked(kl_weight)
    by_default = isinstance(kl_weight, str)  # "auto": a guide trained before trains on (_continued)
    lr_at = _learning_rates(lr, lr_final, epochs, optimizer)
    per_layer = _check_guide(model, guide)
    batches, rank = _training_batches(model, data, batch_size, distributed, seed)
    validation_data = _validation_batch(model, validation_data, getattr(batches, "x", None))
    optimizer = optimizer or JointAdam(lr=lr)
    options = {"num_particles": num_particles, "estimator": estimator, "clip_norm": clip_norm,
               "distributed": distributed}
    likelihood = likelihood_of(model)
    _check_early_stopping(early_stopping, validation_data is not None,
                          None if likelihood is None else isinstance(likelihood, Categorical | Bernoulli), kl_weight)
    choice = None
    if selection is not None:
        fallback = _why_selection_cannot_run(batches, distributed, optimizer, selection)
        # IVON's own effective sample size sets the weight it can train at: N / ess (1 by default)
        kl_weight = optimizer.num_data / optimizer.ess if isinstance(optimizer, IVON) else 1.0
        choice = KLWeightChoice(kl_weight=kl_weight, chosen_by="fallback", reason=fallback) if fallback else None
        # a guide trained before trains on, whether or not a selection could run (a DataLoader); not distributed,
        if by_default and not isinstance(optimizer, IVON) and not distributed:  # where each process has its own
            continued = _continued(guide, batches)  # record (rows, a loaded checkpoint), and all must train alike
            if continued is not None:
                choice, kl_weight, fallback = continued, continued.kl_weight, ""
        if fallback and not isinstance(optimizer, IVON) and rank == 0:  # (IVON's weight is the user's own ess)
            _warn_fallback(fallback, put_back=False)
    step = TrainingStep(model, guide, optimizer, num_data=batches.num_data, kl_weight=kl_weight, **options)
    _warn_parts_in_evaluation_mode(model, rank)
    if seed is not None:
        pyro.set_rng_seed(seed)

    if distributed:
        step.set_up_everywhere(batches)
    start, record_before = None, kl_weight_of(guide)
    if selection is not None and choice is None:
        try:  # the path's steps record the candidates' weights on the guide; an exit that puts the parameters back
            with training_mode(model, True):  # puts the record back too
                if not is_set_up(guide):  # on a batch of all the data, as the first step would: its errors first
                    with torch.no_grad(), poutine.block(), without_trace_shapes(), buffers_kept(model):
                        guide(*next(iter(batches)))  # (batch norm's statistics as they were: the snapshot follows)
                if _has_latent_sites(guide):
                    start = ParameterSnapshot(model, guide, optimizer=optimizer)
                    rows, rows_batch_size = _rows_to_split(batches, batch_size)
                    choice = _choose_kl_weight(model, guide, rows, optimizer, selection, epochs, rows_batch_size,
                                               options, num_validation_samples, progress, seed, start, lr)
                else:
                    choice = KLWeightChoice(kl_weight=1.0, chosen_by="fallback",
                                            reason="the model has no latent weights, so the KL weight changes "
                                                   "nothing")
        except BaseException:
            record_kl_weight(guide, record_before)
            raise
        if choice.reason == _INTERRUPTED:  # nothing trained: the guide's record (if any) is still its posterior's
            record_kl_weight(guide, record_before)
            history = History()
            history.interrupted, history.kl_weight_choice = True, record_before or choice
            return history
        step = TrainingStep(model, guide, optimizer, num_data=batches.num_data, kl_weight=choice.kl_weight,
                            **options)
        if choice.chosen_by == "validation":  # the final fit's share of the epochs, its learning rates over it
            epochs = selection.final_fit_epochs(epochs)
            lr_at = _learning_rates(lr, lr_final, epochs, optimizer)
    record = _EpochRecorder(model, guide, step.elbo, batches.num_data, per_layer, validation_data,
                            num_validation_samples)
    lr_given = optimizer.defaults["lr"] if lr_at is not None else None
    if choice is not None:  # the chosen weight is the posterior's from here on: a callback's save writes it
        record_kl_weight(guide, choice)
        choice = kl_weight_of(guide) or choice  # (as recorded: a point-estimate guide says so)
    try:
        with training_mode(model, True):
            history = _train(step, batches, record, epochs, callbacks, progress and rank == 0, distributed,
                             lr_at, early_stopping, choice)
    except (DataError, ValueError):  # the parameters go back to the start of fit, before the selection's path too
        if start is not None:
            start.restore()
        else:
            step.restore_initial()
        record_kl_weight(guide, record_before)  # (the ELBO recorded the weights it trained at)
        raise
    except BaseException:  # the parameters as the steps left them (a diverged run: the last finite state)
        if step.updates == 0 and (start is None or choice.chosen_by == "fallback"):  # (a fallback put them back)
            record_kl_weight(guide, record_before)  # as at the start of fit: nothing it trained is kept
        else:  # trained on these rows, what the next fit and fit_temperature must know
            remember_training_inputs(guide, _training_inputs(batches))
        raise
    finally:  # lr_final's schedule is this fit's: the optimizer keeps the rate it was given, for the next fit
        if lr_given is not None:
            optimizer.set_learning_rate(lr_given)
    remember_training_inputs(guide, _training_inputs(batches))  # (a fit that put the parameters back trained none)
    if isinstance(kl_weight, LinearWarmup) and 0 < step.schedule_step < kl_weight.warmup_steps and not (
            history.interrupted or history.stopped_epoch):
        warn_at_caller(
            f"fit ended {step.schedule_step} steps into {kl_weight!r}, part-way up its ramp: the posterior is "
            f"tempered at KL weight {kl_weight(step.schedule_step - 1):.3g}, not {kl_weight.end:g}. Give warmup_steps "
            "fewer than the fit's steps (epochs times batches per epoch), or train longer."
        )
    if choice is None:  # a number or a schedule: the weight of the epoch the parameters are from (the last one, or
        # the one early stopping put back); before any step, a number's own
        given = float(kl_weight) if isinstance(kl_weight, int | float) else 1.0
        restored = early_stopping is not None and early_stopping.restore_best and history.best_epoch is not None
        kept = history.best_epoch if restored else len(history)
        choice = KLWeightChoice(kl_weight=float(history["kl_weight"][kept - 1]) if kept else given)
    record_kl_weight(guide, choice)
    history.kl_weight_choice = kl_weight_of(guide) or choice  # (as recorded: a point-estimate guide says so)
    return history


# -- fit's chapters ---------------------------------------------------------------------------------------------
def _checked_callbacks(callbacks) -> list:
    """``callbacks`` as a list of callables, or a ``TypeError`` before anything trains (a lone function, or a None in
    the list, failed after the whole selection, or after the first epoch)."""
    if callable(callbacks):
        raise TypeError("callbacks must be a list of callables, e.g. callbacks=[my_callback]; got one callable.")
    try:
        callbacks = list(callbacks)
    except TypeError:
        raise TypeError(f"callbacks must be a list of callables, e.g. callbacks=[my_callback]; got "
                        f"{type(callbacks).__name__}.") from None
    for callback in callbacks:
        if not callable(callback):
            raise TypeError(f"callbacks must be a list of callables (callback(epoch, history)); got "
                            f"{type(callback).__name__} among them.")
    return callbacks


def _selection_asked(kl_weight) -> SelectKLWeight | None:
    """The selection ``kl_weight`` asks for, or ``None`` for a number or a schedule (checked by the ELBO)."""
    if isinstance(kl_weight, SelectKLWeight):
        return kl_weight
    if isinstance(kl_weight, str):
        if kl_weight != "auto":
            raise ValueError(
                f'kl_weight must be "auto" (chosen from the data), a number (1: the Bayes posterior), a schedule or '
                f"a pyro_bbb.train.SelectKLWeight, got {kl_weight!r}."
            )
        return SelectKLWeight()
    return None


def _has_latent_sites(guide) -> bool:
    """Whether the (set-up) guide has a latent site: without one there is no KL to weigh (``True`` when unknown)."""
    prototype = getattr(guide, "prototype_trace", None)
    if prototype is None:
        return True
    return any(not site["is_observed"] for _, site in prototype.iter_stochastic_nodes())


def _why_selection_cannot_run(batches, distributed: bool, optimizer, selection: SelectKLWeight) -> str:
    """Why ``kl_weight="auto"`` must train at weight 1 instead ("" when it can choose)."""
    if distributed:
        return "distributed training; choose the KL weight in one process and pass it"
    if getattr(batches, "loader", None) is not None and loader_rows(batches.loader) is None:
        return ("this DataLoader's rows cannot be read without iterating it (a dataset other than a TensorDataset, "
                "a weighted or custom sampler, or a collate_fn of its own), so they cannot be split; pass (x, y) "
                "tensors to choose the KL weight")
    if isinstance(optimizer, IVON):
        return "IVON trains at the KL weight its ess sets (num_data / ess)"
    return ""


def _training_inputs(batches) -> Any:
    """The inputs of the training rows: the tensors', or those of a DataLoader whose rows can be read (else
    ``None``: unknown)."""
    loader = getattr(batches, "loader", None)
    return getattr(batches, "x", None) if loader is None else (loader_rows(loader) or [None])[0]


#: The share of the rows a guide was trained on (by ``fit``) from which ``"auto"`` trains on (:func:`_continued`)
_MOSTLY_SEEN = 0.5


def _continued(guide, batches) -> KLWeightChoice | None:
    """How ``fit``'s default ``"auto"`` trains a guide that was already trained at a weight it recorded (a positive
    one) and that would be scored on rows it has seen: its earlier weight was chosen by validation (an earlier
    ``"auto"``, or a checkpoint of one: fitting again trains longer), or an earlier ``fit`` trained it on most of
    these rows. It trains on at that weight (the earlier choice kept, saying so), with a warning naming the fix.
    ``None``: it chooses (a guide never trained, or trained on other rows by a loop or at a weight of one's own)."""
    earlier = kl_weight_of(guide)
    if earlier is None or not earlier.kl_weight > 0:
        return None
    if earlier.chosen_by == "validation":
        why = "its KL weight was chosen by validation before (an earlier fit, or its checkpoint)"
    else:  # (the rows are fingerprinted only here: a record chosen by validation decides alone)
        seen = fraction_seen_in_training(guide, _training_inputs(batches))
        if seen is None or seen < _MOSTLY_SEEN:
            return None
        why = f"an earlier fit trained it on {seen:.0%} of these rows"
    weight = earlier.kl_weight
    warn_at_caller(f"fit(kl_weight='auto') did not choose the KL weight again: {why}, and a selection now would score "
                   f"the candidates on rows it has seen. Training on at KL weight {weight:g}, the one it was trained "
                   f"at; pass kl_weight={weight:g} to say so and silence this, or "
                   "kl_weight=pyro_bbb.train.SelectKLWeight() to choose again (best from a fresh guide).")
    if earlier.chosen_by == "validation":
        return replace(earlier, reason="trained on at it by a later fit (a new selection would score it on rows it "
                                       "has seen)")
    return KLWeightChoice(kl_weight=weight, chosen_by="fallback",
                          reason=f"{why}, so a selection would score the candidates on rows it has seen")


def _rows_to_split(batches, batch_size):
    """The rows the selection carves its split from, and their batch size: the tensors themselves, or the rows and
    batch size of a DataLoader that :func:`~pyro_bbb.data.batches.loader_rows` can read (its final fit is the
    loader's own)."""
    if getattr(batches, "loader", None) is None:
        return batches, batch_size
    rows = Batches(loader_rows(batches.loader), batches.loader.batch_size, batches.likelihood, batches.device,
                   batches.dtype)
    return rows, batches.loader.batch_size


_INTERRUPTED = "interrupted (Ctrl-C) while choosing"
#: What a model raises on data it cannot take (torch raises RuntimeError for shapes, IndexError for rows)
_MODEL_ERRORS = (ValueError, TypeError, IndexError, RuntimeError)


def _warn_fallback(reason: str, put_back: bool = True) -> None:
    """Say, at the user's ``fit`` call, that ``kl_weight="auto"`` could not choose."""
    where = "The parameters were put back; training" if put_back else "Training"
    warn_at_caller(f"fit(kl_weight='auto') did not choose the KL weight: {reason.rstrip('.')}. {where} at KL weight "
                   "1 (the Bayes posterior) on all the data instead; pass kl_weight=1 to say so and silence this.")


def _too_few_held_out(num_data: int, held_out: int, selection: SelectKLWeight, stratified: bool) -> str:
    """Why no validation split of at least two rows (with two left to train on) could be held out: the rows, the
    share asked for, or (a classifier's split keeps each class's share) classes too small to give a row each."""
    why = (f"too few rows to hold out a validation split: {num_data} training rows with "
           f"SelectKLWeight(validation_fraction={selection.validation_fraction:g}"
           f"{f', folds={selection.folds}' if selection.folds > 1 else ''}) hold out {held_out} row(s) for validation, "
           "and the choice needs at least 2 (and 2 to train on)")
    if stratified:
        why += ("; the split is stratified, each class giving its own share (rounded), so classes of a few rows each "
                "give none")
    return why + ": give more rows or a larger validation_fraction"


def _choose_kl_weight(model, guide, batches, optimizer, selection: SelectKLWeight, epochs: int, batch_size,
                      options: dict, num_samples: int, progress: bool, seed,
                      start: ParameterSnapshot, lr: float) -> KLWeightChoice:
    """The selection path on a split carved from ``batches`` (see :mod:`pyro_bbb.train.selection`); leaves the
    parameters (and a pyro_bbb optimizer's state) where the chosen weight's run left them.

    A path that cannot run on the split (a step that fails, e.g. a hand-written model whose data plate must see every
    row, or a run that diverges) puts every parameter back as it was, warns, and falls back to weight 1 on all the
    data. An error that a step on all the data raises too (the model's or the estimator's, not the split's) is raised
    at once instead, with the parameters as they were. Ctrl-C ends it with the parameters as they were.
    """
    classes = isinstance(likelihood_of(model), Categorical | Bernoulli)
    generator = torch.Generator().manual_seed(seed if seed is not None else int(torch.randint(2**31, ())))
    one_label_per_row = batches.y.dim() == 1 or tuple(batches.y.shape[1:]) == (1,)  # (N,) or (N, 1) labels
    splits = validation_splits(batches.y, selection.validation_fraction, selection.folds,
                               stratify=classes and one_label_per_row, generator=generator)
    if any(len(held_out) < 2 or len(train_rows) < 2 for train_rows, held_out in splits):
        reason = _too_few_held_out(batches.num_data, min(len(held_out) for _, held_out in splits), selection,
                                   stratified=classes and one_label_per_row)
        _warn_fallback(reason, put_back=False)
        return KLWeightChoice(kl_weight=1.0, chosen_by="fallback", reason=reason)
    live = progress and _live_display()
    bar = tqdm(total=len(selection.candidates) * len(splits), desc="choosing kl_weight", unit="weight",
               disable=not live, dynamic_ncols=True, mininterval=0.5)
    shown = {}
    fold = {}  # this split's training rows and held-out rows

    def train_at(weight: float, phase_epochs: int) -> None:
        part = fold["part"]
        step = TrainingStep(model, guide, optimizer, num_data=part.num_data, kl_weight=weight, **options)
        record = _EpochRecorder(model, guide, step.elbo, part.num_data, False, None, num_samples)
        if _train(step, part, record, phase_epochs, [], False, False, step_scheduler=False).interrupted:
            raise KeyboardInterrupt

    def score() -> torch.Tensor:
        x_held, y_held = fold["held_out"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pred = predict(model, guide, inputs_to(x_held, batches.device), num_samples=num_samples,
                           batch_size=batch_size)
        for warning in caught:  # predict's words, said as fit's (the user called fit, which scores with predict)
            warn_at_caller(str(warning.message).replace("predict: ", "fit, scoring the KL weight's candidates: ", 1),
                           warning.category)
        log_density = metrics.log_likelihood(pred, y_held.to(pred.samples.device), reduction="none")
        log_density = log_density.detach().cpu().double()
        return torch.where(torch.isfinite(log_density), log_density, -math.inf)  # a NaN prediction is never chosen

    def report(weight: float, nll: float) -> None:
        shown[f"{weight:g}"] = f"{nll:.3g}"
        bar.set_postfix(shown, refresh=False)
        bar.update()
        if progress and not live:
            _print_line("choosing kl_weight", {"validation NLL": f"{nll:.3g}", "kl_weight": f"{weight:g}"})

    warm_epochs = selection.warm_start_epochs(epochs) if can_warm_start(guide) else 0
    scores: dict[float, list[torch.Tensor]] = {weight: [] for weight in selection.candidates}
    try:
        with without_trace_shapes():  # (a failure's reason in one line, without Pyro's shape tables)
            for number, (train_rows, held_out) in enumerate(splits):
                if number:  # every split's run from the same start
                    start.restore()
                fold["part"] = Batches((select_rows(batches.x, train_rows), batches.y[train_rows]), batch_size,
                                       batches.likelihood, batches.device, batches.dtype)
                fold["held_out"] = select_rows(batches.x, held_out), batches.y[held_out]
                if warm_epochs:
                    epochs_text = f"{warm_epochs} epoch{'s' if warm_epochs > 1 else ''}"
                    bar.set_postfix_str(f"MAP warm start, {epochs_text}")
                    if progress and not live:
                        _print_line("choosing kl_weight", {"MAP warm start": epochs_text})
                    with _InterruptAtOnce():  # (everything is put back: no step need finish)
                        map_warm_start(model, guide, fold["part"], epochs=warm_epochs,
                                       lr=_learning_rate_of(optimizer, lr), prior_weight=min(selection.candidates))
                fold_scores, snapshots = run_path(selection, train_at, score,
                                                  lambda: ParameterSnapshot(model, guide, optimizer=optimizer), epochs,
                                                  report)
                for weight, log_densities in fold_scores.items():
                    scores[weight].append(log_densities)
        chosen, nll, se = choose_weight({weight: torch.cat(parts) for weight, parts in scores.items()})
    except KeyboardInterrupt:
        start.restore()
        return KLWeightChoice(kl_weight=1.0, chosen_by="fallback", reason=_INTERRUPTED)
    except (DataError, TargetError) as error:  # bad rows of the split are bad rows of the data: say so now
        start.restore()
        message = str(error).split(" The parameters (and a pyro_bbb optimizer's state) were restored")[0]
        raise DataError(f"{message} The parameters (and a pyro_bbb optimizer's state) were restored to their state "
                        "at the start of fit.") from error
    # a model the split breaks, or a run that diverged (TrainingDivergedError is a FloatingPointError)
    except (*_MODEL_ERRORS, FloatingPointError) as error:
        start.restore()
        # out of GPU memory is not the split's doing (out of CPU memory is a plain RuntimeError: the step on all
        # the data below runs out too, and raises it)
        if isinstance(error, torch.cuda.OutOfMemoryError):
            raise
        if not isinstance(error, FloatingPointError):  # a model that fails on all the data too: its error, now
            _raise_if_a_step_fails(TrainingStep(model, guide, optimizer, num_data=batches.num_data, **options),
                                   batches)
        reason = f"the path on a split of {fold['part'].num_data} of the {batches.num_data} rows failed: {error}"
        _warn_fallback(reason)
        return KLWeightChoice(kl_weight=1.0, chosen_by="fallback", reason=reason)
    except BaseException:  # anything else (e.g. out of memory): nothing half-trained is left behind
        start.restore()
        raise
    finally:
        bar.close()
    if not math.isfinite(nll[chosen]):
        start.restore()
        reason = "every candidate's validation NLL was infinite or NaN"
        _warn_fallback(reason)
        return KLWeightChoice(kl_weight=1.0, chosen_by="fallback", reason=reason)
    snapshots[chosen].restore()  # the last split's run at the chosen weight
    return KLWeightChoice(kl_weight=chosen, chosen_by="validation", validation_nll=nll, validation_nll_se=se,
                          num_validation=sum(len(held_out) for _, held_out in splits), warm_start_epochs=warm_epochs)


def _raise_if_a_step_fails(step: TrainingStep, batches) -> None:
    """Raise the error a step on the first batch of all the data raises (a model or estimator error, not the split's),
    changing nothing: no parameter, no optimizer state, and the random number generators as they were."""
    with rng_untouched():
        step.check(*next(iter(batches)))


def _learning_rate_of(optimizer, lr: float) -> float:
    """The optimizer's own learning rate where it states one (a pyro_bbb optimizer's ``defaults``, a Pyro optimizer's
    argument dict), else ``fit``'s ``lr`` (1e-3 beside an optimizer, which refuses an ``lr`` of its own): the MAP
    warm start steps at it."""
    defaults = getattr(optimizer, "defaults", None)
    arguments = getattr(optimizer, "pt_optim_args", None)
    for source in (defaults, arguments):
        if isinstance(source, dict) and isinstance(source.get("lr"), int | float):
            return float(source["lr"])
    return lr


def _check_settings(epochs, batch_size, num_particles, num_validation_samples, lr, clip_norm, optimizer,
                    seed) -> tuple[int, int | None, int, int, int | None]:
    """The settings checked, the counts and the seed as Python ints (numpy's went on to torch's split raw)."""
    counts = (check_count("epochs", epochs), check_count("batch_size", batch_size, optional=True),
              check_count("num_particles", num_particles),
              check_count("num_validation_samples", num_validation_samples))
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, Integral) or not 0 <= seed < 2**32):
        raise ValueError(f"`seed` must be a whole number from 0 to 2**32 - 1 (or None), got {seed!r}.")
    check_positive("lr", lr)
    check_positive("clip_norm", clip_norm, optional=True)
    if optimizer is not None and not isinstance(optimizer, PyroOptim):
        raise TypeError(
            f"`optimizer` must be a pyro.optim optimizer such as pyro.optim.Adam({{'lr': 1e-3}}), got "
            f"{type(optimizer).__name__}."
        )
    return (*counts, None if seed is None else int(seed))


def _learning_rates(lr: float, lr_final: float | None, epochs: int, optimizer) -> Callable[[int], float] | None:
    """Epoch -> learning rate, geometric from ``lr`` (a pyro_bbb optimizer's own rate) to ``lr_final``; ``None`` for
    a constant one."""
    if lr_final is None:
        return None
    check_positive("lr_final", lr_final)
    if optimizer is not None:
        if not hasattr(optimizer, "set_learning_rate"):
            raise ValueError(
                "lr_final schedules fit's own Adam or a pyro_bbb.optim optimizer; give your optimizer its own "
                "schedule instead (e.g. pyro.optim.ClippedAdam({'lr': 1e-2, 'lrd': 0.999})), or drop optimizer=."
            )
        lr = optimizer.defaults["lr"]
    return lambda epoch: lr * (lr_final / lr) ** ((epoch - 1) / max(1, epochs - 1))


def _check_guide(model, guide) -> bool:
    """Whether the History can have per-layer columns -- decided before any step."""
    _check_guide_saw_the_targets(model, guide)
    per_layer = _has_normal_posteriors(guide)  # the per-layer history columns need a Normal posterior per weight
    if not per_layer:
        warn_at_caller(
            f"{type(guide).__name__} has no Normal posterior per weight: the History records the loss, NLL and KL "
            "but no per-layer KL or posterior std, and summary/check_posterior will not apply (they need "
            "pyro_bbb.MeanFieldGuide or AutoNormal, alone or as parts of an AutoGuideList).",
        )
    return per_layer


def _has_normal_posteriors(guide) -> bool:
    """Whether ``guide`` gives weights a Normal posterior each: it does so at every site, or it is an
    ``AutoGuideList`` with such a part (its other parts are left out of the per-layer columns: said, unless they are
    point estimates)."""
    if not isinstance(guide, AutoGuideList):
        return has_site_posteriors(guide)
    parts = _leaf_parts(guide)
    if not any(has_site_posteriors(part) for part in parts):
        return False
    points = point_estimate_parts(guide)
    unread = sorted({type(part).__name__ for part in parts
                     if not has_site_posteriors(part) and not any(part is point for point in points)})
    if unread:
        warn_at_caller(
            f"the History's per-layer columns, summary and check_posterior read this AutoGuideList's AutoNormal and "
            f"MeanFieldGuide parts only: the sites of its {', '.join(unread)} part(s) have a posterior these do not "
            "read, and are left out (summary names them in attrs['not_summarised'])."
        )
    return True


def _leaf_parts(guide) -> list:
    return [leaf for part in guide for leaf in (_leaf_parts(part) if isinstance(part, AutoGuideList) else [part])]


def _warn_parts_in_evaluation_mode(model, rank: int) -> None:
    """Parts the user left in evaluation mode train in it (dropout off, batch norm statistics frozen): said, since a
    pretrained body can arrive in it unasked (``from_pretrained`` returns one)."""
    parts = parts_trained_in_evaluation_mode(model)
    if parts and rank == 0:
        shown = ", ".join(repr(part) for part in parts[:3]) + (f" and {len(parts) - 3} more" if len(parts) > 3 else "")
        warn_at_caller(
            f"fit trains {shown} in evaluation mode, as you left {'it' if len(parts) == 1 else 'them'} (dropout off, "
            "batch norm on its running statistics, which stay as they are); call .train() on "
            f"{'it' if len(parts) == 1 else 'them'} first to train in training mode."
        )


def _training_batches(model, data, batch_size, distributed: bool, seed):
    """The epoch's batches (checked), and this process's rank."""
    device, dtype, likelihood = model_device(model), model_dtype(model), likelihood_of(model)
    if not distributed:
        return Batches(data, batch_size, likelihood, device, dtype), 0
    rank, world = distributed_.require_process_group()
    error = None
    try:  # a rank whose data fails the checks must not leave the others waiting in a collective
        batches = Batches(data, batch_size, likelihood, device, dtype, distributed=True)
    except (ValueError, TypeError) as caught:
        error = caught
    distributed_.raise_if_any_rank_failed(error)
    if batches.loader is None:
        batches = distributed_.ShardedBatches(batches.x, batches.y, batch_size or -(-batches.num_data // world),
                                              rank, world, seed or 0, device)
    return batches, rank


def _check_early_stopping(early_stopping, has_validation_data: bool, classifier: bool | None, kl_weight) -> None:
    """``early_stopping`` checked against the data and the KL weight, before anything trains."""
    if early_stopping is None:
        return
    if not isinstance(early_stopping, EarlyStopping):
        raise TypeError(
            f"early_stopping must be a pyro_bbb.EarlyStopping (e.g. EarlyStopping(patience=20)), got "
            f"{type(early_stopping).__name__}."
        )
    early_stopping.check_monitor(has_validation_data, classifier)
    if isinstance(kl_weight, Schedule) and not isinstance(kl_weight, Constant) and (
            not early_stopping.monitor.startswith("val_")):
        raise ValueError(
            f"EarlyStopping(monitor={early_stopping.monitor!r}) would compare epochs trained at different KL weights "
            f"under {kl_weight!r}: the training loss rises as the weight does, so it would stop the schedule early "
            "and put back a posterior of a weight it only passed through. Monitor a held-out metric "
            "(validation_data=..., monitor='val_log_likelihood'), or train at one KL weight."
        )
    early_stopping.reset()


def _validation_batch(model, validation_data, x_train=None):
    """``validation_data`` checked (and, against the training inputs ``x_train`` when known, the number of features
    of a table of floats -- found before training, not after the selection and a first epoch; sequences and images
    may differ in length and size) and on the model's device."""
    if validation_data is None:
        return None
    if not isinstance(validation_data, Sequence) or len(validation_data) != 2:
        raise TypeError("validation_data must be an (x, y) pair of tensors.")
    x, y = check_batch(*validation_data, likelihood_of(model), what="validation_data", dtype=model_dtype(model))
    if x_train is not None:
        def tables(inputs):
            return {name: t.shape[1] for name, t in input_tensors(inputs).items()
                    if t.dim() == 2 and t.is_floating_point()}

        train, held = tables(x_train), tables(x)
        for name in train.keys() & held.keys():
            if train[name] != held[name]:
                raise ValueError(f"validation_data's {name} has {held[name]} features, the training data's "
                                 f"{train[name]}: the same model cannot score both.")
    device = model_device(model)
    return inputs_to(x, device), y


def _callbacks_stop(callbacks, epoch: int, history: History, unclear: set[int]) -> bool:
    """Run every callback after ``epoch``; whether one returned ``True`` (or numpy's). Any other answer but
    ``False`` and ``None`` does not stop, and is said once per callback (``unclear``: those said already): a callback
    returning a loss, or a DataFrame, stopped training after its first epoch, or failed in ``bool()``."""
    stop = False
    for callback in callbacks:
        answer = callback(epoch, history)
        if isinstance(answer, torch.Tensor) and answer.dtype == torch.bool and answer.numel() == 1:
            answer = bool(answer)  # (a comparison of tensors: loss < 0.1)
        if isinstance(answer, bool | np.bool_):
            stop = stop or bool(answer)
        elif answer is not None and id(callback) not in unclear:
            unclear.add(id(callback))
            warn_at_caller(f"fit: the callback {getattr(callback, '__name__', type(callback).__name__)} returned "
                           f"{type(answer).__name__} {str(answer)[:40]!r}, not True, False or None: training stops "
                           "only on True, and went on. Return True to stop, None (or nothing) to go on.")
    return stop


def _train(stepper: TrainingStep, batches, record, epochs: int, callbacks, progress: bool, distributed: bool,
           lr_at: Callable[[int], float] | None = None,
           early_stopping: EarlyStopping | None = None, choice: KLWeightChoice | None = None,
           step_scheduler: bool = True) -> History:
    """The epochs: steps, one record per epoch, callbacks, early stopping; a bad batch, a NaN or Ctrl-C end it
    cleanly. A Pyro learning-rate scheduler steps after each epoch (``step_scheduler``; not in the selection's path,
    which trains at the rate it was given, as under ``lr_final``)."""
    history = History()
    history.kl_weight_choice = choice  # (the selection's, seen by callbacks; a number's is known at the end)
    unclear: set[int] = set()  # (the callbacks whose answer was neither a bool nor None: said once)
    live = progress and _live_display()
    bar = tqdm(range(1, epochs + 1), desc="fit", unit="epoch", disable=not live, dynamic_ncols=True,
               mininterval=0.5)
    every = max(1, math.ceil(epochs / 10))  # not a terminal (a log file): a line every tenth of the epochs
    stop = _StopAfterStep(enabled=not distributed)  # Ctrl-C ends the current step, then fit returns
    try:
        with stop:
            for epoch in bar:
                if lr_at is not None:
                    stepper.optimizer.set_learning_rate(lr_at(epoch))
                start = time.perf_counter()
                totals = {"loss": 0.0, "nll": 0.0, "kl": 0.0, "seen": 0}
                for x, y in stepper.guarded(batches):
                    stepper(x, y)
                    terms, b = stepper.elbo.last_terms, num_rows(x)
                    history.step_loss.append(stepper.global_loss / batches.num_data if distributed
                                             else terms["loss_per_datum"])
                    if b:
                        for key in ("loss", "nll", "kl"):
                            totals[key] += b * terms[key]
                        totals["seen"] += b
                    if stop.requested:
                        break
                if distributed:  # every rank's share, weighted by its data: the global batch's averages
                    totals = distributed_.all_reduce_sum(totals)
                if totals["seen"]:
                    history.append(record(epoch, totals, start, interrupted=stop.requested))
                    if step_scheduler and not stop.requested:
                        _step_lr_scheduler(stepper.optimizer, history.last)
                    if early_stopping is not None:
                        _note_for_early_stopping(early_stopping, epoch, history, stepper, distributed)
                    postfix = _postfix(history.last)
                    if early_stopping is not None and early_stopping.best_epoch is not None:
                        postfix["best"] = str(early_stopping.best_epoch)
                    bar.set_postfix(postfix, refresh=False)
                    if progress and not live and (epoch % every == 0 or epoch == epochs):
                        _print_line(f"fit: epoch {epoch}/{epochs}", postfix)
                if stop.requested:
                    history.interrupted = True
                    break
                stop_now = _callbacks_stop(callbacks, epoch, history, unclear)  # every callback runs
                if stop_now or (early_stopping is not None and early_stopping.should_stop(epoch)):
                    break
    except (DataError, TargetError) as error:
        stepper.restore_initial()
        raise DataError(
            f"{error} The parameters (and a pyro_bbb optimizer's state) were restored to their state at the start of "
            "fit."
        ) from error
    except TrainingDivergedError as error:
        error.history = history
        raise
    finally:
        bar.close()
    if early_stopping is not None:
        early_stopping.restore()
        history.best_epoch, history.stopped_epoch = early_stopping.best_epoch, early_stopping.stopped_epoch
    return history


def _step_lr_scheduler(optimizer, record: dict[str, Any]) -> None:
    """A Pyro learning-rate scheduler (``pyro.optim.ExponentialLR``, ...) steps once per epoch, as Pyro's own loops
    step it; ``ReduceLROnPlateau`` on the epoch's validation NLL, else its loss per datum."""
    if not isinstance(optimizer, PyroLRScheduler):
        return
    constructor = optimizer.pt_scheduler_constructor
    if isinstance(constructor, type) and issubclass(constructor, torch.optim.lr_scheduler.ReduceLROnPlateau):
        optimizer.step(-record["val_log_likelihood"] if "val_log_likelihood" in record else record["loss_per_datum"])
    else:
        optimizer.step()


def _live_display() -> bool:
    """Whether a progress bar can redraw in place: a terminal, or a notebook (``tqdm.auto``'s widget); a log file
    gets a line now and then instead of a carriage return per update."""
    return sys.stderr.isatty() or issubclass(tqdm, tqdm_notebook)


def _print_line(what: str, values: dict[str, str]) -> None:
    print(f"{what}: " + ", ".join(f"{key}={value}" for key, value in values.items()), file=sys.stderr, flush=True)


def _note_for_early_stopping(early_stopping: EarlyStopping, epoch: int, history: History, stepper: TrainingStep,
                             distributed: bool) -> None:
    """Show the epoch to ``early_stopping``; a metric this model does not record is an error with nothing lost.
    Distributed, it sees the mean over ranks of the monitored value, so that every rank decides alike."""
    record = history.last
    if distributed and early_stopping.monitor in record:
        _, world = distributed_.require_process_group()
        total = distributed_.all_reduce_sum({"value": record[early_stopping.monitor]})["value"]
        record = record | {early_stopping.monitor: total / world}
    try:
        early_stopping.improved(epoch, record, stepper.snapshot)
    except ValueError as error:
        stepper.restore_initial()
        raise ValueError(f"{error} The parameters were restored to their state at the start of fit.") from error


class _EpochRecorder:
    """One History record per epoch: the averaged terms, the per-layer KL and widths, the validation metrics."""

    def __init__(self, model, guide, elbo: ELBO, num_data: int, per_layer: bool, validation_data,
                 num_validation_samples: int):
        self.model, self.guide, self.elbo, self.num_data = model, guide, elbo, num_data
        self.per_layer, self.validation_data = per_layer, validation_data
        self.num_validation_samples = num_validation_samples

    def __call__(self, epoch: int, totals: dict[str, float], start: float, interrupted: bool) -> dict[str, Any]:
        seen = totals.pop("seen")
        record = {"epoch": epoch, **{key: value / seen for key, value in totals.items()}}
        record["loss_per_datum"] = record["loss"] / self.num_data
        record["kl_weight"] = self.elbo.last_terms["kl_weight"]
        record["num_data"] = self.num_data
        if self.per_layer and not normal_site_parts(self.guide):  # a guide list's Normal parts reached no site
            self.per_layer = False
            warn_at_caller(
                "the AutoGuideList's AutoNormal/MeanFieldGuide parts hold no latent site (check the names given to "
                "poutine.block's expose= or hide=): the History has no per-layer columns."
            )
        if self.per_layer:
            summary = layer_summary(self.model, self.guide, tails=False)
            record["kl_by_layer"] = {layer: entry["kl"] for layer, entry in summary.items()}
            record["posterior_std"] = {k: e["posterior_std"] for k, e in summary.items() if "posterior_std" in e}
            record["std_ratio"] = {k: e["std_ratio"] for k, e in summary.items() if "std_ratio" in e}
            record["std_ratio_geomean"] = {k: e["std_ratio_geomean"] for k, e in summary.items() if "std_ratio" in e}
            record["prior_std"] = {k: e["prior_std"] for k, e in summary.items() if "prior_std" in e}
        if self.validation_data is not None:
            try:  # its draws from a fork of the random streams: validation does not change the training run
                with rng_untouched():
                    record.update(_validation_metrics(self.model, self.guide, self.validation_data,
                                                      self.num_validation_samples))
            except _MODEL_ERRORS as error:  # fit puts the parameters back
                if isinstance(error, torch.cuda.OutOfMemoryError):  # (torch.OutOfMemoryError from torch 2.5 on)
                    raise
                raise DataError(f"validation_data could not be scored after epoch {epoch}: {error}") from error
        record["seconds"] = time.perf_counter() - start
        if interrupted:
            record["interrupted"] = True
        return record


def _postfix(record: dict[str, Any]) -> dict[str, str]:
    # every term per datum, so they add up: loss = nll + kl_w * kl (the history keeps the totals)
    n = record["num_data"]
    postfix = {"loss/datum": f"{record['loss_per_datum']:.4g}", "nll/datum": f"{record['nll'] / n:.4g}",
               "kl/datum": f"{record['kl'] / n:.4g}", "kl_w": f"{record['kl_weight']:.3g}"}
    if "val_log_likelihood" in record:
        postfix["val_ll"] = f"{record['val_log_likelihood']:.3f}"
    return postfix


class _InterruptAtOnce:
    """While active (main thread only), Ctrl-C (SIGINT) raises ``KeyboardInterrupt`` at once, as in a terminal, also in
    a process started with SIGINT ignored (a background job), which :class:`_StopAfterStep` honours too: for the MAP
    warm start, whose every parameter the selection puts back."""

    def __enter__(self):
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False


class _StopAfterStep:
    """While active (main thread only), the first Ctrl-C (SIGINT) only asks the loop to stop after the current
    step, so that no update is left half-done; a second one interrupts at once."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.requested = False
        self._previous = None

    def __enter__(self):
        if self.enabled:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        if self.enabled:
            signal.signal(signal.SIGINT, self._previous)
        return False
