"""Pages generated for the documentation: one API page per module of pyro_bbb, one page per tutorial (its markdown
cells as text, its code as code, and the figures it writes, from ``docs/figures/``)."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

#: The modules with an API page, in the order of the index.
MODULES = [
    "pyro_bbb", "pyro_bbb.bnn", "pyro_bbb.nn", "pyro_bbb.nn.linear", "pyro_bbb.nn.conv", "pyro_bbb.nn.recurrent",
    "pyro_bbb.nn.recurrence", "pyro_bbb.nn.module", "pyro_bbb.nn.functional", "pyro_bbb.nn.draws", "pyro_bbb.priors",
    "pyro_bbb.likelihoods", "pyro_bbb.guide", "pyro_bbb.elbo", "pyro_bbb.handlers", "pyro_bbb.moments",
    "pyro_bbb.training", "pyro_bbb.predictive", "pyro_bbb.prediction", "pyro_bbb.metrics", "pyro_bbb.diagnostics",
    "pyro_bbb.plots", "pyro_bbb.export", "pyro_bbb.convert", "pyro_bbb.checkpoint", "pyro_bbb.inputs",
    "pyro_bbb.checks", "pyro_bbb.pruning", "pyro_bbb.schedules", "pyro_bbb.stopping", "pyro_bbb.optim",
    "pyro_bbb.datasets", "pyro_bbb.distributed", "pyro_bbb.lightning", "pyro_bbb.pyro_adapter",
]
#: Packages whose names are re-exports of their modules' (documented there): their page shows the docstring only.
PACKAGES = {"pyro_bbb", "pyro_bbb.nn"}


def _api_page(module: str) -> str:
    title = f"``{module}``"
    options = "" if module in PACKAGES else "   :members:\n"
    body = f"{title}\n{'=' * len(title)}\n\n.. automodule:: {module}\n{options}"
    if module in PACKAGES:
        import importlib

        names = getattr(importlib.import_module(module), "__all__", [])
        body += "\nPublic names: " + ", ".join(f"``{n}``" for n in names) + ".\n"
    return body


def _tutorial_page(script: Path, figures: Path) -> str:
    source = script.read_text()
    cells = re.split(r"^# %%(.*)$", source, flags=re.MULTILINE)
    parts = []
    if cells[0].strip():
        parts.append(f"```python\n{cells[0].strip()}\n```")
    for marker, body in zip(cells[1::2], cells[2::2]):
        body = body.strip("\n")
        if "[markdown]" in marker:
            lines = (line[2:] if line.startswith("# ") else line.lstrip("#") for line in body.splitlines())
            parts.append("\n".join(lines))
        elif body.strip():
            parts.append(f"```python\n{body}\n```")
    names = sorted({m.group(1) for m in re.finditer(r"([\w{}\-]+)\.png", source)})
    patterns = [re.sub(r"\{[^}]*\}", "*", name) + ".png" for name in names]
    found = sorted(p.name for p in figures.glob("*.png") if any(fnmatch.fnmatch(p.name, pat) for pat in patterns))
    parts.append(f"## Figures\n\nRun `python tutorials/{script.name}` to write them to `tutorials/figures/`.")
    parts += [f"![{name}](../../figures/{name})" for name in found]
    return "\n\n".join(parts) + "\n"


def write_pages(docs: Path) -> None:
    """Write ``docs/generated/api/*.rst`` and ``docs/generated/tutorials/*.md`` (only files whose text changed)."""
    root = docs.parent
    pages: dict[Path, str] = {}
    for module in MODULES:
        pages[docs / "generated" / "api" / f"{module}.rst"] = _api_page(module)
    for script in sorted((root / "tutorials").glob("*.py")):
        pages[docs / "generated" / "tutorials" / f"{script.stem}.md"] = _tutorial_page(script, docs / "figures")
    for path, text in pages.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
