"""What :class:`pyro_bbb.ELBO` learns about one (model, guide) pair and keeps for it alone: the KL schedule's step,
whether Pyro's validation has checked the pair once, and whether its vectorized particles equal one particle alone.

Examples
--------
>>> pairs = PairStates()
>>> model, guide = (lambda: None), (lambda: None)
>>> pairs.select(model, guide).step
0
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import Any

import pyro.poutine as poutine
import torch

__all__ = ["PairState", "PairStates", "particle_matches_alone", "checked_vectorized_particles"]


class PairState:
    """One pair's KL schedule ``step``, whether it was ``validated``, and ``vectorized_ok`` (``None``: not checked).

    Examples
    --------
    >>> PairState(None, None).validated
    False
    """

    def __init__(self, model, guide):
        self.step, self.validated, self.vectorized_ok = 0, False, None
        self._refs = tuple(_reference(obj) for obj in (model, guide))

    def holds(self, model, guide) -> bool:
        """Whether this is the state of ``(model, guide)``."""
        return all(ref() is obj for ref, obj in zip(self._refs, (model, guide)))

    def alive(self) -> bool:
        """Whether its model and guide still exist."""
        return all(ref() is not None for ref in self._refs)


class PairStates:
    """The states of the pairs an ELBO has seen, and the current one (a fresh state before any call): what one pair
    learned never stands for another's.

    Examples
    --------
    >>> PairStates().current.step
    0
    """

    def __init__(self):
        self._states: dict[tuple[int, int], PairState] = {}
        self.current = PairState(None, None)

    def select(self, model, guide) -> PairState:
        """Make ``(model, guide)``'s state current (a new one for a new pair) and return it."""
        key = (id(model), id(guide))
        state = self._states.get(key)
        if state is None or not state.holds(model, guide):
            self._states = {k: v for k, v in self._states.items() if v.alive()}
            state = self._states[key] = PairState(model, guide)
        self.current = state
        return state


def _reference(obj) -> Callable[[], Any]:
    """A weak reference where the object allows one (a module, a function), else a strong one."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _first_particle(value: torch.Tensor, event_dim: int, max_plate_nesting: int) -> torch.Tensor:
    """A vectorized site's value at particle 0, without the particle dimension or leading singletons."""
    batch_dims = value.dim() - event_dim
    if batch_dims >= max_plate_nesting:
        value = value.select(batch_dims - max_plate_nesting, 0)
    while value.dim() > event_dim and value.shape[0] == 1:
        value = value[0]
    return value


@torch.no_grad()
def particle_matches_alone(vectorized_model, model, guide_trace, max_plate_nesting, args, kwargs) -> bool:
    """Whether the observed log-densities of particle 0 equal those of its weight draw run without the plate
    (both with the estimators' handlers hidden: Flipout's signs are not part of the draw).

    Examples
    --------
    >>> import pyro
    >>> def model():
    ...     pyro.sample("y", pyro.distributions.Normal(0.0, 1.0), obs=torch.tensor(0.5))
    >>> trace = poutine.trace(lambda: None).get_trace()
    >>> particle_matches_alone(model, model, trace, 1, (), {})
    True
    """
    draws = {name: site["value"] for name, site in guide_trace.iter_stochastic_nodes()}
    first = {name: _first_particle(value, guide_trace.nodes[name]["fn"].event_dim, max_plate_nesting)
             for name, value in draws.items()}
    try:
        with poutine.block(hide_types=["bayesian_affine", "bayesian_affine_map"]), poutine.block():
            together = poutine.trace(poutine.condition(vectorized_model, data=draws)).get_trace(*args, **kwargs)
            alone = poutine.trace(poutine.condition(model, data=first)).get_trace(*args, **kwargs)
    except (RuntimeError, ValueError, IndexError):
        return False
    for name, site in together.nodes.items():
        if site["type"] != "sample" or not site["is_observed"]:
            continue
        vectorized = _first_particle(site["fn"].log_prob(site["value"]), 0, max_plate_nesting)
        single = alone.nodes[name]["fn"].log_prob(alone.nodes[name]["value"])
        if vectorized.numel() != single.numel() or not torch.allclose(
            vectorized.reshape(-1), single.reshape(-1), rtol=1e-4, atol=1e-4
        ):
            return False
    return True


def checked_vectorized_particles(elbo, pair: PairState, model, guide, unscaled_model, args, kwargs):
    """An ELBO's particle traces where its vectorized particles are not known to be right: the first call compares
    particle 0 with its draw run alone (:func:`particle_matches_alone`); where they differ (the model's code reads the
    particle dimension as its batch) a warning, and the particles one at a time from then on.

    Examples
    --------
    ::

        yield from checked_vectorized_particles(elbo, elbo.pairs.current, model, guide, unscaled, args, kwargs)
    """
    if pair.vectorized_ok is None:
        traces = next(elbo.pyro_particle_traces(model, guide, args, kwargs))
        pair.vectorized_ok = particle_matches_alone(elbo.vectorized_model(unscaled_model), unscaled_model, traces[1],
                                                    elbo.max_plate_nesting, args, kwargs)
        if pair.vectorized_ok:
            yield traces
            return
        warnings.warn(
            "pyro_bbb.ELBO(vectorize_particles=True): particle 0 of the vectorized model differs from the same weight "
            "draw run alone (the model's code reads the particle dimension as its batch); running the "
            f"{elbo.num_particles} particles one at a time instead. Build the model with pyro_bbb.BNN, whose network "
            "sees ordinary batches, or index from the right (out[..., -1, :]).", stacklevel=5)
    for _ in range(elbo.num_particles):
        yield elbo.trace_pair(model, guide, args, kwargs)
