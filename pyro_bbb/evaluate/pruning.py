"""Pruning by signal-to-noise: most weights of a Bayes-by-Backprop network can be set to zero with little loss
(Blundell et al. 2015, section 5.1).

Examples
--------
>>> guide = MeanFieldGuide(BayesianLinear(3, 2), init_scale=0.1)
>>> _ = guide(torch.randn(4, 3))
>>> pruned, fraction = prune_by_snr(guide, 0.5)
>>> fraction
0.5
"""

from __future__ import annotations

import pyro.distributions as dist
import torch

from ..infer.guide import MeanFieldGuide, require_fitted_posteriors, site_loc_scale
from ..priors import is_real_support

__all__ = ["signal_to_noise", "PrunedGuide", "prune_by_snr"]


@torch.no_grad()
def signal_to_noise(guide) -> dict[str, torch.Tensor]:
    """``|mu| / sigma`` of every weight of every real-valued site (Blundell et al. 2015, section 5.1).

    Examples
    --------
    >>> guide = MeanFieldGuide(BayesianLinear(3, 2), init_scale=0.1, init_loc_fn=lambda s: torch.ones(s["fn"].shape()))
    >>> _ = guide(torch.randn(4, 3))
    >>> guide_snr = signal_to_noise(guide)
    >>> guide_snr["weight"].round(decimals=3)
    tensor([[10., 10., 10.],
            [10., 10., 10.]])
    """
    require_fitted_posteriors(guide, "pruning")
    snr = {}
    for name, site in guide.prototype_trace.iter_stochastic_nodes():
        if is_real_support(site["fn"].support):
            loc, scale = site_loc_scale(guide, name)
            snr[name] = loc.abs() / scale
    return snr


class PrunedGuide(torch.nn.Module):
    """A guide whose pruned weights are zero (to within 1e-37); the rest are drawn from the wrapped guide.

    Made by :func:`prune_by_snr`. Use it for prediction (``pyro_bbb.predict(model, pruned, x)``); the wrapped
    guide and its parameters are unchanged.

    Examples
    --------
    See :func:`prune_by_snr`; then ``pyro_bbb.predict(model, pruned, x)``.

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

    @property
    def records_of(self):
        """The guide whose records speak for this one: the KL weight it was trained at
        (:func:`~pyro_bbb.infer.tempering.kl_weight_of`) and the rows it was trained on
        (:mod:`pyro_bbb.data.provenance`), which pruning does not change."""
        return self.guide

    def forward(self, *args, **kwargs):
        with self.guide.pruned(self.keep_masks):
            return self.guide(*args, **kwargs)

    def site_posteriors(self) -> dict[str, dist.Distribution]:
        """As :meth:`pyro_bbb.MeanFieldGuide.site_posteriors`, with pruned weights at zero."""
        with self.guide.pruned(self.keep_masks):
            return self.guide.site_posteriors()

    def extra_repr(self) -> str:
        return f"fraction={self.fraction:.3f}"


@torch.no_grad()
def prune_by_snr(guide, fraction: float) -> tuple[PrunedGuide, float]:
    """Set the ``fraction`` of weights with the lowest signal-to-noise ratio ``|mu|/sigma`` to zero.

    Blundell et al. (2015), section 5.1: most weights of a Bayes-by-Backprop network can be removed this way with
    little loss of accuracy. Ranks all real-valued sites together and removes ``round(fraction * n)`` of the ``n``
    weights (ties at the threshold broken in site order); returns the pruned guide and the achieved fraction.

    Examples
    --------
    >>> guide = MeanFieldGuide(BayesianLinear(10, 10), init_scale=0.1)
    >>> _ = guide(torch.randn(4, 10))
    >>> pruned, achieved = prune_by_snr(guide, 0.5)
    >>> achieved
    0.5
    """
    if not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
        raise ValueError(f"`fraction` must lie in [0, 1], got {fraction!r}.")
    if not isinstance(guide, MeanFieldGuide):  # (its pruned() draws the kept weights; signal_to_noise reads any)
        raise TypeError(f"prune_by_snr makes a guide that predicts with the pruned weights at zero, which needs a "
                        f"pyro_bbb.MeanFieldGuide; got {type(guide).__name__} (signal_to_noise reads its ratios).")
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


#: ArviZ's default HDI probability; for a Normal the highest-density interval is the central one.
