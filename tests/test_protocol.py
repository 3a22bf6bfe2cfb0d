"""The experimental protocol (docs/protocol.md), function by function, against cases computed by
hand: MSER-5, the steady-state test, capacity from a non-monotone grid (the LPM DAG-4 case), paired
intervals and verdicts, the refusal to compare unstable policies, the seed ranges."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from topas.experiments.protocol import (
    EVALUATION_SEEDS,
    HELD_OUT_WORKFLOW_SEEDS,
    TUNING_SEEDS,
    UnstableComparison,
    check_disjoint,
    compare_latency,
    grid_capacity,
    growth_test,
    mser5,
    paired_bootstrap,
    paired_t,
    require_stable,
    seed_capacity,
    steady_state,
    verdict,
)
from topas.experiments.protocol.seeds import first
from topas.experiments.protocol.steady import (arrivals_in_order, in_system_at_arrivals, indicator_series,
                                               jct_by_arrival, run_series)
from topas.experiments.protocol.warmup import mser

# ----------------------------------------------------------------------------- seeds


def test_tuning_evaluation_and_held_out_seeds_are_disjoint():
    assert not set(TUNING_SEEDS) & set(EVALUATION_SEEDS)
    assert not set(TUNING_SEEDS) & set(HELD_OUT_WORKFLOW_SEEDS)
    assert not set(EVALUATION_SEEDS) & set(HELD_OUT_WORKFLOW_SEEDS)
    check_disjoint()


def test_overlapping_ranges_are_named():
    with pytest.raises(ValueError, match="'tuning' and 'evaluation' overlap: both hold seed 5"):
        check_disjoint({"tuning": range(5, 10), "evaluation": range(0, 6)})


def test_a_study_takes_the_first_seeds_of_its_range():
    assert first(TUNING_SEEDS, 2) == [100, 101]
    with pytest.raises(ValueError, match="11 seeds asked for"):
        first(EVALUATION_SEEDS, 11)


def test_selection_scripts_read_the_tuning_seeds():
    import importlib.util

    from topas.paths import REPO_ROOT

    for name in ("select_topas_plus", "sweep_topas_defaults"):
        spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "scripts" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        assert mod.SEEDS is TUNING_SEEDS, name
        if name == "select_topas_plus":
            base, cands = mod.experiments(8, 2, [1.2])
            assert {e.seed for e in base} | {e.seed for _, e in cands} == {100, 101}
            base, _ = mod.experiments(8, 2, [1.2], workloads=mod.HELD_OUT, seed_range=mod.CONFIRM_SEEDS)
            assert {e.seed for e in base} == {0, 1}  # --confirm evaluates: evaluation seeds


# ----------------------------------------------------------------------------- MSER-5


def test_mser5_drops_the_low_start_hand_computed():
    # batch means Z = 10, 4, 2, 3 (m = 4; candidates d = 0, 1)
    # d = 0: mean 4.75, squares 27.5625 + 0.5625 + 7.5625 + 3.0625 = 38.75, / 4^2 = 2.421875
    # d = 1: mean 3, squares 1 + 1 + 0 = 2, / 3^2 = 0.2222...  -> d* = 1, five observations dropped
    y = [8, 12, 10, 9, 11] + [4] * 5 + [1, 3, 2, 2, 2] + [3] * 5 + [99, 99]  # the last 2 are in no batch
    w = mser5(y)
    assert (w.n, w.batches, w.batches_removed, w.removed) == (22, 4, 1, 5)
    assert w.statistic == pytest.approx((2.421875, 2 / 9))


def test_mser5_keeps_a_series_without_warm_up():
    # Z = 1, 3, 1, 3, 1, 3: d = 0: 6 / 36 = 0.1667; d = 1: (5 * 0.64 ... ) -> hand: mean 2.2,
    # squares 0.64 + 1.44 + 0.64 + 1.44 + 0.64 = 4.8, / 25 = 0.192; d = 2: mean 2, 4 / 16 = 0.25
    y = np.repeat([1.0, 3, 1, 3, 1, 3], 5)
    w = mser5(y)
    assert w.batches_removed == 0 and w.removed == 0
    assert w.statistic == pytest.approx((1 / 6, 0.192, 0.25))


def test_mser_ties_take_the_smallest_truncation_and_bad_input_is_named():
    assert mser5([1.0] * 20).batches_removed == 0
    assert mser([5.0, 1, 1, 1], batch=1).removed == 1
    with pytest.raises(ValueError, match="at least 2 are needed"):
        mser5([1.0] * 9)
    with pytest.raises(ValueError, match="observation 2 is not finite"):
        mser5([1.0, 2, float("nan")] + [1.0] * 10)


# ----------------------------------------------------------------------------- steady state


def tasks_table(arrival, jct) -> pd.DataFrame:
    arrival, jct = np.asarray(arrival, float), np.asarray(jct, float)
    return pd.DataFrame({"arrival": arrival, "finish": arrival + jct, "jct": jct})


def test_in_system_counts_the_earlier_tasks_not_yet_finished():
    # arrivals 0, 1, 2, 3; finishes 5, 1.5, 2.5, 10: at t=1 task 0 is in; at 2 task 0 (1 left at
    # 1.5); at 3 task 0 (2 left at 2.5)
    t = tasks_table([0, 1, 2, 3], [5, 0.5, 0.5, 7])
    assert in_system_at_arrivals(t).tolist() == [0, 1, 1, 1]
    assert jct_by_arrival(t.iloc[::-1]).tolist() == [5, 0.5, 0.5, 7]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(1, 8)), min_size=1, max_size=30))
def test_a_run_is_read_in_arrival_order_ties_in_table_order(rows):
    """run_series (read and checked once per run) is the table sorted by arrival, stably; each
    arriving task finds the earlier tasks (in that order) not finished by its arrival (every task
    takes time: a JCT > 0)."""
    jct = [j / 4 + k * 1e-3 for k, (_, j) in enumerate(rows)]  # tied arrivals told apart by their JCT
    t = tasks_table([a / 2 for a, _ in rows], jct)
    run = run_series(t)
    ordered = t.sort_values("arrival", kind="stable")
    assert run.jct.tolist() == ordered["jct"].tolist() == jct_by_arrival(t).tolist()
    assert run.arrivals.tolist() == ordered["arrival"].tolist() == arrivals_in_order(t).tolist()
    arr, fin = ordered["arrival"].tolist(), ordered["finish"].tolist()
    assert run.in_system().tolist() == [sum(1 for j in range(k) if fin[j] > arr[k]) for k in range(len(arr))]
    assert indicator_series(t, "in_system").tolist() == run.in_system().tolist()


def test_a_run_without_every_finish_or_column_is_refused_by_name():
    t = tasks_table([0, 1, 2], [1, 1, 1])
    t.loc[1, ["finish", "jct"]] = np.nan
    with pytest.raises(ValueError, match="run 7: 1 task\\(s\\) have no finish time"):
        run_series(t, "run 7")
    with pytest.raises(ValueError, match="r: the tasks table has no column\\(s\\) jct"):
        run_series(t.drop(columns="jct"), "r")
    with pytest.raises(ValueError, match="x: unknown indicator 'queue'"):
        indicator_series(t, "queue", "x")


def test_a_growing_series_grows_and_a_stationary_one_does_not():
    rng = np.random.default_rng(0)
    flat = rng.exponential(10.0, 500)
    assert not growth_test(flat, level=0.05).growing
    ramp = flat + 0.1 * np.arange(500)
    g = growth_test(ramp, level=0.05)
    assert g.growing and g.p_value < 1e-4 and g.slope == pytest.approx(0.1, rel=0.2)
    const = growth_test([3.0] * 100)
    assert (const.slope, const.p_value, const.growing) == (0.0, 1.0, False)


def test_growth_explained_by_the_realized_arrival_rate_is_not_growth():
    """A stable queue whose arrival sample speeds up towards its end: its load, and so the tasks
    in the system, trend with the rate. Adjusted for each batch's rate the trend is gone; a queue
    that grows beyond what its arrivals explain still grows."""
    rng = np.random.default_rng(3)
    n = 1000
    rate = np.linspace(0.8, 1.2, n)                       # the sample's arrivals speed up by 50%
    arrivals = np.cumsum(rng.exponential(1.0 / rate))
    # an infinite-server queue, stable at any rate: each task stays 5 s, so an arriving task finds
    # the tasks that arrived in the 5 s before it
    in_system = (np.arange(n) - np.searchsorted(arrivals, arrivals - 5.0)).astype(float)
    assert growth_test(in_system, level=0.005).growing    # the plain slope test calls it growing
    adjusted = growth_test(in_system, level=0.005, arrivals=arrivals)
    assert not adjusted.growing and adjusted.p_value > 0.005
    growing = in_system + 0.01 * np.arange(n)             # plus a queue that builds up
    g = growth_test(growing, level=0.005, arrivals=arrivals)
    assert g.growing and g.slope == pytest.approx(0.01, rel=0.3)


def test_rate_adjusted_p_value_is_the_position_coefficient_of_an_ols_fit():
    rng = np.random.default_rng(5)
    arrivals = np.cumsum(rng.exponential(1.0, 200))
    y = rng.normal(10.0, 1.0, 200) + 0.004 * np.arange(200)
    g = growth_test(y, n_batches=8, arrivals=arrivals)
    kept, arr = y[g.warmup:], arrivals[g.warmup:]
    parts = np.array_split(np.arange(len(kept)), 8)
    x = np.column_stack([np.ones(8), [p.mean() + g.warmup for p in parts],
                         [(len(p) - 1) / (arr[p[-1]] - arr[p[0]]) for p in parts]])
    means = np.array([kept[p].mean() for p in parts])
    beta, res, *_ = np.linalg.lstsq(x, means, rcond=None)
    se = np.sqrt(res[0] / 5 * np.linalg.inv(x.T @ x)[1, 1])
    assert (g.slope, g.p_value) == pytest.approx((beta[1], stats.t.sf(beta[1] / se, 5)))


def test_deterministic_arrivals_leave_the_plain_slope_test():
    y = np.array([float((k * 7) % 11) for k in range(100)]) + 0.05 * np.arange(100)
    plain = growth_test(y, n_batches=5)
    same_rates = growth_test(y, n_batches=5, arrivals=np.arange(100.0))
    assert (same_rates.slope, same_rates.p_value) == pytest.approx((plain.slope, plain.p_value))
    with pytest.raises(ValueError, match="arrival times for"):
        growth_test(y, arrivals=np.arange(99.0))


def test_growth_test_p_value_is_linregress_on_the_batch_means():
    y = np.array([float((k * 7) % 11) for k in range(100)]) + 0.05 * np.arange(100)
    g = growth_test(y, n_batches=5)
    kept = y[g.warmup:]
    parts = np.array_split(np.arange(len(kept)), 5)
    fit = stats.linregress([p.mean() + g.warmup for p in parts], [kept[p].mean() for p in parts],
                           alternative="greater")
    assert (g.slope, g.p_value) == pytest.approx((fit.slope, fit.pvalue))


def test_steady_state_over_seeds_bonferroni_and_the_seed_rule():
    rng = np.random.default_rng(1)
    arrival = np.arange(400, dtype=float)
    stable = {s: tasks_table(arrival, 5 + rng.exponential(1.0, 400)) for s in range(3)}
    st = steady_state(stable)
    assert st.stable and st.n_growing == 0
    assert st.level == pytest.approx(0.05 / 6)  # 3 seeds x 2 indicators
    assert list(st.evidence.columns) == ["seed", "indicator", "n", "warmup", "slope", "p_value", "growth", "growing"]
    assert len(st.evidence) == 6
    # one seed collapses: JCT grows by 1 s per task, so tasks pile up
    collapsed = {**stable, 2: tasks_table(arrival, 5 + 1.0 * arrival)}
    st = steady_state(collapsed)
    assert not st.stable and st.growing_seeds == (2,)
    assert steady_state(collapsed, min_fraction=2 / 3).stable  # a stated fraction of the seeds


def test_steady_state_needs_finished_runs():
    t = tasks_table(np.arange(50.0), np.ones(50))
    t.loc[3, ["finish", "jct"]] = np.nan
    with pytest.raises(ValueError, match="seed 0, jct: 1 task"):
        steady_state({0: t})


# ----------------------------------------------------------------------------- capacity


LPM_DAG4_1000 = {1.2: True, 1.3: False, 1.4: False, 1.5: False, 1.54: True, 1.6: False}
LPM_DAG4_600 = {1.2: True, 1.3: False, 1.4: True, 1.5: True, 1.54: True, 1.6: True}


def test_capacity_of_the_non_monotone_lpm_dag4_case_is_below_the_first_unstable_load():
    cap = grid_capacity({(load, 0): ok for load, ok in LPM_DAG4_1000.items()})
    assert cap.capacity == 1.2  # not 1.54: LPM is unstable at 1.3
    assert (cap.lower, cap.upper) == (1.2, 1.3)
    assert seed_capacity(LPM_DAG4_600) == 1.2


def test_capacity_over_seeds_all_or_a_stated_fraction():
    grid = {0: {1.0: True, 1.1: True, 1.2: True, 1.3: False},
            1: {1.0: True, 1.1: True, 1.2: False, 1.3: True},
            2: {1.0: True, 1.1: True, 1.2: True, 1.3: True}}
    v = {(l, s): ok for s, g in grid.items() for l, ok in g.items()}
    cap = grid_capacity(v)
    assert (cap.capacity, cap.lower, cap.upper) == (1.1, 1.1, 1.2)
    assert (cap.seed_low, cap.seed_high, cap.n_seeds) == (1.1, 1.3, 3)
    assert dict(cap.seed_capacities) == {0: 1.2, 1: 1.1, 2: 1.3}
    assert grid_capacity(v, min_fraction=2 / 3).capacity == 1.2
    top = grid_capacity({(l, 0): True for l in (1.0, 1.5)})
    assert (top.capacity, top.upper) == (1.5, math.inf)
    below = grid_capacity({(1.0, 0): False, (1.5, 0): True})
    assert math.isnan(below.capacity) and (below.lower, below.upper) == (0.0, 1.0)


def test_capacity_needs_every_seed_at_every_load():
    with pytest.raises(ValueError, match="no verdict for load 1.3, seed 1"):
        grid_capacity({(1.2, 0): True, (1.3, 0): True, (1.2, 1): True})
    frame = pd.DataFrame({"load": [1.2, 1.2], "seed": [0, 0], "stable": [True, False]})
    with pytest.raises(ValueError, match="two verdicts for load 1.2, seed 0"):
        grid_capacity(frame)


# ----------------------------------------------------------------------------- paired comparisons


def test_paired_t_interval_hand_computed():
    # differences 1, 2, 3: mean 2, sd 1, sem 1/sqrt(3); t(0.975, 2) = 4.302653 -> 2 +- 2.484138
    base = {0: 10.0, 1: 20.0, 2: 30.0}
    pol = {0: 11.0, 1: 22.0, 2: 33.0}
    c = paired_t(pol, base, policy="topas", baseline="lpm")
    assert c.difference == pytest.approx(2.0)
    assert (c.low, c.high) == pytest.approx((2 - 2.484138, 2 + 2.484138), abs=1e-6)
    assert c.relative == pytest.approx(0.1) and c.relative_low == c.relative_high == pytest.approx(0.1)
    assert c.verdict == "tie" and c.n == 3 and c.method == "t"
    better = paired_t({0: 9.0, 1: 18.5, 2: 28.0}, base)  # differences -1, -1.5, -2
    assert better.high < 0 and better.verdict == "win"


def test_verdict_only_when_the_interval_excludes_zero():
    assert verdict(-3.0, -0.1) == "win"
    assert verdict(0.1, 3.0) == "loss"
    assert verdict(-1.0, 1.0) == "tie"
    assert verdict(-3.0, -0.1, lower_is_better=False) == "loss"


def test_pairs_need_the_same_seeds():
    with pytest.raises(ValueError, match=r"topas only: \[2\]; lpm only: \[3\]"):
        paired_t({0: 1.0, 1: 2.0, 2: 3.0}, {0: 1.0, 1: 2.0, 3: 3.0}, policy="topas", baseline="lpm")
    with pytest.raises(ValueError, match="an interval needs >= 2"):
        paired_t({0: 1.0}, {0: 2.0})


def test_paired_bootstrap_is_scipy_bca_and_deterministic():
    rng = np.random.default_rng(3)
    base = {s: float(v) for s, v in enumerate(rng.lognormal(5, 1, 8))}
    pol = {s: v * 0.8 + float(rng.normal(0, 5)) for s, v in base.items()}
    a = paired_bootstrap(pol, base)
    b = paired_bootstrap(pol, base)
    assert a == b and a.method == "bootstrap-BCa"
    d = np.array([pol[s] - base[s] for s in sorted(base)])
    ref = stats.bootstrap((d,), np.mean, n_resamples=9999, method="BCa", rng=np.random.default_rng(0))
    assert (a.low, a.high) == pytest.approx((ref.confidence_interval.low, ref.confidence_interval.high))
    assert a.difference == pytest.approx(d.mean())


@pytest.mark.parametrize("n", [2, 5, 8, 13, 30])
def test_the_bootstrap_evaluates_all_resamples_at_once_with_the_same_interval_to_the_bit(n):
    rng = np.random.default_rng(n)
    base = {s: float(v) for s, v in enumerate(rng.lognormal(5, 1, n))}
    pol = {s: v * float(rng.uniform(0.5, 1.5)) for s, v in base.items()}
    c = paired_bootstrap(pol, base)
    for d, (low, high) in ((np.array([pol[s] - base[s] for s in sorted(base)]), (c.low, c.high)),
                           (np.array([pol[s] / base[s] - 1.0 for s in sorted(base)]), (c.relative_low, c.relative_high))):
        one_at_a_time = stats.bootstrap((d,), np.mean, n_resamples=9999, method="BCa", vectorized=False,
                                        rng=np.random.default_rng(0)).confidence_interval
        assert (low, high) == (float(one_at_a_time.low), float(one_at_a_time.high))


def test_latency_is_refused_where_a_compared_policy_is_not_stable():
    values = {"topas": {0: 1.0, 1: 2.0}, "lpm": {0: 1.5, 1: 2.5}}
    with pytest.raises(UnstableComparison, match=r"lpm is not stable on dag-4 at load 1\.3"):
        compare_latency(values, "topas", "lpm", {"topas": True, "lpm": False}, 1.3, "dag-4")
    with pytest.raises(UnstableComparison, match="no stability verdict for topas"):
        require_stable({"lpm": True}, ["topas", "lpm"], 1.2)
    c = compare_latency(values, "topas", "lpm", {"topas": True, "lpm": True}, 1.2, "dag-4")
    assert c.method == "t" and c.difference == pytest.approx(-0.5) and c.verdict == "win"
    assert compare_latency(values, "topas", "lpm", {"topas": True, "lpm": True}, 1.2,
                           metric="jct_p99").method == "bootstrap-BCa"


# ----------------------------------------------------------------------------- convergence study


def test_convergence_study_is_one_tidy_row_per_run_and_indicator(tmp_path):
    from topas.experiments import ResultStore
    from topas.experiments.protocol import convergence_study
    from topas.experiments.protocol.convergence import COLUMNS

    df = convergence_study(["fcfs"], "dag-4", [0.5, 3.0], [0, 1], [30, 40], store=ResultStore(tmp_path), jobs=1)
    assert list(df.columns) == list(COLUMNS)
    assert len(df) == 1 * 2 * 2 * 2 * 2
    assert sorted(df.n_tasks.unique()) == [30, 40] and set(df.indicator) == {"jct", "in_system"}
    light = df[df.load == 0.5]
    assert light.stable.all()  # half the nominal rate: no queue builds
    heavy = df[(df.load == 3.0) & (df.n_tasks == 40)]
    assert not heavy.stable.any() and (heavy.n_growing > 0).all()
    from topas.experiments.protocol.convergence import capacity_table

    caps = capacity_table(df)
    assert list(caps.n_tasks) == [30, 40]
    row = caps[caps.n_tasks == 40].iloc[0]
    assert (row.capacity, row.lower, row.upper, row.n_seeds) == (0.5, 0.5, 3.0, 2)
    with pytest.raises(ValueError, match="parameters given for lpm"):
        convergence_study(["fcfs"], "dag-4", [1.0], [0], [30], store=ResultStore(tmp_path), params={"lpm": {}})
