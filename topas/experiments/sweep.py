"""Sweeps over the results store: run what a :class:`~topas.experiments.result_store.ResultStore`
lacks of a list of experiments, each result stored as it finishes, and return their summaries.

A killed sweep loses at most the runs in flight; re-run on the same store it runs only the
experiments that are missing. With ``$TOPAS_STORE_ONLY=1`` (``make figures`` sets it) a sweep
runs nothing: a missing result raises :class:`MissingResults` naming the experiments.
"""

from __future__ import annotations

import functools
import os
from typing import Iterable

import pandas as pd

# dispatch.map_experiments is looked up at each sweep, so a test can replace it (monkeypatch)
from topas.experiments import dispatch
from topas.experiments.ray_backend import map_experiments_ray
from topas.experiments.result_store import ResultStore
from topas.experiments.run_cost import cached_costs, longest_first
# run_experiment is looked up in this module at each run, so a test can count or slow a sweep's runs
# (monkeypatch sweep.run_experiment); it is defined once, in spec.
from topas.experiments.spec import Experiment, run_experiment
from topas.experiments.store_layout import STORE_ONLY_ENV
from topas.experiments.store_layout import log as _log

__all__ = ["MissingResults", "ensure_stored", "run_and_store", "run_sweep"]


class MissingResults(LookupError):
    """Store-only mode (``$TOPAS_STORE_ONLY``) and a sweep needs results the store lacks."""


def run_and_store(exp: Experiment, root: str) -> str:
    """Run ``exp`` and write its result into the store at ``root`` (in this process); return
    its key. This is what a sweep's worker runs, so a finished run is on disk even if the
    process that started the sweep dies."""
    store = ResultStore(root)
    if not store.has(exp):
        store.put(exp, run_experiment(exp))
    return exp.key()


def run_sweep(
    experiments: Iterable[Experiment],
    store: ResultStore | str | os.PathLike[str] | None = None,
    jobs: int | None = None,
    progress: bool = True,
    desc: str = "sweep",
    ray_address: str | None = None,
    tables: bool = True,
) -> pd.DataFrame:
    """Run the experiments that ``store`` does not hold yet and return the summaries of all of
    them (one row per experiment, in the input order; see :meth:`ResultStore.summaries`).
    ``tables=False`` says the caller uses the summaries only: a pack then ships these
    experiments' ``meta.json`` without their tables (notebook 12's ~1,000 runs).

    Every spec is checked first (a bad workload, policy, parameter or profile raises its own
    error before anything runs). Experiments with equal keys run once. ``jobs``: worker processes
    (``None``: one per CPU core; ``1``: in this process). ``ray_address`` (or
    ``$TOPAS_RAY_ADDRESS``): run on Ray instead (:mod:`topas.experiments.ray_backend`); each result
    is written here, by this process, as it arrives. Experiments on the ``sglang`` engine always
    run one at a time, in this process: they share one server. A failing experiment stops the sweep
    with :class:`topas.experiments.ExperimentFailed` naming it; results already stored are kept,
    so re-running the sweep resumes where it stopped (so does a sweep stopped by Ctrl-C).
    """
    store, keys = ensure_stored(experiments, store, jobs, progress, desc, ray_address, "run_sweep",
                                log="sweep" if tables else "summary")
    return store.summaries(keys)


def ensure_stored(
    experiments: Iterable[Experiment],
    store: ResultStore | str | os.PathLike[str] | None = None,
    jobs: int | None = None,
    progress: bool = True,
    desc: str = "sweep",
    ray_address: str | None = None,
    caller: str = "run_sweep",
    log: str = "sweep",
) -> tuple[ResultStore, list[str]]:
    """Run what ``store`` lacks of ``experiments`` (each result stored as it finishes) and return
    the store and the experiments' keys in the input order: the engine of :func:`run_sweep` and
    :func:`topas.experiments.run_many`. On several workers the runs start longest first
    (:func:`topas.experiments.run_cost.longest_first`, priced by the plan's measured costs when
    the store holds them), so a sweep does not end on one long run with a core idle."""
    if not isinstance(store, ResultStore):
        store = ResultStore(store)
    exps, jobs = dispatch.check_sweep(experiments, jobs, caller)
    todo: list[Experiment] = []
    seen: set[str] = set()
    for e in exps:  # input order; ``seen`` is only a membership test
        k = e.key()
        if k not in seen and not store.has(k):
            todo.append(e)
        seen.add(k)
    if todo and os.environ.get(STORE_ONLY_ENV, "") not in ("", "0"):
        names = "\n  ".join(e.label() for e in todo[:10]) + ("\n  ..." if len(todo) > 10 else "")
        raise MissingResults(
            f"{len(todo)} experiment(s) are not in the results store ({store.root}"
            f"{' or the shipped packs' if store.packs else ''}) and ${STORE_ONLY_ENV} forbids running "
            f"them:\n  {names}\nRun `make reproduce` (or unset {STORE_ONLY_ENV}) to simulate them.")
    if todo:
        store.root.mkdir(parents=True, exist_ok=True)
        jobs, address = dispatch.workers(todo, jobs, ray_address)
        if jobs > 1 or address is not None:  # several workers: the longest runs first
            todo = longest_first(todo, cached_costs(store.root))  # the plan's costs, if measured
        if address is not None:
            map_experiments_ray(run_experiment, todo, address, progress=progress, desc=desc,
                                on_result=store.put)
        else:
            fn = functools.partial(run_and_store, root=str(store.root))
            dispatch.map_experiments(fn, todo, jobs=min(jobs, len(todo)), progress=progress, desc=desc)
    keys = [e.key() for e in exps]
    for k in keys:
        _log(log, k)
    return store, keys
