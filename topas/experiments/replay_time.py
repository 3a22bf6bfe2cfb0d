"""A replay's durations as the pool of servers hands replays out by: its arrivals (re-timed), and
the wall time the plan (:mod:`topas.experiments.plan`) gave it in this process.

Kept apart from the plan, which reads the results store and runs the simulator, so that the sweep
(:mod:`topas.experiments.dispatch`) can order replays without importing either.
"""

from __future__ import annotations

from topas.experiments.spec import Experiment, prepare

__all__ = ["arrival_span", "last_arrival", "replay_order"]

#: planned wall times of this process's replays by key (for :func:`replay_order`)
_PLANNED: dict[str, float] = {}


def _arrivals(exp: Experiment) -> list[float]:
    if "arrivals" not in exp._cache:
        exp._cache["arrivals"] = [float(t.arrival) for t in prepare(exp).trace.tasks]
    return exp._cache["arrivals"]


def arrival_span(exp: Experiment) -> float:
    """Seconds from the first to the last task arrival of ``exp`` as it runs (re-timed)."""
    a = _arrivals(exp)
    return float(max(a) - min(a)) if a else 0.0


def last_arrival(exp: Experiment) -> float:
    """Seconds from the replay's start (time 0) to its last task's arrival."""
    return float(max(_arrivals(exp), default=0.0))


def replay_order(exp: Experiment) -> float:
    """The duration a pool of replays hands ``exp`` out by: its planned wall time when this
    process planned it (:func:`topas.experiments.plan.estimate_replays`), else its arrival span."""
    return exp._cache.get("planned_wall") or _PLANNED.get(exp.key()) or arrival_span(exp)
