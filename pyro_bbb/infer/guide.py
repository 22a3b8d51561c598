"""``MeanFieldGuide``: an independent Normal posterior for every weight, sampled at the weight's own site."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from operator import attrgetter
from typing import Any

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions.transforms import biject_to
from pyro.infer.autoguide import AutoDelta, AutoGuideList, AutoLaplaceApproximation, AutoNormal
from pyro.infer.autoguide.initialization import init_to_median
from torch.distributions import transform_to

from .._checks import check_positive, require_set_up
from .._internals import (
    AutoNormalHooks,
    autonormal_event_dim,
    autonormal_loc_and_scale,
    module_local_params_enabled,
    pyro_name,
    site_name,
    unwrap_handlers,
)
from .._warnings import warn_at_caller
from ..nn.module import BayesianModule
from ..priors import is_real_support

__all__ = [
    "MeanFieldGuide", "DEFAULT_INIT_SCALE", "has_site_posteriors", "normal_site_parts", "never_trained",
    "require_site_posteriors",
    "require_fitted_posteriors", "site_loc_scale", "site_param_names", "drawn_posterior", "without_drawn_posterior",
    "site_posterior", "normal_mean", "AdoptedPosteriorWarning", "point_estimate_parts", "is_point_estimate",
]


@torch.no_grad()
def _fingerprint(param: torch.Tensor) -> torch.Tensor:
    """Up to 64 evenly spaced entries of ``param`` and its sum (an optimizer step, written in place through
    ``.data`` as fused kernels do, changes them without a trace in the tensor's version counter)."""
    flat = param.detach().reshape(-1)
    step = max(1, flat.numel() // 64)
    return torch.cat([flat[::step][:64], flat.sum(0, keepdim=True, dtype=torch.float64).to(flat.dtype)]).clone()


class AdoptedPosteriorWarning(UserWarning):
    """A new :class:`MeanFieldGuide` found a posterior another guide trained under its site names in Pyro's param
    store, and starts from it (the store is global). Call ``pyro.clear_param_store()`` before building a new model to
    start afresh.

    Examples
    --------
    >>> issubclass(AdoptedPosteriorWarning, UserWarning)
    True
    """

#: Key under which a guide site's ``infer`` dict carries the live posterior ``(loc, scale)`` of a mean-field Normal.
_POSTERIOR_KEY = "pyro_bbb_posterior"

#: Initial posterior standard deviation of every weight (``benchmarks/init_scale.py`` measures the choice).
DEFAULT_INIT_SCALE = 1e-4


class _InitFromModules:
    """Pyro init strategy: a Bayesian layer's own initial value, else the prior median."""

    def __init__(self, model: Callable):
        self.model = model
        self._values: dict[str, torch.Tensor] | None = None

    def _initial_values(self) -> dict[str, torch.Tensor]:
        if self._values is None:
            self._values = {}
            if isinstance(self.model, torch.nn.Module):
                for module in self.model.modules():
                    if isinstance(module, BayesianModule):
                        self._values.update(module.initial_values(full_names=True))
        return self._values

    def __call__(self, site: dict) -> torch.Tensor:
        value = self._initial_values().get(site["name"])
        if value is not None and value.shape == site["fn"].shape():
            return value.detach().clone()
        return init_to_median(site)


class MeanFieldGuide(AutoNormalHooks):
    """Mean-field Gaussian guide: ``q(w) = prod_i Normal(w_i | mu_i, sigma_i)`` over every latent site.

    Unlike Pyro's :class:`~pyro.infer.autoguide.AutoNormal`, which samples an auxiliary ``<name>_unconstrained``
    site and puts a ``Delta`` at the real one, this guide draws every real-valued site directly from a
    ``Normal`` at the site's own name. :class:`pyro.infer.TraceMeanField_ELBO` (and :class:`pyro_bbb.ELBO`)
    therefore use the closed-form KL, and effect handlers can read the posterior's mean and scale. Sites with a
    constrained support (e.g. a learned noise scale) get a Normal in unconstrained space pushed through
    ``biject_to(support)``, still at the site's own name (their KL is estimated by Monte Carlo).

    Parameters
    ----------
    model : callable
        The Pyro model, usually a :class:`~pyro.nn.PyroModule` built from :mod:`pyro_bbb.nn` layers.
    init_scale : float or "prior", optional
        Initial posterior standard deviation of every weight (unconstrained scale for constrained sites).
        Defaults to :data:`DEFAULT_INIT_SCALE`; ``benchmarks/README.md`` shows how it was chosen. ``"prior"``: every
        Bayesian layer's weights start at their prior's standard deviation (an empirical-Bayes prior's hyperprior
        mode; :func:`pyro_bbb.priors.initial_width`), other sites at :data:`DEFAULT_INIT_SCALE`.
    init_loc_fn : callable, optional
        A Pyro init strategy for the posterior means, as for ``AutoNormal``. By default each layer's posterior mean
        starts at the layer's own initialisation (what ``torch.nn`` would have drawn, or trained weights for
        converted models) and other sites at their prior median.
    create_plates : callable, optional
        As in :class:`~pyro.infer.autoguide.AutoNormal`: for models that subsample a plate
        (``pyro.plate("data", N, subsample=idx)``) with local latent variables inside it, return the model's plate
        with the same indices. The parameters of a local site have the plate's full size (also when the first call
        is subsampled) and are sliced by the plate at every call; :class:`pyro_bbb.ELBO` scales the local KL with
        the likelihood and counts the global KL once.

    Notes
    -----
    What differs from ``AutoNormal`` on purpose: there is no auxiliary ``<name>_unconstrained`` site and no
    ``Delta``, so the guide's log-density at a site is the Normal's (nonzero, where AutoNormal's is 0) and the KL is
    closed-form; the default ``init_scale`` is ``1e-4`` (AutoNormal's 0.1) and the default initial means are the
    layers' own initialisation (AutoNormal's ``init_to_feasible``). ``median()``, ``quantiles()`` and the ``locs`` /
    ``scales`` parameter modules are AutoNormal's. Run against Pyro 1.9.1's ``tests/infer/test_autoguide.py`` with
    ``AutoNormal`` replaced by this class (AutoNormal's defaults), every test passes except ``test_scores``, which
    asserts the ``Delta``'s zero log-density.

    Examples
    --------
    >>> layer = BayesianLinear(3, 1)
    >>> guide = MeanFieldGuide(layer)
    >>> _ = guide(torch.randn(5, 3))
    >>> q = guide.site_posteriors()["weight"]
    >>> torch.equal(q.loc, layer.weight_init), round(float(q.scale.max()), 6)
    (True, 0.0001)
    """

    def __init__(
        self,
        model: Callable,
        init_scale: float | None = None,
        init_loc_fn: Callable | None = None,
        *,
        create_plates: Callable | None = None,
    ):
        inner = unwrap_handlers(model)  # (a module inside poutine.block(...), as an AutoGuideList's part is built)
        if init_loc_fn is None:
            init_loc_fn = _InitFromModules(inner)
        elif not callable(init_loc_fn):
            raise ValueError(f"`init_loc_fn` must be a Pyro init strategy (a callable), got {init_loc_fn!r}.")
        widths_from_prior = isinstance(init_scale, str)
        if widths_from_prior and init_scale != "prior":
            raise ValueError(f'`init_scale` must be a number > 0 or "prior", got {init_scale!r}.')
        init_scale = check_positive("init_scale", DEFAULT_INIT_SCALE if widths_from_prior or init_scale is None
                                    else init_scale)
        super().__init__(model, init_loc_fn=init_loc_fn, init_scale=float(init_scale), create_plates=create_plates)
        self.__dict__["_widths_from_prior"] = widths_from_prior
        # kept out of the module tree (no parameters of the model in the guide's state), for the layers' init scales
        self.__dict__["_module"] = inner if isinstance(inner, torch.nn.Module) else None

    def after_set_up(self) -> None:
        """Set the layers' initial posterior widths and refuse parameters an earlier, different model left."""
        self._set_initial_scales()
        # Pyro's param store is global: a new guide adopts any parameter an earlier guide left there under the same
        # name. With another shape that can only be an earlier, different model; with the same shape and other values,
        # a posterior that guide trained.
        adopted = []
        for name, site in self.prototype_trace.iter_stochastic_nodes():
            initial = biject_to(site["fn"].support).inv(site["value"].detach())
            expected = list(initial.shape)
            for frame in site["cond_indep_stack"]:  # a subsampled plate's parameters have its full size
                if frame.vectorized and (frame.full_size or frame.size) != frame.size:
                    expected[frame.dim - self.event_dim(name)] = frame.full_size
            expected = tuple(expected)
            loc = attrgetter(name)(self.locs).detach()  # outside any plate: the full-size parameter
            if loc.shape != expected:
                raise ValueError(
                    f"Pyro's param store already holds a posterior for site {name!r} with shape {tuple(loc.shape)}, "
                    f"but this model's site has shape {expected}: it was left by an earlier model. Call "
                    "pyro.clear_param_store() before building a new model and guide."
                )
            if loc.shape == initial.shape and not torch.equal(loc, initial):
                adopted.append(name)
        if adopted:
            warn_at_caller(
                f"MeanFieldGuide: Pyro's param store already holds a posterior for the sites {adopted[:5]}"
                f"{' ...' if len(adopted) > 5 else ''}, trained by an earlier guide under the same names; this guide "
                "starts from it, not from its own initialisation, and the model's deterministic parameters under "
                "names the earlier model used (a pretrained body's weights) are the earlier model's too. Call "
                "pyro.clear_param_store() before building a new model and guide to start afresh (or ignore this if "
                "continuing that training is what you want).",
                AdoptedPosteriorWarning,
            )
        # what set-up left: any later step, load or restore replaces or changes these (see `is_untrained`)
        self.__dict__["_set_up_state"] = None if adopted else [(p, _fingerprint(p)) for p in self.parameters()]

    @property
    def is_untrained(self) -> bool:
        """Whether every parameter of the guide is still what set-up gave it (no optimizer step, load or restore
        since; ``False`` as well when set-up adopted a trained posterior from Pyro's param store, or when the model
        has no latent site, so the guide has nothing to train).

        Examples
        --------
        >>> guide = MeanFieldGuide(BayesianLinear(3, 1))
        >>> _ = guide(torch.randn(5, 3))
        >>> guide.is_untrained
        True
        >>> with torch.no_grad():
        ...     _ = guide.locs.weight.add_(1.0)
        >>> guide.is_untrained
        False
        """
        if self.prototype_trace is None:
            return True
        state = self.__dict__.get("_set_up_state")
        if state is None:  # set-up adopted another guide's trained posterior
            return False
        current = list(self.parameters())
        return 0 < len(current) == len(state) and all(
            p is q and torch.equal(_fingerprint(p), print_) for p, (q, print_) in zip(current, state)
        )

    @torch.no_grad()
    def _set_initial_scales(self) -> None:
        """Posterior widths a layer's prior asks for (MOPED: ``delta * |w|``), or with ``init_scale="prior"`` the
        prior's width, replace ``init_scale`` at set-up."""
        model = self.__dict__.get("_module")
        if model is None:
            return
        for module in model.modules():
            if isinstance(module, BayesianModule):
                scales = module.prior_widths(full_names=True) if self.__dict__.get("_widths_from_prior") else {}
                scales.update(module.initial_scales(full_names=True))
                for site, scale in scales.items():
                    if self.has_site(site):
                        constrained = attrgetter(site)(self.scales)
                        constrained.unconstrained().copy_(transform_to(self.scale_constraint).inv(scale))

    @staticmethod
    def _constrain(normal: dist.Distribution, site: dict) -> dist.Distribution:
        """The Normal itself for a real-valued site, else pushed through ``biject_to(support)``."""
        if is_real_support(site["fn"].support):
            return normal
        return dist.TransformedDistribution(normal, [biject_to(site["fn"].support)])

    def _read_loc_and_scale(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The site's (constrained) loc and scale: straight from the param store by full name when they are there.

        Same values and the same ``param`` messages as the nested ``PyroModule`` attribute lookup of
        ``AutoNormal`` (which also re-registers parameters after ``pyro.clear_param_store()``, so it stays the
        fallback), at a fraction of its Python cost -- a noticeable part of a small network's step.
        """
        names = self.posterior_param_names(name)
        if names is None:
            return self.autonormal_loc_and_scale(name)
        # event_dim lets a subsampling plate around this call slice the full-size parameters, as AutoNormal's do
        event_dim = self.event_dim(name)
        return pyro.param(names[0], event_dim=event_dim), pyro.param(names[1], event_dim=event_dim)

    def posterior_param_names(self, name: str) -> tuple[str, str] | None:
        """The names in Pyro's param store of site ``name``'s posterior loc and (constrained) scale; ``None`` when
        they are not read from there (module-local parameters, or not created yet).

        Examples
        --------
        >>> guide = MeanFieldGuide(BayesianLinear(2, 1))
        >>> _ = guide(torch.zeros(1, 2))
        >>> guide.posterior_param_names("weight")
        ('MeanFieldGuide.locs.weight', 'MeanFieldGuide.scales.weight')
        """
        names = self.__dict__.setdefault("_param_names", {}).get(name)
        if names is None:
            names = self._param_names[name] = site_param_names(self, name)
        store = pyro.get_param_store()
        if module_local_params_enabled() or not all(n in store for n in names):
            return None
        return names

    @property
    def is_pruned(self) -> bool:
        """Whether a :meth:`pruned` block is active (some weights fixed at 0).

        Examples
        --------
        >>> MeanFieldGuide(BayesianLinear(2, 1)).is_pruned
        False
        """
        return bool(self.__dict__.get("_keep_masks"))

    def loc_and_scale(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Site ``name``'s (constrained) ``(loc, scale)``; a pruned weight's are 0 and the smallest positive scale."""
        loc, scale = self._read_loc_and_scale(name)
        mask = self.__dict__.get("_keep_masks", {}).get(name)
        if mask is None:
            return loc, scale
        # a pruned weight is zero: mean 0 and the smallest positive scale (a Normal needs scale > 0), so |w| < 1e-37
        return loc * mask, torch.where(mask, scale, torch.finfo(scale.dtype).tiny)

    @contextmanager
    def pruned(self, keep_masks: dict[str, torch.Tensor]):
        """Within the block, weights where ``keep_masks[site]`` is False are fixed at 0 (mean 0, the smallest
        positive scale); see :func:`pyro_bbb.evaluate.pruning.prune_by_snr`.

        Examples
        --------
        >>> guide = MeanFieldGuide(BayesianLinear(2, 1), init_loc_fn=lambda site: torch.ones(site["fn"].shape()))
        >>> _ = guide(torch.zeros(1, 2))
        >>> with guide.pruned({"weight": torch.tensor([[True, False]])}):
        ...     guide.site_posteriors()["weight"].loc
        tensor([[1., 0.]])
        """
        previous = self.__dict__.get("_keep_masks")
        self.__dict__["_keep_masks"] = keep_masks
        try:
            yield
        finally:
            self.__dict__["_keep_masks"] = previous or {}

    def _posterior(self, name: str, site: dict) -> dist.Distribution:
        return self.posterior_at(name, *self.loc_and_scale(name))

    def posterior_at(self, name: str, loc: torch.Tensor, scale: torch.Tensor) -> dist.Distribution:
        """The distribution this guide samples site ``name`` from, for the (constrained) parameters ``loc`` and
        ``scale``: ``Normal(loc, scale)``, pushed through ``biject_to(support)`` for a constrained site.

        Examples
        --------
        >>> guide = MeanFieldGuide(BayesianLinear(2, 1))
        >>> _ = guide(torch.zeros(1, 2))
        >>> guide.posterior_at("bias", torch.zeros(1), torch.ones(1)).event_shape
        torch.Size([1])
        """
        site = self.prototype_trace.nodes[name]
        return self._constrain(dist.Normal(loc, scale).to_event(self.event_dim(name)), site)

    def _sample(self, name: str, site: dict) -> torch.Tensor:
        """``pyro.sample`` at the site's own name; a real site carries its live ``(loc, scale)`` in ``infer`` for
        the estimators of :mod:`pyro_bbb.infer.estimators` (replay copies it to the model's site)."""
        loc, scale = self.loc_and_scale(name)
        if is_real_support(site["fn"].support):
            normal = dist.Normal(loc, scale).to_event(self.event_dim(name))
            return pyro.sample(name, normal, infer={_POSTERIOR_KEY: (loc, scale)})
        return pyro.sample(name, self.posterior_at(name, loc, scale))

    def forward(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        """Draw every latent site from its posterior; returns ``{site_name: value}``."""
        if self.prototype_trace is None:
            self.set_up(*args, **kwargs)
        plates = self.plates_for_call(*args, **kwargs)
        result = {}
        for name, site in self.prototype_trace.iter_stochastic_nodes():
            with ExitStack() as stack:
                for frame in site["cond_indep_stack"]:
                    if frame.vectorized:
                        stack.enter_context(plates[frame.name])
                result[name] = self._sample(name, site)
        return result

    @torch.no_grad()
    def site_posteriors(self) -> dict[str, dist.Distribution]:
        """Detached posterior of every site: ``{site_name: Normal(loc, scale)}`` (elementwise, batch-shaped).

        Real-valued sites (all weights and biases) give a :class:`pyro.distributions.Normal`; a constrained site
        gives the :class:`~pyro.distributions.TransformedDistribution` of its unconstrained Normal.

        Examples
        --------
        >>> guide = MeanFieldGuide(BayesianLinear(2, 1), init_scale=0.05)
        >>> _ = guide(torch.zeros(1, 2))
        >>> guide.site_posteriors()["bias"].scale
        tensor([0.0500])
        """
        require_set_up(self, "the posterior")
        posteriors = {}
        for name, site in self.prototype_trace.iter_stochastic_nodes():
            loc, scale = (t.detach().clone() for t in self.loc_and_scale(name))
            posteriors[name] = self._constrain(dist.Normal(loc, scale), site)
        return posteriors


# -- per-site Normal posteriors of any guide that has them ------------------------------------------------------
def has_site_posteriors(guide) -> bool:
    """Whether ``guide`` has an independent Normal posterior (in unconstrained space) at every latent site:
    :class:`MeanFieldGuide` and Pyro's :class:`~pyro.infer.autoguide.AutoNormal` do; ``AutoDelta``,
    ``AutoDiagonalNormal`` (one joint latent), ``AutoLowRankMultivariateNormal``, ``AutoGuideList`` and
    hand-written guides do not. Per-layer summaries, ``check_posterior`` and the per-layer columns of
    :class:`pyro_bbb.train.History` need them.

    Examples
    --------
    >>> from pyro.infer.autoguide import AutoDelta
    >>> layer = BayesianLinear(2, 1)
    >>> has_site_posteriors(MeanFieldGuide(layer)), has_site_posteriors(AutoDelta(layer))
    (True, False)
    """
    return isinstance(guide, AutoNormal)


def normal_site_parts(guide) -> dict[str, Any]:
    """Each latent site that ``guide`` gives an independent Normal posterior (in unconstrained space), mapped to the
    guide that holds it: every site of a :class:`MeanFieldGuide` or ``AutoNormal``; in an ``AutoGuideList``, the
    sites of such parts (an ``AutoDelta`` part's are point estimates, left out); none for any other guide, or one
    not set up yet. What the per-layer diagnostics read.

    Examples
    --------
    >>> from pyro.infer.autoguide import AutoDelta
    >>> layer = BayesianLinear(2, 1)
    >>> guide = AutoGuideList(layer)
    >>> guide.append(AutoDelta(poutine.block(layer, hide=["bias"])))
    >>> guide.append(MeanFieldGuide(poutine.block(layer, expose=["bias"])))
    >>> _ = guide(torch.zeros(1, 2))
    >>> {name: type(part).__name__ for name, part in normal_site_parts(guide).items()}
    {'bias': 'MeanFieldGuide'}
    """
    if isinstance(guide, AutoGuideList):
        return {name: owner for part in guide for name, owner in normal_site_parts(part).items()}
    trace = getattr(guide, "prototype_trace", None)
    if not isinstance(guide, AutoNormal) or trace is None:
        return {}
    return {name: guide for name, _ in trace.iter_stochastic_nodes()}


def never_trained(guide) -> bool:
    """Whether ``guide``'s Normal posteriors are still what set-up gave them: a :class:`MeanFieldGuide` no step has
    changed, or an ``AutoGuideList`` whose every ``MeanFieldGuide`` part is (``False`` for guides that do not say).

    Examples
    --------
    >>> guide = MeanFieldGuide(BayesianLinear(2, 1))
    >>> _ = guide(torch.zeros(1, 2))
    >>> never_trained(guide)
    True
    """
    if isinstance(guide, AutoGuideList):
        parts = {id(part): part for part in normal_site_parts(guide).values()}.values()
        return bool(parts) and all(never_trained(part) for part in parts)
    return bool(getattr(guide, "is_untrained", False))


def point_estimate_parts(guide) -> list[Any]:
    """The parts of ``guide`` that give their latent sites a point mass (a MAP estimate): an ``AutoDelta``, an
    ``AutoLaplaceApproximation`` (a MAP estimate until its ``laplace_approximation()``), or those inside an
    ``AutoGuideList``; ``[]`` for any other guide (hand-written guides are not read here).

    Examples
    --------
    >>> from pyro.infer.autoguide import AutoDelta
    >>> layer = BayesianLinear(2, 1)
    >>> len(point_estimate_parts(AutoDelta(layer))), point_estimate_parts(MeanFieldGuide(layer))
    (1, [])
    """
    if isinstance(guide, AutoDelta | AutoLaplaceApproximation):
        return [guide]
    if isinstance(guide, AutoGuideList):
        return [point for part in guide for point in point_estimate_parts(part)]
    return []


def is_point_estimate(guide) -> bool:
    """Whether every part of ``guide`` is a point estimate (:func:`point_estimate_parts`): its "KL" is a prior's
    negative log density, so a KL weight sets the prior's strength for a MAP estimate, not a posterior's temperature.

    Examples
    --------
    >>> from pyro.infer.autoguide import AutoDelta
    >>> layer = BayesianLinear(2, 1)
    >>> is_point_estimate(AutoDelta(layer)), is_point_estimate(MeanFieldGuide(layer))
    (True, False)
    """
    if isinstance(guide, AutoGuideList):
        parts = list(guide)
        return bool(parts) and all(is_point_estimate(part) for part in parts)
    return isinstance(guide, AutoDelta | AutoLaplaceApproximation)


def require_site_posteriors(guide, what: str, some: bool = False) -> None:
    """Raise a ``ValueError`` naming ``what`` needs per-site Normal posteriors when ``guide`` has none (``some``:
    when it has none at any site, e.g. an ``AutoGuideList`` whose parts are all point estimates).

    Examples
    --------
    >>> from pyro.infer.autoguide import AutoDelta
    >>> require_site_posteriors(AutoDelta(BayesianLinear(2, 1)), "summary")
    Traceback (most recent call last):
    ...
    ValueError: summary needs a guide with an independent Normal posterior at every weight ...
    """
    if some and normal_site_parts(guide):
        return
    if not has_site_posteriors(guide):
        where = ("at some weights (pyro_bbb.MeanFieldGuide or Pyro's AutoNormal, alone or as a part of an "
                 "AutoGuideList)" if some else "at every weight (pyro_bbb.MeanFieldGuide or Pyro's AutoNormal)")
        which = ("an AutoGuideList is not read here, whatever its parts" if isinstance(guide, AutoGuideList)
                 and not some else f"{type(guide).__name__} does not have one")
        raise ValueError(
            f"{what} needs a guide with an independent Normal posterior {where}; {which}. fit, predict, save and "
            "load work with any guide."
        )


def require_fitted_posteriors(guide, what: str, some: bool = False) -> None:
    """Raise a clear error when ``what`` cannot read ``guide``'s per-site posteriors: the guide has not seen the
    model yet (:class:`~pyro_bbb._checks.GuideNotSetUpError`), or has no Normal posterior per site (``ValueError``;
    ``some``: at no site, :func:`normal_site_parts`).

    Examples
    --------
    >>> require_fitted_posteriors(MeanFieldGuide(BayesianLinear(2, 1)), "pruning")
    Traceback (most recent call last):
    ...
    pyro_bbb._checks.GuideNotSetUpError: the guide has not seen the model yet (it has not been fitted), and pruning ...
    """
    require_set_up(guide, what)
    require_site_posteriors(guide, what, some)


# The one place that answers, for any guide with a Normal posterior per site (MeanFieldGuide, AutoNormal), what a
# site's posterior is: its parameters' names in the store (site_param_names), its live loc and scale
# (site_loc_scale), its distribution (site_posterior), and -- inside a trace -- the (loc, scale) a draw came from
# (drawn_posterior). IVON, the estimators, the ELBO's replay, diagnostics, pruning, plots and export ask here.
def site_loc_scale(guide, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The live (differentiable) posterior mean and standard deviation of site ``name``, in unconstrained space for
    a constrained site; a pruned weight's are 0 and the smallest positive scale.

    Examples
    --------
    >>> from pyro.infer.autoguide import AutoNormal
    >>> pyro.clear_param_store()
    >>> guide = AutoNormal(BayesianLinear(2, 1), init_scale=0.05)
    >>> _ = guide(torch.zeros(1, 2))
    >>> site_loc_scale(guide, "bias")[1]
    tensor([0.0500], grad_fn=<SoftplusBackward0>)
    >>> site_loc_scale(guide, "fc9.weight")
    Traceback (most recent call last):
    ...
    KeyError: "no latent site named 'fc9.weight'; the guide's sites are ['bias', 'weight']."
    """
    require_set_up(guide, "the posterior of a site")
    if isinstance(guide, AutoGuideList):
        return site_loc_scale(_part_holding(guide, name), name)
    require_site_posteriors(guide, "the posterior of a site")
    site = guide.prototype_trace.nodes.get(name)
    if site is None or site["type"] != "sample" or site["is_observed"]:
        names = sorted(n for n, _ in guide.prototype_trace.iter_stochastic_nodes())
        raise KeyError(f"no latent site named {name!r}; the guide's sites are {names}.")
    if isinstance(guide, MeanFieldGuide):
        return guide.loc_and_scale(name)
    return autonormal_loc_and_scale(guide, name)


def _part_holding(guide: AutoGuideList, name: str):
    """The part of ``guide`` that gives site ``name`` a Normal posterior; a ``KeyError`` naming those that do."""
    parts = normal_site_parts(guide)
    if name not in parts:
        raise KeyError(f"site {name!r} has no Normal posterior in this AutoGuideList (a point estimate, or no such "
                       f"site); the sites with one are {sorted(parts)}.")
    return parts[name]


def drawn_posterior(site: dict) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The live ``(loc, scale)`` a :class:`MeanFieldGuide` drew a real-valued sample site from (what the estimators
    read), or ``None`` for any other site.

    Examples
    --------
    >>> guide = MeanFieldGuide(BayesianLinear(2, 1))
    >>> trace = poutine.trace(guide).get_trace(torch.zeros(1, 2))
    >>> [t.shape for t in drawn_posterior(trace.nodes["weight"])]
    [torch.Size([1, 2]), torch.Size([1, 2])]
    """
    return site["infer"].get(_POSTERIOR_KEY)


def without_drawn_posterior(infer: dict) -> dict:
    """A copy of a sample site's ``infer`` without the ``(loc, scale)`` a :class:`MeanFieldGuide` draw carries: a value
    set by hand (e.g. at the posterior mean) is then used as it is, not redrawn by an estimator.

    Examples
    --------
    >>> guide = MeanFieldGuide(BayesianLinear(2, 1))
    >>> trace = poutine.trace(guide).get_trace(torch.zeros(1, 2))
    >>> drawn_posterior({"infer": without_drawn_posterior(trace.nodes["weight"]["infer"])}) is None
    True
    """
    return {key: value for key, value in infer.items() if key != _POSTERIOR_KEY}


def site_param_names(guide, name: str) -> tuple[str, str]:
    """The names in Pyro's param store of site ``name``'s posterior loc and (unconstrained) scale, for a
    :class:`MeanFieldGuide` or Pyro's ``AutoNormal`` (whether or not they exist yet).

    Examples
    --------
    >>> from pyro.infer.autoguide import AutoNormal
    >>> site_param_names(AutoNormal(BayesianLinear(2, 1)), "weight")
    ('AutoNormal.locs.weight', 'AutoNormal.scales.weight')
    """
    prefix = guide.module_name if isinstance(guide, MeanFieldGuide) else pyro_name(guide)
    return site_name(prefix, f"locs.{name}"), site_name(prefix, f"scales.{name}")


def site_posterior(guide, name: str, site: dict) -> dist.Distribution:
    """The posterior distribution over site ``name`` (``site`` is its prototype-trace entry): the Normal of
    :func:`site_loc_scale` over the whole tensor, pushed through ``biject_to(support)`` for a constrained site.

    Examples
    --------
    >>> guide = MeanFieldGuide(BayesianLinear(2, 1))
    >>> _ = guide(torch.zeros(1, 2))
    >>> site_posterior(guide, "weight", guide.prototype_trace.nodes["weight"]).event_shape
    torch.Size([1, 2])
    """
    if isinstance(guide, AutoGuideList):
        guide = _part_holding(guide, name)
    loc, scale = site_loc_scale(guide, name)
    normal = dist.Normal(loc, scale).to_event(autonormal_event_dim(guide, name))
    return MeanFieldGuide._constrain(normal, site)


def normal_mean(fn: dist.Distribution) -> torch.Tensor | None:
    """The value at the mean of a (possibly ``Independent``-wrapped, possibly transformed) ``Normal`` -- the Normal's
    mean pushed through the transforms -- else ``None``: the posterior-mean value of a :class:`MeanFieldGuide` site.

    Examples
    --------
    >>> normal_mean(dist.Normal(torch.zeros(2), 1.0).to_event(1))
    tensor([0., 0.])
    >>> normal_mean(dist.LogNormal(torch.zeros(1), 1.0)), normal_mean(dist.Gamma(1.0, 1.0))
    (tensor([1.]), None)
    """
    transforms = []
    while True:
        if isinstance(fn, torch.distributions.Independent):
            fn = fn.base_dist
        elif isinstance(fn, torch.distributions.TransformedDistribution):
            transforms = list(fn.transforms) + transforms
            fn = fn.base_dist
        else:
            break
    if not isinstance(fn, torch.distributions.Normal):
        return None
    value = fn.loc
    for transform in transforms:
        value = transform(value)
    return value
