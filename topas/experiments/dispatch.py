"""Where a sweep's experiments run: in this process, on local worker processes, or handed to
their engine.

:func:`check_sweep` checks every spec before anything runs; :func:`workers` says where a sweep
runs (worker processes, Ray, or, for an ``in_process`` engine such as a replay on a real server,
this process); :func:`map_experiments` runs a function over the experiments there, in the input
order, the first failure raising :class:`~topas.errors.ExperimentFailed` naming the experiment.
Both :func:`topas.experiments.local.run_many` and the results store's sweeps
(:func:`topas.experiments.sweep.ensure_stored`) run through here.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from typing import Any, Callable, Iterable, Sequence, TypeVar

from tqdm.auto import tqdm

from topas.errors import ExperimentFailed
from topas.experiments.ray_backend import resolve_address
from topas.experiments.replay_time import replay_order
from topas.experiments.spec import Experiment

__all__ = ["JOBS_ENV", "check_sweep", "default_jobs", "map_experiments", "workers"]

T = TypeVar("T")

#: Worker processes for a sweep that does not say (``jobs=None``): every notebook's and study's
#: sweeps, and ``make reproduce`` without ``--jobs``. Unset: one per CPU core.
JOBS_ENV = "TOPAS_JOBS"


def default_jobs() -> int:
    """``$TOPAS_JOBS`` (a whole number >= 1), else ``os.cpu_count()``; ``ValueError`` naming the
    variable and its value where it is set to anything else."""
    raw = os.environ.get(JOBS_ENV, "").strip()
    if not raw:
        return os.cpu_count() or 1
    try:
        jobs = int(raw)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise ValueError(f"${JOBS_ENV}={raw!r}: worker processes must be a whole number >= 1 (unset it to use every core)")
    return jobs


def check_sweep(experiments: Iterable[Experiment], jobs: int | None, caller: str) -> tuple[list[Experiment], int]:
    """Check every spec (resolving each input, so a bad one is named before anything runs) and
    ``jobs`` (``None``: :func:`default_jobs`); return the experiments as a list and the job count."""
    exps = list(experiments)
    for e in exps:
        if not isinstance(e, Experiment):
            raise TypeError(f"{caller} takes Experiment objects, got {e!r}")
        e.key()  # resolves and checks every input; raises naming the bad item
    if jobs is None:
        jobs = default_jobs()
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1 or None, got jobs={jobs!r}")
    return exps, jobs


def workers(exps: Sequence[Experiment], jobs: int, ray_address: str | None) -> tuple[int, str | None]:
    """Where a sweep of ``exps`` runs: ``(jobs, Ray address or None)``. Runs of an ``in_process``
    engine (a replay on a real server: concurrent replays on one server would measure each
    other) run in this process, handed out by the engine (:func:`map_experiments`)."""
    if _in_process_engine(exps) is not None:
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
    engine = _in_process_engine(exps)
    if engine is not None:  # e.g. one replay at a time per server, in threads
        return engine.map(fn, exps, progress=progress, desc=desc, order=replay_order)
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


def _in_process_engine(exps: Sequence[Experiment]) -> Any:
    """The first ``in_process`` engine among ``exps``' engines (it hands out the whole sweep), or ``None``."""
    for e in exps:
        engine = e.runner()
        if engine.in_process:
            return engine
    return None


def _ignore_sigint() -> None:
    """Worker initializer: Ctrl-C goes to the process that runs the sweep (which stops the
    workers), not to every worker (each would print its own traceback); and a worker whose
    parent dies (``kill -9`` of the sweep) exits instead of living on as an orphan
    (:func:`_exit_with_parent`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent()


#: How often a worker checks that the process running the sweep is still there (seconds).
ORPHAN_POLL_S = 0.2


def _exit_with_parent() -> None:
    """Start a daemon thread that ends this worker as soon as its parent is gone (its parent
    process id changes: it was re-parented). A run in flight is lost, which the store's atomic
    writes allow (its temporary folder is removed by the next write); the sweep resumes it."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(ORPHAN_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="topas-orphan-watch").start()


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
