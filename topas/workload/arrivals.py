"""Poisson (or bursty gamma-renewal) task arrivals, and re-timing a trace to a new arrival rate.

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
- bursts (issue 16): ``process="gamma:CV"`` draws the gaps from a gamma distribution of the same
  mean ``1/rate`` and coefficient of variation ``CV`` (shape ``1/CV^2``, scale ``CV^2/rate``), a
  renewal process: CV > 1 clusters arrivals into bursts separated by long gaps, CV = 1 has
  exponential gaps (but its own draws: ``"poisson"`` keeps the exponential draws above, so
  results stored before bursts existed stay valid), CV < 1 is more regular than Poisson.
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING

import numpy as np

from topas.workload.trace_rules import MAX_ARRIVAL_S
from topas.workload.validate import TraceError, validate_trace

if TYPE_CHECKING:  # pragma: no cover
    from topas.workload.model import Trace

ARRIVAL_DECIMALS = 6


def _check_rate(rate: object) -> float:
    if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not math.isfinite(rate) or rate <= 0:
        raise ValueError(f"rate must be a finite number > 0 (tasks per second), got rate={rate!r}")
    return float(rate)


def parse_process(process: object) -> tuple[str, float | None]:
    """``"poisson"`` -> ("poisson", None); ``"gamma:CV"`` -> ("gamma", CV) for a finite CV > 0.

    Raises ``ValueError`` naming the bad spec."""
    if process == "poisson":
        return "poisson", None
    if isinstance(process, str) and process.startswith("gamma:"):
        try:
            cv = float(process.split(":", 1)[1])
        except ValueError:
            cv = float("nan")
        if math.isfinite(cv) and cv > 0:
            return "gamma", cv
    raise ValueError(f"arrival process must be 'poisson' or 'gamma:CV' with a number CV > 0, got {process!r}")


def canonical_process(process: str) -> str:
    """The process spec in one spelling (``"gamma:2.0"`` -> ``"gamma:2"``), for keys and labels."""
    kind, cv = parse_process(process)
    return kind if cv is None else f"gamma:{cv:g}"


def _gaps(n: int, rate: float, seed: int, process: str) -> np.ndarray:
    kind, cv = parse_process(process)
    rng = np.random.default_rng(seed)
    if kind == "poisson":
        return rng.exponential(1.0 / rate, size=n)
    shape = 1.0 / (cv * cv)
    return rng.gamma(shape, 1.0 / (rate * shape), size=n)


def poisson_arrivals(n: int, rate: float, seed: int, process: str = "poisson") -> list[float]:
    """``n`` arrival times (seconds) of a Poisson process of ``rate`` tasks/s, the first at 0.0;
    with ``process="gamma:CV"`` a gamma renewal process of the same rate (module docstring)."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got n={n!r}")
    rate = _check_rate(rate)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"seed must be an integer (for reproducible arrivals), got seed={seed!r}")
    parse_process(process)
    if n == 0:
        return []
    gaps = _gaps(int(n) - 1, rate, seed, process)
    times = np.concatenate(([0.0], np.cumsum(gaps)))
    return [round(float(t), ARRIVAL_DECIMALS) for t in times]


def retime(trace: "Trace", rate: float, seed: int, process: str = "poisson") -> "Trace":
    """The same tasks, in the same order, with Poisson arrivals of ``rate`` tasks/s from ``seed``
    (or the gamma renewal process ``process="gamma:CV"``).

    ``meta`` records the new arrivals: ``rate``, ``arrival_seed`` and ``arrival_process``. The
    result is validated.
    """

    rate = _check_rate(rate)
    process = canonical_process(process)
    if len(trace.tasks) - 1 > MAX_ARRIVAL_S * rate:  # the mean horizon (n - 1) / rate, without overflow
        raise TraceError(f"<trace {trace.name}>", f"rate {rate:.4g} tasks/s spreads its {len(trace.tasks)} "
                         f"tasks over about {(len(trace.tasks) - 1) / rate:.3g} s, beyond the longest horizon "
                         f"a run may span ({MAX_ARRIVAL_S:g} s); raise the rate or load")
    t = trace.with_arrivals(poisson_arrivals(len(trace.tasks), rate, seed, process))
    meta = dict(trace.meta)
    meta.update({"rate": rate, "arrival_seed": int(seed), "arrival_process": process})
    out = t.with_meta(meta)
    validate_trace(out)
    return out
