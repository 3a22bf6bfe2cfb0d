"""Fidelity in CI: the simulator against the real CPU SGLang server on a small case.

One trace (Chain-3 scaled to the CPU server, 16 tasks) on a KV pool where nothing is evicted (so the
prefix hits do not hinge on eviction timing), one load, two policies (FCFS, TOPAS),
two measured runs each: the simulated mean JCT (the SGLang engine model, calibrated to the
server's speed measured around each run) must be within 30% of the measured one, and the cached
prompt tokens within 10%. The bars are loose on purpose (CPU timings on a shared machine move by
tens of percent); a change that breaks the engine model breaks them by far more. If the first
attempt misses a bar, the case is measured once more and the second attempt decides (noise, not
the model, is what a second draw changes: the prefix hits depend on timing too, through
evictions under memory pressure). The server is warmed up by one discarded replay first. The tight figures are a benchmark (scripts/fidelity_cpu.py), not this test.

Run by ``make test-sglang`` inside ``.venvs/sglang-cpu``; not collected by ``make test``.
"""

from __future__ import annotations

import pytest

pytest.importorskip("sglang")

from topas.fidelity import compare as fc  # noqa: E402
from topas.fidelity.cpu_server import cpu_server  # noqa: E402
from topas.fidelity.run import (fidelity_points, replay_measure, run_fidelity, server_kv_settings,  # noqa: E402
                                sim_engine, speed_probe)
from topas.fidelity.workloads import cpu_trace  # noqa: E402
from topas.paths import REPO_ROOT  # noqa: E402
from topas.workload.trace_io import write_trace  # noqa: E402

PROFILE = REPO_ROOT / "data" / "profiles" / "cpu_tiny-llama.json"
#: A KV pool large enough that nothing is evicted in this case. On a full pool SGLang's radix
#: cache evicts least-recently-used leaves (finished requests' KV, then prefixes), and which
#: prefixes survive hinges on the timing of each eviction, which CPU noise moves from run to run
#: (FCFS's prefix hits vary by 10-15% between repeats of the benchmark's 4,096-token points).
#: CI checks the time model and the prefix accounting; the benchmark checks memory pressure.
CI_POOL = 32768


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("fidelity")
    with cpu_server(log_path=d / "server.log", decision_log=d / "decisions.jsonl", max_total_tokens=CI_POOL,
                    profile=PROFILE) as url:  # the plugin prices TOPAS on the simulation's profile
        yield {"url": url, "dir": d, "log": d / "decisions.jsonl"}


def _attempt(server, out):
    trace = write_trace(cpu_trace("chain-3-ci", 16), server["dir"] / "chain-3-ci.json.gz")
    settings = server_kv_settings(server["url"])
    cost, _ = sim_engine(PROFILE, settings=settings)
    pts = fidelity_points([str(trace)], ["fcfs", "topas"], rates=[3.0], n_tasks=16)
    return run_fidelity(pts, replay_measure(server["url"], decision_log=server["log"]), PROFILE, out, repeats=2,
                        settings=settings, bars=fc.CI_BARS, probe=speed_probe(server["url"], cost), log=print)


def _barred_ok(comp) -> bool:
    ok = comp.table["ok"].dropna()
    return bool(ok.astype(bool).all())


def test_fidelity_small_case(server):
    comp = _attempt(server, server["dir"] / "first")
    print("\n".join(fc.verdict_lines(comp)))
    if not _barred_ok(comp):
        comp = _attempt(server, server["dir"] / "second")
        print("second attempt:\n" + "\n".join(fc.verdict_lines(comp)))
    t = comp.table
    jct = t[t["metric"] == "jct_mean"]
    assert jct["ok"].astype(bool).all(), f"mean JCT off by more than 30%:\n{jct.to_string()}"
    cached = t[t["metric"] == "cached_tokens"]
    assert cached["ok"].astype(bool).all(), f"cached tokens off by more than 10%:\n{cached.to_string()}"
