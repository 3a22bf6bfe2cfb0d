"""What a simulation is expected to cost, from the per-policy costs ``sim_plan.calibrate``
measures on this machine (cached in the results store's folder under the code's fingerprint):
:func:`estimate_cpu` prices one experiment, :func:`longest_first` orders a sweep by it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Sequence

from topas.experiments.replay_time import _arrivals
from topas.experiments.spec import Experiment
from topas.provenance import engine_fingerprint

__all__ = ["cached_costs", "estimate_cpu", "longest_first"]


def _cache_path(root: Path) -> Path:
    return root / f"plan_costs-{engine_fingerprint('sim')[:16]}.json"


def cached_costs(root: Path) -> dict[str, dict[str, float]]:
    """What :func:`topas.experiments.sim_plan.calibrate` last measured for this code in the results
    store folder ``root``, without running anything; ``{}`` when nothing was measured."""
    path = _cache_path(Path(root))
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except ValueError:
        return {}


def longest_first(exps: Sequence[Experiment], costs: Mapping[str, Mapping[str, float]]) -> list[Experiment]:
    """``exps`` by expected CPU time, longest first (ties in input order): a pool that starts the
    longest runs first does not end on one long run with the other workers idle. Priced by
    :func:`estimate_cpu` where ``costs`` are known, else by tasks x engines."""
    def cost(e: Experiment) -> float:
        if costs:
            return estimate_cpu(e, costs)
        return float(_tasks(e) * max(1, int(e.engines)))

    return sorted(exps, key=cost, reverse=True)


def _tasks(exp: Experiment) -> int:
    """The tasks ``exp`` runs: its ``n_tasks``, else its whole trace's (read once per experiment)."""
    if exp.n_tasks is not None:
        return int(exp.n_tasks)
    return len(_arrivals(exp))


def estimate_cpu(exp: Experiment, costs: Mapping[str, Mapping[str, float]]) -> float:
    """Expected CPU seconds of ``exp`` from per-task ``costs`` (``sim_plan.calibrate``)."""
    per = costs.get(exp.policy) or {}
    if exp.workload in per:
        c = per[exp.workload]
    elif per:
        c = sum(per.values()) / len(per)
    else:  # a policy not calibrated: the mean over all
        vals = [v for d in costs.values() for v in d.values()]
        c = sum(vals) / len(vals) if vals else 0.0
    return c * _tasks(exp) * max(1, int(exp.engines))
