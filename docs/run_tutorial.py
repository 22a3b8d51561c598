"""Run one tutorial as ``make figures`` does and keep what it prints for the documentation.

The tutorial runs as ``__main__`` with the given arguments; everything it prints still reaches the terminal, and is
also written to ``<out-dir>/<tutorial>.output.json`` as ``[[line, code, text], ...]``: the line of the tutorial whose
code printed it (its number and its code), so ``build_pages.py`` can show each output right under the code that
produced it.

Usage: ``python docs/run_tutorial.py tutorials/quickstart.py --out-dir docs/figures [tutorial arguments...]``
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path


class LineRecorder:
    """A stdout that passes text on and remembers the line of ``script`` behind each write."""

    def __init__(self, script: Path, stream):
        self.script, self.stream = str(script), stream
        self.records: list[list] = []

    def write(self, text: str) -> int:
        self.stream.write(text)
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename != self.script:
            frame = frame.f_back
        line = frame.f_lineno if frame is not None else None
        if self.records and self.records[-1][0] == line:
            self.records[-1][1] += text
        else:
            self.records.append([line, text])
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False


def main(argv: list[str]) -> None:
    script = Path(argv[0]).resolve()
    out_dir = Path(argv[argv.index("--out-dir") + 1]) if "--out-dir" in argv else Path("tutorials/figures")
    recorder = LineRecorder(script, sys.stdout)
    sys.argv = [str(script), *argv[1:]]
    sys.stdout = recorder
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.stdout = recorder.stream
    out_dir.mkdir(parents=True, exist_ok=True)
    source = script.read_text().splitlines()
    # each record keeps the printing line's code too, so the output finds its place after later edits of the script
    records = [[line, source[line - 1].strip() if line else "", text] for line, text in recorder.records
               if text.strip()]
    lines = ",\n".join(json.dumps(record) for record in records)
    (out_dir / f"{script.stem}.output.json").write_text(f"[\n{lines}\n]\n")


if __name__ == "__main__":
    main(sys.argv[1:])
