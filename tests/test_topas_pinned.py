"""TOPAS's decisions are pinned: a few small runs of different workloads and readings must give
exactly the decision table and summary they gave when these digests were recorded.

The digests were computed with the search as it was before its speed-up (per-decision
quantities hoisted, candidate sets scored by delta), so any change that alters one decision --
a reordered float sum that flips a tie, a cached value that goes stale -- fails here. A
deliberate change of behaviour re-records them (``python tests/test_topas_pinned.py``) and says so.
"""

from __future__ import annotations

import hashlib
import json
import sys

import pytest

from topas.engine.metrics import WALL_CLOCK_KEYS
from topas.experiments import Experiment, run_experiment
from topas.policies.topas_params import EARLIER_PLAN

#: (name, experiment): workloads of different shapes (chain, fork-join, wide, >M agents), the
#: ablations and the readings' non-default branches, each small enough to run in about a second.
RUNS = {
    "dag-4/topas": Experiment("dag-4", "topas", {}, load=1.0, seed=0, n_tasks=60),
    "dag-10-wide/topas": Experiment("dag-10-wide", "topas", {}, load=1.5, seed=0, n_tasks=30),
    "chain-3/topas-no-reuse": Experiment("chain-3", "topas-no-reuse", {}, load=1.2, seed=1, n_tasks=60),
    "metagpt-tl/topas-local+": Experiment(
        "metagpt-tl", "topas", {"search": "local+", "redo": "reprefill", "admit_norm": "remaining"},
        load=1.5, seed=0, n_tasks=25),
    "metagpt-sop/topas-readings": Experiment(
        "metagpt-sop", "topas", {"sibling_share": "equal", "move_cost": "engine", "revalue_credit": False,
                                 "aging_form": "linear"}, load=1.5, seed=2, n_tasks=25, dag_visibility="online"),
    "dag-10-wide/topas-sampled": Experiment("dag-10-wide", "topas", {"estimator": "sampled", "samples": 4},
                                            load=1.5, seed=0, n_tasks=15),
    "dag-4/topas-request-only": Experiment("dag-4", "topas-request-only", {}, load=1.2, seed=0, n_tasks=40),
    # the earlier plan (no in-batch guard, d_r estimated, V_reuse at swap prices) on the engine
    # without recheck_on_insert: these decisions are those of the code before those switches
    "dag-4/topas-earlier-plan": Experiment("dag-4", "topas", dict(EARLIER_PLAN), load=1.0, seed=0, n_tasks=60,
                                           engine_options={"recheck_on_insert": False}),
    "dag-10-wide/topas-earlier-plan": Experiment("dag-10-wide", "topas", dict(EARLIER_PLAN), load=1.5, seed=0,
                                                 n_tasks=30, engine_options={"recheck_on_insert": False}),
    "dag-4/topas-preempt-off": Experiment("dag-4", "topas", {"preempt": False}, load=1.3, seed=0, n_tasks=60),
}

#: sha256 of each run's decision table (wall-clock columns dropped) and deterministic summary
EXPECTED: dict[str, str] = {
    'chain-3/topas-no-reuse': 'a700afc505b62d3abd9aac271bd9c2361b32cc6be869f5f5ac2d2d4845f3819a',
    'dag-10-wide/topas': '331351663029efc7510267617efc12966cc32b7f35b82f1a9bcfdee27c48eb7d',
    'dag-10-wide/topas-earlier-plan': '5d9c6db4feeb061934f8b493c7bf9567d9be275db5bd09a552e78aa8c2a1a739',
    'dag-10-wide/topas-sampled': 'a2a032c8ff3d045d917df953bf08da2da6d29d7c96b78cf384cbb0c9a77bd6f1',
    'dag-4/topas': '21ab71c0905cce7ffc0ffdf1020259f44911343ed75ae359799fddddf1b4697f',
    'dag-4/topas-earlier-plan': 'c36c8a2b7bf3aaf9f263d7929b0c9ad5013eb9bda76099da1bb52e8649b20275',
    'dag-4/topas-preempt-off': 'eecc98bfa7b79fcbbadb0d8522b342f8c794754e95014649895a7653115ec610',
    'dag-4/topas-request-only': '890fa211e576d83bc29e886d74556d99f43cd006c7d2c0b052b891f8c0bd6cf9',
    'metagpt-sop/topas-readings': '2f76ae5f4887200c4cae4d35ae570b35f6a3f243c95678da99ad759d3c1916ea',
    'metagpt-tl/topas-local+': 'c2a0823e282cdb0a32f699f439dbefb98c488db5d30b833bdeac38808ef40405',
}


def digest(exp: Experiment) -> str:
    """sha256 over the run's decisions (every column but wall time, floats as repr) and summary."""
    res = run_experiment(exp)
    d = res.decisions.drop(columns=[c for c in res.decisions.columns if c in WALL_CLOCK_KEYS or c == "wall_s"])
    h = hashlib.sha256()
    h.update(",".join(map(str, d.columns)).encode())
    for row in d.itertuples(index=False):
        h.update(repr(tuple(row)).encode())
    h.update(json.dumps(res.deterministic_summary(), sort_keys=True, default=repr).encode())
    return h.hexdigest()


@pytest.mark.parametrize("name", sorted(RUNS))
def test_topas_decisions_are_pinned(name):
    assert name in EXPECTED, f"no recorded digest for {name}; record with python {__file__}"
    assert digest(RUNS[name]) == EXPECTED[name], f"{name}: TOPAS's decisions or summary changed"


if __name__ == "__main__":  # print the digests to paste into EXPECTED
    for name in sorted(RUNS):
        print(f"    {name!r}: {digest(RUNS[name])!r},", flush=True)
    sys.exit(0)
