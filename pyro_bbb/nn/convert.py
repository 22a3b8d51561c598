"""``bayesianize``: an existing PyTorch model, whole or in part, as a Bayes-by-Backprop model.

Examples
--------
>>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
>>> bayesianize(net, prior=priors.Normal(0.0, 0.5), last_layer_only=True)
PyroSequential(
  (0): PyroLinear(in_features=4, out_features=8, bias=True)
  (1): PyroReLU()
  (2): BayesianLinear(in_features=8, out_features=2, bias=True, prior=Normal(loc=0.0, scale=0.5))
)
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Callable, Mapping, Sequence
from types import FunctionType

import torch
from pyro.nn import PyroModule
from pyro.nn.module import to_pyro_module_
from torch import nn

from .._internals import ConvNd, ConvTransposeNd, module_hooks, sampled_attributes
from .._warnings import warn_at_caller
from ..priors import Prior
from . import conv
from .linear import BayesianLinear
from .module import BayesianModule
from .recurrent import BayesianGRU, BayesianGRUCell, BayesianLSTM, BayesianLSTMCell

__all__ = ["bayesianize", "SUPPORTED"]

#: Deterministic layer type -> its Bayesian twin. Selection is by ``isinstance``, never by class name.
SUPPORTED: dict[type[nn.Module], type[BayesianModule]] = {
    nn.Linear: BayesianLinear,
    nn.Conv1d: conv.BayesianConv1d,
    nn.Conv2d: conv.BayesianConv2d,
    nn.Conv3d: conv.BayesianConv3d,
    nn.ConvTranspose1d: conv.BayesianConvTranspose1d,
    nn.ConvTranspose2d: conv.BayesianConvTranspose2d,
    nn.ConvTranspose3d: conv.BayesianConvTranspose3d,
    nn.LSTM: BayesianLSTM,
    nn.GRU: BayesianGRU,
    nn.LSTMCell: BayesianLSTMCell,
    nn.GRUCell: BayesianGRUCell,
}

#: Containers whose sub-layers are used through their weights rather than called (so they cannot be swapped).
_OPAQUE = (nn.MultiheadAttention,)

Selector = str | Sequence[str] | Callable[[str, nn.Module], bool] | None
PriorSpec = Prior | Mapping[str, Prior] | Callable[[str, nn.Module], Prior | None] | None


def _twin_type(module: nn.Module) -> type[BayesianModule] | None:
    if isinstance(module, (nn.modules.lazy.LazyModuleMixin, BayesianModule)) or sampled_attributes(module):
        return None  # lazy, or already Bayesian (a pyro_bbb layer, or a PyroSample weight with its own prior)
    for base, twin in SUPPORTED.items():
        if isinstance(module, base):
            return twin
    return None


def _warn_frozen(candidates: list[tuple[str, nn.Module]]) -> None:
    """A frozen (pretrained) layer converted with the rest would be trained, in silence: said, with the fix; also a
    layer frozen in part (a bias-only fine-tune, BitFit, freezes the weights), each of whose parameters becomes a
    trained posterior."""
    frozen = []  # (layer name, its frozen parameters' names, whether all its parameters are frozen)
    for name, layer in candidates:
        names = [n for n, p in layer.named_parameters() if not p.requires_grad]
        if names:
            frozen.append((name, names, len(names) == len(list(layer.parameters()))))
    if not frozen:
        return
    if frozen[0][0] == "":  # the one layer passed: nothing to exclude
        which = "" if frozen[0][2] else f": its {', '.join(frozen[0][1])}"
        warn_at_caller(f"bayesianize: the layer passed was frozen (requires_grad=False{which}) and is now Bayesian, "
                       "every parameter trained; to keep it deterministic and frozen, use the layer as it is.")
        return
    shown = [name if whole else f"{name} ({', '.join(names)})" for name, names, whole in frozen]
    layers = [name for name, _, _ in frozen]
    warn_at_caller(
        f"bayesianize: {shown} {'was' if len(shown) == 1 else 'were'} frozen (requires_grad=False; in part: the "
        f"parameters named) and {'is' if len(shown) == 1 else 'are'} now Bayesian, every parameter trained with "
        f"the rest; pass exclude={layers!r} to keep them deterministic and frozen."
    )


#: Methods of a layer's torch class that a subclass may define anew without changing what the layer computes
_HARMLESS_OVERRIDES = frozenset({"extra_repr", "reset_parameters"})


def _own_methods(layer: nn.Module, base: type) -> list[str]:
    """The methods of ``base`` (and its torch ancestors below ``nn.Module``) that ``layer``'s class defines anew:
    ``forward``, a helper that ``base``'s forward calls (a convolution's ``_conv_forward``), or ``__call__``."""
    defined = {name for klass in base.__mro__ if klass not in nn.Module.__mro__ for name, value in vars(klass).items()
               if not name.startswith("__") and isinstance(value, FunctionType | staticmethod | classmethod | property)}
    defined |= {"__call__", "_call_impl"}  # (how nn.Module runs forward: a subclass's own changes what it computes)
    own = []
    for name in sorted(defined - _HARMLESS_OVERRIDES):  # (its own __init__, as every subclass has, changes nothing)
        owner = next(klass for klass in type(layer).__mro__ if name in vars(klass))
        if owner not in base.__mro__ and owner is not PyroModule:  # (a PyroModule's call: the twin's is one too)
            own.append(name)
    return own


def _refuse_what_a_twin_would_change(converted: nn.Module, candidates: list[tuple[str, nn.Module]]) -> None:
    """A Bayesian twin runs its torch base class's forward on parameters of its own: a layer whose behaviour lies
    elsewhere -- a subclass's own ``forward``, hooks, a parametrization (``weight_norm``), a ``Parameter`` shared
    with another layer converted too (tied weights) -- would change without a word. Each is an error naming the
    layers; a layer tied to a module that stays deterministic (a language model's head tied to its embedding) is
    converted with a warning that training unties them."""
    holders: dict[int, list[str]] = {}
    for module_name, module in converted.named_modules():
        for param in module.parameters(recurse=False):
            holders.setdefault(id(param), []).append(module_name)
    problems, untied, names = [], [], {name for name, _ in candidates}
    for name, layer in candidates:
        base, shown = next(b for b in SUPPORTED if isinstance(layer, b)), name or "(the layer itself)"
        own = _own_methods(layer, base)
        if own:
            problems.append(f"{shown}: {type(layer).__name__} has its own {', '.join(own)}, which {base.__name__}'s "
                            "would replace")
        hooks = module_hooks(layer)
        if hooks:
            problems.append(f"{shown}: has hooks ({', '.join(hooks)}) the new layer would not have; register them on "
                            "the converted layer")
        if nn.utils.parametrize.is_parametrized(layer):
            problems.append(f"{shown}: a parametrization (weight_norm, spectral_norm, ...) of "
                            f"{sorted(layer.parametrizations)}; remove it first (nn.utils.parametrize."
                            "remove_parametrizations)")
        # a module whose parameter is also another's (not an ancestor's alias, as a head's bias often is): tied
        tied = sorted({other for param in layer.parameters(recurse=False) for other in holders[id(param)]
                       if other != name and not (other == "" or name.startswith(other + "."))})
        converted_too = [other for other in tied if other in names]
        if converted_too:
            problems.append(f"{shown}: its parameters are tied to {converted_too}'s (one Parameter in two layers), "
                            "and two posteriors would untie them")
        elif tied:
            untied.append(f"{name} (tied to {tied})")
    if untied:
        warn_at_caller(
            f"bayesianize: {', '.join(untied)}: the Bayesian layer gets a posterior of its own, started at the tied "
            "weight, and the other module keeps the deterministic one, so training unties them (a weight-tied "
            "language model's head, e.g.). To keep them tied, leave the layer deterministic (exclude=[...]).")
    if problems:
        raise ValueError("bayesianize would silently change these layers: " + "; ".join(problems) + ". Leave them "
                         "deterministic (exclude=[...]), or change them first.")


def _patterns(selector: Selector, what: str) -> Selector:
    """``include`` / ``exclude`` as given, one pattern as a tuple of it (a string is not read character by character:
    ``exclude="head"`` matched every module named by one of its letters, ``"body*"`` everything through its ``*``)."""
    if selector is None or callable(selector):
        return selector
    patterns = (selector,) if isinstance(selector, str) else tuple(selector)
    if not all(isinstance(pattern, str) for pattern in patterns):
        raise TypeError(f"{what} takes module-name patterns (a string or a list of them) or a predicate (name, "
                        f"module) -> bool; got {selector!r}.")
    return patterns


def _is_plain(pattern: str) -> bool:
    """Whether ``pattern`` is a plain name, without ``fnmatch``'s wildcards."""
    return not any(c in pattern for c in "*?[")


def _unmatched(patterns, names: list[str]) -> list[str]:
    """The plain names among ``patterns`` that match none of ``names`` (a misspelling); a wildcard pattern
    (``"*norm*"``) may match nothing, as a recipe shared by several architectures does."""
    return [pattern for pattern in patterns
            if _is_plain(pattern) and not any(fnmatch.fnmatchcase(name, pattern) for name in names)]


def _refuse_lazy(chosen: list[tuple[str, nn.Module]]) -> None:
    """A lazy layer (``nn.LazyLinear``, ...) chosen to convert has no sizes until its first forward pass, so no twin
    can be built (it was passed over)."""
    lazy = [name or "(the module itself)" for name, m in chosen
            if isinstance(m, nn.modules.lazy.LazyModuleMixin) and m.has_uninitialized_params()]
    if lazy:
        kind = "is a lazy module" if len(lazy) == 1 else "are lazy modules"
        raise ValueError(
            f"bayesianize needs every layer's sizes, and {lazy} {kind} not yet initialized (nn.LazyLinear, ...). Run "
            "one forward pass on an example batch first (net(x)), which gives them their sizes, then bayesianize."
        )


def _matches(selector: Selector, name: str, module: nn.Module) -> bool:
    if callable(selector):
        return bool(selector(name, module))
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in selector)


def _prior_for(prior: PriorSpec, names: list[str], module: nn.Module) -> Prior | None:
    """The prior ``prior`` gives the layer called ``names`` (every name of a layer used at several places: a dict's
    pattern matches any of them, as ``include`` / ``exclude`` do; a callable is called with the first)."""
    if prior is None or isinstance(prior, Prior) or isinstance(prior, torch.distributions.Distribution):
        return prior
    if isinstance(prior, Mapping):
        return next((p for pattern, p in prior.items()
                     if any(fnmatch.fnmatchcase(name, pattern) for name in names)), None)
    if callable(prior):
        return prior(names[0], module)
    raise TypeError(
        "prior must be a Prior, a dict from name pattern to Prior, or a callable (name, module) -> Prior; got "
        f"{type(prior).__name__}."
    )


def _make_twin(module: nn.Module, twin: type[BayesianModule], prior: Prior | None, from_weights: bool):
    weight = next(module.parameters())
    kwargs = {"prior": prior, "device": weight.device, "dtype": weight.dtype}
    if isinstance(module, nn.Linear):
        new = twin(module.in_features, module.out_features, bias=module.bias is not None, **kwargs)
    elif isinstance(module, ConvTransposeNd):
        new = twin(module.in_channels, module.out_channels, module.kernel_size, stride=module.stride,
                   padding=module.padding, output_padding=module.output_padding, groups=module.groups,
                   bias=module.bias is not None, dilation=module.dilation, padding_mode=module.padding_mode,
                   **kwargs)
    elif isinstance(module, ConvNd):
        new = twin(module.in_channels, module.out_channels, module.kernel_size, stride=module.stride,
                   padding=module.padding, dilation=module.dilation, groups=module.groups,
                   bias=module.bias is not None, padding_mode=module.padding_mode, **kwargs)
    elif isinstance(module, nn.RNNBase):
        if getattr(module, "proj_size", 0):
            kwargs["proj_size"] = module.proj_size
        new = twin(module.input_size, module.hidden_size, num_layers=module.num_layers, bias=module.bias,
                   batch_first=module.batch_first, dropout=module.dropout, bidirectional=module.bidirectional,
                   **kwargs)
    else:  # recurrent cells
        new = twin(module.input_size, module.hidden_size, bias=module.bias, **kwargs)
    if from_weights:
        for name, param in module.named_parameters():
            new.set_initial_value(name, param)
    new.train(module.training)
    return new


def _supported_names() -> str:
    return ", ".join(f"nn.{t.__name__}" for t in SUPPORTED)


def bayesianize(
    module: nn.Module,
    prior: PriorSpec = None,
    include: Selector = None,
    exclude: Selector = None,
    last_layer_only: bool = False,
    init_from_weights: bool = True,
) -> PyroModule:
    """A copy of ``module`` with the chosen layers replaced by their Bayesian twins; the original is untouched.

    Layers are chosen by type (``isinstance`` against :data:`SUPPORTED`: ``nn.Linear``, ``nn.Conv1d/2d/3d``,
    ``nn.ConvTranspose1d/2d/3d``, ``nn.LSTM``, ``nn.GRU`` and their cells), then
    narrowed by module name (``fnmatch`` patterns such as ``"head.*"``) or a predicate ``(name, module) -> bool``.
    Everything else (normalisation, dropout, activations, embeddings, attention, custom modules) stays
    deterministic (the copy is converted to :class:`~pyro.nn.PyroModule` so their parameters are trained as point
    estimates alongside the guide, and saved by :func:`pyro_bbb.save`); a layer that is already Bayesian (a pyro_bbb
    layer, or a ``PyroModule`` layer whose weight is a ``PyroSample`` site, as in Pyro's tutorials) keeps its prior.
    The projections inside
    ``nn.MultiheadAttention`` are used through their weights, not called, and are never converted.

    Parameters
    ----------
    module : nn.Module
        The (trained) model.
    prior : Prior, dict or callable, optional
        One prior for every converted layer; a dict from name pattern to prior (first match wins, under any of a
        shared layer's names; a plain name, no wildcard, that names no convertible layer is an error; unmatched
        layers get their twin's default: :data:`~pyro_bbb.priors.DEFAULT_PRIOR`, ``Normal(0, 2)`` for recurrent
        layers); or
        ``(name, module) -> prior``. ``None``: every twin's default. :class:`pyro_bbb.priors.Moped` centres each
        weight's prior on its trained value.
    include : pattern, list of patterns or predicate, optional
        Convert only these layers (a container stands for the layers inside it); a plain name (no wildcard) that
        matches no module is an error (a misspelling). A layer named exactly that cannot
        be converted is an error; the normalisation, dropout or activation modules that a wildcard
        (``"encoder.layer.1.*"``) or a predicate also matches are left deterministic.
    exclude : pattern, list of patterns or predicate, optional
        Never convert these; a plain name (no wildcard) that matches no module is an error, a wildcard may match
        nothing.
    last_layer_only : bool
        Convert only the last convertible layer (in registration order): a Bayesian head on a deterministic body.
    init_from_weights : bool
        Start the posterior means at the trained weights (:class:`pyro_bbb.MeanFieldGuide` reads them); with a
        small ``init_scale`` the converted model predicts like the original before any training.

    Returns
    -------
    PyroModule
        Wrap it as ``pyro_bbb.BNN(converted, likelihood)``.

    Examples
    --------
    See the module example.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"bayesianize converts a torch.nn.Module, got {type(module).__name__}.")
    include, exclude = _patterns(include, "include"), _patterns(exclude, "exclude")
    _refuse_lazy([("", module)])
    if _twin_type(module) is not None:  # the model is itself one convertible layer: the same checks, then its twin
        if (include is not None and not _matches(include, "", module)) or (
                exclude is not None and _matches(exclude, "", module)):
            raise ValueError(f"no layer to convert: the module passed is itself the one layer ({type(module).__name__}"
                             "), and include/exclude leave it out. Use it as it is, or drop include/exclude.")
        _refuse_what_a_twin_would_change(module, [("", module)])
        _warn_frozen([("", module)])
        return _make_twin(module, _twin_type(module), _prior_for(prior, [""], module), init_from_weights)
    if sampled_attributes(module):
        raise ValueError(
            f"{type(module).__name__} is already Bayesian: its {sampled_attributes(module)} are PyroSample sites "
            "with their own priors, and bayesianize leaves such layers as they are. Use it as it is."
        )
    converted = copy.deepcopy(module)
    named = [(name, m) for name, m in converted.named_modules() if name]
    opaque = [name for name, m in named if isinstance(m, _OPAQUE)]

    aliases: dict[int, list[str]] = {}  # every name of a module used at several places (a shared encoder)
    named_all = [(name, m) for name, m in converted.named_modules(remove_duplicate=False) if name]
    for name, m in named_all:
        aliases.setdefault(id(m), []).append(name)

    def inside(name: str, parents) -> bool:
        return any(name.startswith(p + ".") for p in parents)

    def selected(selector: Selector, m: nn.Module) -> bool:  # under any of its names
        return any(_matches(selector, alias, m) for alias in aliases[id(m)])

    def within(m: nn.Module, parents) -> bool:
        return any(alias in parents or inside(alias, parents) for alias in aliases[id(m)])

    if include is None:
        candidates = [(n, m) for n, m in named if not inside(n, opaque)]
    else:
        direct = [(n, m) for n, m in named if selected(include, m)]
        unmatched = [] if callable(include) else _unmatched(include, [n for n, _ in named_all])
        if not direct or unmatched:
            raise ValueError(f"include={list(unmatched) or include!r} matched no module; the module names are "
                             f"{[n for n, _ in named]}.")
        # a matched container (children, no parameters of its own) stands for the layers inside it; a module named
        # exactly that cannot be converted is an error, one that a wildcard or a predicate swept up is passed over
        named_exactly = set() if callable(include) else {p for p in include if _is_plain(p)}
        unsupported = [f"{n} ({type(m).__name__})" for n, m in direct
                       if n in named_exactly and (_twin_type(m) is None or inside(n, opaque))
                       and not (list(m.children()) and not list(m.parameters(recurse=False)))]
        already = [f"{n} ({', '.join(sampled_attributes(m))})" for n, m in direct
                   if n in named_exactly and sampled_attributes(m)]
        if already:
            raise ValueError(
                f"these modules are already Bayesian, their PyroSample sites with their own priors: "
                f"{', '.join(already)}. bayesianize leaves such layers as they are (the guide and the estimators "
                "treat them like pyro_bbb layers); drop them from include, or replace their PyroSample attributes "
                "with plain parameters first to give them pyro_bbb's priors."
            )
        if unsupported:
            raise ValueError(
                f"cannot make these modules Bayesian: {', '.join(unsupported)}. Supported types: {_supported_names()} "
                "(and their subclasses); the projections inside nn.MultiheadAttention are used through their "
                "weights, not called, and cannot be converted. Leave the others deterministic, or exclude them."
            )
        roots = [alias for _, m in direct for alias in aliases[id(m)]]
        candidates = [(n, m) for n, m in named if within(m, roots) and not inside(n, opaque)]
    if exclude is not None:  # an excluded container takes its layers with it; a shared layer, under any of its names
        unmatched = [] if callable(exclude) else _unmatched(exclude, [n for n, _ in named_all])
        if unmatched:  # (a misspelt name would convert the layer it meant to keep)
            raise ValueError(f"exclude={unmatched!r} matched no module; the module names are {[n for n, _ in named]}.")
        excluded = [alias for _, m in named if selected(exclude, m) for alias in aliases[id(m)]]
        candidates = [(n, m) for n, m in candidates if not within(m, excluded)]
    plain_rnns = [n for n, m in candidates if isinstance(m, nn.RNN | nn.RNNCell)]
    if plain_rnns:  # a recurrent layer without a Bayesian twin stays deterministic: said, not left to be found out
        warn_at_caller(f"bayesianize leaves {plain_rnns} (torch.nn.RNN / RNNCell) deterministic: only LSTM and GRU "
                       "layers have Bayesian twins (BayesianLSTM, BayesianGRU). Use one of those to make it Bayesian, "
                       "or exclude it to silence this.")
    _refuse_lazy(candidates)
    candidates = [(n, m) for n, m in candidates if _twin_type(m) is not None]
    if last_layer_only:
        candidates = candidates[-1:]
    if not candidates:
        where = "" if include is None else f" among the modules include={include!r} selects"
        raise ValueError(f"no layer to convert: no {_supported_names()} outside attention blocks{where}.")

    _refuse_what_a_twin_would_change(converted, candidates)
    if isinstance(prior, Mapping):  # (a misspelt name would leave its layer at the default prior)
        convertible = [n for n, m in named_all if _twin_type(m) is not None]
        unmatched = _unmatched(prior, convertible)
        if unmatched:
            raise ValueError(f"prior patterns {unmatched} match no layer that can be converted; those are "
                             f"{convertible}.")
    _warn_frozen(candidates)
    references = list(converted.named_modules(remove_duplicate=False))  # a layer used at several places: each one
    for _, layer in candidates:
        twin = _make_twin(layer, _twin_type(layer), _prior_for(prior, aliases[id(layer)], layer), init_from_weights)
        for path in [n for n, m in references if m is layer]:  # gets the same twin (one posterior, as before one
            parent_name, _, child = path.rpartition(".")       # set of weights), in its place in the parent's order
            (converted.get_submodule(parent_name) if parent_name else converted).add_module(child, twin)
    to_pyro_module_(converted)
    return converted
