"""Run many experiments on local processes.

:func:`run_many` checks every spec first (its key resolves the trace, profile, policy and
parameters, so a typo fails before any simulation starts), then runs the experiments the results
store lacks (:mod:`topas.experiments.store`; each result is stored as it finishes, so a killed or
interrupted sweep resumes where it stopped) on a ``concurrent.futures.ProcessPoolExecutor``
(``jobs=None``: one process per CPU core; ``jobs=1``: in this process, no pool), with a tqdm bar,
and returns one flat row per experiment in the input order: the experiment's fields (:meth:`Experiment.fields`), its ``key``, then the run's summary
(:class:`topas.engine.metrics.SimResult`). Two keys differ in meaning between the two:

* ``rate``: the resolved arrival rate the run used (tasks/s; ``None`` = the trace's own arrivals);
  the spec's own value is kept as ``rate_given``;
* ``n_tasks``: the number of tasks simulated (the summary's); the spec's limit is ``n_tasks_limit``.

Rows are deterministic apart from the wall-clock keys
(:data:`topas.engine.metrics.WALL_CLOCK_KEYS`): the same experiments give the same rows whatever
``jobs`` is. Full per-task tables are not returned (they stay in the worker); the Parquet results
store (:func:`topas.experiments.sweep.run_sweep`) keeps them.
"""

from __future__ import annotations

from typing import Any, Iterable

from topas.errors import ExperimentFailed
from topas.experiments.dispatch import check_sweep, map_experiments, workers
from topas.experiments.ray_backend import map_experiments_ray
from topas.experiments.spec import KNOWLEDGE_FIELDS, Experiment, prepare, run_prepared
from topas.experiments.sweep import ensure_stored

__all__ = ["run_many", "run_row", "map_experiments", "check_sweep", "workers", "ExperimentFailed"]


def run_row(exp: Experiment) -> dict[str, Any]:
    """Run one experiment (in this process) and return its row (see the module docstring)."""
    p = prepare(exp)
    result = run_prepared(p)
    spec = exp.fields()
    row: dict[str, Any] = {"key": exp.key()}
    for k in ("workload", "policy", "params", "profile", "engine", "kv_budget", "load"):
        row[k] = spec[k]
    row["engine_model"] = spec.get("engine_model", "stock")
    row["rate_given"] = spec["rate"]
    row["rate"] = p.rate
    row["seed"] = spec["seed"]
    row["n_tasks_limit"] = spec["n_tasks"]
    for k, default in KNOWLEDGE_FIELDS.items():  # absent from results stored before issue 16
        row[k] = spec.get(k, default)
    summary = dict(result.summary)
    summary.pop("policy", None)  # the same name as the spec's
    row.update(summary)
    return row


def run_many(
    experiments: Iterable[Experiment],
    jobs: int | None = None,
    progress: bool = True,
    desc: str = "experiments",
    ray_address: str | None = None,
    store: Any = None,
) -> list[dict[str, Any]]:
    """Run ``experiments`` and return their rows, in the input order.

    ``store``: the results store read first and written as each run finishes (a
    :class:`~topas.experiments.result_store.ResultStore` or its root folder; ``None``: the default
    store, ``data/results/store`` plus the shipped packs unless ``$TOPAS_USE_PACKS=0``; ``False``: no
    store, everything runs and nothing is kept). ``jobs``: worker processes (``None``: ``$TOPAS_JOBS`` or one per core, ``dispatch.default_jobs``; never more than there are
    experiments; ``1`` runs in this process). ``ray_address`` (or ``$TOPAS_RAY_ADDRESS``): run
    on Ray instead, one task per experiment (see :mod:`topas.experiments.ray_backend`; ``jobs``
    is then ignored). ``progress``: show a tqdm bar on stderr labelled
    ``desc``. A failing experiment stops the sweep: pending ones are cancelled and
    :class:`ExperimentFailed` names the experiment (its cause is the original error). A bad spec
    (unknown workload, policy, parameter or profile) raises its own error before anything runs.
    """
    if store is not False:
        st, keys = ensure_stored(experiments, store, jobs, progress, desc, ray_address, "run_many")
        return st.rows(keys)
    exps, jobs = check_sweep(experiments, jobs, "run_many")
    jobs, address = workers(exps, jobs, ray_address)
    if address is not None and exps:
        return map_experiments_ray(run_row, exps, address, progress=progress, desc=desc)
    jobs = min(jobs, max(1, len(exps)))
    return map_experiments(run_row, exps, jobs=jobs, progress=progress, desc=desc)
