"""Every benchmark script runs in its --quick mode (CI runs these; the tables come from full runs)."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
UCI = BENCHMARKS.parents[1] / "shared" / "uci"


@pytest.mark.slow
@pytest.mark.parametrize(
    "script",
    ["step_time.py", "predict.py", "fit_overhead.py", "gradient_variance.py", "init_scale.py", "classification.py",
     "uci.py", "reber_convergence.py", "memory.py"],
)  # fmt: skip
def test_benchmark_quick_mode(script):
    if script == "uci.py" and not UCI.exists():
        pytest.skip("the UCI data (../shared/uci) is not available here")
    result = subprocess.run([sys.executable, str(BENCHMARKS / script), "--quick"], capture_output=True, text=True,
                            timeout=600, cwd=BENCHMARKS)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip()
