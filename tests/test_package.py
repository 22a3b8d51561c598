"""The public surface: the top level holds what users call (at most 25 names, each a real object, no module
aliases), every package's ``__all__`` names what it has, and plumbing modules are private (no API page)."""

import importlib
import pkgutil
from pathlib import Path

import pyro_bbb

PACKAGES = ["pyro_bbb", "pyro_bbb.nn", "pyro_bbb.infer", "pyro_bbb.optim", "pyro_bbb.train", "pyro_bbb.prediction",
            "pyro_bbb.evaluate", "pyro_bbb.data"]


def test_the_top_level_is_the_happy_path_and_the_packages():
    assert len(pyro_bbb.__all__) <= 25, pyro_bbb.__all__
    assert len(set(pyro_bbb.__all__)) == len(pyro_bbb.__all__)
    for name in ("BNN", "MeanFieldGuide", "ELBO", "fit", "predict", "evidence", "save", "load", "flipout"):
        assert name in pyro_bbb.__all__
    # one name per thing: what moved into its package is not also at the top
    for alias in ("metrics", "plots", "diagnostics", "datasets", "schedules", "History", "Prediction", "DataError",
                  "FlipoutMessenger", "to_inference_data", "set_up_guide", "DEFAULT_INIT_SCALE"):
        assert alias not in pyro_bbb.__all__ and not hasattr(pyro_bbb, alias), alias


def test_every_exported_name_exists_and_is_documented():
    for package in PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            value = getattr(module, name)  # AttributeError names the missing export
            if callable(value) and not name.startswith("_"):
                assert (getattr(value, "__doc__", None) or "").strip(), f"{package}.{name} has no docstring"


def test_plumbing_is_private_and_gets_no_api_page():
    """The modules of the ELBO's internals, of input handling, of vectorized draws and of the data plate's name are
    private; the recurrent engines are named for what they run."""
    root = Path(pyro_bbb.__file__).parent
    names = {m.name for m in pkgutil.walk_packages([str(root)], "pyro_bbb.")}
    for private in ("pyro_bbb.infer._kl", "pyro_bbb.data._inputs", "pyro_bbb.nn._draws", "pyro_bbb._plates",
                    "pyro_bbb.nn._time_loop", "pyro_bbb.nn._fused_kernel", "pyro_bbb.nn.recurrent"):
        assert private in names, private
    for gone in ("pyro_bbb.infer.kl", "pyro_bbb.data.inputs", "pyro_bbb.nn.draws", "pyro_bbb.plates",
                 "pyro_bbb.nn.recurrence", "pyro_bbb.nn._rnn_kernels"):
        assert gone not in names, gone
    from docs.build_pages import public_modules

    public = public_modules(root.parent)
    assert not [m for m in public if any(part.startswith("_") for part in m.split("."))]
    assert "pyro_bbb.infer.elbo" in public and "pyro_bbb.infer._kl" not in public
