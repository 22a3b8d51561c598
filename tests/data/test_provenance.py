import os
import subprocess
import sys

import numpy as np
import torch

import pyro_bbb
from pyro_bbb.data.provenance import (
    fraction_seen_in_training,
    remember_training_inputs,
    restore_training_fingerprints,
    training_fingerprints,
)

_FINGERPRINTS = ("import torch, pyro_bbb; from pyro_bbb.data.provenance import remember_training_inputs, "
                 "training_fingerprints; g = object.__new__(pyro_bbb.MeanFieldGuide); "
                 "remember_training_inputs(g, torch.arange(12.0).reshape(4, 3)); "
                 "print(training_fingerprints(g).tolist())")


def test_fingerprints_are_the_same_in_every_process():
    """A checkpoint carries them to another process: Python's own hash of bytes is salted per process
    (PYTHONHASHSEED), and would have matched no row there."""
    runs = [subprocess.run([sys.executable, "-c", _FINGERPRINTS], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")]
    guide = object.__new__(pyro_bbb.MeanFieldGuide)
    remember_training_inputs(guide, torch.arange(12.0).reshape(4, 3))
    assert runs[0] == runs[1] == f"{training_fingerprints(guide).tolist()}\n"


def test_fingerprints_match_equal_rows_whatever_holds_them_and_restore_in_place_of_others():
    guide = object.__new__(pyro_bbb.MeanFieldGuide)
    x = torch.randn(6, 3)
    assert training_fingerprints(guide) is None and fraction_seen_in_training(guide, x) is None
    remember_training_inputs(guide, x[:3])
    assert fraction_seen_in_training(guide, x.double().numpy()) == 0.5
    assert fraction_seen_in_training(guide, np.asarray(x[:3])) == 1.0
    saved = training_fingerprints(guide)
    assert saved.dtype == torch.int64 and saved.shape == (3,)
    other = object.__new__(pyro_bbb.MeanFieldGuide)
    remember_training_inputs(other, x[3:])
    restore_training_fingerprints(other, saved)  # in place of its own
    assert fraction_seen_in_training(other, x[:3]) == 1.0 and fraction_seen_in_training(other, x[3:]) == 0.0
    restore_training_fingerprints(other, None)
    assert fraction_seen_in_training(other, x) is None


def test_a_row_with_negative_zero_is_the_row_with_zero():
    """-0.0 == 0.0, but their bytes differ: a standardized feature that rounds to -0.0 was a row never seen."""
    guide = object.__new__(pyro_bbb.MeanFieldGuide)
    remember_training_inputs(guide, torch.tensor([[0.0, 1.0], [2.0, 0.0]]))
    assert fraction_seen_in_training(guide, torch.tensor([[-0.0, 1.0], [2.0, -0.0]])) == 1.0
    assert fraction_seen_in_training(guide, np.array([[-0.0, 1.0]])) == 1.0


def test_rows_of_a_tuple_or_dict_of_inputs_are_fingerprinted_and_a_tensors_as_before():
    """Several inputs per row (a tuple, a dict: a transformers BatchEncoding) were not recorded: a second
    fit(kl_weight="auto") chose the weight again on rows the guide was trained on, and fit_temperature took them as
    held out. A tensor's fingerprints are those checkpoints already hold (the blake2b of each row's bytes)."""
    import hashlib

    guide = object.__new__(pyro_bbb.MeanFieldGuide)
    a, b = torch.randn(6, 2), torch.arange(6).reshape(6, 1)
    remember_training_inputs(guide, (a[:3], b[:3]))
    assert fraction_seen_in_training(guide, (a, b)) == 0.5
    assert fraction_seen_in_training(guide, (a, b + 1)) == 0.0  # the row is all its parts
    encoded = object.__new__(pyro_bbb.MeanFieldGuide)
    remember_training_inputs(encoded, {"x": a[:3], "ids": b[:3]})
    assert fraction_seen_in_training(encoded, {"ids": b, "x": a}) == 0.5  # a dict: its tensors by key
    assert fraction_seen_in_training(guide, (a, b[:4])) is None  # (not rows of one length: nothing said)
    single = object.__new__(pyro_bbb.MeanFieldGuide)
    remember_training_inputs(single, a)
    expected = sorted(int.from_bytes(hashlib.blake2b(row.numpy().tobytes(), digest_size=8).digest(), "little",
                                     signed=True) for row in a)
    assert training_fingerprints(single).tolist() == expected


def test_a_second_auto_fit_on_a_tuple_of_inputs_keeps_its_weight():
    import warnings

    import pyro

    from pyro_bbb import likelihoods
    from pyro_bbb.nn import BayesianLinear

    class TwoInputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = BayesianLinear(3, 1)

        def forward(self, a, b):
            return self.layer(torch.cat([a, b], -1))

    torch.manual_seed(0)
    a, b = torch.randn(40, 2), torch.randn(40, 1)
    y = a[:, 0] - b[:, 0] + 0.3 * torch.randn(40)
    for x in ((a, b), {"a": a, "b": b}):
        pyro.clear_param_store()
        bnn = pyro_bbb.BNN(TwoInputs(), likelihoods.Gaussian())
        guide = pyro_bbb.MeanFieldGuide(bnn)
        pyro_bbb.fit(bnn, guide, (x, y), epochs=3, batch_size=10, kl_weight=0.1, progress=False, seed=0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            history = pyro_bbb.fit(bnn, guide, (x, y), epochs=3, batch_size=10, progress=False, seed=0)
        assert history.kl_weight_choice.kl_weight == 0.1
        assert any("trained it on 100% of these rows" in str(w.message) for w in caught)
