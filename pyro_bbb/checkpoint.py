"""``save`` / ``load``: a fitted model and guide in one file that is safe to open.

The file holds only tensors, numbers and strings, and is read with ``torch.load(..., weights_only=True)``: a
checkpoint from a stranger cannot run code. It stores the guide's variational parameters, the model's
deterministic parameters and buffers, one example input (to rebuild the guide's sites) and the settings needed to
predict (likelihood, data plate).

Example
-------
>>> import os, tempfile, torch, pyro
>>> import pyro_bbb
>>> from pyro_bbb import likelihoods
>>> from pyro_bbb.nn import BayesianLinear
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
from typing import Any

import pyro.poutine as poutine
import torch

from . import __version__

__all__ = ["save", "load"]

FORMAT = "pyro_bbb.checkpoint"
FORMAT_VERSION = 1


def _example_inputs(guide) -> list[torch.Tensor | None]:
    """The first row of every argument the guide was set up with (enough to rebuild its sites)."""
    inputs = guide.prototype_trace.nodes["_INPUT"]
    if inputs["kwargs"]:
        raise ValueError("save supports models called with positional tensor arguments only, e.g. model(x, y).")
    rows = []
    for arg in inputs["args"]:
        if arg is not None and not isinstance(arg, torch.Tensor):
            raise ValueError(f"save supports tensor arguments only; the model was called with a {type(arg).__name__}.")
        rows.append(None if arg is None else arg[:1].detach().cpu().clone())
    return rows


def _settings(model) -> dict[str, Any]:
    likelihood = getattr(model, "likelihood", None)
    return {
        "model_class": type(model).__name__,
        "data_plate": getattr(model, "data_plate", "data"),
        "likelihood": type(likelihood).__name__ if likelihood is not None else "",
        "likelihood_repr": repr(likelihood) if likelihood is not None else "",
    }


def _state(module) -> dict[str, torch.Tensor]:
    if not isinstance(module, torch.nn.Module):
        return {}
    return {name: value.detach() for name, value in module.state_dict().items()}


def save(path: str | os.PathLike, model, guide) -> None:
    """Write ``model``'s deterministic state and ``guide``'s posterior to ``path``.

    Parameters
    ----------
    path : str or PathLike
        Destination file (conventionally ``.pt``).
    model : torch.nn.Module
        The model, e.g. a :class:`pyro_bbb.BNN`.
    guide : MeanFieldGuide
        The fitted guide.

    Example
    -------
    See the module example.
    """
    if getattr(guide, "prototype_trace", None) is None:
        raise ValueError("the guide has not been fitted yet; there is nothing to save.")
    checkpoint = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "pyro_bbb_version": __version__,
        "settings": _settings(model),
        "example_inputs": _example_inputs(guide),
        "model_state": _state(model),
        "guide_state": _state(guide),
    }
    torch.save(checkpoint, path)


def _mismatches(saved: dict[str, torch.Tensor], current: dict[str, torch.Tensor], what: str) -> list[str]:
    problems = [f"{what} {name!r} is in the checkpoint but not in the {what}" for name in saved.keys() - current.keys()]
    problems += [f"{what} {name!r} is missing from the checkpoint" for name in current.keys() - saved.keys()]
    problems += [
        f"{what} {name!r}: checkpoint shape {tuple(saved[name].shape)}, {what} shape {tuple(current[name].shape)}"
        for name in saved.keys() & current.keys()
        if saved[name].shape != current[name].shape
    ]
    return sorted(problems)


def load(path: str | os.PathLike, model, guide):
    """Read a checkpoint written by :func:`save` into ``model`` and ``guide`` (built as before); returns ``guide``.

    Nothing is changed unless every tensor fits: a model or guide of another shape, or another likelihood,
    raises ``ValueError`` listing the differences. Tensors are placed on the model's device.

    Example
    -------
    See the module example.
    """
    device = next((t.device for t in (*model.buffers(), *model.parameters())), torch.device("cpu"))
    checkpoint = torch.load(path, map_location=device, weights_only=True)
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT:
        raise ValueError(f"{os.fspath(path)!r} is not a pyro_bbb checkpoint (written by pyro_bbb.save).")
    if checkpoint["format_version"] > FORMAT_VERSION:
        raise ValueError(
            f"the checkpoint has format version {checkpoint['format_version']}, newer than this pyro_bbb "
            f"({__version__}) reads; upgrade pyro_bbb."
        )
    saved, current = checkpoint["settings"], _settings(model)
    for key in ("likelihood", "data_plate"):
        if saved[key] != current[key]:
            raise ValueError(
                f"the checkpoint was saved with {key} {saved[key]!r} but this model has {current[key]!r}; build the "
                "model the way it was built when saved."
            )
    if getattr(guide, "prototype_trace", None) is None:
        inputs = [None if t is None else t.to(device) for t in checkpoint["example_inputs"]]
        with torch.no_grad(), poutine.block():
            guide(*inputs)
    problems = _mismatches(checkpoint["model_state"], _state(model), "model")
    problems += _mismatches(checkpoint["guide_state"], _state(guide), "guide")
    if problems:
        raise ValueError(
            "the checkpoint does not fit this model and guide (were they built with other layer sizes?):\n  "
            + "\n  ".join(problems)
        )
    if isinstance(model, torch.nn.Module):
        model.load_state_dict(checkpoint["model_state"])
    guide.load_state_dict(checkpoint["guide_state"])
    return guide
