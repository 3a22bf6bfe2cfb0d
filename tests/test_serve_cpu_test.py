"""`topas serve --cpu-test` starts exactly the CPU stand-in server docs/gpu.md describes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from topas.sglang.launcher import CPU_STANDIN_CONTEXT, CPU_STANDIN_POOL

ROOT = Path(__file__).resolve().parents[1]


def test_cpu_test_dry_run_prints_the_stand_in():
    r = subprocess.run([sys.executable, "-m", "topas.cli", "serve", "--cpu-test", "--policy", "fcfs", "--dry-run",
                        "--", "--port", "30005", "--enable-metrics"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    out = r.stdout
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in out and "SGLANG_PLUGINS=topas" in out
    cmd = out.strip().splitlines()[-1].split()
    assert cmd[cmd.index("--context-length") + 1] == str(CPU_STANDIN_CONTEXT) == "16384"
    assert cmd[cmd.index("--max-total-tokens") + 1] == str(CPU_STANDIN_POOL)
    assert cmd[cmd.index("--port") + 1] == "30005" and cmd.count("--port") == 1
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and "--enable-metrics" in cmd
    assert cmd[cmd.index("--model-path") + 1].endswith("tiny-llama")
    assert "--sleep-on-idle" in cmd  # an idle stand-in must not keep a core busy


def test_docs_give_the_same_recipe():
    text = (ROOT / "docs" / "gpu.md").read_text()
    assert "topas serve --cpu-test" in text and "--context-length 16384" in text and "--sleep-on-idle" in text
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in text
