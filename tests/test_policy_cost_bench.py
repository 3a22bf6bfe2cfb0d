"""benchmarks/policy_cost.py's split of a TOPAS run: the parts add up to the run, the counts are
what the decisions saw, and the timers are gone once it returns."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def policy_cost():
    sys.path.insert(0, str(BENCH))  # it imports its sibling decision_latency
    try:
        spec = importlib.util.spec_from_file_location("policy_cost", BENCH / "policy_cost.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.path.remove(str(BENCH))


def test_a_topas_run_splits_into_set_up_search_and_the_rest(policy_cost):
    from topas.engine.cost import DEFAULT_PROFILE, load_profile
    from topas.engine.simulator import simulate
    from topas.policies import make_policy
    from topas.policies.topas_decision import _DecisionCtx

    methods = (_DecisionCtx.__init__, _DecisionCtx.search, _DecisionCtx._evaluate)
    trace, cost = policy_cost.trace_at_load("dag-10-wide", 15, 1.5, 0), load_profile(DEFAULT_PROFILE)
    sp = policy_cost.topas_split(trace, cost)
    assert sp["rest"] + sp["setup"] + sp["search"] == pytest.approx(sp["run"])
    assert min(sp["rest"], sp["setup"], sp["search"]) > 0
    assert (_DecisionCtx.__init__, _DecisionCtx.search, _DecisionCtx._evaluate) == methods  # restored
    decisions = simulate(trace, make_policy("topas"), cost).decisions
    moved = decisions[["n_admitted", "n_preempt", "n_evict", "n_load"]].sum(axis=1)
    assert sp["empty"] == pytest.approx((moved == 0).mean()) and 0 < sp["empty"] < 1
    decisions = decisions[decisions["n_waiting"] > 0]  # an empty queue is not searched
    assert sp["decisions"] == len(decisions)
    assert sp["waiting"] == pytest.approx(decisions["n_waiting"].mean())
    assert sp["sets"] == pytest.approx(decisions["info_candidates"].mean())
    assert 0 < sp["full"] <= sp["sets"] and sp["agents"] == len(trace.agents)


def test_the_engines_floor_replays_topas_decisions_and_ends_as_topas_run_did(policy_cost):
    from topas.engine.cost import DEFAULT_PROFILE, load_profile
    from topas.engine.simulator import simulate
    from topas.policies import make_policy

    trace, cost = policy_cost.trace_at_load("dag-4", 20, 1.0, 0), load_profile(DEFAULT_PROFILE)
    floor, run, n = policy_cost.replayed_cpu(trace, cost, 1)  # raises if the replay ends otherwise
    assert 0 < floor < run  # the replay does none of TOPAS's own work
    assert n == len(simulate(trace, make_policy("topas"), cost).decisions)  # the recorded run's decisions


def test_a_replay_that_departs_from_the_recorded_run_is_refused(policy_cost, monkeypatch):
    from topas.engine.cost import DEFAULT_PROFILE, load_profile

    trace, cost = policy_cost.trace_at_load("dag-4", 20, 1.0, 0), load_profile(DEFAULT_PROFILE)
    real_simulate = policy_cost.simulate

    def simulate(tr, policy, c):  # the replay's run ends otherwise than the recorded one
        result = real_simulate(tr, policy, c)
        if type(policy).__name__ == "Replayed":
            result.summary["jct_mean"] += 1.0
        return result

    monkeypatch.setattr(policy_cost, "simulate", simulate)
    with pytest.raises(RuntimeError, match="replayed end with mean JCT"):
        policy_cost.replayed_cpu(trace, cost, 1)


def test_a_replay_that_reads_every_request_into_arrays_ends_as_topas_run_did(policy_cost):
    from topas.engine.cost import DEFAULT_PROFILE, load_profile

    trace, cost = policy_cost.trace_at_load("dag-4", 20, 1.0, 0), load_profile(DEFAULT_PROFILE)
    floor, run, n = policy_cost.replayed_cpu(trace, cost, 1, read=True)  # raises if the replay ends otherwise
    assert 0 < floor < run and n > 0


def test_a_replay_of_the_kernels_alone_runs_each_recorded_set_up_again_and_ends_as_topas_run_did(policy_cost, monkeypatch):
    from topas.engine.cost import DEFAULT_PROFILE, load_profile
    from topas.policies import topas_kernel_setup

    real = topas_kernel_setup.cached_setup_kernel
    calls = []

    def counted(ii, ff):
        calls.append(ii.sum())
        return real(ii, ff)

    monkeypatch.setattr(topas_kernel_setup, "cached_setup_kernel", counted)
    trace, cost = policy_cost.trace_at_load("dag-4", 20, 1.0, 0), load_profile(DEFAULT_PROFILE)
    only, run, n = policy_cost.replayed_cpu(trace, cost, 1, kernels=True)  # raises if the replay ends otherwise
    assert 0 < only < run and n > 0
    recorded = len(calls) // 2
    assert recorded > 0 and calls[recorded:] == calls[:recorded]  # the same arrays, in the same order, once more
