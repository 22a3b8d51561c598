"""``save`` / ``load``: a fitted model and guide in one file that is safe to open.

The file holds only tensors, numbers and strings, and is read with ``torch.load(..., weights_only=True)``: a
checkpoint from a stranger cannot run code. It stores the guide's variational parameters, the model's
deterministic parameters and buffers, one example input (to rebuild the guide's sites), the settings needed to
predict and to resume training (likelihood, data plate, a :class:`pyro_bbb.BNN`'s ``num_data``), the KL weight
the posterior was trained at (:mod:`pyro_bbb.infer.tempering`) and, with ``save(..., training_rows=True)``,
fingerprints of the rows ``fit`` trained it on (:mod:`pyro_bbb.data.provenance`: what ``fit``'s ``"auto"`` and
``fit_temperature`` ask when it is loaded).

Examples
--------
>>> import os, tempfile, torch, pyro
>>> pyro.clear_param_store()
>>> bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.1))
>>> guide = pyro_bbb.MeanFieldGuide(bnn)
>>> _ = pyro_bbb.fit(bnn, guide, (torch.randn(20, 3), torch.randn(20)), epochs=1, progress=False)
>>> path = os.path.join(tempfile.mkdtemp(), "bnn.pt")
>>> pyro_bbb.save(path, bnn, guide)
>>> pyro.clear_param_store()
>>> bnn2 = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.1))
>>> guide2 = pyro_bbb.load(path, bnn2, pyro_bbb.MeanFieldGuide(bnn2))
>>> torch.equal(guide2.site_posteriors()["net.weight"].loc, guide.site_posteriors()["net.weight"].loc)
True
"""

from __future__ import annotations

import os
import weakref
import zipfile
from numbers import Integral
from typing import IO, Any

import pyro
import pyro.poutine as poutine
import torch

from ._checks import require_set_up
from ._inputs import Inputs, cast_inputs, input_tensors, inputs_to, map_inputs, model_dtype
from ._internals import module_local_params_enabled, unconstrained_param
from ._plates import data_plate_of
from ._rng import rng_untouched
from ._version import __version__
from .data.provenance import restore_training_fingerprints, training_fingerprints
from .infer.tempering import KLWeightChoice, kl_weight_of, record_kl_weight
from .nn.module import layer_priors, training_mode
from .optim import IVON, Adam

__all__ = ["save", "load"]

FORMAT = "pyro_bbb.checkpoint"
FORMAT_VERSION = 1


def _example_inputs(guide) -> list[Inputs | None]:
    """The first row of every argument the guide was set up with (enough to rebuild its sites); an argument may be
    a tensor, or a tuple or dict of tensors."""
    inputs = guide.prototype_trace.nodes["_INPUT"]
    if inputs["kwargs"]:
        raise ValueError("save supports models called with positional arguments only, e.g. model(x, y).")
    rows = []
    for arg in inputs["args"]:
        try:
            first = None if arg is None else map_inputs(lambda t: t[:1].detach().cpu().clone(), cast_inputs(arg, None))
        except TypeError:
            raise ValueError(
                f"save supports tensor arguments (or tuples and dicts of tensors) only; the model was called with a "
                f"{type(arg).__name__}."
            ) from None
        rows.append(first)
    return rows


def _settings(model) -> dict[str, Any]:
    likelihood = getattr(model, "likelihood", None)
    return {
        "model_class": type(model).__name__,
        "data_plate": data_plate_of(model),
        "likelihood": type(likelihood).__name__ if likelihood is not None else "",
        "likelihood_repr": repr(likelihood) if likelihood is not None else "",
        "num_data": _saved_num_data(model),
        "priors": {site: repr(prior) for site, prior in layer_priors(model).items()},
    }


def _comparable(prior_repr: str) -> bool:
    """Whether a prior's ``repr`` says what it is from process to process: not one naming an object by its address (a
    prior of one's own holding a function), which differs for the same prior built again."""
    return " at 0x" not in prior_repr


def _saved_num_data(model) -> int | None:
    """A model's ``num_data`` as a plain int (a :class:`pyro_bbb.BNN`'s always is), or ``None`` for anything else."""
    num_data = getattr(model, "num_data", None)
    if isinstance(num_data, Integral) and not isinstance(num_data, bool) and num_data > 0:
        return int(num_data)
    return None


#: The ``num_data`` each model got from its last :func:`load` (an N a later load replaces, not one of its own)
_NUM_DATA_LOADED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _num_data_to_load(saved: dict[str, Any], model) -> tuple[bool, int | None]:
    """Whether to set the model's ``num_data`` and to what: the training-set size a :class:`pyro_bbb.BNN` was saved
    with (the N its data plate declares to Pyro's own ELBOs, ``None`` if it had none), for a model built without one
    or holding the one an earlier load gave it; not for a model that keeps its own (built with an N, or set one
    since, e.g. to fine-tune on another data set) or has nowhere to keep it."""
    if not hasattr(model, "num_data"):
        return False, None
    current, num_data = model.num_data, saved.get("num_data")
    from_load = isinstance(model, torch.nn.Module) and model in _NUM_DATA_LOADED
    if current is not None and not (from_load and _NUM_DATA_LOADED[model] == current):
        return False, None
    return current is not None or num_data is not None, num_data


def _latent_shapes(guide) -> dict[str, list[int]]:
    """Every global latent site of the guide's model by name, with its shape: what an autoguide that packs all sites
    into one vector (``AutoDiagonalNormal``, ``AutoLowRankMultivariateNormal``) does not show by its parameters'
    shapes. (A site in a plate is left out: its shape is that of the batch it was set up with.)"""
    return {name: list(site["value"].shape) for name, site in guide.prototype_trace.iter_stochastic_nodes()
            if not any(frame.vectorized for frame in site["cond_indep_stack"])}


def _state(module) -> dict[str, torch.Tensor]:
    if not isinstance(module, torch.nn.Module):
        return {}
    return {name: value.detach() for name, value in module.state_dict().items()}


def _used_params(model, guide, inputs) -> dict[str, torch.Tensor]:
    """Every Pyro parameter one guide draw and the model replayed against it use (including ``pyro.module`` nets
    and ``pyro.param`` sites outside any module), by param-store name: unconstrained values, live."""
    # the draw must not move the user's random stream, nor the model (evaluation mode: batch norm reads its running
    # statistics, does not update them, and takes the one example row)
    with rng_untouched(), torch.no_grad(), poutine.block(), training_mode(model, False), \
            poutine.trace(param_only=True) as params:
        guide_trace = poutine.trace(guide).get_trace(*inputs)
        poutine.replay(model, trace=guide_trace)(*inputs)
    return {name: unconstrained_param(site["value"]) for name, site in params.trace.nodes.items()}


def save(path: str | os.PathLike | IO[bytes], model, guide, optimizer=None, training_rows: bool = False) -> None:
    """Write ``model``'s deterministic state and ``guide``'s posterior to ``path``.

    Everything the model and guide read from Pyro's param store is written too -- a feature net registered with
    ``pyro.module``, a learned prior scale from ``pyro.param`` -- with the values the store holds now (also after
    ``pyro.get_param_store().load(...)``).

    Parameters
    ----------
    path : str, PathLike or binary file object
        Destination file (conventionally ``.pt``), or a file object open for writing (``io.BytesIO``), as
        ``torch.save`` takes.
    model : torch.nn.Module
        The model, e.g. a :class:`pyro_bbb.BNN`.
    guide : MeanFieldGuide
        The fitted guide (any Pyro autoguide).
    optimizer : pyro_bbb.optim.Adam or IVON, optional
        Its state (moments by parameter name) is written too, so that ``load(..., optimizer=...)`` and ``fit(...,
        optimizer=...)`` resume the run where it stopped instead of restarting the moments.
    training_rows : bool
        Also write fingerprints of the rows ``fit`` trained the guide on (8 bytes a row), so that the loaded guide
        knows them: ``fit``'s ``"auto"`` then trains on at its weight on those rows instead of scoring candidates on
        them, and ``fit_temperature`` refuses them. Off by default: whoever holds the file can then test whether a
        given row was in the training data.

    Examples
    --------
    See the module example.
    """
    require_set_up(guide, "save")
    if optimizer is not None and not hasattr(optimizer, "get_state"):
        raise TypeError(f"save writes an optimizer's get_state(); {type(optimizer).__name__} has none.")
    adam = optimizer.adam if isinstance(optimizer, IVON) else optimizer  # (IVON's Adam: the other parameters')
    if optimizer is not None and module_local_params_enabled() and (
            not isinstance(adam, Adam) or adam.has_unnamed_moments()):
        raise ValueError(
            f"save(optimizer=...) under pyro.settings.set(module_local_params=True): a {type(optimizer).__name__}'s "
            "get_state keys each parameter's moments by its name in Pyro's param store, which module-local "
            "parameters do not have, so a resumed run would restart them without a word. Save without optimizer= "
            "(a resumed fit then starts fresh moments), or train with module_local_params=False to resume exactly."
        )
    if getattr(guide, "prototype_trace", None) is None:
        raise ValueError(
            f"save writes Pyro autoguides (e.g. pyro_bbb.MeanFieldGuide); {type(guide).__name__} is not one."
        )
    inputs = _example_inputs(guide)
    checkpoint = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "pyro_bbb_version": __version__,
        "settings": _settings(model),
        "example_inputs": inputs,
        "latent_shapes": _latent_shapes(guide),
        "model_state": _state(model),
        "guide_state": _state(guide),
        "param_store": {name: value.detach().clone() for name, value in _used_params(model, guide, inputs).items()},
    }
    if optimizer is not None:
        checkpoint["optimizer"] = {"class": type(optimizer).__name__, "state": optimizer.get_state()}
    choice = kl_weight_of(guide)
    if choice is not None:  # the KL weight it was trained at: a tempered posterior stays one when loaded
        checkpoint["kl_weight_choice"] = choice.to_dict()
    rows = training_fingerprints(guide) if training_rows else None
    if rows is not None:  # which rows it was trained on: fit's "auto" and fit_temperature read them when loaded
        checkpoint["training_rows"] = rows
    torch.save(checkpoint, path)


def _mismatches(saved: dict[str, Any], current: dict[str, Any], what: str, owner: str | None = None) -> list[str]:
    """The names in one map and not the other, and those of another shape: tensors, or shapes themselves."""
    owner = owner or what

    def shape(value) -> tuple[int, ...]:
        return tuple(value.shape if isinstance(value, torch.Tensor) else value)

    problems = [f"{what} {name!r} is in the checkpoint but not in the {owner}"
                for name in saved.keys() - current.keys()]
    problems += [f"{what} {name!r} is missing from the checkpoint" for name in current.keys() - saved.keys()]
    problems += [
        f"{what} {name!r}: checkpoint shape {shape(saved[name])}, {owner} shape {shape(current[name])}"
        for name in saved.keys() & current.keys()
        if shape(saved[name]) != shape(current[name])
    ]
    return sorted(problems)


_PARTS = {"settings": dict, "example_inputs": list, "model_state": dict, "guide_state": dict, "param_store": dict}


def _where(path: str | os.PathLike | IO[bytes]) -> str:
    """How an error names the checkpoint: its path, quoted, or what a file object is."""
    if isinstance(path, str | bytes | os.PathLike):
        return repr(os.fspath(path))
    return f"the file object {type(path).__name__}"


def _failing_checksum(path: str | os.PathLike | IO[bytes]) -> str | None:
    """The first part of the checkpoint's zip archive whose bytes do not match their CRC-32 (``torch.load`` does not
    check them: a flipped bit in a tensor loads as another number), or ``None``; also ``None`` for a file that is not
    a zip archive, which ``torch.load`` then refuses. A file object is read from where it is and put back there."""
    start = None
    if isinstance(path, bytes):  # (a path in bytes, which torch.load takes too)
        path = os.fsdecode(path)
    try:
        if not isinstance(path, str | os.PathLike):
            if not (hasattr(path, "seek") and hasattr(path, "tell")):
                return None
            start = path.tell()
        with zipfile.ZipFile(path) as archive:
            try:
                return archive.testzip()
            except (zipfile.BadZipFile, OSError, EOFError) as error:  # a part's header damaged
                return f"({error})"
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return None
    finally:
        if start is not None:
            path.seek(start)


def _read(path: str | os.PathLike | IO[bytes], device: torch.device) -> dict[str, Any]:
    """The checkpoint's contents, or one ``ValueError`` naming the file for anything that is not a whole, finite
    pyro_bbb checkpoint (truncated, corrupted, foreign, or holding objects that ``weights_only`` refuses)."""
    where = _where(path)
    failing = _failing_checksum(path)
    if failing is not None:
        raise ValueError(f"{where} is corrupted: its part {failing!r} does not match its checksum (CRC-32), so some "
                         "of its bytes changed after pyro_bbb.save wrote it. Nothing was loaded; save it again, or use "
                         "an intact copy.")
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as error:  # torch raises zip, pickle, EOF and runtime errors for damaged or foreign files
        raise ValueError(
            f"{where} could not be read as a pyro_bbb checkpoint ({type(error).__name__}: {str(error)[:200]}); it is "
            "truncated, corrupted, or not a file written by pyro_bbb.save. Nothing was loaded."
        ) from error
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT:
        raise ValueError(f"{where} is not a pyro_bbb checkpoint (written by pyro_bbb.save).")
    if not isinstance(checkpoint.get("format_version"), int):
        raise ValueError(f"{where} is a damaged pyro_bbb checkpoint: it has no format version.")
    if checkpoint["format_version"] > FORMAT_VERSION:
        raise ValueError(
            f"the checkpoint {where} has format version {checkpoint['format_version']}, newer than this pyro_bbb "
            f"({__version__}) reads; upgrade pyro_bbb."
        )
    checkpoint.setdefault("param_store", {})  # version-1 files written before the param store was saved
    damaged = [key for key, kind in _PARTS.items() if not isinstance(checkpoint.get(key), kind)]
    if damaged:
        raise ValueError(f"{where} is a damaged pyro_bbb checkpoint: {', '.join(damaged)} missing or malformed.")
    priors = checkpoint["settings"].get("priors", {})
    if not (isinstance(priors, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in priors.items())):
        raise ValueError(f"{where} is a damaged pyro_bbb checkpoint: its priors are not a site name -> prior map.")
    num_data = checkpoint["settings"].get("num_data")
    if num_data is not None and (not isinstance(num_data, int) or isinstance(num_data, bool) or num_data < 1):
        raise ValueError(f"{where} is a damaged pyro_bbb checkpoint: its num_data {num_data!r} is not a positive "
                         "whole number.")
    for value in checkpoint["example_inputs"]:
        try:
            value is None or input_tensors(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where} is a damaged pyro_bbb checkpoint: example_inputs are not tensors.") from None
    shapes = checkpoint.get("latent_shapes", {})
    if not (isinstance(shapes, dict) and all(isinstance(name, str) and isinstance(shape, list) and all(
            isinstance(size, int) for size in shape) for name, shape in shapes.items())):
        raise ValueError(f"{where} is a damaged pyro_bbb checkpoint: latent_shapes is not a site name -> shape map.")
    rows = checkpoint.get("training_rows")
    if rows is not None and not (isinstance(rows, torch.Tensor) and rows.dtype == torch.int64 and rows.dim() == 1):
        raise ValueError(f"{where} is a damaged pyro_bbb checkpoint: training_rows is not a 1-d int64 tensor.")
    for part in ("model_state", "guide_state", "param_store"):
        for name, value in checkpoint[part].items():
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"{where} is a damaged pyro_bbb checkpoint: {part} {name!r} is not a tensor.")
            # (a model's buffer may hold infinities by design, a causal mask's -inf: load checks its parameters)
            bad = torch.isnan(value) if part == "model_state" else ~torch.isfinite(value)
            if value.is_floating_point() and bool(bad.any()):
                raise ValueError(
                    f"{where} holds NaN or infinite values in {part} {name!r}; refusing to load a diverged model."
                )
    return checkpoint


def _diverged_parameters(model_state: dict[str, torch.Tensor], model) -> list[str]:
    """The names of the model's trained parameters the checkpoint holds infinite (NaN is refused on reading)."""
    names = {name for name, _ in model.named_parameters()} if isinstance(model, torch.nn.Module) else set()
    return [name for name, value in model_state.items()
            if name in names and value.is_floating_point() and not bool(torch.isfinite(value).all())]


def _saved_params_and_frozen(saved: dict, store: dict, model) -> tuple[dict, list]:
    """The checkpoint's param-store entries this model keeps there, and ``(buffer, value)`` for those it now holds as
    buffers of the same name: a frozen layer's parameters, which a checkpoint of an earlier version of
    :class:`pyro_bbb.BNN` kept in the param store."""
    buffers = dict(model.named_buffers(remove_duplicate=False)) if isinstance(model, torch.nn.Module) else {}
    frozen = {name for name in saved if name not in store and name in buffers
              and buffers[name].shape == saved[name].shape}
    return ({name: value for name, value in saved.items() if name not in frozen},
            [(buffers[name], saved[name]) for name in frozen])


def load(path: str | os.PathLike | IO[bytes], model, guide, optimizer=None):
    """Read a checkpoint written by :func:`save` into ``model`` and ``guide`` (built as before); returns ``guide``.

    Nothing is changed unless every tensor fits: a model or guide of another shape, another likelihood (or the
    same likelihood with other settings), a layer with another prior, a missing ``pyro.module`` / ``pyro.param``
    parameter, or a damaged file raises ``ValueError`` listing the differences. Tensors are placed on the model's
    device. With ``optimizer`` (of the class that was saved), its state is restored too: ``fit(...,
    optimizer=optimizer)`` then continues the run.
    A :class:`pyro_bbb.BNN` built without ``num_data`` gets the one it was saved with (the training-set size its
    data plate declares to Pyro's own ELBOs), as does one whose ``num_data`` an earlier ``load`` set (none, if this
    checkpoint has none); one built with its own, or given one since, keeps it. ``path`` is a file's path or a binary
    file object (``io.BytesIO``), as ``torch.load`` takes.

    Examples
    --------
    See the module example.
    """
    device = next((t.device for t in (*model.buffers(), *model.parameters())), torch.device("cpu"))
    checkpoint = _read(path, device)
    saved, current = checkpoint["settings"], _settings(model)
    for key in ("likelihood", "data_plate", "likelihood_repr"):
        if saved.get(key, current[key]) != current[key]:
            raise ValueError(
                f"the checkpoint was saved with {key} {saved[key]!r} but this model has {current[key]!r}; build the "
                "model the way it was built when saved."
            )
    other_priors = sorted(site for site, prior in saved.get("priors", {}).items()
                          if current["priors"].get(site, prior) != prior and _comparable(prior)
                          and _comparable(current["priors"][site]))
    if other_priors:  # (its KL, evidence and further training read the prior)
        raise ValueError(
            "the checkpoint was saved with other priors than this model's: "
            + "; ".join(f"{site} {saved['priors'][site]} saved, {current['priors'][site]} now"
                        for site in other_priors[:5])
            + (f" (and {len(other_priors) - 5} more)" if len(other_priors) > 5 else "")
            + ". Build the model with the priors it was saved with; to change a prior, set layer.prior after "
            "loading."
        )
    set_num_data, num_data = _num_data_to_load(saved, model)
    # the example rows in the model's floating dtype (a float32 checkpoint loads into a float64 model, and back)
    dtype = model_dtype(model)
    inputs = [None if t is None else inputs_to(cast_inputs(t, dtype), device) for t in checkpoint["example_inputs"]]
    keys_before = set(pyro.get_param_store().keys())
    try:  # a refusal leaves Pyro's param store as it found it (the set-up below fills it for this model's shapes)
        try:
            if getattr(guide, "prototype_trace", None) is None:
                with torch.no_grad(), poutine.block(), training_mode(model, False), rng_untouched():
                    guide(*inputs)
            store = _used_params(model, guide, inputs)
        except (RuntimeError, TypeError, ValueError, IndexError) as error:
            shapes = [None if t is None else {k: tuple(v.shape) for k, v in input_tensors(t).items()} for t in inputs]
            raise ValueError(
                f"the example rows {_where(path)} holds (shapes {shapes}; one row of each argument the model was "
                f"called with when saved) do not run through this model and guide: {type(error).__name__}: "
                f"{str(error).split(chr(10) + 'Trace Shapes:')[0].strip()}. "
                "Build the model the way it was built when saved (its input width and layer sizes). Nothing was "
                "loaded."
            ) from error
        problems = _mismatches(checkpoint["model_state"], _state(model), "model")
        if "latent_shapes" in checkpoint:  # (files written before it was saved: the parameters' shapes only)
            problems += _mismatches(checkpoint["latent_shapes"], _latent_shapes(guide), "latent site", "model")
        problems += _mismatches(checkpoint["guide_state"], _state(guide), "guide")
        saved_params, held = _saved_params_and_frozen(checkpoint["param_store"], store, model)
        problems += _mismatches(saved_params, store, "parameter") if saved_params else []
        if problems:
            raise ValueError(
                "the checkpoint does not fit this model and guide (were they built with other layer sizes?):\n  "
                + "\n  ".join(problems)
            )
        diverged = _diverged_parameters(checkpoint["model_state"], model)
        if diverged:
            raise ValueError(f"{_where(path)} holds infinite values in the model parameters {diverged}; refusing "
                             "to load a diverged model.")
        saved_optimizer = checkpoint.get("optimizer")
        if optimizer is not None:
            if not isinstance(saved_optimizer, dict) or not isinstance(saved_optimizer.get("state"), dict):
                raise ValueError("the checkpoint holds no optimizer state: save it with pyro_bbb.save(..., "
                                 "optimizer=...).")
            if saved_optimizer.get("class") != type(optimizer).__name__:
                raise ValueError(
                    f"the checkpoint holds the state of a {saved_optimizer.get('class')}, not of a "
                    f"{type(optimizer).__name__}; pass an optimizer of the class that was saved."
                )
        choice = checkpoint.get("kl_weight_choice")
        try:
            choice = None if choice is None else KLWeightChoice.from_dict(choice)
        except ValueError as error:
            raise ValueError(f"{_where(path)} is a damaged pyro_bbb checkpoint: {str(error).rstrip('.')}. Save it "
                             "again with pyro_bbb.save.") from None
        if optimizer is not None:  # first: a state it refuses leaves the model and guide as they were
            optimizer.set_state(saved_optimizer["state"])
    except BaseException:  # (a model that cannot run the example rows raises torch's own errors)
        param_store = pyro.get_param_store()
        for name in set(param_store.keys()) - keys_before:
            del param_store[name]
        raise
    if isinstance(model, torch.nn.Module):
        model.load_state_dict(checkpoint["model_state"])
    guide.load_state_dict(checkpoint["guide_state"])
    with torch.no_grad():
        for name, value in saved_params.items():
            store[name].copy_(value)
        for buffer, value in held:
            buffer.copy_(value)
    record_kl_weight(guide, choice)  # (none in the checkpoint: nothing known of how it was trained)
    restore_training_fingerprints(guide, checkpoint.get("training_rows"))  # (nor, without them, of its rows)
    if set_num_data:
        model.num_data = num_data
        if isinstance(model, torch.nn.Module):  # (as _num_data_to_load reads it: a module's)
            _NUM_DATA_LOADED[model] = num_data
    return guide
