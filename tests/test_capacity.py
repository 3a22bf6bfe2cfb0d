"""Capacity: the saturated-throughput window, the stable-load search, operating points, the
stability indicators and the ``topas capacity`` command (topas.experiments.capacity)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from topas.cli import main
from topas.experiments import Experiment
from topas.experiments.capacity import (
    capacity_table,
    completion_ratio,
    is_stable,
    operating_points,
    saturated_throughput,
    stability_ratio,
    stability_table,
    stable_capacities,
    stable_capacity,
)
from topas.experiments.store import ResultStore


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> ResultStore:
    return ResultStore(tmp_path_factory.mktemp("capacity-store"))


def test_saturated_throughput_counts_the_steady_window(store):
    est = saturated_throughput("dag-4", "fcfs", n_tasks=120, load_sat=4.0, store=store)
    tasks = store.load_table(Experiment("dag-4", "fcfs", load=4.0, n_tasks=120), "tasks")
    finish = np.sort(tasks["finish"].to_numpy())
    lo, hi = est.window
    # the window runs from the 25% to the 75% completion (warm-up and drain left out)
    assert lo == finish[int(0.25 * 119)] and hi == finish[int(math.ceil(0.75 * 119))]
    assert est.count_tasks_per_s == pytest.approx((int(math.ceil(0.75 * 119)) - int(0.25 * 119)) / (hi - lo))
    assert est.in_system_at_end > 0  # a queue is still there at the window's end
    assert est.x_nominal == pytest.approx(est.tasks_per_s / 0.15)  # dag-4's nominal rate
    assert 0 < est.x_nominal < 4.0  # saturated: below the offered load


def test_stable_capacity_brackets_a_stable_and_an_unstable_load(store):
    c = stable_capacity("chain-3", "fcfs", n_tasks=200, steps=3, store=store)
    assert 0 < c.lo < c.hi < math.inf
    # the bracket from the doubling search ([1, 2] or [0.5, 1], ...) is halved three times
    assert c.hi - c.lo == pytest.approx(c.hi / 2 ** 3 if c.hi <= 1 else (2 ** math.floor(math.log2(c.lo))) / 2 ** 3)
    stable = {round(l, 6): (r <= 1.5 and comp >= 0.9) for l, r, comp in c.probes}
    assert stable[round(c.lo, 6)] and not stable[round(c.hi, 6)]
    # every probe below the answer that ran was stable, every one above unstable (monotone)
    assert all(s for l, s in stable.items() if l <= c.lo) and not any(s for l, s in stable.items() if l >= c.hi)
    # well beyond the bracket the queue clearly grows; well inside it does not
    for load, want in ((0.6 * c.lo, True), (1.6 * c.hi, False)):
        e = Experiment("chain-3", "fcfs", load=round(load, 6), n_tasks=200)
        from topas.experiments import run_sweep

        run_sweep([e], store, jobs=1, progress=False)
        assert is_stable(store.load_table(e, "tasks")) is want, load


def test_capacity_table_names_the_best_baseline(store):
    t = capacity_table(["chain-3"], ["fcfs", "lpm"], n_tasks=120, steps=2, load_sat=None, store=store,
                       progress=False)
    assert list(t["policy"]) == ["fcfs", "lpm"]
    best = t.loc[t["capacity x nominal"].idxmax(), "policy"]
    assert set(t["best baseline"]) == {best}
    assert t.set_index("policy").loc[best, "fraction of best baseline"] == 1.0
    assert (t["fraction of best baseline"] <= 1.0).all()
    assert t["capacity tasks/s"].tolist() == pytest.approx((t["capacity x nominal"] * 0.2).tolist())  # chain-3: 0.2 tasks/s
    assert (t["unstable at"] > t["capacity x nominal"]).all()


def test_capacity_table_rejects_bad_names_before_running(store):
    with pytest.raises(Exception, match="unknown policy 'nope'"):
        capacity_table(["chain-3"], ["fcfs", "nope"], store=store, progress=False)
    with pytest.raises(Exception, match="unknown workload 'no-such'"):
        capacity_table(["no-such"], ["fcfs"], store=store, progress=False)


def test_operating_points_are_fractions_of_the_best_baselines_capacity():
    caps = pd.DataFrame({"workload": ["w", "w", "w"], "policy": ["fcfs", "lpm", "topas"],
                         "capacity x nominal": [1.0, 1.6, 3.0], "capacity tasks/s": [0.1, 0.16, 0.3]})
    pts = operating_points(caps, fractions=(0.5, 0.8), beyond=(1.2,))
    assert list(pts["load"]) == [0.8, 1.28, 1.92]  # of lpm's 1.6, not topas's 3.0
    assert list(pts["regime"]) == ["below", "below", "beyond"]
    assert set(pts["best baseline"]) == {"lpm"}
    assert pts["rate"].tolist() == pytest.approx([0.08, 0.128, 0.192])
    with pytest.raises(ValueError, match="no baseline"):
        operating_points(caps[caps.policy == "topas"])


def _tasks(arrival, jct):
    arrival = np.asarray(arrival, dtype=float)
    return pd.DataFrame({"arrival": arrival, "jct": jct, "finish": arrival + np.asarray(jct, dtype=float)})


def test_stability_indicators_tell_a_growing_queue_from_a_bounded_one():
    t = np.arange(100.0)
    bounded = _tasks(t, np.full(100, 5.0))
    growing = _tasks(t, 5.0 + 2.0 * t)  # each task waits longer than the last: overload
    assert stability_ratio(bounded) == pytest.approx(1.0) and completion_ratio(bounded) >= 0.9
    assert is_stable(bounded)
    assert stability_ratio(growing) > 1.5 and not is_stable(growing)
    # a policy that starves the oldest tasks fools the JCT ratio, not the completion ratio
    starving = _tasks(t, np.where(t % 2 == 0, 400.0 - t, 5.0))
    assert stability_ratio(starving) < 1.5
    assert completion_ratio(starving) < 0.9 and not is_stable(starving)


def test_stability_table_reads_any_stored_runs(store):
    exps = [Experiment("dag-4", "fcfs", load=l, n_tasks=100) for l in (0.5, 3.0)]
    from topas.experiments import run_sweep

    run_sweep(exps, store, jobs=1, progress=False)
    s = stability_table(exps, store)
    assert list(s["load"]) == [0.5, 3.0]
    assert list(s["stable"]) == [True, False]
    assert {"last/first quarter JCT", "completion ratio", "key", "jct_mean"} <= set(s.columns)


def test_cli_capacity_prints_the_table_and_names_bad_inputs(tmp_path):
    runner = CliRunner(mix_stderr=False) if "mix_stderr" in CliRunner.__init__.__code__.co_varnames else CliRunner()
    r = runner.invoke(main, ["capacity", "chain-3", "--policies", "fcfs", "--tasks", "60", "--steps", "1",
                             "--store", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "capacity x nominal" in r.output and "fcfs" in r.output and "60 tasks per run" in r.output
    r = runner.invoke(main, ["capacity", "chain-3", "--policies", "fcfs,bogus", "--store", str(tmp_path)])
    assert r.exit_code == 1 and "unknown policy 'bogus'" in r.stderr
    r = runner.invoke(main, ["capacity", "nope", "--store", str(tmp_path)])
    assert r.exit_code == 1 and "unknown workload 'nope'" in r.stderr


def test_capacity_over_seeds_is_the_smallest_by_default(store):
    per_seed = [stable_capacity("dag-4", "fcfs", n_tasks=120, seed=s, steps=2, store=store).lo for s in (0, 1)]
    kw = dict(n_tasks=120, seeds=(0, 1), steps=2, load_sat=None, store=store, progress=False)
    assert capacity_table(["dag-4"], ["fcfs"], **kw)["capacity x nominal"].item() == min(per_seed)
    assert capacity_table(["dag-4"], ["fcfs"], over_seeds="mean", **kw)["capacity x nominal"].item() == \
        pytest.approx(sum(per_seed) / 2)


def test_searches_in_lockstep_probe_the_same_loads_as_one_at_a_time(tmp_path):
    cases = [("chain-3", "fcfs", 0), ("dag-4", "lpm", 0)]
    together = stable_capacities(cases, n_tasks=60, steps=2, store=ResultStore(tmp_path / "a"), jobs=1)
    alone = [stable_capacity(w, p, n_tasks=60, seed=s, steps=2, store=ResultStore(tmp_path / "b"))
             for w, p, s in cases]
    assert [(c.lo, c.hi, c.probes) for c in together] == [(c.lo, c.hi, c.probes) for c in alone]
    assert all(len(c.probes) >= 3 for c in together)  # a bracket, then two bisection steps
