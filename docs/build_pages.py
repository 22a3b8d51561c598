"""Pages generated for the documentation at build time, under ``docs/generated/``:

* one API page per public module of pyro_bbb, and ``api.md``, which lists them grouped by role;
* one page per tutorial: its markdown cells as prose, its code cut at every ``# %%`` marker (the marker's text a
  sentence before the code), what each piece printed right under it (``docs/figures/<tutorial>.output.json``,
  written by ``make figures``), and each figure it writes right under the code that writes it, with the caption
  ``docs/captions.toml`` writes for that figure (what the figure shows);
* ``tutorials.md``, the tutorials in reading order.
"""

from __future__ import annotations

import fnmatch
import json
import re
import textwrap
from pathlib import Path

import tomllib

#: The package whose public modules get an API page.
PACKAGE = "pyro_bbb"

#: Reading order of the tutorials (any tutorial not listed comes after these, alphabetically).
TUTORIAL_ORDER = [
    "quickstart", "regression_uncertainty", "classification_calibration", "uncertainty_baselines",
    "kl_scaling_explained", "why_is_my_kl_flat",
    "pyro_style_models", "natural_gradient", "bayesian_lstm_reber", "bayesian_transformer_head", "inspect_with_arviz",
]

#: API sections: a title and the modules it holds (a name ending in ``.`` takes that package and its modules).
API_ROLES = [
    ("The model: networks, priors, likelihoods", ["pyro_bbb", "pyro_bbb.bnn", "pyro_bbb.priors",
                                                  "pyro_bbb.distributions", "pyro_bbb.likelihoods"]),
    ("Bayesian layers", ["pyro_bbb.nn."]),
    ("Inference: guide, ELBO, estimators", ["pyro_bbb.infer."]),
    ("Optimizers", ["pyro_bbb.optim."]),
    ("Training", ["pyro_bbb.train."]),
    ("Prediction", ["pyro_bbb.prediction."]),
    ("Evaluation: metrics, diagnostics, plots, ArviZ", ["pyro_bbb.evaluate."]),
    ("Data", ["pyro_bbb.data."]),
    ("Checkpoints", ["pyro_bbb.checkpoint"]),
]


def public_modules(root: Path) -> list[str]:
    """Every module and package of pyro_bbb whose dotted name has no private (``_``) part, packages first."""
    names = []
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not any(part.startswith("_") for part in parts):
            names.append(".".join(parts))
    return sorted(names, key=lambda name: (name.count(".") > 0, name))


def _is_package(module: str, root: Path) -> bool:
    return (root / module.replace(".", "/") / "__init__.py").exists()


def _api_page(module: str, package: bool) -> str:
    """A package's page shows its docstring and public names (documented in its modules); a module's, its members."""
    title = f"``{module}``"
    options = "" if package else "   :members:\n"
    body = f"{title}\n{'=' * len(title)}\n\n.. automodule:: {module}\n{options}"
    if package:
        import importlib

        names = getattr(importlib.import_module(module), "__all__", [])
        body += "\nPublic names: " + ", ".join(f"``{n}``" for n in names) + ".\n"
    return body


def _in_role(module: str, members: list[str]) -> bool:
    return any(module == m or (m.endswith(".") and (module == m[:-1] or module.startswith(m))) for m in members)


def _api_index(modules: list[str]) -> str:
    """The API reference's front page: one toctree per role; every public module is in exactly one."""
    parts = ["# API reference\n\nThe public modules, grouped by what they are for. Private modules (`_name`) are "
             "implementation details and not listed."]
    placed = set()
    for title, members in API_ROLES:
        chosen = [m for m in modules if _in_role(m, members) and m not in placed]
        placed.update(chosen)
        entries = "\n".join(f"api/{m}" for m in chosen)
        parts.append(f"## {title}\n\n```{{toctree}}\n:maxdepth: 1\n\n{entries}\n```")
    missing = sorted(set(modules) - placed)
    if missing:
        raise ValueError(f"build_pages.API_ROLES places no role for the modules {missing}: add them to a role.")
    return "\n\n".join(parts) + "\n"


_MARKER = re.compile(r"^\s*# %%(.*)$")
_NOQA = re.compile(r"\s+# noqa(: [A-Z0-9, ]+)?$")


def tutorial_cells(source: str) -> list[dict]:
    """The script cut at every ``# %%`` line (at any indentation): ``{"kind": "markdown" | "code", "text", "note",
    "first", "last"}`` with the 1-based line range of each cell's body and, for code, the marker's text as a note."""
    lines = source.splitlines()
    starts = [i for i, line in enumerate(lines) if _MARKER.match(line)]
    if not starts or starts[0] != 0:
        starts = [-1, *starts]
    cells = []
    for start, end in zip(starts, [*starts[1:], len(lines)]):
        marker = _MARKER.match(lines[start]).group(1).strip() if start >= 0 else ""
        body = lines[start + 1 : end]
        if "[markdown]" in marker:
            text = "\n".join(re.sub(r"^\s*# ?", "", line) if line.strip() else "" for line in body)
            cells.append({"kind": "markdown", "text": text.strip(), "first": start + 2, "last": end})
        else:
            while marker and body and body[0].strip().startswith("# "):  # the note goes on over comment lines
                marker += " " + body[0].strip()[2:]
                body = body[1:]
            code = textwrap.dedent("\n".join(_NOQA.sub("", line) for line in body)).strip("\n")
            cells.append({"kind": "code", "text": code, "note": marker, "first": start + 2, "last": end})
    return cells


def _place_outputs(records: list[list], source: str) -> list[tuple[int | None, str]]:
    """``(line, text)`` per printed text: the line of ``source`` holding the code that printed it (the recorded line
    if it still holds that code, else the nearest line that does; ``None`` when no line does any more)."""
    lines = [line.strip() for line in source.splitlines()]
    placed = []
    for line, code, text in records:
        if line is not None and not (0 < line <= len(lines) and lines[line - 1] == code):
            candidates = [i + 1 for i, current in enumerate(lines) if code and current == code]
            line = min(candidates, key=lambda i: abs(i - line)) if candidates else None
        placed.append((line, text))
    return placed


def _figures_written(code: str, figures: Path) -> list[str]:
    """The PNGs in ``figures`` whose names ``code`` mentions (``{...}`` in a name is a wildcard)."""
    names = sorted({m.group(1) for m in re.finditer(r"([\w{}\-]+)\.png", code)})
    patterns = [re.sub(r"\{[^}]*\}", "*", name) + ".png" for name in names]
    return sorted(p.name for p in figures.glob("*.png") if any(fnmatch.fnmatch(p.name, pat) for pat in patterns))


def figure_captions(figures: Path) -> dict[str, str]:
    """Each figure's caption, by file name, from ``captions.toml`` beside the ``figures`` folder (empty without one)."""
    path = figures.parent / "captions.toml"
    return tomllib.loads(path.read_text())["captions"] if path.exists() else {}


def _figure(name: str, caption: str) -> str:
    """A MyST figure of ``docs/figures/<name>`` on a page under ``docs/generated/tutorials/``, at its own size up to
    the text column's width (the stylesheet's ``max-width``), so that a small plot is not stretched."""
    return f"```{{figure}} ../../figures/{name}\n:alt: {name}\n\n{caption}\n```"


def _tutorial_page(script: Path, figures: Path) -> str:
    source = script.read_text()
    cells = tutorial_cells(source)
    output_file = figures / f"{script.stem}.output.json"
    outputs = _place_outputs(json.loads(output_file.read_text()), source) if output_file.exists() else []
    captions = figure_captions(figures)
    parts, shown = [], set()
    for cell in cells:
        if cell["kind"] == "markdown":
            parts.append(cell["text"])
            continue
        if not cell["text"].strip():
            continue
        if cell["note"]:
            parts.append(cell["note"])
        parts.append(f"```python\n{cell['text']}\n```")
        printed = "".join(text for line, text in outputs if line is not None and cell["first"] <= line <= cell["last"])
        if printed.strip():
            parts.append(f"```text\n{printed.rstrip()}\n```")
        written = [name for name in _figures_written(cell["text"], figures) if name not in shown]
        for name in written:
            shown.add(name)
            parts.append(_figure(name, captions.get(name, f"`{name}`")))
    unplaced = "".join(text for line, text in outputs if line is None)
    if unplaced.strip():
        parts.append("Printed by code that has changed since `make figures` last ran:")
        parts.append(f"```text\n{unplaced.rstrip()}\n```")
    rest = [name for name in _figures_written(source, figures) if name not in shown]
    if rest:
        parts.append("## Figures")
        parts += [_figure(name, captions.get(name, f"`{name}`")) for name in rest]
    if not outputs:
        parts.append("*Run `make figures` to show this tutorial's printed output here.*")
    parts.append(f"*The script: `tutorials/{script.name}` (`python tutorials/{script.name} --help`).*")
    return "\n\n".join(parts) + "\n"


def _tutorials_index(scripts: list[Path]) -> str:
    entries = "\n".join(f"tutorials/{script.stem}" for script in scripts)
    return ("# Tutorials\n\nEach tutorial is a script in `tutorials/` (jupytext percent format) that prints its "
            "numbers and writes its figures; `make figures` reruns them all. Read them in this order.\n\n"
            f"```{{toctree}}\n:maxdepth: 1\n\n{entries}\n```\n")


def tutorial_scripts(root: Path) -> list[Path]:
    """The tutorials in reading order."""
    scripts = sorted((root / "tutorials").glob("*.py"))
    rank = {name: i for i, name in enumerate(TUTORIAL_ORDER)}
    return sorted(scripts, key=lambda s: (rank.get(s.stem, len(rank)), s.stem))


def write_pages(docs: Path) -> None:
    """Write the generated pages (only files whose text changed) and remove those of modules or tutorials that no
    longer exist."""
    root = docs.parent
    generated = docs / "generated"
    modules = public_modules(root)
    pages: dict[Path, str] = {generated / "api.md": _api_index(modules)}
    for module in modules:
        pages[generated / "api" / f"{module}.rst"] = _api_page(module, _is_package(module, root))
    scripts = tutorial_scripts(root)
    pages[generated / "tutorials.md"] = _tutorials_index(scripts)
    for script in scripts:
        pages[generated / "tutorials" / f"{script.stem}.md"] = _tutorial_page(script, docs / "figures")
    for path, text in pages.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    for folder in {path.parent for path in pages}:
        for stale in set(folder.iterdir()) - set(pages) - {generated / "api", generated / "tutorials"}:
            stale.unlink()
