"""Experiments: specs with stable keys (:mod:`.spec`) and a local sweep runner (:mod:`.local`).

An experiment is (trace, policy + parameters, engine profile, arrival rate, seed)::

    from topas.experiments import Experiment, run_experiment, run_many

    exp = Experiment("dag-4", "topas", {"beta": 0.5}, load=1.2, seed=0, n_tasks=200)
    result = run_experiment(exp)                  # a SimResult (tables + summary)
    rows = run_many([exp, ...], jobs=None)        # one summary row per experiment, in order

The Parquet results store, resumable sweeps and Ray come with a later issue; they key results
by :meth:`Experiment.key`.
"""

from topas.experiments.local import ExperimentFailed, run_many, run_row
from topas.experiments.spec import (
    Experiment,
    ExperimentError,
    available_traces,
    prepare,
    resolve_trace_path,
    run_experiment,
)

__all__ = [
    "Experiment",
    "ExperimentError",
    "ExperimentFailed",
    "available_traces",
    "prepare",
    "resolve_trace_path",
    "run_experiment",
    "run_many",
    "run_row",
]
