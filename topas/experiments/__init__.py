"""Experiments: specs with stable keys (:mod:`.spec`) and a local sweep runner (:mod:`.local`).

An experiment is (trace, policy + parameters, engine profile, arrival rate, seed)::

    from topas.experiments import Experiment, run_experiment, run_many

    exp = Experiment("dag-4", "topas", {"beta": 0.5}, load=1.2, seed=0, n_tasks=200)
    result = run_experiment(exp)                  # a SimResult (tables + summary)
    rows = run_many([exp, ...], jobs=None)        # one summary row per experiment, in order

Results go to a Parquet store keyed by :meth:`Experiment.key` (:mod:`.store`, :mod:`.sweep`); a sweep over it
runs only what is missing, so a killed sweep resumes where it stopped::

    from topas.experiments import ResultStore, run_sweep

    store = ResultStore()                         # data/results/store
    df = run_sweep([exp, ...], store)             # summaries of all, running only the missing
    result = store.load(exp)                      # the stored tables (a SimResult)
"""

from topas.experiments.local import ExperimentFailed, map_experiments, run_many, run_row
from topas.experiments.result_store import ResultStore
from topas.experiments.spec import (
    Experiment,
    ExperimentError,
    available_traces,
    prepare,
    resolve_trace_path,
    run_experiment,
)
from topas.experiments.sweep import run_sweep

__all__ = [
    "Experiment",
    "ExperimentError",
    "ExperimentFailed",
    "ResultStore",
    "available_traces",
    "map_experiments",
    "prepare",
    "resolve_trace_path",
    "run_experiment",
    "run_many",
    "run_row",
    "run_sweep",
]
