"""studies.analysis (the tables of notebooks 05-08) and the plot helpers that draw them."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import json

import numpy as np
import pandas as pd
import pytest

from topas import plots
from topas.engine.metrics import SimResult
from topas.experiments import Experiment
from studies import analysis, mechanism_plots, paper_compare


def _result(queue=(1.0, 2.0), policy="topas") -> SimResult:
    requests = pd.DataFrame({
        "task_id": ["t0", "t0", "t0", "t1", "t1", "t1"],
        "stage_id": ["A", "B", "C"] * 2,
        "ready": [0.0, 5.0, 5.0, 10.0, 15.0, 15.0],
        "queue_time": [queue[0], queue[1], queue[1], queue[0], queue[1], queue[1]],
    })
    timeline = pd.DataFrame({"time": [0.0, 10.0, 30.0], "prefix_tokens": [100, 300, 0],
                             "request_tokens": [50, 50, 0]})
    decisions = pd.DataFrame({"wall_s": [0.001, 0.002, 0.003, 0.004], "info_candidates": [1.0, 3.0, np.nan, 8.0]})
    summary = {"jct_mean": 10.0, "jct_p99": 20.0, "busy_time": 27.0, "makespan": 30.0, "avg_decode_batch": 4.0,
               "retractions": 1, "preemptions": 2, "prefix_loads_swap": 3, "prefix_loads_prefill": 4,
               "prefix_evictions": 5, "bytes_swapped": 2e9}
    empty = pd.DataFrame()
    return SimResult(summary=summary, tasks=empty, requests=requests, decisions=decisions,
                     prefix_events=empty, timeline=timeline)


def test_decision_overhead_by_hand():
    s = analysis.decision_overhead(_result().decisions, makespan=10.0)
    assert s["decisions"] == 4
    assert s["mean_ms"] == pytest.approx(2.5)
    assert s["p50_ms"] == pytest.approx(2.5)
    assert s["max_ms"] == pytest.approx(4.0)
    assert s["share_pct"] == pytest.approx(100 * 0.010 / 10.0)
    assert s["candidates_mean"] == pytest.approx(4.0)  # NaN dropped
    assert s["candidates_max"] == 8.0


def test_overhead_table_labels_the_paper():
    rep = analysis.paper_reported()
    t = analysis.overhead_table(analysis.decision_overhead(_result().decisions, 10.0), "here", rep)
    assert list(t["source"]) == ["this reproduction (simulator)", "paper (reported)"]
    assert t.loc[1, "mean (ms)"] == pytest.approx(1.9)
    assert t.loc[1, "share of serving time (%)"] == pytest.approx(0.31)


def test_prefix_share_and_mechanism_row_match_the_script():
    res = _result()
    # prefix tokens 100 for 10 s, 300 for 20 s over a budget of 1000
    assert analysis.prefix_share(res, 1000) == pytest.approx((100 * 10 + 300 * 20) / 30 / 1000)
    import importlib.util

    from topas.paths import REPO_ROOT

    spec = importlib.util.spec_from_file_location("mechanism_script", REPO_ROOT / "scripts" / "mechanism.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert analysis.mechanism_row("topas", res, 1000) == mod.mechanism_row("topas", res, 1000)


def test_mechanism_table_columns():
    t = analysis.mechanism_table({("dag-4", "lpm"): _result(), ("dag-4", "topas"): _result()}, 1000)
    row = analysis.mechanism_row("lpm", _result(), 1000)
    assert list(t.columns[:1]) == ["workload"]
    assert set(row) <= set(t.columns)
    assert t["GB swapped"].tolist() == [2.0, 2.0]
    assert list(t.columns[-3:]) == ["queue A", "queue B", "queue C"]


def test_stage_queueing_depths():
    q = analysis.stage_queueing({("dag-4", "lpm"): _result()})
    by = q.set_index("stage")
    assert by.loc["A", "depth"] == 0 and by.loc["B", "depth"] == 1 and by.loc["C", "depth"] == 1
    assert by.loc["B", "width"] == 2 and by.loc["A", "width"] == 1
    assert by.loc["B", "queue_s"] == pytest.approx(2.0)


def test_with_params_and_at_load():
    exps = [Experiment("dag-4", "topas", {"rho": 0.0}, load=1.0, n_tasks=5),
            Experiment("dag-4", "lpm", {}, load=1.3, n_tasks=5)]
    out = analysis.with_params(exps, {"rho": 1.0, "beta": 2.0})
    assert dict(out[0].params) == {"rho": 0.0, "beta": 2.0}  # the grid's axis wins
    assert dict(out[1].params) == {}
    same = analysis.at_load(exps + exps, 1.2)
    assert len(same) == 2 and {e.load for e in same} == {1.2}


def _summaries(rows):
    return pd.DataFrame(rows, columns=["workload", "policy", "seed", "params", "jct_mean", "jct_p99", "throughput_rps"])


def test_sensitivity_table_means_over_seeds():
    s = _summaries([
        ("dag-4", "topas", 0, '{"beta":0.0,"rho":1.0}', 10.0, 20.0, 1.0),
        ("dag-4", "topas", 1, '{"beta":0.0,"rho":1.0}', 12.0, 22.0, 1.0),
        ("dag-4", "topas", 0, '{"beta":1.0,"rho":1.0}', 8.0, 30.0, 1.0),
    ])
    t = analysis.sensitivity_table(s, ["beta", "rho"])
    assert len(t) == 2
    r = t[t.beta == 0.0].iloc[0]
    assert r["mean JCT (s)"] == pytest.approx(11.0) and r["p99 JCT (s)"] == pytest.approx(21.0) and r["seeds"] == 2


def test_change_vs_best_baseline():
    s = _summaries([
        ("dag-4", "lpm", 0, "{}", 100.0, 200.0, 1.0),
        ("dag-4", "parrot-fcfs", 0, "{}", 80.0, 250.0, 2.0),
        ("dag-4", "topas", 0, "{}", 60.0, 300.0, 1.5),
        ("dag-4", "topas-base", 0, "{}", 50.0, 300.0, 1.5),  # an ablation is never a baseline
    ])
    assert analysis.change_vs(s, "dag-4", "jct_mean") == (pytest.approx(-25.0), "parrot-fcfs")
    assert analysis.change_vs(s, "dag-4", "jct_p99") == (pytest.approx(50.0), "lpm")
    assert analysis.change_vs(s, "dag-4", "throughput_rps") == (pytest.approx(-25.0), "parrot-fcfs")
    v, best = analysis.change_vs(s, "chain-3", "jct_mean")
    assert np.isnan(v) and best is None


@pytest.mark.slow
def test_plots_are_readable(tmp_path):
    plots.use_style()
    res = _result()
    figs = [
        mechanism_plots.plot_decision_time(res.decisions, title="t"),
        mechanism_plots.plot_kv_occupancy({("dag-4", "lpm"): res.timeline, ("dag-4", "topas"): res.timeline}, 1000),
        mechanism_plots.plot_stage_queueing(analysis.stage_queueing({("dag-4", "lpm"): res, ("dag-4", "topas"): res})),
    ]
    s = _summaries([("dag-4", "topas", 0, f'{{"beta":{b},"rho":{r}}}', 10.0 + b + r, 20.0, 1.0)
                    for b in (0.0, 1.0) for r in (0.0, 0.5)])
    figs.append(mechanism_plots.plot_sensitivity(analysis.sensitivity_table(s, ["beta", "rho"]), x="beta", y="rho"))
    from tests.test_paper_compare import _tables
    _, lat, cap = _tables()
    figs.append(mechanism_plots.plot_paper_vs_ours(paper_compare.paper_vs_ours(lat, cap)))
    for k, fig in enumerate(figs):
        assert plots.text_overlaps(fig) == [], k
        assert all(ax.get_xlabel() for ax in fig.axes if ax.get_label() != "<colorbar>" and ax.has_data()), k
        assert k == 4 or any(ax.get_ylabel() for ax in fig.axes), k  # 4: rows named by tick labels
        plots.save_figure(fig, f"f{k}", tmp_path)
        assert (tmp_path / f"f{k}.png").stat().st_size > 0
    heat = figs[3]
    assert any(ax.get_ylabel() == "mean JCT (s)" for ax in heat.axes)  # the colour bar


def test_sensitivity_table_fills_parameters_left_at_their_defaults():
    # the default-valued grid point is stored under the key of a run that gave no parameters
    from studies.analysis import sensitivity_table
    from topas.policies import policy_class

    d = policy_class("topas").Params()
    summaries = pd.DataFrame([
        {"policy": "topas", "params": "{}", "seed": 0, "jct_mean": 10.0, "jct_p99": 20.0},
        {"policy": "topas", "params": json.dumps({"beta": 2.0, "rho": d.rho}), "seed": 0, "jct_mean": 12.0,
         "jct_p99": 24.0},
    ])
    t = sensitivity_table(summaries, ["beta", "rho"])
    assert set(zip(t["beta"], t["rho"])) == {(d.beta, d.rho), (2.0, d.rho)}


def test_engine_model_table_compares_topas_with_the_best_baseline_on_each_engine():
    rows = []
    for model, jct in (("legacy", {"topas": 130.0, "fcfs": 150.0, "lpm": 110.0}),
                       ("stock", {"topas": 90.0, "fcfs": 100.0, "lpm": 120.0})):
        for pol, v in jct.items():
            for seed in (0, 1):
                rows.append({"workload": "w", "engine": "sim", "engine_model": model, "policy": pol, "seed": seed,
                             "jct_mean": v, "jct_p99": 2 * v})
    s = pd.DataFrame(rows)
    t = analysis.engine_model_table(s, against=("fcfs", "lpm"))
    assert list(t["engine model"]) == ["stock", "legacy"]  # the reference first
    t = t.set_index("engine model")
    assert t.loc["stock", "best baseline"] == "fcfs" and t.loc["stock", "topas vs best: mean JCT %"] == pytest.approx(-10.0)
    # on the other model the best baseline changes; the fixed comparison keeps stock's best (fcfs)
    assert t.loc["legacy", "best baseline"] == "lpm"
    assert t.loc["legacy", "topas vs best: mean JCT %"] == pytest.approx(100 * (130 - 110) / 110)
    assert t.loc["legacy", "stock's best"] == "fcfs"
    assert t.loc["legacy", "topas vs stock's best: mean JCT %"] == pytest.approx(100 * (130 - 150) / 150)
    shift = analysis.engine_model_shift(s).set_index("policy")
    assert shift.loc["lpm", "mean JCT change %, legacy"] == pytest.approx(100 * (110 - 120) / 120)
