"""The caller's random streams, left as they were.

What reads a model without training it (a diagnostic's Monte Carlo estimate, ``evidence``'s draws, ``save``'s example
draw, a check that runs one step and undoes it) draws inside :func:`rng_untouched`: a fork of torch's CPU generator,
of every CUDA device's generator already in use, and of Python's and numpy's, so the user's next draw is the one it
would have been, on CPU and CUDA alike. With a ``seed`` the fork is seeded (the same estimate every call) without
seeding a CUDA device that is not in use yet, which ``torch.manual_seed`` would do later, when it starts.

Examples
--------
>>> _ = torch.manual_seed(1)
>>> first = torch.rand(1)
>>> _ = torch.manual_seed(1)
>>> with rng_untouched(seed=0):
...     _ = torch.rand(5)
>>> torch.equal(torch.rand(1), first)             # the stream goes on as if nothing had drawn
True
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

__all__ = ["rng_untouched"]


@contextmanager
def rng_untouched(seed: int | None = None, torch_only: bool = False) -> Iterator[None]:
    """Run the block on forks of every random generator in use, restored afterwards (also on an error); seeded with
    ``seed`` when one is given. ``torch_only`` leaves Python's and numpy's generators out (a block that draws with
    torch alone: saving and restoring numpy's state is most of the cost, 0.1 ms against torch's 5 us).

    Examples
    --------
    >>> with rng_untouched(seed=0):
    ...     a = torch.randn(2)
    >>> with rng_untouched(seed=0):
    ...     b = torch.randn(2)
    >>> torch.equal(a, b)
    True
    """
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    states = None if torch_only else (random.getstate(), np.random.get_state())
    try:
        with torch.random.fork_rng(devices=devices):
            if seed is not None:
                torch.random.default_generator.manual_seed(seed)
                for device in devices:
                    torch.cuda.default_generators[device].manual_seed(seed)
                if states is not None:
                    random.seed(seed)
                    np.random.seed(seed)
            yield
    finally:
        if states is not None:
            random.setstate(states[0])
            np.random.set_state(states[1])
