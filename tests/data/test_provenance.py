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
