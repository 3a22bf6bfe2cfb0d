"""topas.sets: the baseline, candidate and workload sets are declared once and agree with what the
policies register, the traces shipped and the protocol's grid."""

from __future__ import annotations

from topas import sets
from topas.experiments.protocol.seeds import HELD_OUT_WORKFLOW_SEEDS
from topas.policies import available_policies
from topas.policies.guarded import GUARDED_OF
from topas.workload.random_dag import trace_name


def test_every_policy_of_a_set_is_registered():
    have = set(available_policies())
    for name in ("PAPER_BASELINES", "ABLATIONS", "PAPER_POLICIES", "PROTOCOL_BASELINES", "GUARDED_BASELINES",
                 "CANDIDATES"):
        missing = set(getattr(sets, name)) - have
        assert not missing, f"sets.{name} names unregistered policies {sorted(missing)}"


def test_the_guarded_baselines_are_the_protocol_baselines_with_the_guard():
    assert tuple(GUARDED_OF) == sets.PROTOCOL_BASELINES
    assert sets.GUARDED_BASELINES == tuple(f"{b}-guarded" for b in sets.PROTOCOL_BASELINES)


def test_workload_families():
    assert sets.IN_SAMPLE == sets.SYNTHETIC
    assert not set(sets.IN_SAMPLE) & set(sets.HELD_OUT)
    assert set(sets.HELD_OUT) == set(sets.METAGPT) | set(sets.RANDOM_DAGS)
    assert sets.RANDOM_DAGS == tuple(trace_name(s) for s in HELD_OUT_WORKFLOW_SEEDS)


def test_the_protocol_and_the_figures_use_the_declared_sets():
    from studies import grid
    from studies.protocol_runs import study

    assert study.FULL.policies == sets.PROTOCOL_BASELINES + sets.GUARDED_BASELINES + sets.CANDIDATES
    assert study.FULL.workloads == sets.IN_SAMPLE + sets.METAGPT
    assert {e.policy for e in grid.jct_vs_load(["dag-4"], quick=True)} == set(sets.PAPER_POLICIES)
