"""Pyro's own tests of ``TraceMeanField_ELBO`` with ``pyro_bbb.ELBO`` substituted, against the same tests as Pyro ships
them: the outcome of every test, side by side. Not part of the suite (Pyro's wheel has no tests, and its test files
are not copied here): point it at a checkout of Pyro's source, whose ``tests/`` it runs against the *installed* pyro.

    python tests/pyro_reference/run_pyros_tests.py /path/to/pyro-source

Runs ``tests/infer/test_valid_models.py``, ``test_gradient.py`` (``TraceMeanField_ELBO`` replaced) and
``test_elbo_mapdata.py`` (its ``TraceGraph_ELBO`` replaced: the file has no mean-field ELBO of its own), then prints
the counts and every test whose outcome differs (ids compared with the class name normalised).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

FILES = ["tests/infer/test_valid_models.py", "tests/infer/test_gradient.py"]
MAPDATA = "tests/infer/test_elbo_mapdata.py"
PLUGIN = '''
import os
import pyro.infer
import pyro.infer.trace_mean_field_elbo
import pyro_bbb
pyro.infer.TraceMeanField_ELBO = pyro_bbb.ELBO
pyro.infer.trace_mean_field_elbo.TraceMeanField_ELBO = pyro_bbb.ELBO
if os.environ.get("SUBSTITUTE_TRACEGRAPH"):
    pyro.infer.TraceGraph_ELBO = pyro_bbb.ELBO
'''


def _outcomes(path: Path) -> dict[str, str]:
    out = {}
    for case in ET.parse(path).iter("testcase"):
        key = re.sub(r"\bTraceMeanField_ELBO\b", "ELBO", f"{case.get('classname')}::{case.get('name')}")
        status = "passed"
        for child in case:
            status = {"failure": "failed", "error": "failed", "skipped": "skipped or xfailed"}.get(child.tag, status)
        out[key] = status
    return out


def _run(workdir: Path, files: list[str], report: str, plugin: bool, env: dict | None = None) -> dict[str, str]:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *(["-p", "substitute_elbo"] * plugin),
               *files, f"--junitxml={report}"]
    run = subprocess.run(command, cwd=workdir, env={**os.environ, **(env or {})}, check=False, capture_output=True,
                         text=True)
    if not (workdir / report).exists():
        raise RuntimeError(f"pytest wrote no report:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    return _outcomes(workdir / report)


def main(source: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shutil.copytree(Path(source) / "tests", work / "tests")  # without pyro/: the installed pyro is tested
        shutil.copy(Path(source) / "setup.cfg", work / "setup.cfg")
        (work / "substitute_elbo.py").write_text(PLUGIN)
        pyros = _run(work, [*FILES, MAPDATA], "pyro.xml", plugin=False)
        ours = _run(work, FILES, "ours.xml", plugin=True)
        ours.update(_run(work, [MAPDATA], "ours_map.xml", plugin=True, env={"SUBSTITUTE_TRACEGRAPH": "1"}))
    differ = sorted(k for k in set(pyros) | set(ours) if pyros.get(k) != ours.get(k))
    print(f"Pyro's classes: {dict(Counter(pyros.values()))}")
    print(f"pyro_bbb.ELBO:  {dict(Counter(ours.values()))}")
    print(f"tests whose outcome differs: {len(differ)}")
    for key in differ:
        print(f"  {key}: {pyros.get(key)} -> {ours.get(key)}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
