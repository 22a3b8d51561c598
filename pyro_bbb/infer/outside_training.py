"""Whether a recorded guide was trained since by an objective other than :class:`pyro_bbb.ELBO`.

``fit`` records the KL weight it trained a guide at (:mod:`~pyro_bbb.infer.tempering`); a Pyro user may go on training
that guide in an ``SVI`` loop of Pyro's own ``Trace_ELBO`` (weight 1), which knows nothing of the record.
:func:`watch_guide` puts a hook on each of the guide's parameters that fires when a backward pass computes its gradient:
a pass that runs neither inside a :class:`pyro_bbb.ELBO` call or ``fit`` (:func:`objective_of_record`) nor through a
``pyro_bbb.ELBO`` loss (:func:`watch_objective_backward`), and that does not add onto a gradient such a loss left that
is neither applied by pyro_bbb's optimizers nor zeroed yet (an auxiliary loss of one's own, backward apart; with a torch
optimizer, gradients added without ``zero_grad`` after its step count as such), has the guide's parameters digested
before any step. :func:`trained_outside` then says whether they changed since: a step taken on gradients that did not
come from ``pyro_bbb.ELBO``. Gradients no step follows (a look at them, a saliency map) change nothing. The digest reads
the values' bits, so a fused optimizer kernel or a ``.data`` write, which torch's version counter misses, is seen too. A
``load_state_dict`` of the guide forgets what was noted. Not watched: a guide function (not a module), parameters that
did not require gradients when the record was made or that Pyro's param store replaced since, other threads while one
runs ``fit``, and a ``pyro_bbb.ELBO`` loss summed with another guide's loss excuses that loss too. A backward nested in
a ``pyro_bbb.ELBO`` loss's, with an id of its own (``checkpoint(..., use_reentrant=True)`` in a guide module), is taken
for an outside one: use ``use_reentrant=False``, torch's recommended checkpoint.

Examples
--------
>>> bnn = pyro_bbb.BNN(BayesianLinear(2, 1), likelihoods.Gaussian(scale=0.5))
>>> guide = pyro_bbb.MeanFieldGuide(bnn)
>>> x, y = torch.randn(10, 2), torch.randn(10)
>>> _ = pyro_bbb.ELBO(num_data=10).loss(bnn, guide, x, y)  # (sets the guide up)
>>> watch_guide(guide)
>>> svi = pyro.infer.SVI(bnn, guide, pyro.optim.Adam({"lr": 0.01}), pyro.infer.Trace_ELBO())
>>> _ = svi.step(x, y)
>>> trained_outside(guide)
True
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import torch

from .._internals import current_backward_id
from .contract import objective_gradient_kept

__all__ = ["objective_of_record", "watch_objective_backward", "watch_guide", "trained_outside",
           "forget_outside_training"]

#: guide -> (the backward pass that left gradients from outside on it, its parameters' digests before any step)
_digests_before: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: guide -> {id: (weak parameter, hook handle)} of its hooked parameters
_hooked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: the latest backward passes through a pyro_bbb.ELBO loss (ids): enough to cover every pass a digest can wait on,
#: since the next pyro_bbb.ELBO training call forgets the digests (forget_outside_training)
_objective_backwards: deque[int] = deque(maxlen=64)
_objective_calls = 0  # pyro_bbb.ELBO calls and fits under way: their backward passes train at the recorded weight


@contextmanager
def objective_of_record() -> Iterator[None]:
    """Run :class:`pyro_bbb.ELBO`'s calls and ``fit`` inside it: their backward passes (the MAP warm start's too)
    train the posterior at the weight they record, so they are not another objective's.

    Examples
    --------
    >>> bnn = pyro_bbb.BNN(BayesianLinear(2, 1), likelihoods.Gaussian(scale=0.5), num_data=10)
    >>> guide = pyro_bbb.MeanFieldGuide(bnn)
    >>> svi = pyro.infer.SVI(bnn, guide, pyro.optim.Adam({"lr": 0.01}), pyro.infer.Trace_ELBO())
    >>> _ = svi.step(torch.randn(10, 2), torch.randn(10))
    >>> watch_guide(guide)
    >>> with objective_of_record():  # (taken for pyro_bbb's own step)
    ...     _ = svi.step(torch.randn(10, 2), torch.randn(10))
    >>> trained_outside(guide)
    False
    """
    global _objective_calls
    _objective_calls += 1
    try:
        yield
    finally:
        _objective_calls -= 1


def watch_objective_backward(loss: torch.Tensor) -> None:
    """Note the backward pass of ``loss`` (a :class:`pyro_bbb.ELBO` loss whose backward is the caller's:
    ``differentiable_loss``) as one that trains at the recorded weight, with any loss summed with it.

    Examples
    --------
    >>> guide = torch.nn.Linear(2, 1)
    >>> watch_guide(guide)
    >>> loss = guide(torch.randn(4, 2)).square().sum()
    >>> watch_objective_backward(loss)
    >>> loss.backward()
    >>> torch.optim.SGD(guide.parameters(), lr=0.1).step()
    >>> trained_outside(guide)  # (without watch_objective_backward: True)
    False
    """
    def at_backward(grad: torch.Tensor) -> torch.Tensor:
        _objective_backwards.append(current_backward_id())
        return grad
    loss.register_hook(at_backward)


def watch_guide(guide: torch.nn.Module) -> None:
    """Hook each of ``guide``'s parameters that requires gradients (once; the hooks go with the guide): a backward
    pass from outside ``pyro_bbb.ELBO`` has the guide's parameters digested before its gradients can be applied.

    Examples
    --------
    >>> guide = pyro_bbb.MeanFieldGuide(BayesianLinear(2, 1))
    >>> _ = guide(torch.randn(3, 2))
    >>> watch_guide(guide)
    >>> trained_outside(guide)
    False
    """
    if guide not in _hooked:
        _hooked[guide] = {}
        weakref.finalize(guide, _remove_hooks, _hooked[guide])
        # a state put back by hand is not a step taken on outside gradients (nor known to be one of pyro_bbb's)
        guide.register_load_state_dict_post_hook(lambda module, keys: forget_outside_training(module))
    hooked, guide_ref = _hooked[guide], weakref.ref(guide)

    def at_gradient(param_ref: weakref.ref, grad: torch.Tensor) -> None:
        if _objective_calls or (guide_now := guide_ref()) is None or guide_now in _digests_before:
            return  # (pyro_bbb's own step: one test, as cheap as a hook can be)
        backward = current_backward_id()
        if backward in _objective_backwards or objective_gradient_kept(param_ref()):  # (an auxiliary loss's)
            return
        _digests_before[guide_now] = backward, _digests(guide_now)

    for param in guide.parameters():
        entry = hooked.get(id(param))
        if param.requires_grad and (entry is None or entry[0]() is not param):
            param_ref = weakref.ref(param)
            handle = param.register_hook(partial(at_gradient, param_ref))
            hooked[id(param)] = (param_ref, handle)


def trained_outside(guide: torch.nn.Module) -> bool:
    """Whether a parameter of ``guide`` changed after a backward pass from outside :class:`pyro_bbb.ELBO` left
    gradients on it (:func:`watch_guide`).

    Examples
    --------
    >>> trained_outside(pyro_bbb.MeanFieldGuide(BayesianLinear(2, 1)))
    False
    """
    noted = _digests_before.get(guide)
    if noted is None:
        return False
    backward, digests = noted
    if backward in _objective_backwards:  # a pyro_bbb.ELBO loss was in that pass after all (reached later)
        _digests_before.pop(guide, None)
        return False
    return any(key not in digests or not torch.equal(digest, digests[key]) for key, digest in _digests(guide).items())


def forget_outside_training(guide: torch.nn.Module) -> None:
    """Forget what :func:`watch_guide` noted of ``guide`` (a new record, or a :class:`pyro_bbb.ELBO` training call
    that trains it from here at the weight it records).

    Examples
    --------
    >>> guide = torch.nn.Linear(2, 1)
    >>> watch_guide(guide)
    >>> guide(torch.randn(4, 2)).sum().backward()  # (gradients from outside)
    >>> torch.optim.SGD(guide.parameters(), lr=0.1).step()
    >>> forget_outside_training(guide)  # (e.g. a new record)
    >>> trained_outside(guide)
    False
    """
    _digests_before.pop(guide, None)


def _digests(guide: torch.nn.Module) -> dict[int, torch.Tensor]:
    """Each parameter of ``guide`` (by id: the guide holds them) -> two integers read from the bits of its values:
    their sum, and their sum weighted by a pseudo-random odd number per position. An optimizer's step changes them
    (a change that cancels in both sums would have to be made for it), a NaN is equal to itself, no float64 is
    needed, and the weighted sum runs over chunks, so no more than a chunk's copy is made."""
    out = {}
    for param in guide.parameters():
        values = param.detach()
        values = torch.view_as_real(values) if values.is_complex() else values
        bits = values.reshape(-1).view(_SAME_SIZE_INTEGER[values.element_size()])
        weighted = torch.zeros((), dtype=torch.int64, device=bits.device)
        for start in range(0, bits.numel(), _CHUNK):
            chunk = bits[start:start + _CHUNK]
            positions = torch.arange(start, start + chunk.numel(), device=bits.device)
            weighted += (chunk.long() * ((positions * _GOLDEN) % _TWO_32 | 1)).sum()
        out[id(param)] = torch.stack([bits.sum(dtype=torch.int64), weighted])
    return out


_CHUNK = 1 << 20  # values a chunk of the weighted sum reads
_GOLDEN, _TWO_32 = 2654435761, 1 << 32  # (Knuth's multiplicative hash of the position, made odd)
_SAME_SIZE_INTEGER = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _remove_hooks(hooked: dict) -> None:
    """The guide is gone: its parameters (if they live on, in Pyro's param store) keep no hook of it."""
    for _, handle in hooked.values():
        handle.remove()
