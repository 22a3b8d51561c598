"""Look inside a fitted posterior: KL per layer, posterior width against the prior, signal-to-noise, pruning.

These answer "my KL does not change" and "is my network Bayesian at all": a layer whose KL per weight is
near zero sits on its prior (the data is ignored); a layer whose posterior standard deviation is a tiny fraction
of the prior's has collapsed to a point estimate.

Example
-------
>>> import torch, pyro
>>> from pyro_bbb import BNN, MeanFieldGuide, likelihoods
>>> from pyro_bbb.nn import BayesianLinear
>>> pyro.clear_param_store()
>>> bnn = BNN(torch.nn.Sequential(BayesianLinear(2, 4), torch.nn.Tanh(), BayesianLinear(4, 1)),
...           likelihoods.Gaussian(scale=0.1))
>>> guide = MeanFieldGuide(bnn, init_scale=0.5)
>>> _ = guide(torch.randn(3, 2), torch.randn(3))
>>> {layer: round(r, 2) for layer, r in posterior_to_prior_std(bnn, guide).items()}
{'net.0': 0.5, 'net.2': 0.5}
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import pyro.distributions as dist
import torch
from pyro.distributions.kl import kl_divergence

from .nn.module import BayesianModule
from .priors import _is_real

__all__ = [
    "PosteriorWarning",
    "PrunedGuide",
    "layer_summary",
    "kl_by_layer",
    "posterior_to_prior_std",
    "signal_to_noise",
    "check_posterior",
    "prune_by_snr",
]

#: Monte Carlo draws for a KL without closed form (e.g. a scale-mixture prior), and for a prior's std.
_MC_DRAWS = 256


class PosteriorWarning(UserWarning):
    """A posterior that sits on its prior, or has collapsed to a point estimate."""


def _require_fitted(guide) -> None:
    if getattr(guide, "prototype_trace", None) is None:
        raise ValueError("the guide has not seen the model yet: fit it (or run one SVI step) first.")


def _layer_names(model: Callable) -> dict[str, str]:
    """Site name -> name of the Bayesian layer that owns it (``"(root)"`` for a model that is itself a layer)."""
    owners = {}
    if isinstance(model, torch.nn.Module):
        for module in model.modules():
            if isinstance(module, BayesianModule):
                layer = module.__dict__.get("_pyro_name") or "(root)"
                owners.update({site: layer for site in module.initial_values(full_names=True)})
    return owners


def _kl(q: dist.Distribution, p: dist.Distribution) -> torch.Tensor:
    try:
        return kl_divergence(q, p).sum()
    except NotImplementedError:
        draws = q.sample((_MC_DRAWS,))
        return (q.log_prob(draws) - p.log_prob(draws)).mean(0).sum()


def _prior_std(p: dist.Distribution) -> torch.Tensor:
    try:
        std = p.stddev
    except NotImplementedError:
        std = p.sample((_MC_DRAWS,)).std(0)
    return std


@torch.no_grad()
def layer_summary(model: Callable, guide) -> dict[str, dict[str, float]]:
    """Per layer: KL, number of weights, KL per weight, mean posterior std, mean prior std and their mean ratio.

    Latent sites outside Bayesian layers (e.g. a learned noise scale) are their own "layer" and report only the
    KL (their width lives on another scale). The KL is closed-form where registered, else a 256-draw Monte Carlo
    estimate.

    Example
    -------
    >>> import torch, pyro
    >>> from pyro_bbb import MeanFieldGuide
    >>> from pyro_bbb.nn import BayesianLinear
    >>> pyro.clear_param_store()
    >>> layer = BayesianLinear(3, 2)
    >>> guide = MeanFieldGuide(layer, init_scale=1.0, init_loc=lambda site: torch.zeros(site["fn"].shape()))
    >>> _ = guide(torch.randn(4, 3))
    >>> layer_summary(layer, guide)["(root)"]["kl"]          # posterior == prior
    0.0
    """
    _require_fitted(guide)
    owners = _layer_names(model)
    summary: dict[str, dict[str, Any]] = {}
    for name, site in guide.prototype_trace.iter_stochastic_nodes():
        p = site["fn"]  # the prior, as the model declared it
        q = guide._posterior(name, site)
        layer = owners.get(name, name)
        entry = summary.setdefault(layer, {"kl": 0.0, "num_weights": 0, "_std": [], "_ratio": []})
        entry["kl"] += float(_kl(q, p))
        entry["num_weights"] += p.shape().numel()
        if name in owners and _is_real(site["fn"].support):
            scale = guide._get_loc_and_scale(name)[1]
            entry["_std"].append(scale.reshape(-1))
            entry["_ratio"].append((scale / _prior_std(p).expand(scale.shape)).reshape(-1))
    for entry in summary.values():
        entry["kl_per_weight"] = entry["kl"] / max(entry["num_weights"], 1)
        std, ratio = entry.pop("_std"), entry.pop("_ratio")
        if std:
            entry["posterior_std"] = float(torch.cat(std).mean())
            entry["std_ratio"] = float(torch.cat(ratio).mean())
            entry["prior_std"] = entry["posterior_std"] / entry["std_ratio"] if entry["std_ratio"] else math.nan
    return summary


def kl_by_layer(model: Callable, guide) -> dict[str, float]:
    """``KL(q || p)`` of each layer, in nats.

    Example
    -------
    >>> import torch, pyro
    >>> from pyro_bbb import MeanFieldGuide
    >>> from pyro_bbb.nn import BayesianLinear
    >>> pyro.clear_param_store()
    >>> layer = BayesianLinear(3, 2)
    >>> guide = MeanFieldGuide(layer, init_loc=lambda site: torch.zeros(site["fn"].shape()))
    >>> _ = guide(torch.randn(4, 3))
    >>> round(kl_by_layer(layer, guide)["(root)"] / 8, 3)   # per weight: -log(1e-4) + 1e-8/2 - 1/2
    8.71
    """
    return {layer: entry["kl"] for layer, entry in layer_summary(model, guide).items()}


def posterior_to_prior_std(model: Callable, guide) -> dict[str, float]:
    """Mean over each Bayesian layer's weights of ``posterior std / prior std``.

    Near 1: the layer sits on its prior. Near 0: it has collapsed to a point estimate. See the module example.
    """
    return {layer: e["std_ratio"] for layer, e in layer_summary(model, guide).items() if "std_ratio" in e}


@torch.no_grad()
def signal_to_noise(guide) -> dict[str, torch.Tensor]:
    """``|mu| / sigma`` of every weight of every real-valued site (Blundell et al. 2015, section 5.1).

    Example
    -------
    >>> import torch, pyro
    >>> from pyro_bbb import MeanFieldGuide
    >>> from pyro_bbb.nn import BayesianLinear
    >>> pyro.clear_param_store()
    >>> guide = MeanFieldGuide(BayesianLinear(3, 2), init_scale=0.1, init_loc=lambda s: torch.ones(s["fn"].shape()))
    >>> _ = guide(torch.randn(4, 3))
    >>> guide_snr = signal_to_noise(guide)
    >>> guide_snr["weight"].round(decimals=3)
    tensor([[10., 10., 10.],
            [10., 10., 10.]])
    """
    _require_fitted(guide)
    snr = {}
    for name, site in guide.prototype_trace.iter_stochastic_nodes():
        if _is_real(site["fn"].support):
            loc, scale = guide._get_loc_and_scale(name)
            snr[name] = loc.abs() / scale
    return snr


def check_posterior(
    model: Callable,
    guide,
    *,
    prior_kl_per_weight: float = 1e-2,
    collapsed_std_ratio: float = 1e-2,
) -> dict[str, dict[str, float]]:
    """Warn (:class:`PosteriorWarning`) about layers whose posterior sits on the prior or has collapsed.

    * **On the prior**: KL per weight below ``prior_kl_per_weight`` nats. The data barely moves the layer: the
      KL is over-weighted (``kl_weight`` too large, or the likelihood is not scaled to the full data set), the
      learning rate is too low, or training was too short.
    * **Collapsed**: mean posterior std below ``collapsed_std_ratio`` of the prior std. The net is a point
      estimate: the KL is under-weighted (``kl_weight`` too small, or ``num_data`` much too large).

    Returns :func:`layer_summary` with a ``"status"`` per layer (``"ok"``, ``"on prior"``, ``"collapsed"``).

    Example
    -------
    >>> import torch, pyro, warnings
    >>> from pyro_bbb import MeanFieldGuide
    >>> from pyro_bbb.nn import BayesianLinear
    >>> pyro.clear_param_store()
    >>> layer = BayesianLinear(3, 2)
    >>> guide = MeanFieldGuide(layer, init_scale=1e-5)
    >>> _ = guide(torch.randn(4, 3))
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     report = check_posterior(layer, guide)
    >>> report["(root)"]["status"], caught[0].category.__name__
    ('collapsed', 'PosteriorWarning')
    """
    summary = layer_summary(model, guide)
    for layer, entry in summary.items():
        entry["status"] = "ok"
        if "std_ratio" not in entry:
            continue
        if entry["kl_per_weight"] < prior_kl_per_weight:
            entry["status"] = "on prior"
            warnings.warn(
                f"layer {layer!r} sits on its prior: KL {entry['kl_per_weight']:.2g} nats per weight (threshold "
                f"{prior_kl_per_weight:g}), posterior std {entry['std_ratio']:.2f} x the prior's. The data is being "
                "ignored: the KL may be over-weighted (lower kl_weight; let pyro_bbb.ELBO(num_data=N) scale the "
                "likelihood rather than dividing it), the learning rate may be too low, or training too short.",
                PosteriorWarning,
                stacklevel=2,
            )
        elif entry["std_ratio"] < collapsed_std_ratio:
            entry["status"] = "collapsed"
            warnings.warn(
                f"layer {layer!r} has collapsed to a point estimate: posterior std is {entry['std_ratio']:.2g} x the "
                f"prior's (threshold {collapsed_std_ratio:g}). The KL is under-weighted: raise kl_weight towards 1 "
                "and check that num_data is the training-set size.",
                PosteriorWarning,
                stacklevel=2,
            )
    return summary


class PrunedGuide(torch.nn.Module):
    """A guide whose pruned weights are exactly zero; the rest are drawn from the wrapped guide.

    Made by :func:`prune_by_snr`. Use it for prediction (``pyro_bbb.predict(model, pruned, x)``); the wrapped
    guide and its parameters are unchanged.

    Attributes
    ----------
    guide : MeanFieldGuide
        The original guide.
    keep_masks : dict[str, Tensor]
        Per site, ``True`` where the weight is kept.
    fraction : float
        Fraction of the weights set to zero.
    """

    def __init__(self, guide, keep_masks: dict[str, torch.Tensor]):
        super().__init__()
        self.guide = guide
        self.keep_masks = keep_masks
        kept = sum(int(m.sum()) for m in keep_masks.values())
        total = sum(m.numel() for m in keep_masks.values())
        self.fraction = 1 - kept / total if total else 0.0

    @property
    def prototype_trace(self):
        return self.guide.prototype_trace

    def forward(self, *args, **kwargs):
        with self.guide._pruned(self.keep_masks):
            return self.guide(*args, **kwargs)

    def site_posteriors(self) -> dict[str, dist.Distribution]:
        """As :meth:`pyro_bbb.MeanFieldGuide.site_posteriors`, with pruned weights at zero."""
        with self.guide._pruned(self.keep_masks):
            return self.guide.site_posteriors()

    def extra_repr(self) -> str:
        return f"fraction={self.fraction:.3f}"


@torch.no_grad()
def prune_by_snr(guide, fraction: float) -> tuple[PrunedGuide, float]:
    """Set the ``fraction`` of weights with the lowest signal-to-noise ratio ``|mu|/sigma`` to zero.

    Blundell et al. (2015), section 5.1: most weights of a Bayes-by-Backprop network can be removed this way with
    little loss of accuracy. Ranks all real-valued sites together and removes ``round(fraction * n)`` of the ``n``
    weights (ties at the threshold broken in site order); returns the pruned guide and the achieved fraction.

    Example
    -------
    >>> import torch, pyro
    >>> from pyro_bbb import MeanFieldGuide
    >>> from pyro_bbb.nn import BayesianLinear
    >>> pyro.clear_param_store()
    >>> guide = MeanFieldGuide(BayesianLinear(10, 10), init_scale=0.1)
    >>> _ = guide(torch.randn(4, 10))
    >>> pruned, achieved = prune_by_snr(guide, 0.5)
    >>> achieved
    0.5
    """
    if not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
        raise ValueError(f"`fraction` must lie in [0, 1], got {fraction!r}.")
    snr = signal_to_noise(guide)
    if not snr:
        raise ValueError("the guide has no real-valued weights to prune.")
    flat = torch.cat([v.reshape(-1) for v in snr.values()])
    num_pruned = int(round(fraction * flat.numel()))
    if num_pruned == 0:
        masks = {name: torch.ones_like(v, dtype=torch.bool) for name, v in snr.items()}
    else:
        threshold = flat.kthvalue(num_pruned).values
        below = int((flat < threshold).sum())
        # prune everything below the threshold and as many at the threshold as needed, in site order
        budget = num_pruned - below
        masks = {}
        for name, v in snr.items():
            at = v == threshold
            ranks = at.reshape(-1).cumsum(0).reshape(v.shape)
            prune_here = (v < threshold) | (at & (ranks <= budget))
            budget -= int((at & (ranks <= budget)).sum())
            masks[name] = ~prune_here
    pruned = PrunedGuide(guide, masks)
    return pruned, pruned.fraction
