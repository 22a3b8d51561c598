"""The Python code blocks of the README and the documentation pages, and running them as a reader would.

A page's blocks run in order in one fresh interpreter (a later block may use what an earlier one defined), in a
working folder of the caller's choice, so the files they write land there. ``make figures`` runs the README here to
refresh ``docs/figures/bnn_band.png``; ``tests/test_docs.py`` runs every page in a temporary folder.

Usage: ``python docs/code_blocks.py README.md --cwd docs/figures``
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

#: A fenced block: three backticks, ``python``, the code, three backticks (each fence on its own line).
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def python_blocks(page: Path) -> list[str]:
    """The code of every ```` ```python ```` block of ``page``, in order."""
    return _BLOCK.findall(page.read_text())


def run_page(page: Path, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``page``'s Python blocks, in order, in one interpreter with ``cwd`` as its working folder."""
    code = "\n\n".join(python_blocks(page))
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=timeout)


if __name__ == "__main__":
    page = Path(sys.argv[1]).resolve()
    cwd = Path(sys.argv[sys.argv.index("--cwd") + 1]) if "--cwd" in sys.argv else Path.cwd()
    code = "\n\n".join(python_blocks(page))  # run as a reader would: the progress bar and prints as they come
    sys.exit(subprocess.run([sys.executable, "-c", code], cwd=cwd, check=False).returncode)
