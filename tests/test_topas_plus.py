"""topas-plus (ours, topas/policies/topas_plus.py): an admission order in three tiers.

Starving requests first (``starve_s``), then requests whose agent prefix is resident, then the
rest; inside a tier, tasks by ``g_i(t) * Delta_task(F | H) / L_i(H)`` (the aged share of the
remaining expected critical path that admitting the task's ready frontier commits), every ready
stage of a task with its task's priority. Output lengths come from the estimator (prior, then
finished calls), never from the trace.
"""

from __future__ import annotations

from dataclasses import replace

import math

import pytest

from test_baselines import CHAIN3, COST, DAG4, _dag4_trace, admit, engine_view, req, task_view
from topas.engine.cost import load_profile
from topas.engine.simulator import simulate
from topas.experiments import Experiment, run_experiment
from topas.policies import PolicyError, available_policies, make_policy
from topas.policies.lpm import LPM
from topas.policies.topas_plus import path_priority

CHAIN_AGENTS = {"A": "a", "B": "b", "C": "c"}
DAG_AGENTS = {"A": "a", "B": "b", "C": "c", "D": "d"}
PRIORS = {"a": 100, "b": 100, "c": 100, "d": 100}
# every stage: 100 input tokens at 1 ms + 100 expected outputs at 10 ms = 1.1 s (COST)
STAGE_S = 1.1


def chain_at(tid, stage, arrival=0.0, ready=0.0):
    """A chain-3 task whose stages before ``stage`` are done, and its waiting request."""
    done = {"A": (), "B": ("A",), "C": ("A", "B")}[stage]
    tv = task_view(tid, arrival, CHAIN3, CHAIN_AGENTS, done=done, observed={s: 100 for s in done})
    return tv, req(tid, stage, CHAIN_AGENTS[stage], ready)


def test_registered_as_ours_and_orders_only():
    assert "topas-plus" in available_policies()
    p = make_policy("topas-plus")
    assert not p.manages_prefixes  # an admission order: the engine keeps its radix cache
    assert p.params.residency_first and p.params.rank == "path" and p.params.group == "off"


def test_path_priority_is_the_aged_share_of_the_remaining_path():
    assert path_priority(1.0, 3.0, 0.0, 60.0) == pytest.approx(1 / 3)
    assert path_priority(1.0, 3.0, 120.0, 60.0) == pytest.approx(3 * (1 / 3))  # g = 1 + 120/60
    assert path_priority(1.0, 3.0, 120.0, 0.0) == pytest.approx(1 / 3)  # H_age 0: no aging
    assert path_priority(0.0, 0.0, 5.0, 60.0) == pytest.approx(1 + 5 / 60)  # nothing left: share 1


def test_inside_a_tier_the_task_nearest_completion_goes_first():
    # three chains that arrived together, at stages A, B and C; readiness in the opposite order
    views = [chain_at("t1", "A", ready=0.0), chain_at("t2", "B", ready=1.0), chain_at("t3", "C", ready=2.0)]
    view = engine_view(0.0, PRIORS, [v for v, _ in views], [r for _, r in views], resident=("a", "b", "c"))
    # shares of the remaining path: C 1, B 1/2, A 1/3
    assert admit(make_policy("topas-plus"), view) == ["t3/C", "t2/B", "t1/A"]
    prio = make_policy("topas-plus").priorities(view)
    assert prio == pytest.approx({"t1": 1 / 3, "t2": 1 / 2, "t3": 1.0})


def test_resident_prefixes_come_before_a_higher_priority_cold_one():
    (tv1, r1), (tv2, r2) = chain_at("t1", "C"), chain_at("t2", "A")
    view = engine_view(0.0, PRIORS, [tv1, tv2], [r1, r2], resident=("a",))
    assert admit(make_policy("topas-plus"), view) == ["t2/A", "t1/C"]
    # without residency-first the priority alone decides
    assert admit(make_policy("topas-plus", residency_first=False), view) == ["t1/C", "t2/A"]


def test_parallel_siblings_share_their_task_priority_not_a_split_of_it():
    # DAG-4 task with A done: B and C ready; L = B||C + D = 2.2 s, the frontier commits 1.1 s: 1/2
    dag = task_view("d1", 0.0, DAG4, DAG_AGENTS, done=("A",), observed={"A": 100})
    (tv2, r2) = chain_at("c1", "A")  # share 1/3; TOPAS's 1/k split would give each sibling 1/4
    waiting = [req("d1", "B", "b", 1.0), r2, req("d1", "C", "c", 2.0)]
    view = engine_view(0.0, PRIORS, [dag, tv2], waiting, resident=("a", "b", "c", "d"))
    assert admit(make_policy("topas-plus"), view) == ["d1/B", "d1/C", "c1/A"]
    assert make_policy("topas-plus").priorities(view)["d1"] == pytest.approx(0.5)


@pytest.mark.parametrize("h_age,first", [(60.0, "old/A"), (0.0, "new/C"), (1000.0, "new/C")])
def test_linear_aging_lets_an_old_task_overtake(h_age, first):
    # at t = 200 s: the old task (share 1/3) has g = 1 + 200 / H_age; the new one (share 1) g = 1
    (tv_o, r_o), (tv_n, r_n) = chain_at("old", "A", arrival=0.0, ready=0.0), chain_at("new", "C", 200.0, 200.0)
    view = engine_view(200.0, PRIORS, [tv_o, tv_n], [r_o, r_n], resident=("a", "c"))
    assert admit(make_policy("topas-plus", H_age=h_age), view)[0] == first


def test_a_starving_request_goes_ahead_of_every_tier():
    (tv1, r1), (tv2, r2) = chain_at("t1", "A", ready=0.0), chain_at("t2", "C", arrival=20.0, ready=20.0)
    view = engine_view(25.0, PRIORS, [tv1, tv2], [r1, r2], resident=("c",))  # t1 cold, waiting 25 s
    assert admit(make_policy("topas-plus"), view) == ["t2/C", "t1/A"]
    assert admit(make_policy("topas-plus", starve_s=10.0), view) == ["t1/A", "t2/C"]
    assert admit(make_policy("topas-plus", starve_s=30.0), view) == ["t2/C", "t1/A"]


def test_groups_keep_a_cold_agents_requests_together():
    # at t = 60 s (H_age 60): x at C since 0 s (g 2, share 1 -> 2), y at B since 0 s (g 2, share
    # 1/2 -> 1), z at C since 60 s (g 1, share 1 -> 1, readied after y); prefixes b and c are cold
    (tx, x), (ty, y), (tz, z) = chain_at("x", "C"), chain_at("y", "B"), chain_at("z", "C", 60.0, 60.0)
    view = engine_view(60.0, PRIORS, [tx, ty, tz], [x, y, z], resident=("a",))
    unguarded = {"in_batch_guard": False, "H_age": 60.0}
    assert admit(make_policy("topas-plus", **unguarded), view) == ["x/C", "y/B", "z/C"]  # "off": request by request
    # groups: agent c (x, z) ahead of b (y), by its summed priority (3 vs 1) or by its best request
    assert admit(make_policy("topas-plus", group="sum", **unguarded), view) == ["x/C", "z/C", "y/B"]
    assert admit(make_policy("topas-plus", group="max", **unguarded), view) == ["x/C", "z/C", "y/B"]
    # the in-batch guard: c's prefix is not in the tree, so one of its requests (x, the first) is
    # offered and z waits until the prefix is cached
    assert admit(make_policy("topas-plus", H_age=60.0), view) == ["x/C", "y/B"]


def test_output_lengths_come_from_the_prior_then_from_finished_calls_only():
    # t at stage A: share = 1.1 / 3.3 under the prior (100 tokens per stage) ...
    tv, r = chain_at("t", "A")
    view = engine_view(0.0, PRIORS, [tv], [r], resident=("a",))
    p = make_policy("topas-plus")
    assert p.priorities(view)["t"] == pytest.approx(1 / 3)
    # ... and moves only when calls of agent c are observed finishing with 1,000 tokens:
    # E[Y_c] = (1 * 100 + 4 * 1000) / 5 = 820 -> C takes 0.1 + 8.2 s, L = 1.1 + 1.1 + 8.3
    for k in range(4):
        p.on_finish(req(f"o{k}", "C", "c", 0.0), 0.0, 1000)
    assert p.priorities(view)["t"] == pytest.approx(STAGE_S / (2 * STAGE_S + 0.1 + 8.2))
    # a second policy that saw nothing still reads the prior: nothing else leaks in
    assert make_policy("topas-plus").priorities(view)["t"] == pytest.approx(1 / 3)


class _Spy(LPM):
    """LPM that keeps every view it was shown."""

    def reset(self):
        super().reset()
        self.views = []

    def decide(self, view):
        self.views.append(view)
        return super().decide(view)


def test_with_fcfs_inside_the_tiers_it_is_lpm_by_residency():
    # the residency tiers with FCFS inside (no aging, no groups, no guard) give the order of an LPM that
    # matches every resident prefix (also one still being computed) and does not deprioritize
    # in-batch duplicates, starting from arrival order: exactly, on every view of a busy run with
    # equal prefixes (LPM's length key is then constant)
    spy = _Spy()
    simulate(_dag4_trace(n=30), spy, load_profile().with_budget(12_000))
    plus = make_policy("topas-plus", rank="fcfs", H_age=0.0, in_batch_guard=False)
    busy = [v for v in spy.views if len(v.waiting) > 1 and 0 < len(v.resident) < len(v.prefixes)]
    assert len(busy) > 10
    for v in busy:
        by_residency = replace(v, prefixes={a: replace(p, in_tree=p.resident) for a, p in v.prefixes.items()})
        lpm = LPM(in_batch_deprioritize_tokens=10**9)
        assert plus.decide(v).admit == lpm.decide(by_residency).admit


def test_a_small_busy_run_completes_every_task_deterministically():
    trace = _dag4_trace()
    cost = load_profile("a100-80gb_qwen2.5-32b").with_budget(12_000)  # memory pressure
    res = simulate(trace, make_policy("topas-plus"), cost)
    assert len(res.tasks) == 50 and res.tasks["finish"].notna().all()
    assert res.requests["finish"].notna().all() and len(res.requests) == 200
    assert res.summary["preemptions"] == 0  # it only orders; it never preempts
    again = simulate(trace, make_policy("topas-plus"), cost)
    assert again.deterministic_summary() == res.deterministic_summary()
    assert again.tasks["jct"].tolist() == res.tasks["jct"].tolist()


def test_runs_as_an_experiment_with_its_parameters_by_name():
    # the path notebooks and the CLI take: a registered name, parameters as strings or numbers
    res = run_experiment(Experiment("chain-3", "topas-plus", {"H_age": "30"}, load=1.2, seed=0, n_tasks=20))
    assert res.summary["n_tasks"] == 20 and math.isfinite(res.summary["jct_mean"])


@pytest.mark.parametrize("bad", [{"H_age": -1.0}, {"starve_s": -5}, {"group": "all"}, {"rank": "spf"}, {"beta": 1.0}])
def test_bad_parameters_are_refused_by_name(bad):
    with pytest.raises(PolicyError, match=next(iter(bad))):
        make_policy("topas-plus", **bad)


# ----------------------------------------------------------------------- the selection script
def _selection_script():
    import importlib.util

    from topas.paths import REPO_ROOT

    spec = importlib.util.spec_from_file_location("select_topas_plus", REPO_ROOT / "scripts" / "select_topas_plus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_selection_rule_is_the_smallest_worst_ratio_then_the_geometric_mean():
    import pandas as pd

    mod = _selection_script()
    t = pd.DataFrame([  # variant, ratio of mean, ratio of p99 at two points
        ("steady", 0.99, 1.00), ("steady", 0.95, 0.97),
        ("spiky", 0.50, 0.50), ("spiky", 0.60, 1.20),   # far better on average, loses one point
        ("also steady", 1.002, 0.90), ("also steady", 0.90, 0.90),  # ties "steady"'s worst (0.5%)
    ], columns=["variant", "ratio_jct_mean", "ratio_jct_p99"]).assign(decision_ms=0.1)
    r = mod.ranking(t)
    assert list(r["variant"]) == ["also steady", "steady", "spiky"]
    assert r.loc[2, "worst_ratio"] == pytest.approx(1.2) and not r.loc[2, "tied_best"]


def test_selection_runs_the_synthetic_workloads_only(tmp_path, capsys):
    import pandas as pd

    mod = _selection_script()
    out = tmp_path / "sel.csv"
    assert mod.main(["--tasks", "8", "--seeds", "1", "--loads", "1.2", "--store", str(tmp_path / "store"),
                     "--out", str(out)]) == 0
    t = pd.read_csv(out)
    assert set(t["workload"]) == {"chain-3", "dag-4", "dag-10-wide"}
    assert set(t["variant"]) == set(mod.CANDIDATES)
    assert set(t["best_baseline_jct_mean"]) <= set(mod.BASELINES)
    assert "chosen:" in capsys.readouterr().out
    # the candidate this selection chose spells out today's defaults, but for H_age, re-selected
    # with the in-batch guard on (scripts/select_plan_execution.py: 200 s)
    from topas.policies.topas_plus import TopasPlusParams

    chosen = mod.CANDIDATES["residency+path, H_age 60 s"]
    today = {k: getattr(TopasPlusParams(), k) for k in chosen}
    assert {k: v for k, v in today.items() if k != "H_age"} == {k: v for k, v in chosen.items() if k != "H_age"}
    assert TopasPlusParams().H_age == 200.0
