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
store (:func:`topas.experiments.store.run_sweep`) keeps them.
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from typing import Any, Callable, Iterable, Sequence, TypeVar

from tqdm.auto import tqdm

from topas.experiments.spec import KNOWLEDGE_FIELDS, Experiment, prepare, run_prepared

__all__ = ["run_many", "run_row", "map_experiments", "ExperimentFailed"]

T = TypeVar("T")


class ExperimentFailed(RuntimeError):
    """An experiment raised while running; the message names it, ``__cause__`` is the error."""


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
    :class:`~topas.experiments.store.ResultStore` or its root folder; ``None``: the default store,
    ``data/results/store`` plus the shipped packs unless ``$TOPAS_USE_PACKS=0``; ``False``: no
    store, everything runs and nothing is kept). ``jobs``: worker processes (``None``: ``os.cpu_count()``; never more than there are
    experiments; ``1`` runs in this process). ``ray_address`` (or ``$TOPAS_RAY_ADDRESS``): run
    on Ray instead, one task per experiment (see :mod:`topas.experiments.ray_backend`; ``jobs``
    is then ignored). ``progress``: show a tqdm bar on stderr labelled
    ``desc``. A failing experiment stops the sweep: pending ones are cancelled and
    :class:`ExperimentFailed` names the experiment (its cause is the original error). A bad spec
    (unknown workload, policy, parameter or profile) raises its own error before anything runs.
    """
    from topas.experiments.ray_backend import map_experiments_ray

    if store is not False:
        from topas.experiments.store import ensure_stored

        st, keys = ensure_stored(experiments, store, jobs, progress, desc, ray_address, "run_many")
        return st.rows(keys)
    exps, jobs = check_sweep(experiments, jobs, "run_many")
    jobs, address = workers(exps, jobs, ray_address)
    if address is not None and exps:
        return map_experiments_ray(run_row, exps, address, progress=progress, desc=desc)
    jobs = min(jobs, max(1, len(exps)))
    return map_experiments(run_row, exps, jobs=jobs, progress=progress, desc=desc)


def check_sweep(experiments: Iterable[Experiment], jobs: int | None, caller: str) -> tuple[list[Experiment], int]:
    """Check every spec (resolving each input, so a bad one is named before anything runs) and
    ``jobs`` (``None`` = all cores); return the experiments as a list and the job count."""
    exps = list(experiments)
    for e in exps:
        if not isinstance(e, Experiment):
            raise TypeError(f"{caller} takes Experiment objects, got {e!r}")
        e.key()  # resolves and checks every input; raises naming the bad item
    if jobs is None:
        jobs = os.cpu_count() or 1
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1 or None, got jobs={jobs!r}")
    return exps, jobs


def workers(exps: Sequence[Experiment], jobs: int, ray_address: str | None) -> tuple[int, str | None]:
    """Where a sweep of ``exps`` runs: ``(jobs, Ray address or None)``. Replays on the ``sglang``
    engine run in this process, one at a time per server (concurrent replays on one server would
    measure each other; :func:`map_experiments` hands them to :mod:`topas.sglang.pool`)."""
    from topas.experiments.ray_backend import resolve_address

    if any(e.engine == "sglang" for e in exps):
        return 1, None
    return jobs, resolve_address(ray_address)


def map_experiments(
    fn: Callable[[Experiment], T],
    exps: Sequence[Experiment],
    jobs: int = 1,
    progress: bool = True,
    desc: str = "experiments",
) -> list[T]:
    """``[fn(e) for e in exps]``, on ``jobs`` worker processes (``1``: in this process), in the
    input order, with a tqdm bar. ``fn`` must be a picklable (module-level) function. The first
    failure cancels the pending experiments and raises :class:`ExperimentFailed` naming the
    experiment (its cause is the original error). Specs are not checked here (see :func:`run_many`).
    """
    if any(e.engine == "sglang" for e in exps):  # one replay at a time per server, in threads
        from topas.experiments.plan import replay_order
        from topas.sglang.pool import map_on_servers

        return map_on_servers(fn, exps, progress=progress, desc=desc, order=replay_order)
    out: list[Any] = [None] * len(exps)
    bar = tqdm(total=len(exps), desc=desc, unit="run", disable=not progress)
    try:
        if jobs == 1 or len(exps) <= 1:
            for i, e in enumerate(exps):
                out[i] = _run_or_raise(fn, e)
                bar.update(1)
        else:
            pool = ProcessPoolExecutor(max_workers=min(jobs, len(exps)), initializer=_ignore_sigint)
            try:
                futures: dict[Future, int] = {pool.submit(fn, e): i for i, e in enumerate(exps)}
                pending = set(futures)
                while pending:
                    done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                    for f in done:
                        i = futures[f]
                        err = f.exception()
                        if err is not None:
                            for p in pending:
                                p.cancel()
                            raise ExperimentFailed(f"experiment {exps[i].label()} failed: {err}") from err
                        out[i] = f.result()
                        bar.update(1)
            except KeyboardInterrupt:
                _stop(pool)
                raise
            finally:
                pool.shutdown(wait=True, cancel_futures=True)  # a no-op after _stop
    finally:
        bar.close()
    return out


def _ignore_sigint() -> None:
    """Worker initializer: Ctrl-C goes to the process that runs the sweep (which stops the
    workers), not to every worker (each would print its own traceback)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Cancel what has not started and terminate the workers (their runs in flight are lost;
    the store's atomic writes leave nothing half-written)."""
    procs = list(getattr(pool, "_processes", {}).values())  # no public API lists the workers
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)


def _run_or_raise(fn: Callable[[Experiment], T], e: Experiment) -> T:
    try:
        return fn(e)
    except Exception as err:
        raise ExperimentFailed(f"experiment {e.label()} failed: {err}") from err
