"""Poisson task arrivals, and re-timing a trace to a new arrival rate.

docs/method.md "Setup and metrics": Poisson task arrivals; the same sampled trajectories are shared by all
policies. A trace file fixes the tasks (their DAGs and lengths); :func:`retime` gives them new
arrival times for a rate and a seed, keeping the tasks and their order, so every policy run at
(rate, seed) sees exactly the same workload.

Choices (documented in data/traces/README.md as well):

- the first task arrives at ``t = 0`` (a simulation does not start with an idle gap); task ``k``
  arrives at the sum of ``k`` independent exponential gaps of mean ``1/rate``. The empirical rate
  of ``n`` arrivals is therefore ``(n - 1) / (last - first)``;
- gaps are drawn with ``numpy.random.default_rng(seed).exponential(1/rate, n - 1)`` and arrival
  times are rounded to the microsecond (``round(t, 6)``; monotone, so the order is kept) to keep
  trace files short and readable.
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from topas.workload.model import Trace

ARRIVAL_DECIMALS = 6


def _check_rate(rate: object) -> float:
    if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not math.isfinite(rate) or rate <= 0:
        raise ValueError(f"rate must be a finite number > 0 (tasks per second), got rate={rate!r}")
    return float(rate)


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """``n`` arrival times (seconds) of a Poisson process of ``rate`` tasks/s, the first at 0.0."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got n={n!r}")
    rate = _check_rate(rate)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"seed must be an integer (for reproducible arrivals), got seed={seed!r}")
    if n == 0:
        return []
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=int(n) - 1)
    times = np.concatenate(([0.0], np.cumsum(gaps)))
    return [round(float(t), ARRIVAL_DECIMALS) for t in times]


def retime(trace: "Trace", rate: float, seed: int) -> "Trace":
    """The same tasks, in the same order, with Poisson arrivals of ``rate`` tasks/s from ``seed``.

    ``meta`` records the new arrivals: ``rate``, ``arrival_seed`` and ``arrival_process``. The
    result is validated.
    """
    from topas.workload.model import Trace
    from topas.workload.validate import validate_trace

    rate = _check_rate(rate)
    t = trace.with_arrivals(poisson_arrivals(len(trace.tasks), rate, seed))
    meta = dict(trace.meta)
    meta.update({"rate": rate, "arrival_seed": int(seed), "arrival_process": "poisson"})
    out = Trace(name=t.name, agents=t.agents, tasks=t.tasks, meta=meta)
    validate_trace(out)
    return out
