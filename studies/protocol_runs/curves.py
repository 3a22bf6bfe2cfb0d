"""The protocol's runs against load: per policy and load, the seeds' mean with a 95% t interval,
and which claim a point may carry (notebooks 02 and 03; docs/protocol.md).

A point is a **latency** point when the policy is within its capacity there (every seed stable at
that load and every lower grid load, :mod:`topas.experiments.protocol.grid_capacity`); the first
grid load past a policy's capacity is its **overload** point (what its runs complete, never a
latency claim); the grid's stopping rule runs nothing higher. The candidates' paired comparisons
with the best baseline come from :func:`studies.protocol_runs.study.latency_rows`, never from
these per-policy means: two overlapping per-policy intervals do not make a tie, a paired
interval does.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd
from scipy import stats

from studies.protocol_runs.study import _within_capacity, sample_of

__all__ = ["CONFIDENCE", "CURVE_COLUMNS", "METRICS", "jct_table", "load_curves"]

CONFIDENCE = 0.95
#: The run summary columns a curve carries.
METRICS = ("jct_mean", "jct_p99", "throughput_rps")
CURVE_COLUMNS = ("workload", "sample", "policy", "load", "claim", "n_seeds", "n_tasks", "n_growing",
                 "completion_ratio") + tuple(f"{m}{s}" for m in METRICS for s in ("", "_low", "_high"))


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """Mean of ``values`` and its ``confidence`` t interval (``scipy.stats.t``); one value: NaN bounds."""
    v = np.asarray(values, dtype=float)
    mean = float(v.mean())
    if len(v) < 2:
        return mean, math.nan, math.nan
    sem = float(stats.sem(v))
    if sem == 0.0:
        return mean, mean, mean
    low, high = stats.t.interval(confidence, len(v) - 1, loc=mean, scale=sem)
    return mean, float(low), float(high)


def load_curves(runs: pd.DataFrame, confidence: float = CONFIDENCE) -> pd.DataFrame:
    """One row per (workload, policy, load) of the protocol's ``runs``
    (:func:`studies.protocol_runs.study.protocol_runs`): the seeds' mean of each of
    :data:`METRICS` with its t interval, how many seeds' runs grow, and ``claim``: ``latency``
    (within the policy's capacity) or ``overload`` (the first load past it)."""
    if runs.empty:
        raise ValueError("load_curves: no runs")
    caps = _within_capacity(runs)
    rows = []
    for (w, p, load), g in runs.groupby(["workload", "policy", "load"], sort=False):
        cap = caps[(w, p)]
        inside = not math.isnan(cap) and load <= cap + 1e-9
        row = {"workload": w, "sample": sample_of(w), "policy": p, "load": float(load),
               "claim": "latency" if inside else "overload", "n_seeds": int(g["seed"].nunique()),
               "n_tasks": int(g["n_tasks"].iloc[0]), "n_growing": int(g["growing"].sum()),
               "completion_ratio": float(g["completion_ratio"].mean())}
        for m in METRICS:
            row[m], row[f"{m}_low"], row[f"{m}_high"] = t_interval(g[m].to_numpy(dtype=float), confidence)
        rows.append(row)
    out = pd.DataFrame(rows, columns=list(CURVE_COLUMNS))
    # the stopping rule runs one load past capacity; a higher one (a policy's first pass) is not shown
    first_over = out[out["claim"] == "overload"].groupby(["workload", "policy"])["load"].transform("min")
    keep = (out["claim"] == "latency") | (out["load"] == first_over.reindex(out.index))
    return out[keep].sort_values(["workload", "policy", "load"], kind="stable").reset_index(drop=True)


def jct_table(curves: pd.DataFrame, latency: pd.DataFrame) -> pd.DataFrame:
    """:func:`load_curves` with, on each candidate's latency rows, its paired comparison with the
    best baseline at that load (``latency``: :func:`studies.protocol_runs.study.latency_rows`):
    the baseline, the mean-JCT difference in % with its 95% t interval and the verdict, the p99
    difference in % with its BCa interval and verdict."""
    cols = {"baseline": "vs baseline", "jct_rel_pct": "mean JCT vs baseline (%)",
            "jct_rel_low_pct": "low (%)", "jct_rel_high_pct": "high (%)", "jct_verdict": "mean JCT verdict",
            "p99_rel_pct": "p99 JCT vs baseline (%)", "p99_rel_low_pct": "p99 low (%)",
            "p99_rel_high_pct": "p99 high (%)", "p99_verdict": "p99 verdict"}
    lat = latency.rename(columns={"candidate": "policy"})[["workload", "policy", "load", *cols]]
    out = curves.merge(lat, on=["workload", "policy", "load"], how="left", validate="one_to_one")
    return out.rename(columns=cols)
