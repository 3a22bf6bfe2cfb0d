"""The CPU test server's start: a server whose port was taken between its choice and its bind
(SGLang then logs "address already in use" and waits instead of exiting) is stopped at once and
started again on a fresh port; a port the caller gave is never replaced.

Stand-in servers (small Python processes) play SGLang here: one logs the bind error and hangs, as
the real one did in CI; the other answers ``/health``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from topas.fidelity import cpu_server as cs

HANGS = ("import sys, time; print(\"ERROR:    [Errno 98] error while attempting to bind on address "
         "('127.0.0.1', %d): address already in use\", flush=True); time.sleep(120)")
ANSWERS = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", %d), H).serve_forever()
"""


@pytest.fixture
def stand_ins(tmp_path, monkeypatch):
    """``cpu_server`` with its venv marked built and ``launcher.start`` replaced: each start runs
    the next script of ``plan`` (``HANGS`` or ``ANSWERS``) on the port it was given."""
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / ".ready").touch()
    monkeypatch.setattr(cs, "VENV", tmp_path / "venv")
    plan: list[str] = []
    ports: list[int] = []

    def start(args, env, log_path=None, python=None):
        port = int(args[args.index("--port") + 1])
        ports.append(port)
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL
        return subprocess.Popen([sys.executable, "-c", plan.pop(0) % port], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)

    monkeypatch.setattr(cs.launcher, "start", start)
    return plan, ports


def test_a_server_whose_port_was_taken_is_started_again_on_a_fresh_port(stand_ins, tmp_path):
    plan, ports = stand_ins
    plan += [HANGS, ANSWERS]
    t0 = time.monotonic()
    with cs.cpu_server(log_path=tmp_path / "server.log", niceness=None, startup_s=60) as url:
        assert url == f"http://127.0.0.1:{ports[1]}"
    assert len(ports) == 2 and ports[0] != ports[1]
    assert time.monotonic() - t0 < 30  # not the startup timeout: the log said so at once


def test_a_port_the_caller_gave_is_not_replaced(stand_ins, tmp_path):
    plan, ports = stand_ins
    plan += [HANGS, ANSWERS]
    with pytest.raises(RuntimeError, match="address already in use"):
        with cs.cpu_server(port=cs.launcher.free_port(), log_path=tmp_path / "server.log", niceness=None,
                           startup_s=60):
            pass
    assert len(ports) == 1


def test_the_tries_are_bounded(stand_ins, tmp_path):
    plan, ports = stand_ins
    plan += [HANGS] * cs.PORT_TRIES
    with pytest.raises(RuntimeError, match=f"at each of {cs.PORT_TRIES} start"):
        with cs.cpu_server(log_path=tmp_path / "server.log", niceness=None, startup_s=60):
            pass
    assert len(ports) == cs.PORT_TRIES


def test_an_earlier_starts_error_in_the_same_log_does_not_count(stand_ins, tmp_path):
    plan, ports = stand_ins
    log = tmp_path / "server.log"
    log.write_text("ERROR: error while attempting to bind on address ('127.0.0.1', 1): address already in use\n")
    plan += [ANSWERS]
    with cs.cpu_server(log_path=log, niceness=None, startup_s=60) as url:
        assert url.endswith(f":{ports[0]}")
    assert len(ports) == 1


def test_a_server_that_exits_is_reported_with_its_status(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(RuntimeError, match="exited with 3"):
        cs.wait_until_up(proc, "http://127.0.0.1:9", 30, Path(tmp_path / "none.log"))


def test_a_server_that_exits_is_reported_with_the_last_lines_of_its_start(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("an earlier start's line\n")
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-c", "print('no model here'); raise SystemExit(2)"], stdout=out)
        proc.wait()
    with pytest.raises(RuntimeError, match="exited with 2") as e:
        cs.wait_until_up(proc, "http://127.0.0.1:9", 30, log, log_from=len("an earlier start's line\n"))
    assert "no model here" in str(e.value) and "earlier" not in str(e.value)
