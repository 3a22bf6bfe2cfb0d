"""The SGLang adapter (no SGLang needed): the same policy sees the same EngineView and makes the
same decisions through the adapter as inside the simulator.

A simulator subclass mirrors its state into :class:`topas.sglang.adapter.Snapshot` s at every
decision point (what the plugin copies out of SGLang's scheduler) and drives an Adapter with a
second, fresh policy object of the same class and parameters. At every decision the adapter's
view must equal the simulator's and the admission, preemption and pin actions must match.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from conftest import kept_view
from topas.engine.config import EngineConfig
from topas.engine.cost import load_profile
from topas.engine.simulator import Simulator
from topas.engine.view import Decision
from topas.policies.base import make_policy
from topas.sglang.adapter import Adapter, ReqSnap, RequestMeta, Snapshot, meta_from_custom_params
from topas.sglang.tokens import prefix_ids, request_ids
from topas.workload.arrivals import retime
from topas.workload.synthetic import dag4, chain3, scaled_down


def _meta(sim, r) -> RequestMeta:
    t = r.task.task
    return RequestMeta(
        run="run0", t0=0.0, task=t.id, stage=r.stage.id, workflow=t.workflow, arrival=t.arrival,
        ready=r.ready_time, dag=tuple((s.id, s.agent, s.input_tokens, s.parents) for s in t.stages),
        agents=tuple((a.name, a.prefix_tokens, a.expected_output_tokens) for a in sim.trace.agents.values()),
    )


def _rounded(view):
    """The view with service times rounded: the two engines sum the same intervals in another order."""
    def r(v):
        return dataclasses.replace(v, service_time=round(v.service_time, 9))
    return dataclasses.replace(view, running=tuple(map(r, view.running)), waiting=tuple(map(r, view.waiting)))


class Mirror(Simulator):
    """Runs the simulator and, at each decision, the adapter on a snapshot of the same state."""

    def __init__(self, trace, policy, twin, cost, config, knowledge=None):
        super().__init__(trace, policy, cost, config, knowledge)
        self.adapter = Adapter(twin, cost, recheck_steps=10**9)
        self._finished: list[tuple[str, int, float]] = []
        self.admissions: list[tuple[str, ...]] = []
        self.compared = 0
        orig = policy.decide

        def capture(view):
            self._sim_view = kept_view(view)
            self._sim_decision = orig(view)
            return self._sim_decision

        policy.decide = capture
        policy.reads_tasks = True  # the adapter's view shows the tasks: compared whole

    def stage_finished(self, r, view):
        self._finished.append((r.rid, r.y, self.now))
        super().stage_finished(r, view)

    def requeue(self, r, view, by_engine):
        assert not by_engine, "this scenario must not retract (the mirror reports only policy preemptions)"
        super().requeue(r, view, by_engine)

    def _decide(self):
        snap = Snapshot(
            now=self.now,
            # (the plugin computes each reservation from SGLang's own state, Controller.reserve)
            waiting=tuple(ReqSnap(rid, _meta(self, r), r.generated, 0, self.batch.reserve(r))
                          for rid, r in self.waiting.items()),
            running=tuple(ReqSnap(r.rid, _meta(self, r), r.generated, r.kv, self.batch.reserve(r))
                          for r in self.batch.running()),
            kv_budget=self.memory.budget, finished=tuple(self._finished),
            # what SGLang's radix tree holds: a prefix being computed is not in it yet
            cached=frozenset(a for a, p in self.memory.prefixes.items()
                             if p.resident and p.prefill_left == 0 and a not in self.memory.computing),
            host=frozenset(a for a, p in self.memory.prefixes.items() if p.on_host),
            n_decoding=len(self.batch.decoding),
        )
        self._finished = []
        acts = self.adapter.step(snap, force=True)
        before = set(self.waiting)
        super()._decide()
        sim_view, d = self._sim_view, self._sim_decision
        assert acts.fallback is None
        assert _rounded(self.adapter.last_view) == _rounded(sim_view)
        assert acts.admit == d.admit  # SGLang rids are the policy rids here
        assert acts.preempt == d.preempt
        admitted = tuple(rid for rid in d.admit if rid in before and rid not in self.waiting)
        self.adapter.on_admitted(admitted, self.now)
        self.admissions.append(admitted)
        self.compared += 1


CASES = [
    ("fcfs", {}), ("lpm", {}), ("spf", {}), ("parrot-fcfs", {}), ("autellix-las", {}),
    ("topas", {}), ("topas", {"beta": 0.5}), ("topas-base", {}), ("topas-plus", {}),
]


@pytest.mark.parametrize("policy,params", CASES, ids=[f"{p}{q or ''}" for p, q in CASES])
@pytest.mark.parametrize("workload", ["chain-3", "dag-4"])
def test_same_admission_sequence_as_the_simulator(policy, params, workload):
    gen = {"chain-3": chain3, "dag-4": dag4}[workload]
    # a deterministic arrival script: 12 tasks, Poisson arrivals (seed 3), a budget with room for
    # every prefix and a batch (no engine retraction, which the mirror does not report)
    trace = retime(gen(n_tasks=12, prefix_tokens=1024, input_tokens=256, output_tokens=64), rate=2.0, seed=3)
    cost = load_profile().with_budget(200_000)
    sim_policy, twin = make_policy(policy, params), make_policy(policy, params)
    m = Mirror(trace, sim_policy, twin, cost, EngineConfig())
    res = m.run()
    assert res.summary["n_tasks"] == 12
    assert m.compared == len(res.decisions) > 5
    assert sum(len(a) for a in m.admissions) >= trace.num_requests


def test_metadata_round_trip_and_plain_requests():
    trace = scaled_down("dag-4", 2)
    t = trace.tasks[0]
    meta = RequestMeta(run="r", t0=1.5, task=t.id, stage="B", workflow=t.workflow, arrival=0.25, ready=0.5,
                       dag=tuple((s.id, s.agent, s.input_tokens, s.parents) for s in t.stages),
                       agents=tuple((a.name, a.prefix_tokens, a.expected_output_tokens) for a in trace.agents.values()),
                       policy="topas", params=(("beta", 0.5),))
    back = meta_from_custom_params({"topas": meta.to_json()})
    assert back == meta and back.rid == f"{t.id}/B" and back.agent == "dag4.B"
    assert "output" not in meta.to_json()  # y_v is never sent
    assert meta_from_custom_params(None) is None and meta_from_custom_params({"other": 1}) is None
    with pytest.raises(ValueError):
        meta_from_custom_params({"topas": "{not json"})


def test_token_ids_share_exactly_the_agent_prefix():
    a1 = request_ids("dag4.A", 100, "run", 0, "t0", "A", 20)
    a2 = request_ids("dag4.A", 100, "run", 1, "t1", "A", 20)
    b = request_ids("dag4.B", 100, "run", 2, "t0", "B", 20)
    common = next(k for k, (x, y) in enumerate(zip(a1, a2)) if x != y)
    assert common == 100 and a1[:100] == prefix_ids("dag4.A", 100)
    assert b[0] != a1[0] and len(a1) == 120
    assert request_ids("dag4.A", 100, "run", 0, "t0", "A", 20) == a1  # deterministic


def _snap(now, waiting=(), running=(), finished=(), budget=4096):
    return Snapshot(now=now, waiting=tuple(waiting), running=tuple(running), kv_budget=budget, finished=tuple(finished))


def _req_meta(trace, task, stage, ready, policy=None):
    t = next(x for x in trace.tasks if x.id == task)
    return RequestMeta(run="r1", t0=100.0, task=task, stage=stage, workflow=t.workflow, arrival=t.arrival,
                       ready=ready, dag=tuple((s.id, s.agent, s.input_tokens, s.parents) for s in t.stages),
                       agents=tuple((a.name, a.prefix_tokens, a.expected_output_tokens) for a in trace.agents.values()),
                       policy=policy)


def test_decides_only_at_events_and_restricts_admission_between():
    trace = scaled_down("chain-3", 2, rate=10.0)
    ad = Adapter(make_policy("fcfs"), load_profile(), recheck_steps=3)
    m0 = _req_meta(trace, "t00000", "A", 0.0)
    a = ad.step(_snap(100.0, [ReqSnap("e0", m0)]))
    assert a.decided and a.restrict and a.admit == ("e0",)
    # nothing changed: no new decision, nothing may be admitted
    a = ad.step(_snap(100.1, [ReqSnap("e0", m0)]))
    assert not a.decided and a.restrict and a.admit == ()
    a = ad.step(_snap(100.2, [ReqSnap("e0", m0)]))
    assert not a.decided
    a = ad.step(_snap(100.3, [ReqSnap("e0", m0)]))  # recheck_steps reached
    assert a.decided and a.admit == ("e0",)
    ad.on_admitted(["e0"], 100.3)
    # a plain request (no metadata) is invisible to the policy; an empty queue needs no decision
    a = ad.step(_snap(100.4, [ReqSnap("plain", None)], [ReqSnap("e0", m0, 1, 33)]))
    assert not a.restrict and not a.decided
    # finishing A makes the task's state advance; B's arrival is a decision point
    m1 = _req_meta(trace, "t00000", "B", 0.5)
    a = ad.step(_snap(100.6, [ReqSnap("e1", m1)], [], finished=[("e0", 8, 100.5)]))
    assert a.decided and a.admit == ("e1",)
    tv = ad.view(_snap(100.6, [ReqSnap("e1", m1)]), 0.6).tasks["t00000"]
    assert tv.done == {"A"} and tv.observed_output == {"A": 8}


def test_a_prefix_in_use_is_in_the_tree_only_when_the_probe_finds_it():
    # LPM matches only what the radix tree holds: the plugin probes every agent it knows, also one
    # a running request uses (resident anyway, but its prefill may not have reached the tree)
    trace = scaled_down("chain-3", 2, rate=10.0)
    ad = Adapter(make_policy("lpm"), load_profile())
    m0, m1 = _req_meta(trace, "t00000", "A", 0.0), _req_meta(trace, "t00001", "A", 0.1)
    ad.step(_snap(100.0, [ReqSnap("e0", m0)]))
    ad.on_admitted(["e0"], 100.0)
    agent = m0.dag[0][1]
    for in_tree in (False, True):
        snap = dataclasses.replace(_snap(100.2, [ReqSnap("e1", m1)], [ReqSnap("e0", m0, 0, 40)]),
                                   probe=lambda a, hit=in_tree: hit and a == agent)
        assert agent in ad.probe_agents()
        p = ad.view(snap, 0.2).prefixes[agent]
        assert p.resident and p.in_tree == in_tree


def test_a_managing_policy_sees_the_tree_too_computing_and_reservations():
    """TOPAS (which manages prefixes) reads the radix tree through the same probe: a prefix its
    pin holds but a running request is still computing is resident, not in the tree and
    ``computing`` (its in-batch guard admits none of the agent's requests then); once the probe
    finds it, it is in the tree; an unpinned prefix the tree still holds is ``cached``. Each
    request's ``reserve`` is what the snapshot says the engine reserves."""
    from topas.engine.view import PrefixView, RequestView

    trace = scaled_down("chain-3", 2, rate=10.0)
    ad = Adapter(make_policy("topas"), load_profile())
    m0, m1 = _req_meta(trace, "t00000", "A", 0.0), _req_meta(trace, "t00001", "A", 0.1)
    agent = m0.dag[0][1]
    ad.step(_snap(100.0, [ReqSnap("e0", m0, 0, 0, 16)]))
    ad.on_admitted(["e0"], 100.0)
    assert agent in ad.pinned
    for found in (False, True):
        snap = dataclasses.replace(_snap(100.2, [ReqSnap("e1", m1, 0, 0, 16)], [ReqSnap("e0", m0, 1, 41, 15)]),
                                   probe=lambda a, hit=found: hit and a == agent)
        v = ad.view(snap, ad.observe(snap))
        p = v.prefixes[agent]
        assert p.resident and p.refcount == 1 and p.in_tree == found
        if "computing" in PrefixView.__dataclass_fields__:
            assert p.computing == (not found)
        if "reserve" in RequestView.__dataclass_fields__:
            assert (v.waiting[0].reserve, v.running[0].reserve) == (16, 15)
    # a locked pin (Snapshot.cached) is in the tree without a probe
    assert ad.view(_snap(100.2, [ReqSnap("e1", m1)], [ReqSnap("e0", m0, 1, 41)]), 0.2).prefixes[agent].in_tree is False
    snap = dataclasses.replace(_snap(100.2, [ReqSnap("e1", m1)], [ReqSnap("e0", m0, 1, 41)]),
                               cached=frozenset({agent}), probe=lambda a: False)
    assert ad.view(snap, 0.2).prefixes[agent].in_tree
    # unpinned and idle, but still in the tree: cached (a load re-pins it for free)
    ad.pinned.discard(agent)
    snap = dataclasses.replace(_snap(100.3, [ReqSnap("e1", m1)]), probe=lambda a: a == agent)
    p = ad.view(snap, 0.3).prefixes[agent]
    assert not p.resident and p.cached and not p.in_tree


def test_a_prefix_entering_the_tree_is_a_decision_point():
    """Requests waiting on a prefix that is not in the tree are re-decided as soon as the probe
    finds it there (the simulator's ``recheck_on_insert``), not only at the next event or after
    ``recheck_steps`` iterations."""
    trace = scaled_down("chain-3", 2, rate=10.0)
    m0, m1 = _req_meta(trace, "t00000", "A", 0.0), _req_meta(trace, "t00001", "A", 0.1)
    agent = m0.dag[0][1]
    for on in (True, False):
        ad = Adapter(make_policy("fcfs"), load_profile(), recheck_steps=100, recheck_on_insert=on)
        ad.step(_snap(100.0, [ReqSnap("e0", m0)]))
        ad.on_admitted(["e0"], 100.0)
        state = {"in": False}
        probe = lambda a: state["in"] and a == agent  # noqa: E731
        a = ad.step(dataclasses.replace(_snap(100.1, [ReqSnap("e1", m1)], [ReqSnap("e0", m0, 0, 40)]), probe=probe))
        assert a.decided and ad.held == ({agent} if on else set())  # e1 arrived: waiting on a prefix not in the tree
        a = ad.step(dataclasses.replace(_snap(100.2, [ReqSnap("e1", m1)], [ReqSnap("e0", m0, 1, 41)]), probe=probe))
        assert not a.decided
        state["in"] = True
        a = ad.step(dataclasses.replace(_snap(100.3, [ReqSnap("e1", m1)], [ReqSnap("e0", m0, 2, 42)]), probe=probe))
        assert a.decided == on


def test_the_reservation_is_sglangs_prefill_adder_rule():
    from topas.sglang.snapshot import output_reserve_of

    # waiting: the whole remaining output, clipped; running: new_token_ratio of it, or all with ignore_eos
    assert output_reserve_of(16, 0, False, False, 0.5) == 16
    assert output_reserve_of(10_000, 3, False, False, 0.5) == 4096
    assert output_reserve_of(10_000, 3, False, False, 0.5, clip=100) == 100
    assert output_reserve_of(16, 5, True, False, 0.7) == int(0.7 * 11) == 7
    assert output_reserve_of(16, 5, True, True, 0.7) == 11
    assert output_reserve_of(16, 20, True, True, 0.7) == 0
    try:
        from topas.engine.reservation import output_reserve
    except ImportError:  # pragma: no cover
        return
    for mx, g, running, eos, ratio in [(16, 0, False, False, 0.3), (5000, 7, True, False, 0.42), (64, 9, True, True, 0.1)]:
        assert output_reserve_of(mx, g, running, eos, ratio) == output_reserve(mx, g, 4096, not running or eos, ratio)


class _Boom:
    name = "boom"
    manages_prefixes = False

    def reset(self):
        pass

    def decide(self, view):
        raise RuntimeError("boom")

    def on_finish(self, *a):
        pass

    def on_preempt(self, *a):
        pass


def test_a_policy_that_raises_or_is_infeasible_falls_back():
    trace = scaled_down("chain-3", 1)
    m0 = _req_meta(trace, "t00000", "A", 0.0)
    recs = []
    ad = Adapter(_Boom(), load_profile(), recorder=recs.append)
    a = ad.step(_snap(100.0, [ReqSnap("e0", m0)]))
    assert a.fallback and "RuntimeError: boom" in a.fallback and not a.restrict
    assert recs and recs[-1]["fallback"] == a.fallback and math.isfinite(recs[-1]["wall_s"])

    class Bad(_Boom):
        def decide(self, view):
            return Decision(admit=("t00000/A", "t00000/A"))

    a = Adapter(Bad(), load_profile()).step(_snap(100.0, [ReqSnap("e0", m0)]))
    assert a.fallback and "twice" in a.fallback

    class Loads(_Boom):  # a policy that does not manage prefixes may not load one
        def decide(self, view):
            return Decision(admit=("t00000/A",), load=("chain3.A",))

    a = Adapter(Loads(), load_profile()).step(_snap(100.0, [ReqSnap("e0", m0)]))
    assert a.fallback and "does not manage prefixes" in a.fallback


def test_run_metadata_switches_the_policy():
    trace = scaled_down("chain-3", 1)
    ad = Adapter(make_policy("fcfs"), load_profile(), policy_factory=lambda n, p: make_policy(n, p))
    a = ad.step(_snap(100.0, [ReqSnap("e0", _req_meta(trace, "t00000", "A", 0.0, policy="topas"))]))
    assert ad.policy.name == "topas" and a.decided and a.pinned == {"chain3.A"}
