"""The eviction study's tables (studies.eviction.study.build_tables) on a tiny hand-made grid,
and the shape of its grid."""

from __future__ import annotations

import math

import pytest

from studies.eviction import study as es


def _summary(jct: float, uncached: int, prompt: int = 1000, n_tasks: int = 10) -> dict:
    return {"jct_mean": jct, "jct_p99": 2 * jct, "prompt_tokens": prompt, "cached_tokens": prompt - uncached,
            "n_tasks": n_tasks}


#: (admission, eviction) -> per-seed mean JCT; uncached tokens = 10 * JCT
JCT = {
    ("lpm", "lru"): (10.0, 11.0, 12.0),
    ("lpm", "lfu"): (9.0, 10.1, 10.9),     # better than lru on every seed, by about 1 s
    ("lpm", "belady"): (5.0, 5.0, 5.0),    # the bound: best, never a candidate
    ("topas", "lru"): (20.0, 21.0, 22.0),
    ("topas", "lfu"): (8.0, 9.2, 9.9),     # the best non-bound cell, beats lpm+lfu
    ("topas", "belady"): (4.0, 4.0, 4.0),
    ("spf", "lru"): (1.0, 1.0, 1.0),       # fastest of all, but not stable: never the best baseline
    ("spf", "belady"): (1.0, 1.0, 1.0),
}
UNSTABLE = {("spf", "lru"), ("spf", "belady")}


def _tables():
    summaries = {("w", "none", a, e): {s: _summary(j, int(10 * j)) for s, j in enumerate(v)}
                 for (a, e), v in JCT.items()}
    stable = {k: ((k[2], k[3]) not in UNSTABLE, (0,) if (k[2], k[3]) in UNSTABLE else ()) for k in summaries}
    return es.build_tables(summaries, stable)


def test_runs_table_one_row_per_cell_with_seed_means():
    runs = _tables()["runs"]
    assert list(runs.columns) == list(es.RUN_COLUMNS)
    assert len(runs) == len(JCT)
    row = runs[(runs.admission == "lpm") & (runs.eviction == "lru")].iloc[0]
    assert row.jct_mean == pytest.approx(11.0)
    assert row.uncached_tokens == pytest.approx(110.0)
    assert row.cached_pct == pytest.approx(100 * (1 - 110 / 1000))
    assert runs[runs.eviction == "belady"]["bound"].all() and not runs[runs.eviction == "lru"]["bound"].any()


def test_belady_gap_against_the_same_admission():
    gap = _tables()["gap"]
    assert set(gap.eviction) == {"lru", "lfu"}  # the bound has no gap row
    row = gap[(gap.admission == "lpm") & (gap.eviction == "lru")].iloc[0]
    assert row.uncached_gap_pct == pytest.approx(100 * (110 / 50 - 1))
    assert row.jct_gap_pct == pytest.approx(100 * (11.0 / 5.0 - 1))
    assert row.jct_gap_low_pct < row.jct_gap_pct < row.jct_gap_high_pct
    spf = gap[gap.admission == "spf"].iloc[0]
    assert math.isnan(spf.jct_gap_pct) and "not stable" in spf.note


def test_where_eviction_matters_is_paired_and_excludes_the_bound():
    m = _tables()["matters"].set_index("admission")
    assert m.loc["lpm", "best_eviction"] == "lfu" and m.loc["lpm", "verdict"] == "win"
    assert m.loc["topas", "verdict"] == "win" and m.loc["topas", "relative_high_pct"] < 0
    assert m.loc["lpm", "spread_pct"] == pytest.approx(100 * (11.0 / 10.0 - 1))
    assert m.loc["spf", "verdict"].startswith("not compared")


def test_verdict_best_candidate_against_best_stable_baseline():
    v = _tables()["verdict"].iloc[0]
    assert v.candidate == "topas+lfu"  # not a belady cell, though those are faster
    assert v.baseline == "lpm+lfu"     # not spf: it is not stable
    assert v.difference_s == pytest.approx(((8 - 9) + (9.2 - 10.1) + (9.9 - 10.9)) / 3)
    assert v.verdict == "win"


def test_a_tie_when_the_interval_holds_zero():
    summaries = {("w", "none", "lpm", e): {s: _summary(j, 10) for s, j in enumerate(v)}
                 for e, v in (("lru", (10.0, 11.0, 12.0)), ("lfu", (9.0, 12.0, 11.5)))}
    t = es.build_tables(summaries, {k: (True, ()) for k in summaries})
    assert t["matters"].iloc[0]["verdict"] == "tie"
    assert t["gap"].empty  # no bound cell ran


def test_grid_sizes_and_keys():
    quick = es.eviction_study_grid(("dag-4",), quick=True)
    q = es.QUICK
    def orders(a):  # an admission that decides eviction runs with its own order only
        return 1 if a in es.OWN_EVICTION else len(es.EVICTIONS)

    n_none = sum(orders(a) for a in (q.admissions or es.ADMISSIONS)) * q.n_seeds
    n_host = sum(orders(a) for a in q.host_admissions) * q.host_n_seeds
    assert len(quick) == n_none + n_host == len(set(quick))
    lru = [e for e in quick if not e.engine_options]
    quick_admissions = q.admissions or es.ADMISSIONS
    own = [a for a in quick_admissions if a in es.OWN_EVICTION]
    assert len(lru) == (len(quick_admissions) - len(own)) * q.n_seeds  # lru without a host tier is the default engine
    assert len(es.eviction_study_grid(("dag-4",))) > len(quick)  # the full grid runs every admission
    assert {e.engine_options for e in quick if e.policy in es.OWN_EVICTION} == {(("eviction", "policy"),)}
    assert all(e.seed in range(q.n_seeds) for e in quick) and all(e.load == es.LOAD for e in quick)


def test_the_verdict_has_a_declared_and_an_in_sample_candidate():
    """The declared candidate (selected on tuning seeds before the runs) and the best of our cells
    (picked on the compared seeds: in-sample) are each compared with the best baseline."""
    jcts = {("lpm", "lru"): (10.0, 11.0, 12.0), ("spf", "lru"): (10.5, 11.5, 12.5),
            ("topas-plus", "lru"): (8.0, 9.0, 10.0), es.DECLARED: (9.0, 10.0, 11.1)}
    summaries = {("w", "none", a, e): {s: _summary(j, 10) for s, j in enumerate(v)} for (a, e), v in jcts.items()}
    v = es.build_tables(summaries, {k: (True, ()) for k in summaries})["verdict"]
    assert list(v["selection"].str.split(":").str[0]) == ["declared", "in-sample"]
    assert list(v["candidate"]) == ["+".join(es.DECLARED), "topas-plus+lru"]
    assert set(v["baseline"]) == {"lpm+lru"} and list(v["verdict"]) == ["win", "win"]
    assert "best of 2 cells" in v["selection"].iloc[1]


def test_the_verdict_says_which_workloads_a_selection_saw():
    """TOPAS-both and TOPAS+ were selected on the synthetic workloads: their rows are in-sample there,
    held-out on the MetaGPT workflows and the random DAGs; the study runs all nine on 5 seeds."""
    jcts = {("lpm", "lru"): (10.0, 11.0, 12.0), es.DECLARED: (9.0, 10.0, 11.1)}
    summaries = {(w, "none", a, e): {s: _summary(j, 10) for s, j in enumerate(v)}
                 for w in ("dag-4", "metagpt-tl", "random-dag-1002") for (a, e), v in jcts.items()}
    v = es.build_tables(summaries, {k: (True, ()) for k in summaries})["verdict"]
    assert dict(zip(v["workload"], v["sample"])) == {"dag-4": "in-sample", "metagpt-tl": "held-out",
                                                     "random-dag-1002": "held-out"}
    assert {"random-dag-1000", "metagpt-sop", "chain-3"} <= set(es.WORKLOADS) and es.FULL.n_seeds == 5


def test_a_policy_that_decides_eviction_runs_in_the_eviction_study_only():
    """TOPAS-both under the engine's default eviction is TOPAS+: the sweeps over every policy
    (the results table) leave it out; the eviction study runs it with its own order."""
    from studies import grid
    from topas.policies import available_policies

    assert "topas-both" in available_policies() and "topas-both" not in grid.swept_policies()
    assert {e.policy for e in grid.results_table(quick=True)} == set(grid.swept_policies())
    both = [e for e in es.eviction_study_grid(("dag-4",)) if e.policy == "topas-both"]
    assert both and all(dict(e.engine_options)["eviction"] == "policy" for e in both)


def test_runs_name_the_growing_seeds_and_the_seeds_table_counts_them():
    summaries = {("w", "none", a, "lru"): {s: _summary(10.0, 10) for s in range(3)} for a in ("lpm", "spf")}
    stable = {("w", "none", "lpm", "lru"): (False, (2,)), ("w", "none", "spf", "lru"): (False, (0, 2))}
    t = es.build_tables(summaries, stable)
    assert list(t["runs"]["growing"]) == ["2", "0 2"]
    assert t["seeds"].set_index("seed")["cells_growing"].to_dict() == {0: 1, 1: 0, 2: 2}
    assert set(t["seeds"]["cells"]) == {2}


def _screen(rows):
    import pandas as pd

    return pd.DataFrame([{"workload": w, "host_tier": h, "admission": a, "eviction": e, "jct_mean": j}
                         for w, h, a, e, j in rows])


def test_the_full_length_stage_picks_the_deciding_cells_on_the_screen():
    """Per admission its screen-best online order and LRU, LPM+KVFlow, LPM+Belady (the bound) and the
    declared candidate; the bound is never an admission's best, however fast."""
    from studies.eviction import full_length as fl

    screen = _screen([
        ("w", "none", "lpm", "lru", 10.0), ("w", "none", "lpm", "lfu", 9.0), ("w", "none", "lpm", "kvflow", 11.0),
        ("w", "none", "lpm", "priority", 9.5), ("w", "none", "lpm", "belady", 1.0),
        ("w", "none", "fcfs", "lru", 20.0), ("w", "none", "fcfs", "priority", 19.0), ("w", "none", "fcfs", "kvflow", 18.0),
        ("w", "none", "fcfs", "belady", 2.0),
        ("w", "none", "topas-plus", "lru", 8.0), ("w", "none", "topas-plus", "lfu", 8.5),
        ("w", "none", "topas-both", "policy", 7.0),
        ("w", "hicache", "lpm", "lru", 5.0),
    ])
    cells = fl.deciding_cells(screen, es.OWN_EVICTION, es.BOUND)
    assert list(cells.columns) == list(fl.CELL_COLUMNS)
    got = {(r.host_tier, r.admission, r.eviction) for r in cells.itertuples()}
    assert got == {("none", "lpm", "lfu"), ("none", "lpm", "lru"), ("none", "lpm", "kvflow"), ("none", "lpm", "belady"),
                   ("none", "fcfs", "kvflow"), ("none", "fcfs", "lru"),  # KVFlow under FCFS only as its best
                   ("none", "topas-plus", "lru"), ("none", "topas-both", "policy"), ("hicache", "lpm", "lru")}
    why = cells.set_index(["host_tier", "admission", "eviction"])["why"]
    assert why[("none", "topas-plus", "lru")] == "best on the screen; LRU (SGLang's default)"
    assert "never a candidate" in why[("none", "lpm", "belady")] and "declared" in why[("none", "topas-both", "policy")]
    only = fl.deciding_cells(screen, es.OWN_EVICTION, es.BOUND, host_tiers=("hicache",))
    assert set(only["host_tier"]) == {"hicache"}


def test_the_full_length_stage_runs_the_protocol_s_run_length():
    """The run length is the protocol's (studies.protocol_runs.study.FULL), not a copy: 1,000 tasks,
    600 on MetaGPT; quick mode is tiny."""
    from studies.eviction import full_length as fl
    from studies.protocol_runs.study import FULL as PROTOCOL

    assert all(fl.run_length(w) == PROTOCOL.n_tasks[w] for w in es.WORKLOADS)
    assert fl.run_length("metagpt-sop") == 600 and fl.run_length("dag-4") == 1000
    assert fl.seeds() == list(range(es.FULL.n_seeds))
    assert fl.run_length("dag-4", quick=True) <= 60 and len(fl.seeds(quick=True)) == 2
    screen = _screen([("dag-4", "none", "lpm", "lru", 10.0), ("dag-4", "none", "lpm", "lfu", 9.0),
                      ("metagpt-tl", "none", "lpm", "lru", 10.0), ("dag-4", "hicache", "lpm", "lru", 1.0)])
    runs = es.full_length_grid(screen)
    assert {(e.workload, e.n_tasks) for e in runs} == {("dag-4", 1000), ("metagpt-tl", 600)}
    assert len(runs) == 4 * es.FULL.n_seeds and all(e.load == es.LOAD for e in runs)
    assert {dict(e.engine_options).get("host_tier", False) for e in runs} == {False, True}
    quick = es.full_length_grid(screen, quick=True)  # DAG-4 without a host tier only
    assert {(e.workload, e.n_tasks) for e in quick} == {("dag-4", fl.run_length("dag-4", True))} and len(quick) == 4


def test_the_stages_are_labelled():
    assert es.screen_label() == "screen, 100 tasks"
    assert es.full_label() == "full length, 600 / 1000 tasks"


def test_the_full_length_stage_reads_cached_evidence_and_builds_from_summaries_alone(tmp_path, monkeypatch):
    """The full-length stage's stability comes from the protocol's evidence cache (the same verdict
    as the steady-state test on the tasks tables), so its tables build from a pack that ships these
    runs' ``meta.json`` alone and the evidence file (``make figures``), with nothing simulated."""
    import pandas as pd
    from conftest import summary_only_pack

    from studies.protocol_runs import study as ps
    from topas.experiments.protocol.steady import steady_state
    from topas.experiments.store import STORE_ONLY_ENV, ResultStore

    screen = _screen([("dag-4", "none", "lpm", "lru", 10.0), ("dag-4", "none", "lpm", "lfu", 9.0),
                      ("dag-4", "none", "lpm", "kvflow", 11.0), ("dag-4", "none", "lpm", "belady", 5.0),
                      ("dag-4", "none", "topas-plus", "lru", 8.0), ("dag-4", "none", "topas-both", "policy", 7.0)])
    store = ResultStore(tmp_path / "store")
    full = es.full_length_tables(screen, quick=True, store=store)
    exps = es.full_length_grid(screen, quick=True)
    cache = ps.quick_evidence_path(store)  # a quick run's rows: in the store, never the committed file
    ev = ps.read_evidence(cache)
    assert set(ev["key"]) == {e.key() for e in exps} and list(ev.columns) == list(ps.EVIDENCE_COLUMNS)
    assert set(ev["engine_options"]) >= {ps.DEFAULT_ENGINE, '{"eviction":"kvflow"}'}

    # the cached verdict is the steady-state test's on the tasks tables
    by_cell = {}
    for e in exps:
        by_cell.setdefault((e.policy, dict(e.engine_options).get("eviction", "lru")), {})[e.seed] = e
    for r in full["runs"].itertuples():
        st = steady_state({s: store.load_table(e, "tasks") for s, e in by_cell[(r.admission, r.eviction)].items()})
        assert (r.stable, r.growing) == (st.stable, " ".join(str(x) for x in st.growing_seeds)), r

    # the runs in a pack without their tables (summaries only), the store empty: the same tables
    pack = summary_only_pack(store.root, [e.key() for e in exps], tmp_path / "pack")
    monkeypatch.setenv(STORE_ONLY_ENV, "1")  # nothing is simulated
    again = es.full_length_tables(screen, quick=True, store=ResultStore(tmp_path / "empty", packs=[pack]),
                                  evidence_path=cache)
    assert set(again) == set(full)
    for name in full:
        pd.testing.assert_frame_equal(again[name], full[name])
