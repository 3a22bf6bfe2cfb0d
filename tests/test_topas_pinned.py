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
    'dag-10-wide/topas': 'b7e8f6814f4023263f095b17eba0d37030b052266ff1c465431c4853aafb9ba4',
    'dag-10-wide/topas-earlier-plan': '2f1e2dc3f6d7c65592b05eafed2ce833cbc4e3c2c8422b35ec5b40fb09164240',
    'dag-10-wide/topas-sampled': '647774a5b8fd7b425d54057289b245bb7b96789c93f897e35c535920200aea08',
    'dag-4/topas': 'a69efa2e4f3b51edf154a45a3285ca7ce533644fc6e1655e8d35c12a1e776efd',
    'dag-4/topas-earlier-plan': '3e3eb2e4c6391a08e05fec5fdfddfe16547b47208137502ad6ccbd71366da36c',
    'dag-4/topas-preempt-off': '23aac3cc6957e758f6f2c44f83fcc8f8fa984b304637f1d90f00c8ab15602529',
    'dag-4/topas-request-only': '890fa211e576d83bc29e886d74556d99f43cd006c7d2c0b052b891f8c0bd6cf9',
    'metagpt-sop/topas-readings': 'd3f0142a5856e2b7919e9db341edd967929d06146ecfc4f0e136919f43980f31',
    'metagpt-tl/topas-local+': 'c554db64a857d46d76f362b58954b313bbf548224fa67392ff0dd586c7fb4e34',
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
