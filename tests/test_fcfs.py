"""FCFS as SGLang's default policy serves its waiting queue (topas/policies/fcfs.py): arrival
order, and a retracted request rejoins at the end."""

from __future__ import annotations

from test_lpm import req, view
from topas.policies import make_policy


def order(policy, v) -> list[str]:
    return list(policy.decide(v).admit)


def test_requests_are_served_in_the_order_they_became_ready_ties_by_id():
    fcfs = make_policy("fcfs")
    v = view([req("b", "a", 0.2), req("c", "b", 0.1), req("a", "c", 0.1)], in_tree={"a"})
    assert order(fcfs, v) == ["a", "c", "b"]  # the cache plays no part


def test_a_retracted_request_rejoins_at_the_end_of_the_queue():
    fcfs = make_policy("fcfs")
    assert order(fcfs, view([req("r1", "a", 0.0), req("r2", "b", 0.1)])) == ["r1", "r2"]
    # r1 ran and was retracted at t=1; r3 had arrived at 0.5, r4 arrives at 1.5: SGLang appended
    # r3, then r1 (re-entering), then r4
    fcfs.on_preempt(req("r1", "a", 0.0), 1.0, by_engine=True)
    v = view([req("r1", "a", 0.0), req("r2", "b", 0.1), req("r3", "c", 0.5), req("r4", "c", 1.5)])
    assert order(fcfs, v) == ["r2", "r3", "r1", "r4"]
    # from then on r1 keeps that place
    assert order(fcfs, view([req("r1", "a", 0.0), req("r3", "c", 0.5), req("r5", "c", 0.2)])) == ["r3", "r1", "r5"]
    # a fresh FCFS, with no history, orders by ready time
    assert order(make_policy("fcfs"), view([req("r3", "c", 0.5), req("r1", "a", 0.0)])) == ["r1", "r3"]
