"""The offline eviction bound: the true future it reads (topas.engine.future) and, on small cases,
Belady keeping the entry that is used next where LRU evicts it (topas.engine.belady)."""

from __future__ import annotations

from conftest import stage, task, trace
from topas.engine.future import NEVER, NextUse, reference_order
from topas.workload.model import Agent, Segment, Stage, Task, Trace


def _seg_trace() -> Trace:
    """Two tasks; each task's calls of agent a share a context segment ``ctx<i>`` after a's prefix."""
    pa, pb = Segment("pa", 100, "prefix"), Segment("pb", 80, "prefix")
    tasks = []
    for i, arrival in enumerate((0.0, 5.0)):
        t = f"t{i}"
        ctx = Segment(f"ctx{i}", 300, "context", t, "x")
        u = {s: Segment(f"u{i}{s}", 20, "unique", t, s) for s in "xwy"}
        tasks.append(Task(t, arrival, (
            Stage("x", "a", 320, 8, (), segments=(pa, ctx, u["x"])),
            Stage("w", "b", 20, 8, ("x",), segments=(pb, u["w"])),
            Stage("y", "a", 320, 8, ("w",), segments=(pa, ctx, u["y"])))))
    return Trace("seg", {"a": Agent("a", 100, 8.0), "b": Agent("b", 80, 8.0)}, tuple(tasks))


def test_reference_order_is_tasks_by_arrival_then_stage_depth():
    # DAG-4 (A -> {B, C} -> D) declared out of depth order; a second task arriving earlier
    t_late = task("t1", 2.0, stage("D", "D", 1, 1, "BC"), stage("A", "A", 1, 1), stage("B", "B", 1, 1, "A"),
                  stage("C", "C", 1, 1, "A"))
    t_early = task("t0", 1.0, stage("A", "A", 1, 1))
    order = [rid for *_, rid in reference_order([t_late, t_early])]
    assert order == ["t0/A", "t1/A", "t1/B", "t1/C", "t1/D"]
    depths = {rid: d for _, d, _, rid in reference_order([t_late])}
    assert depths == {"t1/A": 0, "t1/B": 1, "t1/C": 1, "t1/D": 2}


def test_next_use_of_prefixes_follows_finished_requests():
    tr = trace({"A": 10, "B": 10}, [task("t0", 0.0, stage("A", "A", 5, 1), stage("B", "B", 5, 1, "A")),
                                    task("t1", 1.0, stage("A", "A", 5, 1))])
    nu = NextUse(tr)
    assert nu.next_use(("A",)) == 0 and nu.next_use(("B",)) == 1
    nu.finish("t0/A")
    assert nu.next_use(("A",)) == 2  # t1's call is next
    nu.finish("t0/B")
    assert nu.next_use(("B",)) == NEVER
    assert nu.next_use(("C",)) == NEVER  # an agent nobody uses


def test_next_use_of_segments_and_of_output_leaves():
    nu = NextUse(_seg_trace())
    pos = nu.position
    assert nu.next_use(("a", "ctx0")) == pos["t0/x"]
    nu.finish("t0/x")
    assert nu.next_use(("a", "ctx0")) == pos["t0/y"]  # the task's last call reads it again
    assert nu.next_use(("a", "pa")) == NEVER  # inside the agent prefix: the prefix's key holds it
    assert nu.next_use(("a", "\0out/t0/x")) == NEVER  # an output leaf: no prompt holds it
    nu.finish("t0/y")
    assert nu.next_use(("a", "ctx0")) == NEVER  # the task is done with its context
    assert nu.next_use(("a", "ctx1")) == pos["t1/x"]
    assert nu.next_use(("b",)) == pos["t0/w"]


def test_finishing_an_unknown_request_names_it():
    nu = NextUse(_seg_trace())
    try:
        nu.finish("t9/x")
    except KeyError as e:
        assert "t9/x" in str(e)
    else:  # pragma: no cover
        raise AssertionError("finish of an unknown request did not raise")


# ---------------------------------------------------------------------------- in the engine

def _two_call_task(id: str, arrival: float, agent: str) -> Task:
    """Two calls of one agent in a chain: the second matches the first's prefix, so the prefix
    no longer shares its radix node with a request's KV (it is an entry of its own)."""
    return task(id, arrival, stage("S1", agent, 50, 10), stage("S2", agent, 50, 10, ("S1",)))


def _keep_or_lose_a():
    """A, then B, then C needs room (A and B cached, each with two finished leaves), then A again.
    LRU evicts A's leaves, then A's prefix (older than B's leaves); Belady evicts the four leaves
    (never used again) and keeps both prefixes, so the last call finds A cached."""
    return trace({"A": 300, "B": 300, "C": 300},
                 [_two_call_task("t0", 0.0, "A"), _two_call_task("t1", 10.0, "B"),
                  task("t2", 20.0, stage("S1", "C", 50, 10)), task("t3", 30.0, stage("S1", "A", 50, 10))])


def _run(tr: Trace, eviction: str, policy=None, kv_budget: int = 1000, **cfg):
    from conftest import ROUND_COST
    from topas.engine.config import EngineConfig
    from topas.engine.simulator import simulate
    from topas.policies.fcfs import FCFS

    return simulate(tr, policy or FCFS(), ROUND_COST, EngineConfig(kv_budget=kv_budget, eviction=eviction, **cfg))


def test_belady_keeps_the_prefix_used_next_where_lru_evicts_it():
    lru, bel = (_run(_keep_or_lose_a(), e).requests.set_index("rid") for e in ("lru", "belady"))
    assert lru.loc["t3/S1", "cached_tokens"] == 0  # LRU took A's prefix for C
    assert bel.loc["t3/S1", "cached_tokens"] == 300  # Belady kept it (B's is never used again either)
    # the calls before t3 are alike: both engines found the same prefixes cached up to C
    assert (lru.drop(index="t3/S1")["cached_tokens"] == bel.drop(index="t3/S1")["cached_tokens"]).all()


def _context_trace() -> Trace:
    """Segments. Task t0: x (agent a) leaves a 300-token context that y (agent a) reads after a
    long call v (agent c). Meanwhile t1 (agent b) runs and finishes, and t2 (agent d) needs room.
    LRU evicts t0's context (touched before t1's nodes); Belady evicts the output leaves, x's own
    segment and t1's nodes (never used again) and keeps the context y reads."""
    seg = Segment
    pa, pb, pc, pd = (seg(f"p{x}", 100, "prefix") for x in "abcd")
    ctx = seg("ctx0", 300, "context", "t0", "x")
    t0 = Task("t0", 0.0, (Stage("x", "a", 320, 10, (), segments=(pa, ctx, seg("ux", 20, "unique", "t0", "x"))),
                          Stage("v", "c", 20, 400, ("x",), segments=(pc, seg("uv", 20, "unique", "t0", "v"))),
                          Stage("y", "a", 320, 10, ("v",), segments=(pa, ctx, seg("uy", 20, "unique", "t0", "y")))))
    t1 = Task("t1", 2.0, (Stage("z", "b", 300, 10, (), segments=(pb, seg("ub", 300, "unique", "t1", "z"))),))
    t2 = Task("t2", 5.0, (Stage("z", "d", 300, 10, (), segments=(pd, seg("ud", 300, "unique", "t2", "z"))),))
    return Trace("ctx", {a: Agent(a, 100, 8.0) for a in "abcd"}, (t0, t1, t2))


def test_belady_keeps_the_task_context_its_next_call_reads():
    # 1400 tokens: v running (520 with its reservation) and every cached node (840) leave 40
    # free when t2 needs 411: LRU frees x's leaves, then the context; Belady the never-used nodes
    runs = {e: _run(_context_trace(), e, kv_budget=1400).requests.set_index("rid") for e in ("lru", "lfu", "belady")}
    assert runs["belady"].loc["t0/y", "cached_tokens"] == 400  # a's prefix and the context
    assert runs["lru"].loc["t0/y", "cached_tokens"] == 0
    assert runs["lfu"].loc["t0/y", "cached_tokens"] == 0  # one hit each: LFU is LRU here
    for e in ("lru", "lfu"):  # everything before y is alike
        assert (runs[e]["first_admit"].drop(index="t0/y") == runs["belady"]["first_admit"].drop(index="t0/y")).all()


def test_belady_is_labelled_an_offline_bound():
    from topas.engine.eviction import available_evictions, eviction_strategy

    ev = eviction_strategy("belady")
    assert ev.bound and "OFFLINE BOUND" in available_evictions()["belady"][0]
    from topas.engine.eviction import PREFIX, Evictable
    e = Evictable(PREFIX, "A", 10, 0.0, 0, 0, 0, (1, "A"), "A")
    try:
        ev.priority(e)
    except ValueError as err:
        assert "prepare" in str(err)
    else:  # pragma: no cover
        raise AssertionError("belady ranked an entry without the run's future")


def test_belady_refuses_a_request_outside_the_future_it_was_given():
    from topas.engine.belady import Belady
    from topas.engine.eviction import OfflineFuture

    tr = _keep_or_lose_a()
    Belady().prepare(None, OfflineFuture(tr, 0.0, {"t0/S1": "waiting", "t0/S2": "pending"}))  # type: ignore[arg-type]
    try:  # a cluster's engine: its trace holds no tasks, its requests arrive from the router
        Belady().prepare(None, OfflineFuture(tr.head(0), 0.0, {"t0/S1": "done"}))  # type: ignore[arg-type]
    except ValueError as e:
        assert "t0/S1" in str(e) and "cluster" in str(e)
    else:  # pragma: no cover
        raise AssertionError("belady ran on a future that lacks the engine's requests")


def test_the_future_shows_each_request_state_as_the_engine_holds_it_when_read():
    # The simulator hands the bound a mapping read through to its requests (no copy of every
    # request at every eviction pass): at any read it is the dict of their states then.
    from types import SimpleNamespace

    from topas.engine.eviction import RequestStates

    requests = {"t0/S1": SimpleNamespace(state="waiting"), "t0/S2": SimpleNamespace(state="pending")}
    states = RequestStates(requests)
    assert dict(states) == {"t0/S1": "waiting", "t0/S2": "pending"} and len(states) == 2
    requests["t0/S1"].state = "done"
    requests["t1/S1"] = SimpleNamespace(state="waiting")
    assert dict(states) == {"t0/S1": "done", "t0/S2": "pending", "t1/S1": "waiting"}
    assert "t1/S1" in states and "t9/S1" not in states and list(states) == list(requests)
    try:
        states["t9/S1"]
    except KeyError as e:
        assert "t9/S1" in str(e)
    else:  # pragma: no cover
        raise AssertionError("an unknown request id has a state")


def test_belady_reads_the_same_states_as_a_copy_would_give(monkeypatch):
    # A run under the bound with the states read through and with them copied at every pass, as
    # the engine once gave them: the same run.
    from topas.engine import simulator
    from topas.engine.config import EngineConfig
    from topas.engine.cost import load_profile
    from topas.engine.eviction import OfflineFuture
    from topas.policies import make_policy
    from topas.workload import synthetic

    tr = synthetic.generate("dag-10-wide", n_tasks=40, seed=2)
    cost, config = load_profile("a100-80gb_qwen2.5-32b").with_budget(20_000), EngineConfig(eviction="belady")
    through = simulator.simulate(tr, make_policy("lpm"), cost, config)
    monkeypatch.setattr(simulator.Simulator, "offline_future", lambda self: OfflineFuture(
        self.trace, self.clock.now, {rid: r.state for rid, r in self.requests.items()}))
    copied = simulator.simulate(tr, make_policy("lpm"), cost, config)
    assert through.summary["prefix_evictions"] > 10  # the bound chose what to evict, many times
    assert through.deterministic_summary() == copied.deterministic_summary()
    assert through.prefix_events.equals(copied.prefix_events) and through.requests.equals(copied.requests)
