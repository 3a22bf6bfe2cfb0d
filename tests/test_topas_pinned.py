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
    'chain-3/topas-no-reuse': '7ee3b50c5950c73e11c3c99c09039a0589524825bebbccee8723466936bbc840',
    'dag-10-wide/topas': 'f29cd8a69e87d8bdda2a8043909bef36847b8e484248ec2824f6a7ebd2d94136',
    'dag-10-wide/topas-sampled': '40b9c79ee788b12b6db280d7584bc558d20487975460822f8da1b005723ede4a',
    'dag-4/topas': '45d3697f4227756a7c75600ca1d65f73233b40bf8b2994ecdc26ddb410a6de09',
    'dag-4/topas-request-only': '1f1f4cdaa50edda553bf69fbe4071c10e42823a4452a48549fcce63b60c2f016',
    'metagpt-sop/topas-readings': '753de69aea0828b9773f8c119e62e3825af8b3f03d3967b9e264f641dde60fe4',
    'metagpt-tl/topas-local+': '3e7e7dd12b6287abd2242083395b1ab51fae74dca7c8baf12f8310d5a3c0f028',
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
