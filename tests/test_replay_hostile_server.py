"""``topas replay`` against misbehaving servers (issue 44): a server that drips one byte at a
time, one that never answers, and ones whose ``/server_info`` is malformed all fail within
``--timeout`` with one line (exit 3), never a traceback or a hang."""

from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import contextmanager

import pytest
from click.testing import CliRunner

from topas.cli import main

pytest.importorskip("aiohttp")


@contextmanager
def raw_server(handle):
    """A TCP server on 127.0.0.1 calling ``handle(conn)`` for each connection, in a thread."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    stop = threading.Event()

    def serve():
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            threading.Thread(target=handle, args=(conn, stop), daemon=True).start()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        t.join()
        sock.close()


def drip(conn, stop):
    """Answer one byte every second, forever."""
    try:
        for b in b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100000:
            if stop.wait(1.0):
                break
            conn.sendall(bytes([b]))
    except OSError:
        pass
    finally:
        conn.close()


def silent(conn, stop):
    """Accept, read, never answer."""
    stop.wait(60)
    conn.close()


def json_answer(body_of):
    def handle(conn, stop):
        try:
            req = conn.recv(65536).decode("latin-1")
            path = req.split(" ")[1] if " " in req else "/"
            status, body = body_of(path)
            payload = json.dumps(body).encode()
            conn.sendall(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: "
                         f"{len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
        except OSError:
            pass
        finally:
            conn.close()
    return handle


def replay(url, tmp_path, timeout=3):
    try:
        runner = CliRunner(mix_stderr=False)
    except TypeError:
        runner = CliRunner()
    t = time.monotonic()
    r = runner.invoke(main, ["replay", "--trace", "chain-3", "--tasks", "2", "--policy", "fcfs", "--server", url,
                             "--out", str(tmp_path / "out"), "--timeout", str(timeout)])
    return r, time.monotonic() - t


def assert_one_line(r):
    assert r.exit_code != 0 and isinstance(r.exception, SystemExit), (r.exit_code, repr(r.exception), r.output)
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.timeout(30)
@pytest.mark.parametrize("handle", [drip, silent], ids=["one-byte-per-second", "never-answers"])
def test_a_slow_or_silent_server_fails_within_the_timeout(tmp_path, handle):
    with raw_server(handle) as url:
        r, wall = replay(url, tmp_path, timeout=3)
    err = assert_one_line(r)
    assert wall < 3 + 2.5, (wall, err)
    assert url in err
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("info,needle", [
    ([1, 2, 3], "JSON list"),
    ({"internal_states": [{"topas": {"policies": ["fcfs"]}}]}, "kv_pool_tokens"),
    ({"internal_states": [{"topas": {"policies": ["fcfs"], "kv_pool_tokens": "lots"}}]}, "malformed"),
    ({"internal_states": [{"topas": {"policies": ["fcfs"], "kv_pool_tokens": 1000}}], "tp_size": "two"},
     "malformed"),
], ids=["json-list", "no-kv-pool", "kv-pool-not-int", "tp-not-int"])
def test_a_malformed_server_info_is_one_line_naming_the_server(tmp_path, info, needle):
    def body_of(path):
        return (200, info) if "server_info" in path else (404, {"error": "not found"})

    with raw_server(json_answer(body_of)) as url:
        r, _ = replay(url, tmp_path)
    err = assert_one_line(r)
    assert r.exit_code == 3 and url in err and needle in err, err
