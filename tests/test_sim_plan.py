"""The simulator's plan is priced by a per-task cost of each policy on each workload it runs,
measured once per code version on this machine."""

from __future__ import annotations

import pytest

from topas.experiments import sim_plan
from topas.experiments.spec import Experiment


def test_each_policy_is_calibrated_on_each_workload_the_plan_runs_it_on(tmp_path, monkeypatch):
    ran: list[tuple[str, str]] = []
    monkeypatch.setattr(sim_plan, "run_experiment", lambda e: ran.append((e.policy, e.workload)))
    monkeypatch.setattr(sim_plan, "prepare", lambda e: None)
    costs = sim_plan.calibrate(["fcfs"], root=tmp_path, pairs={("topas", "metagpt-tl")})
    assert sorted(ran) == [("fcfs", "chain-3"), ("fcfs", "dag-10-wide"), ("fcfs", "dag-4"), ("topas", "metagpt-tl")]
    assert set(costs) == {"fcfs", "topas"} and set(costs["topas"]) == {"metagpt-tl"}
    # kept for this code version: a second plan measures only what it has not seen
    ran.clear()
    assert sim_plan.calibrate(["fcfs"], root=tmp_path, pairs={("topas", "metagpt-tl")}) == costs and ran == []
    sim_plan.calibrate(["fcfs"], root=tmp_path, pairs={("topas", "dag-4")})
    assert ran == [("topas", "dag-4")]


def test_a_run_is_priced_by_its_own_workloads_cost_else_its_policys_mean():
    costs = {"topas": {"dag-4": 0.001, "metagpt-tl": 0.005}, "fcfs": {"dag-4": 0.0005}}
    assert sim_plan.estimate_cpu(Experiment("metagpt-tl", "topas", n_tasks=100), costs) == pytest.approx(0.5)
    assert sim_plan.estimate_cpu(Experiment("chain-3", "topas", n_tasks=100), costs) == pytest.approx(0.3)
    # a policy not calibrated: the mean over every measured cost
    assert sim_plan.estimate_cpu(Experiment("chain-3", "lpm", n_tasks=100), costs) == pytest.approx(65 / 300)
