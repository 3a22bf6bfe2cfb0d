"""The SGLang server handshake, identity, plan and multi-server sweep, against a fake
``/server_info`` (no SGLang needed; tests_sglang/ runs the same against the real CPU server)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import LocalHTTPServer, QuietHandler
from topas.experiments import Experiment
from topas.experiments.plan import (REPLAY_OVERHEAD_S, Stage, arrival_span, format_hours, plan_lines,
                                   wall_on_servers)
from topas.sglang import server as srv

ROOT = Path(__file__).resolve().parents[1]


def plugin_info(**over) -> dict:
    block = {"plugin": "topas", "protocol": 1, "topas_version": "0.1.0", "policy": "fcfs", "params": {},
             "policies": ["fcfs", "lpm", "topas"], "kv_pool_tokens": 20000, "page_size": 1,
             "device": "NVIDIA H100 80GB HBM3", "model_config_sha256": "abc", "runs": {}}
    block.update(over.pop("block", {}))
    info = {"model_path": "Qwen/Qwen2.5-32B-Instruct", "version": "0.5.23", "schedule_policy": "fcfs",
            "tp_size": 1, "page_size": 1, "internal_states": [{"topas": block}]}
    info.update(over)
    return info


class FakeServer(LocalHTTPServer):
    """An HTTP server answering GET /server_info with ``self.info`` (404 on anything else)."""

    def __init__(self, info: dict | None) -> None:
        self.info = info
        owner = self

        class Handler(QuietHandler):
            def do_GET(self):  # noqa: N802
                if self.path == "/server_info":
                    body = json.dumps(owner.info).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self.send_response(404)
                    self.end_headers()

        super().__init__(Handler)


@pytest.fixture
def fake():
    servers: list[FakeServer] = []

    def make(info=None) -> FakeServer:
        s = FakeServer(plugin_info() if info is None else info)
        servers.append(s)
        return s

    srv._CACHE.clear()
    yield make
    srv._CACHE.clear()
    for s in servers:
        s.close()


@pytest.fixture
def sglang_env(monkeypatch):
    monkeypatch.delenv("TOPAS_SGLANG_URL", raising=False)
    monkeypatch.delenv("TOPAS_SGLANG_IDENTITY", raising=False)

    def set_urls(*urls):
        monkeypatch.setenv("TOPAS_SGLANG_URL", ",".join(urls))

    return set_urls


# ----------------------------------------------------------------------------- URLs and the handshake


def test_a_url_without_a_scheme_fails_at_once_naming_it():
    t = time.perf_counter()
    with pytest.raises(srv.ServerError, match=r"'127.0.0.1:30000' must start with http://"):
        srv.check_url("127.0.0.1:30000")
    assert time.perf_counter() - t < 1
    assert srv.parse_servers("http://a:1/, http://b:2") == ["http://a:1", "http://b:2"]
    with pytest.raises(srv.ServerError, match="given twice"):
        srv.parse_servers("http://a:1,http://a:1/")


def test_an_unreachable_server_is_one_line_quickly():
    from topas.sglang.launcher import free_port

    t = time.perf_counter()
    with pytest.raises(srv.ServerError) as e:
        srv.server_info(f"http://127.0.0.1:{free_port()}")
    assert time.perf_counter() - t < 5
    assert "cannot reach the SGLang server" in str(e.value) and "\n" not in str(e.value)


def test_a_server_without_the_plugin_is_refused_naming_the_fix(fake):
    info = plugin_info()
    info["internal_states"] = [{"some": "state"}]  # SGLang's own answer: no topas block
    s = fake(info)
    with pytest.raises(srv.ServerError, match="does not run the topas plugin") as e:
        srv.identity(s.url)
    assert "SGLANG_PLUGINS=topas" in str(e.value) and "topas serve" in str(e.value)


def test_identity_and_policy_check(fake):
    s = fake()
    ident = srv.identity(s.url)
    assert ident.kv_pool_tokens == 20000 and ident.device == "NVIDIA H100 80GB HBM3"
    assert ident.model == "Qwen/Qwen2.5-32B-Instruct" and ident.sglang_version == "0.5.23"
    assert ident.plugin_version == "0.1.0/protocol-1" and ident.schedule_policy == "fcfs"
    assert "Qwen2.5-32B-Instruct" in ident.short and "20,000-token KV pool" in ident.short
    srv.check_policy(s.url, "topas")
    with pytest.raises(srv.ServerError, match="cannot run policy 'spf'"):
        srv.check_policy(s.url, "spf")


def test_servers_of_one_sweep_must_be_identical(fake):
    a, b = fake(), fake(plugin_info(block={"kv_pool_tokens": 10000}))
    with pytest.raises(srv.ServerError, match="differ in kv_pool_tokens"):
        srv.common_identity([a.url, b.url])
    c = fake()
    assert srv.common_identity([a.url, c.url]) == srv.identity(a.url)


# ----------------------------------------------------------------------------- keys


def test_sglang_keys_name_the_server_and_never_match_another(fake, sglang_env):
    a, same, other_pool, other_gpu = (fake(), fake(), fake(plugin_info(block={"kv_pool_tokens": 10000})),
                                      fake(plugin_info(block={"device": "NVIDIA A100-SXM4-80GB"})))

    def key(url):
        sglang_env(url)
        e = Experiment("chain-3", "fcfs", load=1.0, n_tasks=2, engine="sglang")
        return e.key(), e.canonical()

    ka, ca = key(a.url)
    assert ca["server"]["kv_pool_tokens"] == 20000 and ca["server"]["model_config_sha256"] == "abc"
    assert key(same.url)[0] == ka  # an identical server: the result is reusable
    assert key(other_pool.url)[0] != ka
    assert key(other_gpu.url)[0] != ka
    sim = Experiment("chain-3", "fcfs", load=1.0, n_tasks=2).key()
    assert sim != ka


def test_a_policy_the_server_cannot_run_fails_before_anything_runs(fake, sglang_env):
    sglang_env(fake().url)
    with pytest.raises(srv.ServerError, match="cannot run policy 'spf'"):
        Experiment("chain-3", "spf", load=1.0, n_tasks=2, engine="sglang").key()


def test_stored_replays_are_found_without_a_server(fake, sglang_env, tmp_path, monkeypatch):
    from topas.experiments.store import ResultStore
    from topas.experiments.spec import run_experiment

    sglang_env(fake().url)
    e = Experiment("chain-3", "fcfs", load=1.0, n_tasks=2, engine="sglang")
    store = ResultStore(tmp_path / "store")
    store.put(e, run_experiment(Experiment("chain-3", "fcfs", load=1.0, n_tasks=2)))  # any result will do
    ident = srv.stored_identity(store)
    assert ident == e.canonical()["server"]
    monkeypatch.delenv("TOPAS_SGLANG_URL")
    monkeypatch.setenv("TOPAS_SGLANG_IDENTITY", json.dumps(ident))
    assert store.has(Experiment("chain-3", "fcfs", load=1.0, n_tasks=2, engine="sglang"))


# ----------------------------------------------------------------------------- after a replay


def test_a_run_without_plugin_decisions_is_an_error(fake):
    from topas.sglang.replay import ReplayError, check_decisions

    s = fake(plugin_info(block={"runs": {"r1": {"policy": "topas", "decisions": 0, "fallbacks": 0},
                                         "r2": {"policy": "topas", "decisions": 7, "fallbacks": 1}}}))
    with pytest.raises(ReplayError, match="made no decision for run r1"):
        check_decisions(s.url, "r1", "topas")
    with pytest.raises(ReplayError, match="made no decision for run r9"):
        check_decisions(s.url, "r9", "topas")
    assert check_decisions(s.url, "r2", "topas") == {"policy": "topas", "decisions": 7, "fallbacks": 1}


def test_a_pool_too_small_for_input_and_output_is_refused_with_a_hint(fake):
    from topas.sglang.replay import ReplayError, check_server
    from topas.workload.synthetic import scaled_down

    s = fake(plugin_info(block={"kv_pool_tokens": 50}))
    with pytest.raises(ReplayError, match=r"KV pool of .* \(50 tokens\) cannot hold request .*--max-total-tokens"):
        check_server(s.url, scaled_down("chain-3", 2), "fcfs")


def test_replay_result_directories_get_the_usual_mode(tmp_path):
    from tests.test_sglang_replay import _fake_replay
    from topas.sglang.replay import write_result_atomic
    from topas.workload.synthetic import scaled_down

    old = os.umask(0o022)
    try:
        out = write_result_atomic(_fake_replay(scaled_down("dag-4", 2)), tmp_path / "run")
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {0o644}


# ----------------------------------------------------------------------------- plan and servers


def test_arrival_span_and_the_plan():
    e = Experiment("dag-4", "fcfs", load=1.2, seed=0, n_tasks=20)
    from topas.experiments.spec import prepare

    arrivals = [t.arrival for t in prepare(e).trace.tasks]
    assert arrival_span(e) == pytest.approx(max(arrivals) - min(arrivals)) and arrival_span(e) > 0
    assert wall_on_servers([5, 4, 3, 3, 1], 1) == 16
    assert wall_on_servers([5, 4, 3, 3, 1], 2) == 8  # 5+3 | 4+3+1
    assert wall_on_servers([], 3) == 0
    lines, wall = plan_lines([Stage("table", [e], stored=2)], 1)
    assert "table: 1 replays (2 already stored, skipped)" in lines[0]
    assert wall == pytest.approx(max(arrivals) + REPLAY_OVERHEAD_S)  # no estimates: arrivals + overhead
    assert format_hours(3 * 3600 + 20 * 60) == "3 h 20 min" and format_hours(90) == "2 min"


def test_the_afternoon_grid_is_about_three_hours_on_one_server():
    from studies import grid

    exps = grid.gpu_afternoon(engine="sim")
    assert {e.workload for e in exps} == {"chain-3", "dag-4", "dag-10-wide", "metagpt-tl"}
    assert {"topas", "lpm", "parrot-fcfs", "spf"} <= {e.policy for e in exps}
    hours = sum(arrival_span(e) for e in exps) / 3600
    # 0.76 h of arrivals per policy: 3.05 h for the four policies the grid was sized for, 3.8 h
    # with topas-plus (issue 13) registered as the fifth
    assert 2.5 <= hours <= 4.0, hours
    assert {e.n_tasks for e in grid.gpu_afternoon(tasks=2, engine="sim")} == {2}


class _Item:
    """A stand-in experiment for the server pool: it only needs a label."""

    def __init__(self, i):
        self.i = i

    def label(self):
        return f"e{self.i}"


def test_replays_run_one_per_server_at_a_time(monkeypatch):
    from topas.sglang.pool import current_server, map_on_servers

    busy: dict[str, int] = {}
    peak: dict[str, int] = {}
    lock = threading.Lock()

    def fn(e):
        s = current_server()
        with lock:
            busy[s] = busy.get(s, 0) + 1
            peak[s] = max(peak.get(s, 0), busy[s])
        time.sleep(0.05)
        with lock:
            busy[s] -= 1
        return (e.i, s)

    out = map_on_servers(fn, [_Item(i) for i in range(8)], servers=["http://a:1", "http://b:2"], progress=False)
    assert [i for i, _ in out] == list(range(8))  # input order
    assert {s for _, s in out} == {"http://a:1", "http://b:2"} and set(peak.values()) == {1}


def test_a_failing_replay_stops_the_sweep_naming_it():
    from topas.experiments.local import ExperimentFailed
    from topas.sglang.pool import map_on_servers

    def fn(e):
        if e.i == 1:
            raise RuntimeError("boom")
        return e.i

    with pytest.raises(ExperimentFailed, match="e1 failed: boom"):
        map_on_servers(fn, [_Item(i) for i in range(4)], servers=["http://a:1"], progress=False)


# ----------------------------------------------------------------------------- scripts/reproduce.py


def _reproduce(*args, env=None, timeout=120):
    e = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    e.pop("TOPAS_SGLANG_URL", None)
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "reproduce.py"), *args], capture_output=True,
                          text=True, env=e, timeout=timeout)


def test_reproduce_refuses_bad_or_unreachable_servers_in_one_line(fake, tmp_path):
    from topas.sglang.launcher import free_port

    r = _reproduce("--engine", "sglang", "--server", "127.0.0.1:30000", "--out-dir", str(tmp_path))
    assert r.returncode == 3 and r.stderr.strip().count("\n") == 0 and "http://" in r.stderr
    r = _reproduce("--engine", "sglang", "--server", f"http://127.0.0.1:{free_port()}", "--out-dir", str(tmp_path))
    assert r.returncode == 3 and "cannot reach the SGLang server" in r.stderr
    assert r.stderr.strip().count("\n") == 0
    info = plugin_info()
    info["internal_states"] = [{}]
    r = _reproduce("--engine", "sglang", "--server", fake(info).url, "--out-dir", str(tmp_path))
    assert r.returncode == 3 and "does not run the topas plugin" in r.stderr


def test_reproduce_prints_the_plan_and_asks_for_yes(fake, tmp_path):
    info = plugin_info(block={"policies": ["topas", "topas-plus", "lpm", "parrot-fcfs", "spf"]})
    url = fake(info).url
    env = {"TOPAS_STORE": str(tmp_path / "store")}
    r = _reproduce("--engine", "sglang", "--servers", url, "--grid", "gpu-afternoon", "--out-dir",
                   str(tmp_path), env=env)
    assert r.returncode == 2, r.stderr
    assert "gpu-afternoon grid: 20 replays" in r.stdout and "of arrivals" in r.stdout
    assert "--yes" in r.stderr and "YES=1" in r.stderr
    r = _reproduce("--engine", "sglang", "--servers", url, "--grid", "gpu-afternoon", "--plan", "--tasks", "3",
                   "--out-dir", str(tmp_path), env=env)
    assert r.returncode == 0, r.stderr
    assert "gpu-afternoon grid: 20 replays" in r.stdout and not list(tmp_path.glob("*.csv"))


def test_make_passes_args_and_the_new_variables_through():
    out = subprocess.run(["make", "-n", "reproduce", "ENGINE=sglang", "GRID=gpu-afternoon", "SERVERS=http://a:1,http://b:2",
                          "YES=1", "ARGS=--tasks 2 --plan", "STAMP="], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    line = [ln for ln in out.splitlines() if "reproduce.py" in ln][0]
    for part in ("--engine sglang", "--grid gpu-afternoon", "--servers http://a:1,http://b:2", "--yes",
                 "--tasks 2 --plan"):
        assert part in line


def test_a_free_port_for_a_server_is_one_no_socket_bound_to_port_0_can_take(monkeypatch):
    """The server binds its port minutes after it is chosen: below the ephemeral range and below
    the range SGLang picks its own torch.distributed port from, no other socket is handed it in
    between; where the range cannot be read, the kernel picks one."""
    import socket

    from topas.sglang import launcher

    low = launcher._ephemeral_low()
    for _ in range(20):
        port = launcher.free_port()
        if low is not None:
            assert launcher.PORT_FLOOR <= port < min(low, launcher.PORT_CEILING)  # nor SGLang's own range
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free
    monkeypatch.setattr(launcher, "_ephemeral_low", lambda: None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        assert launcher.free_port() != s.getsockname()[1]  # a bound port is never offered
