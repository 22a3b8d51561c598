"""Look inside a fitted posterior: KL per layer, posterior width against the prior, the per-layer and per-weight
tables (signal-to-noise pruning lives in :mod:`pyro_bbb.evaluate.pruning`).

These answer "my KL does not change" and "is my network Bayesian at all": a layer whose KL per weight is
near zero sits on its prior (the data is ignored); a layer whose posterior standard deviation is a tiny fraction
of the prior's has collapsed to a point estimate.

Examples
--------
>>> bnn = BNN(torch.nn.Sequential(BayesianLinear(2, 4), torch.nn.Tanh(), BayesianLinear(4, 1)),
...           likelihoods.Gaussian(scale=0.1))
>>> guide = MeanFieldGuide(bnn, init_scale=0.5)
>>> _ = guide(torch.randn(3, 2), torch.randn(3))
>>> {layer: round(r, 2) for layer, r in posterior_to_prior_std(bnn, guide).items()}
{'net.0': 0.5, 'net.2': 0.67}
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch

from .._internals import sample_priors
from .._kl import constant_normal, elementwise_kl, normal_kl_floor, total_kl
from .._rng import rng_untouched
from .._warnings import warn_at_caller
from ..infer.guide import (
    never_trained,
    normal_site_parts,
    point_estimate_parts,
    require_fitted_posteriors,
    site_loc_scale,
    site_posterior,
)
from ..infer.tempering import kl_weight_of
from ..nn.module import current_priors, site_owners
from ..priors import is_real_support, prior_in_force, prior_std, strip_independent

__all__ = [
    "PosteriorWarning",
    "layer_summary",
    "kl_by_layer",
    "posterior_to_prior_std",
    "check_posterior",
    "summary",
    "parameter_summary",
    "normal_sites",
]



class PosteriorWarning(UserWarning):
    """A posterior that sits on its prior, or has collapsed to a point estimate.

    Examples
    --------
    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("error", PosteriorWarning)   # a pipeline that stops on a bad posterior
    ...     issubclass(PosteriorWarning, UserWarning)
    True
    """


def _full_size_prior(p: dist.Distribution, q: dist.Distribution) -> dist.Distribution | None:
    """The prior over the whole of ``q``: ``p`` itself, or -- for a local latent in a subsampled data plate, whose
    prototype prior covers one minibatch -- the same prior over every datum when it is one distribution repeated
    (``None`` when it differs per datum)."""
    if p.shape() == q.shape():
        return p
    base = strip_independent(p)
    params = {k: getattr(base, k) for k in base.arg_constraints if k in base.__dict__}
    if not params or not all(t.numel() == 1 or all(st == 0 for st in t.stride()) for t in params.values()):
        return None
    scalar = type(base)(**{k: t.reshape(-1)[0] for k, t in params.items()})
    return scalar.expand(strip_independent(q).batch_shape).to_event(q.event_dim)


@torch.no_grad()
def layer_summary(model: Callable, guide, tails: bool = True) -> dict[str, dict[str, float]]:
    """Per layer: the KL and how the posterior's width compares with the prior's.

    Keys of each layer's entry: ``kl`` (nats), ``num_weights``, ``kl_per_weight``; and for Bayesian layers
    ``kl_q99`` (99th percentile of the per-weight KL above the least any Normal posterior has against the prior,
    about 0.66 nats for the default scale mixture, 0 for a Normal prior: what the best-informed weights carry),
    ``posterior_std`` (mean), ``prior_std`` (mean), ``std_ratio`` (mean of posterior std / prior std) and
    ``std_ratio_geomean`` (its geometric mean, which a few very wide or very narrow weights do not dominate: what
    :func:`check_posterior` judges collapse by). ``tails=False`` leaves out ``kl_q99`` (the percentile sorts every
    weight's KL: a third of the summary's time; what :func:`pyro_bbb.fit` records after every epoch does not need
    it). Latent sites outside Bayesian layers (e.g. a learned noise scale) are their own "layer" and report only the
    KL. KLs are closed-form where registered, else 256-draw Monte Carlo estimates (the same draws every call; the
    caller's random streams are left as they were, so reading the posterior never changes what training draws next).

    Examples
    --------
    >>> layer = BayesianLinear(3, 2, prior=priors.Normal(0.0, 1.0))
    >>> guide = MeanFieldGuide(layer, init_scale=1.0, init_loc_fn=lambda site: torch.zeros(site["fn"].shape()))
    >>> _ = guide(torch.randn(4, 3))
    >>> entry = layer_summary(layer, guide)["(root)"]       # posterior == prior
    >>> entry["kl"], entry["std_ratio_geomean"]
    (0.0, 1.0)
    """
    require_fitted_posteriors(guide, "this diagnostic", some=True)
    owners, priors_now = site_owners(model), current_priors(model)
    others = [name for name, _ in normal_sites(guide) if name not in priors_now]  # (PyroSample weights' priors)
    priors_now = {**_pyro_sample_priors(model, others), **priors_now}
    parts: dict[str, dict[str, Any]] = {}
    pending: list[tuple] = []  # the summed route's sites not yet summed: (part, loc, scale, m, t)
    with pyro.validation_enabled(False), rng_untouched(seed=0, torch_only=True):  # (nothing to validate: own tensors)
        for name, site in normal_sites(guide):
            _add_site(parts, pending, guide, name, site, owners, priors_now, tails)
            if sum(loc.numel() for _, loc, *_ in pending) >= _JOINED_WEIGHTS:
                _add_pending(pending)  # (a bounded number of widths held at once)
        _add_pending(pending)
    return _summarize(parts)


def _pyro_sample_priors(model: Callable, names: list[str]) -> dict[str, torch.distributions.Distribution]:
    """The prior each of ``names`` that is a ``PyroSample`` attribute of the model emits now: with a learned scale
    at its current value, or one given anew since (the guide's prototype trace keeps the prior of its first call);
    not a ``pyro.sample`` of the model's own code, whose prototype prior then stands."""
    if not isinstance(model, torch.nn.Module):
        return {}
    emitters = sample_priors(model)
    with torch.no_grad(), poutine.block():
        return {name: emitters[name]() for name in names if name in emitters}


def normal_sites(guide) -> list[tuple[str, dict]]:
    """The latent sites (name, prototype-trace entry) to which ``guide`` gives a Normal posterior, in the model's
    order: all of a :class:`~pyro_bbb.MeanFieldGuide`'s or ``AutoNormal``'s; an ``AutoGuideList``'s point-estimate
    sites (an ``AutoDelta`` part's) are left out.

    Examples
    --------
    >>> guide = MeanFieldGuide(BayesianLinear(2, 1))
    >>> _ = guide(torch.zeros(1, 2))
    >>> [name for name, _ in normal_sites(guide)]
    ['weight', 'bias']
    """
    parts = normal_site_parts(guide)
    return [(name, site) for name, site in guide.prototype_trace.iter_stochastic_nodes() if name in parts]


#: The sums over a Bayesian layer's real-valued weights, in this order (``ratio``: posterior std / prior std)
_SUMS = ("count", "kl", "std", "prior_std", "ratio", "log_ratio")


def _add_site(parts: dict[str, dict[str, Any]], pending: list[tuple], guide, name: str, site: dict, owners: dict,
              priors_now: dict, tails: bool) -> None:
    """Site ``name``'s KL into its layer's part; for a Bayesian layer's real-valued site, the sums of :data:`_SUMS`
    over its weights (and, with ``tails``, each weight's KL)."""
    prior = priors_now.get(name, site["fn"])  # the prior as it is now (a learned one at its current scale)
    real = name in owners and is_real_support(site["fn"].support)
    constants = constant_normal(prior) if real and not tails else None
    if constants is not None:  # (fit's record after every epoch) sums of closed forms, no per-weight tensor
        loc, scale = (t.detach() for t in site_loc_scale(guide, name))
        if prior.shape() == loc.shape:
            part = _part(parts, owners[name])
            part["num_weights"] += loc.numel()
            pending.append((part, loc, scale, *constants))  # summed with other such sites by _add_pending
            return
    q = site_posterior(guide, name, site)
    if real:  # each weight's KL in float64: a width near 0 (a pruned weight's 1e-37) squares to 0 in float32 (inf)
        base = strip_independent(q)
        q = dist.Normal(base.loc.double(), base.scale.double()).to_event(len(q.event_shape))
    p = _full_size_prior(prior, q)  # for all data of a local site
    if p is None:  # a local latent whose prior differs per datum: its KL needs the data, not just the guide
        return
    p = prior_in_force(p, q)  # an empirical-Bayes prior at the scale it takes given q
    part = _part(parts, owners.get(name, name))
    part["num_weights"] += p.shape().numel()
    if not real:
        part["kl"] += float(total_kl(q, p))
        return
    kl = elementwise_kl(q, p).reshape(-1).double()
    scale = strip_independent(q).scale.reshape(-1).double()  # (a real-valued site's posterior is its Normal)
    prior_scale = prior_std(strip_independent(p)).double().expand(q.shape()).reshape(-1)
    ratio = scale / prior_scale
    sums = torch.stack([kl.sum(), scale.sum(), prior_scale.sum(), ratio.sum(), ratio.log().sum()]).tolist()
    _add_sums(part, [kl.numel(), *sums])
    if tails:  # (what the data put there: above the least a Normal posterior can have against this prior)
        part["kls"].append(kl - normal_kl_floor(p))


def _part(parts: dict[str, dict[str, Any]], layer: str) -> dict[str, Any]:
    """Layer ``layer``'s part: its KL, its number of weights, the sums of :data:`_SUMS` over its real-valued weights
    (``None`` before the first) and each weight's KL (``tails``)."""
    return parts.setdefault(layer, {"kl": 0.0, "num_weights": 0, "sums": None, "kls": []})


def _add_sums(part: dict[str, Any], sums: list[float]) -> None:
    part["sums"] = sums if part["sums"] is None else [a + b for a, b in zip(part["sums"], sums)]
    part["kl"] += sums[1]


def _summarize(parts: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each layer's entry of :func:`layer_summary` from its part."""
    summary = {}
    for layer, part in parts.items():
        entry = {"kl": part["kl"], "num_weights": part["num_weights"]}
        entry["kl_per_weight"] = entry["kl"] / entry["num_weights"] if entry["num_weights"] else 0.0
        if part["kls"]:
            entry["kl_q99"] = float(torch.quantile(torch.cat(part["kls"]), 0.99))
        if part["sums"] is not None:
            means = {key: value / part["sums"][0] for key, value in zip(_SUMS, part["sums"])}
            entry["posterior_std"], entry["prior_std"] = means["std"], means["prior_std"]
            entry["std_ratio"], entry["std_ratio_geomean"] = means["ratio"], math.exp(means["log_ratio"])
        summary[layer] = entry
    return summary


def _add_pending(pending: list[tuple]) -> None:
    """Add the summed route's pending sites (``(part, loc, scale, m, t)``) to their parts' sums, and empty the list."""
    for (part, loc, _, m, t), (std, log_std, squares, loc_sum) in zip(pending, _site_sums(pending)):
        n = loc.numel()
        # KL(N(mu, s) || N(m, t)) summed over the weights, from sums: sum (mu - m)^2 = sum mu^2 - 2 m sum mu + n m^2
        kl = (squares - 2 * m * loc_sum + n * m * m) / (2 * t * t) - log_std + n * (math.log(t) - 0.5)
        _add_sums(part, [n, kl, std, n * t, std / t, log_std - n * math.log(t)])
    pending.clear()


#: At most this many weights are joined into one array by :func:`_site_sums` (a larger site is summed alone): the
#: joined array holds six float64 numbers per weight, and a large network's weights must not need that at once
_JOINED_WEIGHTS = 1 << 20


def _site_sums(pending: list[tuple]) -> list[list[float]]:
    """``[sum s, sum log s, sum s^2 + sum mu^2, sum mu]`` of each pending site's ``(loc mu, scale s)``, in float64
    (a width near 0 squares to 0 in float32). Sites of one device, up to :data:`_JOINED_WEIGHTS` weights, are joined
    into one (4, weights) array and summed along its slices: a few operations for any number of sites, where fit reads
    this after every epoch and a small net's epoch is a few steps."""
    chunks: list[list[int]] = []
    open_chunks: dict[torch.device, tuple[list[int], int]] = {}  # per device: the chunk being filled, its weights
    for i, (_, loc, *_) in enumerate(pending):
        chunk, size = open_chunks.get(loc.device, ([], 0))
        if not chunk or size + loc.numel() > _JOINED_WEIGHTS:
            chunk, size = [], 0
            chunks.append(chunk)
        chunk.append(i)
        open_chunks[loc.device] = (chunk, size + loc.numel())
    sums: list[list[float] | None] = [None] * len(pending)
    for chunk in chunks:
        locs = torch.cat([pending[i][1].reshape(-1) for i in chunk]).double()
        scales = torch.cat([pending[i][2].reshape(-1) for i in chunk]).double()
        if len(chunk) == 1:  # (no joined array)
            per_site = torch.stack([scales.sum(), scales.log().sum(), scales.square().sum() + locs.square().sum(),
                                    locs.sum()])[None]
        else:
            rows = torch.stack([scales, scales.log(), torch.addcmul(scales * scales, locs, locs), locs])
            per_site = torch.stack([part.sum(1) for part in rows.split([pending[i][1].numel() for i in chunk], 1)])
        for i, values in zip(chunk, per_site.tolist()):
            sums[i] = values
    return sums


def kl_by_layer(model: Callable, guide) -> dict[str, float]:
    """``KL(q || p)`` of each layer, in nats.

    Examples
    --------
    >>> layer = BayesianLinear(3, 2, prior=priors.Normal(0.0, 1.0))
    >>> guide = MeanFieldGuide(layer, init_loc_fn=lambda site: torch.zeros(site["fn"].shape()))
    >>> _ = guide(torch.randn(4, 3))
    >>> round(kl_by_layer(layer, guide)["(root)"] / 8, 3)   # per weight: -log(1e-4) + 1e-8/2 - 1/2
    8.71
    """
    return {layer: entry["kl"] for layer, entry in layer_summary(model, guide, tails=False).items()}


def posterior_to_prior_std(model: Callable, guide) -> dict[str, float]:
    """Mean over each Bayesian layer's weights of ``posterior std / prior std``.

    Near 1: the layer sits on its prior. Near 0: it has collapsed to a point estimate.

    Examples
    --------
    See the module example: ``{'net.0': 0.5, 'net.2': 0.67}`` for a guide that starts at a width of 0.5 (half the
    first layer's prior width).
    """
    summary = layer_summary(model, guide, tails=False)
    return {layer: e["std_ratio"] for layer, e in summary.items() if "std_ratio" in e}


def check_posterior(
    model: Callable,
    guide,
    *,
    prior_kl: float = 0.1,
    collapsed_std_ratio: float = 1e-2,
) -> dict[str, dict[str, float]]:
    """Warn (:class:`PosteriorWarning`) about layers whose posterior sits on the prior or has collapsed.

    * **On the prior**: even the best-informed weights carry almost no information; the 99th percentile of the
      per-weight KL is below ``prior_kl`` nats (counted above the least a Normal posterior can have against a prior
      that is not Normal: about 0.66 nats for the default scale mixture). The data barely moves the layer: the KL
      is over-weighted (``kl_weight`` too large, or the likelihood divided by the data size by hand), the learning
      rate is too low, or training stopped early. (In a good fit many weights sit on the prior, which is why pruning
      works, but the informative ones carry nats each.)
    * **Collapsed**: the geometric mean of posterior std / prior std is below ``collapsed_std_ratio``. The net is
      a point estimate: the KL is under-weighted (``kl_weight`` too small, or ``num_data`` much too large).

    A :class:`~pyro_bbb.MeanFieldGuide` that was never trained gets one warning saying so, and every layer the
    status ``"not trained"``.

    Returns :func:`layer_summary` with a ``"status"`` per layer (``"ok"``, ``"on prior"``, ``"collapsed"``,
    ``"not trained"``).

    Examples
    --------
    >>> import torch, pyro, warnings
    >>> pyro.clear_param_store()
    >>> layer = BayesianLinear(3, 2)
    >>> guide = MeanFieldGuide(layer, init_scale=1e-5)
    >>> _ = guide(torch.randn(4, 3))
    >>> svi = pyro.infer.SVI(layer, guide, pyro.optim.Adam({"lr": 1e-3}), pyro.infer.Trace_ELBO())
    >>> _ = svi.step(torch.randn(4, 3))                    # one step: trained, and still collapsed
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     report = check_posterior(layer, guide)
    >>> report["(root)"]["status"], caught[0].category.__name__
    ('collapsed', 'PosteriorWarning')
    """
    summary = layer_summary(model, guide)
    if never_trained(guide):  # a MeanFieldGuide (or a guide list's) no step has changed: nothing to diagnose yet
        for entry in summary.values():
            entry["status"] = "not trained"
        warn_at_caller(
            "check_posterior: the guide was never trained (its parameters are what set-up gave them), so its "
            "layers show the initial posterior, not what the data did to it. Train it first (pyro_bbb.fit).",
            PosteriorWarning,
        )
        return summary
    choice = kl_weight_of(guide)
    tempered = (f" (This guide was trained at KL weight {choice.kl_weight:g}: a tempered posterior, narrower than the "
                "Bayes one by design; kl_weight=1 gives the Bayes posterior.)") if choice and choice.tempered else ""
    under_weighted = (" The KL is under-weighted (raise kl_weight towards 1 and check that num_data is the "
                      "training-set size), or " if choice is None or choice.kl_weight < 1 else
                      f" Trained at KL weight {choice.kl_weight:g}, the KL is under-weighted only if num_data was "
                      "smaller than the training set; else ")
    for layer, entry in summary.items():
        entry["status"] = "ok"
        if choice is not None:
            entry["kl_weight"] = choice.kl_weight
        if "std_ratio" not in entry:
            continue
        if entry["kl_q99"] < prior_kl:
            entry["status"] = "on prior"
            warn_at_caller(
                f"layer {layer!r} sits on its prior: its best-informed weights carry {entry['kl_q99']:.2g} nats of KL "
                f"each (99th percentile; threshold {prior_kl:g}) and its posterior std is "
                f"{entry['std_ratio_geomean']:.2f} x the prior's. The data is being ignored: the KL may be "
                "over-weighted (lower kl_weight; let pyro_bbb.ELBO(num_data=N) scale the likelihood instead of "
                "dividing it by hand), the learning rate may be too low, or training too short.",
                PosteriorWarning,
            )
        elif entry["std_ratio_geomean"] < collapsed_std_ratio:
            entry["status"] = "collapsed"
            warn_at_caller(
                f"layer {layer!r} has collapsed to a point estimate: its posterior std is "
                f"{entry['std_ratio_geomean']:.2g} x the prior's (geometric mean; threshold {collapsed_std_ratio:g}). "
                + under_weighted + "training stopped while the posterior was still widening from the guide's small "
                "init_scale (train longer, or start wider). Very large data sets can legitimately give narrow "
                "posteriors; lower the threshold then." + tempered,
                PosteriorWarning,
            )
    return summary


HDI_PROB = 0.94


@torch.no_grad()
def summary(model: Callable, guide):
    """The posterior per layer as a table (:class:`pandas.DataFrame`), computed from the guide's means and scales.

    One row per layer -- number of weights, mean ``|mu|``, mean and 5/50/95% quantiles of the posterior std
    ``sigma``, mean prior std, KL, KL per weight, and 5/50/95% quantiles of the signal-to-noise ratio ``|mu|/sigma``.
    The per-weight table is :func:`parameter_summary`. A guide trained by :func:`pyro_bbb.fit` adds the column
    ``kl_weight`` (the weight it was trained at; other than 1: a tempered posterior, not the Bayes one); when ``fit``
    chose it, a column ``val_nll@<weight>`` per candidate holds that candidate's validation NLL (per held-out datum),
    so the printed table shows what the choice was made on. The table's ``attrs["kl_weight"]`` holds the
    :class:`~pyro_bbb.infer.tempering.KLWeightChoice` (its ``describe()``: the choice in one line).

    Examples
    --------
    >>> layer = BayesianLinear(3, 2)
    >>> guide = MeanFieldGuide(layer, init_scale=0.1)
    >>> _ = guide(torch.randn(4, 3))
    >>> summary(layer, guide)[["num_weights", "sigma_mean"]].round(3)
            num_weights  sigma_mean
    (root)            8         0.1
    """
    import pandas as pd

    require_fitted_posteriors(guide, "this diagnostic", some=True)
    rows = {}
    layers = layer_summary(model, guide)
    owners = site_owners(model)
    groups: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for name, site in normal_sites(guide):
        if is_real_support(site["fn"].support):
            groups.setdefault(owners.get(name, name), []).append(site_loc_scale(guide, name))
    for layer, entry in layers.items():
        row = {"num_weights": entry["num_weights"], "kl": entry["kl"], "kl_per_weight": entry["kl_per_weight"]}
        if layer in groups:
            loc = torch.cat([m.reshape(-1) for m, _ in groups[layer]]).double()
            scale = torch.cat([s.reshape(-1) for _, s in groups[layer]]).double()
            snr = loc.abs() / scale
            q = torch.tensor([0.05, 0.5, 0.95], dtype=torch.double)
            row |= {"mean_abs_mu": float(loc.abs().mean()), "sigma_mean": float(scale.mean())}
            row |= dict(zip(("sigma_q05", "sigma_q50", "sigma_q95"), torch.quantile(scale, q).tolist()))
            row["prior_sigma"] = entry.get("prior_std", math.nan)
            row |= dict(zip(("snr_q05", "snr_q50", "snr_q95"), torch.quantile(snr, q).tolist()))
        rows[layer] = row
    columns = ["num_weights", "mean_abs_mu", "sigma_mean", "sigma_q05", "sigma_q50", "sigma_q95", "prior_sigma",
               "kl", "kl_per_weight", "snr_q05", "snr_q50", "snr_q95"]
    table = pd.DataFrame.from_dict(rows, orient="index").reindex(columns=columns)
    return _with_point_estimates(_with_kl_weight(table, guide), guide)


def _with_point_estimates(table, guide):
    """``table`` with the latent sites of an ``AutoGuideList`` that it leaves out: ``attrs["point_estimates"]``,
    those of its point-estimate parts (no width, no KL), and ``attrs["not_summarised"]``, those of parts whose
    posterior is not a Normal per site (``AutoDiagonalNormal``, a hand-written guide); each absent when empty."""
    normal = normal_site_parts(guide)
    points = {name for part in point_estimate_parts(guide) for name, _ in part.prototype_trace.iter_stochastic_nodes()}
    left_out = [name for name, _ in guide.prototype_trace.iter_stochastic_nodes() if name not in normal]
    for key, names in (("point_estimates", [n for n in left_out if n in points]),
                       ("not_summarised", [n for n in left_out if n not in points])):
        if names:
            table.attrs[key] = names
    return table


def _with_kl_weight(table, guide, column: bool = True):
    """``table`` with ``attrs["kl_weight"]`` (and the column ``kl_weight``) of a guide whose weight is recorded."""
    choice = kl_weight_of(guide)
    if choice is not None:
        if column:
            table["kl_weight"] = choice.kl_weight
            for weight, nll in choice.validation_nll.items():  # what the choice was made on, in the printed table
                table[f"val_nll@{weight:g}"] = nll
        table.attrs["kl_weight"] = choice
    return table


def _hdi(draws: torch.Tensor, prob: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The highest-density interval of each element of ``draws`` (draws first): the narrowest interval holding
    ``prob`` of them, as ArviZ finds it (an equal-tailed one is wider for a skewed posterior, a noise scale's).

    Examples
    --------
    >>> low, high = _hdi(torch.arange(100.0) ** 2, 0.5)   # skewed: the narrowest half is at the low end
    >>> float(low), float(high)
    (0.0, 2500.0)
    """
    ordered = draws.sort(0).values
    inside = int(math.floor(prob * draws.shape[0]))
    start = (ordered[inside:] - ordered[: draws.shape[0] - inside]).argmin(0, keepdim=True)
    return ordered.gather(0, start)[0], ordered.gather(0, start + inside)[0]


@torch.no_grad()
def parameter_summary(model: Callable, guide):
    """The posterior per weight (``fc1.weight[0, 1]``) in ArviZ's summary columns ``mean``, ``sd``, ``hdi_3%``,
    ``hdi_97%`` -- exact for a Normal posterior, no sampling (a constrained site such as a learned noise scale is
    summarised from 4000 draws, the same every call, leaving the caller's random streams as they were). For a guide
    trained by :func:`pyro_bbb.fit`, ``attrs["kl_weight"]`` holds its :class:`~pyro_bbb.infer.tempering.KLWeightChoice`,
    as in :func:`summary` (a tempered posterior's intervals are narrower by design).

    Examples
    --------
    >>> layer = BayesianLinear(3, 2)
    >>> guide = MeanFieldGuide(layer, init_scale=0.1)
    >>> _ = guide(torch.randn(4, 3))
    >>> list(parameter_summary(layer, guide).columns)
    ['mean', 'sd', 'hdi_3%', 'hdi_97%']
    """
    import pandas as pd

    require_fitted_posteriors(guide, "this diagnostic", some=True)
    z = float(torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(0.5 + HDI_PROB / 2)))
    low, high = f"hdi_{100 * (1 - HDI_PROB) / 2:g}%", f"hdi_{100 * (1 + HDI_PROB) / 2:g}%"
    frames = []
    for name, site in normal_sites(guide):
        loc, scale = (t.detach().double() for t in site_loc_scale(guide, name))
        if is_real_support(site["fn"].support):
            stats = {"mean": loc, "sd": scale, low: loc - z * scale, high: loc + z * scale}
        else:
            with rng_untouched(seed=0, torch_only=True):
                draws = site_posterior(guide, name, site).sample((4000,)).double()
            stats = {"mean": draws.mean(0), "sd": draws.std(0), **dict(zip((low, high), _hdi(draws, HDI_PROB)))}
        index = [f"{name}[{', '.join(map(str, i))}]" if loc.dim() else name for i in np.ndindex(*loc.shape)]
        frames.append(pd.DataFrame({k: v.reshape(-1).cpu().numpy() for k, v in stats.items()}, index=index))
    return _with_point_estimates(_with_kl_weight(pd.concat(frames), guide, column=False), guide)
