"""TOPAS's decision state kept across decisions (``topas.policies.topas_state``) is a cache of
the view: at every decision of a few runs it equals the state rebuilt from that decision's view
alone, and a kept entry gone stale is caught by the check."""

from __future__ import annotations

import pytest

from topas.experiments import Experiment, run_experiment
from topas.policies import topas_state

#: workloads of different shapes, with the defaults and the readings whose per-agent entries
#: differ (``move_cost="engine"``, ``reuse_cost="swap"``), with and without a host tier
RUNS = {
    "dag-4/topas": Experiment("dag-4", "topas", {}, load=1.0, seed=0, n_tasks=60),
    "dag-10-wide/topas": Experiment("dag-10-wide", "topas", {}, load=1.5, seed=0, n_tasks=30),
    "metagpt-tl/topas": Experiment("metagpt-tl", "topas", {}, load=1.5, seed=0, n_tasks=25),
    "dag-4/topas-engine-moves-host": Experiment(
        "dag-4", "topas", {"move_cost": "engine", "reuse_cost": "swap"}, load=1.3, seed=1, n_tasks=40,
        engine_options={"host_tier": True}),
    "metagpt-sop/topas-engine-moves": Experiment(
        "metagpt-sop", "topas", {"move_cost": "engine"}, load=1.5, seed=2, n_tasks=20, dag_visibility="online"),
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_kept_state_equals_rebuild_at_every_decision(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    checks = []
    check = topas_state.check_decision

    def counting(policy, view):  # type: ignore[no-untyped-def]
        check(policy, view)
        checks.append(view.time)

    monkeypatch.setattr(topas_state, "CHECK", True)
    monkeypatch.setattr(topas_state, "check_decision", counting)
    run_experiment(RUNS[name])
    assert len(checks) > 20  # the check ran at every decision with something waiting


def test_stale_entry_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent's entry left stale (its prefix changed, the entry not recomputed) fails the check."""
    seen = []
    check = topas_state.check_decision

    def stale(policy, view):  # type: ignore[no-untyped-def]
        state = policy._state
        a = next(iter(view.prefixes))
        kept = state.move_in[a]
        state.move_in[a] = kept + 1.0
        with pytest.raises(AssertionError, match="move_in"):
            check(policy, view)
        state.move_in[a] = kept
        check(policy, view)
        seen.append(a)

    monkeypatch.setattr(topas_state, "CHECK", True)
    monkeypatch.setattr(topas_state, "check_decision", stale)
    run_experiment(Experiment("dag-4", "topas", {}, load=1.0, seed=0, n_tasks=10))
    assert seen
