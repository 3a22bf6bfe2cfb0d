"""Notebook 13's tables (studies.cluster.tables) on hand-built summaries."""

from __future__ import annotations

import pandas as pd
import pytest

from topas.experiments import Experiment
from studies.cluster import tables as cluster_study
from studies.cluster import grid


def _summary(mean: float, stable: bool = True, **kw) -> dict:
    row = {"n_tasks": 20, "n_requests": 80, "jct_mean": mean, "jct_p99": 2 * mean, "throughput_rps": 1.0,
           "requests_per_engine_cv": 0.1, "prefix_copies_mean": 1.5, "prefix_copies_max": 2, "prefix_hits": 10,
           "prefix_loads_prefill": 3, "kv_util_mean": 0.5, "router_hold_mean": 0.0,
           "jct_last_first_quarter": 1.0 if stable else 3.0, "completion_ratio": 1.0, "sim_wall_s": 0.5}
    row.update(kw)
    return row


def _exp(router: str, policy: str, engines: int = 2, load: float = 0.8) -> Experiment:
    return Experiment("dag-4", policy, load=load * engines, n_tasks=10 * engines, engines=engines, router=router)


def test_cluster_table_reads_the_load_per_engine_and_stability():
    exps = [_exp("least-load", "fcfs", engines=4, load=0.5), _exp("kairos", "topas", engines=4, load=0.5)]
    t = cluster_study.cluster_table(pd.DataFrame([_summary(10.0), _summary(12.0, stable=False)]), exps)
    assert list(t["load / engine"]) == [0.5, 0.5]
    assert list(t["config"]) == ["least-load + fcfs", "kairos + topas"]
    assert list(t["stable"]) == [True, False]
    assert list(t["mean JCT"]) == [10.0, 12.0]


def test_cluster_table_refuses_a_single_engine_run_and_a_length_mismatch():
    with pytest.raises(ValueError, match="not a cluster experiment"):
        cluster_study.cluster_table(pd.DataFrame([_summary(1.0)]), [Experiment("dag-4", "fcfs", load=1.0)])
    with pytest.raises(ValueError, match="1 summaries for 2 experiments"):
        cluster_study.cluster_table(pd.DataFrame([_summary(1.0)]), [_exp("kairos", "fcfs")] * 2)


def test_the_best_config_is_the_fastest_stable_run_and_the_others_are_measured_from_it():
    exps = [_exp("least-load", "fcfs"), _exp("topas", "topas"), _exp("kairos", "lpm")]
    # kairos + lpm is fastest but unstable: the best stable run is least-load + fcfs
    t = cluster_study.cluster_table(pd.DataFrame([_summary(10.0), _summary(12.0), _summary(5.0, stable=False)]), exps)
    b = cluster_study.best_configs(t).iloc[0]
    assert b["best"] == "least-load + fcfs" and b["stable runs"] == 2
    assert b["runner-up"] == "topas + topas" and b["runner-up vs best %"] == pytest.approx(20.0)
    assert b["topas + topas vs best %"] == pytest.approx(20.0)
    assert b["best router, topas inside"] == "topas" and b["lpm inside vs best %"] == pytest.approx(-50.0)


def test_router_summary_counts_wins_over_every_point():
    exps = [_exp("least-load", "fcfs", load=0.5), _exp("topas", "topas", load=0.5),
            _exp("least-load", "fcfs", load=1.0), _exp("topas", "topas", load=1.0)]
    t = cluster_study.cluster_table(pd.DataFrame([_summary(10.0), _summary(11.0), _summary(30.0), _summary(15.0)]), exps)
    s = cluster_study.router_summary(t).set_index("router")
    assert s.loc["topas", "wins"] == 1 and s.loc["least-load", "wins"] == 1
    assert s.loc["least-load", "worst vs best %"] == pytest.approx(100.0)
    assert s.loc["topas", "worst vs best %"] == pytest.approx(10.0)


def test_scaling_table_gives_requests_simulated_per_second():
    exps = [_exp("least-load", "fcfs", engines=2), _exp("least-load", "fcfs", engines=4)]
    s = cluster_study.scaling_table(pd.DataFrame([_summary(1.0, sim_wall_s=2.0, n_requests=100),
                                                  _summary(1.0, sim_wall_s=5.0, n_requests=400)]), exps)
    assert list(s["requests / s simulated"]) == [50.0, 80.0]


def test_the_grids_cover_every_router_engine_count_and_load():
    from topas.cluster import available_routers

    sz = grid.cluster_size(False)
    exps = grid.cluster_grid(False)
    points = sum(len(ns) for _, ns in sz.workloads) * len(sz.loads)
    assert len(exps) == points * len(available_routers()) * len(sz.policies)
    assert {e.engines for e in exps if e.workload == "dag-4"} == {2, 4, 8}
    assert {e.router for e in exps} == set(available_routers())
    assert all(e.engine == "sim" and e.n_tasks == sz.tasks_per_engine * e.engines for e in exps)
    assert {round(e.load / e.engines, 6) for e in exps} == set(sz.loads)
    scaling = grid.cluster_scaling_grid(False)
    assert max(e.n_tasks for e in scaling) == 10_000 and max(e.engines for e in scaling) == 64
