"""Peak memory of a training run: pyro_bbb against the hand-written Bayes-by-Backprop step, each in its own process.

The medium MLP of ``step_time.py`` (784-400-400-10, batch 128, N = 60,000): each contender runs ``--steps`` steps in
a fresh Python process and reports its peak resident set size (``ru_maxrss``); a process that only imports torch,
pyro and pyro_bbb and builds the data is the baseline, so the table also shows what training adds to it.

    python benchmarks/memory.py            # prints peak RSS per contender and the ratios
    python benchmarks/memory.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

CONTENDERS = ["baseline (imports and data)", "hand-written PyTorch BbB", "pyro_bbb reparam", "pyro_bbb flipout",
              "pyro_bbb local reparam"]
WIDTHS, BATCH, NUM_DATA = [784, 400, 400, 10], 128, 60_000


def measure(contender: str, steps: int) -> None:
    """In this process: build the contender, train ``steps`` steps, print the peak RSS in MiB as JSON."""
    sys.path.insert(0, str(Path(__file__).parent))
    import pyro
    import torch
    from step_time import CONTENDERS as STEPS
    from step_time import make_data

    torch.manual_seed(0)
    pyro.clear_param_store()
    data = make_data(WIDTHS, BATCH)
    if contender != CONTENDERS[0]:
        step = STEPS[contender](WIDTHS, BATCH, NUM_DATA)
        for i in range(steps):
            step(*data[i % len(data)])
    print(json.dumps({"contender": contender, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    steps = 3 if args.quick else args.steps
    if args.measure is not None:
        measure(args.measure, steps)
        return
    peaks = {}
    for contender in CONTENDERS:
        out = subprocess.run([sys.executable, __file__, "--measure", contender, "--steps", str(steps)],
                             check=True, capture_output=True, text=True).stdout
        peaks[contender] = json.loads(out.strip().splitlines()[-1])["peak_mib"]
    base, hand = peaks[CONTENDERS[0]], peaks["hand-written PyTorch BbB"]
    print(f"medium MLP {'-'.join(map(str, WIDTHS))}, batch {BATCH}, {steps} steps; peak RSS per process")
    print(f"  {'':28s} {'peak MiB':>9s} {'/ hand-written':>15s} {'above baseline':>15s}")
    for contender, peak in peaks.items():
        print(f"  {contender:28s} {peak:9.1f} {peak / hand:15.2f} {peak - base:13.1f} MiB")


if __name__ == "__main__":
    main()
