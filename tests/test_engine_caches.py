"""The engine's kept state at scheduling points equals a rebuild from scratch, at every decision of
small runs: the prefixes' views (``PrefixViews``), the running requests' reservations
(``Batch.held``), the waiting requests' tree matches
(``SegmentMemory.matches``), the admission walk's locked prefix tokens and the LRU evictable prefix
a settle pass keeps (``Eviction._next_lru_prefix``); the decision's running requests, built
when the policy first reads them (``RunningViews``), are what an eager view shows, and cannot be
read once the decision is taken; and a policy that declares it does not read the tasks is shown
none, with the same run as if it were."""

from __future__ import annotations

import pytest

from topas.engine.simulator import Simulator, simulate
from topas.engine.view import PrefixView
from topas.engine.view_cache import ExpiredView, RunningViews, TasksNotShown, UnreadTasks
from topas.policies.base import make_policy
from topas.experiments import Experiment
from topas.experiments.spec import prepare

RUNS = [
    Experiment("metagpt-tl", "fcfs", {}, load=1.2, seed=0, n_tasks=12),  # segments, LRU settle
    Experiment("metagpt-sop", "lpm", {}, load=1.3, seed=0, n_tasks=10, engine_options={"host_tier": True}),
    Experiment("dag-4", "topas", {}, load=1.3, seed=0, n_tasks=30),  # a managing policy
    Experiment("dag-4", "fcfs", {}, load=1.3, seed=0, n_tasks=30,
               engine_options={"eviction": "kvflow", "host_tier": True}),  # host loads skipped in the walk
]


def rebuilt_prefixes(sim: Simulator) -> dict[str, PrefixView]:
    m = sim.memory
    return {a: PrefixView(a, p.tokens, sim.knowledge.prior(a, p.agent.expected_output_tokens), p.resident,
                          p.on_host, p.refcount, p.last_used, m.cached_unpinned(a), m.in_tree(a), a in m.computing)
            for a, p in m.prefixes.items()}


def rebuilt_matches(sim: Simulator) -> dict[str, int]:
    seg = sim.segments
    return {rid: sum(n.tokens for n in seg.tree.match(r.agent, seg._tail(r))) for rid, r in sim.waiting.items()}


@pytest.mark.parametrize("exp", RUNS, ids=lambda e: f"{e.workload}/{e.policy}")
def test_kept_state_equals_a_rebuild_at_every_decision(exp: Experiment) -> None:
    p = prepare(exp)
    sim = Simulator(p.trace, p.policy, p.cost, p.config, p.knowledge)
    checked = {"view": 0, "fits": 0, "settle": 0}
    view, fits, next_lru = sim.view, sim.admission._fits, sim.eviction._next_lru_prefix

    def checked_view(*args, **kwargs):
        v = view(*args, **kwargs)
        assert v.prefixes == rebuilt_prefixes(sim)
        if sim.segments is not None:
            assert v.segment_match == rebuilt_matches(sim)
        # Batch.held computes the running requests' reservations in one pass of its own: each
        # must be Batch.reserve's, request by request
        assert list(sim.batch.held()) == [(r, sim.batch.reserve(r)) for r in sim.batch.running()]
        checked["view"] += 1
        return v

    def checked_fits(tokens, exclude, locked):
        if sim.config.radix_cache:
            assert locked == sim.memory.locked_prefix_tokens()
        checked["fits"] += 1
        return fits(tokens, exclude, locked)

    def checked_next(best, touched):
        out = next_lru(best, touched)
        assert out is sim.memory.lru_evictable_prefix()
        checked["settle"] += 1
        return out

    sim.view = checked_view
    sim.admission._fits = checked_fits
    sim.eviction._next_lru_prefix = checked_next
    sim.run()
    assert checked["view"] and checked["fits"]
    assert checked["settle"] or exp.engine_options  # (LRU settles evict in the stock engine runs)


@pytest.mark.parametrize("exp", RUNS, ids=lambda e: f"{e.workload}/{e.policy}")
def test_the_decisions_running_views_are_those_of_an_eager_view(exp: Experiment) -> None:
    """Read at every decision, the lazily built running views equal those an eager view builds
    at the same point, and the run is the same to the bit with every view built eagerly."""
    p = prepare(exp)
    sim = Simulator(p.trace, p.policy, p.cost, p.config, p.knowledge)
    decide, read = sim.policy.decide, [0]

    def reading_decide(view):
        if isinstance(view.running, RunningViews):
            assert not view.running.built
            assert tuple(view.running) == sim.view().running  # (an eager view, same point)
            read[0] += 1
        return decide(view)

    sim.policy.decide = reading_decide
    lazy = sim.run()
    assert read[0] == len(lazy.decisions)
    p = prepare(exp)
    eager = Simulator(p.trace, p.policy, p.cost, p.config, p.knowledge)
    view = eager.view
    eager.view = lambda lazy_running=False, with_tasks=True: view()  # (with the tasks, for every policy)
    out = eager.run()
    assert out.tasks.equals(lazy.tasks) and out.decisions.drop(columns="wall_s").equals(lazy.decisions.drop(columns="wall_s"))


def test_running_views_read_after_the_decision_raise() -> None:
    """A policy that keeps a view and reads its running requests later gets an error, not the
    engine as it is by then."""
    kept = []

    class Keeps(type(make_policy("fcfs"))):
        def decide(self, view):
            kept.append(view)
            return super().decide(view)

    p = prepare(RUNS[2])
    simulate(p.trace.head(3), Keeps(), p.cost, p.config)
    assert kept
    with pytest.raises(ExpiredView, match="after the policy's decision"):
        len(kept[0].running)


def test_running_views_behave_as_their_tuple() -> None:
    built = []
    rv = RunningViews(lambda: built.append(1) or ("a", "b"))
    assert not rv.built and repr(rv) == "RunningViews(<not built>)"
    assert len(rv) == 2 and list(rv) == ["a", "b"] and rv[1] == "b" and rv == ("a", "b") and bool(rv)
    assert built == [1] and rv.built  # built once
    rv.seal()
    assert tuple(rv) == ("a", "b")  # built before the seal: still readable
    empty = RunningViews(tuple)
    assert not empty and empty == ()


def test_only_the_policies_that_order_the_waiting_requests_alone_skip_the_tasks() -> None:
    from topas.policies import available_policies, policy_class

    skip = {name for name in available_policies() if not policy_class(name).reads_tasks}
    assert skip == {"fcfs", "lpm", "k-lpm", "fcfs-guarded", "lpm-guarded", "k-lpm-guarded"}


@pytest.mark.parametrize("exp", [
    Experiment("dag-10-wide", "k-lpm", {}, load=1.3, seed=0, n_tasks=20),
    Experiment("metagpt-sop", "lpm-guarded", {}, load=1.3, seed=1, n_tasks=8, dag_visibility="online"),
    Experiment("dag-4", "fcfs", {}, load=1.3, seed=0, n_tasks=20, engines=2, router="least-load"),
], ids=lambda e: f"{e.workload}/{e.policy}{'/cluster' if e.engines > 1 else ''}")
def test_a_policy_not_shown_the_tasks_runs_as_if_it_were(exp: Experiment) -> None:
    """Not building the task views for a policy that declares it does not read them
    (``reads_tasks = False``) changes nothing in its run; its views show ``UnreadTasks``."""
    from topas.experiments import run_experiment

    shown = []
    base = type(make_policy(exp.policy))
    decide = base.decide

    def noting(self, view):
        shown.append(type(view.tasks))
        return decide(self, view)

    import unittest.mock as mock

    with mock.patch.object(base, "decide", noting):
        skipped = run_experiment(exp)
    assert shown and set(shown) == {UnreadTasks}
    shown.clear()
    with mock.patch.object(base, "reads_tasks", True), mock.patch.object(base, "decide", noting):
        built = run_experiment(exp)
    assert shown and UnreadTasks not in set(shown)
    for table in ("tasks", "requests", "prefix_events", "timeline"):
        assert getattr(skipped, table).equals(getattr(built, table)), table
    assert skipped.decisions.drop(columns="wall_s").equals(built.decisions.drop(columns="wall_s"))


def test_a_policy_that_declares_it_does_not_read_the_tasks_is_refused_them() -> None:
    class Peeks(type(make_policy("fcfs"))):
        name = "peeks"

        def decide(self, view):
            len(view.tasks)
            return super().decide(view)

    p = prepare(RUNS[2])
    with pytest.raises(TasksNotShown, match="policy 'peeks' read EngineView.tasks but declares reads_tasks = False"):
        simulate(p.trace.head(3), Peeks(), p.cost, p.config)
    tasks = UnreadTasks("peeks")
    for read in (lambda: tasks["t0"], lambda: list(tasks), lambda: "t0" in tasks, lambda: dict(tasks)):
        with pytest.raises(TasksNotShown):
            read()
    assert tasks == tasks and tasks != {} and repr(tasks) == "UnreadTasks('peeks')"
