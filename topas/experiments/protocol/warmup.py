"""Warm-up removal by MSER-5 (White 1997; White, Cobb & Spratt 2000).

docs/protocol.md "Warm-up". A run starts with an empty engine, so its first tasks see a shorter
queue than the steady state: their JCTs (and the queue lengths they see) are biased low. MSER-5
picks how many of the first observations to drop so that the mean of what is kept is estimated
with the smallest standard error, as follows. With the series ``y_1..y_n`` (in arrival order):

1. form ``m = floor(n / b)`` non-overlapping batches of ``b = 5`` consecutive observations, from
   the start (the last ``n mod b`` observations are in no batch; they are kept in the data), and
   their means ``Z_1..Z_m``;
2. for each candidate ``d`` (batches to drop) with ``0 <= d < m / 2``, the MSER statistic
   ``MSER(d) = sum_{j=d+1..m} (Z_j - Zbar_d)^2 / (m - d)^2``, where ``Zbar_d`` is the mean of
   ``Z_{d+1}..Z_m``;
3. ``d* = argmin MSER(d)`` (the smallest such ``d`` on ties); the warm-up is the first ``b d*``
   observations.

Candidates stop at half the batches (the usual restriction: the statistic is noisy when few
batches remain). When the minimum sits on the last candidate the warm-up may be longer than half
the run (``at_limit``): the run is too short, or not stationary, for MSER to find its end.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["MSER_BATCH", "Warmup", "mser", "mser5"]

#: Batch size of MSER-5.
MSER_BATCH = 5


@dataclass(frozen=True)
class Warmup:
    """The warm-up MSER found in a series of ``n`` observations."""

    #: observations in the series
    n: int
    #: batch size ``b``
    batch: int
    #: number of batches ``m``
    batches: int
    #: batches dropped ``d*``
    batches_removed: int
    #: ``MSER(d)`` for every candidate ``d`` (index = ``d``)
    statistic: tuple[float, ...]
    #: whether ``d*`` is the last candidate (the warm-up may be longer than half the run)
    at_limit: bool

    @property
    def removed(self) -> int:
        """Observations dropped from the start: ``b * d*``."""
        return self.batch * self.batches_removed


def mser(series: Sequence[float] | np.ndarray, batch: int = MSER_BATCH) -> Warmup:
    """MSER-``batch`` truncation of ``series`` (module docstring). ``ValueError`` for fewer than two
    batches of observations, a non-finite value, or a batch size below 1."""
    if isinstance(batch, bool) or not isinstance(batch, numbers.Integral) or batch < 1:
        raise ValueError(f"MSER: the batch size must be an integer >= 1, got {batch!r}")
    y = np.asarray(series, dtype=float)
    if y.ndim != 1:
        raise ValueError(f"MSER: the series must be one-dimensional, got shape {y.shape}")
    if not np.all(np.isfinite(y)):
        bad = int(np.flatnonzero(~np.isfinite(y))[0])
        raise ValueError(f"MSER: observation {bad} is not finite ({y[bad]!r})")
    m = len(y) // batch
    if m < 2:
        raise ValueError(f"MSER: {len(y)} observations make {m} batch(es) of {batch}; at least 2 are needed")
    z = y[: m * batch].reshape(m, batch).mean(axis=1)
    stat = []
    for d in range(math.ceil(m / 2)):
        rest = z[d:]
        stat.append(float(((rest - rest.mean()) ** 2).sum() / (m - d) ** 2))
    best = int(np.argmin(stat))  # the first minimum: the smallest d on ties
    return Warmup(n=len(y), batch=int(batch), batches=m, batches_removed=best, statistic=tuple(stat),
                  at_limit=best == len(stat) - 1 and len(stat) > 1)


def mser5(series: Sequence[float] | np.ndarray) -> Warmup:
    """MSER-5: :func:`mser` with batches of 5."""
    return mser(series, MSER_BATCH)
