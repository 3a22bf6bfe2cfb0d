"""The resume hint runs as printed: the command the user ran (make's, or the script's with this Python)."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
from pathlib import Path

from pipeline.reproduce import INVOKED_AS_ENV, resume_command

ROOT = Path(__file__).resolve().parents[1]


def test_the_script_line_runs_as_printed(monkeypatch):
    monkeypatch.delenv(INVOKED_AS_ENV, raising=False)
    cmd = resume_command(["--engine", "sglang", "--servers", "http://a:1,http://b:2", "ARGS=x y"])
    parts = shlex.split(cmd)
    assert parts[1:] == ["scripts/reproduce.py", "--engine", "sglang", "--servers", "http://a:1,http://b:2",
                         "ARGS=x y"]
    assert os.access(parts[0], os.X_OK)  # a Python that exists, not a bare script path


def test_the_script_is_executable():
    assert os.stat(ROOT / "scripts" / "reproduce.py").st_mode & stat.S_IXUSR


def test_make_reproduce_passes_the_command_as_typed(monkeypatch):
    out = subprocess.run(["make", "-n", "reproduce", "ENGINE=sglang", "GRID=gpu-afternoon", "SERVERS=http://a:1",
                          "YES=1", "ARGS=--tasks 2", "STAMP="], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    line = [ln for ln in out.splitlines() if "reproduce.py" in ln][0]
    assert (f"{INVOKED_AS_ENV}=\"make reproduce ENGINE=sglang GRID=gpu-afternoon SERVERS=http://a:1 YES=1 "
            f"ARGS='--tasks 2'\"") in line
    monkeypatch.setenv(INVOKED_AS_ENV, "make reproduce ENGINE=sglang")
    assert resume_command(["--engine", "sglang"]) == "make reproduce ENGINE=sglang"
