"""`topas replay` refuses as `scripts/reproduce.py` does: exit 3 within seconds, one line, the hint."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _replay(*args, env=None, timeout=60):
    e = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "topas.cli", "replay", "--trace", "dag-4", "--tasks", "2",
                        "--policy", "fcfs", *args], capture_output=True, text=True, env=e, timeout=timeout)
    return r, time.perf_counter() - t


def test_unreachable_port_exits_3_within_5_s_with_the_hint(tmp_path):
    from topas.sglang.launcher import free_port

    r, wall = _replay("--server", f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path / "out"))
    assert r.returncode == 3, r.stderr
    assert wall < 5.0
    assert "cannot reach the SGLang server" in r.stderr and "topas serve" in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_url_without_a_scheme_exits_3(tmp_path):
    r, wall = _replay("--server", "127.0.0.1:30000", "--out", str(tmp_path / "out"))
    assert r.returncode == 3 and "http://" in r.stderr and wall < 5.0


def test_a_server_without_the_plugin_or_the_policy_exits_3(tmp_path):
    from tests.test_sglang_server import FakeServer, plugin_info

    info = plugin_info()
    info["internal_states"] = [{}]
    fake = FakeServer(info)
    try:
        r, _ = _replay("--server", fake.url, "--out", str(tmp_path / "out"))
        assert r.returncode == 3 and "does not run the topas plugin" in r.stderr
        fake.info = plugin_info(block={"policies": ["lpm"]})
        r, _ = _replay("--server", fake.url, "--out", str(tmp_path / "out"))
        assert r.returncode == 3 and "cannot run policy 'fcfs'" in r.stderr
    finally:
        fake.httpd.shutdown()


def test_missing_aiohttp_is_named_with_its_install_command(tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "aiohttp.py").write_text("raise ImportError('No module named aiohttp')\n")
    r, _ = _replay("--server", "http://127.0.0.1:1", "--out", str(tmp_path / "out"),
                   env={"PYTHONPATH": f"{shim}{os.pathsep}{ROOT}"})
    assert r.returncode == 3, r.stderr
    assert "aiohttp" in r.stderr and "pip install -e '.[sglang]'" in r.stderr and "Traceback" not in r.stderr


def test_run_replay_names_the_install_command(monkeypatch):
    import builtins

    from topas.sglang.client import ReplayError, require_client

    real = builtins.__import__

    def no_aiohttp(name, *a, **kw):
        if name == "aiohttp":
            raise ImportError(name)
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_aiohttp)
    with pytest.raises(ReplayError, match=r"pip install -e '\.\[sglang\]'"):
        require_client()
