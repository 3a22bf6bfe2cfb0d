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
