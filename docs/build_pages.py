"""Pages generated for the documentation: one API page per public module of pyro_bbb, one page per tutorial (its
markdown cells as text, its code as code, and the figures it writes, from ``docs/figures/``)."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

#: The package whose public modules get an API page.
PACKAGE = "pyro_bbb"


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
    for module in public_modules(root):
        pages[docs / "generated" / "api" / f"{module}.rst"] = _api_page(module, _is_package(module, root))
    for script in sorted((root / "tutorials").glob("*.py")):
        pages[docs / "generated" / "tutorials" / f"{script.stem}.md"] = _tutorial_page(script, docs / "figures")
    for path, text in pages.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    for folder in {path.parent for path in pages}:  # pages of modules or tutorials that no longer exist
        for stale in set(folder.iterdir()) - set(pages):
            stale.unlink()
