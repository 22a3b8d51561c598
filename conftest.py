"""Shared by the tests and the docstring examples.

Docstring examples run with the names every example uses already imported (``torch``, ``pyro``, ``dist``,
``poutine``, ``pyro_bbb``, ``likelihoods``, ``priors``, ``BNN``, ``MeanFieldGuide``, ``BayesianLinear``) and a
fresh Pyro param store, so that they show what they are about rather than the same set-up lines. The optional
Lightning integration is skipped when Lightning is not installed (``pip install pyro-bbb[lightning]``).
"""

import importlib.util

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import pytest
import torch

import pyro_bbb
from pyro_bbb import BNN, MeanFieldGuide, likelihoods, priors
from pyro_bbb.nn import BayesianLinear

collect_ignore = []
if importlib.util.find_spec("lightning") is None:
    collect_ignore += [
        "pyro_bbb/train/lightning.py", "tests/train/lightning_script.py", "tests/train/test_lightning.py"]


@pytest.fixture(autouse=True)
def doctest_names(request, doctest_namespace):
    """For docstring examples: the common imports, and an empty param store with a fixed seed."""
    doctest_namespace.update(torch=torch, pyro=pyro, dist=dist, poutine=poutine, pyro_bbb=pyro_bbb,
                             likelihoods=likelihoods, priors=priors, BNN=BNN, MeanFieldGuide=MeanFieldGuide,
                             BayesianLinear=BayesianLinear)
    if isinstance(request.node, pytest.DoctestItem):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
