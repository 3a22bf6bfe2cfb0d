"""How long a sweep of replays takes, before it starts.

A replay on a real SGLang server submits each task at its arrival time, so its wall time is at
least its arrivals' span (:func:`arrival_span`: last arrival - first arrival, after re-timing),
whatever the hardware. ``scripts/reproduce.py`` prints, per stage, the replays still to run and
the sum of their spans, and the wall time on the given number of servers (replays packed onto
servers longest first, :func:`wall_on_servers`); past a threshold it asks for ``--yes``.
These are lower bounds: each replay also drains its last tasks after the last arrival.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence

from topas.experiments.spec import Experiment, prepare

__all__ = ["arrival_span", "Stage", "wall_on_servers", "plan_lines", "format_hours"]


def arrival_span(exp: Experiment) -> float:
    """Seconds from the first to the last task arrival of ``exp`` as it runs (re-timed)."""
    if "arrival_span" not in exp._cache:
        arrivals = [t.arrival for t in prepare(exp).trace.tasks]
        exp._cache["arrival_span"] = float(max(arrivals) - min(arrivals)) if arrivals else 0.0
    return exp._cache["arrival_span"]


def wall_on_servers(spans: Sequence[float], servers: int) -> float:
    """The wall time of independent replays of ``spans`` on ``servers`` servers, one replay at a
    time each, handed out longest first (what :func:`topas.sglang.pool.map_on_servers` does)."""
    if servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers}")
    load = [0.0] * servers
    heapq.heapify(load)
    for s in sorted(spans, reverse=True):
        heapq.heappush(load, heapq.heappop(load) + s)
    return max(load) if spans else 0.0


@dataclass
class Stage:
    """One stage of a reproduction: its name and its experiments (the replays it may run) and
    which of them the results store already holds."""

    name: str
    experiments: list[Experiment]
    stored: int = 0

    def spans(self) -> list[float]:
        return [arrival_span(e) for e in self.experiments]


def format_hours(seconds: float) -> str:
    """``2 h 57 min``, ``41 min``, ``12 s``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    m = round(seconds / 60)
    return f"{m // 60} h {m % 60:02d} min" if m >= 60 else f"{m} min"


def plan_lines(stages: Sequence[Stage], servers: int) -> tuple[list[str], float]:
    """The plan's lines (one per stage and a total) and the total wall time on ``servers``
    servers (seconds). ``Stage.experiments`` are the replays still to run."""
    lines = []
    total_arr = total_wall = 0.0
    for st in stages:
        spans = st.spans()
        arr, wall = sum(spans), wall_on_servers(spans, servers)
        total_arr += arr
        total_wall += wall
        kept = f" ({st.stored} already stored, skipped)" if st.stored else ""
        lines.append(f"  {st.name}: {len(spans)} replays{kept}, {format_hours(arr)} of arrivals"
                     + (f", about {format_hours(wall)} on {servers} servers" if servers > 1 else ""))
    on = f" on {servers} servers" if servers > 1 else " on one server"
    lines.append(f"  total: {format_hours(total_arr)} of arrivals, at least {format_hours(total_wall)} of wall "
                 f"time{on} (each replay also drains its last tasks)")
    return lines, total_wall
