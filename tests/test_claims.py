"""Notebook 12's tables (studies.claims.tables) on hand-built results, and its grids
(studies.claims.grid: operating points, the reading space, both ablation sets)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from studies.claims import tables as claims
from studies.claims import grid
from studies.analysis import paper_reported


def _points(workloads=("chain-3",), fractions=(0.5, 0.8, 1.2)) -> pd.DataFrame:
    return pd.DataFrame([{"workload": w, "fraction": f, "regime": "below" if f < 1 else "beyond",
                          "load": round(f * 1.5, 4)} for w in workloads for f in fractions])


def _run(workload, fraction, policy, mean, p99, label=None, regime=None, stable=True):
    return {"workload": workload, "fraction": fraction, "regime": regime or ("below" if fraction < 1 else "beyond"),
            "policy": policy, "label": label or policy, "load": fraction, "jct_mean": mean, "jct_p99": p99,
            "seed": 0, "n_tasks": 100, "key": f"{workload}/{fraction}/{policy}/{label}", "stable": stable}


def test_operating_table_compares_each_policy_with_the_best_baseline_of_its_point():
    runs = pd.DataFrame([
        _run("dag-4", 0.8, "lpm", 100.0, 300.0), _run("dag-4", 0.8, "fcfs", 120.0, 200.0),
        _run("dag-4", 0.8, "topas", 90.0, 250.0), _run("dag-4", 0.8, "topas-plus", 80.0, 190.0),
    ])
    t = claims.operating_table(runs).set_index("policy")
    assert t.loc["topas", "best baseline (mean)"] == "lpm" and t.loc["topas", "best baseline (p99)"] == "fcfs"
    assert t.loc["topas", "mean vs best %"] == pytest.approx(-10.0)
    assert t.loc["topas", "p99 vs best %"] == pytest.approx(25.0)
    assert t.loc["lpm", "mean vs best %"] == pytest.approx(0.0)


def test_topas_plus_goal_is_ties_at_stable_points_and_ten_percent_where_a_baseline_thrashes():
    def row(fraction, mean, p99, lead=float("nan"), best_unstable=False):
        return {"policy": "topas-plus", "workload": "w", "fraction": fraction,
                "regime": "below" if fraction < 1 else "beyond", "mean vs best %": mean, "p99 vs best %": p99,
                "a baseline is unstable": lead == lead, "lead over unstable baselines %": lead,
                "best baseline is unstable": best_unstable}
    rows = pd.DataFrame([
        row(0.5, 1.5, -3.0),                       # a tie with the best baseline: met
        row(0.6, 1.5, 2.5),                        # p99 behind by more than a tie
        row(0.8, -2.0, -3.0, lead=60.0),           # others thrash; 60% ahead of them: met
        row(0.9, -2.0, -3.0, lead=8.0),            # only 8% ahead of a thrashing baseline
        row(0.95, -8.0, 1.0, lead=40.0, best_unstable=True),   # the best baseline thrashes: needs -10%
        row(0.96, -12.0, 1.0, lead=40.0, best_unstable=True),
        row(1.2, 30.0, 30.0, lead=5.0),            # beyond capacity: shown, not judged
    ])
    goal = claims.policy_vs_best(rows, "topas-plus")["meets goal"].tolist()
    assert goal == [True, False, True, False, False, True, "n/a (beyond capacity)"]


def test_operating_table_measures_the_lead_over_the_baselines_that_thrash():
    runs = pd.DataFrame([
        _run("w", 0.8, "lpm", 100.0, 200.0), _run("w", 0.8, "fcfs", 400.0, 900.0, stable=False),
        _run("w", 0.8, "spf", 250.0, 500.0, stable=False), _run("w", 0.8, "topas-plus", 95.0, 190.0),
    ])
    runs["stable"] = runs["stable"].astype(bool)
    t = claims.operating_table(runs).set_index("policy")
    assert t.loc["topas-plus", "lead over unstable baselines %"] == pytest.approx(62.0)  # vs SPF's 250 s
    assert bool(t.loc["topas-plus", "a baseline is unstable"]) and not t.loc["topas-plus", "best baseline is unstable"]


def test_reading_space_pairs_each_reading_with_the_baselines_same_reading_or_their_default():
    runs = pd.DataFrame([
        _run("dag-4", 0.8, "lpm", 100.0, 200.0, "default"),
        _run("dag-4", 0.8, "spf", 110.0, 190.0, "default"),
        _run("dag-4", 0.8, "lpm", 150.0, 260.0, "host_tier=all"),  # the engine axis is LPM's too
        _run("dag-4", 0.8, "topas", 120.0, 220.0, "default"),
        _run("dag-4", 0.8, "topas", 90.0, 180.0, "search=local+"),  # TOPAS's axis: baselines' defaults
        _run("dag-4", 0.8, "topas", 140.0, 230.0, "host_tier=all"),
    ])
    t = claims.reading_space_table(runs, baselines=("lpm", "spf")).set_index("reading")
    assert t.loc["default", "mean vs best %"] == pytest.approx(20.0)
    assert t.loc["search=local+", "mean vs best %"] == pytest.approx(-10.0)
    assert t.loc["search=local+", "best baseline (p99)"] == "spf"
    # under host_tier=all LPM's own run (150) is the reference; SPF has none there, so its default (110)
    assert t.loc["host_tier=all", "best baseline (mean)"] == "spf"
    assert t.loc["host_tier=all", "mean vs best %"] == pytest.approx(100 * (140 / 110 - 1))
    s = claims.reading_spread(claims.reading_space_table(runs, baselines=("lpm", "spf"))).iloc[0]
    assert s["best reading"] == "search=local+" and s["readings that win"] == 1 and s["readings"] == 3


def test_verdict_row_per_claim_counts_the_cells_where_topas_wins():
    op = pd.DataFrame([
        {"workload": "dag-4", "policy": "topas", "regime": "below", "mean vs best %": 5.0, "p99 vs best %": 20.0},
        {"workload": "dag-4", "policy": "topas", "regime": "below", "mean vs best %": 1.0, "p99 vs best %": 8.0},
        {"workload": "dag-4", "policy": "topas", "regime": "beyond", "mean vs best %": 60.0, "p99 vs best %": 90.0},
        {"workload": "dag-4", "policy": "topas-plus", "regime": "below", "mean vs best %": -4.0, "p99 vs best %": -6.0},
    ])
    rd = pd.DataFrame([
        {"workload": "dag-4", "fraction": 0.8, "regime": "below", "reading": "default", "mean vs best %": 5.0,
         "p99 vs best %": 20.0},
        {"workload": "dag-4", "fraction": 0.8, "regime": "below", "reading": "host_tier=topas-only",
         "mean vs best %": -45.0, "p99 vs best %": 3.0},
    ])
    v = claims.verdict_table(op, rd, paper_reported()).set_index("metric")
    assert set(v["workload"]) == {"dag-4"}
    assert v.loc["mean", "paper (reported)"] == "-39.8%"
    assert v.loc["mean", "TOPAS (paper reading), stable"] == "+1% .. +5%"
    assert v.loc["mean", "topas-plus, stable"] == "-4%"
    assert not any(c.startswith("best reading") for c in v.columns)  # dropped: picked after the fact
    assert v.loc["mean", "TOPAS wins where (readings x loads)"] == "1 of 2 cells: host_tier=topas-only @ 0.8x"
    assert v.loc["mean", "reaches the paper's size"] == "1 of 2 cells"
    assert v.loc["p99", "TOPAS wins where (readings x loads)"] == "nowhere (0 of 2 cells)"


def test_operating_grid_runs_every_policy_at_every_point():
    exps = grid.operating_grid(_points(), quick=True)
    assert {e.policy for e in exps} == set(grid.claim_policies(grid.CLAIM_POLICIES))
    assert sorted({e.load for e in exps}) == [0.75, 1.2, 1.8]
    assert {e.n_tasks for e in exps} == {grid.CLAIMS_QUICK.op_tasks}


def test_reading_grid_skips_the_search_axis_where_every_subset_is_scored():
    pts = _points(("chain-3", "metagpt-tl"), (0.8, 1.2))
    labels = {(e.workload, label) for label, e in grid.reading_grid(pts, quick=True)}
    assert ("metagpt-tl", "search=local+") in labels  # 11 agents > M = 6
    assert not any(w == "chain-3" and "search=" in l for w, l in labels)  # 3 agents: the default run
    assert ("chain-3", "host_tier=topas-only") in labels and ("chain-3", "parrot_grouping=False") in labels
    # the factorial crosses the host tier (none / TOPAS only), the search and J_admit's normalisation
    assert ("metagpt-tl", "search=local+,admit_norm=remaining,host_tier=topas-only") in labels
    tl = [e for label, e in grid.reading_grid(pts, quick=True) if e.workload == "metagpt-tl"]
    assert {e.n_tasks for e in tl} == {grid.CLAIMS_QUICK.reading_tasks_metagpt}


def test_ablation_grid_holds_both_ablation_sets_and_the_baselines_at_two_points():
    pairs = grid.ablation_grid(_points(), quick=False)
    labels = {label for label, _ in pairs}
    assert {"topas-base", "topas-plus: no residency tier", "lpm"} <= labels
    assert sorted({e.load for _, e in pairs}) == [1.2, 1.8]  # 0.8 of capacity and beyond
    quick = grid.ablation_grid(_points(), quick=True)
    assert {label for label, _ in quick} == labels
    assert sorted({e.load for _, e in quick}) == [1.2]  # quick: 0.8 of capacity only
    assert {e.params_dict.get("rank") for label, e in pairs if label == "topas-plus: FCFS inside tiers"} == {"fcfs"}


def test_pct_and_verdict_words():
    assert claims.pct(90.0, 100.0) == pytest.approx(-10.0)
    assert math.isnan(claims.pct(float("nan"), 1.0))
    assert [claims.verdict_word(x) for x in (-5.0, 1.0, 5.0)] == ["wins", "ties", "loses"]
