"""A policy's plan is what the engine executes (docs/method.md "The plan and the engine").

* The engine computes one copy of a prefix per request admitted before the prefix is in the radix
  tree (SGLang inserts a prompt only when its prefill ends). TOPAS and TOPAS+ admit at most one
  request of such an agent (``EngineView.admit_cap``), so they compute no copy; the engine's
  ``in_batch_guard`` does the same for any policy.
* TOPAS plans memory with the engine's own admission rule (``RequestView.reserve``), so what it
  plans is admitted; its gains never read that reservation.
* V_reuse prices a later use of a prefix at what the engine pays to bring it back.
* Every run counts the difference: ``prefix_dup_copies``/``prefix_dup_tokens``,
  ``planned_admits``/``admitted``, ``preempt_unused``.
"""

from __future__ import annotations

import dataclasses

import pytest

from conftest import stage, task, trace
from test_topas_policy import COST, DAG4, engine_view, pfx, req, task_view
from topas.engine.config import EngineConfig
from topas.engine.simulator import simulate
from topas.engine.view import admit_cap, within_caps
from topas.experiments import Experiment, run_experiment
from topas.policies import make_policy
from topas.policies.topas import _DecisionCtx
from topas.policies.topas_params import EARLIER_PLAN

#: DAG-4 near capacity, where requests of a cold agent queue up together (tuning seed)
BUSY = dict(load=1.375, seed=100, n_tasks=120)


@pytest.fixture(scope="module")
def runs():
    def run(policy, params=None, **engine):
        return run_experiment(Experiment("dag-4", policy, params or {}, engine_options=engine, **BUSY)).summary

    return {
        "lpm": run("lpm"),
        "fcfs": run("fcfs"),
        "fcfs guarded": run("fcfs", in_batch_guard=True),
        "topas": run("topas"),
        "topas earlier": run("topas", dict(EARLIER_PLAN)),
        "topas-plus": run("topas-plus"),
        "topas-plus unguarded": run("topas-plus", {"in_batch_guard": False}),
    }


# ----------------------------------------------------------------------------- duplicate copies


def test_the_instrument_sees_the_copies_that_an_unguarded_plan_makes(runs):
    # without the guard TOPAS packs several requests of a just-loaded agent into one batch, and
    # each after the first computes its own copy of the prefix (3,072 tokens on DAG-4)
    s = runs["topas earlier"]
    assert s["prefix_dup_copies"] > 0 and s["prefix_dup_tokens"] == 3072 * s["prefix_dup_copies"]
    assert runs["topas-plus unguarded"]["prefix_dup_copies"] > 0
    assert runs["fcfs"]["prefix_dup_copies"] > 0  # stock SGLang's FCFS does it too


def test_topas_and_topas_plus_copy_no_more_prefix_tokens_than_lpm(runs):
    lpm = runs["lpm"]["prefix_dup_tokens"]
    assert runs["topas"]["prefix_dup_tokens"] <= lpm
    assert runs["topas-plus"]["prefix_dup_tokens"] <= lpm
    assert runs["topas"]["prefix_dup_copies"] == runs["topas-plus"]["prefix_dup_copies"] == 0


def test_the_engine_guard_holds_back_any_policys_second_request_of_a_cold_prefix(runs):
    assert runs["fcfs guarded"]["prefix_dup_copies"] == 0
    assert runs["fcfs guarded"]["n_tasks"] == runs["fcfs"]["n_tasks"]  # every task still finishes


def test_admit_cap_one_request_computes_a_cold_prefix_the_others_wait():
    assert admit_cap(in_tree=True, computing=False, restorable=False, sharing=False) is None
    assert admit_cap(in_tree=False, computing=False, restorable=False, sharing=False) == 1
    assert admit_cap(in_tree=False, computing=True, restorable=False, sharing=False) == 0
    # a copy from host memory or a re-pin of a cached prefix: every request matches it
    assert admit_cap(in_tree=False, computing=False, restorable=True, sharing=False) is None
    assert admit_cap(in_tree=False, computing=True, restorable=False, sharing=True) is None


def test_within_caps_keeps_the_order_and_holds_back_past_each_cap():
    @dataclasses.dataclass
    class R:
        rid: str
        agent: str

    queue = [R("1", "hot"), R("2", "cold"), R("3", "cold"), R("4", "busy"), R("5", "hot")]
    caps = {"hot": None, "cold": 1, "busy": 0}
    keep, held = within_caps(queue, caps.__getitem__)
    assert [r.rid for r in keep] == ["1", "2", "5"] and [r.rid for r in held] == ["3", "4"]


def test_topas_admits_one_request_of_an_agent_whose_prefix_is_not_in_the_tree():
    # three single-stage tasks of agent a wait; a's prefix is not resident: the plan loads it and
    # admits one (its gain is the best), the others wait for the prefix to be cached
    tasks = [task_view(f"t{i}", 0.0, (("A", ()),), "lower") for i in range(3)]
    waiting = [req(f"t{i}", "A", "a") for i in range(3)]
    view = engine_view(0.0, [pfx("a", resident=False, on_host=False)], tasks, waiting)
    assert make_policy("topas").decide(view).admit == ("t0/A",)
    assert len(make_policy("topas", in_batch_guard=False).decide(view).admit) == 3
    # once the prefix is in the tree, all three go
    hot = engine_view(0.0, [dataclasses.replace(pfx("a", resident=True), in_tree=True)], tasks, waiting)
    assert len(make_policy("topas").decide(hot).admit) == 3


def test_a_held_request_is_admitted_as_soon_as_its_prefix_enters_the_tree():
    # one agent, four calls at once: the first computes the prefix, the others match it (cached
    # tokens = the prefix) and start at the iteration after it entered the tree, not recheck_steps
    # decode steps later
    tr = trace({"a": 2000}, [task(f"t{i}", 0.0, stage("S", "a", 100, 400)) for i in range(4)])
    on = simulate(tr, make_policy("topas"), COST, EngineConfig(kv_budget=10_000))
    off = simulate(tr, make_policy("topas"), COST, EngineConfig(kv_budget=10_000, recheck_on_insert=False))
    req_on, req_off = on.requests.set_index("rid"), off.requests.set_index("rid")
    assert on.summary["prefix_dup_copies"] == 0
    assert (req_on["cached_tokens"] > 0).sum() == 3
    later = [f"t{i}/S" for i in range(1, 4)]
    assert (req_on.loc[later, "first_admit"] < req_off.loc[later, "first_admit"]).all()


# ----------------------------------------------------------------------------- memory: the engine's rule

PREFIXES = [pfx("a", resident=True)] + [pfx(a) for a in "bcd"]


def test_topas_plans_what_the_engine_admits(runs):
    s = runs["topas"]
    assert s["planned_admits"] == s["admitted"] > 0
    earlier = runs["topas earlier"]  # its estimate of d_r is short of the engine's reservation
    assert earlier["admitted"] < earlier["planned_admits"]
    # ordering policies plan nothing: their admit list is an order of the whole queue
    assert runs["lpm"]["planned_admits"] is None and runs["lpm"]["admitted"] > 0


def test_a_waiting_requests_demand_is_the_engines_admission_check():
    tasks = [task_view("t1", 0.0, DAG4, "lower")]
    w = dataclasses.replace(req("t1", "A", "a", generated=7), reserve=250)
    view = engine_view(0.0, PREFIXES, tasks, [w])
    ctx = _DecisionCtx(make_policy("topas"), view)
    assert ctx.demand["t1/A"] == 100 + 7 + 1 + 250  # prompt, the first token's slot, the reservation
    r = dataclasses.replace(req("t2", "A", "a", generated=20, running=True), reserve=40)
    tasks.append(task_view("t2", 0.0, DAG4, "lower"))
    ctx = _DecisionCtx(make_policy("topas"), engine_view(0.0, PREFIXES, tasks, [w], [r]))
    assert ctx.run_demand["t2/A"] == 120 + 40  # its KV and what the engine reserves for it


def test_the_gains_never_read_the_reservation():
    # the reservation follows max_new_tokens (a request parameter, the output length on our traces);
    # TOPAS uses it for memory only: its residual times and gains are the non-clairvoyant ones
    tasks = [task_view(f"t{i}", 0.0, DAG4, "lower") for i in range(2)]
    small = [dataclasses.replace(req(f"t{i}", "A", "a"), reserve=10) for i in range(2)]
    large = [dataclasses.replace(r, reserve=5000) for r in small]
    gains = [_DecisionCtx(make_policy("topas"), engine_view(0.0, PREFIXES, tasks, w)).gain
             for w in (small, large)]
    assert gains[0] == gains[1]


# ----------------------------------------------------------------------------- V_reuse's price


@pytest.mark.parametrize("host_tier", [False, True])
def test_v_reuse_prices_a_reuse_at_what_the_engine_pays_to_reload(host_tier):
    tasks = [task_view("t1", 0.0, DAG4, "lower")]
    view = dataclasses.replace(engine_view(0.0, PREFIXES, tasks, [req("t1", "A", "a")]),
                               host_tier=host_tier)
    swap, prefill = COST.swap_time(1000), COST.prefill_time([(1000, 0)])
    assert _DecisionCtx(make_policy("topas"), view).reload["a"] == (swap if host_tier else prefill)
    assert _DecisionCtx(make_policy("topas", reuse_cost="swap"), view).reload["a"] == swap


# ----------------------------------------------------------------------------- preemptions


def test_every_run_counts_preemptions_whose_room_went_unused(runs):
    for s in runs.values():
        assert 0 <= s["preempt_unused"] <= s["preemptions"]
    assert runs["lpm"]["preempt_unused"] == 0  # it never preempts
