"""The convergence study: how the steady-state verdict depends on the run length.

docs/protocol.md "Run length". For every (policy, load, run length) the runs over the given seeds
are tested with :func:`topas.experiments.protocol.steady.steady_state`; the run length the
protocol uses is the shortest one from which the verdicts stop changing. Runs go through the
results store (:func:`topas.experiments.run_sweep`), so the study is cached and resumable, and a
run of ``n`` tasks is the first ``n`` tasks of the workload's trace.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import pandas as pd

from topas.experiments.protocol.grid_capacity import grid_capacity
from topas.experiments.protocol.steady import ALPHA, INDICATORS, MIN_FRACTION, N_BATCHES, steady_state
from topas.experiments.result_store import ResultStore
from topas.experiments.spec import Experiment
from topas.experiments.sweep import run_sweep

__all__ = ["CAPACITY_COLUMNS", "COLUMNS", "capacity_table", "convergence_study"]

#: The columns of :func:`convergence_study`'s frame, one row per (policy, load, run length, seed,
#: indicator).
COLUMNS = ("policy", "workload", "load", "n_tasks", "seed", "indicator", "n", "warmup", "slope", "p_value",
           "growth", "growing", "seed_stable", "stable", "n_growing", "n_seeds", "level", "jct_mean")


def convergence_study(policies: Sequence[str], workload: str, loads: Sequence[float], seeds: Sequence[int],
                      run_lengths: Sequence[int], store: Any = None, params: Mapping[str, Mapping[str, Any]] | None = None,
                      alpha: float = ALPHA, min_fraction: float = MIN_FRACTION,
                      indicators: Sequence[str] = INDICATORS, n_batches: int = N_BATCHES, jobs: int | None = None,
                      progress: bool = False, **experiment_options: Any) -> pd.DataFrame:
    """Run every (policy, load, seed, run length) and test each (policy, load, run length) over the
    seeds. ``params``: policy -> its parameters; ``experiment_options``: any other
    :class:`~topas.experiments.Experiment` field (e.g. ``engine_options``). ``store``: a
    :class:`~topas.experiments.ResultStore` or its folder (default: the default store). Returns a
    tidy frame (:data:`COLUMNS`): the per-(seed, indicator) evidence, whether the seed's run is
    stable (``seed_stable``), and the verdict of its (policy, load, run length) (``stable``)."""
    for what, v in (("policies", policies), ("loads", loads), ("seeds", seeds), ("run_lengths", run_lengths)):
        if len(v) == 0:
            raise ValueError(f"convergence_study: no {what}")
    params = dict(params or {})
    unknown = sorted(set(params) - set(policies))
    if unknown:
        raise ValueError(f"convergence_study: parameters given for {', '.join(unknown)}, which is not among the policies")
    store = store if isinstance(store, ResultStore) else ResultStore(store)
    cells = {(p, float(l), int(n), int(s)): Experiment(workload, p, dict(params.get(p, {})), load=float(l), seed=int(s),
                                                       n_tasks=int(n), **experiment_options)
             for p in policies for l in loads for n in run_lengths for s in seeds}
    run_sweep(list(cells.values()), store, jobs=jobs, progress=progress, desc="convergence")
    frames = []
    for p in policies:
        for l in loads:
            for n in run_lengths:
                tasks = {int(s): store.load_table(cells[(p, float(l), int(n), int(s))], "tasks") for s in seeds}
                st = steady_state(tasks, alpha, min_fraction, indicators, n_batches,
                                  what=f"{workload}/{p} at load {float(l):g}, {int(n)} tasks")
                ev = st.evidence.assign(policy=p, workload=workload, load=float(l), n_tasks=int(n),
                                        stable=st.stable, n_growing=st.n_growing, n_seeds=st.n_seeds, level=st.level)
                ev["seed_stable"] = ~ev["seed"].isin(st.growing_seeds)
                ev["jct_mean"] = ev["seed"].map({s: float(t["jct"].mean()) for s, t in tasks.items()})
                frames.append(ev)
    return pd.concat(frames, ignore_index=True)[list(COLUMNS)]


#: The columns of :func:`capacity_table`.
CAPACITY_COLUMNS = ("policy", "workload", "n_tasks", "capacity", "lower", "upper", "seed_low", "seed_high",
                    "n_seeds", "min_fraction", "loads")


def capacity_table(frame: pd.DataFrame, min_fraction: float = MIN_FRACTION) -> pd.DataFrame:
    """Capacity with its interval (:func:`~topas.experiments.protocol.grid_capacity.grid_capacity`)
    per (policy, workload, run length) of a :func:`convergence_study` frame, from its per-(load,
    seed) verdicts (``seed_stable``); the frame's loads are the grid. One row each
    (:data:`CAPACITY_COLUMNS`; ``loads`` lists the grid)."""
    rows = []
    for (policy, workload, n), g in frame.groupby(["policy", "workload", "n_tasks"], sort=True):
        v = g.drop_duplicates(["load", "seed"])[["load", "seed", "seed_stable"]].rename(columns={"seed_stable": "stable"})
        c = grid_capacity(v, min_fraction, what=f"{workload}/{policy}, {n} tasks")
        rows.append({"policy": policy, "workload": workload, "n_tasks": int(n), "capacity": c.capacity,
                     "lower": c.lower, "upper": c.upper, "seed_low": c.seed_low, "seed_high": c.seed_high,
                     "n_seeds": c.n_seeds, "min_fraction": c.min_fraction,
                     "loads": " ".join(f"{l:g}" for l in c.loads)})
    return pd.DataFrame(rows, columns=list(CAPACITY_COLUMNS))
