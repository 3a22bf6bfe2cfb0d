"""The simulator against its documented semantics (topas/engine/simulator.py, docs/design.md "Engine model").

Expected times are written from the semantics with the round cost model of ``conftest.py``:

* a request's prefill produces its first output token; its remaining ``y - 1`` tokens take one
  decode step each, and a step's context for a request is ``l_a + x + (tokens generated so far)``;
* a prefix never seen before is a prefill of ``l_a`` tokens in the same iteration as the first
  request's own chunk: chunks ``[(l_a, 0), (x, l_a)]`` in one ``prefill_time`` call;
* a resident prefix is shared: the request prefills only ``[(x, l_a)]``;
* prefix moves (swap in from host, first write to host) are serialised with the next iteration.

Decode runs are summed step by step here (``decode_time`` per step), independently of the
engine's closed form (``decode_steps_time``). Times are compared to the microsecond.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import ROUND_COST as C
from conftest import chain3_task, dag4_task, stage, task, trace
from topas.engine.config import LEGACY_ENGINE, EngineConfig
from topas.engine.metrics import WALL_CLOCK_KEYS, SimResult
from topas.engine.simulator import SimulationStuck, Simulator, simulate
from topas.engine.view_cache import ViewedDict
from topas.engine.view import Decision, EngineView, InfeasibleDecision
from topas.policies.base import Policy
from topas.policies.fcfs import FCFS
from topas.policies.lpm import LPM

US = 1e-6  # "to the microsecond"


def decode_run(l: int, x: int, y: int, cost=C) -> float:
    """The y - 1 decode steps of a request running alone: step k has generated k tokens so far."""
    return sum(cost.decode_time(1, l + x + g) for g in range(1, y))


def first_run(l: int, x: int, y: int) -> float:
    """A lone request whose prefix was never loaded: prefix prefill + own prefill, then decode."""
    return C.prefill_time([(l, 0), (x, l)]) + decode_run(l, x, y)


def hit_run(l: int, x: int, y: int) -> float:
    """A lone request whose prefix is resident: own prefill on top of the cached prefix, then decode."""
    return C.prefill_time([(x, l)]) + decode_run(l, x, y)


def by_rid(res: SimResult) -> dict[str, dict]:
    return {row["rid"]: row for row in res.requests.to_dict("records")}


def jcts(res: SimResult) -> dict[str, float]:
    return dict(zip(res.tasks["task_id"], res.tasks["jct"]))


class Scripted(Policy):
    """A test policy: its k-th decision is ``script(view, k)``; manages prefixes unless told not to."""

    name = "scripted"
    manages_prefixes = True

    def __init__(self, script, manages: bool = True) -> None:
        self.script = script
        self.manages_prefixes = manages
        super().__init__()

    def reset(self) -> None:
        self.k = 0
        self.preempted: list[tuple[str, int, bool]] = []

    def decide(self, view: EngineView) -> Decision:
        d = self.script(view, self.k)
        self.k += 1
        return d

    def on_preempt(self, request, time, by_engine):
        self.preempted.append((request.rid, request.generated, by_engine))


class SpyFCFS(FCFS):
    """FCFS that records ``on_preempt`` calls."""

    def reset(self) -> None:
        super().reset()
        self.preempted: list[tuple[str, int, bool]] = []

    def on_preempt(self, request, time, by_engine):
        super().on_preempt(request, time, by_engine)
        self.preempted.append((request.rid, request.generated, by_engine))


# ============================================================================ exact cases


def test_single_stage_alone_jct_is_first_prefix_load_plus_prefill_plus_decode():
    l, x, y = 1000, 300, 40
    res = simulate(trace({"A": l}, [task("t0", 0.0, stage("S", "A", x, y))]), FCFS(), C)
    # prefill: 0.01 + 1e-4*(1000+300) + 1e-7*(1000*0 + 1000*1000) + 1e-7*(300*1000 + 300*300) = 0.279
    # decode : 39 steps, step g (g = 1..39 generated): 0.02 + 1e-3*1 + 1e-6*(1300 + g)
    #          = 39*0.0223 + 1e-6*780 = 0.87048
    assert C.prefill_time([(l, 0), (x, l)]) == pytest.approx(0.279, abs=1e-12)
    assert res.tasks["jct"].iloc[0] == pytest.approx(0.279 + 0.87048, abs=US)
    assert res.tasks["jct"].iloc[0] == pytest.approx(first_run(l, x, y), abs=US)
    r = by_rid(res)["t0/S"]
    assert r["prefill_time"] == pytest.approx(0.279, abs=US)
    assert r["decode_time"] == pytest.approx(0.87048, abs=US)
    assert r["queue_time"] == 0.0 and r["prefix_hit"] is False
    assert res.summary["decode_steps"] == y - 1


def test_one_output_token_is_produced_by_the_prefill_alone():
    res = simulate(trace({"A": 500}, [task("t0", 2.0, stage("S", "A", 100, 1))]), FCFS(), C)
    prefill = C.prefill_time([(500, 0), (100, 500)])
    assert res.tasks["jct"].iloc[0] == pytest.approx(prefill, abs=US)
    assert res.tasks["finish"].iloc[0] == pytest.approx(2.0 + prefill, abs=US)
    assert res.summary["decode_steps"] == 0


def test_chain3_alone_jct_is_the_sum_over_its_stages():
    l = {"A": 1000, "B": 2000, "C": 500}
    x = {"A": 300, "B": 200, "C": 100}
    y = {"A": 40, "B": 1, "C": 25}
    res = simulate(trace(l, [chain3_task("t0", 1.5, x, y)]), FCFS(), C)
    # each stage starts when its parent finishes and first-loads its own agent's prefix
    expected = {s: first_run(l[s], x[s], y[s]) for s in "ABC"}
    assert jcts(res)["t0"] == pytest.approx(sum(expected.values()), abs=US)
    req = by_rid(res)
    t = 1.5
    for s in "ABC":  # each stage is ready (and admitted) exactly when its parent finishes
        r = req[f"t0/{s}"]
        assert r["ready"] == pytest.approx(t, abs=US)
        assert r["first_admit"] == pytest.approx(t, abs=US)  # idle engine: admitted at once
        t += expected[s]
        assert r["finish"] == pytest.approx(t, abs=US)


def test_dag4_alone_runs_b_and_c_as_one_batch():
    l = {"A": 1000, "B": 800, "C": 600, "D": 400}
    x = {"A": 300, "B": 200, "C": 100, "D": 50}
    y = {"A": 20, "B": 10, "C": 16, "D": 5}
    res = simulate(trace(l, [dag4_task("t0", 0.0, x, y)]), FCFS(), C)
    a = first_run(l["A"], x["A"], y["A"])
    # B and C become ready together; one prefill iteration first-loads both prefixes and
    # prefills both requests; then one decode batch of 2 until B has its 10 tokens ...
    bc_prefill = C.prefill_time([(l["B"], 0), (l["C"], 0), (x["B"], l["B"]), (x["C"], l["C"])])
    both = sum(C.decode_time(2, (l["B"] + x["B"] + g) + (l["C"] + x["C"] + g)) for g in range(1, 10))
    # ... then C alone for its last 6 tokens (generated 10..15)
    c_alone = sum(C.decode_time(1, l["C"] + x["C"] + g) for g in range(10, 16))
    d = first_run(l["D"], x["D"], y["D"])
    req = by_rid(res)
    assert req["t0/B"]["finish"] == pytest.approx(a + bc_prefill + both, abs=US)
    assert req["t0/C"]["finish"] == pytest.approx(a + bc_prefill + both + c_alone, abs=US)
    assert req["t0/D"]["first_admit"] == pytest.approx(req["t0/C"]["finish"], abs=US)
    assert jcts(res)["t0"] == pytest.approx(a + bc_prefill + both + c_alone + d, abs=US)


def test_a_resident_prefix_is_shared_and_only_the_suffix_is_prefilled():
    l = {"A": 1000, "B": 2000, "C": 500}
    x = {"A": 300, "B": 200, "C": 100}
    y = {"A": 40, "B": 3, "C": 25}
    tasks = [chain3_task("t0", 0.0, x, y), chain3_task("t1", 100.0, x, y)]  # t0 is long done at 100 s
    res = simulate(trace(l, tasks), FCFS(), C)
    assert jcts(res)["t0"] == pytest.approx(sum(first_run(l[s], x[s], y[s]) for s in "ABC"), abs=US)
    assert jcts(res)["t1"] == pytest.approx(sum(hit_run(l[s], x[s], y[s]) for s in "ABC"), abs=US)
    hits = res.requests.set_index("rid")["prefix_hit"]
    assert not hits[["t0/A", "t0/B", "t0/C"]].any() and hits[["t1/A", "t1/B", "t1/C"]].all()
    assert res.summary["prefix_loads_prefill"] == 3 and res.summary["prefix_evictions"] == 0


def test_chunked_prefill_splits_prefix_and_request_at_max_prefill_tokens():
    l, x, y = 100, 50, 4
    cfg = EngineConfig(max_prefill_tokens=64)
    res = simulate(trace({"A": l}, [task("t0", 0.0, stage("S", "A", x, y))]), FCFS(), C, cfg)
    # iteration 1: 64 prefix tokens; the request waits for its prefix to be complete
    # iteration 2: the last 36 prefix tokens (64 cached), then 28 of the request's (on 100 cached)
    # iteration 3: the request's last 22 tokens on 100 + 28 cached
    prefill = (C.prefill_time([(64, 0)]) + C.prefill_time([(36, 64), (28, 100)])
               + C.prefill_time([(22, 128)]))
    assert jcts(res)["t0"] == pytest.approx(prefill + decode_run(l, x, y), abs=US)
    assert len(res.timeline) == 3 + 1  # three prefill iterations, one decode run


def test_decode_runs_are_advanced_in_closed_form_between_events():
    l, x, y = 100, 50, 5000
    res = simulate(trace({"A": l}, [task("t0", 0.0, stage("S", "A", x, y))]), FCFS(), C)
    assert res.summary["decode_steps"] == y - 1
    assert len(res.timeline) == 2  # one prefill iteration, one decode run: cost grows with events
    assert jcts(res)["t0"] == pytest.approx(first_run(l, x, y), abs=US)


def test_an_arrival_is_admitted_at_the_first_decode_step_boundary_after_it():
    l, x0, y0, x1, y1 = 1000, 200, 400, 100, 10
    arrival = 1.0
    tasks = [task("t0", 0.0, stage("S", "A", x0, y0)), task("t1", arrival, stage("S", "A", x1, y1))]
    res = simulate(trace({"A": l}, tasks), FCFS(), C)
    # t0 decodes alone from its prefill's end; the decode run stops at the first step boundary
    # at or after t1's arrival, where t1 is admitted (prefill goes before decode).
    t, g = C.prefill_time([(l, 0), (x0, l)]), 1
    while t < arrival:
        t += C.decode_time(1, l + x0 + g)
        g += 1
    assert abs(t - arrival) > 1e-3  # not a near-tie: the test is about the boundary, not rounding
    req = by_rid(res)
    assert req["t1/S"]["ready"] == arrival
    assert req["t1/S"]["first_admit"] == pytest.approx(t, abs=US)
    assert req["t1/S"]["prefix_hit"] is True
    # t1's prefill [(x1, l)] runs at t, stalling t0's decode for one iteration
    assert req["t1/S"]["queue_time"] == pytest.approx(t - arrival, abs=US)
    assert req["t1/S"]["prefill_time"] == pytest.approx(C.prefill_time([(x1, l)]), abs=US)


# ============================================================================ determinism


def _deterministic(res: SimResult) -> SimResult:
    """The result without its wall-clock measurements (decisions.wall_s, WALL_CLOCK_KEYS)."""
    return SimResult(
        tasks=res.tasks, requests=res.requests, prefix_events=res.prefix_events, timeline=res.timeline,
        decisions=res.decisions.drop(columns=["wall_s"]),
        summary={k: v for k, v in res.summary.items() if k not in WALL_CLOCK_KEYS},
    )


def _busy_trace():
    """40 two-stage tasks over 6 agents, varied lengths, arriving faster than they are served on
    a budget that holds about three prefixes: queueing, LRU evictions among several candidates,
    swaps and a retraction."""
    agents = {"P": 300, "Q": 250, "R": 200, "S": 150, "T": 220, "U": 180}
    tasks = []
    for i in range(40):
        a, b = "PQRSTU"[(i * 5 + i // 3) % 6], "PQRSTU"[(i * 7 + 2) % 6]
        tasks.append(task(f"t{i:02d}", 0.4 * i, stage("A", a, 30 + i % 50, 10 + (i * 13) % 40),
                          stage("B", b, 40, 5 + (i * 7) % 30, "A")))
    return trace(agents, tasks)


# host tier (swaps) and ratio reservations (retractions), so that every mechanism is exercised
BUSY_CONFIG = EngineConfig(kv_budget=900, max_prefill_tokens=128, host_tier=True, full_output_reserve=False)


def _write_tables(res: SimResult, directory: Path) -> dict[str, bytes]:
    _deterministic(res).to_parquet(directory)
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*.parquet"))}


@pytest.mark.parametrize("policy", [FCFS, LPM])
def test_same_inputs_give_byte_identical_tables(tmp_path, policy):
    a = simulate(_busy_trace(), policy(), C, BUSY_CONFIG)
    b = simulate(_busy_trace(), policy(), C, BUSY_CONFIG)
    # the workload is busy enough to exercise every mechanism the tables record
    assert a.summary["retractions"] > 0 and a.summary["prefix_loads_swap"] > 0
    assert a.summary["prefix_evictions"] > 0 and a.summary["queue_time_mean"] > 0.5
    ta, tb = _write_tables(a, tmp_path / "a"), _write_tables(b, tmp_path / "b")
    assert sorted(ta) == ["decisions.parquet", "prefix_events.parquet", "requests.parquet",
                          "summary.parquet", "tasks.parquet", "timeline.parquet"]
    for name in ta:
        assert ta[name] == tb[name], f"{name} differs between identical runs"


_SUBPROCESS_RUN = """
import sys
sys.path.insert(0, {tests!r})
from pathlib import Path
import test_simulator as T
from topas.engine.simulator import simulate
from topas.policies.lpm import LPM
res = simulate(T._busy_trace(), LPM(), T.C, T.BUSY_CONFIG)
T._deterministic(res).to_parquet(Path({out!r}))
"""


def test_results_do_not_depend_on_the_hash_seed(tmp_path):
    """Bit-identical across processes with different string hashing (no hash-ordered iteration)."""
    tests = str(Path(__file__).resolve().parent)
    out = {}
    for seed in ("1", "2"):
        d = tmp_path / f"hash{seed}"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, "-c", _SUBPROCESS_RUN.format(tests=tests, out=str(d))],
                       env=env, check=True, timeout=120)
        out[seed] = {p.name: p.read_bytes() for p in sorted(d.glob("*.parquet"))}
    assert len(out["1"]) == 6 and out["1"] == out["2"]


# ============================================================================ decision validation


def _two_stage():
    # t0: A -> B on one agent; t1 arrives later, while t0/A decodes
    return trace({"P": 300, "Q": 300},
                 [task("t0", 0.0, stage("A", "P", 100, 100), stage("B", "P", 100, 10, "A")),
                  task("t1", 0.5, stage("A", "P", 100, 10))])


def test_admitting_a_request_that_is_not_waiting_is_rejected():
    pol = Scripted(lambda v, k: Decision(load=("P",), admit=("t0/B",)))  # t0/B's parent has not run
    with pytest.raises(InfeasibleDecision, match=r"t0/B.*not waiting"):
        simulate(_two_stage(), pol, C)


def test_admitting_a_request_twice_is_rejected():
    pol = Scripted(lambda v, k: Decision(load=("P",), admit=("t0/A", "t0/A")))
    with pytest.raises(InfeasibleDecision, match=r"t0/A twice"):
        simulate(_two_stage(), pol, C)


def test_a_running_request_cannot_be_admitted_again():
    def script(v, k):
        return Decision(load=("P",), admit=("t0/A",)) if k == 0 else Decision(admit=("t0/A", "t1/A"))
    with pytest.raises(InfeasibleDecision, match=r"t0/A.*not waiting"):
        simulate(_two_stage(), Scripted(script), C)


def test_evicting_a_prefix_used_by_a_running_request_is_rejected():
    def script(v, k):
        return Decision(load=("P",), admit=("t0/A",)) if k == 0 else Decision(evict=("P",))
    with pytest.raises(InfeasibleDecision, match=r"evicts prefix 'P', used by 1 running request"):
        simulate(_two_stage(), Scripted(script), C)


def test_loading_a_prefix_that_does_not_fit_is_rejected():
    pol = Scripted(lambda v, k: Decision(load=("P", "Q")))
    with pytest.raises(InfeasibleDecision, match=r"loads prefix 'Q' \(300 tokens\) but only 200 of 500"):
        simulate(_two_stage(), pol, C, EngineConfig(kv_budget=500))


def test_a_managing_policy_must_load_the_prefix_before_admitting():
    pol = Scripted(lambda v, k: Decision(admit=("t0/A",)))
    with pytest.raises(InfeasibleDecision, match=r"admits t0/A but its prefix 'P' is not resident"):
        simulate(_two_stage(), pol, C)


def test_preempting_a_request_that_is_not_running_is_rejected():
    pol = Scripted(lambda v, k: Decision(load=("P",), preempt=("t0/A",)))
    with pytest.raises(InfeasibleDecision, match=r"preempts t0/A, which is not running"):
        simulate(_two_stage(), pol, C)


def test_an_unknown_prefix_is_rejected():
    pol = Scripted(lambda v, k: Decision(load=("nobody",)))
    with pytest.raises(InfeasibleDecision, match=r"unknown agent prefix 'nobody'"):
        simulate(_two_stage(), pol, C)


@pytest.mark.parametrize("field", ["evict", "load", "preempt"])
def test_a_policy_that_does_not_manage_prefixes_may_only_admit(field):
    item = "t0/A" if field == "preempt" else "P"
    pol = Scripted(lambda v, k: Decision(admit=("t0/A",), **{field: (item,)}), manages=False)
    with pytest.raises(InfeasibleDecision, match=rf"does not manage prefixes.*{field}.*'{item}'"):
        simulate(_two_stage(), pol, C)


def test_an_idle_engine_whose_policy_admits_nothing_is_stuck():
    pol = Scripted(lambda v, k: Decision(), manages=False)
    # t0/A waits from 0 s; the engine jumps to t1's arrival (0.5 s), still admits nothing: stuck
    stuck = r"'scripted' admitted none of the 2 waiting requests \(e\.g\. t0/A\)"
    with pytest.raises(SimulationStuck, match=stuck):
        simulate(_two_stage(), pol, C)


# ============================================================================ prefix memory


def _sequential(agents: str, spacing: float = 10.0, x: int = 50, y: int = 10):
    """One single-stage task per letter of ``agents``, each arriving after the previous finished."""
    return [task(f"t{i}", spacing * i, stage("S", a, x, y)) for i, a in enumerate(agents)]


def test_without_the_radix_cache_unreferenced_prefixes_are_evicted_lru_as_a_request_needs_room():
    # Two 300-token prefixes + a request fit in 800 tokens, three prefixes do not.
    res = simulate(trace({"P": 300, "Q": 300, "R": 300}, _sequential("PQPRPQ")), FCFS(), C,
                   EngineConfig(kv_budget=800, **LEGACY_ENGINE))
    events = list(zip(res.prefix_events["agent"], res.prefix_events["event"]))
    assert events == [
        ("P", "load_prefill"), ("Q", "load_prefill"),  # t0, t1; t2 hits P
        ("Q", "evict_swap"), ("R", "load_prefill"),    # t3: Q was used less recently than P
        ("R", "evict_swap"), ("Q", "load_swap"),       # t5 (t4 hits P): R is now the LRU one
    ]
    # a prefix swapped in from the host is not recomputed: its tokens count as cached (t5)
    assert list(res.requests.sort_values("rid")["prefix_hit"]) == [False, False, True, False, True, True]


def test_host_tier_first_eviction_writes_to_host_later_ones_are_free_and_reloads_are_swaps():
    l, x, y = 600, 100, 50  # one 600-token prefix + a request fit in 1000 tokens, two prefixes do not
    res = simulate(trace({"P": l, "Q": l}, _sequential("PQPQ", x=x, y=y)), FCFS(), C,
                   EngineConfig(kv_budget=1000, **LEGACY_ENGINE))
    events = list(zip(res.prefix_events["agent"], res.prefix_events["event"], res.prefix_events["bytes"]))
    mu = C.kv_bytes_per_token
    assert events == [
        ("P", "load_prefill", 0.0),
        ("P", "evict_swap", l * mu), ("Q", "load_prefill", 0.0),
        ("Q", "evict_swap", l * mu), ("P", "load_swap", l * mu),
        ("P", "evict_free", 0.0), ("Q", "load_swap", l * mu),
    ]
    swap = C.swap_time(l)  # 0.001 + 600/1000 = 0.601 s
    assert swap == pytest.approx(0.601, abs=1e-12)
    j = jcts(res)
    assert j["t0"] == pytest.approx(first_run(l, x, y), abs=US)
    assert j["t1"] == pytest.approx(swap + first_run(l, x, y), abs=US)  # write P out, prefill Q
    assert j["t2"] == pytest.approx(2 * swap + hit_run(l, x, y), abs=US)  # write Q out, swap P in
    assert j["t3"] == pytest.approx(swap + hit_run(l, x, y), abs=US)  # P's host copy exists; swap Q in
    assert res.summary["prefix_loads_swap"] == 2 and res.summary["bytes_swapped"] == 4 * l * mu


def test_without_a_host_tier_evictions_are_free_and_reloads_are_prefills():
    l, x, y = 600, 100, 50
    res = simulate(trace({"P": l, "Q": l}, _sequential("PQP", x=x, y=y)), FCFS(), C,
                   EngineConfig(kv_budget=1000, **{**LEGACY_ENGINE, "host_tier": False}))
    assert list(res.prefix_events["event"]) == ["load_prefill", "evict_free", "load_prefill",
                                                "evict_free", "load_prefill"]
    assert jcts(res)["t2"] == pytest.approx(first_run(l, x, y), abs=US)


# ============================================================================ admission and retraction

# A constant new_token_ratio (no decay) keeps the admission arithmetic simple.
# The new_token_ratio also for admissions (not add_one_req's whole output) and KV freed at finish.
def _ratio(r: float, **kw) -> EngineConfig:
    return EngineConfig(init_new_token_ratio=r, min_new_token_ratio_factor=1.0, full_output_reserve=False,
                        radix_cache=False, admission_gate=False, **kw)


def test_admission_stops_at_the_first_request_that_does_not_fit():
    # t0 decodes for a while; t1, t2, t3 arrive together at 1 s (FCFS order t1, t2, t3).
    # Budget 1000 = prefix 100 + t0's KV (100 + g) + t0's reservation 0.5*(300 - g) + ...:
    # t1 (50 + 5 reserved) fits, t2 (600 + 50 reserved) does not, so t3 (which would fit) waits.
    later = [(50, 10), (600, 100), (50, 10)]  # (x, y) of t1, t2, t3
    tasks = [task("t0", 0.0, stage("S", "A", 100, 300))] + [
        task(f"t{i}", 1.0, stage("S", "A", xi, yi)) for i, (xi, yi) in enumerate(later, 1)
    ]
    res = simulate(trace({"A": 100}, tasks), FCFS(), C, _ratio(0.5, kv_budget=1000))
    first = res.decisions[res.decisions["time"] >= 1.0].iloc[0]
    assert (first["n_waiting"], first["n_proposed"], first["n_admitted"]) == (3, 3, 1)
    req = by_rid(res)
    assert req["t1/S"]["first_admit"] == first["time"]
    assert req["t3/S"]["first_admit"] > first["time"]
    assert req["t3/S"]["first_admit"] >= req["t2/S"]["first_admit"]  # t3 never overtakes t2


def test_decode_out_of_memory_retracts_and_the_generated_tokens_are_recomputed():
    # Each request fits alone (100 + 100 + 400 <= 700) and both are admitted (tiny reservations),
    # but together they outgrow the budget while decoding.
    l, x, y = 100, 100, 400
    tasks = [task("t0", 0.0, stage("S", "A", x, y)), task("t1", 1.0, stage("S", "A", x, y))]
    pol = SpyFCFS()
    res = simulate(trace({"A": l}, tasks), pol, C, _ratio(0.01, kv_budget=700))
    req = by_rid(res)
    # t1 has generated fewer tokens, so it is the one retracted (SGLang keeps the most advanced)
    assert len(pol.preempted) == 1
    rid, generated, by_engine = pol.preempted[0]
    assert (rid, by_engine) == ("t1/S", True) and generated > 1
    assert (req["t1/S"]["retractions"], req["t0/S"]["retractions"]) == (1, 0)
    assert req["t1/S"]["recomputed_tokens"] == generated and res.summary["recomputed_tokens"] == generated
    assert req["t1/S"]["preemptions"] == 0 and res.summary["retractions"] == 1
    # the budget was full when the retraction happened ...
    used = res.timeline["prefix_tokens"] + res.timeline["request_tokens"]
    assert used.max() == 700 and (used <= 700).all()
    # ... and t1's prefill time is its first prefill plus the re-prefill of x + generated tokens
    # (alone: t0 has finished by then, t1 readmitted after it)
    assert req["t1/S"]["first_admit"] < req["t0/S"]["finish"]
    assert req["t1/S"]["prefill_time"] == pytest.approx(
        C.prefill_time([(x, l)]) + C.prefill_time([(x + generated, l)]), abs=US)
    assert req["t1/S"]["finish"] == pytest.approx(
        req["t0/S"]["finish"] + C.prefill_time([(x + generated, l)]) + sum(
            C.decode_time(1, l + x + g) for g in range(generated + 1, y)), abs=US)


def test_finishing_a_prefill_never_overshoots_the_budget():
    # Regression: admission used to check only x + generated, while the prefill's output token
    # also takes a KV slot. Here each request needs 1 (input) + 1 (first output) tokens; with
    # the prefix, budget 4 fits one request at a time (1 + 1 + 2 = 4), not two (1 + 2 + 2 = 5 > 4).
    tasks = [task("t0", 0.0, stage("S", "A", 1, 2)), task("t1", 0.0, stage("S", "A", 1, 2))]
    res = simulate(trace({"A": 1}, tasks), FCFS(), C, _ratio(0.05, kv_budget=4))
    used = res.timeline["prefix_tokens"] + res.timeline["request_tokens"]
    assert (used <= 4).all()
    req = by_rid(res)
    assert req["t0/S"]["first_admit"] == 0.0 and req["t1/S"]["first_admit"] == req["t0/S"]["finish"]


def test_a_prefix_evicted_before_its_first_prefill_finished_is_dropped_not_swapped():
    # Regression: a managing policy may evict a prefix between the chunks of its first-ever
    # prefill (after preempting its only user). Its KV is incomplete, so there is nothing to write
    # to the host tier: the eviction is free and the next load prefills the whole prefix again
    # (it used to be written out and swapped back in as if complete, skipping the missing chunks).
    def script(v, k):
        if k == 0:
            return Decision(load=("P",), admit=("t0/S",))
        if k == 1:  # t1 arrives after P's first 64-token chunk
            assert v.prefixes["P"].resident and [r.rid for r in v.running] == ["t0/S"]
            return Decision(preempt=("t0/S",), evict=("P",), load=("Q",), admit=("t1/S",))
        return Decision(load=tuple(a for a in "PQ" if not v.prefixes[a].resident
                                   and any(r.agent == a for r in v.waiting)),
                        admit=tuple(r.rid for r in v.waiting))
    tasks = [task("t0", 0.0, stage("S", "P", 50, 5)), task("t1", 0.01, stage("S", "Q", 50, 5))]
    res = simulate(trace({"P": 300, "Q": 100}, tasks), Scripted(script), C,
                   EngineConfig(max_prefill_tokens=64))
    events = list(zip(res.prefix_events["agent"], res.prefix_events["event"]))
    assert events == [("P", "load_prefill"), ("P", "evict_free"),
                      ("Q", "load_prefill"), ("P", "load_prefill")]
    assert res.summary["bytes_swapped"] == 0.0


def test_a_viewed_dict_views_again_only_what_was_set_or_touched_and_forgets_what_it_viewed():
    calls: list[str] = []

    def view_of(v: str) -> str:
        calls.append(v)
        return v.upper()

    d = ViewedDict()
    d["a"], d["b"] = "x", "y"
    assert d.viewed(view_of) == {"a": "X", "b": "Y"} and calls == ["x", "y"]
    d.touch("b")
    d.touch("gone")  # a key it does not hold is not viewed
    d["c"] = "z"
    assert d.viewed(view_of) == {"a": "X", "b": "Y", "c": "Z"} and calls == ["x", "y", "y", "z"]
    d.touch_all()  # a cluster engine: every view again, in the dict's order
    assert d.viewed(view_of) == {"a": "X", "b": "Y", "c": "Z"} and calls[4:] == ["x", "y", "z"]
    assert d.fresh == []  # nothing waits to be viewed once viewed, whatever was touched
    del d["a"]
    d.pop("b")
    assert d.viewed(view_of) == {"c": "Z"} and len(calls) == 7
    with pytest.raises(TypeError):
        d.update({"d": "w"})
