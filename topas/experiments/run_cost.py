"""What a simulation is expected to cost, from the per-policy costs ``sim_plan.calibrate``
measures on this machine (cached in the results store's folder under the code's fingerprint):
:func:`estimate_cpu` prices one experiment, :func:`longest_first` orders a sweep by it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Sequence

from topas.experiments.spec import Experiment

__all__ = ["cached_costs", "estimate_cpu", "longest_first"]


def _cache_path(root: Path) -> Path:
    from topas.provenance import engine_fingerprint

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
        return float(e.n_tasks if e.n_tasks is not None else 0) * max(1, int(e.engines))

    return sorted(exps, key=cost, reverse=True)


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
    if exp.n_tasks is not None:
        n = int(exp.n_tasks)
    else:  # the whole trace: read it
        from topas.experiments.replay_time import _arrivals

        n = len(_arrivals(exp))
    return c * n * max(1, int(exp.engines))
