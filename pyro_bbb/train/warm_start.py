"""A MAP warm start: the posterior means trained as a deterministic net before the variational fit.

A mean-field posterior learns its means slowly under the sampling noise of its own weights; the published recipes
that make weight-space VI predict well start it from a trained deterministic net (MOPED, Krishnan et al. 2020; the
MAP start of VOGN and IVON's benchmarks). :func:`map_warm_start` trains only the posterior means of a guide with a
Normal posterior per site (:class:`pyro_bbb.MeanFieldGuide`, Pyro's ``AutoNormal``): every latent site is set to its
posterior mean (no draw), and Adam minimises the negative log joint per row, ``-(1/B) sum log p(y|x, w)
- (prior_weight/N) log p(w)``, the MAP objective of the (tempered) posterior. The posterior scales are left as they
are. ``fit(kl_weight="auto")`` runs it on the selection's training rows before the path of KL weights
(:class:`pyro_bbb.train.SelectKLWeight`'s ``warm_start``), so the held-out rows that score the weights stay unseen.

Examples
--------
>>> pyro.clear_param_store()
>>> net = pyro_bbb.BNN(pyro_bbb.nn.BayesianLinear(3, 1), pyro_bbb.likelihoods.Gaussian(scale=0.1))
>>> guide = pyro_bbb.MeanFieldGuide(net)
>>> x = torch.randn(64, 3); y = x @ torch.tensor([1.0, -2.0, 0.5])
>>> batches = Batches((x, y), 16, net.likelihood, None)
>>> map_warm_start(net, guide, batches, epochs=60, lr=0.05)
>>> guide.site_posteriors()["net.weight"].loc.round(decimals=1)
tensor([[ 1.0000, -2.0000,  0.5000]])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyro.poutine as poutine
import torch
from pyro.poutine.messenger import Messenger

from .._internals import is_deterministic_site
from .._kl import log_prob_sum, needs_posterior
from .._plates import data_plate_of
from ..data.batches import Batches
from ..infer import ReplayBackend
from ..infer.guide import has_site_posteriors, normal_mean, without_drawn_posterior
from ..infer.scaling import DataPlateScaleMessenger
from ..priors import prior_in_force
from .selection import every_parameter

__all__ = ["map_warm_start", "map_loss", "can_warm_start", "PosteriorMeanMessenger", "posterior_mean"]


def can_warm_start(guide) -> bool:
    """Whether :func:`map_warm_start` applies to ``guide``: it needs a Normal posterior per latent site.

    Examples
    --------
    >>> from pyro.infer.autoguide import AutoDelta
    >>> layer = pyro_bbb.nn.BayesianLinear(2, 1)
    >>> can_warm_start(pyro_bbb.MeanFieldGuide(layer)), can_warm_start(AutoDelta(layer))
    (True, False)
    """
    return has_site_posteriors(guide)


class PosteriorMeanMessenger(Messenger):
    """Inside a guide, every draw from a ``Normal`` (or a transformed ``Normal``) posterior takes the value at the
    Normal's mean instead, differentiably in that mean: the guide then returns the deterministic net at its posterior
    means (pushed through the site's transform for a constrained site), with its plates and subsampling unchanged.
    Other sites (an ``AutoNormal``'s ``Delta`` that follows its draw, observed sites) are left alone.

    Examples
    --------
    >>> guide = pyro_bbb.MeanFieldGuide(pyro_bbb.nn.BayesianLinear(2, 1))
    >>> _ = guide(torch.zeros(1, 2))
    >>> with posterior_mean():
    ...     draw = guide(torch.zeros(1, 2))
    >>> torch.equal(draw["bias"], guide.site_posteriors()["bias"].loc)
    True
    """

    def _pyro_sample(self, msg: dict[str, Any]) -> None:
        if msg["is_observed"] or msg["value"] is not None:
            return
        mean = normal_mean(msg["fn"])
        if mean is not None:
            msg["value"], msg["done"] = mean, True
            msg["infer"] = without_drawn_posterior(msg["infer"])  # no estimator redraws it


def posterior_mean(fn: Callable | None = None) -> PosteriorMeanMessenger | Callable:
    """Factory of :class:`PosteriorMeanMessenger` (``posterior_mean(guide)`` or ``with posterior_mean():``).

    Examples
    --------
    >>> guide = pyro_bbb.MeanFieldGuide(pyro_bbb.nn.BayesianLinear(2, 1))
    >>> _ = guide(torch.zeros(1, 2))
    >>> posterior_mean(guide)(torch.zeros(1, 2))["weight"].shape
    torch.Size([1, 2])
    """
    messenger = PosteriorMeanMessenger()
    return messenger(fn) if fn is not None else messenger


def map_loss(model: Callable, guide, x, y, *, num_data: int, prior_weight: float = 1.0) -> torch.Tensor:
    """The MAP objective per row at the guide's posterior means: ``-(1/N) [sum_batch (N/B) log p(y|x, w)
    + prior_weight log p(w)]`` (the data plate scales the batch's log-likelihood by ``N/B``, as in the ELBO).

    Examples
    --------
    >>> pyro.clear_param_store()
    >>> net = pyro_bbb.BNN(pyro_bbb.nn.BayesianLinear(2, 1), pyro_bbb.likelihoods.Gaussian(scale=1.0))
    >>> guide = pyro_bbb.MeanFieldGuide(net)
    >>> _ = guide(torch.zeros(4, 2), torch.zeros(4))
    >>> map_loss(net, guide, torch.zeros(4, 2), torch.zeros(4), num_data=4).requires_grad
    True
    """
    return _traced_map_loss(model, guide, x, y, num_data, prior_weight, data_plate_of(model))[0]


def _traced_map_loss(model: Callable, guide, x, y, num_data: int, prior_weight: float,
                     data_plate: str) -> tuple[torch.Tensor, tuple]:
    """:func:`map_loss` through Pyro's handlers (scaling the model's plate ``data_plate``), with the
    ``(model_trace, guide_trace)`` a replay plan is made from."""
    with DataPlateScaleMessenger(num_data, data_plate):
        guide_trace = poutine.trace(posterior_mean(guide)).get_trace(x, y)
        trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(x, y)
    log_prior, log_likelihood = 0.0, 0.0
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or is_deterministic_site(site):
            continue
        if not site["is_observed"] and name in guide_trace.nodes and needs_posterior(site["fn"]):
            with torch.no_grad():  # an empirical-Bayes prior: the Normal it is, given the posterior (held fixed)
                site = {**site, "fn": prior_in_force(site["fn"], guide_trace.nodes[name]["fn"])}
        log_prob = log_prob_sum(site)  # scaled and masked as in the ELBO
        if site["is_observed"]:
            log_likelihood = log_likelihood + log_prob
        elif name in guide_trace.nodes:
            log_prior = log_prior + log_prob
    return -(log_likelihood + prior_weight * log_prior) / num_data, (trace, guide_trace)


def map_warm_start(model: Callable, guide, batches: Batches, *, epochs: int, lr: float = 1e-3,
                   prior_weight: float = 1.0, should_stop: Callable[[], bool] | None = None) -> None:
    """Train the guide's posterior means for ``epochs`` epochs of Adam on :func:`map_loss` over ``batches``, with
    the model's own deterministic parameters (if any); the posterior scales are not touched.

    The guide must have a Normal posterior per site (:func:`can_warm_start`). A non-finite loss raises
    ``FloatingPointError`` before the step that would apply it. After one step through Pyro's handlers, a
    :class:`~pyro_bbb.BNN` with a :class:`~pyro_bbb.MeanFieldGuide` replays the loss without them (the same loss and
    gradients, bit for bit: :class:`pyro_bbb.infer.ReplayBackend`); other models trace every step.

    Examples
    --------
    See the module's example.
    """
    if guide.prototype_trace is None:
        x, y = next(iter(batches))
        guide(x, y)
    every = every_parameter(model, guide)
    scales = {id(param) for param in guide.scales.parameters()}
    params = [param for param in every if id(param) not in scales and param.requires_grad]
    optimizer = torch.optim.Adam(params, lr=lr)
    replay, replayable = ReplayBackend(enabled=True), True  # after one traced step, replayed (bit for bit)
    data_plate = data_plate_of(model)  # (the model's own plate, whatever its name)
    for _ in range(epochs):
        for x, y in batches:
            loss = replay.map_loss(model, guide, x, y, batches.num_data, data_plate, prior_weight)
            if loss is None:
                loss, traces = _traced_map_loss(model, guide, x, y, batches.num_data, prior_weight, data_plate)
                if replayable:
                    replay.after_map_step(model, guide, traces, batches.num_data, data_plate)
                    replayable = replay.plan is not None
            if not torch.isfinite(loss):
                raise FloatingPointError(f"the MAP warm start's loss became {float(loss.detach())}; lower lr.")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        if should_stop is not None and should_stop():
            break
    for param in every:  # nothing left for the next step, the scales' included
        param.grad = None
