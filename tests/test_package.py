"""The public surface: the top level holds what users call (at most 25 names, each a real object, no module
aliases), every package's ``__all__`` names what it has, and plumbing modules are private (no API page)."""

import ast
import importlib
import pkgutil
import re
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
    for private in ("pyro_bbb._kl", "pyro_bbb._inputs", "pyro_bbb._draws", "pyro_bbb._plates",
                    "pyro_bbb.nn._time_loop", "pyro_bbb.nn._fused_kernel", "pyro_bbb.nn.recurrent"):
        assert private in names, private
    for gone in ("pyro_bbb.infer.kl", "pyro_bbb.infer._kl", "pyro_bbb.data.inputs", "pyro_bbb.data._inputs",
                 "pyro_bbb.nn.draws", "pyro_bbb.nn._draws", "pyro_bbb.plates", "pyro_bbb.nn.recurrence",
                 "pyro_bbb.nn._rnn_kernels"):
        assert gone not in names, gone
    from docs.build_pages import public_modules

    public = public_modules(root.parent)
    assert not [m for m in public if any(part.startswith("_") for part in m.split("."))]
    assert "pyro_bbb.infer.elbo" in public and "pyro_bbb._kl" not in public


def imports_of(path: Path, module: str) -> set[str]:
    """The ``pyro_bbb`` modules that the source file of ``module`` imports from, resolved to absolute names."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                found.add(".".join(base + ([node.module] if node.module else [])))
            elif node.module and node.module.startswith("pyro_bbb"):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("pyro_bbb")}
    return found


def test_no_module_imports_a_private_module_of_another_package():
    """A ``_module`` inside a subpackage is that subpackage's own; the root's ``_`` modules are the shared plumbing
    (``_internals`` is the one adapter to Pyro's and torch's private names)."""
    root = Path(pyro_bbb.__file__).parent
    crossings = []
    for path in root.rglob("*.py"):
        module = ".".join(("pyro_bbb",) + path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for imported in imports_of(path, module):
            owner, _, leaf = imported.rpartition(".")
            if leaf.startswith("_") and not leaf.startswith("__") and owner != "pyro_bbb" \
                    and not package.startswith(owner):
                crossings.append(f"{module} imports {imported}")
    assert not crossings, crossings
    assert imports_of(root / "evaluate" / "metrics.py", "pyro_bbb.evaluate.metrics") >= {"pyro_bbb._inputs"}


def test_the_guides_code_map_lists_every_module_and_no_other():
    """``docs/guide.md``'s "The code's layout" names each folder in bold and its modules in backticks."""
    root = Path(pyro_bbb.__file__).parent
    text = (root.parent / "docs" / "guide.md").read_text()
    section = text.split("## The code's layout", 1)[1].split("\n## ", 1)[0]
    listed = set()
    for folder, body in re.findall(r"\*\*`([a-z_]+)/`\*\*(.*?)(?=\*\*`[a-z_]+/`\*\*|\Z)", section, re.S):
        prefix = "" if folder == "pyro_bbb" else folder + "/"
        listed |= {prefix + name for name in re.findall(r"`([a-z_]+\.py)`", body)}
    actual = {path.relative_to(root).as_posix() for path in root.rglob("*.py") if path.name != "__init__.py"}
    assert not listed - actual, f"the code map lists modules that do not exist: {sorted(listed - actual)}"
    assert not actual - listed, f"the code map does not list: {sorted(actual - listed)}"
