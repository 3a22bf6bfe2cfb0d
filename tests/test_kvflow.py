"""KVFlow's Agent Step Graph (topas.engine.kvflow_steps), on hand-built DAGs, read like the spec."""

from __future__ import annotations

import pytest

from conftest import task_view as task
from topas.engine.kvflow_steps import (agent_steps, eviction_pass, node_value, prefetch_order, sglang_priority,
    stage_steps)


# a -> b -> d, a -> c -> d (a diamond), d -> e
DIAMOND = [("a", "A", ()), ("b", "B", ("a",)), ("c", "C", ("a",)), ("d", "D", ("b", "c")), ("e", "E", ("d",))]


def test_a_chain_counts_one_step_per_stage_after_the_ready_one() -> None:
    t = task("t", [("s0", "X", ()), ("s1", "Y", ("s0",)), ("s2", "Z", ("s1",))])
    assert stage_steps(t) == {"s0": 0, "s1": 1, "s2": 2}
    t = task("t", [("s0", "X", ()), ("s1", "Y", ("s0",)), ("s2", "Z", ("s1",))], done=("s0",))
    assert stage_steps(t) == {"s1": 0, "s2": 1}


def test_an_and_join_waits_for_its_latest_parent() -> None:
    # c is one step later than b: d (AND) is one step after c
    t = task("t", [("a", "A", ()), ("b", "B", ("a",)), ("x", "X", ("a",)), ("c", "C", ("x",)),
                   ("d", "D", ("b", "c"))])
    assert stage_steps(t)["d"] == 3


def test_an_or_join_runs_after_its_earliest_parent_and_is_ready_once_one_is_done() -> None:
    t = task("t", [("a", "A", ()), ("b", "B", ("a",)), ("x", "X", ("a",)), ("c", "C", ("x",)),
                   ("d", "D", ("b", "c"))])
    assert stage_steps(t, or_joins={"d"})["d"] == 2
    done_b = task("t", [("a", "A", ()), ("b", "B", ("a",)), ("x", "X", ("a",)), ("c", "C", ("x",)),
                        ("d", "D", ("b", "c"))], done=("a", "b"))
    assert stage_steps(done_b, or_joins={"d"})["d"] == 0
    assert stage_steps(done_b)["d"] == 2  # AND: still waits for x then c


def test_an_and_join_with_one_parent_done_waits_for_the_other() -> None:
    t = task("t", DIAMOND, done=("a", "b"))
    assert stage_steps(t) == {"c": 0, "d": 1, "e": 2}


def test_an_agent_takes_its_nearest_stage_and_concurrent_workflows_the_minimum() -> None:
    # agent A serves a (ready) in t1 and e (3 steps away) in t2: A is due now
    t1 = task("t1", [("a", "A", ()), ("b", "B", ("a",))])
    t2 = task("t2", [("x", "X", ()), ("y", "Y", ("x",)), ("z", "Z", ("y",)), ("e", "A", ("z",)), ("f", "B", ("e",))])
    assert agent_steps([t1, t2]) == {"A": 0, "B": 1, "X": 0, "Y": 1, "Z": 2}
    assert agent_steps([t2]) == {"X": 0, "Y": 1, "Z": 2, "A": 3, "B": 4}


def test_finished_stages_do_not_count() -> None:
    t = task("t", DIAMOND, done=("a", "b", "c", "d"))
    assert agent_steps([t]) == {"E": 0}


def test_online_visibility_shows_only_ready_stages_so_only_they_are_due() -> None:
    # what an online view shows of the diamond after a: b and c (ready), a (done)
    shown = task("t", [("a", "A", ()), ("b", "B", ("a",)), ("c", "C", ("a",))], done=("a",))
    assert agent_steps([shown]) == {"B": 0, "C": 0}


def test_a_node_value_is_the_minimum_over_its_agents_capped_at_h_plus_1() -> None:
    steps = {"A": 0, "B": 3, "C": 9}
    assert node_value(["B"], steps) == 3
    assert node_value(["B", "A"], steps) == 0  # protected while any agent using it is due soon
    assert node_value(["C"], steps) == 5  # min(9, H + 1), H = 4
    assert node_value(["Q"], steps) == 5  # an agent no known stage waits for: H + 1
    assert node_value([], steps) == 6  # no known agent: H + 2
    assert node_value([None], steps) == 6
    assert node_value(["C"], steps, horizon=10) == 9


def test_eviction_passes_take_the_furthest_first_and_the_due_last() -> None:
    # H = 4: pass 0 takes values >= 3, pass 1 value 2, pass 2 value 1, pass 3 (plain order) value 0
    assert [eviction_pass(v) for v in range(7)] == [3, 2, 1, 0, 0, 0, 0]
    assert [eviction_pass(v, horizon=2) for v in range(5)] == [1, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="horizon"):
        eviction_pass(0, horizon=0)
    with pytest.raises(ValueError, match="value"):
        eviction_pass(-1)


def test_prefetch_takes_agents_due_within_l_steps_nearest_first() -> None:
    assert prefetch_order({"C": 2, "A": 1, "B": 0, "D": 3}) == ("B", "A", "C")
    assert prefetch_order({"C": 2, "A": 1, "B": 0, "D": 3}, lookahead=0) == ("B",)
    with pytest.raises(ValueError, match="look-ahead"):
        prefetch_order({}, lookahead=-1)


def test_sglang_priority_keeps_the_due_longest() -> None:
    assert [sglang_priority(v) for v in (0, 1, 5, 6)] == [6, 5, 1, 0]


def test_a_request_priority_is_its_agents_next_use_after_it() -> None:
    from topas.engine.cost import CostModel  # noqa: F401  (the view's type only)
    from topas.engine.view import EngineView
    from topas.engine.kvflow_steps import kvflow_request_priority

    # chain X -> Y -> X: once the first X is done, X is due again in 1 step (value 1 -> priority 5)
    chain = [("s0", "X", ()), ("s1", "Y", ("s0",)), ("s2", "X", ("s1",))]
    view = EngineView(0.0, 100, 0, 0, {}, (), (), {"t": task("t", chain)}, None)  # type: ignore[arg-type]
    assert kvflow_request_priority(view, "t", "s0") == 5
    # after the last X no known stage needs X: value H + 1 -> priority 1
    late = EngineView(0.0, 100, 0, 0, {}, (), (), {"t": task("t", chain, done=("s0", "s1"))}, None)  # type: ignore[arg-type]
    assert kvflow_request_priority(late, "t", "s2") == 1
    with pytest.raises(KeyError, match="stage 'nope'"):
        kvflow_request_priority(view, "t", "nope")


# ---------------------------------------------------------------- the eviction strategy


def entry(kind: str, agent: str, last_access: float, serial: int = 0):
    from topas.engine.eviction import PREFIX, Evictable
    tie = (1, agent) if kind == PREFIX else (0, serial)
    return Evictable(kind, agent, 100, last_access, 1, 0, serial, tie, f"{agent}/{serial}")


def kvflow_order(entries, tasks, spec: str = "kvflow") -> list[str]:
    from topas.engine.eviction import eviction_strategy
    from topas.engine.view import EngineView
    ev = eviction_strategy(spec)
    ev.prepare(EngineView(0.0, 100, 0, 0, {}, (), (), {t.id: t for t in tasks}, None))  # type: ignore[arg-type]
    return [e.key for e in sorted(entries, key=lambda e: (ev.priority(e), e.tie))]


def test_kvflow_evicts_agents_due_furthest_first_then_plain_lru() -> None:
    from topas.engine.eviction import PREFIX, SEGMENT
    # chain A (ready) -> B (1) -> C (2) -> D (3) -> E (4); F in no task
    t = task("t", [("s0", "A", ()), ("s1", "B", ("s0",)), ("s2", "C", ("s1",)), ("s3", "D", ("s2",)),
                   ("s4", "E", ("s3",))])
    es = [entry(SEGMENT, a, 10.0 - i, i) for i, a in enumerate("ABCDEF")]  # A least recently used
    # pass 0 (value >= 3): D, E, F by LRU (F oldest); then C (2), B (1), A (0, plain order)
    assert kvflow_order(es, [t]) == ["F/5", "E/4", "D/3", "C/2", "B/1", "A/0"]
    # LRU alone would take F, E, D, C, B, A too here: reverse the recency to tell them apart
    es = [entry(SEGMENT, a, float(i), i) for i, a in enumerate("ABCDEF")]  # A least recently used
    assert kvflow_order(es, [t]) == ["D/3", "E/4", "F/5", "C/2", "B/1", "A/0"]


def test_kvflow_takes_request_specific_kv_before_agent_prefixes_within_a_pass() -> None:
    from topas.engine.eviction import PREFIX, SEGMENT
    t = task("t", [("s0", "A", ())])  # A due now; X, Y in no task (pass 0)
    es = [entry(PREFIX, "X", 1.0), entry(SEGMENT, "Y", 5.0, 7), entry(PREFIX, "A", 0.0), entry(SEGMENT, "A", 2.0, 8)]
    # pass 0: Y's segment before X's prefix (older); the last pass (A) is plain LRU: A's prefix first
    assert kvflow_order(es, [t]) == ["Y/7", "X/0", "A/0", "A/8"]


def test_kvflow_parameters_are_checked() -> None:
    from topas.engine.eviction import eviction_strategy
    assert eviction_strategy("kvflow:horizon=2").values["horizon"] == 2
    with pytest.raises(ValueError, match="horizon >= 1"):
        eviction_strategy("kvflow:horizon=0")
    with pytest.raises(ValueError, match="prefetch 0 or 1"):
        eviction_strategy("kvflow:prefetch=2")
    with pytest.raises(ValueError, match="no parameter 'h'"):
        eviction_strategy("kvflow:h=2")


def test_the_step_cache_agrees_with_the_function_as_tasks_move() -> None:
    from topas.engine.view import EngineView
    from topas.engine.kvflow_steps import AgentStepCache, view_agent_steps

    cache = AgentStepCache()
    t1, t2 = task("t1", DIAMOND), task("t2", [("x", "A", ()), ("y", "E", ("x",))])
    for tasks in ({"t1": t1, "t2": t2}, {"t1": t1, "t2": t2}, {"t1": task("t1", DIAMOND, done=("a", "b"))},
                  {"t1": task("t1", DIAMOND, done=("a", "b", "c")), "t2": t2}):
        v = EngineView(0.0, 100, 0, 0, {}, (), (), tasks, None)  # type: ignore[arg-type]
        assert cache.agent_steps(v) == view_agent_steps(v)
