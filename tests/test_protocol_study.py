"""The protocol's final runs (studies.protocol_runs.study): the Bonferroni level over seeds, the
capacity and its verdict against the best baseline, latency only within capacities, overload as its
own claim, the stopping rule that cannot change a capacity, and the per-run evidence cache."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import summary_only_pack
from topas.experiments.protocol import EVALUATION_SEEDS, HELD_OUT_WORKFLOW_SEEDS, TUNING_SEEDS
from topas.experiments.protocol import seeds as seed_ranges
from topas.sets import HELD_OUT, IN_SAMPLE
from studies.protocol_runs.study import (
    EVIDENCE_COLUMNS,
    FULL,
    QUICK,
    TEST_VERSION,
    ProtocolSize,
    capacity_grid_runs,
    capacity_rows,
    evidence_for,
    latency_rows,
    overload_rows,
    run_evidence,
    seed_verdicts,
)

# ----------------------------------------------------------------------------- helpers


def evidence(cells: dict[tuple[str, float], list[bool]], workload: str = "dag-4",
             jct: dict[tuple[str, float], list[float]] | None = None) -> pd.DataFrame:
    """Evidence rows from ``{(policy, load): [growing per seed]}``: a growing run has p-value 0 on
    the in-system indicator, a stable one 0.5 on both; mean JCT from ``jct`` (default 10 s)."""
    rows = []
    for (policy, load), growing in cells.items():
        for seed, g in enumerate(growing):
            j = (jct or {}).get((policy, load), [10.0] * len(growing))[seed]
            rows.append({"key": f"{workload}/{policy}/{load}/{seed}", "workload": workload, "policy": policy,
                         "load": load, "seed": seed, "n_tasks": 1000, "finished": True, "completion_ratio": 1.0,
                         "jct_mean": j, "jct_p99": 3 * j, "throughput_rps": 1.0,
                         "jct_n": 1000, "jct_warmup": 0, "jct_slope": 0.0, "jct_p_value": 0.5, "jct_growth": 0.0,
                         "in_system_n": 1000, "in_system_warmup": 0, "in_system_slope": 1.0 if g else 0.0,
                         "in_system_p_value": 0.0 if g else 0.5, "in_system_growth": 5.0 if g else 0.0})
    return seed_verdicts(pd.DataFrame(rows, columns=list(EVIDENCE_COLUMNS)))


def row(df: pd.DataFrame, **match) -> pd.Series:
    sel = df
    for k, v in match.items():
        sel = sel[sel[k] == v]
    assert len(sel) == 1, f"{match}: {len(sel)} rows"
    return sel.iloc[0]


# ----------------------------------------------------------------------------- the sizes


def test_full_size_uses_five_evaluation_seeds_and_holds_out_workloads_no_selection_saw():
    assert FULL.n_seeds >= 5
    assert FULL.seeds == tuple(EVALUATION_SEEDS[:FULL.n_seeds])
    assert not set(FULL.seeds) & set(TUNING_SEEDS)
    assert not set(IN_SAMPLE) & set(HELD_OUT)
    # the shipped grid: the in-sample workloads and the MetaGPT traces (the random workflows were cut
    # from it for time; docs/protocol.md), every one of them in-sample or held out
    assert set(FULL.workloads) == set(IN_SAMPLE) | {"metagpt-sop", "metagpt-tl"}
    assert set(FULL.workloads) <= set(IN_SAMPLE) | set(HELD_OUT)
    assert {f"random-dag-{s}" for s in HELD_OUT_WORKFLOW_SEEDS} <= set(HELD_OUT)
    assert {"metagpt-sop", "metagpt-tl"} <= set(HELD_OUT)
    assert list(FULL.loads) == sorted(FULL.loads) and FULL.loads[0] < 1.0 < FULL.loads[-1]


def test_every_workload_of_the_full_and_quick_sizes_is_a_shipped_trace():
    traces = Path(__file__).resolve().parents[1] / "data" / "traces"
    for w in set(FULL.workloads) | set(QUICK.workloads) | {FULL.convergence_workload}:
        assert (traces / f"{w}.json.gz").is_file(), w


def test_a_size_refuses_a_grid_that_is_not_ascending_and_a_workload_without_a_length():
    with pytest.raises(ValueError, match="ascending"):
        ProtocolSize(("dag-4",), ("fcfs",), (1.0, 0.5), 2, {"dag-4": 10})
    with pytest.raises(ValueError, match="chain-3"):
        ProtocolSize(("dag-4", "chain-3"), ("fcfs",), (0.5, 1.0), 2, {"dag-4": 10})
    with pytest.raises(ValueError, match="evaluation seeds"):
        ProtocolSize(("dag-4",), ("fcfs",), (0.5,), len(seed_ranges.EVALUATION_SEEDS) + 1, {"dag-4": 10})


# ----------------------------------------------------------------------------- per-run verdicts


def test_seed_verdicts_test_each_p_value_at_alpha_over_seeds_times_indicators():
    ev = evidence({("lpm", 1.0): [False] * 5, ("lpm", 1.5): [False] * 3})
    # alpha 0.05 over 5 seeds x 2 indicators is 0.005; over 3 seeds, 0.05 / 6
    assert np.allclose(ev.loc[ev["load"] == 1.0, "level"], 0.005)
    assert np.allclose(ev.loc[ev["load"] == 1.5, "level"], 0.05 / 6)
    raw = ev.drop(columns=["level", "growing", "stable_at_load"])
    raw.loc[(raw["load"] == 1.0) & (raw["seed"] == 0), "jct_p_value"] = 0.0049
    raw.loc[(raw["load"] == 1.0) & (raw["seed"] == 1), "jct_p_value"] = 0.0051
    ev = seed_verdicts(raw)
    at1 = ev[ev["load"] == 1.0].set_index("seed")
    assert at1.loc[0, "growing"] and not at1.loc[1, "growing"]
    assert not at1["stable_at_load"].any()
    assert ev.loc[ev["load"] == 1.5, "stable_at_load"].all()


def test_a_run_that_did_not_finish_counts_as_growing():
    tasks = pd.DataFrame({"arrival": [0.0, 1.0, 2.0], "finish": [1.0, np.nan, 3.0], "jct": [1.0, np.nan, 1.0]})
    summary = {"completion_ratio": 2 / 3, "jct_mean": 1.0, "jct_p99": 1.0, "throughput_rps": 1.0}
    r = run_evidence(tasks, summary)
    assert r["finished"] is False
    assert r["jct_p_value"] == 0.0 and r["in_system_p_value"] == 0.0 and r["in_system_growth"] == math.inf


# ----------------------------------------------------------------------------- capacity


def test_capacity_of_the_non_monotone_lpm_case_stops_at_the_first_rejected_load():
    # one seed stable at 1.0, growing at 1.25, stable again at 1.5 (the LPM DAG-4 shape)
    ev = evidence({("lpm", 1.0): [False, False], ("lpm", 1.25): [True, False], ("lpm", 1.5): [False, False]})
    c = row(capacity_rows(ev), policy="lpm")
    assert (c["capacity"], c["lower"], c["upper"]) == (1.0, 1.0, 1.25)
    assert (c["seed_low"], c["seed_high"]) == (1.0, 1.5)
    assert c["sample"] == "in-sample" and c["loads_run"] == 3


def test_capacity_verdicts_are_at_grid_resolution_against_the_best_baseline():
    loads = (1.0, 1.25, 1.5, 1.75, 2.0)

    def ladder(cap: float) -> dict:
        return {l: [l > cap] * 2 for l in loads}

    caps = {"fcfs": 1.0, "lpm": 1.5, "spf": 1.25, "topas": 1.25, "topas-plus": 1.75, "topas-both": 1.5}
    cells = {(p, l): g for p, c in caps.items() for l, g in ladder(c).items()}
    out = capacity_rows(evidence(cells, workload="random-dag-1000")).set_index("policy")
    assert set(out["best_baseline"]) == {"lpm"} and set(out["baseline_upper"]) == {1.75}
    assert out.loc["lpm", "capacity_verdict"] == "best baseline"
    assert out.loc["topas-plus", "capacity_verdict"] == "higher"    # 1.75 >= LPM's first rejected 1.75
    assert out.loc["topas", "capacity_verdict"] == "lower"          # its first rejected 1.5 <= LPM's 1.5
    assert out.loc["topas-both", "capacity_verdict"] == "same bracket"
    assert (out["sample"] == "held-out").all()


def test_a_policy_unstable_at_the_lowest_load_has_no_capacity_and_is_lower():
    cells = {("fcfs", 1.0): [False, False], ("fcfs", 1.5): [False, False],
             ("topas", 1.0): [True, False], ("topas", 1.5): [True, True]}
    out = capacity_rows(evidence(cells)).set_index("policy")
    assert math.isnan(out.loc["topas", "capacity"]) and out.loc["topas", "upper"] == 1.0
    assert out.loc["topas", "capacity_verdict"] == "lower"
    assert out.loc["fcfs", "upper"] == math.inf


# ----------------------------------------------------------------------------- latency and overload


def test_latency_is_compared_only_within_both_capacities_against_the_lowest_mean_baseline():
    loads = (1.0, 1.25, 1.5)
    growing = {"fcfs": (1.5,), "lpm": (1.25, 1.5), "topas": ()}
    jct = {("fcfs", 1.0): [12, 13, 14], ("lpm", 1.0): [10, 11, 12], ("topas", 1.0): [9, 10.5, 11.5],
           ("fcfs", 1.25): [20, 22, 24], ("lpm", 1.25): [5, 5, 5], ("topas", 1.25): [21, 23, 25],
           ("fcfs", 1.5): [50, 60, 70], ("lpm", 1.5): [90, 95, 99], ("topas", 1.5): [30, 30, 30]}
    cells = {(p, l): [l in growing[p]] * 3 for p in growing for l in loads}
    lat = latency_rows(evidence(cells, jct=jct), candidates=("topas",), baselines=("fcfs", "lpm"))
    assert list(lat["load"]) == [1.0, 1.25]      # 1.5 is above every baseline's capacity
    # at 1.0 LPM has the lower mean; at 1.25 LPM is past capacity (its 5 s does not count), so FCFS
    assert list(lat["baseline"]) == ["lpm", "fcfs"]
    assert list(lat["near_capacity"]) == [False, True]
    at1 = row(lat, load=1.0)
    # differences -1, -0.5, -0.5: mean -2/3, t interval (2 df) about [-1.38, 0.05]: a tie
    assert at1["jct_diff_s"] == pytest.approx(-2 / 3) and at1["jct_verdict"] == "tie"
    assert at1["jct_high_s"] > 0 > at1["jct_low_s"]
    assert at1["n_seeds"] == 3


def test_overload_is_the_first_load_above_capacity_and_absent_when_stable_at_the_top():
    cells = {("lpm", 1.0): [False, False], ("lpm", 1.25): [True, False], ("lpm", 1.5): [True, True],
             ("fcfs", 1.0): [False, False], ("fcfs", 1.25): [False, False], ("fcfs", 1.5): [False, False]}
    ov = overload_rows(evidence(cells))
    assert list(ov["policy"]) == ["lpm"]
    o = ov.iloc[0]
    assert (o["load"], o["capacity"], o["n_growing"], o["n_seeds"]) == (1.25, 1.0, 1, 2)
    assert o["in_system_growth"] == pytest.approx(2.5)


# ----------------------------------------------------------------------------- the stopping rule


def _fake_grid(monkeypatch, truth: dict[tuple[str, float, int], bool]) -> list[tuple[str, float, int]]:
    """capacity_grid_runs over a table of which (policy, load, seed) runs grow: no simulation. Returns
    the list of runs asked for."""
    import topas.experiments as experiments
    import studies.protocol_runs.study as study

    asked: list[tuple[str, float, int]] = []

    def run_sweep(exps, store, **kw):
        asked.extend((e.policy, e.load, e.seed) for e in exps)

    def evidence_for(exps, store, path=None):
        cells: dict = {}
        for e in exps:
            cells.setdefault((e.policy, e.load), []).append(truth[(e.policy, e.load, e.seed)])
        return evidence(cells).drop(columns=["level", "growing", "stable_at_load"])

    monkeypatch.setattr(experiments, "run_sweep", run_sweep)
    monkeypatch.setattr(study, "evidence_for", evidence_for)
    return asked


def test_the_stopping_rule_never_changes_a_capacity_its_bracket_latency_or_overload(monkeypatch, tmp_path):
    loads = (0.75, 1.0, 1.25, 1.5, 1.75, 2.0)
    policies = ("fcfs", "lpm", "topas")
    rng = np.random.default_rng(7)
    skipped = 0
    for trial in range(40):
        # growth more likely at higher loads, but not monotone in load
        truth = {(p, l, s): bool(rng.random() < (l - 0.5) / 2.0) for p in policies for l in loads for s in range(3)}
        asked = _fake_grid(monkeypatch, truth)
        size = ProtocolSize(("dag-4",), policies, loads, 3, {"dag-4": 10})
        ev_stopped = capacity_grid_runs(size, store=tmp_path)
        n_asked = len(asked)
        stopped = capacity_rows(ev_stopped).set_index("policy")
        ev_full = evidence({(p, l): [truth[(p, l, s)] for s in range(3)] for p in policies for l in loads})
        full = capacity_rows(ev_full).set_index("policy")
        cols = ["capacity", "lower", "upper", "seed_low", "capacity_verdict"]
        pd.testing.assert_frame_equal(stopped[cols], full[cols])
        pd.testing.assert_frame_equal(overload_rows(ev_stopped).reset_index(drop=True),
                                      overload_rows(ev_full).reset_index(drop=True))
        lat_cols = ["workload", "load", "candidate", "baseline", "n_seeds"]
        pd.testing.assert_frame_equal(
            latency_rows(ev_stopped, candidates=("topas",), baselines=("fcfs", "lpm"))[lat_cols].reset_index(drop=True),
            latency_rows(ev_full, candidates=("topas",), baselines=("fcfs", "lpm"))[lat_cols].reset_index(drop=True))
        skipped += len(policies) * len(loads) * 3 - n_asked
        for p in policies:
            ran = sorted({l for (q, l, _) in asked if q == p})
            assert not any(truth[(p, l, s)] for l in ran[:-1] for s in range(3)), \
                f"trial {trial}: {p} ran past the first load at which a seed failed"
    assert skipped > 0  # the rule does save runs


# ----------------------------------------------------------------------------- the evidence cache


def test_evidence_is_cached_by_key_and_a_mismatched_row_is_named(tmp_path):
    from topas.experiments import Experiment, ResultStore, run_sweep

    store = ResultStore(tmp_path / "store")
    exps = [Experiment("chain-3", "fcfs", {}, load=0.5, seed=s, n_tasks=60) for s in (0, 1)]
    run_sweep(exps, store, jobs=1, tables=False)
    cache = tmp_path / "evidence.csv"
    first_ev = evidence_for(exps, store, cache)
    assert list(first_ev["key"]) == [e.key() for e in exps]
    assert cache.is_file() and len(pd.read_csv(cache)) == 2

    # evidence of another test version is recomputed, not read
    old = pd.read_csv(cache).assign(test="plain-slope", jct_p_value=-1.0)
    old.to_csv(cache, index=False)
    redone = evidence_for(exps, store, cache)
    assert (redone["test"] == TEST_VERSION).all() and (redone["jct_p_value"] >= 0).all()
    assert set(pd.read_csv(cache)["test"]) == {TEST_VERSION}

    # the cached evidence stands in for the tasks tables (a pack ships summaries only): the runs
    # moved into a pack whose manifest keeps no table of theirs
    pack = summary_only_pack(store.root, [e.key() for e in exps], tmp_path / "pack")
    store = ResultStore(tmp_path / "empty", packs=[pack])
    again = evidence_for(exps, store, cache)
    pd.testing.assert_frame_equal(again.reset_index(drop=True), first_ev.reset_index(drop=True), check_dtype=False)

    bad = pd.read_csv(cache)
    bad.loc[bad["seed"] == 1, "jct_mean"] += 1.0
    bad.to_csv(cache, index=False)
    with pytest.raises(ValueError, match=r"seed=1") as err:
        evidence_for(exps, store, cache)
    assert str(cache) in str(err.value)


def test_grid_bound_holds_every_run_the_protocol_made():
    """The plan's bound for notebook 16 is every (workload, policy, grid load, seed) and the
    convergence study: each shipped run of the final grid is one of them, and there are more (the
    stopping rule skips the rest)."""
    import pandas as pd

    from studies.protocol_runs import study as ps

    bound = ps.grid_bound(ps.FULL)
    keys = {e.key() for e in bound}
    assert len(keys) == len(bound) == (len(ps.FULL.workloads) * len(ps.FULL.policies) * len(ps.FULL.loads)
                                       * ps.FULL.n_seeds + len(ps.convergence_experiments(ps.FULL)))
    # the cache holds other studies' runs too (notebook 15's full-length stage: its LRU cells are
    # default-engine runs, on the random workflows as well, which the protocol's grid leaves out)
    ev = ps.default_engine_rows(ps.read_evidence(ps.default_evidence_path(None)))
    ev = ev[(ev["test"] == ps.TEST_VERSION) & ev["policy"].isin(ps.FULL.policies)
            & (ev["workload"].isin(ps.FULL.workloads) | (ev["workload"] == ps.FULL.convergence_workload))
            & ((ev["workload"].map(ps.FULL.n_tasks) == ev["n_tasks"]) | (ev["workload"] == ps.FULL.convergence_workload))]
    assert len(ev) > 1000
    assert set(ev["key"]) <= keys
    assert len(keys) > len(set(ev["key"]))


def test_quick_runs_write_their_evidence_in_the_store_never_the_committed_cache(monkeypatch):
    """``make reproduce QUICK=1`` writes nothing tracked: its evidence rows go to the (git-ignored)
    store, not ``data/results/protocol/evidence.csv``."""
    from studies.protocol_runs import study as ps
    from topas.experiments.store import default_store_root

    committed = ps.default_evidence_path(None)
    assert committed.parts[-3:] == ("results", "protocol", "evidence.csv")
    assert ps.quick_evidence_path(None) == Path(default_store_root()) / "protocol_evidence.csv"
    seen = []
    monkeypatch.setattr(ps, "capacity_grid_runs", lambda size, store, path, *a: seen.append(path) or pd.DataFrame())
    monkeypatch.setattr(ps, "convergence_rows", lambda size, store, path, *a: seen.append(path) or pd.DataFrame())
    for f in (ps.capacity_rows, ps.latency_rows, ps.overload_rows):
        monkeypatch.setattr(ps, f.__name__, lambda runs, *a, **k: pd.DataFrame())
    ps.protocol_runs(["dag-4"], quick=True)
    ps.protocol_tables(quick=True)
    assert seen and all(p == ps.quick_evidence_path(None) for p in seen)


def test_the_shared_cache_never_pools_runs_of_other_engine_options(tmp_path):
    """The cache holds every study's long runs (the eviction study's full-length stage too): a run
    of another engine's options at the same (workload, policy, run length, load) is its own group in
    :func:`seed_verdicts`, and a reader of the protocol's grid keeps the default engine's rows. A
    cache written before the column existed reads as the default engine's."""
    from studies.protocol_runs import study as ps
    from topas.experiments import Experiment

    ev = evidence({("lpm", 1.0): [False, False]}).drop(columns=["level", "growing", "stable_at_load"])
    other = ev.assign(key=ev["key"] + "/kvflow", engine_options='{"eviction":"kvflow"}', in_system_p_value=0.0)
    v = ps.seed_verdicts(pd.concat([ev, other], ignore_index=True))
    assert list(v["stable_at_load"]) == [True, True, False, False]
    assert (v["level"] == ps.ALPHA / (2 * len(ps.INDICATORS))).all()  # k seeds, not 2k
    assert list(ps.default_engine_rows(v)["key"]) == list(ev["key"])
    old = tmp_path / "old.csv"
    ev.drop(columns=["engine_options"]).to_csv(old, index=False)
    assert list(ps.read_evidence(old).columns) == list(EVIDENCE_COLUMNS)
    assert set(ps.read_evidence(old)["engine_options"]) == {ps.DEFAULT_ENGINE}
    assert ps.engine_options_of(Experiment("dag-4", "lpm", {}, load=1.0, seed=0, n_tasks=10)) == ps.DEFAULT_ENGINE
