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
}

#: sha256 of each run's decision table (wall-clock columns dropped) and deterministic summary
EXPECTED: dict[str, str] = {
    'chain-3/topas-no-reuse': '0adb27186c81a59187b7939c9cc2d2b6c15ae5b08f328e477213d56a4938d487',
    'dag-10-wide/topas': '6a1376745c567021e10b1485508c39b8d30d36fee5a1b3a6f1f4df8e04f37a11',
    'dag-10-wide/topas-sampled': '267da3b0129253ccbbcf640542afae735e58fc394943130951cd5f1c1fe966d0',
    'dag-4/topas': '3247bf1befed9903add3ce1843ecfd2a0e10a225ed0ffa6493898beae96fe6ea',
    'dag-4/topas-request-only': '834a1db7267f12963fd4bc5682975fd8f5a2429602382e28021369f011d150d0',
    'metagpt-sop/topas-readings': '571e8c055999260a3004bc2d9d4995844b46b4c828ecd7125c2fb76ccc9177e8',
    'metagpt-tl/topas-local+': '3aaf28a411417538f9b437807106a74086e150b5dd88e0aab5408dba9e97c763',
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
