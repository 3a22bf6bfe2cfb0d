"""Capacity of a policy on a workload, and loads defined from it.

A load of "1.2x" the trace's nominal rate means little by itself: one policy may run far below
its capacity there while another is already overloaded. This module measures each policy's
capacity on the simulator and expresses operating points as fractions of the best baseline's.

**Capacity = the largest stable arrival rate** (:func:`stable_capacity`, the number
:func:`capacity_table` reports and :func:`operating_points` uses). Run ``N`` tasks at ``1x``
nominal; double the load while the run is stable, halve it while it is not, then bisect the
bracket ``steps`` times. A run is *stable* (:func:`is_stable`) when both indicators say so:

* last-quarter / first-quarter mean JCT by arrival (:func:`stability_ratio`) at most 1.5: a
  growing queue makes late tasks wait longer than early ones. Blind to a policy that starves
  old tasks (LPM at 2x nominal on DAG-4: ratio 0.86 with a mean JCT 4x the 1x one);
* completions / arrivals over the arrival window after warm-up (:func:`completion_ratio`) at
  least 0.9: an overloaded engine completes at its own rate, whatever it starves.

The answer is the largest load found stable (conservative); the table also gives the smallest
found unstable. Resolution: 1/16 of nominal from a [1, 2] bracket with 4 steps, but a run of
``N`` tasks cannot tell an overload of a few percent from a stable load (the queue grows too
slowly), so small ``N`` overestimates; see ``docs/capacity.md`` for the effect of ``N``.

**Deep-queue throughput** (:func:`saturated_throughput`, reported beside it). Run at ``L_sat``
(default 4x nominal) so that a queue is always present, and measure completions per second in
the steady window between the 25% and 75% completion quantiles (leaving out warm-up and drain),
as a count of tasks (``count``) and work-normalised (the unloaded service time of the requests
finished in the window per second, divided by a task's mean: robust to a policy finishing cheap
tasks first or draining tasks whose early stages ran before the window). **It is not the
capacity on this engine**: throughput under a deep queue depends on ``L_sat`` and is often
*lower* than the largest stable rate (congestion collapse: with many tasks admitted, all agents'
prefixes and many reservations compete for the KV pool; Parrot-FCFS on DAG-4 sustains ~0.85-1.1x
nominal but completes 0.71-0.96x under a deep queue), and for FCFS it grows with ``L_sat``
(0.96x at 1.5x, 1.38x at 6x, work-normalised). Use it to see how a policy degrades in overload.

``x nominal`` divides by the trace's ``meta["rate"]``, the unit of ``Experiment(load=...)``.
Every run goes through the results store (:func:`topas.experiments.run_sweep`), so a table is
cached and a killed measurement resumes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Generator, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from topas.engine.metrics import completion_ratio, stability_ratio
from topas.experiments.result_store import ResultStore
from topas.experiments.solo import chunk_size, stage_solo_time
from topas.experiments.spec import Experiment, ExperimentError, prepare, run_experiment
from topas.experiments.sweep import run_sweep
from topas.sets import PAPER_BASELINES

__all__ = [
    "DEFAULT_LOAD_SAT",
    "DEFAULT_TASKS",
    "STABLE_RATIO",
    "CapacityEstimate",
    "StableCapacity",
    "stable_capacity",
    "stable_capacities",
    "capacity_experiment",
    "estimate_from_tables",
    "saturated_throughput",
    "capacity_table",
    "operating_points",
    "operating_experiments",
    "MIN_COMPLETION",
    "completion_ratio",
    "is_stable",
    "stability_ratio",
    "stability_table",
]

#: The baselines whose best defines "the best baseline's capacity".
#: Saturating load (multiple of the nominal rate): above every policy's capacity on every trace
#: shipped (the highest measured is below 3x, docs/capacity.md).
DEFAULT_LOAD_SAT = 4.0
#: Tasks per capacity run (docs/capacity.md: how the estimate moves with N).
DEFAULT_TASKS = 200
#: A run whose last-quarter / first-quarter mean JCT exceeds this is called unstable.
STABLE_RATIO = 1.5
#: ... and so is one that completes less than this share of what arrives (:func:`completion_ratio`).
MIN_COMPLETION = 0.9


@dataclass(frozen=True)
class CapacityEstimate:
    """One policy's saturated throughput on one workload (see the module docstring)."""

    workload: str
    policy: str
    #: the reported capacity: work-normalised tasks/s over the steady window
    tasks_per_s: float
    #: tasks completed per second over the steady window (biased up for size-based policies)
    count_tasks_per_s: float
    #: the trace's nominal rate (tasks/s), the unit of ``load``
    nominal_rate: float
    load_sat: float
    n_tasks: int
    seed: int
    #: the steady window [t_lo, t_hi] (s) and the completion quantiles that bound it
    window: tuple[float, float]
    quantiles: tuple[float, float]
    #: tasks still waiting or running at t_hi (a queue must be present for the window to count)
    in_system_at_end: int
    key: str = ""

    @property
    def x_nominal(self) -> float:
        return self.tasks_per_s / self.nominal_rate

    @property
    def count_x_nominal(self) -> float:
        return self.count_tasks_per_s / self.nominal_rate


def capacity_experiment(workload: str, policy: str, n_tasks: int = DEFAULT_TASKS, seed: int = 0,
                        load_sat: float = DEFAULT_LOAD_SAT, params: Mapping[str, Any] | None = None,
                        engine_options: Mapping[str, Any] | None = None, **kw: Any) -> Experiment:
    """The experiment a capacity measurement runs (stock engine unless ``engine_options``)."""
    return Experiment(workload, policy, dict(params or {}), load=load_sat, seed=seed, n_tasks=n_tasks,
                      engine_options=dict(engine_options or {}), **kw)


def estimate_from_tables(exp: Experiment, tasks: pd.DataFrame, requests: pd.DataFrame,
                         quantiles: tuple[float, float] = (0.25, 0.75)) -> CapacityEstimate:
    """The capacity estimate of a finished saturated run of ``exp`` from its ``tasks`` and
    ``requests`` tables (:class:`~topas.engine.metrics.SimResult`)."""
    q_lo, q_hi = quantiles
    if not 0 <= q_lo < q_hi <= 1:
        raise ValueError(f"quantiles must satisfy 0 <= lo < hi <= 1, got {quantiles!r}")
    n = len(tasks)
    if n < 8:
        raise ValueError(f"{exp.label()}: {n} tasks are too few to find a steady window (need >= 8)")
    p = prepare(exp)
    if not p.nominal_rate:
        raise ExperimentError(f"workload {exp.workload!r} has no nominal meta['rate']: cannot express capacity in x nominal")
    finish = np.sort(tasks["finish"].to_numpy(dtype=float))
    i_lo, i_hi = int(math.floor(q_lo * (n - 1))), int(math.ceil(q_hi * (n - 1)))
    t_lo, t_hi = float(finish[i_lo]), float(finish[i_hi])
    if not t_hi > t_lo:
        raise ValueError(f"{exp.label()}: the steady window is empty (t_lo = t_hi = {t_lo})")
    count = (i_hi - i_lo) / (t_hi - t_lo)
    # work-normalised: unloaded service time of the requests finished inside the window
    chunk = chunk_size(p.cost, p.config)
    agents = p.trace.agents
    solo = {}
    for task in p.trace.tasks:
        for s in task.stages:
            solo[f"{task.id}/{s.id}"] = stage_solo_time(p.cost, s, agents[s.agent].prefix_tokens, chunk)
    mean_task_work = sum(solo.values()) / len(p.trace.tasks)
    fin = requests["finish"].to_numpy(dtype=float)
    inside = (fin > t_lo) & (fin <= t_hi)
    served = float(sum(solo[r] for r in requests["rid"][inside]))
    work_rate = served / (t_hi - t_lo) / mean_task_work
    arrivals = tasks["arrival"].to_numpy(dtype=float)
    in_system = int(((arrivals <= t_hi) & (tasks["finish"].to_numpy(dtype=float) > t_hi)).sum())
    return CapacityEstimate(exp.workload, exp.policy, work_rate, count, float(p.nominal_rate),
                            float(exp.load), n, exp.seed, (t_lo, t_hi), (q_lo, q_hi), in_system, exp.key())


def saturated_throughput(workload: str, policy: str, n_tasks: int = DEFAULT_TASKS, seed: int = 0,
                         load_sat: float = DEFAULT_LOAD_SAT, params: Mapping[str, Any] | None = None,
                         engine_options: Mapping[str, Any] | None = None, store: Any = None,
                         quantiles: tuple[float, float] = (0.25, 0.75), progress: bool = False
                         ) -> CapacityEstimate:
    """Measure ``policy``'s saturated throughput on ``workload`` (the module docstring's method):
    one run at ``load_sat`` x nominal with ``n_tasks`` tasks, arrival seed ``seed``; the result
    is read from / written to ``store`` (see :func:`topas.experiments.run_sweep`; ``False``: no
    store, the run is not kept)."""
    exp = capacity_experiment(workload, policy, n_tasks, seed, load_sat, params, engine_options)
    return _estimates([exp], store, quantiles, progress)[0]


def _estimates(exps: Sequence[Experiment], store: Any, quantiles: tuple[float, float],
               progress: bool) -> list[CapacityEstimate]:
    if store is False:
        out = []
        for e in exps:
            r = run_experiment(e)
            out.append(estimate_from_tables(e, r.tasks, r.requests, quantiles))
        return out
    st = store if isinstance(store, ResultStore) else ResultStore(store)
    run_sweep(exps, st, jobs=1, progress=progress, desc="capacity")
    return [estimate_from_tables(e, st.load_table(e, "tasks"), st.load_table(e, "requests"), quantiles)
            for e in exps]


@dataclass(frozen=True)
class StableCapacity:
    """The largest load found stable and the smallest found unstable (multiples of nominal),
    with every probe: ``(load, last/first quarter JCT, completion ratio)``."""

    workload: str
    policy: str
    lo: float
    hi: float
    nominal_rate: float
    n_tasks: int
    seed: int
    probes: tuple[tuple[float, float, float], ...]

    @property
    def x_nominal(self) -> float:
        """The capacity estimate: ``lo``, the largest load seen stable (conservative: a fraction
        ``f <= 1`` of it is a load the policy sustained)."""
        return self.lo

    @property
    def tasks_per_s(self) -> float:
        return self.lo * self.nominal_rate


def stable_capacity(workload: str, policy: str, n_tasks: int = DEFAULT_TASKS, seed: int = 0,
                    start: float = 1.0, steps: int = 4, unstable_above: float = STABLE_RATIO,
                    min_completion: float = MIN_COMPLETION,
                    max_load: float = 16.0, min_load: float = 1 / 16, params: Mapping[str, Any] | None = None,
                    engine_options: Mapping[str, Any] | None = None, store: Any = None,
                    progress: bool = False) -> StableCapacity:
    """The largest stable load of ``policy`` on ``workload`` (multiple of nominal), by search:
    run ``n_tasks`` tasks at ``start`` x nominal; double the load while the run is stable
    (:func:`is_stable`), halve it while it is not, until a
    stable and an unstable load bracket the capacity; then bisect the bracket ``steps`` times
    (the bracket's width halves each time: from [1, 2], 4 steps leave 1/16 of nominal). Assumes
    stability is monotone in the load; a noisy indicator near the threshold can make the answer
    land anywhere inside the region where runs are borderline. Runs are cached in ``store``.
    ``lo`` is ``min_load`` when even that is unstable, ``hi`` is ``inf`` when ``max_load`` is stable."""
    (c,) = stable_capacities([(workload, policy, seed)], n_tasks, start, steps, unstable_above, min_completion,
                             max_load, min_load, params, engine_options, store, progress, jobs=1)
    return c


def _search(start: float, steps: int, max_load: float, min_load: float) -> Generator[float, bool, tuple[float, float]]:
    """The doubling/halving-then-bisection search of :func:`stable_capacity` as a coroutine: it
    yields the next load to probe, is sent whether that load was stable, and returns ``(lo, hi)``."""
    lo, hi = 0.0, math.inf
    load = float(start)
    if (yield load):
        lo = load
        while hi == math.inf and load < max_load:
            load = min(2 * load, max_load)
            if (yield load):
                lo = load
            else:
                hi = load
    else:
        hi = load
        while lo == 0.0 and load > min_load:
            load = max(load / 2, min_load)
            if (yield load):
                lo = load
            else:
                hi = load
        if lo == 0.0:
            lo = min_load
    if math.isfinite(hi):
        for _ in range(steps):
            mid = 0.5 * (lo + hi)
            if (yield mid):
                lo = mid
            else:
                hi = mid
    return lo, hi


def stable_capacities(cases: Sequence[tuple[str, str, int]], n_tasks: int = DEFAULT_TASKS, start: float = 1.0,
                      steps: int = 4, unstable_above: float = STABLE_RATIO, min_completion: float = MIN_COMPLETION,
                      max_load: float = 16.0, min_load: float = 1 / 16, params: Mapping[str, Any] | None = None,
                      engine_options: Mapping[str, Any] | None = None, store: Any = None,
                      progress: bool = False, jobs: int | None = None) -> list[StableCapacity]:
    """:func:`stable_capacity` for every ``(workload, policy, seed)`` of ``cases`` at once: the
    searches advance in lockstep, each round's probes running as one sweep (``jobs`` worker
    processes, ``None``: one per core), so independent searches use every core. The same probes
    and results as one search at a time."""
    st = store if isinstance(store, ResultStore) else ResultStore(store)
    searches = {i: _search(start, steps, max_load, min_load) for i in range(len(cases))}
    probes: dict[int, list[tuple[float, float, float]]] = {i: [] for i in searches}
    pending = {i: next(g) for i, g in searches.items()}
    done: dict[int, tuple[float, float]] = {}
    rounds = 0
    while pending:
        rounds += 1
        exps = {i: Experiment(cases[i][0], cases[i][1], dict(params or {}), load=round(load, 6), seed=cases[i][2],
                              n_tasks=n_tasks, engine_options=dict(engine_options or {}))
                for i, load in pending.items()}
        run_sweep(list(exps.values()), st, jobs=jobs, progress=progress, desc=f"capacity round {rounds}",
                  tables=False)
        nxt = {}
        for i, e in exps.items():
            ratio, completion = indicators(st, e)
            probes[i].append((round(pending[i], 6), ratio, completion))
            try:
                nxt[i] = searches[i].send(stable_by(ratio, completion, unstable_above, min_completion))
            except StopIteration as stop:
                done[i] = stop.value
        pending = nxt
    out = []
    for i, (w, p, seed) in enumerate(cases):
        nominal = Experiment(w, p, load=1.0).resolve_rate()
        out.append(StableCapacity(w, p, done[i][0], done[i][1], float(nominal), n_tasks, seed, tuple(probes[i])))
    return out


def capacity_table(workloads: Sequence[str], policies: Sequence[str] = PAPER_BASELINES + ("topas",),
                   n_tasks: int = DEFAULT_TASKS, seeds: Sequence[int] = (0,),
                   load_sat: float | None = DEFAULT_LOAD_SAT, steps: int = 4,
                   engine_options: Mapping[str, Any] | None = None, store: Any = None,
                   baselines: Sequence[str] = PAPER_BASELINES, unstable_above: float = STABLE_RATIO,
                   over_seeds: str = "min", progress: bool = True) -> pd.DataFrame:
    """Capacities of ``policies`` on ``workloads``, one row per pair (over ``seeds``: the
    ``over_seeds`` of each column, ``"min"`` (default: conservative, a load below it was stable
    for every arrival sample) or ``"mean"``):

    * ``capacity x nominal`` / ``capacity tasks/s``: the largest load found stable
      (:func:`stable_capacity`, ``steps`` bisection steps), and ``unstable at`` the smallest
      load found unstable (the bracket);
    * ``saturated x nominal`` and ``saturated count x nominal``: the work-normalised and
      count-based throughput under a deep queue at ``load_sat`` (:func:`saturated_throughput`;
      ``load_sat=None`` skips them);
    * ``best baseline`` (highest capacity among ``baselines`` present) and ``fraction of best
      baseline``; ``runs`` (simulations behind the row), ``wall_s`` (their simulated wall time).

    Every spec is checked before anything runs: a bad workload or policy name raises
    (:class:`~topas.experiments.ExperimentError` / :class:`~topas.policies.base.PolicyError`)
    naming it. Runs are cached in ``store`` (see :func:`topas.experiments.run_sweep`)."""
    if over_seeds not in ("min", "mean"):
        raise ValueError(f"over_seeds must be 'min' or 'mean', got {over_seeds!r}")
    for w in workloads:
        for p in policies:
            capacity_experiment(w, p, n_tasks, 0, load_sat or DEFAULT_LOAD_SAT, None, engine_options).key()
    st = store if isinstance(store, ResultStore) else ResultStore(store)
    pairs = [(w, p) for w in workloads for p in policies]
    rows = []
    cases = [(w, p, s) for w, p in pairs for s in seeds]
    found = stable_capacities(cases, n_tasks, steps=steps, unstable_above=unstable_above,
                              engine_options=engine_options, store=st, progress=progress)
    for (w, p, s), c in zip(cases, found):
        exps = [Experiment(w, p, load=l, seed=s, n_tasks=n_tasks, engine_options=dict(engine_options or {}))
                for l, *_ in c.probes]
        row = {"workload": w, "policy": p, "seed": s, "capacity x nominal": c.x_nominal,
               "capacity tasks/s": c.tasks_per_s, "unstable at": c.hi, "nominal rate": c.nominal_rate}
        if load_sat is not None:
            e = saturated_throughput(w, p, n_tasks, s, load_sat, engine_options=engine_options, store=st)
            row["saturated x nominal"] = e.x_nominal
            row["saturated count x nominal"] = e.count_x_nominal
            exps.append(capacity_experiment(w, p, n_tasks, s, load_sat, None, engine_options))
        row["runs"] = len(exps)
        row["wall_s"] = sum(float(st.meta(e)["summary"].get("sim_wall_s", 0.0)) for e in exps)
        rows.append(row)
    df = pd.DataFrame(rows)
    cols = [c for c in df.columns if c not in ("workload", "policy", "seed", "nominal rate", "runs", "wall_s")]
    table = (df.groupby(["workload", "policy"], sort=False)
             .agg(**{c: (c, over_seeds) for c in cols}, **{"nominal rate": ("nominal rate", "first"),
                  "seeds": ("seed", "nunique"), "runs": ("runs", "sum"), "wall_s": ("wall_s", "sum")})
             .reset_index())
    best, frac = [], []
    for w, cap in zip(table["workload"], table["capacity x nominal"]):
        base = table[(table["workload"] == w) & table["policy"].isin(baselines)]
        if base.empty:
            best.append(None)
            frac.append(float("nan"))
            continue
        b = base.loc[base["capacity x nominal"].idxmax()]
        best.append(b["policy"])
        frac.append(cap / b["capacity x nominal"])
    table["best baseline"] = best
    table["fraction of best baseline"] = frac
    table["n_tasks"] = n_tasks
    return table


def operating_points(capacities: pd.DataFrame, fractions: Sequence[float] = (0.5, 0.8, 0.95),
                     beyond: Sequence[float] = (1.2,), baselines: Sequence[str] = PAPER_BASELINES) -> pd.DataFrame:
    """Loads defined from the best baseline's capacity: for each workload of ``capacities`` (a
    :func:`capacity_table`) and each fraction ``f`` in ``fractions`` (stable points) and
    ``beyond`` (overload), the ``load`` (multiple of the nominal rate, as
    :class:`~topas.experiments.Experiment` takes it) = ``f`` x the best baseline's capacity in
    x nominal. Columns: ``workload``, ``fraction``, ``regime`` (``below``/``beyond``), ``load``,
    ``rate`` (tasks/s), ``best baseline``, ``best capacity x nominal``."""
    for f in (*fractions, *beyond):
        if not (isinstance(f, (int, float)) and f > 0):
            raise ValueError(f"fractions must be positive numbers, got {f!r}")
    rows = []
    for w in dict.fromkeys(capacities["workload"]):
        base = capacities[(capacities["workload"] == w) & capacities["policy"].isin(baselines)]
        if base.empty:
            raise ValueError(f"workload {w!r}: no baseline ({', '.join(baselines)}) in the capacity table")
        b = base.loc[base["capacity x nominal"].idxmax()]
        for regime, fs in (("below", fractions), ("beyond", beyond)):
            for f in fs:
                rows.append({"workload": w, "fraction": float(f), "regime": regime,
                             "load": round(float(f) * float(b["capacity x nominal"]), 4),
                             "rate": float(f) * float(b["capacity tasks/s"]),
                             "best baseline": b["policy"], "best capacity x nominal": float(b["capacity x nominal"])})
    return pd.DataFrame(rows)


def operating_experiments(points: pd.DataFrame, policies: Sequence[str] = PAPER_BASELINES + ("topas",),
                          n_tasks: int = 1000, seeds: Sequence[int] = (0,), **kw: Any) -> list[Experiment]:
    """The experiments of ``policies`` at every operating point of ``points``
    (:func:`operating_points`), ``n_tasks`` tasks, arrival seeds ``seeds``; ``kw`` goes to
    :class:`~topas.experiments.Experiment` (e.g. ``engine_options``)."""
    return [Experiment(r["workload"], p, load=r["load"], seed=s, n_tasks=n_tasks, **kw)
            for r in points.to_dict("records") for p in policies for s in seeds]


def indicators(store: Any, e: Experiment) -> tuple[float, float]:
    """``(last/first quarter JCT, completion ratio)`` of a stored run: from its summary (every
    run since issue 13 records both), else from its tasks table."""
    summary = store.meta(e)["summary"]
    if "jct_last_first_quarter" in summary and "completion_ratio" in summary:
        return float(summary["jct_last_first_quarter"]), float(summary["completion_ratio"])
    tasks = store.load_table(e, "tasks")
    return stability_ratio(tasks), completion_ratio(tasks)


def stable_by(ratio: float, completion: float, unstable_above: float = STABLE_RATIO,
              min_completion: float = MIN_COMPLETION) -> bool:
    """:func:`is_stable` from the two indicators."""
    return ratio <= unstable_above and completion >= min_completion


def is_stable(tasks: pd.DataFrame, unstable_above: float = STABLE_RATIO,
              min_completion: float = MIN_COMPLETION) -> bool:
    """A run is stable when its last/first quarter JCT is at most ``unstable_above`` and it
    completes at least ``min_completion`` of what arrives after warm-up (:func:`completion_ratio`;
    with 0.9 an overload of about 10% or more is caught, less may pass as stable)."""
    return stable_by(stability_ratio(tasks), completion_ratio(tasks), unstable_above, min_completion)


def stability_table(experiments: Iterable[Experiment], store: Any = None,
                    unstable_above: float = STABLE_RATIO, min_completion: float = MIN_COMPLETION) -> pd.DataFrame:
    """The stability indicators of each stored run of ``experiments`` (run them first, e.g. with
    :func:`topas.experiments.run_sweep`): ``workload``, ``policy``, ``load``, ``seed``, ``key``,
    ``jct_mean``, ``last/first quarter JCT`` (:func:`stability_ratio`), ``completion ratio``
    (:func:`completion_ratio`) and ``stable`` (:func:`is_stable`)."""
    st = store if isinstance(store, ResultStore) else ResultStore(store)
    rows = []
    for e in experiments:
        ratio, completion = indicators(st, e)
        rows.append({"workload": e.workload, "policy": e.policy, "load": e.load, "seed": e.seed,
                     "key": e.key(), "jct_mean": float(st.meta(e)["summary"]["jct_mean"]),
                     "last/first quarter JCT": ratio, "completion ratio": completion,
                     "stable": stable_by(ratio, completion, unstable_above, min_completion)})
    return pd.DataFrame(rows)
