"""KVFlow's background prefetch and the admission skip (topas.engine.prefetch), on tiny traces
with the round cost model (tests/conftest.py: a prefix swap of l tokens takes 0.001 + l/1000 s)."""

from __future__ import annotations

from conftest import ROUND_COST, stage, task, trace

from topas.engine.config import EngineConfig
from topas.engine.simulator import Simulator
from topas.policies import make_policy
from topas.engine.kvflow_steps import prefetch_order, view_agent_steps


def kvflow_prefetcher(view):
    steps = view_agent_steps(view)
    return tuple((a, steps[a]) for a in prefetch_order(steps))


def run(tr, prefetch: bool, on_host: tuple[str, ...], policy: str = "lpm") -> Simulator:
    sim = Simulator(tr, make_policy(policy), ROUND_COST, EngineConfig(host_tier=True))
    for a in on_host:  # as if swapped out earlier
        sim.memory.prefixes[a].on_host = True
    if prefetch:
        sim.prefetch.prefetcher = kvflow_prefetcher
    sim.run()
    return sim


def events(sim: Simulator, agent: str) -> list[tuple[float, str]]:
    return [(round(t, 6), kind) for t, a, kind, _, _ in sim.memory.prefix_events if a == agent]


# chain A -> B: A decodes 2000 tokens (about 46 s); B's prefix (2000 tokens) is on host
CHAIN = trace({"A": 500, "B": 2000}, [task("t", 0.0, stage("a", "A", 100, 2000), stage("b", "B", 100, 5, "a"))])


def test_the_next_agents_prefix_is_loaded_in_the_background_while_its_parent_runs() -> None:
    sim = run(CHAIN, prefetch=True, on_host=("B",))
    # B is one step away when the task arrives (L = 2): its load starts at once, off the critical path
    assert events(sim, "B") == [(0.0, "prefetch_swap")]
    b = sim.requests["t/b"]
    assert b.first_admit_time == b.ready_time  # admitted as soon as it is ready, its prefix cached
    assert b.cached_tokens >= 2000


def test_without_prefetch_the_load_is_a_swap_in_the_requests_own_iteration() -> None:
    sim = run(CHAIN, prefetch=False, on_host=("B",))
    assert [k for _, k in events(sim, "B")] == ["load_swap"]
    with_pf = run(CHAIN, prefetch=True, on_host=("B",))
    # the blocking swap (2.001 s) is on the task's critical path only without prefetch
    jct = sim.tasks["t"].finish_time
    assert jct - with_pf.tasks["t"].finish_time > 1.9


# two roots ready at once: B's prefix (4000 tokens, 4.001 s to load) is on host, A's is not
ROOTS = trace({"A": 500, "B": 4000}, [task("t", 0.0, stage("a", "A", 100, 20), stage("b", "B", 100, 20))])


def test_a_request_whose_prefix_is_loading_is_skipped_not_blocking_the_queue() -> None:
    sim = run(ROOTS, prefetch=True, on_host=("B",))
    a, b = sim.requests["t/a"], sim.requests["t/b"]
    assert a.first_admit_time == 0.0  # admitted while B's prefix loads
    assert b.first_admit_time >= 0.001 + 4000 / 1000  # only once its load has completed
    assert events(sim, "B")[0] == (0.0, "prefetch_swap")
    assert "load_swap" not in [k for _, k in events(sim, "B")]


def test_a_loading_prefix_is_locked_and_not_matchable() -> None:
    sim = Simulator(ROOTS, make_policy("lpm"), ROUND_COST, EngineConfig(host_tier=True))
    sim.memory.prefixes["B"].on_host = True
    sim.prefetch.prefetcher = kvflow_prefetcher
    sim.step()  # the arrival: the decision starts B's load and admits A
    assert sim.prefetch.loading == {"B": 0.001 + 4000 / 1000}
    v = sim.view()
    assert v.prefixes["B"].resident and not v.prefixes["B"].in_tree
    assert sim.memory.locked(sim.memory.prefixes["B"])
    assert "t/b" in sim.waiting


def _events(policy: str, host: bool, **kw) -> dict[str, int]:
    from topas.experiments.spec import Experiment, run_experiment
    r = run_experiment(Experiment(workload="dag-4", policy=policy, load=1.5, seed=0, n_tasks=40,
                                  engine_options=(("eviction", "kvflow"), ("host_tier", host)), **kw))
    assert r.summary["n_tasks"] == 40
    return {k: int(v) for k, v in r.prefix_events["event"].value_counts().items()}


def test_kvflow_with_a_host_tier_loads_every_host_prefix_in_the_background() -> None:
    ev = _events("lpm", True)
    assert ev.get("prefetch_swap", 0) > 0 and ev.get("load_swap", 0) == 0
    online = _events("lpm", True, dag_visibility="online")
    assert online.get("prefetch_swap", 0) > 0 and online.get("load_swap", 0) == 0


def test_kvflow_without_a_host_tier_or_under_a_prefix_managing_policy_does_not_prefetch() -> None:
    assert "prefetch_swap" not in _events("lpm", False)
    assert "prefetch_swap" not in _events("topas", True)


def test_the_host_link_serves_a_waiting_requests_load_before_queued_prefetches() -> None:
    tr = trace({"A": 100, "B": 1000, "C": 1000, "D": 1000}, [task("t", 0.0, stage("a", "A", 10, 5))])
    sim = Simulator(tr, make_policy("lpm"), ROUND_COST, EngineConfig(host_tier=True))
    for a in "BCD":
        sim.memory.prefixes[a].on_host = True
    link = sim.prefetch
    assert link.prefetch((("B", 1), ("C", 2))) == 2  # B on the link (1.001 s), C queued
    assert link.prefetch((("D", 0),), demand=True) == 1  # queued ahead of C (priority 0 < 3)
    assert link.on_link == "B" and link.loading == {"B": 1.001, "C": None, "D": None}
    sim.clock.now = 1.5  # past B's copy: D starts when B ended, C after D
    assert link.loads_done() == 1
    assert link.on_link == "D" and link.loading == {"C": None, "D": 1.001 + 1.001}
    sim.clock.now = 5.0
    assert link.loads_done() == 2
    assert link.loading == {} and link.on_link is None
