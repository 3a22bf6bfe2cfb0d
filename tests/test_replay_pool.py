"""The GPU box's pool of replays and its plan (no server needed): one pool across workloads, no
server idle while replays wait, the plan computed by the very schedule the pool follows."""

from __future__ import annotations

import threading
import time

import pytest

from topas.experiments import Experiment
from topas.experiments.plan import ReplayEstimate, Stage, estimate_replays, plan_lines, twin
from topas.sglang.pool import hand_out_order, map_on_servers, schedule

SERVERS = [f"http://127.0.0.1:{30000 + k}" for k in range(8)]


def _never_idle_while_waiting(sched) -> None:
    """Every replay starts when the first server becomes free (no server waits while it waits)."""
    free = {k: 0.0 for k in range(sched.servers)}
    for s in sorted(sched.slots, key=lambda s: (s.start, s.server)):
        assert s.start == pytest.approx(min(free.values())), s
        free[s.server] = s.end


def test_the_schedule_on_8_servers_leaves_none_idle_while_replays_wait():
    durations = [100.0, 90.0, 80.0, 10.0, 10.0, 5.0, 300.0, 7.0, 60.0, 60.0, 45.0, 1.0, 2.0, 200.0]
    sched = schedule(durations, 8)
    _never_idle_while_waiting(sched)
    assert sched.used == 8 and sorted(s.index for s in sched.slots) == list(range(len(durations)))
    assert sched.wall == 300.0  # the longest replay alone bounds it; everything else packs around it
    # handed out longest first: the first 8 to start are the 8 longest
    assert {s.index for s in sched.slots[:8]} == set(hand_out_order(durations)[:8])


def test_workload_by_workload_would_idle_servers_one_pool_does_not():
    # 4 workloads x 5 replays on 8 servers: one run_many per workload leaves 3 servers unused and
    # waits for each workload's longest replay; one pool does neither
    per_workload = [[400.0, 380.0, 360.0, 200.0, 100.0], [300.0] * 5, [900.0, 100, 100, 100, 100], [50.0] * 5]
    one_by_one = sum(schedule(w, 8).wall for w in per_workload)
    pooled = schedule([d for w in per_workload for d in w], 8)
    assert max(schedule(w, 8).used for w in per_workload) == 5
    assert pooled.used == 8 and pooled.wall < one_by_one
    _never_idle_while_waiting(pooled)


class _Item:
    def __init__(self, i: int, d: float) -> None:
        self.i, self.d = i, d

    def label(self) -> str:
        return f"e{self.i}"


def test_the_pool_follows_the_planned_schedule():
    """map_on_servers hands replays out in the plan's order, one per server at a time, each as soon
    as its server is free: with durations scaled down, the replays start where the plan says."""
    durations = [0.30, 0.05, 0.20, 0.05, 0.10, 0.25, 0.05, 0.15, 0.05, 0.10]
    t0 = time.perf_counter()
    started: dict[int, tuple[str, float]] = {}
    lock = threading.Lock()
    running: dict[str, int] = {}

    def fn(e):
        from topas.sglang.pool import current_server

        with lock:
            started[e.i] = (current_server(), time.perf_counter() - t0)
            running[current_server()] = running.get(current_server(), 0) + 1
            assert running[current_server()] == 1  # one replay per server at a time
        time.sleep(e.d)
        with lock:
            running[current_server()] -= 1
        return e.i

    items = [_Item(i, d) for i, d in enumerate(durations)]
    out = map_on_servers(fn, items, servers=SERVERS[:3], progress=False, order=lambda e: e.d)
    assert out == list(range(len(items)))
    plan = schedule(durations, 3)
    for s in plan.slots:
        assert started[s.index][1] == pytest.approx(s.start, abs=0.04), s


def test_the_plan_counts_drain_and_overhead_and_uses_all_servers():
    exps = [Experiment(w, p, load=1.4, seed=0, n_tasks=3, engine="sglang")
            for w in ("chain-3", "dag-4") for p in ("fcfs", "lpm", "topas", "spf")]
    ests = [ReplayEstimate(e.label(), 10.0 * (k + 1), 5.0, 3.0) for k, e in enumerate(exps)]
    lines, wall = plan_lines([Stage("table", exps, 0, ests)], 8)
    assert wall == pytest.approx(max(x.wall for x in ests)) == 88.0  # one replay per server
    assert "on 8 servers" in lines[-2] and "of 8 servers get a replay" not in lines[-2]
    assert "drain" in lines[-1] and "3 s of overhead" in lines[-1]
    lines, wall = plan_lines([Stage("table", exps, 0, ests)], 1)
    assert wall == pytest.approx(sum(x.wall for x in ests))


def test_the_drain_is_the_simulated_twins(tmp_path):
    from topas.experiments import run_many
    from topas.experiments.store import ResultStore

    e = Experiment("dag-4", "fcfs", load=1.4, seed=0, n_tasks=5, engine="sglang")
    t = twin(e)
    assert t.engine == "sim" and t.profile == e.profile
    cpu = twin(e, device="cpu (x86_64)", kv_pool=8192)  # as the plugin names a CPU
    assert cpu.profile.endswith("cpu_tiny-llama.json") and cpu.kv_budget == 8192
    store = ResultStore(tmp_path / "store")
    (est,) = estimate_replays([e], store=store, jobs=1)
    row = run_many([t], jobs=1, progress=False, store=store)[0]
    from topas.experiments.spec import prepare

    arr = [x.arrival for x in prepare(e).trace.tasks]
    assert est.arrivals == pytest.approx(max(arr))
    assert est.drain == pytest.approx(min(arr) + row["makespan"] - max(arr)) and est.drain > 0
