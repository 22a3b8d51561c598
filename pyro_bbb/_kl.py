"""The KL arithmetic of the ELBO and of the diagnostics: closed-form Normal KLs (one site, or every site of a step
together) and the Monte Carlo fallback.

Examples
--------
>>> mu, s = torch.zeros(3), torch.ones(3)
>>> float(normal_kl_of(mu, s, 0.0, 1.0))
0.0
"""

from __future__ import annotations

import functools
import math
import weakref
from numbers import Real

import torch
from pyro.distributions import Delta, Normal
from pyro.distributions.kl import kl_divergence
from pyro.distributions.util import scale_and_mask
from pyro.util import check_site_shape

from ._internals import autonormal_draw_site, foreach_norm, tensor_version
from .distributions import EmpiricalBayesNormalDistribution
from .priors import prior_std, strip_independent

__all__ = [
    "log_prob_sum", "base_normal", "has_trainable_parameters", "normal_kl_sum", "normal_kl_of", "constant_normal",
    "zero_mean_prior_scale",
    "batched_normal_kls", "site_kl", "is_unscaled", "elementwise_kl", "normal_kl_floor", "total_kl", "latent_site_kl",
    "sum_site_kls",
]


def log_prob_sum(site: dict, max_plate_nesting: float | None = None) -> torch.Tensor:
    """Scaled and masked log-density of a site's value, summed; checks plate shapes when given the nesting."""
    log_prob = site["fn"].log_prob(site["value"], *site["args"], **site["kwargs"])
    if max_plate_nesting is not None:
        site["log_prob"] = log_prob
        check_site_shape(site, max_plate_nesting)
    return scale_and_mask(log_prob, site["scale"], site["mask"]).sum()


def base_normal(d) -> Normal | None:
    d = strip_independent(d)
    return d if type(d) is Normal else None


def needs_posterior(d) -> bool:
    """Whether a prior's KL needs the posterior itself (an empirical-Bayes prior, whose scale is set from ``q``).

    Examples
    --------
    >>> needs_posterior(priors.EmpiricalBayesNormal().distribution((2,), fan_in=2)), needs_posterior(dist.Normal(0, 1))
    (True, False)
    """
    return isinstance(strip_independent(d), EmpiricalBayesNormalDistribution)


def has_trainable_parameters(d) -> bool:
    """Whether a distribution's parameters carry gradients (a learned or hierarchical prior)."""
    return any(isinstance(v, torch.Tensor) and v.requires_grad for v in vars(strip_independent(d)).values())


def _is_constant(t: torch.Tensor) -> bool:
    """A tensor expanded from one number (every stride 0); not an empty one (no number to read)."""
    return t.numel() > 0 and (all(stride == 0 for stride in t.stride()) or t.numel() == 1)


#: Per prior distribution (layers cache theirs): the versions of its loc and scale, and ``(m, t)`` as Python numbers
#: or None when the fast path does not apply. Read once per prior (and again after an in-place change), so the step
#: does not synchronise with the device to look at them.
_PRIOR_CONSTANTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _prior_constants(p) -> tuple[float, float] | None:
    """``(m, t)`` of a Normal prior with one constant loc and scale; None when the prior's parameters vary, or carry
    gradients (a learned or hierarchical prior: the KL must reach them, so it is computed in torch)."""
    base = base_normal(p)
    if base is None or base.loc.requires_grad or base.scale.requires_grad:
        return None
    versions = (tensor_version(base.loc), tensor_version(base.scale))
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
    base = base_normal(p)
    if base is None or base.loc.requires_grad or not base.scale.requires_grad:
        return None
    if not (_is_constant(base.loc) and _is_constant(base.scale)):
        return None
    return float(base.loc.reshape(-1)[0]), base.scale.reshape(-1)[0]


def normal_kl_sum(mu: torch.Tensor, s: torch.Tensor, p) -> torch.Tensor | None:
    """``sum KL(Normal(mu, s) || Normal(m, t))`` over a whole weight tensor when the prior ``p`` has one ``(m, t)``.

    ``n (log t - 1/2) - sum log s + (sum s^2 + sum (mu - m)^2) / (2 t^2)``: three reductions instead of the ten
    elementwise passes of the general formula (the KL is the costliest part of a step after the matrix products).
    ``t`` may be a learned scalar tensor, which the KL's gradient then reaches.
    """
    constants = _prior_constants(p) or _learned_scale_constants(p)
    if constants is None or mu.shape != base_normal(p).loc.shape:
        return None
    return normal_kl_of(mu, s, *constants)


def normal_kl_of(mu: torch.Tensor, s: torch.Tensor, m: float, t: float | torch.Tensor) -> torch.Tensor:
    """:func:`normal_kl_sum` given the prior's ``(m, t)``."""
    n = mu.numel()
    squares = torch.linalg.vector_norm(s).square() + torch.linalg.vector_norm(mu).square()
    if m != 0.0:  # sum (mu - m)^2 = |mu|^2 - 2 m sum(mu) + n m^2, without an elementwise pass
        squares = squares - 2 * m * mu.sum() + n * m * m
    log_t = t.log() if isinstance(t, torch.Tensor) else math.log(t)
    return squares * (0.5 / (t * t)) - s.log().sum() + n * (log_t - 0.5)


def constant_normal(p) -> tuple[float, float] | None:
    """``(m, t)`` when ``p`` is a Normal prior with one fixed loc ``m`` and scale ``t`` over its whole tensor (numbers
    read once per prior, not every call), else None.

    Examples
    --------
    >>> constant_normal(dist.Normal(0.0, 0.5).expand([3, 2]).to_event(2)), constant_normal(dist.Laplace(0.0, 1.0))
    ((0.0, 0.5), None)
    """
    return _prior_constants(p)


def zero_mean_prior_scale(mu: torch.Tensor, p) -> float | None:
    """``t`` when ``p`` is a Normal(0, t) prior with number parameters over a tensor of ``mu``'s shape (the KLs that
    :func:`batched_normal_kls` computes together), else None."""
    constants = _prior_constants(p)
    if constants is None or constants[0] != 0.0 or mu.shape != base_normal(p).loc.shape:
        return None
    return constants[1]


def batched_normal_kls(sites: list[tuple[torch.Tensor, torch.Tensor, float]]) -> torch.Tensor:
    """``sum KL(Normal(mu, s) || Normal(0, t))`` over each site's tensor, one entry per ``(mu, s, t)``.

    ``(|s|^2 + |mu|^2) / (2 t^2) - sum log s + n (log t - 1/2)``, as :func:`normal_kl_sum`, with every site's norms
    in one foreach call and the rest on vectors of one entry per site: about ten operations for any number of sites
    instead of ten per site (a small network's step is bounded by how many operations it runs, not their size).
    """
    locs, scales, ts = zip(*sites)
    if len({(s.dtype, s.device) for s in (*locs, *scales)}) > 1:  # mixed precision or devices: one site at a time
        return torch.stack([normal_kl_of(mu, s, 0.0, t) for mu, s, t in sites])
    norms = torch.stack(foreach_norm([*scales, *locs])).square()
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


def site_kl(guide_site: dict, model_site: dict) -> torch.Tensor:
    """KL(q || p) of one latent site: closed form where registered, else log q(w) - log p(w) at the draw.

    A ``Delta`` site (Pyro's ``AutoNormal`` and ``AutoDiagonalNormal`` put one at each latent, drawn through an
    auxiliary site whose log q the ELBO counts) is read at its draw: its ``log_density`` holds the Jacobian of the
    map to a constrained support, which Pyro's registered ``kl_divergence(Delta, p)`` leaves out."""
    q = base_normal(guide_site["fn"]) if guide_site["mask"] is None else None
    if q is not None:
        kl = normal_kl_sum(q.loc, q.scale, model_site["fn"])
        if kl is not None:
            return kl * guide_site["scale"]
    if isinstance(strip_independent(guide_site["fn"]), Delta):
        return log_prob_sum(guide_site) - log_prob_sum(model_site)
    try:
        kl = kl_divergence(guide_site["fn"], model_site["fn"])
    except NotImplementedError:
        return log_prob_sum(guide_site) - log_prob_sum(model_site)
    kl = scale_and_mask(kl, scale=guide_site["scale"], mask=guide_site["mask"])
    if torch.is_tensor(kl):
        return kl.sum()
    return torch.as_tensor(kl * torch.Size(guide_site["fn"].batch_shape).numel())


def is_unscaled(scale) -> bool:
    return isinstance(scale, Real) and scale == 1.0


def elementwise_kl(q: torch.distributions.Distribution, p: torch.distributions.Distribution,
                   draws: int = 256) -> torch.Tensor:
    """Elementwise ``KL(q_i || p_i)`` of a mean-field site; closed form where registered, else a Monte Carlo
    estimate from ``draws`` draws of ``q``.

    Examples
    --------
    >>> q, p = dist.Normal(torch.zeros(2), torch.ones(2)), dist.Normal(0.0, 2.0).expand([2])
    >>> elementwise_kl(q, p)
    tensor([0.3181, 0.3181])
    """
    q, p = strip_independent(q), strip_independent(p)
    try:
        return kl_divergence(q, p)
    except NotImplementedError:
        values = q.sample((draws,))
        return (q.log_prob(values) - p.log_prob(values)).mean(0)


#: The floor's search: widths from 1e-4 to 4 times the prior's, and the draws of the standard Normal each is read at
_FLOOR_WIDTHS, _FLOOR_DRAWS = torch.logspace(-4, math.log10(4.0), 64), 4096


def normal_kl_floor(p: torch.distributions.Distribution) -> float:
    """The least ``KL(q || p_i)`` a Normal ``q`` can have against each element of a real-valued prior: 0 for a
    Normal prior, about 0.66 nats for the default scale mixture. A weight's KL above it is what the data put there.

    The Normal is centred on the prior (its median, else its mean) and its width searched on a grid from 1e-4 to 4
    times the prior's (by 4096 common draws: a few thousandths of a nat). A prior whose elements differ (its own
    tensor of parameters) gets 0: the KL itself is then read, as for a Normal prior.

    Examples
    --------
    >>> round(normal_kl_floor(dist.Normal(0.0, 3.0).expand([4])), 3)
    0.0
    >>> round(normal_kl_floor(priors.ScaleMixtureNormal().distribution((50, 20), fan_in=20)), 2)
    0.66
    """
    base = strip_independent(p)
    if type(base) is Normal or not _same_everywhere(base):
        return 0.0
    with torch.no_grad():
        first = (0,) * len(base.batch_shape)
        centre = float(_centre(base)[first])
        widths = _FLOOR_WIDTHS.double() * float(prior_std(base)[first])
        z = torch.randn(_FLOOR_DRAWS, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        values = (centre + widths[:, None] * z).reshape(-1)
        log_q = Normal(0.0, widths[:, None]).log_prob(widths[:, None] * z)
        log_p = _log_prob_at(base, values).reshape(log_q.shape)
        return max(float((log_q - log_p).mean(1).min()), 0.0)


def _same_everywhere(base: torch.distributions.Distribution) -> bool:
    """Whether every element of a prior is the same distribution (its density equal at two probe values)."""
    shape = base.batch_shape
    params = next((t for t in vars(base).values() if isinstance(t, torch.Tensor)), None)
    dtype, device = (params.dtype, params.device) if params is not None else (torch.get_default_dtype(), None)
    with torch.no_grad():
        for probe in (0.3, -1.7):
            log_p = base.log_prob(torch.full(shape, probe, dtype=dtype, device=device)).reshape(-1)
            if log_p.numel() and not bool((log_p == log_p[0]).all()):
                return False
    return True


def _centre(base: torch.distributions.Distribution) -> torch.Tensor:
    try:
        return base.icdf(torch.tensor(0.5)).expand(base.batch_shape)
    except (NotImplementedError, AttributeError):
        mean = base.mean.expand(base.batch_shape)
        return torch.where(torch.isfinite(mean), mean, torch.zeros_like(mean))


def _log_prob_at(base: torch.distributions.Distribution, values: torch.Tensor) -> torch.Tensor:
    """The density of a prior whose elements are all alike at each of ``values``, packed into rows of its shape."""
    numel = max(base.batch_shape.numel(), 1)
    rows = -(-values.numel() // numel)
    packed = torch.cat([values, values.new_zeros(rows * numel - values.numel())]).reshape(rows, *base.batch_shape)
    params = next((t for t in vars(base).values() if isinstance(t, torch.Tensor)), packed)
    log_p = base.log_prob(packed.to(params.dtype if params.is_floating_point() else packed.dtype))
    return log_p.double().reshape(-1)[: values.numel()].cpu()


def total_kl(q: torch.distributions.Distribution, p: torch.distributions.Distribution,
             draws: int = 256) -> torch.Tensor:
    """``KL(q || p)`` of a mean-field site: :func:`elementwise_kl` summed.

    Examples
    --------
    >>> float(total_kl(dist.Normal(torch.zeros(3), 1.0), dist.Normal(torch.zeros(3), 1.0)))
    0.0
    """
    return elementwise_kl(q, p, draws).sum()


def latent_site_kl(name: str, model_site: dict, guide_trace,
                   validate: bool = False) -> tuple[torch.Tensor | None, tuple | None, str | None]:
    """How the ELBO counts latent site ``name``'s KL: ``(kl, None, drawn)``, or ``(None, (loc, scale, t), drawn)``
    when it is closed-form against a ``Normal(0, t)`` prior (computed with the others by :func:`batched_normal_kls`).
    ``drawn`` names AutoNormal's auxiliary site whose Normal a prior that needs the posterior reads (its log q is then
    in this KL), else ``None``. A clear error for a site the guide lacks, or (``validate``) does not reparameterize.

    Examples
    --------
    >>> trace = pyro.poutine.trace(lambda: pyro.sample("w", Normal(1.0, 2.0))).get_trace()
    >>> model_site = {**trace.nodes["w"], "fn": Normal(0.0, 1.0)}
    >>> latent_site_kl("w", model_site, trace)[1][2]
    1.0
    """
    guide_site = guide_trace.nodes.get(name)
    if guide_site is None:
        raise ValueError(
            f"the model's latent site {name!r} has no posterior in the guide: the guide was set up from an earlier "
            "call whose model had no such site (a site the model emits only for some inputs). Emit the same latent "
            "sites on every call, or observe this one.")
    if validate and not guide_site["fn"].has_rsample:
        raise NotImplementedError(
            f"guide site {name!r} ({type(guide_site['fn']).__name__}) is not reparameterizable; pyro_bbb.ELBO needs "
            "reparameterized guide draws (MeanFieldGuide's are).")
    draw = autonormal_draw_site(guide_trace, name) if needs_posterior(model_site["fn"]) else None
    if draw is not None:  # AutoNormal's site is a Delta: the prior's KL reads the Normal it draws through
        guide_site = draw
    drawn = None if draw is None else draw["name"]
    q = base_normal(guide_site["fn"]) if guide_site["mask"] is None and is_unscaled(guide_site["scale"]) else None
    t = None if q is None else zero_mean_prior_scale(q.loc, model_site["fn"])
    if t is not None:
        return None, (q.loc, q.scale, t), drawn
    return site_kl(guide_site, model_site), None, drawn


def sum_site_kls(kl_by_site: dict[str, torch.Tensor | None], closed_form: dict[str, tuple]) -> torch.Tensor:
    """The total KL of one particle: the sites of ``closed_form`` (``(loc, scale, t)`` against ``Normal(0, t)``,
    ``None`` in ``kl_by_site``) computed together by :func:`batched_normal_kls`, whose entries in ``kl_by_site`` they
    fill (detached), plus the other sites' KLs.

    Examples
    --------
    >>> kl_by_site = {"w": None, "s": torch.tensor(0.5)}
    >>> total = sum_site_kls(kl_by_site, {"w": (torch.ones(2), torch.ones(2), 1.0)})
    >>> round(total.item(), 4), round(kl_by_site["w"].item(), 4)   # 0.5 + 2 * (1 / 2)
    (1.5, 1.0)
    """
    kl = torch.zeros(())
    if not closed_form:
        return sum(kl_by_site.values(), kl)
    kls = batched_normal_kls(list(closed_form.values()))
    kl = sum((v for name, v in kl_by_site.items() if name not in closed_form), kl + kls.sum())
    kl_by_site.update(zip(closed_form, kls.detach().unbind()))
    return kl
