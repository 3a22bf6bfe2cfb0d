"""Properties of the simulator on random small DAG workloads (hypothesis), under FCFS and LPM.

Workloads: 1-4 agents, 1-4 tasks of 1-5 stages each (random DAGs), random prefix, input and
output lengths, random arrivals, a random KV budget from "the largest request just fits alone"
(the trace validation's limit: prefix + input + output <= budget) upwards, and chunked prefill
as small as 16 tokens, SGLang's decaying output reservation or a small constant one, and every
engine behaviour switch (host tier, radix cache, prefix sharing in a prefill batch, admission
gate, whole-output reservation, ignore_eos, a request path) on or off. Every run goes through ``CheckedSimulator``, which checks the engine's
invariants after every iteration:

* memory: resident prefixes + running requests' KV + cached evictable KV never exceed the budget
  after an iteration's allocation, and the counters
  match the entities (prefix tokens = sum of resident l_a, request tokens = sum of running KV,
  refcount = running requests of that agent);
* no request runs (prefills a chunk or decodes) without its agent's prefix resident and fully
  computed;
* time never goes backwards, within an iteration or across;
* every stage is admitted only once all its parents have finished, and finishes exactly once.

From the result tables: the KV timeline stays within the budget, all event logs are in time
order, every task finishes, and each task's JCT is at least its critical path at zero load.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROUND_COST as C
from conftest import stage, task, trace
from topas.engine.config import EngineConfig
from topas.engine.entities import DECODE, DONE, PREFILL
from topas.engine.reservation import output_reserve
from topas.engine.simulator import Simulator
from topas.policies.fcfs import FCFS
from topas.policies.lpm import LPM
from topas.workload.critical_path import longest_remaining_path

MAX_ITERATIONS = 200_000  # far above any of these workloads; a livelock fails instead of hanging


class CheckedSimulator(Simulator):
    """The simulator with its invariants asserted around every iteration."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.iterations = 0
        self.starts: dict[str, int] = {}
        self.finishes: dict[str, int] = {}
        # the running batch's clock and lifecycle, checked (the batch is a part: wrapped here)
        advance, start = self.batch.advance, self.batch.start

        def checked_advance(dt: float) -> None:
            assert dt >= 0.0 and math.isfinite(dt), f"time step {dt} at t={self.now}"
            before = self.now
            advance(dt)
            assert self.now >= before

        def checked_start(r, p, copy) -> None:
            assert p.resident, f"{r.rid} admitted while its prefix {r.agent!r} is not resident"
            for q in r.stage.parents:
                parent = r.task.requests[q]
                assert parent.state == DONE and parent.finish_time <= self.now, \
                    f"{r.rid} admitted at {self.now} before its parent {q} finished"
            self.starts[r.rid] = self.starts.get(r.rid, 0) + 1
            start(r, p, copy)

        self.batch.advance, self.batch.start = checked_advance, checked_start

    # -- lifecycle
    def stage_finished(self, r, view) -> None:
        assert r.generated == r.y, f"{r.rid} finishes with {r.generated} of {r.y} tokens"
        self.finishes[r.rid] = self.finishes.get(r.rid, 0) + 1
        super().stage_finished(r, view)

    # -- iterations
    def _prefill_iteration(self) -> None:
        self._tick()
        self._check_prefixes_held()
        left = {r.rid: r.prefill_left for r in self.batch.prefill_queue}
        super()._prefill_iteration()
        # a request's chunk runs only on top of its complete prefix (a first-ever prefix load may
        # complete in the same iteration, ahead of the request's chunk); the engine skips the others
        for rid, before in left.items():
            r = self.requests[rid]
            if (r.state != PREFILL or r.prefill_left != before) and not r.own_prefix:
                assert self.memory.prefixes[r.agent].prefill_left == 0, \
                    f"{rid} prefilled while its prefix {r.agent!r} was still being computed"
        self._check_memory()

    def _decode_until_event(self) -> None:
        self._tick()
        self._check_prefixes_held()
        for r in self.batch.decoding.values():
            p = self.memory.prefixes[r.agent]
            assert p.prefill_left == 0, f"{r.rid} decodes on a partially computed prefix {r.agent!r}"
        super()._decode_until_event()
        self._check_memory()

    def _tick(self) -> None:
        self.iterations += 1
        assert self.iterations < MAX_ITERATIONS, "the simulation does not make progress"

    def _check_prefixes_held(self) -> None:
        for r in self.batch.running():
            assert self.memory.prefixes[r.agent].resident, f"{r.rid} runs without its prefix {r.agent!r} resident"

    def _check_memory(self) -> None:
        m = self.memory
        resident = sum(p.tokens for p in m.prefixes.values() if p.resident)
        running = list(self.batch.running())
        assert m.prefix_tokens == resident
        assert m.request_tokens == sum(r.kv for r in running)
        for a, p in m.prefixes.items():
            assert p.refcount == sum(1 for r in running if r.agent == a), f"refcount of {a!r}"
        for r in running:
            assert r.state in (PREFILL, DECODE)
        assert m.evictable_tokens >= 0
        assert m.prefix_tokens + m.request_tokens + m.evictable_tokens <= m.budget, (
            f"KV over budget at t={self.now}: {m.prefix_tokens} prefix + {m.request_tokens} "
            f"request + {m.evictable_tokens} cached tokens > {m.budget}")


# ------------------------------------------------------------------------------- workloads


@st.composite
def workloads(draw):
    n_agents = draw(st.integers(1, 4))
    agents = {f"a{k}": draw(st.integers(1, 300)) for k in range(n_agents)}
    names = list(agents)
    tasks, arrival, largest = [], 0.0, max(agents.values())  # every prefix must fit too
    for i in range(draw(st.integers(1, 4))):
        # simultaneous arrivals, or gaps of up to 3 s (a stage takes ~0.05-4 s)
        arrival += draw(st.one_of(st.just(0), st.integers(0, 300))) / 100.0
        stages = []
        for k in range(draw(st.integers(1, 5))):
            parents = tuple(f"s{j}" for j in range(k) if draw(st.booleans()))
            a = draw(st.sampled_from(names))
            x = draw(st.integers(1, 200))
            y = draw(st.one_of(st.integers(1, 20), st.integers(1, 150)))  # short outputs: small reservations
            largest = max(largest, agents[a] + x + y)
            stages.append(stage(f"s{k}", a, x, y, parents))
        tasks.append(task(f"t{i}", arrival, *stages))
    # from "the largest request only just fits alone" to "everything fits at once", tight often
    budget = draw(st.one_of(st.just(largest), st.integers(largest, largest + 30),
                            st.integers(largest, largest + sum(agents.values()) + 400)))
    chunk = draw(st.sampled_from([16, 64, 256, None]))  # None: the cost model's 4096
    # SGLang's decaying output reservation, or a small constant one (admits more, retracts more)
    ratio = draw(st.sampled_from([{}, {"init_new_token_ratio": 0.05, "min_new_token_ratio_factor": 1.0}]))
    switches = {k: draw(st.booleans()) for k in ("host_tier", "radix_cache", "prefill_prefix_sharing",
                                                 "admission_gate", "full_output_reserve", "ignore_eos")}
    latency = draw(st.sampled_from([0.0, 0.01]))
    cfg = EngineConfig(kv_budget=budget, max_prefill_tokens=chunk, recheck_steps=draw(st.sampled_from([1, 32])),
                       request_latency_s=latency, **switches, **ratio)
    policy = draw(st.sampled_from([FCFS, LPM]))
    return trace(agents, tasks), cfg, policy


def stage_lower_bound(l: int, x: int, y: int) -> float:
    """A lower bound on the time a stage spends running, whatever the load.

    Prefill: the request's x tokens are computed on top of (at least) its l cached prefix tokens,
    in one or more iterations of chunk sizes n_1..n_k (sum x), each costing at least
    c0 + c_new*n_i + c_cached*n_i*(l + n_1 + .. + n_{i-1}) + c_sq*n_i^2 (other chunks in the
    same iteration only add). Summed: c0 + c_new*x + c_cached*x*l + c_cached*P + c_sq*Q with
    Q + 2P = x^2 (P, Q >= 0), which is at least min(c_sq, c_cached/2) * x^2. A first-ever
    prefix load and a recompute after retraction only add.
    Decode: y - 1 steps; the step after g generated tokens costs decode_time(b, T) with b >= 1
    and T >= l + x + g; decode_time is increasing in both (non-negative coefficients).
    """
    prefill = (C.prefill_c0 + C.prefill_c_new * x + C.prefill_c_new_cached * x * l
               + min(C.prefill_c_new_sq, C.prefill_c_new_cached / 2) * x * x)
    return prefill + sum(C.decode_time(1, l + x + g) for g in range(1, y))


def critical_path_at_zero_load(t, agents) -> float:
    z = {s.id: stage_lower_bound(agents[s.agent].prefix_tokens, s.input_tokens, s.output_tokens)
         for s in t.stages}
    return longest_remaining_path(t.topo_order, t.children, z)


# ------------------------------------------------------------------------------- the property

PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(workloads())
def test_engine_invariants_on_random_dag_workloads(case):
    tr, cfg, policy = case
    sim = CheckedSimulator(tr, policy(), C, cfg)
    res = sim.run()
    budget = cfg.kv_budget
    n_requests = tr.num_requests

    # every stage ran to completion exactly once (retractions re-admit, they do not re-finish)
    assert len(sim.finishes) == n_requests and set(sim.finishes.values()) == {1}
    req = res.requests.set_index("rid")
    for rid, n in sim.starts.items():
        assert n == 1 + req.loc[rid, "retractions"] + req.loc[rid, "preemptions"]
    assert len(res.tasks) == len(tr.tasks) and res.tasks["finish"].notna().all()

    # after its parents: ready exactly when the last parent finished (a root: at arrival) plus
    # the request path (a full one after a parent, half after arrival), admitted no earlier,
    # finished after admission; a task ends half a request path after its last stage
    half = cfg.request_latency_s / 2
    for t in tr.tasks:
        for s in t.stages:
            r = req.loc[f"{t.id}/{s.id}"]
            ready = max((req.loc[f"{t.id}/{q}", "finish"] + 2 * half for q in s.parents), default=t.arrival + half)
            assert r["ready"] == pytest.approx(ready, abs=1e-12)
            assert r["ready"] <= r["first_admit"] < r["finish"]
        assert res.tasks.set_index("task_id").loc[t.id, "finish"] == pytest.approx(max(
            req.loc[f"{t.id}/{s.id}", "finish"] for s in t.stages) + half, abs=1e-12)

    # the KV timeline never exceeds the budget
    used = res.timeline["prefix_tokens"] + res.timeline["request_tokens"]
    assert (used <= budget).all()
    assert (res.timeline["request_tokens"] >= 0).all() and (res.timeline["prefix_tokens"] >= 0).all()

    # time never goes backwards in any log
    for table in (res.timeline, res.prefix_events, res.decisions):
        assert table["time"].is_monotonic_increasing

    # JCT >= the task's critical path at zero load
    jct = res.tasks.set_index("task_id")["jct"]
    for t in tr.tasks:
        lb = critical_path_at_zero_load(t, tr.agents)
        assert jct[t.id] >= lb * (1 - 1e-9), f"{t.id}: JCT {jct[t.id]} < critical path {lb}"


def test_the_lower_bound_is_close_to_the_time_of_a_lone_request_on_a_resident_prefix():
    """The bound is not vacuous: for a request running alone, unchunked, on a resident prefix, it
    is the exact time less (c_sq - c_cached/2) * x^2 (here c_sq = 1e-7 > c_cached/2 = 5e-8, so
    chunking could make the prefill cheaper than one chunk, and the bound allows for it)."""
    from topas.engine.simulator import simulate

    l, x, y = 200, 100, 30
    tr = trace({"a": l}, [task("t0", 0.0, stage("s", "a", x, y)), task("t1", 50.0, stage("s", "a", x, y))])
    res = simulate(tr, FCFS(), C)
    jct = res.tasks.set_index("task_id")["jct"]["t1"]
    exact = C.prefill_time([(x, l)]) + sum(C.decode_time(1, l + x + g) for g in range(1, y))
    assert jct == pytest.approx(exact, abs=1e-9)
    assert stage_lower_bound(l, x, y) == pytest.approx(
        exact - (C.prefill_c_new_sq - C.prefill_c_new_cached / 2) * x * x, abs=1e-12)


@given(st.integers(-5000, 5000), st.integers(0, 5000), st.integers(-10, 5000), st.booleans(),
       st.floats(0.0, 1.0))
def test_a_reservation_is_the_clipped_remaining_output_scaled(max_new, generated, clip, full, ratio):
    remaining = max(min(max_new - generated, clip), 0)
    assert output_reserve(max_new, generated, clip, full, ratio) == (remaining if full else int(ratio * remaining))
