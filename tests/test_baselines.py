"""The three baseline schedulers: SPF, Parrot-FCFS and Autellix-LAS (topas/policies/{spf,parrot,
autellix}.py), specified by hand-built EngineViews whose admission order is worked out in the
comments, plus an end-to-end run of each in the simulator and the parameter plumbing."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topas.engine.cost import CostModel, load_profile
from topas.engine.simulator import simulate
from topas.engine.view import EngineView, PrefixView, RequestView, StageView, TaskView
from topas.policies import PolicyError, available_policies, make_policy
from topas.policies.estimates import OperatingPoint, OutputEstimator, stage_residual_time
from topas.policies.spf import expected_remaining_path
from topas.workload.critical_path import longest_remaining_path
from topas.workload.model import Agent, Stage, Task, Trace

# A tiny engine with round numbers: prefill costs 1 ms per new token (no fixed or attention
# terms), one decode step costs 10 ms whatever the batch. So a stage with x input tokens and an
# expected y output tokens has an expected residual of 0.001 * x + 0.01 * y seconds.
COST = CostModel(
    name="tiny",
    kv_budget_tokens=100_000,
    kv_bytes_per_token=1.0,
    swap_bandwidth=1e9,
    swap_latency=0.0,
    prefill_c0=0.0,
    prefill_c_new=0.001,
    prefill_c_new_cached=0.0,
    prefill_c_new_sq=0.0,
    decode_c0=0.01,
    decode_c_batch=0.0,
    decode_c_kv=0.0,
)

CHAIN3 = (("A", ()), ("B", ("A",)), ("C", ("B",)))
DAG4 = (("A", ()), ("B", ("A",)), ("C", ("A",)), ("D", ("B", "C")))
SINGLE = (("A", ()),)


def task_view(tid, arrival, shape, agents, done=(), x=100, topo=None, observed=None):
    """A TaskView: ``shape`` = ((stage, parents), ...) in declaration order, ``agents`` maps
    stage -> agent; ``topo`` overrides the topological order."""
    kids = {s: tuple(c for c, ps in shape if s in ps) for s, _ in shape}
    stages = {s: StageView(s, agents[s], x, tuple(ps), kids[s]) for s, ps in shape}
    return TaskView(
        id=tid,
        arrival=arrival,
        workflow="test",
        stages=stages,
        topo_order=tuple(topo or (s for s, _ in shape)),
        done=frozenset(done),
        observed_output=dict(observed or {}),
    )


def req(tid, sid, agent, ready, generated=0, service=0.0, x=100, running=False):
    return RequestView(
        rid=f"{tid}/{sid}",
        task_id=tid,
        stage_id=sid,
        agent=agent,
        input_tokens=x,
        generated=generated,
        ready_time=ready,
        kv_tokens=x + generated if running else 0,
        service_time=service,
        preemptions=0,
        admitted_time=ready if running else None,
    )


def engine_view(time, priors, tasks, waiting, running=(), resident=()):
    """An EngineView over agents with output priors ``priors`` (agent -> tokens)."""
    prefixes = {a: PrefixView(a, 1000, float(y), a in resident, False, 0, -1.0) for a, y in priors.items()}
    return EngineView(
        time=time,
        kv_budget=COST.kv_budget_tokens,
        prefix_tokens=sum(1000 for a in priors if a in resident),
        request_tokens=sum(r.kv_tokens for r in running),
        prefixes=prefixes,
        running=tuple(running),
        waiting=tuple(waiting),
        tasks={t.id: t for t in tasks},
        cost=COST,
        decode_batch=len(running),
    )


def admit(policy, view):
    d = policy.decide(view)
    assert not (d.preempt or d.evict or d.load)  # baselines leave prefixes to the engine
    return list(d.admit)


# ---------------------------------------------------------------------------------------- SPF
def test_spf_picks_the_task_with_the_shortest_expected_remaining_path():
    # Priors 100 tokens for every agent: a stage takes 0.1 s of prefill + 100 * 0.01 s = 1.1 s.
    # t1 (arrived first) has all three stages of its chain left: 3 * 1.1 = 3.3 s.
    # t2 has only C left: 1.1 s. Shortest remaining first: t2/C, then t1/A.
    priors = {"a": 100, "b": 100, "c": 100}
    ag = {"A": "a", "B": "b", "C": "c"}
    t1 = task_view("t1", 0.0, CHAIN3, ag)
    t2 = task_view("t2", 1.0, CHAIN3, ag, done=("A", "B"))
    view = engine_view(5.0, priors, [t1, t2], [req("t1", "A", "a", 0.0), req("t2", "C", "c", 4.0)])
    spf = make_policy("spf")
    assert spf.task_paths(view) == pytest.approx({"t1": 3.3, "t2": 1.1})
    assert admit(spf, view) == ["t2/C", "t1/A"]


def test_spf_uses_the_longest_path_not_the_total_remaining_work():
    # t1 is DAG-4 with A done; B (agent b, prior 500) and C (prior 100) wait, D (prior 100) is
    # pending. z_B = 0.1 + 5.0 = 5.1, z_C = z_D = 1.1: longest path = z_B + z_D = 6.2 s, while its
    # total remaining work is 5.1 + 1.1 + 1.1 = 7.3 s.
    # t2 (arrived later) is one stage of agent e (prior 640): 0.1 + 6.4 = 6.5 s.
    # By critical path t1 (6.2) goes first; by total work t2 (6.5 < 7.3) would. Within t1, B and
    # C have the same task key and go in topological order.
    priors = {"a": 100, "b": 500, "c": 100, "d": 100, "e": 640}
    t1 = task_view("t1", 0.0, DAG4, {"A": "a", "B": "b", "C": "c", "D": "d"}, done=("A",))
    t2 = task_view("t2", 1.0, SINGLE, {"A": "e"})
    waiting = [req("t2", "A", "e", 1.0), req("t1", "C", "c", 2.0), req("t1", "B", "b", 2.0)]
    view = engine_view(3.0, priors, [t1, t2], waiting)
    spf = make_policy("spf")
    assert spf.task_paths(view) == pytest.approx({"t1": 6.2, "t2": 6.5})
    assert admit(spf, view) == ["t1/B", "t1/C", "t2/A"]


def test_spf_conditions_running_and_waiting_stages_on_generated_tokens():
    # t1 as above, but B is running and has generated 200 of its expected 500 tokens: its residual
    # is E[Y - 200 | Y > 200] = 300 tokens = 3.0 s (a running request's prefill is done), so the
    # path is max(3.0, z_C = 1.1) + z_D = 4.1 s. t2 is a retracted stage that generated 600 of
    # its expected 640: recompute 100 + 600 tokens of prefill (0.7 s) + 40 tokens (0.4 s) = 1.1 s.
    priors = {"a": 100, "b": 500, "c": 100, "d": 100, "e": 640}
    t1 = task_view("t1", 0.0, DAG4, {"A": "a", "B": "b", "C": "c", "D": "d"}, done=("A",))
    t2 = task_view("t2", 1.0, SINGLE, {"A": "e"})
    running = [req("t1", "B", "b", 2.0, generated=200, service=2.5, running=True)]
    waiting = [req("t1", "C", "c", 2.0), req("t2", "A", "e", 1.0, generated=600, service=7.0)]
    view = engine_view(10.0, priors, [t1, t2], waiting, running=running)
    spf = make_policy("spf")
    assert spf.task_paths(view) == pytest.approx({"t1": 4.1, "t2": 1.1})
    assert admit(spf, view) == ["t2/A", "t1/C"]


def test_spf_equals_srpt_on_chains():
    # On Chain-3 the longest remaining path is the sum of the remaining stages' expected times,
    # i.e. the task's expected remaining processing time: SPF orders exactly as SRPT would.
    rng = np.random.default_rng(7)
    priors = {"a": 120, "b": 300, "c": 60}
    ag = {"A": "a", "B": "b", "C": "c"}
    tasks, waiting = [], []
    for k in range(12):
        done = ("A", "B", "C")[: int(rng.integers(0, 3))]
        sid = "ABC"[len(done)]
        tasks.append(task_view(f"t{k:02d}", float(k), CHAIN3, ag, done=done))
        waiting.append(req(f"t{k:02d}", sid, ag[sid], float(k) + 0.5, generated=int(rng.integers(0, 50))))
    view = engine_view(20.0, priors, tasks, waiting)
    spf = make_policy("spf")
    est, op = OutputEstimator(), OperatingPoint.of(view)
    srpt = {}
    for t, r in zip(tasks, waiting):
        rest = [s for s in t.topo_order if s not in t.done]
        srpt[t.id] = sum(
            stage_residual_time(view, est, op, t.stages[s], r.generated if s == r.stage_id else 0) for s in rest
        )
    assert spf.task_paths(view) == pytest.approx(srpt)
    expected = sorted(waiting, key=lambda r: (srpt[r.task_id], view.tasks[r.task_id].arrival))
    assert admit(spf, view) == [r.rid for r in expected]


def test_spf_estimate_learns_from_observed_outputs():
    # Agent x's prior is 100 tokens (1.1 s), agent y's 300 (3.1 s): t1 (x) goes first.
    # After three x calls are observed producing 1000 tokens each, E[Y_x] = (100 + 3000) / 4 =
    # 775 tokens -> 0.1 + 7.75 = 7.85 s > 3.1 s, so t2 (y) goes first.
    priors = {"x": 100, "y": 300}
    t1 = task_view("t1", 0.0, SINGLE, {"A": "x"})
    t2 = task_view("t2", 1.0, SINGLE, {"A": "y"})
    view = engine_view(2.0, priors, [t1, t2], [req("t1", "A", "x", 0.0), req("t2", "A", "y", 1.0)])
    spf = make_policy("spf")
    assert admit(spf, view) == ["t1/A", "t2/A"]
    for k in range(3):
        spf.on_finish(req(f"old{k}", "A", "x", 0.0, generated=1000, service=10.0), 1.0, 1000)
    assert spf.task_paths(view) == pytest.approx({"t1": 7.85, "t2": 3.1})
    assert admit(spf, view) == ["t2/A", "t1/A"]
    spf.reset()  # a new run forgets the observations
    assert admit(spf, view) == ["t1/A", "t2/A"]


def test_spf_ties_by_arrival_then_topological_position():
    # Identical remaining paths (same stages, same priors): earlier task first; within a task, the
    # topological order given by the view (here C before B), not the request id.
    priors = {"a": 100, "b": 100, "c": 100, "d": 100}
    ag = {"A": "a", "B": "b", "C": "c", "D": "d"}
    t1 = task_view("t1", 0.0, DAG4, ag, done=("A",), topo=("A", "C", "B", "D"))
    t2 = task_view("t2", 1.0, DAG4, ag, done=("A",))
    waiting = [req("t2", "B", "b", 3.0), req("t2", "C", "c", 3.0), req("t1", "B", "b", 2.0), req("t1", "C", "c", 2.0)]
    view = engine_view(4.0, priors, [t1, t2], waiting)
    assert admit(make_policy("spf"), view) == ["t1/C", "t1/B", "t2/B", "t2/C"]


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_spf_walks_only_the_unfinished_stages_and_gets_the_whole_dags_longest_path(data):
    # A random DAG (each stage's parents among the earlier ones), a finished set closed under
    # parents, some of the ready stages running with tokens generated: the path SPF computes over
    # the unfinished stages is, to the bit, the longest path of the whole DAG with the finished
    # stages taking no time.
    n = data.draw(st.integers(1, 9))
    names = [f"S{i}" for i in range(n)]
    shape = tuple((names[i], tuple(sorted(data.draw(st.sets(st.sampled_from(names[:i]), max_size=3))) if i else ()))
                  for i in range(n))
    done: set[str] = set()
    for s, ps in shape:
        if set(ps) <= done and data.draw(st.booleans()):
            done.add(s)
    agents = {s: data.draw(st.sampled_from("abc")) for s, _ in shape}
    tv = task_view("t1", 0.0, shape, agents, done=done, x=data.draw(st.integers(1, 3000)))
    ready = {s: (data.draw(st.integers(0, 400)), data.draw(st.booleans()))
             for s, ps in shape if s not in done and set(ps) <= done}
    priors = {a: data.draw(st.integers(1, 900)) for a in "abc"}
    waiting = [req("t1", s, agents[s], 0.0, g) for s, (g, running) in ready.items() if not running]
    running = [req("t1", s, agents[s], 0.0, g, running=True) for s, (g, running) in ready.items() if running]
    view = engine_view(1.0, priors, [tv], waiting or [req("t1", names[0], agents[names[0]], 0.0)], running)
    est, op = OutputEstimator(), OperatingPoint.of(view)

    def time_of(s):
        g, is_running = ready.get(s, (0, False))
        if is_running:
            return est.expected_remaining(agents[s], priors[agents[s]], g) * op.tpot
        return stage_residual_time(view, est, op, tv.stages[s], g)

    kids = {s: tv.stages[s].children for s in names}
    assert expected_remaining_path(view, tv, est, op, ready) == longest_remaining_path(tv.topo_order, kids, time_of,
                                                                                        zero=done)


# ---------------------------------------------------------------------------------- Parrot-FCFS
def _parrot_view():
    # t1 (arrival 0): DAG-4, A done, B (agent b) and C (agent c) waiting; its topological order
    #                 lists C before B.
    # t2 (arrival 1): A (agent a) waiting.
    # t3 (arrival 2): DAG-4, A done, B (b) and C (c) waiting.
    ag = {"A": "a", "B": "b", "C": "c", "D": "d"}
    t1 = task_view("t1", 0.0, DAG4, ag, done=("A",), topo=("A", "C", "B", "D"))
    t2 = task_view("t2", 1.0, DAG4, ag)
    t3 = task_view("t3", 2.0, DAG4, ag, done=("A",))
    waiting = [  # deliberately not in any meaningful order
        req("t3", "C", "c", 5.0), req("t2", "A", "a", 1.0), req("t1", "B", "b", 3.0),
        req("t3", "B", "b", 5.0), req("t1", "C", "c", 3.0),
    ]
    return engine_view(6.0, {a: 100 for a in "abcd"}, [t1, t2, t3], waiting)


def test_parrot_orders_by_task_arrival_then_dag_order():
    # Application-level FIFO (no grouping): t1 before t2 before t3 although t2/A became ready
    # first; within t1 the DAG order C, B; within t3 B, C.
    p = make_policy("parrot-fcfs", group_prefixes=False)
    assert admit(p, _parrot_view()) == ["t1/C", "t1/B", "t2/A", "t3/B", "t3/C"]


def test_parrot_groups_requests_of_the_same_agent_prefix():
    # FIFO order is t1/C, t1/B, t2/A, t3/B, t3/C. Grouping by agent, groups ordered by their
    # earliest request: c (t1/C, then t3/C pulled forward), b (t1/B, t3/B), a (t2/A).
    p = make_policy("parrot-fcfs")
    assert admit(p, _parrot_view()) == ["t1/C", "t3/C", "t1/B", "t3/B", "t2/A"]


# --------------------------------------------------------------------------------- Autellix-LAS
def _finish(p, tid, sid, agent, ready, service, end):
    """Show ``p`` a call waiting (so it inherits its task's scalar), then report it finished."""
    r = req(tid, sid, agent, ready)
    p.priority(r)  # first sight: the call inherits the task's current scalar
    p.on_finish(req(tid, sid, agent, ready, generated=10, service=service), end, 10)


def test_autellix_queue_ranges_are_geometric():
    p = make_policy("autellix-las")  # K = 4, first queue 4 s, growth 4
    assert p.queue_ranges() == [(0.0, 4.0), (4.0, 16.0), (16.0, 64.0), (64.0, math.inf)]
    assert [p.queue_of(v) for v in (0.0, 3.99, 4.0, 15.9, 16.0, 63.9, 64.0, 1e9)] == [0, 0, 1, 1, 2, 2, 3, 3]
    q = make_policy("autellix-las", num_queues=3, first_queue_s=2.0, queue_growth=3.0)
    assert q.queue_ranges() == [(0.0, 2.0), (2.0, 6.0), (6.0, math.inf)]


def test_autellix_calls_inherit_the_task_critical_path_service():
    p = make_policy("autellix-las")
    # DAG-4 task t1. A inherits 0 and runs 10 s: service = max(0, 0 + 10) = 10.
    _finish(p, "t1", "A", "a", ready=0.0, service=10.0, end=10.0)
    assert p.task_service("t1") == 10.0
    # B and C both become ready now and inherit 10 (queue Q_2 = [4, 16)).
    b, c = req("t1", "B", "b", 10.0), req("t1", "C", "c", 10.0)
    assert (p.priority(b), p.priority(c)) == (10.0, 10.0)
    assert (p.level(b), p.level(c)) == (1, 1)
    # C runs 7 s: service = max(10, 10 + 7) = 17; then B runs 3 s: max(17, 10 + 3) = 17.
    p.on_finish(req("t1", "C", "c", 10.0, service=7.0), 17.0, 10)
    p.on_finish(req("t1", "B", "b", 10.0, service=3.0), 17.5, 10)
    assert p.task_service("t1") == 17.0
    # D inherits the longest observed path, 17 s: queue Q_3 = [16, 64).
    d = req("t1", "D", "d", 17.5)
    assert p.priority(d) == 17.0 and p.level(d) == 2
    # Another task is unaffected.
    assert p.task_service("t2") == 0.0


def _autellix_setup():
    p = make_policy("autellix-las")
    # t1: its first call ran 10 s (ready 0, finished 10: no waiting) -> scalar 10 (Q_2).
    # t4: its first call ran 12 s (ready 0, finished 12) -> scalar 12 (Q_2).
    _finish(p, "t1", "A", "a", ready=0.0, service=10.0, end=10.0)
    _finish(p, "t4", "A", "a", ready=0.0, service=12.0, end=12.0)
    tasks = [task_view(t, 0.0, CHAIN3, {"A": "a", "B": "b", "C": "c"}, done=d)
             for t, d in (("t1", "A"), ("t2", ""), ("t3", ""), ("t4", "A"))]
    waiting = [
        req("t1", "B", "b", 5.0),   # Q_2 (priority 10)
        req("t2", "A", "a", 20.0),  # Q_1 (new task, priority 0)
        req("t3", "A", "a", 8.0),   # Q_1
        req("t4", "B", "b", 3.0),   # Q_2 (priority 12)
    ]
    return p, tasks, waiting


def test_autellix_bins_into_queues_fcfs_within_a_queue():
    # At t = 21 nobody is starving (t1/B: wait 16 / service 10 = 1.6 < 4; t4/B: 18 / 12 = 1.5).
    # Q_1 first, by ready time: t3/A (8), t2/A (20); then Q_2 by ready time: t4/B (3), t1/B (5).
    p, tasks, waiting = _autellix_setup()
    view = engine_view(21.0, {"a": 100, "b": 100, "c": 100}, tasks, waiting)
    assert admit(p, view) == ["t3/A", "t2/A", "t4/B", "t1/B"]


def test_autellix_promotes_a_starving_call_to_the_first_queue():
    p, tasks, waiting = _autellix_setup()
    priors = {"a": 100, "b": 100, "c": 100}
    t1b = waiting[0]
    # Just below the threshold: t1/B has waited 39.9 s against 10 s of task service (3.99).
    assert p.starvation_ratio(t1b, 44.9) == pytest.approx(3.99)
    assert admit(p, engine_view(44.9, priors, tasks, waiting)) == ["t3/A", "t2/A", "t4/B", "t1/B"]
    # At t = 45: (0 + 40) / (10 + 0) = 4 >= beta -> t1/B moves to Q_1, where it is first by ready
    # time (5 < 8). t4/B: 42 / 12 = 3.5 stays in Q_2.
    assert admit(p, engine_view(45.0, priors, tasks, waiting)) == ["t1/B", "t3/A", "t2/A", "t4/B"]
    # The promoted call's own wait and service restart from zero: at t = 46 its ratio is 1 / 10.
    assert p.starvation_ratio(t1b, 46.0) == pytest.approx(0.1)
    assert p.level(t1b) == 0
    # Its task's critical path still counts from the inherited priority: 10 + 3 s of execution.
    p.on_finish(req("t1", "B", "b", 5.0, service=3.0), 49.0, 10)
    assert p.task_service("t1") == 13.0


def test_autellix_demotes_a_retracted_call_by_its_attained_service():
    # t5/A (new task, priority 0) ran 5 s before the engine retracted it: 0 + 5 >= 4, so it is
    # back in Q_2 and goes after t6/A, a fresh Q_1 call that became ready later.
    p = make_policy("autellix-las")
    tasks = [task_view(t, 0.0, SINGLE, {"A": "a"}) for t in ("t5", "t6")]
    first = engine_view(1.0, {"a": 100}, tasks, [req("t5", "A", "a", 1.0)])
    assert admit(p, first) == ["t5/A"]
    retracted = req("t5", "A", "a", 1.0, generated=300, service=5.0)
    p.on_preempt(retracted, 6.0, by_engine=True)
    view = engine_view(6.5, {"a": 100}, tasks, [retracted, req("t6", "A", "a", 2.0)])
    assert p.level(retracted) == 1
    assert admit(p, view) == ["t6/A", "t5/A"]


def test_autellix_forgets_finished_tasks():
    p = make_policy("autellix-las")
    _finish(p, "t1", "A", "a", ready=0.0, service=10.0, end=10.0)
    view = engine_view(11.0, {"a": 100}, [task_view("t2", 0.0, SINGLE, {"A": "a"})], [req("t2", "A", "a", 0.0)])
    admit(p, view)  # t1 is no longer active
    assert p.task_service("t1") == 0.0


def test_autellix_orders_by_each_calls_level_after_its_promotion(monkeypatch):
    # decide() takes each waiting call's queue once, after its promotion if it is promoted: the
    # order it returns is, at every decision of a run under pressure (calls promoted, retracted,
    # demoted), the order by level() read after the promotions, then ready time, then id.
    from topas.policies import autellix

    decide = autellix.AutellixLAS.decide
    checked = []

    def checking(self, view):
        d = decide(self, view)
        by_id = {r.rid: r for r in view.waiting}
        expected = sorted(view.waiting, key=lambda r: (self.level(r), r.ready_time, r.rid))
        assert [by_id[rid] for rid in d.admit] == expected
        checked.append((sum(self.level(r) > 0 for r in view.waiting),
                        sum(self._calls[r.rid].promotions for r in view.waiting)))
        return d

    monkeypatch.setattr(autellix.AutellixLAS, "decide", checking)
    policy = make_policy("autellix-las", {"first_queue_s": 0.05, "beta_starve": 0.5})
    simulate(_dag4_trace(), policy, load_profile("a100-80gb_qwen2.5-32b").with_budget(12_000))
    assert len(checked) > 50
    assert sum(low for low, _ in checked) > 0  # calls below the first queue were ordered
    assert sum(promoted for _, promoted in checked) > 0  # and promoted calls


# ------------------------------------------------------------------------------- end to end
def _dag4_trace(n=50, seed=3):
    """~50 DAG-4 tasks with varied output lengths, built from the workload model directly."""
    rng = np.random.default_rng(seed)
    agents = {f"d.{s}": Agent(f"d.{s}", prefix_tokens=2048, expected_output_tokens=128.0) for s in "ABCD"}
    arrivals = np.concatenate(([0.0], np.cumsum(rng.exponential(1 / 0.3, size=n - 1))))
    tasks = []
    for k in range(n):
        stages = tuple(
            Stage(id=s, agent=f"d.{s}", input_tokens=int(rng.integers(200, 800)),
                  output_tokens=int(rng.integers(16, 256)), parents=tuple(ps))
            for s, ps in DAG4
        )
        tasks.append(Task(id=f"t{k:03d}", arrival=round(float(arrivals[k]), 6), stages=stages, workflow="dag-4"))
    return Trace(name="test-dag4", agents=agents, tasks=tuple(tasks))


@pytest.mark.parametrize("name", ["spf", "parrot-fcfs", "autellix-las"])
def test_each_baseline_completes_every_task(name):
    trace = _dag4_trace()
    cost = load_profile("a100-80gb_qwen2.5-32b").with_budget(12_000)  # memory pressure
    res = simulate(trace, make_policy(name), cost)
    assert len(res.tasks) == 50
    assert res.tasks["finish"].notna().all() and (res.tasks["jct"] > 0).all()
    assert res.requests["finish"].notna().all() and len(res.requests) == 200
    # deterministic: the same run again gives the same summary
    again = simulate(trace, make_policy(name), cost)
    assert again.deterministic_summary() == res.deterministic_summary()


# ------------------------------------------------------------------------------- parameters
def test_baselines_are_registered():
    assert {"spf", "parrot-fcfs", "autellix-las"} <= set(available_policies())


def test_string_parameters_are_coerced():
    a = make_policy("autellix-las", beta_starve="2.0", num_queues="6")
    assert a.params.beta_starve == 2.0 and a.params.num_queues == 6
    assert make_policy("spf", prior_weight="3").params.prior_weight == 3
    assert make_policy("parrot-fcfs", group_prefixes="false").params.group_prefixes is False


def test_unknown_parameter_is_refused_naming_the_valid_ones():
    with pytest.raises(PolicyError, match="num_queues, first_queue_s, queue_growth, beta_starve"):
        make_policy("autellix-las", beta=2.0)
    with pytest.raises(PolicyError, match="prior_weight"):
        make_policy("spf", weight=1)
    with pytest.raises(PolicyError, match="group_prefixes"):
        make_policy("parrot-fcfs", grouping=True)


@pytest.mark.parametrize("bad", [{"num_queues": 0}, {"first_queue_s": 0.0}, {"queue_growth": 1.0},
                                 {"beta_starve": 0.0}])
def test_autellix_rejects_meaningless_values(bad):
    with pytest.raises(PolicyError, match=next(iter(bad))):
        make_policy("autellix-las", **bad)
