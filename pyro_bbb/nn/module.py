"""The base class of every Bayesian layer: parameters that are Pyro sample sites with a prior."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from pyro.nn import PyroModule, PyroParam, PyroSample
from pyro.poutine.runtime import effectful, get_plates

from .._draws import draws_leading, example_draw_shape, fold_affine_output, folded_draws, unfold_affine_input
from .._internals import ConvNd, module_buffer, pyro_name, sampled_attributes, site_name, tensor_version
from .._plates import current_data_plate
from ..priors import Prior, as_prior, initial_width, prior_state
from .functional import bayesian_affine

__all__ = [
    "BayesianModule", "is_layer_prior", "site_owners", "current_priors", "layer_priors", "buffers_kept",
    "buffer_restorer", "weight_read_outside",
]


class _SitePrior:
    """What a layer hands to :class:`pyro.nn.PyroSample`: builds one parameter's prior on the layer's device."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, module: BayesianModule):
        data_plate = current_data_plate()
        for frame in get_plates():
            if frame.name == data_plate:
                raise ValueError(
                    f"{type(module).__name__} {pyro_name(module) or '(root)'!s} was called inside "
                    f"pyro.plate({data_plate!r}), which would draw separate weights for every datum. Weights are "
                    f"global: run the network before entering the data plate, e.g. `mean = net(x)` and then "
                    f"`with pyro.plate({data_plate!r}, len(x)): pyro.sample('y', ..., obs=y)`."
                )
        return module.prior_distribution(self.name)


_LAYER_PRIORS: weakref.WeakSet = weakref.WeakSet()


def is_layer_prior(fn) -> bool:
    """Whether ``fn`` is the prior distribution of a Bayesian layer's weight or bias (a global site).

    Examples
    --------
    >>> layer = BayesianLinear(2, 1)
    >>> is_layer_prior(layer.prior_distribution("weight")), is_layer_prior(torch.distributions.Normal(0.0, 1.0))
    (True, False)
    """
    return fn in _LAYER_PRIORS


def site_owners(model) -> dict[str, str]:
    """Site name -> name of the Bayesian layer that owns it (``"(root)"`` for a model that is itself a layer): a
    pyro_bbb layer, or a torch linear, convolution or recurrent layer whose parameters are ``PyroSample`` sites
    (``PyroModule[nn.Linear]`` as Pyro's tutorials write it).

    Examples
    --------
    >>> from pyro.nn import PyroModule
    >>> net = PyroModule[torch.nn.Sequential](BayesianLinear(2, 3), BayesianLinear(3, 1))
    >>> site_owners(net)
    {'0.weight': '0', '0.bias': '0', '1.weight': '1', '1.bias': '1'}
    """
    owners = {}
    if isinstance(model, torch.nn.Module):
        for module in model.modules():
            if isinstance(module, BayesianModule):
                layer = pyro_name(module) or "(root)"
                owners.update({site: layer for site in module.initial_values(full_names=True)})
            elif isinstance(module, _TORCH_LAYERS) and sampled_attributes(module):
                prefix = pyro_name(module)
                owners.update({site_name(prefix, a): prefix or "(root)" for a in sampled_attributes(module)})
    return owners


#: torch's layers whose weights a Pyro-style model makes ``PyroSample`` sites.
_TORCH_LAYERS = (torch.nn.Linear, ConvNd, torch.nn.RNNBase, torch.nn.RNNCellBase)


@contextmanager
def training_mode(model, training: bool) -> Iterator[None]:
    """Run with every torch module of ``model`` in training (``True``) or evaluation mode (dropout off, batch norm on
    its running statistics), as ``model.train(training)`` would set them; each module's own mode comes back after.
    A model in training mode (with the network it wraps, a :class:`pyro_bbb.BNN`'s ``net``) trains as it is: a part
    the user put in evaluation mode (a pretrained body whose batch norm statistics stay frozen) stays in it, as
    Lightning leaves it; a model or network in evaluation mode (``model.eval()``, or a deterministic net put in it
    before ``bayesianize``) is switched whole. A ``model`` that is not a ``torch.nn.Module`` (e.g. a function, or a
    Pyro handler around a model) is left as it is.

    Examples
    --------
    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
    >>> with training_mode(net, False):
    ...     net[1].training
    False
    >>> net[1].training
    True
    >>> _ = net[1].eval()  # a part put in evaluation mode by hand stays in it
    >>> with training_mode(net, True):
    ...     net[1].training
    False
    """
    modules = list(model.modules()) if isinstance(model, torch.nn.Module) else []
    modes = [module.training for module in modules]
    if modules and not (training and _trains_as_it_is(model)):
        model.train(training)
    try:
        yield
    finally:
        for module, mode in zip(modules, modes):
            module.training = mode


def _trains_as_it_is(model: torch.nn.Module) -> bool:
    """Whether :func:`training_mode` leaves ``model``'s modes as they are to train: it and the net it wraps are in
    training mode."""
    wrapped = getattr(model, "net", None)
    return model.training and (not isinstance(wrapped, torch.nn.Module) or wrapped.training)


#: Modules that compute otherwise in evaluation mode: dropout, batch norm (its running statistics)
_MODE_DEPENDENT = (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d, torch.nn.AlphaDropout,
                   torch.nn.FeatureAlphaDropout, torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d,
                   torch.nn.SyncBatchNorm)


def parts_trained_in_evaluation_mode(model) -> list[str]:
    """The outermost parts of ``model`` that :func:`training_mode` leaves in evaluation mode to train (put there by
    hand in a model in training mode) and that compute otherwise in it: they hold dropout or batch norm.

    Examples
    --------
    >>> net = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1)),
    ...                           torch.nn.Linear(2, 1))
    >>> _ = net[0].eval()
    >>> parts_trained_in_evaluation_mode(net)
    ['0']
    """
    if not isinstance(model, torch.nn.Module) or not _trains_as_it_is(model):
        return []
    parts: list[str] = []
    for name, module in model.named_modules():
        inside = any(name.startswith(f"{part}.") for part in parts)
        if not module.training and not inside and any(isinstance(m, _MODE_DEPENDENT) for m in module.modules()):
            parts.append(name)
    return parts


@contextmanager
def buffers_kept(model) -> Iterator[None]:
    """Run with ``model``'s buffers (batch norm's running statistics and counts) put back as they were after: for a
    pass in training mode that must not change the model (``evidence``'s draws).

    Examples
    --------
    >>> norm = torch.nn.BatchNorm1d(2)
    >>> with buffers_kept(norm):
    ...     _ = norm(torch.randn(8, 2))
    >>> int(norm.num_batches_tracked), float(norm.running_mean.abs().sum())
    (0, 0.0)
    """
    put_back = buffer_restorer(model)
    try:
        yield
    finally:
        put_back()


def buffer_restorer(model, running_statistics_only: bool = False) -> Callable[[], None]:
    """A function that puts ``model``'s buffers back as they are now (nothing for a model that is not a module): for
    a pass whose effect on batch norm's running statistics is kept only if the pass is. ``running_statistics_only``
    keeps only the buffers of modules that track running statistics (``track_running_stats``: batch and instance
    norm), not, e.g., a Bayesian layer's copy of its initial weights: for a copy made at every training step.

    Examples
    --------
    >>> norm = torch.nn.BatchNorm1d(2)
    >>> put_back = buffer_restorer(norm, running_statistics_only=True)
    >>> _ = norm(torch.randn(8, 2))
    >>> put_back()
    >>> int(norm.num_batches_tracked)
    0
    """
    modules = model.modules() if isinstance(model, torch.nn.Module) else ()
    kept = [(buffer, buffer.detach().clone()) for module in modules
            if not running_statistics_only or getattr(module, "track_running_stats", False)
            for buffer in module.buffers(recurse=False)]

    @torch.no_grad()
    def put_back() -> None:
        for buffer, value in kept:
            buffer.copy_(value)
    return put_back


def current_priors(model) -> dict[str, torch.distributions.Distribution]:
    """Site name -> the prior of every Bayesian layer's parameter as it is now (a learned prior at its current
    scale; a guide's prototype trace keeps the prior of the first call).

    Examples
    --------
    >>> layer = BayesianLinear(2, 1, prior=priors.LearnedNormal(init_scale=0.5))
    >>> float(current_priors(layer)["weight"].base_dist.scale[0, 0])
    0.5
    """
    return {site: module.prior_distribution(name) for site, module, name in _bayesian_sites(model)}


def layer_priors(model) -> dict[str, Prior]:
    """Site name -> the :class:`~pyro_bbb.priors.Prior` of every Bayesian layer's parameter (what was asked for;
    :func:`current_priors` gives the distributions it makes).

    Examples
    --------
    >>> layer_priors(BayesianLinear(2, 1, prior=priors.Normal(0.0, 0.5)))
    {'weight': Normal(loc=0.0, scale=0.5), 'bias': Normal(loc=0.0, scale=0.5)}
    """
    return {site: module.bayesian_parameters()[name] for site, module, name in _bayesian_sites(model)}


def _bayesian_sites(model):
    """``(site name, layer, parameter name)`` of every Bayesian layer's sampled parameter in ``model``."""
    if isinstance(model, torch.nn.Module):
        for module in model.modules():
            if isinstance(module, BayesianModule):
                prefix = pyro_name(module)
                for name in module.bayesian_parameters():
                    yield site_name(prefix, name), module, name


def _weight_read_outside(value: torch.Tensor) -> None:
    """Does nothing unhandled: the handlers of :data:`weight_read_outside` are what note the read."""


#: Called by a :class:`BayesianModule` when its weight draw ``value`` is read outside the layer's own call (a tied
#: weight, ``F.linear(h, layer.weight.T)``; a read for logging): effectful (type ``"weight_read_outside"``), so that
#: an estimator that replaces the layer's use of its draw (Flipout, local reparameterization, moments) can say that
#: the draw is used elsewhere too. Without such a handler it does nothing.
#:
#: >>> weight_read_outside(torch.zeros(2))   # (nothing handles it here)
weight_read_outside = effectful(_weight_read_outside, type="weight_read_outside")


class BayesianModule(PyroModule):
    """A :class:`~pyro.nn.PyroModule` whose parameters are sample sites drawn from a prior.

    Subclasses call :meth:`_declare_bayesian` for each parameter. Reading ``self.weight`` inside ``forward`` then
    runs ``pyro.sample("<module path>.weight", prior)``; under a guide the value comes from the posterior. The
    layer keeps the initial value of every parameter (non-persistent buffers ``<name>_init`` that follow
    ``.to(device)``), which :class:`pyro_bbb.MeanFieldGuide` uses as the starting posterior mean.

    Examples
    --------
    >>> layer = BayesianLinear(3, 2)
    >>> sorted(layer.initial_values())
    ['bias', 'weight']
    """

    def __init__(self, prior: Prior | None = None):
        super().__init__()
        self._bayesian: dict[str, tuple[int, Prior]] = {}
        self._own_calls = 0  # (calls of this layer running now: a weight read outside them is said to estimators)
        self.prior = prior

    def __call__(self, *args, **kwargs):
        d = self.__dict__
        d["_own_calls"] = d.get("_own_calls", 0) + 1
        try:
            return super().__call__(*args, **kwargs)
        finally:
            d["_own_calls"] -= 1

    def __getattr__(self, name: str):
        value = super().__getattr__(name)
        d = self.__dict__
        if not d.get("_own_calls") and name in d.get("_bayesian", ()) and isinstance(value, torch.Tensor):
            weight_read_outside(value)  # (a tied weight, F.linear(h, layer.weight.T): what an estimator must know)
        return value

    @property
    def prior(self) -> Prior:
        """The layer's prior: that of every parameter not given one of its own (``recurrent_prior=``, a
        ``<name>_prior``). Setting it changes theirs from the next model run on (a guide keeps its posterior).

        Examples
        --------
        >>> layer = BayesianLinear(3, 2)
        >>> layer.prior = priors.Normal(0.0, 0.5)
        >>> float(layer.prior_distribution("weight").base_dist.scale[0, 0])
        0.5
        """
        return self.__dict__["_layer_prior"]

    @prior.setter
    def prior(self, value: Prior | None) -> None:
        new, old = as_prior(value), self.__dict__.get("_layer_prior")
        self.__dict__["_layer_prior"] = new
        for name, (fan_in, prior) in list(self._bayesian.items()):
            if prior is old:
                self._set_parameter_prior(name, fan_in, new)

    def _declare_bayesian(self, name: str, init: torch.Tensor | None, fan_in: int, prior: Prior | None = None) -> None:
        """Make ``name`` a sample site with initial value ``init`` (``None``: the parameter is absent)."""
        if init is None:
            setattr(self, name, None)
            return
        self.register_buffer(f"{name}_init", init.detach().clone(), persistent=False)
        self._set_parameter_prior(name, fan_in, self.prior if prior is None else as_prior(prior))
        setattr(self, name, PyroSample(_SitePrior(name)))

    def _set_parameter_prior(self, name: str, fan_in: int, prior: Prior) -> None:
        """Give parameter ``name`` the prior ``prior``: a learned prior's scale is a parameter of the layer."""
        scale_name = f"{name}_prior_scale"
        previous = self._bayesian.get(name, (fan_in, None))[1]
        self._bayesian[name] = (fan_in, prior)
        if getattr(previous, "learned", False):
            delattr(self, scale_name)
        if getattr(prior, "learned", False):  # an empirical-Bayes prior: its scale is a parameter of the layer
            init = module_buffer(self, f"{name}_init")
            scale = prior.initial_scale(init.shape, device=init.device, dtype=init.dtype)
            setattr(self, scale_name, PyroParam(scale, constraint=prior.constraint))

    def set_initial_value(self, name: str, value: torch.Tensor) -> None:
        """Set the initial value of parameter ``name`` (the guide's starting posterior mean; e.g. trained weights),
        of the parameter's own shape. A guide reads it when it is set up (its first call): a guide that exists
        already keeps its means (build a new one, after ``pyro.clear_param_store()``, to start from these).

        Examples
        --------
        >>> layer = BayesianLinear(2, 1)
        >>> layer.set_initial_value("bias", torch.tensor([0.5]))
        >>> layer.initial_values()["bias"]
        tensor([0.5000])
        """
        init = getattr(self, f"{name}_init")
        if tuple(value.shape) != tuple(init.shape):  # (copy_ would broadcast a row or a number over the whole tensor)
            raise ValueError(f"{type(self).__name__}.set_initial_value({name!r}, ...) needs a tensor of shape "
                             f"{tuple(init.shape)}, got {tuple(value.shape)}.")
        init.copy_(value.detach())

    def bayesian_parameters(self) -> dict[str, Prior]:
        """The names of this layer's sampled parameters and their priors.

        Examples
        --------
        >>> BayesianLinear(3, 2, bias=False).bayesian_parameters()
        {'weight': FanInNormal(gain=1.4142135623730951, bias_scale=1.0)}
        """
        return {name: prior for name, (_, prior) in self._bayesian.items()}

    def prior_distribution(self, name: str):
        """The prior distribution of parameter ``name`` (a distribution over the whole tensor).

        Examples
        --------
        >>> BayesianLinear(3, 2).prior_distribution("weight").event_shape
        torch.Size([2, 3])
        """
        fan_in, prior = self._bayesian[name]
        init = module_buffer(self, f"{name}_init")
        if getattr(prior, "learned", False):  # its scale changes every step (and carries gradients): not cached
            scale = getattr(self, f"{name}_prior_scale")
            distribution = prior.distribution(init.shape, fan_in, device=init.device, dtype=init.dtype, scale=scale)
            _LAYER_PRIORS.add(distribution)
            return distribution
        # built once per (prior and its current state, shape, device, dtype, initial value): it is read at every
        # step; a prior whose fields change (or whose tensors change in place) is rebuilt
        key = (id(prior), prior_state(prior), init.shape, init.device, init.dtype, tensor_version(init))
        cache = self.__dict__.setdefault("_prior_cache", {})
        cached = cache.get(name)
        if cached is None or cached[0] != key:
            extra = {"init": init} if getattr(prior, "uses_init", False) else {}
            distribution = prior.distribution(init.shape, fan_in, device=init.device, dtype=init.dtype, **extra)
            cached = cache[name] = (key, distribution)
            _LAYER_PRIORS.add(distribution)
        return cached[1]

    def initial_scales(self, full_names: bool = False) -> dict[str, torch.Tensor]:
        """Initial posterior standard deviations that a prior asks for (e.g. :class:`~pyro_bbb.priors.Moped`'s
        ``delta * |w|``); parameters whose prior does not are absent (the guide's ``init_scale`` applies).

        Examples
        --------
        >>> layer = BayesianLinear(3, 2, prior=priors.Moped(delta=0.1))
        >>> torch.allclose(layer.initial_scales()["weight"], (0.1 * layer.weight_init.abs()).clamp_min(1e-3))
        True
        """
        prefix = pyro_name(self) if full_names else ""
        return {
            site_name(prefix, name): prior.scale(module_buffer(self, f"{name}_init"))
            for name, (_, prior) in self._bayesian.items()
            if hasattr(prior, "scale") and getattr(prior, "uses_init", False)
        }

    def prior_widths(self, full_names: bool = False) -> dict[str, torch.Tensor]:
        """Each parameter's prior standard deviation, per element (:func:`pyro_bbb.priors.initial_width`): the widths
        ``MeanFieldGuide(init_scale="prior")`` starts the posterior at.

        Examples
        --------
        >>> layer = BayesianLinear(4, 2, prior=priors.FanInNormal())
        >>> float(layer.prior_widths()["weight"].max())
        0.5
        """
        prefix = pyro_name(self) if full_names else ""
        return {site_name(prefix, name): initial_width(self.prior_distribution(name)).detach()
                for name in self._bayesian}

    def site_priors(self) -> dict[str, Callable[[], Any]]:
        """Pyro site name -> a function returning the prior that site's parameter has now
        (:meth:`prior_distribution`): for code that reads priors outside a model run, such as the replayed step of
        :class:`pyro_bbb.ELBO`, without the data-plate check a model run makes.

        Examples
        --------
        >>> layer = BayesianLinear(3, 2)
        >>> readers = layer.site_priors()
        >>> sorted(readers), readers["weight"]().event_shape
        (['bias', 'weight'], torch.Size([2, 3]))
        """
        prefix = pyro_name(self)
        return {site_name(prefix, name): partial(self.prior_distribution, name) for name in self._bayesian}

    def initial_values(self, full_names: bool = False) -> dict[str, torch.Tensor]:
        """The initial value of every sampled parameter, keyed by name (or by Pyro site name).

        Examples
        --------
        >>> BayesianLinear(3, 2).initial_values()["weight"].shape
        torch.Size([2, 3])
        """
        prefix = pyro_name(self) if full_names else ""
        return {site_name(prefix, name): getattr(self, f"{name}_init") for name in self._bayesian}

    def _check_dtype(self, input: torch.Tensor, weight_dtype: torch.dtype) -> None:
        """A clear error for an input whose dtype is not the weights' (outside autocast)."""
        if input.dtype == weight_dtype or torch.is_autocast_enabled(input.device.type):
            return
        layer_dtype = getattr(self, f"{next(iter(self._bayesian))}_init").dtype
        if weight_dtype != layer_dtype and input.dtype == layer_dtype:  # the draw came from a guide of another dtype
            raise TypeError(
                f"{type(self).__name__} {pyro_name(self) or '(root)'} is {layer_dtype} but the weights its guide drew "
                f"are {weight_dtype}: a guide keeps the dtype it was built in. Give both one dtype: "
                f"guide.to({layer_dtype}), or the model back to the guide's, model.to({weight_dtype})."
            )
        raise TypeError(
            f"{type(self).__name__} {pyro_name(self) or '(root)'} got an input of dtype {input.dtype} but its "
            f"weights are {weight_dtype}; cast the input (x.to({weight_dtype}))"
            + (f" or the model (model.to({input.dtype}))" if input.is_floating_point() else "")
            + ". pyro_bbb.fit and predict cast floating inputs for you; integer inputs are never cast."
        )

    def _affine(self, input: torch.Tensor, apply, feature_dims: int) -> torch.Tensor:
        """``apply(input, weight, bias)`` as the effectful :func:`~pyro_bbb.nn.functional.bayesian_affine`, so that
        the estimators in :mod:`pyro_bbb.infer.estimators` can replace the shared weight draw. Inside
        :func:`~pyro_bbb._draws.fold_draws` the input's rows are blocks of one draw each (see
        :mod:`pyro_bbb._draws`)."""
        has_bias = "bias" in self._bayesian
        prefix = pyro_name(self)
        weight, bias = self.weight, self.bias if has_bias else None
        self._check_dtype(input, weight.dtype)
        num_draws, param_dims = folded_draws(), feature_dims + 1
        folded = False
        if num_draws is not None:  # (a single folded draw is read as plain weights)
            weight, bias = draws_leading(weight, param_dims, num_draws), draws_leading(bias, 1, num_draws)
            folded = weight.dim() > param_dims or (bias is not None and bias.dim() > 1)
            if folded:  # draw s on its block of rows: (S, rows, *features) against (S, 1, *param)
                rows = unfold_affine_input(input, num_draws, feature_dims)
                weight = weight.expand((num_draws, *weight.shape[-param_dims:])).unsqueeze(1)
                bias = None if bias is None else bias.expand((num_draws, bias.shape[-1])).unsqueeze(1)
        # where an estimator's per-example draws go (Flipout's signs), for folded draws or one plain weight (a weight
        # with draws of its own, from a plate around a layer outside BNN, keeps one per leading element)
        examples = None
        if folded or weight.dim() == param_dims:
            examples = example_draw_shape(tuple(input.shape), feature_dims, num_draws if folded else None)
        output = bayesian_affine(
            rows if folded else input, weight, bias, apply=apply, feature_dims=feature_dims,
            weight_site=site_name(prefix, "weight"), bias_site=site_name(prefix, "bias") if has_bias else None,
            draw=self.weight, examples=examples,
        )
        return fold_affine_output(output, input, feature_dims) if folded else output

    def _prior_repr(self) -> str:
        priors = {name: prior for name, (_, prior) in self._bayesian.items()}
        extra = [f"{name}_prior={p!r}" for name, p in priors.items() if p != self.prior]
        return ", ".join([f"prior={self.prior!r}", *extra])
