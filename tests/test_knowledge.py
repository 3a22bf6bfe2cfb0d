"""What a scheduler cannot know (issue 16): noisy/biased output priors, DAGs shown online, bursts.

The settings change only what a policy *sees* (``topas.engine.knowledge``); these tests assert on
the views a recording policy receives, check that the defaults are today's behaviour exactly
(results and experiment keys), and that noisy priors are the same in every process.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp

import numpy as np
import pytest

import test_sglang_adapter as tsa
from conftest import kept_view
from topas.engine.config import EngineConfig
from topas.engine.cost import load_profile
from topas.engine.knowledge import Knowledge, KnowledgeError, noise_factor, reveal
from topas.engine.simulator import simulate
from topas.experiments.spec import Experiment, ExperimentError, prepare, run_prepared
from topas.policies.base import make_policy
from topas.policies.estimates import OutputEstimator, estimator_convergence, make_estimator
from topas.policies.history import WorkflowHistory
from topas.workload.arrivals import poisson_arrivals, retime
from topas.workload.synthetic import dag4
from topas.workload.trace_io import read_trace
from topas.paths import traces_dir

POLICIES = ["fcfs", "lpm", "spf", "parrot-fcfs", "autellix-las", "topas", "topas-request-only"]


def _recording(name: str, **params):
    """A policy of ``name`` that keeps every view it is shown."""
    policy = make_policy(name, params)
    views = []
    decide = policy.decide

    def record(view):
        views.append(kept_view(view))
        return decide(view)

    policy.decide = record
    policy.reads_tasks = True  # it keeps the views, tasks included
    return policy, views


def _small_dag4(n=10, rate=0.6, seed=2):
    # varied outputs so the true lengths differ from the prior
    return retime(dag4(n_tasks=n, prefix_tokens=1024, input_tokens=256, output_tokens=64), rate=rate, seed=seed)


# ----------------------------------------------------------------------------- online DAGs


@pytest.mark.parametrize("policy", POLICIES)
def test_online_views_show_only_reached_stages_and_no_true_outputs(policy):
    trace = _small_dag4()
    true_y = {(t.id, s.id): s.output_tokens for t in trace.tasks for s in t.stages}
    pol, views = _recording(policy)
    res = simulate(trace, pol, load_profile(), EngineConfig(), knowledge=Knowledge(dag_visibility="online"))
    assert res.summary["n_tasks"] == 10 and len(views) > 5
    saw_partial = False
    for v in views:
        live = {(r.task_id, r.stage_id) for r in (*v.waiting, *v.running)}
        for tid, tv in v.tasks.items():
            reached = set(tv.done) | {s for (t, s) in live if t == tid}
            assert set(tv.stages) == reached, (tid, set(tv.stages), reached)  # nothing unreached
            assert tuple(s for s in tv.topo_order) == tuple(tv.stages) and not tv.complete
            for st in tv.stages.values():
                assert set(st.children) <= set(tv.stages) and set(st.parents) <= set(tv.done)
            assert set(tv.observed_output) == set(tv.done)  # outputs only once observed
            saw_partial |= len(tv.stages) < 4
        for r in (*v.waiting, *v.running):  # a request view has no output length at all
            assert not {f.name for f in dataclasses.fields(r)} & {"y", "output_tokens", "output"}
            assert r.generated < true_y[(r.task_id, r.stage_id)] or r in v.running
    assert saw_partial


def test_full_visibility_shows_the_whole_dag():
    trace = _small_dag4(n=4)
    pol, views = _recording("spf")
    simulate(trace, pol, load_profile(), EngineConfig())
    assert all(len(tv.stages) == 4 and tv.complete for v in views for tv in v.tasks.values())


def test_a_simulators_knowledge_is_fixed_at_construction():
    """The views' caches are built from it (the prefixes' priors), so it cannot change later."""
    from topas.engine.simulator import Simulator

    tr = dag4(n_tasks=2, seed=0)
    know = Knowledge(prior_noise=0.5, seed=1)
    sim = Simulator(tr, make_policy("fcfs"), load_profile("a100-80gb_qwen2.5-32b"), knowledge=know)
    assert sim.knowledge is know
    with pytest.raises(AttributeError):
        sim.knowledge = Knowledge()


def test_reveal_restricts_children_to_reached_stages():
    trace = dag4(n_tasks=1)
    t = trace.tasks[0]
    from topas.engine.view import StageView

    stages = {s.id: StageView(s.id, s.agent, s.input_tokens, s.parents, t.children[s.id]) for s in t.stages}
    shown, order = reveal(stages, t.topo_order, {"A", "B"})
    assert order == ("A", "B") and shown["A"].children == ("B",) and shown["B"].children == ()  # D unreached
    shown, order = reveal(stages, t.topo_order, {"A", "B", "C", "D"})
    assert shown == stages and order == t.topo_order


def test_the_sglang_adapter_filters_its_view_like_the_simulator():
    """The adapter, fed the simulator's state with the knowledge in the request metadata, shows
    the policy exactly the simulator's (noisy, online) view at every decision."""
    know = Knowledge(prior_noise=0.7, prior_bias=1.5, dag_visibility="online", seed=5)
    settings = tuple(sorted(know.settings().items()))
    orig_meta = tsa._meta
    tsa._meta = lambda sim, r: dataclasses.replace(orig_meta(sim, r), knowledge=settings)
    try:
        trace = retime(dag4(n_tasks=10, prefix_tokens=1024, input_tokens=256, output_tokens=64), rate=2.0, seed=3)
        cost = load_profile().with_budget(200_000)
        # the knowledge is the simulator's from its start (its view's per-agent cache reads the priors then)
        m = tsa.Mirror(trace, make_policy("topas"), make_policy("topas"), cost, EngineConfig(), knowledge=know)
        res = m.run()
    finally:
        tsa._meta = orig_meta
    assert res.summary["n_tasks"] == 10 and m.compared > 5
    assert m.adapter.knowledge == know
    view = m.adapter.last_view
    assert any(not tv.complete for tv in view.tasks.values()) or not view.tasks
    a = next(iter(trace.agents.values()))
    assert view.prefixes[a.name].expected_output_tokens == pytest.approx(
        a.expected_output_tokens * 1.5 * noise_factor(0.7, 5, a.name))


def test_request_metadata_carries_knowledge_only_when_set():
    trace = dag4(n_tasks=1)
    meta = tsa._meta(type("S", (), {"trace": trace})(), type("R", (), {
        "task": type("T", (), {"task": trace.tasks[0]})(), "stage": trace.tasks[0].stages[0], "ready_time": 0.0})())
    assert "knowledge" not in meta.to_json()
    noisy = dataclasses.replace(meta, knowledge=(("dag_visibility", "online"), ("prior_noise", 0.5), ("seed", 1)))
    back = tsa.meta_from_custom_params({"topas": noisy.to_json()})
    assert back == noisy and Knowledge.from_settings(dict(back.knowledge)).online


# ----------------------------------------------------------------------------- priors


@pytest.mark.parametrize("policy", ["spf", "topas"])
def test_noisy_priors_reach_the_policy_and_the_engine_runs_true_lengths(policy):
    trace = _small_dag4()
    know = Knowledge(prior_noise=1.0, prior_bias=2.0, seed=7)
    pol, views = _recording(policy)
    res = simulate(trace, pol, load_profile(), EngineConfig(), knowledge=know)
    for a, agent in trace.agents.items():
        want = agent.expected_output_tokens * 2.0 * noise_factor(1.0, 7, a)
        assert all(v.prefixes[a].expected_output_tokens == pytest.approx(want) for v in views)
    # the engine generated exactly the true outputs
    req = res.requests.set_index("rid")
    for t in trace.tasks:
        for s in t.stages:
            assert req.loc[f"{t.id}/{s.id}", "output_tokens"] == s.output_tokens


def test_noise_factor_is_log_normal_with_median_one():
    z = np.log([noise_factor(0.5, seed, "agent") for seed in range(4000)]) / 0.5
    assert abs(np.mean(z)) < 0.06 and abs(np.std(z) - 1) < 0.05
    assert noise_factor(0.0, 3, "a") == 1.0 and noise_factor(0.5, 3, "a") != noise_factor(0.5, 3, "b")


def _factors(args):
    seed, agents = args
    return [noise_factor(0.8, seed, a) for a in agents]


def test_the_same_seed_gives_the_same_noisy_priors_in_every_process():
    agents = ["Architect", "Engineer2", "TeamLeader:2", "dag4.A"]
    here = _factors((11, agents))
    with mp.get_context("spawn").Pool(2) as pool:  # fresh interpreters, other string-hash seeds
        there = pool.map(_factors, [(11, agents), (11, agents)])
    assert there == [here, here]


def test_bad_knowledge_settings_name_the_item():
    with pytest.raises(KnowledgeError, match="prior_noise"):
        Knowledge(prior_noise=-0.1)
    with pytest.raises(KnowledgeError, match="dag_visibility"):
        Knowledge(dag_visibility="partial")
    with pytest.raises(ExperimentError, match="prior_bias"):
        Experiment("dag-4", "fcfs", prior_bias=0)
    with pytest.raises(ExperimentError, match="gamma:CV"):
        Experiment("dag-4", "fcfs", load=1.0, arrivals="gamma:-1")
    with pytest.raises(ExperimentError, match="rate or load"):
        Experiment("dag-4", "fcfs", arrivals="gamma:2")


# ----------------------------------------------------------------------------- defaults = today


def test_defaults_keep_todays_keys_and_canonical_form():
    base = Experiment("dag-4", "topas", load=1.2, seed=1, n_tasks=20)
    explicit = Experiment("dag-4", "topas", {"output_estimator": "online"}, load=1.2, seed=1, n_tasks=20,
                          prior_noise=0.0, prior_bias=1.0, dag_visibility="full", arrivals="poisson")
    assert explicit.key() == base.key()
    canon = base.canonical()
    assert "knowledge" not in canon and "arrivals" not in canon and "output_estimator" not in canon["params"]
    for other in (dict(prior_noise=0.5), dict(prior_bias=0.5), dict(dag_visibility="online"),
                  dict(arrivals="gamma:2")):
        assert Experiment("dag-4", "topas", load=1.2, seed=1, n_tasks=20, **other).key() != base.key()
    assert Experiment("dag-4", "topas", {"output_estimator": "prior"}, load=1.2, seed=1, n_tasks=20).key() != base.key()
    # the noise seed is the experiment's: another seed, other priors, another key
    a = Experiment("dag-4", "topas", load=1.2, seed=1, n_tasks=20, prior_noise=0.5)
    assert a.canonical()["knowledge"] == {"prior_noise": 0.5, "seed": 1}
    assert "gamma:2" in Experiment("dag-4", "fcfs", load=1.0, arrivals="gamma:2.0").label()


@pytest.mark.parametrize("policy", ["spf", "topas", "parrot-fcfs"])
@pytest.mark.parametrize("workload", ["dag-4", "metagpt-tl"])
def test_noise_zero_reproduces_todays_results_exactly(policy, workload):
    exp = Experiment(workload, policy, load=1.0, seed=0, n_tasks=15)
    today = prepare(exp)
    today_result = simulate(today.trace, make_policy(policy), today.cost, today.config)  # no knowledge at all
    zero = run_prepared(prepare(dataclasses.replace(exp, prior_noise=0.0, prior_bias=1.0)))
    for table in ("tasks", "requests", "decisions"):
        a, b = getattr(today_result, table), getattr(zero, table)
        if "wall_s" in a:
            a, b = a.drop(columns="wall_s"), b.drop(columns="wall_s")
        assert a.equals(b), table


def test_noise_changes_what_topas_decides_but_not_the_workload():
    base = Experiment("metagpt-tl", "topas", load=1.0, seed=0, n_tasks=15)
    a = run_prepared(prepare(base))
    b = run_prepared(prepare(dataclasses.replace(base, prior_noise=1.0)))
    assert a.requests["output_tokens"].sum() == b.requests["output_tokens"].sum()
    assert not a.tasks["jct"].equals(b.tasks["jct"])


@pytest.mark.parametrize("policy", ["fcfs", "lpm", "parrot-fcfs", "autellix-las"])
def test_policies_that_read_no_prior_and_no_dag_are_unchanged_by_knowledge(policy):
    """Notebook 14 lets these policies' reference runs stand for every knowledge setting."""
    exp = Experiment("metagpt-tl", policy, load=1.0, seed=0, n_tasks=15)
    ref = run_prepared(prepare(exp))
    blind = run_prepared(prepare(dataclasses.replace(exp, prior_noise=1.0, prior_bias=2.0, dag_visibility="online")))
    assert ref.tasks.equals(blind.tasks) and ref.requests.equals(blind.requests)


# ----------------------------------------------------------------------------- arrivals


def test_poisson_arrivals_are_unchanged_and_gamma_keeps_the_mean_rate():
    gaps = np.random.default_rng(4).exponential(1 / 0.5, size=9)
    assert poisson_arrivals(10, 0.5, 4) == [round(float(t), 6) for t in np.concatenate(([0.0], np.cumsum(gaps)))]
    for cv in (0.5, 2.0, 4.0):
        t = np.array(poisson_arrivals(40_000, 0.5, 4, f"gamma:{cv}"))
        g = np.diff(t)
        assert g.mean() == pytest.approx(2.0, rel=0.06)
        assert g.std() / g.mean() == pytest.approx(cv, rel=0.1)
    trace = retime(dag4(n_tasks=5), 0.5, 1, "gamma:3.0")
    assert trace.meta["arrival_process"] == "gamma:3"


# ----------------------------------------------------------------------------- estimators and history


def test_prior_estimator_never_learns_and_online_converges():
    prior_only, online = make_estimator("prior", 0), make_estimator("online", 1)
    for y in [100] * 50:
        prior_only.observe("a", y)
        online.observe("a", y)
    assert prior_only.expected_remaining("a", 400.0, 0) == 400.0
    assert online.expected_remaining("a", 400.0, 0) == pytest.approx((400 + 50 * 100) / 51)
    assert isinstance(prior_only, OutputEstimator) and not prior_only.learn


def test_estimator_convergence_on_a_metagpt_trace():
    trace = read_trace(traces_dir() / "metagpt-sop.json.gz")
    df = estimator_convergence(trace, prior_noise=1.0, seed=3)
    assert set(df["agent"]) <= set(trace.agents) and (df["n"] == 0).any()
    err = df.groupby("n")["rel_error"].median()
    assert err.loc[50] < err.loc[0] and err.loc[50] < 0.25


def test_history_completes_a_partial_task_from_the_last_finished_one():
    trace = _small_dag4(n=20, rate=0.5)  # tasks overlap: some run after others finished
    pol, views = _recording("spf")
    simulate(trace, pol, load_profile(), EngineConfig(), knowledge=Knowledge(dag_visibility="online"))
    h = WorkflowHistory()
    completed = None
    for v in views:
        tasks = h.tasks(v)
        for tid, tv in tasks.items():
            if h.templates and len(v.tasks[tid].stages) < 4:
                completed = (v.tasks[tid], tv)
    assert completed is not None, "no partial task was seen after a task of the workflow finished"
    partial, full = completed
    assert set(full.stages) == {"A", "B", "C", "D"} and set(partial.stages) < set(full.stages)
    assert full.stages["D"].parents == ("B", "C") and full.done == partial.done


@pytest.mark.parametrize("policy", ["spf", "topas"])
def test_policies_learn_online_dags_from_history(policy):
    """Online, SPF and TOPAS complete partial tasks once a task of the workflow has finished."""
    trace = _small_dag4(n=20, rate=0.5)
    pol, _ = _recording(policy)
    simulate(trace, pol, load_profile(), EngineConfig(), knowledge=Knowledge(dag_visibility="online"))
    assert set(pol.history.templates) == {"dag-4"}
    assert set(pol.history.templates["dag-4"].stages) == {"A", "B", "C", "D"}


# ----------------------------------------------------------------------------- notebook 14's grid and tables


def test_robustness_grid_varies_one_axis_at_a_time():
    from studies import analysis, grid

    exps = grid.robustness(["dag-4"], quick=True)
    conds = [analysis.knowledge_condition({**e.fields(), "params": dict(e.params)}) for e in exps]
    assert len({e.key() for e in exps}) == len(exps)
    ref = [e.policy for e, c in zip(exps, conds) if c[0] == "reference"]
    assert sorted(ref) == sorted(grid.ROBUST_POLICIES) and "topas-plus" in ref
    knowing = {e.policy for e, c in zip(exps, conds) if c[0] in ("prior noise", "prior bias", "DAG visibility")}
    assert knowing == set(grid.KNOWLEDGE_POLICIES)
    assert {c[2] for c in conds if c[0] == "arrivals"} == set(grid.ROBUST_QUICK.cvs)
    assert {e.load for e in exps} == {grid.ROBUST_LOAD}
    wide = grid.robustness(["dag-10-wide"], quick=True)
    assert {e.load for e in wide} == {grid.ROBUST_LOAD_OVERRIDES["dag-10-wide"]}
    assert {e.load for e in grid.robustness(["dag-10-wide"], 0.7, quick=True, load_overrides={})} == {0.7}


def test_robustness_table_and_verdict_from_summary_rows():
    import pandas as pd

    from studies import analysis

    def row(policy, mean, **kw):
        base = {"workload": "w", "policy": policy, "params": "{}", "seed": 0, "jct_mean": mean, "jct_p99": 2 * mean,
                "prior_noise": 0.0, "prior_bias": 1.0, "dag_visibility": "full", "arrivals": "poisson"}
        return {**base, **kw}

    rows = [row("fcfs", 100.0), row("spf", 90.0), row("topas", 80.0),
            row("spf", 95.0, prior_noise=1.0), row("topas", 110.0, prior_noise=1.0),
            row("fcfs", 150.0, arrivals="gamma:3"), row("spf", 120.0, arrivals="gamma:3"),
            row("topas", 130.0, arrivals="gamma:3")]
    table = analysis.robustness_table(pd.DataFrame(rows))
    noise = table[(table["axis"] == "prior noise")].set_index(["policy", "setting"])
    assert noise.loc[("fcfs", 1.0), "source"] == "reference" and noise.loc[("fcfs", 1.0), "jct_mean"] == 100.0
    assert noise.loc[("topas", 1.0), "mean vs reference %"] == pytest.approx(100 * (110 / 80 - 1))
    verdict = analysis.robustness_verdict(table)
    assert set(verdict["policy"]) == {"topas"}  # no TOPAS+ rows without TOPAS+ runs
    v = verdict.set_index(["axis", "setting"])
    assert v.loc[("prior noise", 0.0), "standing"] == "better"  # 80 vs spf's 90
    assert v.loc[("prior noise", 1.0), "standing"] == "worse" and not v.loc[("prior noise", 1.0), "same as reference"]
    assert v.loc[("arrivals", 3.0), "best baseline (mean)"] == "spf"


def test_robustness_verdict_judges_each_candidate_against_the_baselines_only():
    """TOPAS+ gets rows of its own, against the best *baseline* (TOPAS is no baseline of it), and its
    standing is compared with its own reference run's."""
    import pandas as pd

    from studies import analysis

    def row(policy, mean, **kw):
        base = {"workload": "w", "policy": policy, "params": "{}", "seed": 0, "jct_mean": mean, "jct_p99": 2 * mean,
                "prior_noise": 0.0, "prior_bias": 1.0, "dag_visibility": "full", "arrivals": "poisson"}
        return {**base, **kw}

    rows = [row("fcfs", 100.0), row("lpm", 90.0), row("topas", 50.0), row("topas-plus", 99.0),
            row("topas", 55.0, prior_noise=1.0), row("topas-plus", 95.0, prior_noise=1.0),
            row("topas", 60.0, prior_bias=2.0), row("topas-plus", 80.0, prior_bias=2.0)]
    v = analysis.robustness_verdict(analysis.robustness_table(pd.DataFrame(rows)))
    plus = v[v["policy"] == "topas-plus"].set_index(["axis", "setting"])
    assert plus.loc[("prior noise", 0.0), "vs best: mean %"] == pytest.approx(100 * (99 / 90 - 1))  # lpm, not topas
    assert plus.loc[("prior noise", 0.0), "standing"] == "worse"
    assert plus.loc[("prior bias", 2.0), "standing"] == "better" and not plus.loc[("prior bias", 2.0), "same as reference"]
    topas = v[v["policy"] == "topas"].set_index(["axis", "setting"])
    assert topas.loc[("prior bias", 2.0), "same as reference"]
