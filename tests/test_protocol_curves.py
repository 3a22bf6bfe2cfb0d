"""The protocol's runs against load: the seeds' mean with its t interval, latency only within a
policy's capacity, its first load past capacity marked overload, nothing higher."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from studies.protocol_runs import study as ps
from studies.protocol_runs.curves import jct_table, load_curves, t_interval


def runs_frame(caps: dict[str, float], loads=(0.75, 1.0, 1.25, 1.5), seeds=(0, 1, 2), workload="dag-4",
               stop: bool = True) -> pd.DataFrame:
    """Evidence rows as the protocol's grid returns them: a policy's runs grow above its capacity
    (``caps``), JCT rising with load, the seeds a little apart; with ``stop`` the grid's stopping
    rule (nothing above the first failing load)."""
    rows = []
    for k, (p, cap) in enumerate(caps.items()):
        for load in loads:
            if stop and load > cap and any(l > cap for l in loads if l < load):
                continue
            for s in seeds:
                jct = 50.0 * load * (1 + 0.1 * k) + s
                rows.append({"workload": workload, "policy": p, "load": load, "seed": s, "n_tasks": 100,
                             "growing": load > cap, "completion_ratio": 1.0 if load <= cap else 0.8,
                             "jct_mean": jct, "jct_p99": 2 * jct + s, "throughput_rps": load})
    return pd.DataFrame(rows)


def test_t_interval_is_scipys():
    m, lo, hi = t_interval([1.0, 2.0, 4.0])
    want = stats.t.interval(0.95, 2, loc=np.mean([1, 2, 4]), scale=stats.sem([1, 2, 4]))
    assert m == pytest.approx(7 / 3) and (lo, hi) == pytest.approx(want)
    assert t_interval([3.0, 3.0]) == (3.0, 3.0, 3.0)
    m, lo, hi = t_interval([5.0])
    assert m == 5.0 and math.isnan(lo) and math.isnan(hi)


def test_latency_points_are_within_capacity_and_one_overload_point_follows():
    runs = runs_frame({"lpm": 1.25, "topas": 1.0}, stop=False)  # every load run, as a first pass would
    c = load_curves(runs)
    lpm = c[c.policy == "lpm"].set_index("load")["claim"].to_dict()
    assert lpm == {0.75: "latency", 1.0: "latency", 1.25: "latency", 1.5: "overload"}
    topas = c[c.policy == "topas"].set_index("load")["claim"].to_dict()
    assert topas == {0.75: "latency", 1.0: "latency", 1.25: "overload"}  # 1.5 is not shown
    row = c[(c.policy == "lpm") & (c.load == 1.0)].iloc[0]
    assert row["jct_mean"] == pytest.approx(51.0) and row["n_seeds"] == 3 and row["n_growing"] == 0
    assert (row["jct_mean_low"], row["jct_mean_high"]) == pytest.approx(t_interval([50.0, 51.0, 52.0])[1:])


def test_a_policy_unstable_below_a_stable_load_is_past_capacity_there():
    runs = runs_frame({"lpm": 1.5}, stop=False)
    runs.loc[(runs.load == 1.0) & (runs.seed == 1), "growing"] = True  # one seed fails at 1.0 only
    c = load_curves(runs).set_index("load")["claim"].to_dict()
    assert c == {0.75: "latency", 1.0: "overload"}


def test_the_table_carries_the_paired_verdicts_on_the_candidates_rows_only():
    runs = runs_frame({"lpm": 1.25, "fcfs": 0.75, "topas": 1.0})
    t = jct_table(load_curves(runs), ps.latency_rows(runs, candidates=("topas",), baselines=("fcfs", "lpm")))
    top = t[(t.policy == "topas") & (t.claim == "latency")]
    # LPM is the faster baseline within capacity; TOPAS's JCT is 1.2x LPM's on every seed (less the seed offset)
    assert list(top["load"]) == [0.75, 1.0] and set(top["vs baseline"]) == {"lpm"}
    assert top["mean JCT vs baseline (%)"].between(15, 20).all() and set(top["mean JCT verdict"]) == {"loss"}
    assert t.loc[t.policy != "topas", "vs baseline"].isna().all()
    assert t.loc[(t.policy == "topas") & (t.claim == "overload"), "vs baseline"].isna().all()


def test_no_runs_is_an_error():
    with pytest.raises(ValueError, match="no runs"):
        load_curves(runs_frame({"lpm": 1.0}).iloc[0:0])


def test_protocol_runs_refuses_a_workload_the_grid_does_not_run():
    with pytest.raises(ValueError, match="does not run dag-4-10k"):
        ps.protocol_runs(["dag-4-10k"])
