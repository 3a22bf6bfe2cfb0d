"""Steady state, tested: does a run's queue keep growing after its warm-up, over several seeds?

docs/protocol.md "Steady state". A load is beyond a policy's capacity when the work in the system
grows without bound; a run of ``n`` tasks shows that as a trend over arrival order. Two indicator
series are read from each run's tasks table, both in arrival order:

* ``jct``: each task's JCT (``finish - arrival``): grows when every task waits longer than the
  one before (FCFS-like policies);
* ``in_system``: the number of tasks in the system that each arriving task finds
  (:func:`in_system_at_arrivals`): grows under overload whichever tasks the policy starves (a
  policy that lets old tasks wait, such as LPM, keeps JCT by arrival flat while its queue grows).

**The per-run test** (:func:`growth_test`), on each series: remove the warm-up by MSER-5
(:func:`topas.experiments.protocol.warmup.mser5`); split what is kept into ``n_batches`` (10)
contiguous batches of (nearly) equal size and take their means (batch means tame the strong
serial correlation of queue observations); regress the batch means on the batches' mean
positions and on each batch's realized arrival rate (ordinary least squares) and test the
position's coefficient with the one-sided alternative ``slope > 0`` (t test, ``n_batches - 3``
degrees of freedom). The series *grows* when the p-value is below the test's level.

**Why the arrival rate is in the regression.** A finite sample of Poisson arrivals can trend: the
arrival seed 0 of every trace arrives faster towards its end (the batches' realized rates
correlate +0.81 with their position over 1,000 tasks), so the tasks in the system and their JCT
trend up at loads where every other seed is stable far beyond (Chain-3 under FCFS at 0.75x:
``in_system`` slope p = 0.003 unadjusted, 0.066 adjusted). With common random numbers that one
sample is shared by every policy and load, and the unadjusted test rejected 17 of the final runs'
45 (workload, policy) pairs at their lowest load, 0.75x, on seed 0 alone (every policy on Chain-3
and on Random DAG 1002). The adjusted coefficient is the growth the realized
arrivals do not explain; a real overload still shows (SPF on Chain-3 at 1x, seed 1: p = 2e-5).
Without arrival times (``arrivals=None``), or when the batches' rates are all equal
(deterministic arrivals), the plain slope test is used (``scipy.stats.linregress``, ``n_batches -
2`` degrees of freedom).

**Over seeds** (:func:`steady_state`): ``k = seeds x indicators`` tests, each at the level
``alpha / k`` (Bonferroni; ``alpha = 0.05``), so that a policy in steady state on every seed is
called unstable with probability at most ``alpha`` (given the batch-means test's assumptions). A
seed's run grows when any of its indicators does; the load is *stable* when at least
``min_fraction`` of the seeds (default 1.0: all of them) do not grow.

The test answers "is there evidence of growth?": a run too short to show a slow overload passes.
How the verdict moves with the run length is what the convergence study measures
(:mod:`topas.experiments.protocol.convergence`).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from topas.experiments.protocol.warmup import mser5

__all__ = [
    "ALPHA",
    "INDICATORS",
    "MIN_FRACTION",
    "N_BATCHES",
    "GrowthTest",
    "RunSeries",
    "SteadyState",
    "growth_test",
    "arrivals_in_order",
    "in_system_at_arrivals",
    "indicator_series",
    "jct_by_arrival",
    "run_series",
    "steady_state",
]

#: Family-wise level of the steady-state test at one load (all seeds and indicators together).
ALPHA = 0.05
#: Batches the post-warm-up series is split into for the slope test.
N_BATCHES = 10
#: Share of the seeds whose runs must not grow for a load to be stable (1.0: every seed).
MIN_FRACTION = 1.0
#: The indicator series read from a run.
INDICATORS = ("jct", "in_system")


@dataclass(frozen=True)
class GrowthTest:
    """The slope test of one series (see the module docstring)."""

    #: observations in the series, and how many MSER-5 removed as warm-up
    n: int
    warmup: int
    #: OLS slope of the batch means per observation (units of the series per task)
    slope: float
    #: one-sided p-value of ``slope > 0``
    p_value: float
    #: fitted change over the kept window relative to its mean: ``slope * span / mean``
    growth: float
    #: the level the p-value was compared with, and the answer
    level: float
    growing: bool


@dataclass(frozen=True, eq=False)
class RunSeries:
    """A run's tasks in arrival order (ties in table order), read and checked once
    (:func:`run_series`): their arrival and finish times and JCTs, and the indicators' series."""

    arrivals: np.ndarray
    finishes: np.ndarray
    jct: np.ndarray

    def in_system(self) -> np.ndarray:
        """For each task, the tasks in the system when it arrives: those that arrived before it
        (earlier in arrival order) and had not finished by its arrival time."""
        fin = np.sort(self.finishes)
        before = np.arange(len(self.arrivals))
        # a task arriving before task k finishes at or after its own arrival, so every finish time
        # <= arr[k] belongs to a task that arrived before k (or at the same instant, earlier in order)
        done = np.searchsorted(fin, self.arrivals, side="right")
        return (before - np.minimum(done, before)).astype(float)

    def indicator(self, indicator: str, what: str = "run") -> np.ndarray:
        """The series ``indicator`` (one of :data:`INDICATORS`)."""
        _check_indicator(indicator, what)
        return self.jct if indicator == "jct" else self.in_system()


def _check_indicator(indicator: str, what: str) -> None:
    if indicator not in INDICATORS:
        raise ValueError(f"{what}: unknown indicator {indicator!r} (known: {', '.join(INDICATORS)})")


def run_series(tasks: pd.DataFrame, what: str = "run") -> RunSeries:
    """A run's tasks table in arrival order (a stable sort: ties keep the table's order);
    ``ValueError`` naming ``what`` when a column is missing or a task has no finish time."""
    missing = [c for c in ("arrival", "finish", "jct") if c not in tasks.columns]
    if missing:
        raise ValueError(f"{what}: the tasks table has no column(s) {', '.join(missing)}")
    arr, fin, jct = (tasks[c].to_numpy(dtype=float, na_value=np.nan) for c in ("arrival", "finish", "jct"))
    if np.isnan(arr).any() or np.isnan(fin).any() or np.isnan(jct).any():
        n = int((np.isnan(fin) | np.isnan(jct)).sum())
        raise ValueError(f"{what}: {n} task(s) have no finish time; a run must finish every task to be tested")
    order = np.argsort(arr, kind="stable")
    return RunSeries(arr[order], fin[order], jct[order])


def jct_by_arrival(tasks: pd.DataFrame, what: str = "run") -> np.ndarray:
    """Each task's JCT, tasks in arrival order (ties in table order)."""
    return run_series(tasks, what).jct


def in_system_at_arrivals(tasks: pd.DataFrame, what: str = "run") -> np.ndarray:
    """For each task in arrival order, the tasks in the system when it arrives
    (:meth:`RunSeries.in_system`)."""
    return run_series(tasks, what).in_system()


def arrivals_in_order(tasks: pd.DataFrame, what: str = "run") -> np.ndarray:
    """The tasks' arrival times in arrival order (the order of :func:`indicator_series`)."""
    return run_series(tasks, what).arrivals


def _batch_rates(arrivals: np.ndarray, parts: Sequence[np.ndarray]) -> np.ndarray:
    """Each batch's realized arrival rate: (observations - 1) over its span of arrival times
    (``inf`` or ``nan`` for a batch whose arrivals coincide; :func:`_rate_adjusted_slope` then
    falls back)."""
    spans = np.array([arrivals[p[-1]] - arrivals[p[0]] for p in parts])
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.array([len(p) - 1 for p in parts]) / spans


def _rate_adjusted_slope(centres: np.ndarray, means: np.ndarray, rates: np.ndarray) -> tuple[float, float] | None:
    """OLS of the batch means on (1, position, arrival rate): the position's coefficient and its
    one-sided p-value for ``> 0`` (t, ``n - 3`` df); ``None`` when the design is singular."""
    x = np.column_stack([np.ones_like(centres), centres, rates])
    if not np.isfinite(x).all() or np.linalg.matrix_rank(x) < 3:
        return None
    xtx_inv = np.linalg.inv(x.T @ x)
    beta = xtx_inv @ x.T @ means
    df = len(means) - 3
    resid = means - x @ beta
    s2 = float(resid @ resid) / df
    if s2 == 0.0:
        return float(beta[1]), (0.0 if beta[1] > 0 else 1.0)
    t = float(beta[1]) / math.sqrt(s2 * xtx_inv[1, 1])
    return float(beta[1]), float(stats.t.sf(t, df))


def indicator_series(tasks: pd.DataFrame, indicator: str, what: str = "run") -> np.ndarray:
    """The series ``indicator`` (one of :data:`INDICATORS`) of a run's tasks table."""
    _check_indicator(indicator, what)  # before the table's checks
    return run_series(tasks, what).indicator(indicator, what)


def growth_test(series: Sequence[float] | np.ndarray, level: float = ALPHA, n_batches: int = N_BATCHES,
                what: str = "series", arrivals: Sequence[float] | np.ndarray | None = None) -> GrowthTest:
    """MSER-5 warm-up removal, then the one-sided slope test of the batch means, adjusted for each
    batch's realized arrival rate when ``arrivals`` (the observations' arrival times, same order)
    is given (module docstring). ``ValueError`` naming ``what`` when fewer than 2 observations per
    batch remain."""
    if not (0 < level < 1):
        raise ValueError(f"{what}: the test level must be in (0, 1), got {level!r}")
    if isinstance(n_batches, bool) or not isinstance(n_batches, numbers.Integral) or n_batches < 3:
        raise ValueError(f"{what}: n_batches must be an integer >= 3, got {n_batches!r}")
    y = np.asarray(series, dtype=float)
    if arrivals is not None:
        arrivals = np.asarray(arrivals, dtype=float)
        if arrivals.shape != y.shape:
            raise ValueError(f"{what}: {len(arrivals)} arrival times for {len(y)} observations")
        if n_batches < 4:
            raise ValueError(f"{what}: the rate-adjusted test needs n_batches >= 4, got {n_batches}")
    try:
        w = mser5(y)
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None
    kept = y[w.removed:]
    if len(kept) < 2 * n_batches:
        raise ValueError(f"{what}: {len(kept)} observations after the warm-up, fewer than 2 per batch "
                         f"for {n_batches} batches")
    pos = np.arange(w.removed, len(y), dtype=float)
    parts = np.array_split(np.arange(len(kept)), n_batches)
    means = np.array([kept[p].mean() for p in parts])
    centres = np.array([pos[p].mean() for p in parts])
    if np.ptp(means) == 0.0:  # a constant series: no trend (linregress's t is undefined)
        slope, p = 0.0, 1.0
    else:
        adjusted = (None if arrivals is None
                    else _rate_adjusted_slope(centres, means, _batch_rates(arrivals[w.removed:], parts)))
        if adjusted is not None:
            slope, p = adjusted
        else:
            fit = stats.linregress(centres, means, alternative="greater")
            slope, p = float(fit.slope), float(fit.pvalue)
    mean = float(kept.mean())
    span = float(centres[-1] - centres[0])
    growth = slope * span / mean if mean != 0 else (0.0 if slope == 0 else math.copysign(math.inf, slope))
    return GrowthTest(n=len(y), warmup=w.removed, slope=slope, p_value=p, growth=float(growth),
                      level=float(level), growing=bool(p < level))


@dataclass(frozen=True, eq=False)
class SteadyState:
    """The steady-state verdict at one (policy, workload, load) over seeds, with its evidence."""

    stable: bool
    #: family-wise level, and the level of each test (``alpha / (seeds x indicators)``)
    alpha: float
    level: float
    min_fraction: float
    n_seeds: int
    #: seeds whose run grows (any indicator)
    growing_seeds: tuple[int, ...]
    #: one row per (seed, indicator): seed, indicator, n, warmup, slope, p_value, growth, growing
    evidence: pd.DataFrame

    @property
    def n_growing(self) -> int:
        return len(self.growing_seeds)


def steady_state(tasks_by_seed: Mapping[int, pd.DataFrame], alpha: float = ALPHA,
                 min_fraction: float = MIN_FRACTION, indicators: Sequence[str] = INDICATORS,
                 n_batches: int = N_BATCHES, what: str = "runs") -> SteadyState:
    """Whether the runs of one (policy, workload, load), one tasks table per arrival seed, are in
    steady state (module docstring); ``what`` names them in errors."""
    if not tasks_by_seed:
        raise ValueError(f"{what}: no runs to test")
    if not (0 < alpha < 1):
        raise ValueError(f"{what}: alpha must be in (0, 1), got {alpha!r}")
    if not (0 < min_fraction <= 1):
        raise ValueError(f"{what}: min_fraction must be in (0, 1], got {min_fraction!r}")
    indicators = tuple(indicators)
    if not indicators:
        raise ValueError(f"{what}: no indicators to test")
    level = alpha / (len(tasks_by_seed) * len(indicators))
    rows, growing = [], []
    for seed in sorted(tasks_by_seed):
        grows = False
        run = None  # read and checked once per run, named by its first indicator
        for ind in indicators:
            name = f"{what}, seed {seed}, {ind}"
            _check_indicator(ind, name)  # before the table's checks
            run = run_series(tasks_by_seed[seed], name) if run is None else run
            g = growth_test(run.indicator(ind, name), level, n_batches, name, arrivals=run.arrivals)
            rows.append({"seed": seed, "indicator": ind, "n": g.n, "warmup": g.warmup, "slope": g.slope,
                         "p_value": g.p_value, "growth": g.growth, "growing": g.growing})
            grows = grows or g.growing
        if grows:
            growing.append(seed)
    n = len(tasks_by_seed)
    stable = (n - len(growing)) / n >= min_fraction
    return SteadyState(stable=bool(stable), alpha=float(alpha), level=float(level),
                       min_fraction=float(min_fraction), n_seeds=n, growing_seeds=tuple(growing),
                       evidence=pd.DataFrame(rows))
