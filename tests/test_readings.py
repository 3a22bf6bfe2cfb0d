"""The space of readings (issue 13): every open choice is a named parameter whose default is the
reading of the figures so far, and each alternative does what its docstring says.

Hand-built views show each alternative where it makes a difference; a pinned run shows that the
defaults did not move.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from topas.engine.config import EngineConfig, engine_config
from topas.engine.cost import load_profile
from topas.engine.simulator import Simulator, simulate
from topas.engine.view import EngineView, PrefixView, RequestView, StageView, TaskView
from topas.experiments import Experiment, run_experiment
from studies.claims.readings import ENGINE, READINGS, Variant, factorial, one_at_a_time, variant
from topas.policies import PolicyError, make_policy, policy_class
from topas.policies.base import key_params
from topas.policies.estimates import OperatingPoint
from topas.policies.topas import TopasParams, _DecisionCtx
from topas.policies.topas_params import EARLIER_PLAN
from topas.policies.topas_terms import aging, delta_task
from tests.conftest import stage, task, trace

COST = load_profile()
FIXTURE = Path(__file__).parent / "fixtures" / "topas_default_jcts.json"


# ============================================================================ defaults unchanged


@pytest.mark.parametrize("run", json.loads(FIXTURE.read_text())["runs"], ids=lambda r: r["workload"])
def test_topas_with_the_earlier_plan_gives_the_jcts_of_the_code_before_the_readings(run):
    # the readings' defaults are that code's; the plan = execution switches (in_batch_guard,
    # demand, reuse_cost) and the engine's recheck_on_insert at their earlier values give it back
    # (beta 1: the default before the re-selection, scripts/select_plan_execution.py)
    res = run_experiment(Experiment(run["workload"], "topas", {**EARLIER_PLAN, "beta": 1.0}, load=run["load"], seed=0,
                                    n_tasks=run["n_tasks"],
                                    engine_options={**run["engine_options"], "recheck_on_insert": False}))
    assert [round(x, 6) for x in res.tasks["jct"].tolist()] == run["jct"]


def test_default_runs_keep_their_experiment_keys():
    # the new parameters are left out of the key at their defaults (OMIT_DEFAULT), so a default
    # run's canonical form is the one stored before them
    new = {"search", "aging_form", "admit_norm", "sibling_share", "redo", "move_cost"}
    assert new <= {f.name for f in dataclasses.fields(TopasParams)}
    assert not new & set(key_params(make_policy("topas").params))
    assert set(key_params(make_policy("topas", search="local+").params)) & new == {"search"}
    assert "preempt" not in key_params(make_policy("autellix-las").params)


# ============================================================================ the registry


def test_every_axis_default_is_the_policy_default_and_every_alternative_is_accepted():
    for ax in READINGS.values():
        if ax.applies_to == ENGINE:
            for v in ax.values:
                for pol in ("topas", "lpm"):
                    engine_config(ax.engine_options(v, pol))  # accepted by the engine
            continue
        fields = {f.name: f for f in dataclasses.fields(policy_class(ax.applies_to).Params)}
        assert ax.param in fields, f"{ax.name}: {ax.applies_to} has no parameter {ax.param}"
        assert fields[ax.param].default == ax.default, ax.name
        assert ax.default not in ax.alternatives and len(set(ax.alternatives)) == len(ax.alternatives)
        for v in ax.alternatives:
            assert getattr(make_policy(ax.applies_to, {ax.param: v}).params, ax.param) == v


def test_every_axis_says_what_the_paper_leaves_open():
    for ax in READINGS.values():
        assert ax.description and "\n" not in ax.description, ax.name


def test_unknown_axes_and_values_are_named_in_the_error():
    with pytest.raises(ValueError, match=r"unknown reading axis 'serch'; valid axes: search, "):
        one_at_a_time(["topas"], ["serch"])
    with pytest.raises(ValueError, match=r"unknown reading axis 'nope'"):
        factorial(["search", "nope"])
    with pytest.raises(ValueError, match=r"reading axis 'search' has no value 'greedy'; valid values: 'local', "):
        variant("topas", {"search": "greedy"})
    with pytest.raises(ValueError, match=r"reading axis 'search' given twice"):
        factorial(["search", "search"])


def test_the_policies_reject_unknown_reading_values_by_name():
    with pytest.raises(PolicyError, match=r"'search': 'greedy' is not one of \('local', 'local\+', 'exhaustive'\)"):
        make_policy("topas", search="greedy")
    with pytest.raises(PolicyError, match=r"topas parameter aging_form='cubic' is not one of"):
        TopasParams(aging_form="cubic")
    with pytest.raises(ValueError, match=r"swap_bandwidth_scale must be a finite number > 0, got 0"):
        EngineConfig(swap_bandwidth_scale=0)
    with pytest.raises(ValueError, match=r"engine option swap_bandwidth_scale='fast': expected a float"):
        engine_config({"swap_bandwidth_scale": "fast"})


def test_one_at_a_time_changes_exactly_one_axis_from_the_defaults():
    vs = one_at_a_time(["topas", "parrot-fcfs", "autellix-las"])
    assert all(isinstance(v, Variant) for v in vs)
    by = {(v.policy, v.label): v for v in vs}
    assert by[("topas", "default")] == Variant("default", "topas", {}, {})
    assert by[("topas", "search=local+")].params == {"search": "local+"}
    assert by[("topas", "host_tier=topas-only")].engine_options == {"host_tier": True}
    assert by[("parrot-fcfs", "host_tier=topas-only")].engine_options == {}  # the baselines keep stock SGLang
    assert by[("parrot-fcfs", "host_tier=all")].engine_options == {"host_tier": True}
    assert by[("parrot-fcfs", "parrot_grouping=False")].params == {"group_prefixes": False}
    assert by[("autellix-las", "autellix_preempt=True")].params == {"preempt": True}
    assert by[("topas", "swap_bandwidth=0.5")].engine_options == {"host_tier": True, "swap_bandwidth_scale": 0.5}
    assert ("parrot-fcfs", "search=local+") not in by  # a TOPAS axis is not varied for a baseline
    for v in vs:
        assert v.label == "default" or "," not in v.label
    n_topas = sum(len(ax.alternatives) for ax in READINGS.values() if ax.applies("topas"))
    assert sum(v.policy == "topas" for v in vs) == 1 + n_topas


def test_factorial_crosses_the_chosen_axes_with_one_label_per_combination_across_policies():
    vs = factorial(["search", "host_tier"], ["topas", "lpm"])
    topas = [v for v in vs if v.policy == "topas"]
    assert len(topas) == 3 * 3
    assert {v.label for v in topas} == {v.label for v in vs if v.policy == "lpm"}
    v = next(v for v in topas if v.label == "search=exhaustive,host_tier=topas-only")
    assert v.params == {"search": "exhaustive"} and v.engine_options == {"host_tier": True}
    lpm = next(v for v in vs if v.policy == "lpm" and v.label == "search=exhaustive,host_tier=topas-only")
    assert lpm.params == {} and lpm.engine_options == {}
    # a swap bandwidth without a host tier swaps nothing: no option is set
    none = variant("topas", {"host_tier": "none", "swap_bandwidth": 0.5})
    assert none.engine_options == {} and none.label == "swap_bandwidth=0.5"
    assert variant("topas", {"host_tier": "all", "swap_bandwidth": 2.0}).engine_options == {
        "host_tier": True, "swap_bandwidth_scale": 2.0}


def test_a_variant_becomes_an_experiment():
    v = variant("topas", {"search": "local+", "host_tier": "topas-only"})
    e = v.experiment("dag-4", load=1.0, n_tasks=5)
    assert e.policy == "topas" and dict(e.params) == {"search": "local+"}
    assert dict(e.engine_options) == {"host_tier": True}


# ============================================================================ hand-built views


def _view(prefixes, tasks, running=(), budget=20_000, time=0.0, host_tier=False, decode_batch=4):
    """``prefixes``: agent -> dict(tokens, resident, cached=False, on_host=False, out=200 (the
    prior output)); ``tasks``: (task id, arrival, [(stage, agent, x, parents)], done stages);
    ``running``: (rid, generated) of the ready stages that run; the other ready stages wait."""
    run_gen = dict(running)
    tvs, waiting, run = {}, [], []
    for tid, arrival, stages, done in tasks:
        children = {s: tuple(c for c, _, _, ps in stages if s in ps) for s, _, _, _ in stages}
        sv = {s: StageView(s, a, x, tuple(ps), children[s]) for s, a, x, ps in stages}
        tvs[tid] = TaskView(tid, arrival, "w", sv, tuple(s for s, *_ in stages), frozenset(done), {})
        for s, a, x, ps in stages:
            rid = f"{tid}/{s}"
            if s in done or not all(p in done for p in ps):
                continue
            if rid in run_gen:
                g = run_gen[rid]
                run.append(RequestView(rid, tid, s, a, x, g, arrival, x + g, 1.0, 0, arrival))
            else:
                waiting.append(RequestView(rid, tid, s, a, x, 0, arrival, 0, 0.0, 0))
    refs: dict[str, int] = {}
    for r in run:
        refs[r.agent] = refs.get(r.agent, 0) + 1
    pv = {a: PrefixView(a, d["tokens"], float(d.get("out", 200)), d["resident"], d.get("on_host", False),
                        refs.get(a, 0), 0.0, d.get("cached", False)) for a, d in prefixes.items()}
    return EngineView(time=time, kv_budget=budget, prefix_tokens=sum(p.tokens for p in pv.values() if p.resident),
                      request_tokens=sum(r.kv_tokens for r in run), prefixes=pv, running=tuple(run),
                      waiting=tuple(waiting), tasks=tvs, cost=COST, decode_batch=decode_batch, host_tier=host_tier)


def _ctx(view, **params):
    pol = make_policy("topas", params)
    return pol, _DecisionCtx(pol, view)


def _crowded():
    """Two small resident prefixes with nothing to do, a third serving a running request, and a
    large one whose waiting request fits only if both small ones go: no local move (add one,
    add two, drop one, swap) reaches {L, R}."""
    prefixes = {"S1": dict(tokens=3000, resident=True), "S2": dict(tokens=3000, resident=True),
                "R": dict(tokens=500, resident=True), "L": dict(tokens=9000, resident=False, out=400)}
    tasks = [("t0", 0.0, [("A", "L", 2000, ())], ()), ("t9", 0.0, [("X", "R", 100, ())], ())]
    return _view(prefixes, tasks, running=[("t9/X", 10)], budget=14_100)


@pytest.mark.parametrize("search,finds", [("local", False), ("local+", True), ("exhaustive", True)])
def test_drop_two_add_one_lets_a_large_prefix_displace_two_small_ones(search, finds):
    pol = make_policy("topas", M=0, search=search)
    pol.credits["t9/X"] = 50.0  # the running request's admission credit: preempting it costs that
    d = pol.decide(_crowded())
    if finds:
        assert (d.load, d.evict, d.admit, d.preempt) == (("L",), ("S1", "S2"), ("t0/A",), ())
    else:
        assert (d.load, d.evict, d.admit) == ((), (), ())


def test_exhaustive_search_scores_every_subset_of_the_pool_whatever_M():
    _, ctx = _ctx(_crowded(), M=0, search="exhaustive")
    _, evaluated = ctx.search()
    # the 16 subsets of {L, R, S1, S2} less the two over the budget ({L, S1, S2} and with R)
    assert evaluated == 16 - 2
    _, local = _ctx(_crowded(), M=0)
    assert local.search()[1] < evaluated


def test_linear_aging_grows_faster_than_log_aging():
    assert aging(600.0, 0.0, 0.5, 60.0, "log") == pytest.approx(1 + 0.5 * math.log(11))
    assert aging(600.0, 0.0, 0.5, 60.0, "linear") == pytest.approx(1 + 0.5 * 10)
    assert aging(30.0, 0.0, 0.5, 60.0, "linear") > aging(30.0, 0.0, 0.5, 60.0, "log")
    with pytest.raises(ValueError, match=r"aging form 'cubic' is not one of"):
        aging(1.0, 0.0, 0.5, 60.0, "cubic")


def test_linear_aging_lets_an_old_short_task_overtake_a_young_long_one():
    prefixes = {"a": dict(tokens=1000, resident=True, out=100), "b": dict(tokens=1000, resident=True, out=400)}
    tasks = [("old", 0.0, [("S", "a", 100, ())], ()), ("young", 590.0, [("S", "b", 100, ())], ())]
    view = _view(prefixes, tasks, time=600.0)
    first = {form: _ctx(view, aging_form=form)[1].cands[0].task_id for form in ("log", "linear")}
    assert first == {"log": "young", "linear": "old"}


def test_remaining_normalisation_values_a_request_by_the_share_of_its_task_it_commits():
    # a 3-stage chain's first stage commits 10 s of its 30 s; a lone short stage all of its 6 s
    prefixes = {"long": dict(tokens=1000, resident=True, out=400), "short": dict(tokens=1000, resident=True, out=240)}
    chain = [("A", "long", 100, ()), ("B", "long", 100, ("A",)), ("C", "long", 100, ("B",))]
    tasks = [("chain", 0.0, chain, ()), ("single", 0.0, [("S", "short", 100, ())], ())]
    view = _view(prefixes, tasks)
    _, absolute = _ctx(view)
    _, fraction = _ctx(view, admit_norm="fraction")
    _, remaining = _ctx(view, admit_norm="remaining")
    assert absolute.cands[0].task_id == "chain"
    assert fraction.cands[0].task_id == "single" and remaining.cands[0].task_id == "single"
    tc = fraction.tasks["chain"]
    assert fraction.gain["chain/A"] == pytest.approx(tc.g * tc.residual["A"] / tc.L(frozenset()))
    assert fraction.gain["single/S"] == pytest.approx(fraction.tasks["single"].g)  # all of its path
    # "remaining": the same fractions, in seconds of the decision's mean remaining path
    mean_path = (tc.L(frozenset()) + fraction.tasks["single"].L(frozenset())) / 2
    for rid in ("chain/A", "single/S"):
        assert remaining.gain[rid] == pytest.approx(fraction.gain[rid] * mean_path)


@pytest.mark.parametrize("share", ["residual", "equal", "last"])
def test_sibling_share_splits_the_frontier_gain(share):
    # A -> {B (long), C (short)}: A done, both siblings wait; the frontier's gain is the longer one
    prefixes = {"a": dict(tokens=500, resident=True), "long": dict(tokens=500, resident=True, out=400),
                "short": dict(tokens=500, resident=True, out=100)}
    stages = [("A", "a", 100, ()), ("B", "long", 100, ("A",)), ("C", "short", 100, ("A",))]
    _, ctx = _ctx(_view(prefixes, [("t", 0.0, stages, ("A",))]), sibling_share=share)
    tc = ctx.tasks["t"]
    total = tc.g * delta_task(tc.order, tc.children, tc.residual, frozenset(), ("B", "C"))  # g_i * Delta_task(F | H)
    b, c = ctx.gain["t/B"], ctx.gain["t/C"]
    assert b + c == pytest.approx(total)
    expected = {"residual": tc.residual["B"] / (tc.residual["B"] + tc.residual["C"]), "equal": 0.5, "last": 0.0}
    assert b / total == pytest.approx(expected[share])  # "last": C comes after B in topological order


def _preempting():
    """Agent P's request runs with 128 tokens generated, Q's runs too; a waiting request of W."""
    prefixes = {"P": dict(tokens=2000, resident=True), "Q": dict(tokens=500, resident=True, out=50),
                "W": dict(tokens=500, resident=True)}
    tasks = [("p", 0.0, [("S", "P", 300, ())], ()), ("q", 0.0, [("S", "Q", 100, ())], ()),
             ("w", 0.0, [("S", "W", 100, ())], ())]
    return _view(prefixes, tasks, running=[("p/S", 128), ("q/S", 10)])


def test_redo_as_reprefill_charges_one_prefill_and_the_wait_to_be_readmitted():
    view = _preempting()
    pol, decode = _ctx(view)
    _, reprefill = _ctx(view, redo="reprefill")
    victim = next(r for r in view.running if r.rid == "p/S")
    tpot = OperatingPoint.of(view).tpot
    assert decode._redo([victim], {"p/S"}, []) == pytest.approx(tpot * 128)
    prefill = COST.prefill_time([(300 + 128, 2000)])
    # the soonest it can be readmitted: when q/S (40 tokens left) finishes
    q_left = pol.estimator.expected_remaining("Q", 50.0, 10) * tpot
    assert reprefill._redo([victim], {"p/S"}, []) == pytest.approx(prefill + q_left)
    assert prefill < 0.2 < tpot * 128  # the engine's rebuild is far cheaper than re-decoding


def test_engine_move_costs_follow_what_the_engine_does():
    prefixes = {"gone": dict(tokens=4000, resident=False), "ghost": dict(tokens=4000, resident=False, cached=True),
                "here": dict(tokens=4000, resident=True), "saved": dict(tokens=4000, resident=False, on_host=True)}
    swap, prefill = COST.swap_time(4000), COST.prefill_time([(4000, 0)])
    for host_tier in (False, True):
        view = _view(prefixes, [("t", 0.0, [("S", "here", 10, ())], ())], host_tier=host_tier)
        _, paper = _ctx(view)
        _, engine = _ctx(view, move_cost="engine")
        assert paper.move_out["here"] == swap and paper.move_in["ghost"] == prefill  # the paper's prices
        assert engine.move_in["gone"] == prefill and engine.move_in["saved"] == swap
        assert engine.move_in["ghost"] == 0.0  # still cached: pinning it again is free
        assert engine.move_out["here"] == (swap if host_tier else 0.0)  # no host tier: unpin only


def test_the_simulator_shows_a_managing_policy_its_unpinned_but_cached_prefixes_and_the_host_tier():
    # P is unpinned at 10 s for Q and still in the radix cache at 20 s (it is reloaded for free);
    # with a host tier an evicted prefix goes to host memory instead
    tr = trace({"P": 100, "Q": 100}, [task("t0", 0.0, stage("S", "P", 50, 5)), task("t1", 10.0, stage("S", "Q", 50, 5)),
                                      task("t2", 20.0, stage("S", "P", 50, 5))])
    seen: list[EngineView] = []

    class Spy(policy_class("topas")):
        name = "topas"

        def decide(self, view):
            seen.append(view)
            return super().decide(view)

    # (the estimate plan: its d_r, with the prior's output, does not fit P, Q and Q's call in 300)
    res = simulate(tr, Spy(**EARLIER_PLAN), COST, EngineConfig(kv_budget=300))
    at20 = next(v for v in seen if v.time == 20.0).prefixes["P"]
    assert (at20.resident, at20.cached, at20.on_host) == (False, True, False)
    assert "load_cached" in set(res.prefix_events["event"]) and not any(v.host_tier for v in seen)
    seen.clear()
    simulate(tr, Spy(**EARLIER_PLAN), COST, EngineConfig(kv_budget=300, host_tier=True))
    at20 = next(v for v in seen if v.time == 20.0).prefixes["P"]
    assert (at20.resident, at20.cached, at20.on_host) == (False, False, True) and all(v.host_tier for v in seen)


# ============================================================================ baselines


def test_parrot_without_grouping_is_plain_task_fifo():
    prefixes = {"a": dict(tokens=100, resident=True), "b": dict(tokens=100, resident=True)}
    tasks = [("t1", 0.0, [("S", "a", 10, ())], ()), ("t2", 1.0, [("S", "b", 10, ())], ()),
             ("t3", 2.0, [("S", "a", 10, ())], ())]
    view = _view(prefixes, tasks)
    assert make_policy("parrot-fcfs").decide(view).admit == ("t1/S", "t3/S", "t2/S")
    assert make_policy("parrot-fcfs", group_prefixes=False).decide(view).admit == ("t1/S", "t2/S", "t3/S")


def _autellix_view(service_running: float):
    prefixes = {"a": dict(tokens=100, resident=True), "b": dict(tokens=100, resident=True)}
    tasks = [("old", 0.0, [("S", "a", 10, ())], ()), ("new", 5.0, [("S", "b", 10, ())], ())]
    v = _view(prefixes, tasks, running=[("old/S", 100)], time=6.0)
    run = dataclasses.replace(v.running[0], service_time=service_running)
    return dataclasses.replace(v, running=(run,))


def test_autellix_with_preemption_preempts_a_demoted_call_that_blocks_a_higher_queue():
    pol = make_policy("autellix-las", preempt=True)
    demoted = _autellix_view(service_running=5.0)  # past Q_1's 4 s: in Q_2; the new call is in Q_1
    first = pol.decide(demoted)
    assert first.admit == ("new/S",) and first.preempt == ()  # the engine may still admit it
    again = pol.decide(demoted)  # still waiting at the next decision: the engine could not admit it
    assert again.preempt == ("old/S",)
    # the same situation without preemption, or with both calls in one queue: nobody is preempted
    off = make_policy("autellix-las")
    assert off.decide(demoted).preempt == () and off.decide(demoted).preempt == ()
    same = make_policy("autellix-las", preempt=True)
    same.decide(_autellix_view(service_running=1.0))
    assert same.decide(_autellix_view(service_running=1.0)).preempt == ()


def test_the_engine_lets_a_declared_non_managing_policy_preempt_and_runs_it_to_the_end():
    pol = make_policy("autellix-las", preempt=True)
    assert not pol.manages_prefixes and pol.may_preempt
    res = run_experiment(Experiment("metagpt-tl", "autellix-las", {"preempt": True}, load=1.2, n_tasks=12))
    assert res.summary["preemptions"] > 0 and len(res.tasks) == 12 and res.tasks["jct"].notna().all()
    assert run_experiment(Experiment("metagpt-tl", "autellix-las", {}, load=1.2, n_tasks=12)).summary["preemptions"] == 0


# ============================================================================ engine


def test_swap_bandwidth_scale_scales_the_profiles_bandwidth():
    tr = trace({"P": 100}, [task("t0", 0.0, stage("S", "P", 50, 5))])
    sim = Simulator(tr, make_policy("fcfs"), COST, engine_config({"swap_bandwidth_scale": "0.5"}))
    assert sim.cost.swap_bandwidth == pytest.approx(0.5 * COST.swap_bandwidth)
    assert sim.cost.swap_time(1000) > COST.swap_time(1000)


def test_swap_bandwidth_changes_the_engine_only_with_a_host_tier():
    def run(policy, opts):
        return run_experiment(Experiment("chain-3", policy, {}, load=1.4, n_tasks=40, engine_options=opts)).summary

    base, slow = run("lpm", {"host_tier": True}), run("lpm", {"host_tier": True, "swap_bandwidth_scale": 0.05})
    assert base["bytes_swapped"] > 0 and slow["jct_mean"] > base["jct_mean"]
    # no host tier: nothing is swapped, a policy that does not price swaps runs the same
    assert run("lpm", {"swap_bandwidth_scale": 0.05})["jct_mean"] == run("lpm", {})["jct_mean"]
    # ...but TOPAS prices J_move and V_reuse with B_swap whatever the tier (the paper's formulas)
    assert run("topas", {"swap_bandwidth_scale": 0.05})["jct_mean"] != run("topas", {})["jct_mean"]


def test_a_host_tier_for_one_policy_only_is_a_per_experiment_engine_option():
    topas = run_experiment(Experiment("chain-3", "topas", {}, load=1.4, n_tasks=40, engine_options={"host_tier": True}))
    lpm = run_experiment(Experiment("chain-3", "lpm", {}, load=1.4, n_tasks=40))
    assert topas.summary["bytes_swapped"] > 0 and topas.summary["prefix_loads_swap"] > 0
    assert lpm.summary["bytes_swapped"] == 0 and lpm.summary["prefix_loads_swap"] == 0
