import random

import numpy as np
import pytest
import torch

from pyro_bbb._rng import rng_untouched


def _streams():
    return torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()


def _same(a, b):
    return torch.equal(a[0], b[0]) and a[1] == b[1] and (a[2] == b[2]).all()


@pytest.mark.parametrize("seed", [None, 0])
def test_every_stream_is_as_it_was_after_the_block_and_after_an_error(seed):
    torch.manual_seed(3), random.seed(3), np.random.seed(3)
    before = _streams()
    with rng_untouched(seed):
        torch.rand(3), random.random(), np.random.rand()
    assert _same(_streams(), before)
    with pytest.raises(RuntimeError, match="inside"), rng_untouched(seed):
        torch.rand(3)
        raise RuntimeError("inside")
    assert _same(_streams(), before)


def test_a_seed_gives_the_same_draws_whatever_the_callers_state():
    draws = []
    for caller_seed in (1, 2):
        torch.manual_seed(caller_seed), random.seed(caller_seed), np.random.seed(caller_seed)
        with rng_untouched(seed=0):
            draws.append((torch.randn(4), random.random(), np.random.rand()))
    assert torch.equal(draws[0][0], draws[1][0]) and draws[0][1:] == draws[1][1:]
    with rng_untouched():  # no seed: the caller's own stream is drawn from
        torch.manual_seed(5)
        expected = torch.randn(2)
    torch.manual_seed(5)
    with rng_untouched():
        assert torch.equal(torch.randn(2), expected)


def test_a_seed_does_not_seed_a_cuda_device_not_yet_in_use(monkeypatch):
    # torch.manual_seed would queue a seed for CUDA, applied when it starts (moving the user's CUDA stream later)
    calls = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: calls.append(seed))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    with rng_untouched(seed=0):
        pass
    assert calls == []


def test_torch_only_leaves_python_and_numpy_out():
    random.seed(3), np.random.seed(3)
    with rng_untouched(seed=0, torch_only=True):
        drawn = random.random()
    random.seed(3)
    assert drawn == random.random()  # the caller's own Python stream, not a seeded fork
