"""The protocol's seed ranges: fixed, named and disjoint, so that tuning never sees evaluation data.

docs/protocol.md "Seeds". Three uses, three ranges:

* :data:`TUNING_SEEDS` -- the arrival seeds of every run a selection or a parameter sweep looks at
  (``scripts/select_topas_plus.py``, ``scripts/sweep_topas_defaults.py``);
* :data:`EVALUATION_SEEDS` -- the arrival seeds of every run a reported table or figure uses;
* :data:`HELD_OUT_WORKFLOW_SEEDS` -- the generator seeds of the held-out family of synthetic
  workflows (:mod:`topas.workload.random_dag`): each seed draws one workflow mix that no
  selection has seen. A generator seed decides the DAGs, their agents and lengths (and the file's
  nominal arrival times); the arrivals of an experiment on such a trace still come from its
  arrival seed (an evaluation seed).

A study that needs ``n`` seeds takes the first ``n`` of its range (:func:`first`), so adding seeds
never changes the ones already used.
"""

from __future__ import annotations

import numbers
from typing import Mapping

__all__ = [
    "EVALUATION_SEEDS",
    "HELD_OUT_WORKFLOW_SEEDS",
    "SEED_RANGES",
    "TUNING_SEEDS",
    "check_disjoint",
    "first",
]

#: Arrival seeds for tuning: selections and parameter sweeps read only these.
TUNING_SEEDS: range = range(100, 200)
#: Arrival seeds for evaluation: every reported number comes from these.
EVALUATION_SEEDS: range = range(0, 10)
#: Generator seeds of the held-out synthetic workflow family (one trace per seed).
HELD_OUT_WORKFLOW_SEEDS: range = range(1000, 1004)

#: Every range by name (what :func:`check_disjoint` checks).
SEED_RANGES: dict[str, range] = {
    "tuning": TUNING_SEEDS,
    "evaluation": EVALUATION_SEEDS,
    "held-out workflows": HELD_OUT_WORKFLOW_SEEDS,
}


def check_disjoint(ranges: Mapping[str, range] = SEED_RANGES) -> None:
    """Raise ``ValueError`` naming the two ranges and a shared seed if any two ranges overlap."""
    names = list(ranges)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            shared = sorted(set(ranges[a]) & set(ranges[b]))
            if shared:
                raise ValueError(f"seed ranges {a!r} and {b!r} overlap: both hold seed {shared[0]}"
                                 f" ({len(shared)} shared)")


def first(seeds: range, n: int, what: str = "seeds") -> list[int]:
    """The first ``n`` seeds of ``seeds``; ``ValueError`` when the range holds fewer than ``n``."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"{what}: the number of seeds must be an integer >= 1, got {n!r}")
    if n > len(seeds):
        raise ValueError(f"{what}: {n} seeds asked for, the range {seeds.start}-{seeds.stop - 1} holds {len(seeds)}")
    return list(seeds[:n])
