"""The paper's numbers beside ours, ours the protocol's: paired intervals at the highest load
within both capacities, capacity for throughput, the ablation paired the same way."""

from __future__ import annotations

import functools
import math

import pandas as pd
import pytest

from studies import paper_compare as pc
from studies.protocol_runs import study as ps
from studies.analysis import paper_reported
from tests.test_protocol_curves import runs_frame


@functools.lru_cache(maxsize=None)
def _tables(workloads=("dag-4", "metagpt-tl", "metagpt-sop")):
    runs = pd.concat([runs_frame({"fcfs": 0.75, "lpm": 1.25, "spf": 1.0, "topas": 1.0, "topas-plus": 1.25}, workload=w)
                      for w in workloads], ignore_index=True)
    return runs, ps.latency_rows(runs), ps.capacity_rows(runs)


@functools.lru_cache(maxsize=None)
def _ablation():
    # on MetaGPT-TL: TOPAS-base within capacity to 0.75 only, the single-component variants to 1.0
    abl = runs_frame({"topas": 1.0, "topas-base": 0.75, "topas-no-reuse": 1.0, "topas-no-aging": 1.0},
                     workload="metagpt-tl")
    abl.loc[abl.policy == "topas-no-aging", "jct_mean"] *= 1.5  # TOPAS well ahead of it
    return pc.ablation_latency(abl)


def test_every_reported_number_gets_a_row_with_the_paper_value_beside_ours():
    runs, lat, cap = _tables()
    t = pc.paper_vs_ours(lat, cap, _ablation(), overhead={"mean_ms": 1.0, "share_pct": 0.05},
                         overhead_setting="dag-10-wide at 1.4x")
    rep = paper_reported()
    assert len(t) == len(rep) and list(t.columns) == list(pc.COLUMNS)
    assert t["paper_value"].tolist() == pytest.approx(rep["value_pct"].tolist())


def test_latency_rows_are_the_paired_comparison_at_the_highest_load_within_both_capacities():
    runs, lat, cap = _tables()
    t = pc.paper_vs_ours(lat, cap)
    r = t[(t.workload == "dag-4") & (t.metric == "mean_jct")].iloc[0]
    want = lat[(lat.workload == "dag-4") & (lat.candidate == "topas") & lat.near_capacity].iloc[0]
    assert r["load"] == 1.0 and r["against"] == want["baseline"] == "lpm" and r["n_seeds"] == 3
    assert (r["ours_value"], r["ours_low"], r["ours_high"]) == pytest.approx(
        (want["jct_rel_pct"], want["jct_rel_low_pct"], want["jct_rel_high_pct"]))
    assert r["verdict"] == want["jct_verdict"] and r["ours"].endswith(f"vs lpm at 1x ({want['jct_verdict']})")
    p99 = t[(t.workload == "dag-4") & (t.metric == "p99_jct")].iloc[0]
    assert p99["ours_value"] == pytest.approx(want["p99_rel_pct"]) and p99["verdict"] == want["p99_verdict"]
    assert (t.loc[t.workload == "chain-3", "ours"] == "n/a (not run)").all()  # its trace exists, not run here


def test_throughput_is_read_as_capacity():
    _, lat, cap = _tables()
    r = pc.paper_vs_ours(lat, cap).query("metric == 'request_throughput'").iloc[0]
    assert r["ours_value"] == pytest.approx(100 * (1.0 / 1.25 - 1)) and r["verdict"] == "lower"
    assert r["against"] == "lpm" and r["ours"].startswith("capacity 1x vs lpm 1.25x")


def test_the_ablation_rows_pair_topas_with_each_variant_and_take_the_ends_of_the_single_component_range():
    runs, lat, cap = _tables()
    abl = _ablation()
    t = pc.paper_vs_ours(lat, cap, abl).set_index(["metric", "comparison"])
    base = t.loc[("mean_jct", "vs_topas_base")]
    assert base["against"] == "topas-base" and base["load"] == 0.75  # TOPAS-base's capacity bounds it
    lo, hi = t.loc[("mean_jct", "vs_single_component_min")], t.loc[("mean_jct", "vs_single_component_max")]
    assert lo["against"] == "topas-no-aging" and hi["against"] == "topas-no-reuse"
    assert lo["ours_value"] < hi["ours_value"] and lo["load"] == hi["load"] == 1.0
    # without ablation runs those rows say so
    bare = pc.paper_vs_ours(lat, cap)
    assert (bare.loc[bare.comparison.str.startswith("vs_single") | (bare.comparison == "vs_topas_base"), "ours"]
            == "n/a (not run)").all()


def test_no_load_within_both_capacities_is_said_not_hidden():
    runs = runs_frame({"lpm": 1.25, "topas": 0.5}, workload="dag-4")  # TOPAS fails at the lowest load
    t = pc.paper_vs_ours(ps.latency_rows(runs), ps.capacity_rows(runs))
    r = t[(t.workload == "dag-4") & (t.metric == "mean_jct")].iloc[0]
    assert r["ours"] == "n/a (not comparable)" and math.isnan(r["ours_value"])


def test_ablation_runs_need_topas_runs_on_the_workload():
    runs, _, _ = _tables(("dag-4",))
    with pytest.raises(ValueError, match="no TOPAS runs on metagpt-tl"):
        pc.ablation_runs(runs)
