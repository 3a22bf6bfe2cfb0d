"""benchmarks/reproduction_cpu.py: each run's simulation time splits into its policy's decisions
(mean decision time x decisions) and the engine's rest, summed per policy, over the shipped pack."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("reproduction_cpu", BENCH / "reproduction_cpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def runs(*rows):
    cols = ("key", "policy", "n_tasks", "n_decisions", "sim_wall_s", "decision_wall_mean_ms")
    return pd.DataFrame([dict(zip(cols, r)) for r in rows], columns=list(cols))


def test_a_run_is_its_decisions_plus_the_engines_rest(bench):
    t = bench.attribute(runs(("k1", "fcfs", 10, 100, 6.0, 10.0),  # decisions 100 x 10 ms = 1 s
                             ("k2", "topas", 10, 200, 30.0, 60.0),  # 200 x 60 ms = 12 s
                             ("k3", "topas", 10, 100, 30.0, 60.0)))  # 6 s
    assert list(t.index) == ["topas", "fcfs", "all"]  # the largest first, the total last
    assert t.loc["topas", "sim_min"] == pytest.approx(1.0) and t.loc["topas", "decide_min"] == pytest.approx(0.3)
    assert t.loc["topas", "engine_min"] == pytest.approx(0.7)
    assert t.loc["fcfs", "decide_min"] == pytest.approx(1 / 60) and t.loc["fcfs", "engine_min"] == pytest.approx(5 / 60)
    assert t.loc["all", "sim_min"] == pytest.approx(66 / 60) and t.loc["all", "runs"] == 3
    assert t.loc["topas", "share"] == pytest.approx(60 / 66) and t.loc["all", "share"] == pytest.approx(1.0)
    assert t.loc["topas", "decide_share"] == pytest.approx(0.3)
    assert t.loc["topas", "us_per_point"] == pytest.approx(60 / 300 * 1e6)
    assert t.loc["topas", "decide_us_per_point"] == pytest.approx(18 / 300 * 1e6)
    assert tuple(t.columns) == bench.COLUMNS


def test_a_run_without_decisions_is_all_engine(bench):
    t = bench.attribute(runs(("k1", "fcfs", 5, 0, 2.0, float("nan"))))
    assert t.loc["fcfs", "decide_min"] == 0 and t.loc["fcfs", "engine_min"] == pytest.approx(2 / 60)
    assert pd.isna(t.loc["fcfs", "us_per_point"])  # no scheduling point to divide by


def test_bad_summaries_are_refused_naming_what_is_wrong(bench):
    with pytest.raises(ValueError, match="sim_wall_s"):
        bench.attribute(runs(("k1", "fcfs", 5, 3, 2.0, 1.0)).drop(columns="sim_wall_s"))
    with pytest.raises(ValueError, match="run k9 has no simulation time"):
        bench.attribute(runs(("k1", "fcfs", 5, 3, 2.0, 1.0), ("k9", "lpm", 5, 3, float("nan"), 1.0)))
    with pytest.raises(ValueError, match="no runs"):
        bench.attribute(runs())
    with pytest.raises(ValueError, match="workload"):
        bench.attribute(runs(("k1", "fcfs", 5, 3, 2.0, 1.0)), by="workload")


def test_the_shipped_pack_is_attributed_whole(bench, capsys):
    pack = bench.PACK
    manifest = json.loads((pack / "manifest.json").read_text())
    assert bench.main([]) == 0
    out = capsys.readouterr().out
    assert f"the simulations of {manifest['n_experiments']} runs" in out
    assert out.splitlines()[-1].startswith("engine ")


def stamped(*rows):
    """Runs as (key, seconds from a common origin at which the result was stamped, simulation seconds)."""
    t0 = pd.Timestamp("2026-01-01T00:00:00+00:00")
    return pd.DataFrame([{"key": k, "created": (t0 + pd.Timedelta(seconds=end)).isoformat(), "sim_wall_s": float(wall)}
                         for k, end, wall in rows], columns=["key", "created", "sim_wall_s"])


def test_the_timeline_splits_the_span_by_how_many_simulations_ran_at_once(bench):
    # k1 runs 0-10 s, k2 5-15 s (together 5-10), nothing 15-45, k3 45-60
    minutes, gaps = bench.concurrency(stamped(("k1", 10, 10), ("k2", 15, 10), ("k3", 60, 15)))
    assert list(minutes.index) == [0, 1, 2]
    assert minutes.to_list() == pytest.approx([30 / 60, 25 / 60, 5 / 60])
    assert minutes.sum() == pytest.approx(1.0)  # the span: the first start to the last end
    assert len(gaps) == 1
    g = gaps.iloc[0]
    assert g["start_min"] == pytest.approx(15 / 60) and g["seconds"] == pytest.approx(30)
    assert g["after"] == "k2" and g["before"] == "k3"  # the run that ended, the one that started


def test_a_run_that_starts_as_another_ends_leaves_no_gap(bench):
    minutes, gaps = bench.concurrency(stamped(("k1", 10, 10), ("k2", 20, 10)))
    assert minutes.to_list() == pytest.approx([0.0, 20 / 60])
    assert gaps.empty


def test_the_timeline_refuses_runs_it_cannot_place(bench):
    with pytest.raises(ValueError, match="created"):
        bench.concurrency(stamped(("k1", 10, 10)).drop(columns="created"))
    bad = stamped(("k1", 10, 10), ("k7", 20, 10))
    bad.loc[1, "created"] = "not a time"
    with pytest.raises(ValueError, match="run k7 has no creation stamp"):
        bench.concurrency(bad)
    with pytest.raises(ValueError, match="no runs"):
        bench.concurrency(stamped())


def test_the_shipped_packs_timeline_covers_its_simulation_time(bench, capsys):
    assert bench.main(["--timeline"]) == 0
    out = capsys.readouterr().out
    assert "0 at once:" in out and "1 at once:" in out
    gap = out.split("run that started after):\n", 1)[1].splitlines()[0]
    assert "/" in gap and "@" in gap and "->" in gap  # the runs on either side by their labels (Experiment.label)
    line = next(x for x in out.splitlines() if x.startswith("simulation time "))
    busy = float(line.split()[2])
    assert busy == pytest.approx(bench.attribute(bench.read_pack()).loc["all", "sim_min"], abs=0.05)
