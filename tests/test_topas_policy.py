"""The TOPAS policy (topas/policies/topas.py) on hand-built EngineViews: how the utility terms are
assembled into gains (the frontier attribution), GREEDYPACK, the prefix-set search, the admission
credits lambda_r, liveness, the ablations and the estimators; then a starvation stream run in the
simulator. Every expected number is worked out in the comments. Tests marked xfail(strict) pin
down suspected bugs in the policy (each reason says what goes wrong); they start passing, and so
fail as XPASS, once the policy is fixed.

The engine used here (``COST``) has round numbers:

* prefill: 1 ms per new token, nothing else -> a waiting stage with x = 100 input tokens costs
  0.1 s of prefill;
* decode: 10 ms per step whatever the batch -> tpot = 0.01 s, so T_decode * y = 0.01 * y;
* swap: 100 bytes/token at 1 MB/s, no latency -> moving l tokens takes l * 1e-4 s (1,000 tokens:
  0.1 s); a prefix with no host copy is loaded by a prefill of l tokens (1,000 tokens: 1.0 s)
  and its eviction costs a swap (0.1 s); an eviction to an existing host copy is free.

A stage's expected residual z = 0.001 * (x + generated) + 0.01 * E[Y - g | Y > g], with the
agent's output prior as the only sample until outputs are observed. A request's KV demand
d_r = x + generated + output_reserve * E[Y - g | Y > g] (output_reserve = 1 here, see ``HAND``).
Aging g_i = 1 + ln(1 + (t - tau_i) / 60) here, so g = 1 for a task that arrives now.
"""

from __future__ import annotations

import math

import pytest

from conftest import stage, task, trace
from topas.engine.config import LEGACY_ENGINE, EngineConfig
from topas.engine.cost import CostModel
from topas.engine.simulator import SimulationStuck, simulate
from topas.engine.view import EngineView, PrefixView, RequestView, StageView, TaskView
from topas.policies import PolicyError, available_policies
from topas.policies import make_policy as _make_policy
from topas.policies.topas import _DecisionCtx
from topas.policies.topas_params import EARLIER_PLAN

#: The TOPAS parameters every hand computation here assumes. The shipped defaults are chosen by
#: scripts/sweep_topas_defaults.py and may change; these tests pin their own.
#: The plan here is the estimate one (``EARLIER_PLAN``: d_r by ``output_reserve``, V_reuse at swap
#: prices, no in-batch guard); what the engine-rule plan does is tests/test_plan_execution.py's.
HAND = {"output_reserve": 1.0, "rho": 1.0, "beta": 1.0, "H_age": 60.0, "revalue_credit": False, **EARLIER_PLAN}


def make_policy(name, **params):
    """``topas.policies.make_policy`` with the ``HAND`` parameters for TOPAS and its ablations."""
    return _make_policy(name, **({**HAND, **params} if name.startswith("topas") else params))

from topas.workload.model import Agent, Stage, Task, Trace

COST = CostModel(
    name="tiny-topas",
    kv_budget_tokens=100_000,
    kv_bytes_per_token=100.0,
    swap_bandwidth=1e6,
    swap_latency=0.0,
    prefill_c0=0.0,
    prefill_c_new=0.001,
    prefill_c_new_cached=0.0,
    prefill_c_new_sq=0.0,
    decode_c0=0.01,
    decode_c_batch=0.0,
    decode_c_kv=0.0,
)
LN2 = math.log(2)

SINGLE = (("A", ()),)
CHAIN3 = (("A", ()), ("B", ("A",)), ("C", ("B",)))
DAG4 = (("A", ()), ("B", ("A",)), ("C", ("A",)), ("D", ("B", "C")))


def task_view(tid, arrival, shape, agents, done=(), x=100):
    """A TaskView: ``shape`` = ((stage, parents), ...) in topological order; ``agents`` maps
    stage -> agent (a string: stage s uses agent s.lower())."""
    if isinstance(agents, str):
        agents = {s: s.lower() for s, _ in shape}
    kids = {s: tuple(c for c, ps in shape if s in ps) for s, _ in shape}
    stages = {s: StageView(s, agents[s], x, tuple(ps), kids[s]) for s, ps in shape}
    return TaskView(tid, arrival, "test", stages, tuple(s for s, _ in shape), frozenset(done), {})


def req(tid, sid, agent, ready=0.0, generated=0, x=100, running=False):
    return RequestView(
        rid=f"{tid}/{sid}", task_id=tid, stage_id=sid, agent=agent, input_tokens=x, generated=generated,
        ready_time=ready, kv_tokens=x + generated if running else 0, service_time=0.0, preemptions=0,
        admitted_time=ready if running else None,
    )


def pfx(agent, tokens=1000, prior=100, resident=False, on_host=True, refcount=0):
    return PrefixView(agent, tokens, float(prior), resident, on_host, refcount, -1.0)


def engine_view(time, prefixes, tasks, waiting, running=(), budget=100_000):
    return EngineView(
        time=time,
        kv_budget=budget,
        prefix_tokens=sum(p.tokens for p in prefixes if p.resident),
        request_tokens=sum(r.kv_tokens for r in running),
        prefixes={p.agent: p for p in prefixes},
        running=tuple(running),
        waiting=tuple(waiting),
        tasks={t.id: t for t in tasks},
        cost=COST,
        decode_batch=len(running),
    )


def ctx_of(view, name="topas", **params):
    return _DecisionCtx(make_policy(name, **params), view)


# ------------------------------------------------------------------- frontier attribution
def test_a_single_ready_stage_gets_its_whole_age_weighted_delta():
    # t1: Chain-3, arrived at 0, nothing done, A waiting; every stage z = 0.1 + 1.0 = 1.1 s.
    #     L({}) = 3.3, L({A}) = 2.2 -> Delta = 1.1; at t = 60, g = 1 + ln 2.
    # t2: Chain-3 arrived at 30 with A done, B waiting: L = 2.2, L({B}) = 1.1 -> Delta = 1.1;
    #     g = 1 + ln(1 + 30/60) = 1 + ln 1.5.
    # t3: one stage retracted after 60 tokens (arrived at 60, g = 1): its residual is
    #     0.001 * (100 + 60) recomputed + 0.01 * E[Y - 60 | Y > 60] = 0.16 + 0.01 * 40 = 0.56.
    tasks = [task_view("t1", 0.0, CHAIN3, "lower"), task_view("t2", 30.0, CHAIN3, "lower", done=("A",)),
             task_view("t3", 60.0, SINGLE, "lower")]
    waiting = [req("t1", "A", "a"), req("t2", "B", "b"), req("t3", "A", "a", generated=60)]
    view = engine_view(60.0, [pfx(a, resident=True) for a in "abc"], tasks, waiting)
    ctx = ctx_of(view)
    assert ctx.gain == pytest.approx({"t1/A": 1.1 * (1 + LN2), "t2/B": 1.1 * (1 + math.log(1.5)), "t3/A": 0.56})
    # demands: x + generated + E[remaining] = 100 + 0 + 100, and 100 + 60 + 40
    assert ctx.demand == {"t1/A": 200, "t2/B": 200, "t3/A": 200}
    # without aging the gain is the bare Delta
    assert ctx_of(view, "topas-no-aging").gain == pytest.approx({"t1/A": 1.1, "t2/B": 1.1, "t3/A": 0.56})


def test_parallel_siblings_share_the_frontier_delta_in_proportion_to_their_residuals():
    # DAG-4 with A done; B (prior 300: z_B = 0.1 + 3.0 = 3.1) and C (prior 100: z_C = 1.1) wait,
    # D (z_D = 1.1) is pending. L({}) = 3.1 + 1.1 = 4.2; L({B, C}) = 1.1; Delta(F) = 3.1.
    # Shares by residual: B 3.1 * 3.1 / 4.2, C 3.1 * 1.1 / 4.2; they sum to 3.1.
    # (Sequential conditioning depends on the order: C first gets Delta(C | {}) = 4.2 - 4.2 = 0 and
    # then B gets 4.2 - 1.1 = 3.1; B first gets 4.2 - 2.2 = 2.0 and then C gets 2.2 - 1.1 = 1.1.)
    t1 = task_view("t1", 0.0, DAG4, "lower", done=("A",))
    prefixes = [pfx("a"), pfx("b", prior=300, resident=True), pfx("c", resident=True), pfx("d")]
    view = engine_view(0.0, prefixes, [t1], [req("t1", "C", "c"), req("t1", "B", "b")])
    ctx = ctx_of(view)
    assert ctx.gain["t1/B"] == pytest.approx(3.1 * 3.1 / 4.2)
    assert ctx.gain["t1/C"] == pytest.approx(3.1 * 1.1 / 4.2)
    assert sum(ctx.gain.values()) == pytest.approx(3.1)
    # both fit, so the decision admits the whole frontier and J_admit is exactly Delta(F | H) = 3.1
    d = make_policy("topas").decide(view)
    assert set(d.admit) == {"t1/B", "t1/C"} and d.admit[0] == "t1/B"  # larger share first
    assert d.info["J_admit"] == pytest.approx(3.1)


def test_equal_siblings_split_the_frontier_delta_evenly():
    # DAG-4, A done, B = C = D = 1.1 s: L = 2.2, L({B, C}) = 1.1, Delta(F) = 1.1, 0.55 each
    # (conditioning one after the other would give the first sibling 0: the documented tie).
    t1 = task_view("t1", 0.0, DAG4, "lower", done=("A",))
    view = engine_view(0.0, [pfx(a, resident=True) for a in "abcd"], [t1],
                       [req("t1", "B", "b"), req("t1", "C", "c")])
    assert ctx_of(view).gain == pytest.approx({"t1/B": 0.55, "t1/C": 0.55})


def test_a_sibling_waiting_beside_a_running_one_is_a_frontier_of_its_own():
    # DAG-4, A done, B running (committed, H = {B}), C waiting: L(H) = max(0, 1.1) + 1.1 = 2.2,
    # L(H + {C}) = 1.1 -> C gets the whole 1.1 s.
    t1 = task_view("t1", 0.0, DAG4, "lower", done=("A",))
    view = engine_view(0.0, [pfx(a, resident=True) for a in "abcd"], [t1], [req("t1", "C", "c")],
                       running=[req("t1", "B", "b", running=True)])
    assert ctx_of(view).gain == pytest.approx({"t1/C": 1.1})


# ------------------------------------------------------------------------------ GREEDYPACK
def _pack_view():
    # Five one-stage tasks (arrived now: g = 1), priors 100 everywhere (1.0 s of decode, and
    # 100 tokens reserved), so z = 0.001 x + 1.0 and d = x + 100:
    #   t3/A agent c x=900: z 1.9, d 1000      (c is not in R' below)
    #   t1/A agent a x=500: z 1.5, d  600
    #   t2/A agent b x=400: z 1.4, d  500
    #   t4/A agent a x=300: z 1.3, d  400
    #   t5/A agent b x=100: z 1.1, d  200
    xs = {"t1": ("a", 500), "t2": ("b", 400), "t3": ("c", 900), "t4": ("a", 300), "t5": ("b", 100)}
    tasks = [task_view(t, 0.0, SINGLE, {"A": a}, x=x) for t, (a, x) in xs.items()]
    waiting = [req(t, "A", a, x=x) for t, (a, x) in xs.items()]
    return engine_view(0.0, [pfx(a, resident=True) for a in "abc"], tasks, waiting)


def test_greedypack_admits_best_gain_first_and_skips_what_does_not_fit():
    ctx = ctx_of(_pack_view())
    assert [r.rid for r in ctx.cands] == ["t3/A", "t1/A", "t2/A", "t4/A", "t5/A"]
    # R' = {a, b}, 1,000 tokens free: t3 (agent c) is not in R'; t1 (600) fits -> 400 left;
    # t2 (500) does not fit, skipped; t4 (400) fits -> 0 left; t5 (200) does not fit.
    admit, total = ctx._greedy_pack(frozenset("ab"), 1000, set(), False)
    assert admit == [("t1/A", pytest.approx(1.5)), ("t4/A", pytest.approx(1.3))]
    assert total == pytest.approx(2.8)
    # R' = {b}: only b's requests: t2 (500) -> 500 left, t5 (200) -> 300 left
    assert [rid for rid, _ in ctx._greedy_pack(frozenset("b"), 1000, set(), False)[0]] == ["t2/A", "t5/A"]
    # R' = {a, b, c} with room for everything: all five, best gain first
    assert [rid for rid, _ in ctx._greedy_pack(frozenset("abc"), 10**6, set(), False)[0]] == \
        ["t3/A", "t1/A", "t2/A", "t4/A", "t5/A"]


def test_greedypack_respects_k():
    ctx = ctx_of(_pack_view(), K=2)
    assert [rid for rid, _ in ctx._greedy_pack(frozenset("abc"), 10**6, set(), False)[0]] == ["t3/A", "t1/A"]
    d = make_policy("topas", K=1).decide(_pack_view())
    assert d.admit == ("t3/A",)


def test_evaluate_packs_the_budget_left_by_the_prefix_set():
    # Budget 3,000 tokens, a, b, c resident (1,000 each). R' = {a, b}: free = 3000 - 2000 = 1000 ->
    # GREEDYPACK as above (t1, t4) and c is evicted (host copy: free). R' = {a, b, c}: free = 0.
    view = _pack_view()
    view = engine_view(0.0, list(view.prefixes.values()), list(view.tasks.values()), view.waiting, budget=3000)
    ctx = ctx_of(view)
    plan = ctx.evaluate(frozenset("ab"))
    assert [rid for rid, _ in plan.admit] == ["t1/A", "t4/A"]
    assert plan.terms["J_admit"] == pytest.approx(2.8) and plan.terms["J_move"] == 0.0
    assert ctx.evaluate(frozenset("abc")).admit == []
    # The search (evictions are free: host copies; no loads):
    #   {a}:    2,000 free: t1 (600), t4 (400)                  -> 1.5 + 1.3 = 2.8
    #   {a, b}: 1,000 free: t1 (600), t4 (400) as above         -> 2.8
    #   {b}:    2,000 free: t2 (500), t5 (200)                  -> 1.4 + 1.1 = 2.5
    #   {c}, {a, c}, {b, c}: t3 (1,000) first, then no room     -> 1.9
    #   {a, b, c}: nothing fits -> 0
    # {a} and {a, b} tie at 2.8: the smaller set wins, so b is evicted too.
    d = make_policy("topas").decide(view)
    assert d.admit == ("t1/A", "t4/A") and d.evict == ("c",) and d.load == ()


def test_greedypack_stops_at_a_gain_of_zero():
    # t1: roots A (agent a, waiting, z = 1.1) and B (agent b, running) -> C (agent c, prior 900:
    # z_C = 0.1 + 9.0 = 9.1). H = {B}: L(H) = max(1.1, 0 + 9.1) = 9.1 = L(H + {A}) -> Delta_A = 0.
    # With room for everything, A is still not admitted: admitting it does not shorten the task.
    shape = (("A", ()), ("B", ()), ("C", ("B",)))
    t1 = task_view("t1", 0.0, shape, "lower")
    view = engine_view(0.0, [pfx("a", resident=True), pfx("b", resident=True, refcount=1),
                             pfx("c", prior=900)], [t1], [req("t1", "A", "a")],
                       running=[req("t1", "B", "b", running=True)])
    ctx = ctx_of(view)
    assert ctx.gain == {"t1/A": 0.0}
    assert ctx._greedy_pack(frozenset("abc"), 10**6, set(), False) == ([], 0.0)
    pol = make_policy("topas")
    pol.credits["t1/B"] = 0.5  # as if this policy had admitted B (so preempting it is not free)
    d = pol.decide(view)
    assert d.admit == () and d.preempt == ()


def _zero_gain_view():
    shape = (("A", ()), ("B", ()), ("C", ("B",)))
    t1 = task_view("t1", 0.0, shape, "lower")
    return engine_view(0.0, [pfx("a", resident=True), pfx("b", resident=True, refcount=1),
                             pfx("c", prior=900)], [t1], [req("t1", "A", "a")],
                       running=[req("t1", "B", "b", running=True)])


def test_a_tie_never_preempts_a_running_request_for_nothing():
    # Same view, B's credit unknown to this policy (0) and B has generated nothing: keeping
    # {a, b} scores 0, and so do {a} and {} (preempt B: J_redo = 0, J_revoke = 0, nothing to
    # admit). Preempting B throws its prefill away and gains nothing; the current state should win.
    d = make_policy("topas").decide(_zero_gain_view())
    assert d.preempt == ()


# -------------------------------------------------------------------------------- the search
def test_a_pool_of_at_most_m_agents_scores_every_prefix_subset():
    # Pool = agents with waiting or running requests + resident ones = {a, b, c}: 2^3 = 8 sets.
    d = make_policy("topas", M=6).decide(_pack_view())
    assert d.info["candidates"] == 8
    assert d.admit == ("t3/A", "t1/A", "t2/A", "t4/A", "t5/A")  # 100,000 tokens: everything fits
    # a fourth agent, resident and idle, joins the pool: 2^4 = 16
    view = _pack_view()
    view = engine_view(0.0, [*view.prefixes.values(), pfx("d", resident=True)], list(view.tasks.values()),
                       view.waiting)
    assert make_policy("topas", M=6).decide(view).info["candidates"] == 16
    assert make_policy("topas", M=4).decide(view).info["candidates"] == 16
    # with M below the pool size the local search runs instead: never more than all subsets
    assert 1 <= make_policy("topas", M=3).decide(view).info["candidates"] <= 16


def test_the_search_evicts_an_idle_prefix_to_load_a_waiting_agents_prefix():
    # a: resident, idle (no request), host copy (eviction free). b: not resident, host copy.
    # t1/A (agent b, x 100, prior 100): z = 1.1, d = 200. Budget 2,100 < l_a + l_b + d = 2,200.
    #   {a} (stay): admits nothing -> 0.
    #   {b}: evict a (0 s) + load b (1000 * 1e-4 = 0.1 s), one affected task -> J_move = 0.1;
    #        J_admit = 1.1 -> score 1.0.
    #   {a, b}: 100 tokens free, nothing fits: 0 (the move costs no task anything).
    view = engine_view(0.0, [pfx("a", resident=True), pfx("b")], [task_view("t1", 0.0, SINGLE, {"A": "b"})],
                       [req("t1", "A", "b")], budget=2100)
    d = make_policy("topas").decide(view)
    assert (d.admit, d.evict, d.load) == (("t1/A",), ("a",), ("b",))
    assert d.info["J_move"] == pytest.approx(0.1) and d.info["score"] == pytest.approx(1.0)
    # without a host copy of a, evicting it is a swap too: J_move = 0.2, score 0.9, same choice
    view2 = engine_view(0.0, [pfx("a", resident=True, on_host=False), pfx("b")], list(view.tasks.values()),
                        view.waiting, budget=2100)
    d2 = make_policy("topas").decide(view2)
    assert (d2.admit, d2.evict, d2.load) == (("t1/A",), ("a",), ("b",))
    assert d2.info["J_move"] == pytest.approx(0.2) and d2.info["score"] == pytest.approx(0.9)


def _reuse_view():
    # t1: Chain-2 A (agent c, running, 50 tokens generated) -> B (agent a, pending): one next-hop
    #     stage of a whose only unfinished parent runs -> n_a = 1.
    # t2/A: agent b, waiting, z = 1.1, d = 200.
    # Prefixes: a resident, idle, 20,000 tokens with a host copy (reload 2.0 s, eviction free);
    #           c resident (1,000, no host copy: evicting it costs 0.1 s), used by t1/A;
    #           b not resident (host copy: load 0.1 s).
    # t1/A keeps kv 150 + E[Y - 50 | Y > 50] = 50 reserved = 200 tokens.
    # Budget 22,300: a + c + b = 22,000 + 200 leaves 100 < 200, so t2 needs a gone (or c).
    #   {a, c} (stay):  V_reuse = beta * n_a * 2.0 = 2.0 beta                -> 2.0 beta
    #   {b, c}:         J_admit 1.1 - J_move 0.1 (load b) * 2 tasks (t1, t2)  -> 0.9
    #   {a, b, c}:      nothing fits; J_move 0.1 * 1 task (t1); V 2.0 beta    -> 2.0 beta - 0.1
    #   {a, b}:         preempts t1/A: J_redo 0.01 * 50 = 0.5; evict c 0.1 + load b 0.1 for t2;
    #                   n_a = 0 (t1/A no longer runs): 1.1 - 0.5 - 0.2        -> 0.4
    t1 = task_view("t1", 0.0, (("A", ()), ("B", ("A",))), {"A": "c", "B": "a"})
    t2 = task_view("t2", 0.0, SINGLE, {"A": "b"})
    prefixes = [pfx("a", tokens=20_000, resident=True), pfx("b"),
                pfx("c", resident=True, on_host=False, refcount=1)]
    return engine_view(0.0, prefixes, [t1, t2], [req("t2", "A", "b")],
                       running=[req("t1", "A", "c", generated=50, running=True)], budget=22_300)


def test_v_reuse_keeps_a_prefix_its_next_hop_stage_will_need():
    d = make_policy("topas").decide(_reuse_view())  # beta = 1: 2.0 > 0.9
    assert (d.admit, d.evict, d.load, d.preempt) == ((), (), (), ())
    assert d.info["V_reuse"] == pytest.approx(2.0) and d.info["score"] == pytest.approx(2.0)
    ctx = ctx_of(_reuse_view())
    assert ctx.evaluate(frozenset("bc")).score == pytest.approx(0.9)
    assert ctx.evaluate(frozenset("abc")).score == pytest.approx(1.9)
    assert ctx.evaluate(frozenset("ab")).score == pytest.approx(0.4)


@pytest.mark.parametrize("how", [{"beta": 0.0}, {"name": "topas-no-reuse"}, {"name": "topas-base"}])
def test_without_v_reuse_the_prefix_is_traded_for_the_waiting_request(how):
    # beta = 0 (or the term switched off): {a, c} -> 0 < {b, c} -> 0.9
    params = dict(how)
    d = make_policy(params.pop("name", "topas"), **params).decide(_reuse_view())
    assert (d.admit, d.evict, d.load, d.preempt) == (("t2/A",), ("a",), ("b",), ())
    assert d.info["V_reuse"] == 0.0 and d.info["score"] == pytest.approx(0.9)


def test_v_reuse_weight_beta_sets_the_tipping_point():
    # keep a iff 2.0 beta > 0.9, i.e. beta > 0.45
    assert make_policy("topas", beta=0.5).decide(_reuse_view()).admit == ()
    assert make_policy("topas", beta=0.4).decide(_reuse_view()).admit == ("t2/A",)


# ------------------------------------------------------------------- lambda_r and J_revoke
def _revoke_views():
    # view 1 (t = 60): t1, one stage of agent a (arrived at 0), waiting; a resident without host
    # copy. lambda = g * Delta = (1 + ln 2) * 1.1.
    t1 = task_view("t1", 0.0, SINGLE, {"A": "a"})
    v1 = engine_view(60.0, [pfx("a", resident=True, on_host=False), pfx("b", prior=1000)], [t1],
                     [req("t1", "A", "a")], budget=2600)
    # view 2 (t = 120): t1/A runs (50 tokens generated: demand 150 + 50 = 200); t2 (one stage of
    # agent b, prior 1000, arrived at 100) waits: z = 0.1 + 10.0 = 10.1, d = 1,100,
    # g = 1 + ln(1 + 20/60). Budget 2,600: a + b + 200 + 1,100 = 3,300 does not fit, so t2 runs
    # only if a goes, which preempts t1/A:
    #   J_admit = 10.1 g, J_move = evict a (swap 0.1) + load b (0.1) for one task (t2) = 0.2,
    #   J_redo = 0.01 * 50 = 0.5, J_revoke = lambda recorded in view 1 = 1.1 (1 + ln 2).
    t2 = task_view("t2", 100.0, SINGLE, {"A": "b"})
    v2 = engine_view(120.0, [pfx("a", resident=True, on_host=False, refcount=1), pfx("b", prior=1000)],
                     [t1, t2], [req("t2", "A", "b", ready=100.0)],
                     running=[req("t1", "A", "a", ready=60.0, generated=50, running=True)], budget=2600)
    return v1, v2


def test_lambda_is_recorded_at_admission_and_charged_as_j_revoke_on_preemption():
    v1, v2 = _revoke_views()
    pol = make_policy("topas")
    lam = 1.1 * (1 + LN2)
    assert pol.decide(v1).admit == ("t1/A",)
    assert pol.credits == {"t1/A": pytest.approx(lam)}
    d = pol.decide(v2)
    g2 = 1 + math.log(1 + 20 / 60)
    assert (d.preempt, d.evict, d.load, d.admit) == (("t1/A",), ("a",), ("b",), ("t2/A",))
    assert d.info["J_revoke"] == pytest.approx(lam)  # the recorded credit, not a fresh estimate
    assert d.info["J_redo"] == pytest.approx(0.5)
    assert d.info["J_move"] == pytest.approx(0.2)
    assert d.info["score"] == pytest.approx(10.1 * g2 - 0.2 - 0.5 - lam)
    assert pol.credits["t2/A"] == pytest.approx(10.1 * g2)
    # the engine reports the preemption: the credit is dropped
    pol.on_preempt(v2.running[0], 120.0, by_engine=False)
    assert "t1/A" not in pol.credits
    # a request this policy never admitted carries no credit: J_revoke = 0
    assert make_policy("topas").decide(v2).info["J_revoke"] == 0.0


def test_revalue_credit_charges_lambda_at_the_task_s_current_age():
    # Same two views. t1/A was admitted at t = 60 (its running view says admitted_time = 60, its
    # task arrived at 0), so g then = 1 + ln 2 and g now (t = 120) = 1 + ln 3:
    # J_revoke = lambda * (1 + ln 3) / (1 + ln 2) = 1.1 (1 + ln 3).
    v1, v2 = _revoke_views()
    pol = make_policy("topas", revalue_credit=True)
    pol.decide(v1)
    d = pol.decide(v2)
    assert d.preempt == ("t1/A",)
    assert d.info["J_revoke"] == pytest.approx(1.1 * (1 + math.log(3)))
    # without aging there is nothing to revalue: the recorded credit is charged as is
    pol = make_policy("topas-no-aging", revalue_credit=True)
    pol.decide(v1)
    assert pol.decide(v2).info["J_revoke"] == pytest.approx(1.1)


def test_a_finished_request_drops_its_credit():
    v1, _ = _revoke_views()
    pol = make_policy("topas")
    pol.decide(v1)
    pol.on_finish(req("t1", "A", "a", generated=100), 70.0, 100)
    assert pol.credits == {}


def test_no_preemption_when_it_is_switched_off_or_exceeds_k():
    _, v2 = _revoke_views()
    d = make_policy("topas", preempt=False).decide(v2)
    assert d.preempt == () and d.admit == ()
    # K = 1 allows the one preemption; two running requests of a exceed it
    assert make_policy("topas", K=1).decide(v2).preempt == ("t1/A",)
    t3 = task_view("t3", 0.0, SINGLE, {"A": "a"})
    v3 = engine_view(120.0, [pfx("a", resident=True, on_host=False, refcount=2), pfx("b", prior=1000)],
                     [*v2.tasks.values(), t3], v2.waiting,
                     running=[*v2.running, req("t3", "A", "a", ready=60.0, generated=0, x=10, running=True)],
                     budget=2800)
    assert make_policy("topas", K=1).decide(v3).preempt == ()
    assert make_policy("topas", K=2).decide(v3).preempt == ("t1/A", "t3/A")


# ---------------------------------------------------------------------------------- liveness
def test_an_idle_engine_admits_a_request_even_when_its_first_prefix_load_costs_more():
    # b has never been loaded (no host copy): loading it is a 5,000-token prefill = 5.0 s, more
    # than t1/A's gain of 1.1 s, so every scored state admits nothing; the engine is idle, so the
    # liveness rule admits the best request with its prefix anyway.
    view = engine_view(0.0, [pfx("a", resident=True), pfx("b", tokens=5000, on_host=False)],
                       [task_view("t1", 0.0, SINGLE, {"A": "b"})], [req("t1", "A", "b")], budget=10_000)
    d = make_policy("topas").decide(view)
    assert d.admit == ("t1/A",) and d.load == ("b",)
    assert d.info["J_move"] == pytest.approx(5.0)


# --------------------------------------------------------------------------------- ablations
def test_ablations_are_registered_with_their_fixed_switches():
    names = {"topas", "topas-no-reuse", "topas-no-aging", "topas-base", "topas-request-only"}
    assert names <= set(available_policies())
    switches = {n: (make_policy(n).params.reuse, make_policy(n).params.aging) for n in names}
    assert switches == {
        "topas": (True, True),
        "topas-no-reuse": (False, True),
        "topas-no-aging": (True, False),
        "topas-base": (False, False),
        "topas-request-only": (True, True),
    }
    # the other parameters stay settable on an ablation
    assert make_policy("topas-base", beta=0.5, M="3").params.M == 3


@pytest.mark.parametrize("name,param", [("topas-base", "aging"), ("topas-base", "reuse"),
                                        ("topas-no-aging", "aging"), ("topas-no-reuse", "reuse")])
def test_an_ablation_refuses_to_set_the_switch_it_fixes(name, param):
    with pytest.raises(PolicyError, match=param):
        make_policy(name, **{param: True})


def test_request_only_orders_by_gain_and_leaves_prefixes_to_the_engine():
    # the view where TOPAS evicts a and loads b: request-only returns an admission order only
    view = engine_view(0.0, [pfx("a", resident=True), pfx("b")], [task_view("t1", 0.0, SINGLE, {"A": "b"})],
                       [req("t1", "A", "b")], budget=2100)
    pol = make_policy("topas-request-only")
    assert pol.manages_prefixes is False
    d = pol.decide(view)
    assert (d.admit, d.evict, d.load, d.preempt) == (("t1/A",), (), (), ())
    # every waiting request is listed, largest gain first, whatever its prefix
    d = make_policy("topas-request-only").decide(_pack_view())
    assert d.admit == ("t3/A", "t1/A", "t2/A", "t4/A", "t5/A") and not (d.evict or d.load or d.preempt)


# --------------------------------------------------------------------------------- estimators
def _observed(pol, agent, outputs):
    for k, y in enumerate(outputs):
        pol.on_finish(req(f"old{agent}{k}", "A", agent, generated=y), 0.0, y)


def test_sampled_estimator_is_deterministic_for_a_seed_and_at_least_the_expected_one():
    # DAG-4 with A done, B and C in parallel. Agents b and c have observed outputs 10 and 390
    # (prior 200): their draws spread, so E[max(B, C)] > max(E[B], E[C]) (Jensen).
    t1 = task_view("t1", 0.0, DAG4, "lower", done=("A",))
    view = engine_view(0.0, [pfx(a, prior=200, resident=True) for a in "abcd"], [t1],
                       [req("t1", "B", "b"), req("t1", "C", "c")])

    def L(**params):
        pol = make_policy("topas", **params)
        for a in "bc":
            _observed(pol, a, [10, 390])
        pol._decisions = 1
        return _DecisionCtx(pol, view).tasks["t1"].L(frozenset())

    # expected: E[Y] = (200 + 10 + 390) / 3 = 200 tokens -> z = 0.1 + 2.0 = 2.1 each; D = 0.1 + 2.0
    # (agent d has only its prior): L = max(2.1, 2.1) + 2.1 = 4.2
    assert L(estimator="expected") == pytest.approx(4.2)
    # sampled: B and C draw Y from {10, 200, 390} uniformly -> z in {0.2, 2.1, 4.0};
    # P(max = 4.0) = 1 - (2/3)^2 = 5/9, P(max = 2.1) = (2/3)^2 - (1/3)^2 = 3/9, P(max = 0.2) = 1/9:
    # E[max] = (5 * 4.0 + 3 * 2.1 + 0.2) / 9 = 26.5 / 9, plus D's 2.1 -> E[LP] = 5.044 > 4.2.
    sampled = L(estimator="sampled", samples=4096, seed=3)
    assert sampled == L(estimator="sampled", samples=4096, seed=3)  # same seed, same draws
    assert sampled == pytest.approx(26.5 / 9 + 2.1, abs=0.1)  # Monte-Carlo error ~0.02
    assert L(estimator="sampled", samples=4096, seed=4) != sampled  # the seed matters


def _with_priors(tr, prior):
    """``tr`` with every agent's output prior set to ``prior`` tokens."""
    agents = {a: Agent(a, ag.prefix_tokens, float(prior)) for a, ag in tr.agents.items()}
    return Trace(tr.name, agents, tr.tasks, tr.meta)


def test_sampled_estimator_gives_identical_simulations_for_a_seed():
    tasks = [task(f"t{k}", 0.3 * k, stage("A", "a", 50, 10 + 7 * k), stage("B", "b", 60, 20, "A"),
                  stage("C", "c", 70, 5 + 3 * k, "A"), stage("D", "a", 40, 15, "BC")) for k in range(8)]
    tr = _with_priors(trace({"a": 300, "b": 400, "c": 500}, tasks), 20.0)
    cost = COST.with_budget(1500)
    runs = [simulate(tr, make_policy("topas", estimator="sampled", seed=7, samples=8), cost) for _ in range(2)]
    assert runs[0].deterministic_summary() == runs[1].deterministic_summary()
    cols = [c for c in runs[0].decisions.columns if c != "wall_s"]
    assert runs[0].decisions[cols].equals(runs[1].decisions[cols])
    assert runs[0].tasks["finish"].notna().all()


def test_parameters_out_of_range_are_refused():
    for bad in ({"K": 0}, {"H_age": 0.0}, {"beta": -1.0}, {"samples": 0}, {"output_reserve": -0.5}):
        with pytest.raises(PolicyError, match=next(iter(bad))):
            make_policy("topas", **bad)
    with pytest.raises(PolicyError, match="estimator"):
        make_policy("topas", estimator="median")


def test_topas_never_stalls_when_the_expected_output_does_not_fit():
    # One agent, l_a = 300, budget 1,000; the stage needs 300 + 50 + 10 = 360 tokens to run alone,
    # but its agent's prior is 12,345 tokens: d_r = 50 + 12,345 does not fit beside the prefix.
    tr = trace({"a": 300}, [task("t0", 0.0, stage("A", "a", 50, 10))])  # conftest prior: 12,345
    res = simulate(tr, make_policy("topas"), COST.with_budget(1000))
    assert res.tasks["finish"].notna().all()


def test_topas_with_no_output_reserve_runs_the_request_whose_prior_does_not_fit():
    # the same workload with output_reserve = 0: d_r = x = 50 fits, and the run completes
    tr = trace({"a": 300}, [task("t0", 0.0, stage("A", "a", 50, 10))])
    res = simulate(tr, make_policy("topas", output_reserve=0.0), COST.with_budget(1000))
    assert res.tasks["finish"].notna().all()


def _sibling_views():
    # t1: A done; three equal siblings B, C, D (agents b, c, d; z = 1.1 s each) -> E (z = 1.1).
    # Prefixes 1,000 tokens with host copies (evicting is free, loading 0.1 s); b, c resident.
    # Budget 2,400 = two prefixes + two requests of 200 tokens: only two siblings run at a time.
    shape = (("A", ()), ("B", ("A",)), ("C", ("A",)), ("D", ("A",)), ("E", ("B", "C", "D")))
    t1 = task_view("t1", 0.0, shape, "lower", done=("A",))
    v1 = engine_view(0.0, [pfx("b", resident=True), pfx("c", resident=True), pfx("d"), pfx("e")], [t1],
                     [req("t1", s, s.lower()) for s in "BCD"], budget=2400)
    # one second later B and C run (5 tokens generated each: 105 + 95 reserved = 200 tokens) and D
    # waits alone.
    run = [req("t1", s, s.lower(), generated=5, running=True) for s in "BC"]
    v2 = engine_view(1.0, [pfx("b", resident=True, refcount=1), pfx("c", resident=True, refcount=1),
                           pfx("d"), pfx("e")], [t1], [req("t1", "D", "d")], running=run, budget=2400)
    return v1, v2


def test_siblings_admitted_together_get_a_share_each_as_credit():
    # Decision 1: Delta(F = {B, C, D} | {}) = (1.1 + 1.1) - 1.1 = 1.1, a third to each sibling;
    # {b, c} runs two of them: J_admit = 2 * 1.1 / 3 and each credit lambda = 1.1 / 3.
    v1, _ = _sibling_views()
    pol = make_policy("topas")
    d = pol.decide(v1)
    assert d.admit == ("t1/B", "t1/C") and (d.evict, d.load) == ((), ())
    assert pol.credits == {"t1/B": pytest.approx(1.1 / 3), "t1/C": pytest.approx(1.1 / 3)}


def test_topas_does_not_swap_a_running_sibling_for_a_waiting_one_of_the_same_task():
    # Decision 2: D alone is the frontier; with H = {B, C}: Delta(D | H) = 2.2 - 1.1 = 1.1, so D's
    # gain is g * 1.1 (g = 1 + ln(1 + 1/60)). Plan {b, d}: preempt C (J_redo = 0.01 * 5 = 0.05,
    # J_revoke = 1.1 / 3), evict c (free), load d (0.1 s, one task): score = 1.118 - 0.05 - 0.367
    # - 0.1 = 0.60 > 0, so TOPAS swaps C for D. But with C preempted, Delta(D | {B}) = 0: one
    # sibling still waits either way, and t1's longest path stays z + z_E = 2.2 s. The swap only
    # throws away C's prefill and 5 tokens, and the next decision may swap them back.
    v1, v2 = _sibling_views()
    pol = make_policy("topas")
    pol.decide(v1)
    d = pol.decide(v2)
    assert d.preempt == ()


# ------------------------------------------------------------------------------- starvation
# An adversarial stream. Agent S (prefix 500 tokens, outputs 200 = its prior) serves short
# one-stage tasks: x = 50, so z_s = 0.05 + 2.0 = 2.05 s and d_s = 50 + 200 = 250 tokens. Agent G
# (prefix 1,500, prior 1,000) serves one long task L (arrives at t = 1): x = 500, y = 1,000, so
# z_L = 0.5 + 10.0 = 10.5 s and d_L = 1,500. Budget B = 3,000 = l_G + x_L + y_L: with S resident,
# exactly N = (3000 - 500) / 250 = 10 shorts run; G and L need the whole budget ({S, G} leaves
# 1,000 < d_L), so L runs only with S evicted.
# Shorts come in batches of 10: one at t = 0, then one every 2.48 s from t = 0.5. A batch runs
# for 2.49 s (one 0.5 s prefill iteration, 199 decode steps of 10 ms; the first batch 1.0 s more
# for S's first prefill), so the next batch is always waiting (0.01 s longer each batch) when one
# finishes: the budget is always full and there is never an idle gap.
# At a batch boundary nothing runs, and TOPAS chooses between
#   {S}: the 10 waiting shorts, J_admit = 10 * g_s * 2.05 ~ 20.5 g_s, and
#   {G}: L alone, J_admit = g_L * 10.5, J_move = evict S (swap 0.05 s) + load G (a first load:
#        prefill of 1,500 tokens, 1.5 s) = 1.55 s for one task.
# Without aging (g = 1): 10.5 - 1.55 = 8.95 < 20.5, at every boundary, for as long as shorts come.
# With aging (rho = 1, H_age = 10 s) L wins once g_L > (20.5 g_s + 1.55) / 10.5. The shorts wait
# at most 0.2 s (checked), so g_s <= 1 + ln(1.02) < 1.02 and g_L > 2.139 suffices:
# 1 + ln(1 + w / 10) > 2.139 <=> w > 10 (e^1.139 - 1) = 21.2 s; L is admitted at the first boundary
# after t = 1 + 21.2, at most one batch (2.49 s) later: t <= 24.7 s. It cannot be admitted before
# g_L >= (20.5 + 1.55) / 10.5 = 2.1, i.e. w >= 10 (e^1.1 - 1) = 20.04 s. Once admitted it runs
# alone (S's prefix cannot come back beside it): one prefill iteration of 1,500 + 500 tokens (2.0 s)
# after S's eviction swap (0.05 s), then 999 decode steps (9.99 s): 12.04 s. Hence
#     21.04 <= JCT_L <= 24.7 - 1 + 12.04 = 35.74 < 36 s               (the bound, BOUND_S)
# The stream lasts 50 batches (until ~125 s), more than 3 x BOUND_S after L's arrival.
BOUND_S = 36.0


def _starvation_stream(batches=50, n=10, period=2.48):
    agents = {"S": Agent("S", 500, 200.0), "G": Agent("G", 1500, 1000.0)}
    short = (Stage("A", "S", 50, 200),)
    tasks = [Task(f"s00-{j}", 0.0, short, "short") for j in range(n)]
    tasks.append(Task("long", 1.0, (Stage("A", "G", 500, 1000),), "long"))
    for k in range(1, batches):
        tasks += [Task(f"s{k:02d}-{j}", round(0.5 + k * period, 6), short, "short") for j in range(n)]
    return Trace("starvation", agents, tuple(tasks))


def _run_stream(name, **params):
    # The bounds above are derived on the engine model with a host tier and ratio reservations
    # (LEGACY_ENGINE): the swap of S's prefix is what J_move prices. The property is TOPAS's.
    tr = _starvation_stream()
    res = simulate(tr, make_policy(name, H_age=10.0, **params), COST.with_budget(3000),
                   EngineConfig(**LEGACY_ENGINE))
    long = res.requests.set_index("rid").loc["long/A"]
    last_short = max(t.arrival for t in tr.tasks if t.workflow == "short")
    return res, long, last_short


@pytest.mark.parametrize("preempt", [True, False])
def test_without_aging_a_long_task_starves_behind_a_stream_of_short_ones(preempt):
    res, long, last_short = _run_stream("topas-no-aging", preempt=preempt)
    # L is admitted only once the stream has ended (the last batch arrives at ~122 s)
    assert long["first_admit"] > last_short
    jct = res.tasks.set_index("task_id").loc["long", "jct"]
    assert jct > 3 * BOUND_S  # observed: 136.0 s
    assert res.tasks["finish"].notna().all()


def test_aging_admits_the_long_task_within_the_derived_bound():
    # preempt = False: once admitted, L runs to its end (see the xfail below: preemption with aging)
    res, long, _ = _run_stream("topas", preempt=False)
    shorts = res.requests[res.requests["agent"] == "S"]
    # every short's wait, up to L's admission, stays under 0.2 s (so g_s < 1.02 in every decision)
    before = shorts[shorts["ready"] <= long["first_admit"]]
    assert (before["first_admit"].clip(upper=long["first_admit"]) - before["ready"]).max() <= 0.2
    assert 1.0 + 20.04 <= long["first_admit"] <= 24.7  # observed: 22.91
    jct = res.tasks.set_index("task_id").loc["long", "jct"]
    assert 20.04 + 12.04 - 1e-6 <= jct <= BOUND_S  # observed: 33.95
    # the shorts' decision at the boundary it got in: J_admit = g_L * 10.5, J_move = 1.55
    d = res.decisions
    row = d[(d["n_load"] > 0) & (d["time"] == long["first_admit"])].iloc[0]
    g_l = 1 + math.log(1 + (long["first_admit"] - 1.0) / 10.0)
    assert row["info_J_admit"] == pytest.approx(g_l * 10.5) and row["info_J_move"] == pytest.approx(1.55)


def test_revalued_credit_keeps_the_bound_when_preemption_is_allowed():
    # The xfail below: with the paper's credit (frozen at admission) the shorts' aging overtakes
    # L's credit and TOPAS preempts L again and again. Revalued at the current age, L's credit
    # grows with its own task's age and L runs to its end: the same bound holds as without
    # preemption (L admitted at the first batch boundary after 21.6 s, finished by 36 s).
    res, long, _ = _run_stream("topas", revalue_credit=True)
    assert res.requests.set_index("rid").loc["long/A", "preemptions"] == 0
    assert res.tasks.set_index("task_id").loc["long", "jct"] <= BOUND_S


@pytest.mark.xfail(strict=True, reason=(
    "suspected bug: aging lets L in at t = 22.9 s, but the waiting shorts keep aging while L's "
    "credit lambda_L is frozen at admission; 2.4 s later 10 * g_s * 2.05 = 25.04 > lambda_L 22.68 + "
    "J_redo 0.35 + J_move 2.0, so TOPAS preempts L (score 0.008) and S comes back; this repeats "
    "and L finishes at 139.9 s, later than without aging (137.0 s)"))
def test_aging_bounds_the_long_task_when_preemption_is_allowed():
    res, long, _ = _run_stream("topas")
    assert res.tasks.set_index("task_id").loc["long", "jct"] <= BOUND_S
