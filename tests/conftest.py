import pyro
import pytest
import torch


@pytest.fixture(autouse=True)
def fresh_pyro():
    """Each test starts with an empty param store and a fixed seed."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    torch.set_default_dtype(torch.float32)
    yield
    pyro.clear_param_store()
