"""Capacity from a load grid, with an interval, without assuming that stability is monotone in load.

docs/protocol.md "Capacity". Stability is not monotone in load in finite runs (LPM on DAG-4,
1,000 tasks, seed 0: stable at 1.2x nominal, unstable at 1.3-1.5x, stable at 1.54x, unstable at
1.6x), so a bisection that never probes 1.3 reports a capacity where the policy's own run is
unstable. Here every grid load is run on every seed, and

* a seed's capacity (:func:`seed_capacity`) is the largest grid load ``L`` such that the seed's
  run is stable at ``L`` *and at every lower grid load* (``nan`` when it is unstable at the lowest);
* the capacity (:func:`grid_capacity`) is the largest grid load ``L`` that at least
  ``min_fraction`` of the seeds reach (seed capacity >= ``L``): with ``min_fraction = 1`` (the
  default) it is the smallest seed capacity, so every seed is stable at ``L`` and every lower load.

The interval, stated twice:

* ``lower``, ``upper``: the grid bracket. ``lower`` is the capacity (certified by the rule on this
  grid), ``upper`` the next grid load above it, the first load the rule rejects (``inf`` when the
  capacity is the top of the grid: not bracketed; ``lower = 0`` and ``upper`` the lowest grid load
  when even that one is rejected). A finer grid narrows it;
* ``seed_low``, ``seed_high``: the smallest and largest seed capacity, the spread of the answer a
  single-seed measurement would have given.

Per-(load, seed) verdicts come from the steady-state test
(:func:`topas.experiments.protocol.steady.steady_state`, one call per load over all seeds, so
each load's verdict has the family-wise level ``alpha``): :func:`capacity_from_runs` does both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import pandas as pd

from topas.experiments.protocol.steady import ALPHA, INDICATORS, MIN_FRACTION, N_BATCHES, steady_state

__all__ = ["GridCapacity", "capacity_from_runs", "grid_capacity", "seed_capacity", "verdict_frame"]

#: (load, seed) -> stable
Verdicts = Mapping[tuple[float, int], bool]


@dataclass(frozen=True)
class GridCapacity:
    """A capacity measured on a load grid (module docstring); loads in multiples of nominal."""

    #: the capacity (``nan`` when the lowest grid load is rejected)
    capacity: float
    #: the grid bracket [lower, upper)
    lower: float
    upper: float
    #: the spread of the seeds' own capacities
    seed_low: float
    seed_high: float
    n_seeds: int
    min_fraction: float
    loads: tuple[float, ...]
    #: seed -> its capacity
    seed_capacities: Mapping[int, float]


def verdict_frame(verdicts: Verdicts | pd.DataFrame, what: str = "grid") -> pd.DataFrame:
    """Verdicts as a frame with columns ``load``, ``seed``, ``stable``, one row per (load, seed),
    checked complete: every seed has a verdict at every load (else ``ValueError`` naming one)."""
    if isinstance(verdicts, pd.DataFrame):
        missing = [c for c in ("load", "seed", "stable") if c not in verdicts.columns]
        if missing:
            raise ValueError(f"{what}: the verdicts have no column(s) {', '.join(missing)}")
        df = verdicts[["load", "seed", "stable"]].copy()
    else:
        df = pd.DataFrame([{"load": l, "seed": s, "stable": v} for (l, s), v in verdicts.items()],
                          columns=["load", "seed", "stable"])
    if df.empty:
        raise ValueError(f"{what}: no verdicts")
    df["load"] = df["load"].astype(float)
    df["seed"] = df["seed"].astype(int)
    df["stable"] = df["stable"].astype(bool)
    dup = df[df.duplicated(["load", "seed"], keep=False)]
    if len(dup):
        r = dup.iloc[0]
        raise ValueError(f"{what}: two verdicts for load {r.load:g}, seed {r.seed}")
    loads, seeds = sorted(df["load"].unique()), sorted(df["seed"].unique())
    have = set(zip(df["load"], df["seed"]))
    for s in seeds:
        for l in loads:
            if (l, s) not in have:
                raise ValueError(f"{what}: no verdict for load {l:g}, seed {s} (every seed needs every grid load)")
    return df.sort_values(["seed", "load"], kind="stable").reset_index(drop=True)


def seed_capacity(stable_by_load: Mapping[float, bool]) -> float:
    """The largest load ``L`` of the grid with a stable run at ``L`` and at every lower load; ``nan``
    when the lowest load is unstable."""
    if not stable_by_load:
        raise ValueError("seed_capacity: no loads")
    cap = math.nan
    for load in sorted(stable_by_load):
        if not stable_by_load[load]:
            break
        cap = float(load)
    return cap


def grid_capacity(verdicts: Verdicts | pd.DataFrame, min_fraction: float = MIN_FRACTION,
                  what: str = "grid") -> GridCapacity:
    """The capacity and its interval from per-(load, seed) stability verdicts (module docstring)."""
    if not (0 < min_fraction <= 1):
        raise ValueError(f"{what}: min_fraction must be in (0, 1], got {min_fraction!r}")
    df = verdict_frame(verdicts, what)
    loads = tuple(sorted(float(l) for l in df["load"].unique()))
    caps = {int(s): seed_capacity(dict(zip(g["load"], g["stable"]))) for s, g in df.groupby("seed")}
    n = len(caps)
    capacity = math.nan
    for load in loads:
        reached = sum(1 for c in caps.values() if not math.isnan(c) and c >= load)
        if reached / n >= min_fraction:
            capacity = load
        else:
            break
    if math.isnan(capacity):
        lower, upper = 0.0, loads[0]
    else:
        above = [l for l in loads if l > capacity]
        lower, upper = capacity, (above[0] if above else math.inf)
    finite = [c for c in caps.values() if not math.isnan(c)]
    seed_low = math.nan if len(finite) < n else min(finite)
    seed_high = max(finite) if finite else math.nan
    return GridCapacity(capacity=capacity, lower=lower, upper=upper, seed_low=seed_low, seed_high=seed_high,
                        n_seeds=n, min_fraction=float(min_fraction), loads=loads, seed_capacities=caps)


def capacity_from_runs(tasks: Mapping[tuple[float, int], pd.DataFrame], alpha: float = ALPHA,
                       min_fraction: float = MIN_FRACTION, indicators: Sequence[str] = INDICATORS,
                       n_batches: int = N_BATCHES, what: str = "grid") -> tuple[GridCapacity, pd.DataFrame]:
    """Test every load of a grid of runs (``(load, seed) -> tasks table``) with
    :func:`~topas.experiments.protocol.steady.steady_state` over its seeds, then :func:`grid_capacity`.
    Returns the capacity and the evidence (the steady-state rows with ``load`` and ``stable``: the
    per-(load, seed) verdict, a seed's run being stable when none of its indicators grows)."""
    by_load: dict[float, dict[int, pd.DataFrame]] = {}
    for (load, seed), t in tasks.items():
        by_load.setdefault(float(load), {})[int(seed)] = t
    frames, verdicts = [], {}
    for load in sorted(by_load):
        st = steady_state(by_load[load], alpha, 1.0, indicators, n_batches, what=f"{what} at load {load:g}")
        ev = st.evidence.assign(load=load, level=st.level)
        ev["stable"] = ~ev["seed"].isin(st.growing_seeds)
        frames.append(ev)
        for seed in by_load[load]:
            verdicts[(load, seed)] = seed not in st.growing_seeds
    return grid_capacity(verdicts, min_fraction, what), pd.concat(frames, ignore_index=True)
