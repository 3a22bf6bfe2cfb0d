"""benchmarks/cell_cost.py runs each of its cells and prints one line per cell."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "cell_cost.py"


def test_every_cell_runs_and_prints_its_line():
    out = subprocess.run([sys.executable, str(SCRIPT), "--scale", "0.02"], capture_output=True, text=True,
                         check=True, timeout=300).stdout.splitlines()
    rows = [line.split() for line in out[1:]]
    cells = {(r[0], r[1], r[4]) for r in rows}
    assert ("lpm", "dag-10-wide", "belady") in cells and ("spf", "metagpt-tl", "lru") in cells
    assert len(rows) == 12 and all(float(r[5]) >= 0 and float(r[6]) >= 0 for r in rows)
