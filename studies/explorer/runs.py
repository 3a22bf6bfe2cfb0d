"""The weights explorer's runs (notebook 09): one small simulation per policy and setting, the mean
of each term of TOPAS's utility per decision, the change against the starting setting, which
weights change nothing at these settings, and loads above a policy's certified capacity.

The plotting is :mod:`studies.explorer.plots`; the sliders, :mod:`studies.explorer.ui`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from topas.paths import REPO_ROOT

#: The terms of TOPAS's plan score, as the decisions table's ``info_*`` columns carry them for
#: each chosen plan: Score = J_admit - J_move - J_redo - J_revoke + V_reuse (V_reuse includes beta).
TERMS = ("J_admit", "J_move", "J_redo", "J_revoke", "V_reuse")
#: The protocol's capacity table (notebook 16, ``make reproduce``).
CAPACITY_TABLE = REPO_ROOT / "figures" / "capacity_table.csv"


@dataclass(frozen=True)
class Run:
    """One explorer run: its task JCTs (s) and the mean of each utility term per decision (TOPAS only)."""

    jct: np.ndarray
    terms: Mapping[str, float]

    @property
    def mean(self) -> float:
        return float(self.jct.mean()) if len(self.jct) else math.nan

    @property
    def p99(self) -> float:
        return float(np.percentile(self.jct, 99)) if len(self.jct) else math.nan


def term_means(decisions: pd.DataFrame) -> dict[str, float]:
    """Each term's mean over the decisions (the chosen plans' ``info_<term>`` columns); empty
    where the policy records none."""
    return {t: float(decisions[f"info_{t}"].mean()) for t in TERMS if f"info_{t}" in decisions}


@functools.lru_cache(maxsize=256)
def _run(workload: str, policy: str, params: tuple, load: float, seed: int, n_tasks: int) -> Run:
    from topas.experiments import Experiment, run_experiment

    res = run_experiment(Experiment(workload, policy, dict(params), load=load, seed=seed, n_tasks=n_tasks))
    return Run(res.tasks["jct"].to_numpy(dtype=float), term_means(res.decisions))


def run(workload: str, policy: str, params: Mapping[str, float], load: float, seed: int, n_tasks: int) -> Run:
    """One run (cached: moving a slider back costs nothing)."""
    return _run(workload, policy, tuple(sorted(params.items())), float(load), int(seed), int(n_tasks))


def change_line(label: str, now: Run, start: Run) -> str:
    """``TOPAS: mean 41.2 s (-3.1 s, -7.0%), p99 120.3 s (+2.0 s, +1.7%) against the start``."""
    def signed(x: float) -> str:
        return f"{round(x, 1) + 0.0:+.1f}"  # + 0.0: no "-0.0"

    def part(name: str, a: float, b: float) -> str:
        rel = f", {signed(100 * (a - b) / b)}%" if b else ""
        return f"{name} {a:.1f} s ({signed(a - b)} s{rel})"

    return f"{label}: {part('mean', now.mean, start.mean)}, {part('p99', now.p99, start.p99)} against the start"


def inert_weights(reference: Run, probes: Mapping[str, Iterable[Run]]) -> list[str]:
    """The weights whose every probe run (the weight moved, the others at the start) has the
    reference's JCTs exactly: those the sliders cannot change at these settings."""
    return [w for w, runs in probes.items() if all(np.array_equal(r.jct, reference.jct) for r in runs)]


def inert_note(inert: list[str], probed: Mapping[str, tuple[float, float]], setting: str) -> str:
    """A sentence naming the weights that did nothing (``probed``: each weight's range tried)."""
    if not inert:
        return f"At {setting}, every weight changes the runs."
    ranges = "; ".join(f"{w} from {_fmt(probed[w][0])} to {_fmt(probed[w][1])}" for w in inert)
    return (f"At {setting}, these weights change nothing (runs identical to the start): {ranges}. "
            "Their sliders only redraw the same curve here.")


def capacity_warnings(workload: str, load: float, policies: Iterable[str], table: Path = CAPACITY_TABLE) -> list[str]:
    """One line per policy whose certified capacity on ``workload`` (the protocol's table) is below
    ``load``: its runs here are in overload and their JCT grows with the run's length."""
    if not Path(table).is_file():
        return []
    cap = pd.read_csv(table)
    out = []
    for policy in policies:
        row = cap[(cap["workload"] == workload) & (cap["policy"] == policy)]
        if row.empty:
            continue
        c = row["capacity"].iloc[0]
        if pd.isna(c):
            out.append(f"{policy}: no certified capacity on {workload} (unstable at the protocol's lowest load, "
                       f"{row['upper'].iloc[0]:g}x): load {load:g}x is overload")
        elif load > c:
            out.append(f"{policy}: load {load:g}x is above its certified capacity on {workload} ({c:g}x): overload")
    return out


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)
