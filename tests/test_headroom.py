"""Headroom: the unloaded critical path is a lower bound on every task's JCT under any policy and
load (and is attained by a task alone with its prefixes cached), the work-conserving queue bound
lies between it and what runs achieve, and the relaxations are the best baseline on an easier
engine (studies.claims.headroom)."""

from __future__ import annotations

import pytest

from conftest import ROUND_COST, chain3_task, dag4_task, trace
from topas.engine.config import EngineConfig
from topas.engine.cost import load_profile
from topas.engine.simulator import simulate
from topas.experiments import Experiment
from studies.claims.headroom import (
    bound_conditions,
    critical_path_bounds,
    free_prefix_budget,
    headroom_table,
    queue_bound,
)
from topas.experiments.solo import task_critical_path
from topas.experiments.spec import Prepared, prepare, run_prepared
from topas.experiments.store import ResultStore
from topas.policies.base import make_policy

POLICIES = ("fcfs", "lpm", "spf", "parrot-fcfs", "autellix-las", "topas")
X = {"A": 300, "B": 500, "C": 200, "D": 400}
Y = {"A": 60, "B": 90, "C": 40, "D": 70}


@pytest.mark.parametrize("workload, n, load, options", [
    ("chain-3", 40, 2.0, {}),  # overloaded: queues, retractions, TOPAS's preemptions and loads
    ("dag-4", 40, 2.0, {}),
    ("dag-10-wide", 20, 1.5, {}),
    ("metagpt-tl", 10, 3.0, {}),
    ("dag-4", 30, 1.2, {"request_latency_s": 0.5, "host_tier": True}),
])
def test_no_task_finishes_faster_than_its_unloaded_critical_path(workload, n, load, options):
    for policy in POLICIES:
        p = prepare(Experiment(workload, policy, load=load, n_tasks=n, seed=3, engine_options=options))
        assert bound_conditions(p) == []  # the cost model meets the argument's conditions
        tasks = run_prepared(p).tasks.set_index("task_id")
        cp = critical_path_bounds(p).reindex(tasks.index)
        slack = tasks["jct"] - cp
        assert (slack >= -1e-9).all(), (policy, slack.idxmin(), slack.min())
        assert queue_bound(p) >= cp.mean() - 1e-9
        assert tasks["jct"].mean() >= queue_bound(p) - 1e-9, policy


def test_the_bound_is_attained_by_a_task_alone_with_its_prefixes_cached():
    cost = load_profile()
    # the first task computes the prefixes; the second arrives long after and finds them cached
    t = trace({"A": 2000, "B": 1000, "C": 3000}, [chain3_task("t0", 0.0, X, Y), chain3_task("t1", 1000.0, X, Y)])
    for config in (EngineConfig(), EngineConfig(request_latency_s=0.5), EngineConfig(max_prefill_tokens=128)):
        res = simulate(t, make_policy("fcfs"), cost, config).tasks.set_index("task_id")
        assert res.loc["t1", "jct"] == pytest.approx(task_critical_path(t, t.tasks[1], cost, config), rel=1e-12)
        assert res.loc["t0", "jct"] > res.loc["t1", "jct"]  # it computed the prefixes itself
    # a DAG's parallel siblings share decode steps alone too: there the bound is strict
    t = trace({"A": 2000, "B": 1000, "C": 3000, "D": 500}, [dag4_task("t0", 0.0, X, Y), dag4_task("t1", 1000.0, X, Y)])
    res = simulate(t, make_policy("fcfs"), cost, EngineConfig()).tasks.set_index("task_id")
    assert res.loc["t1", "jct"] > task_critical_path(t, t.tasks[1], cost, EngineConfig())


def _prepared(t, cost, config=None) -> Prepared:
    config = config or EngineConfig()
    return Prepared(Experiment("chain-3", "fcfs"), t, None, None, None, make_policy("fcfs"), cost, config)


def test_bound_conditions_name_a_cost_model_that_breaks_the_argument():
    t = trace({"A": 100, "B": 100, "C": 100}, [chain3_task("t0", 0.0, X, Y)])
    fails = bound_conditions(_prepared(t, ROUND_COST))  # c_new_cached = c_new_sq: splitting a chunk saves time
    assert any(f.startswith("(i)") for f in fails)
    assert bound_conditions(_prepared(t, load_profile())) == []


def test_queue_bound_grows_with_a_backlog_that_the_critical_path_ignores():
    cost = load_profile()
    burst = trace({"A": 2000, "B": 1000, "C": 3000}, [chain3_task(f"t{i:02d}", 0.0, X, Y) for i in range(40)])
    p = _prepared(burst, cost)
    cp = critical_path_bounds(p).mean()
    qb = queue_bound(p)
    assert qb > 1.2 * cp  # forty tasks at once: the work, not the DAG, limits them
    jct = simulate(burst, make_policy("fcfs"), cost, EngineConfig()).tasks["jct"].mean()
    assert jct >= qb


def test_headroom_table_labels_bounds_and_relaxations(tmp_path):
    store = ResultStore(tmp_path)
    t = headroom_table(["chain-3"], [1.0], n_tasks=30, store=store, progress=False)
    kinds = dict(zip(t["reference"], t["kind"]))
    best = next(r for r in kinds if r.startswith("best baseline"))
    assert kinds[best] == "measured" and kinds["topas"] == "measured"
    assert kinds["unloaded critical path"] == "bound" and kinds["work-conserving queue bound"] == "bound"
    assert kinds["free prefixes"] == "relaxation" and kinds["4x KV budget"] == "relaxation"
    m = t.set_index("reference")["mean JCT"]
    assert m["unloaded critical path"] <= m["work-conserving queue bound"] <= min(m[best], m["topas"])
    assert t["bounds valid"].all()
    # the free-prefixes run is the best baseline with every prefix added to the budget
    b = best[len("best baseline ("):-1]
    p = prepare(Experiment("chain-3", b, load=1.0, n_tasks=30))
    assert free_prefix_budget(p) == load_profile().kv_budget_tokens + 3 * 4096
    assert store.has(Experiment("chain-3", b, load=1.0, n_tasks=30, kv_budget=free_prefix_budget(p)))
