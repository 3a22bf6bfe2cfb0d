"""`make reproduce ENGINE=sglang` as a GPU-box user runs it, with CPU servers standing in for GPUs.

Two identical servers with the plugin (A, B), one with a smaller KV pool and one without the
plugin (SGLANG_PLUGINS=none), started together; traces with the grid's names but tiny token counts (``topas.sglang.testing.tiny_data_dir``)
so that the ``gpu-afternoon`` grid replays in about a minute. Checked: a server without the plugin
is refused before anything runs; the afternoon grid at one task per run completes on A and B
together (both used), and a run stopped by Ctrl-C keeps what finished and re-runs none of it;
a sweep on two servers finishes faster than on one (the ratio is printed, not asserted) with the
same results in kind; a result measured on one server is not reused for a server with another KV
pool. CPU times mean nothing and are not asserted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("sglang")

from studies import grid  # noqa: E402
from topas.sglang import launcher  # noqa: E402
from topas.sglang import server as srv  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODEL = Path(os.environ.get("TOPAS_TINY_MODEL", ROOT / ".venvs/sglang-cpu/tiny-llama"))
POOL = 6144


def _start(d: Path, name: str, pool: int, plugins: str | None = None):
    env = launcher.server_env("fcfs", {})
    env["OMP_NUM_THREADS"] = "1"
    if plugins is not None:
        env["SGLANG_PLUGINS"] = plugins
    port = launcher.free_port()
    # --sleep-on-idle: an idle SGLang scheduler otherwise polls without pause, and four of them on
    # two cores starved each other: GET /server_info (which waits on the scheduler) took 10-30 s
    args = [*launcher.cpu_test_args(MODEL, port, pool), "--sleep-on-idle"]
    proc = launcher.start(args, env, d / f"{name}.log")
    return {"name": name, "url": f"http://127.0.0.1:{port}", "proc": proc, "log": d / f"{name}.log"}


def _wait(servers, timeout_s=300.0):
    """Every server answers /health within ``timeout_s`` seconds in all (``wait_until_up``: its log
    read for a port taken, its last lines in the error)."""
    from topas.fidelity.cpu_server import wait_until_up

    t0 = time.time()
    for s in servers:
        try:
            wait_until_up(s["proc"], s["url"], timeout_s - (time.time() - t0), s["log"])
        except RuntimeError as e:
            raise RuntimeError(f"server {s['name']}: {e}") from None


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu_box")
    t0 = time.perf_counter()
    started = [_start(d, "a", POOL), _start(d, "b", POOL), _start(d, "other", POOL - 1024),
               _start(d, "none", 2048, plugins="none")]
    try:
        _wait(started)
        print(f"\n4 SGLang CPU servers up in {time.perf_counter() - t0:.1f} s")
        yield {s["name"]: s for s in started} | {"dir": d}
    finally:
        for s in started:
            launcher.stop(s["proc"])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from topas.sglang.testing import tiny_data_dir

    return tiny_data_dir(tmp_path_factory.mktemp("tiny_data"), n_tasks=4)


def _env(tiny: Path, store: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TOPAS_SGLANG_URL", "TOPAS_SGLANG_IDENTITY")}
    return {**env, "PYTHONPATH": str(ROOT), "TOPAS_DATA": str(tiny), "TOPAS_STORE": str(store), **extra}


def _default_sigint() -> None:
    # A shell starts background jobs with SIGINT ignored, the child inherits that, and Python then
    # never raises KeyboardInterrupt: a test run in the background (CI under nohup ... &) would send
    # its Ctrl-C to a run that cannot hear it. The child gets the default disposition back.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _reproduce(args, env, **kw) -> subprocess.Popen:
    kw.setdefault("stdout", subprocess.PIPE)
    return subprocess.Popen([sys.executable, str(ROOT / "scripts/reproduce.py"), "--engine", "sglang",
                             "--no-progress", *args], env=env, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_default_sigint, **kw)


def _stored(store: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in store.glob("*/*/meta.json")}


def _runs_on(url: str) -> set[str]:
    return {r for b in srv.plugin_blocks(srv.server_info(url)) for r in b.get("runs", {})}


def test_a_server_without_the_plugin_is_refused(servers, tiny, tmp_path):
    p = _reproduce(["--server", servers["none"]["url"], "--grid", "gpu-afternoon", "--tasks", "1", "--yes",
                    "--out-dir", str(tmp_path / "fig")], _env(tiny, tmp_path / "store"))
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 3, out
    assert "does not run the topas plugin" in out and "SGLANG_PLUGINS=topas" in out
    assert "Traceback" not in out and not (tmp_path / "store").exists()


def test_the_afternoon_grid_completes_on_two_servers_and_resumes_after_ctrl_c(servers, tiny, tmp_path):
    store, fig = tmp_path / "store", tmp_path / "fig"
    urls = f"{servers['a']['url']},{servers['b']['url']}"
    args = ["--servers", urls, "--grid", "gpu-afternoon", "--tasks", "1", "--yes", "--out-dir", str(fig)]
    env = _env(tiny, store)
    # its output goes to a file: nothing reads a pipe while we wait for the first replays
    log = tmp_path / "first_run.txt"
    with open(log, "w") as f:
        p = _reproduce(args, env, stdout=f)
        t0 = time.time()
        while len(_stored(store)) < 3 and time.time() - t0 < 240 and p.poll() is None:
            time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        p.wait(timeout=120)
    out = log.read_text()
    kept = _stored(store)
    print(f"\ninterrupted after {len(kept)} replays:\n{out[-600:]}")
    assert p.returncode == 130 and "interrupted:" in out and "Traceback" not in out
    assert 3 <= len(kept) < len(grid.gpu_afternoon(tasks=1, engine="sim"))

    p = _reproduce(args, env)
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 0, out
    assert "(%d already stored, skipped)" % len(kept) in out
    n_left = len(grid.gpu_afternoon(tasks=1, engine="sim")) - len(kept)
    took = [ln for ln in out.splitlines() if ln.startswith(f"the pool of {n_left} replays took ")]
    assert len(took) == 1 and "on 2 server(s); planned " in took[0] and "x the plan)" in took[0], out
    print(took[0])
    final = _stored(store)
    assert len(final) == len(grid.gpu_afternoon(tasks=1, engine="sim"))
    for k, meta in kept.items():  # nothing finished was run again
        assert final[k]["created"] == meta["created"] and final[k]["summary"]["run_id"] == meta["summary"]["run_id"]
    for meta in final.values():
        assert meta["engine"] == "sglang" and meta["summary"]["plugin_decisions"] > 0
        assert meta["canonical"]["server"]["kv_pool_tokens"] == POOL
    runs = {m["summary"]["run_id"] for m in final.values()}
    on_a, on_b = runs & _runs_on(servers["a"]["url"]), runs & _runs_on(servers["b"]["url"])
    assert on_a and on_b and on_a | on_b == runs  # both servers replayed
    md = (fig / "results_gpu_afternoon.md").read_text()
    assert "measured on SGLang (tiny-llama" in md and "on the simulator" not in md
    assert {"chain-3", "dag-4", "dag-10-wide", "metagpt-tl"} <= {ln.split("|")[1].strip() for ln in md.splitlines()
                                                                if ln.startswith("| ") and "---" not in ln}


def _sweep(urls: list[str], store: Path, tiny: Path, seeds: int = 3) -> tuple[float, list[dict]]:
    code = ("import json, sys, time\n"
            "from topas.experiments import Experiment, run_many\n"
            "exps = [Experiment('dag-4', p, load=1.0, seed=s, n_tasks=3, engine='sglang')\n"
            f"        for p in ('fcfs', 'topas') for s in range({seeds})]\n"
            "t = time.perf_counter(); rows = run_many(exps, progress=False)\n"
            "print(json.dumps({'wall': time.perf_counter() - t, 'rows': rows}, default=str))\n")
    out = subprocess.run([sys.executable, "-c", code], env=_env(tiny, store, TOPAS_SGLANG_URL=",".join(urls)),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    d = json.loads(out.stdout.strip().splitlines()[-1])
    return d["wall"], d["rows"]


def test_two_servers_finish_a_sweep_faster_than_one_with_the_same_results_in_kind(servers, tiny, tmp_path):
    a, b = servers["a"]["url"], servers["b"]["url"]
    before = _runs_on(b)
    one, rows1 = _sweep([a], tmp_path / "one", tiny)
    two, rows2 = _sweep([a, b], tmp_path / "two", tiny)
    print(f"\n6 replays: one server {one:.1f} s, two servers {two:.1f} s, ratio {one / two:.2f}x")
    assert [r["key"] for r in rows1] == [r["key"] for r in rows2]  # the same experiments, the same keys
    assert [list(r) for r in rows1] == [list(r) for r in rows2]
    for r1, r2 in zip(rows1, rows2):
        assert r1["n_tasks"] == r2["n_tasks"] == 3 and r1["n_requests"] == r2["n_requests"]
    used_b = {r["run_id"] for r in rows2} & (_runs_on(b) - before)
    assert used_b and len(used_b) < len(rows2)  # both servers replayed


def test_a_result_from_one_server_is_not_reused_for_another(servers, tiny, tmp_path):
    store = tmp_path / "store"
    _, on_a = _sweep([servers["a"]["url"]], store, tiny, seeds=1)
    _, on_other = _sweep([servers["other"]["url"]], store, tiny, seeds=1)
    assert not {r["key"] for r in on_a} & {r["key"] for r in on_other}
    assert not {r["run_id"] for r in on_a} & {r["run_id"] for r in on_other}  # replayed again, not reused
    pools = {m["canonical"]["server"]["kv_pool_tokens"] for m in _stored(store).values()}
    assert pools == {POOL, POOL - 1024}
