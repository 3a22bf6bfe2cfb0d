"""The protocol's final runs: capacity with intervals, paired latency verdicts, overload, and the
run-length convergence study behind them (notebook 16; docs/protocol.md).

**One grid serves every claim.** Per workload and policy, the loads of :attr:`ProtocolSize.loads`
are run in ascending order on the first :attr:`ProtocolSize.n_seeds` evaluation seeds, each run
:attr:`ProtocolSize.n_tasks` tasks long. Every (policy, load, seed) sees the same arrivals
(common random numbers). The same runs give:

* **capacity** (:func:`capacity_rows`): the steady-state test per (policy, load) over the seeds
  (:mod:`topas.experiments.protocol.steady`), then the grid capacity with its bracket and the
  spread of the seeds' own capacities (:func:`topas.experiments.protocol.grid_capacity.grid_capacity`);
* **latency** (:func:`latency_rows`): at every grid load within the capacity of both compared
  policies (stable there and at every lower grid load, every seed), the candidate against the best
  baseline within its capacity there (lowest seeds' mean JCT, a choice that favours the
  baseline), paired over the seeds: a t interval for the mean JCT, a BCa bootstrap for p99
  (:mod:`topas.experiments.protocol.paired`);
* **overload** (:func:`overload_rows`): the first grid load above each policy's capacity, labelled
  overload, with what its runs complete and how fast their queues grow; never a latency claim.

**The stopping rule**: a (workload, policy) stops ascending after the first load at which any
seed's run fails the test. The capacity needs every seed (``min_fraction`` 1) stable at it and
at every lower load, so that load is the capacity's upper bracket and no higher load can change
the capacity, its bracket, a latency row (loads within capacity only) or the overload row (the
first load past capacity, which is run on every seed): the rule saves the runs deep in overload,
the slowest to simulate. What it gives up is the seeds' spread above that load: ``seed_high`` is
censored at the stopping load (a seed still stable there reads as that load). The first pass of
the final runs used a rule that ascended until every seed had failed (uncensored ``seed_high``);
it was replaced during the runs, for time (docs/protocol.md).

**Evidence, cached.** The test reads each run's tasks table; the per-run evidence (per indicator:
observations, MSER-5 warm-up, batch-means slope and its one-sided p-value) is kept in a CSV keyed
by the run's experiment key (:data:`EVIDENCE_COLUMNS`; ``data/results/protocol/evidence.csv`` for
the default store), so the results pack ships these runs' summaries only and ``make figures``
re-renders from the summaries and the cached evidence. A cached row whose mean JCT disagrees with
its run's stored summary is an error naming the run. The cache is shared by every study's long runs
(the eviction study's full-length stage writes its rows there too, :mod:`studies.eviction.full_length`):
each row names its run's ``engine_options`` (``{}``, :data:`DEFAULT_ENGINE`, for every run of this
grid), :func:`seed_verdicts` never pools runs of different engine options, and a reader of this
grid's rows alone keeps the default engine's (:func:`default_engine_rows`).

Sizes: :data:`FULL` (``make reproduce``) and :data:`QUICK` (the notebook's quick run, for tests).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from topas.experiments.protocol.grid_capacity import grid_capacity
from topas.experiments.protocol.paired import compare_latency
from topas.experiments.protocol.seeds import EVALUATION_SEEDS, first
from topas.experiments.protocol.steady import ALPHA, INDICATORS, N_BATCHES, growth_test, run_series
from topas.experiments.spec import Experiment
from topas.sets import CANDIDATES, GUARDED_BASELINES, HELD_OUT, IN_SAMPLE, METAGPT, PROTOCOL_BASELINES

__all__ = [
    "CAPACITY_COLUMNS",
    "CONVERGENCE_COLUMNS",
    "DEFAULT_ENGINE",
    "EVIDENCE_COLUMNS",
    "FULL",
    "LATENCY_COLUMNS",
    "OVERLOAD_COLUMNS",
    "QUICK",
    "QUICK_PER_NOTEBOOK",
    "TEST_VERSION",
    "ProtocolSize",
    "capacity_grid_runs",
    "capacity_rows",
    "convergence_experiments",
    "convergence_rows",
    "default_engine_rows",
    "default_evidence_path",
    "engine_options_of",
    "quick_evidence_path",
    "read_evidence",
    "evidence_for",
    "grid_bound",
    "latency_rows",
    "overload_rows",
    "protocol_runs",
    "protocol_size",
    "protocol_tables",
    "restricted",
    "run_evidence",
    "sample_of",
    "seed_verdicts",
]


def _loads(low: float, high: float, step: float) -> tuple[float, ...]:
    n = int(round((high - low) / step))
    return tuple(round(low + i * step, 6) for i in range(n + 1))


@dataclass(frozen=True)
class ProtocolSize:
    """How much the protocol runs (docs/protocol.md gives the numbers and why)."""

    workloads: tuple[str, ...]
    policies: tuple[str, ...]
    #: the load grid, ascending, in multiples of each trace's nominal rate
    loads: tuple[float, ...]
    n_seeds: int
    #: tasks per run, per workload (a run of n tasks is the first n of the trace)
    n_tasks: Mapping[str, int]
    #: the convergence study: workload, policies, loads and run lengths
    convergence_workload: str = "dag-4-10k"
    convergence_policies: tuple[str, ...] = ("lpm", "topas-plus", "topas")
    convergence_loads: tuple[float, ...] = (1.0, 1.25)
    convergence_lengths: tuple[int, ...] = (500, 1000, 2000)
    alpha: float = ALPHA
    seeds: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "seeds", tuple(first(EVALUATION_SEEDS, self.n_seeds, "evaluation seeds")))
        if list(self.loads) != sorted(set(self.loads)) or not self.loads:
            raise ValueError(f"ProtocolSize: the load grid must be ascending without repeats, got {self.loads}")
        missing = [w for w in self.workloads if w not in self.n_tasks]
        if missing:
            raise ValueError(f"ProtocolSize: no run length for {', '.join(missing)}")


#: ``make reproduce``: 5 seeds, loads 0.75-2.0 x nominal in steps of 0.125, 1,000 tasks per run
#: (600 on the MetaGPT traces, whose runs have ~27 requests per task).
#: The held-out random workflows are not in the shipped grid: with ten policies their grid did not
#: fit the reproduction's time (docs/protocol.md, "The final runs"); ``restricted``/``ProtocolSize``
#: run them on request.
FULL_WORKLOADS = IN_SAMPLE + METAGPT
FULL = ProtocolSize(
    workloads=FULL_WORKLOADS,
    policies=PROTOCOL_BASELINES + GUARDED_BASELINES + CANDIDATES,
    loads=_loads(0.75, 2.0, 0.125),
    n_seeds=5,
    n_tasks={**{w: 1000 for w in IN_SAMPLE}, "metagpt-sop": 600, "metagpt-tl": 600,
             **{w: 1000 for w in HELD_OUT if w.startswith("random-dag")}},
)
#: The notebook's quick run: two workloads, three policies, a coarse grid, 2 seeds of 100 tasks.
QUICK = ProtocolSize(
    workloads=("chain-3", "random-dag-1000"),
    policies=("fcfs", "lpm", "lpm-guarded", "topas-plus"),
    loads=(0.5, 1.0, 1.5, 2.0),
    n_seeds=2,
    n_tasks={"chain-3": 100, "random-dag-1000": 100},
    convergence_workload="dag-4-10k",
    convergence_policies=("lpm",),
    convergence_loads=(1.0,),
    convergence_lengths=(100, 200),
)


def protocol_size(quick: bool) -> ProtocolSize:
    return QUICK if quick else FULL


# --------------------------------------------------------------------------------------------
# Per-run evidence

#: One row per run: its key and spec (``engine_options``: :func:`engine_options_of`), its summary's
#: JCT and completion, and per indicator (see :data:`topas.experiments.protocol.steady.INDICATORS`)
#: the slope test's inputs and p-value.
EVIDENCE_COLUMNS = ("key", "test", "workload", "policy", "engine_options", "load", "seed", "n_tasks", "finished", "completion_ratio",
                    "jct_mean", "jct_p99", "throughput_rps") + tuple(
    f"{ind}_{c}" for ind in INDICATORS for c in ("n", "warmup", "slope", "p_value", "growth"))


#: The version of the per-run test the cached evidence was computed with (the ``test`` column): a
#: cached row of another version is recomputed from its run's tasks table.
TEST_VERSION = "rate-adjusted-1"

#: The ``engine_options`` of a run of the default engine (every run of the protocol's grid; the
#: cache's rows written before the column existed were all such runs).
DEFAULT_ENGINE = "{}"


def engine_options_of(exp: Experiment) -> str:
    """A run's engine options as the cache writes them: compact JSON, keys sorted (:data:`DEFAULT_ENGINE`
    for the default engine)."""
    return json.dumps(dict(exp.engine_options), sort_keys=True, separators=(",", ":"))


def _engine_options(evidence: pd.DataFrame) -> pd.Series:
    """``evidence``'s ``engine_options``, :data:`DEFAULT_ENGINE` where a row (or the whole frame)
    predates the column; as objects, since a column read back all empty is float, which a string
    may not fill."""
    if "engine_options" not in evidence.columns:
        return pd.Series(DEFAULT_ENGINE, index=evidence.index, dtype=object)
    return evidence["engine_options"].astype(object).fillna(DEFAULT_ENGINE)


def read_evidence(path: Path) -> pd.DataFrame:
    """The cached evidence at ``path`` (:data:`EVIDENCE_COLUMNS`; an absent file: no rows), with
    ``engine_options`` filled for rows written before the column existed."""
    frame = pd.read_csv(path) if Path(path).exists() else pd.DataFrame(columns=list(EVIDENCE_COLUMNS))
    if "engine_options" not in frame.columns:
        frame.insert(list(EVIDENCE_COLUMNS).index("engine_options"), "engine_options", DEFAULT_ENGINE)
    frame["engine_options"] = _engine_options(frame)
    return frame


def default_engine_rows(evidence: pd.DataFrame) -> pd.DataFrame:
    """The rows of runs on the default engine (the protocol's grid and the runs sharing its keys):
    what a reader of the protocol's runs keeps of the shared cache."""
    return evidence[_engine_options(evidence) == DEFAULT_ENGINE]


def run_evidence(tasks: pd.DataFrame, summary: Mapping[str, Any], what: str = "run") -> dict[str, Any]:
    """The evidence of one run (:data:`EVIDENCE_COLUMNS` less the spec columns): the slope test of
    each indicator at a placeholder level (the level is applied over seeds later:
    :func:`seed_verdicts`). A run that did not finish every task counts as growing (p-value 0)."""
    row: dict[str, Any] = {"completion_ratio": float(summary["completion_ratio"]),
                           "jct_mean": float(summary["jct_mean"]), "jct_p99": float(summary["jct_p99"]),
                           "throughput_rps": float(summary["throughput_rps"])}
    finished = bool(len(tasks)) and not tasks[["finish", "jct"]].isna().to_numpy().any()
    row["finished"] = finished
    run = run_series(tasks, what) if finished else None
    for ind in INDICATORS:
        if run is not None:
            g = growth_test(run.indicator(ind, what), 0.5, N_BATCHES, f"{what}, {ind}", arrivals=run.arrivals)
            vals = (g.n, g.warmup, g.slope, g.p_value, g.growth)
        else:
            vals = (len(tasks), 0, math.inf, 0.0, math.inf)
        row.update(dict(zip((f"{ind}_{c}" for c in ("n", "warmup", "slope", "p_value", "growth")), vals)))
    return row


def default_evidence_path(store: Any) -> Path:
    """Where the evidence of a store's runs is cached: ``data/results/protocol/evidence.csv`` for the
    default store (committed beside the results pack), else ``protocol_evidence.csv`` in the store."""
    from topas.experiments.store import ResultStore, default_store_root

    root = Path(store.root if isinstance(store, ResultStore) else (store or default_store_root()))
    if root.resolve() == Path(default_store_root()).resolve():
        return root.parent / "protocol" / "evidence.csv"
    return root / "protocol_evidence.csv"


def quick_evidence_path(store: Any, evidence_path: Path | None = None) -> Path:
    """Where a quick run's evidence goes: ``evidence_path`` if given, else ``protocol_evidence.csv``
    in the store (for the default store, git-ignored ``data/results/store/``): a quick run never
    adds rows to the committed ``data/results/protocol/evidence.csv``."""
    from topas.experiments.store import ResultStore, default_store_root

    if evidence_path is not None:
        return Path(evidence_path)
    return Path(store.root if isinstance(store, ResultStore) else (store or default_store_root())) / "protocol_evidence.csv"


def _write_cache(path: Path, frame: pd.DataFrame) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".csv.tmp")
    frame.sort_values(["workload", "policy", "n_tasks", "load", "seed", "key"], kind="stable").to_csv(tmp, index=False)
    os.replace(tmp, path)


def evidence_for(experiments: Sequence[Experiment], store: Any, path: Path | None = None) -> pd.DataFrame:
    """The evidence row of every experiment (stored already), from the cache at ``path`` (default
    :func:`default_evidence_path`) where it holds the run and from the run's tasks table otherwise;
    new rows are added to the cache (written atomically). One row per experiment, in input order."""
    from topas.experiments.store import ResultStore

    store = store if isinstance(store, ResultStore) else ResultStore(store)
    path = Path(path) if path is not None else default_evidence_path(store)
    cache = read_evidence(path)
    if "test" not in cache.columns:
        cache["test"] = None
    cache = cache[cache["test"] == TEST_VERSION]  # evidence of another test version is recomputed
    known = {str(k): r for k, r in zip(cache["key"], cache.to_dict("records"))}
    rows, new = [], []
    for exp in experiments:
        key = exp.key()
        meta = store.meta(key)
        summary = meta["summary"]
        r = known.get(key)
        if r is not None and not math.isclose(float(r["jct_mean"]), float(summary["jct_mean"]), rel_tol=1e-9):
            raise ValueError(f"{path}: the cached evidence of {meta.get('label', key)} has mean JCT {r['jct_mean']}, "
                             f"its stored run {summary['jct_mean']}: delete the row (or the file) to recompute")
        if r is None:
            label = meta.get("label", key)
            r = {"key": key, "test": TEST_VERSION, "workload": exp.workload, "policy": exp.policy,
                 "engine_options": engine_options_of(exp), "load": float(exp.load),
                 "seed": int(exp.seed), "n_tasks": int(exp.n_tasks or summary["n_tasks"]),
                 **run_evidence(store.load_table(key, "tasks"), summary, label)}
            new.append(r)
            known[key] = r
        rows.append(r)
    if new:
        _write_cache(path, pd.concat([cache, pd.DataFrame(new)], ignore_index=True)[list(EVIDENCE_COLUMNS)]
                     if len(cache) else pd.DataFrame(new)[list(EVIDENCE_COLUMNS)])
    return pd.DataFrame(rows, columns=list(EVIDENCE_COLUMNS))


def seed_verdicts(evidence: pd.DataFrame, alpha: float = ALPHA,
                  indicators: Sequence[str] = INDICATORS) -> pd.DataFrame:
    """Per run, whether it grows, tested as :func:`topas.experiments.protocol.steady.steady_state`
    does: at one (workload, policy, engine options, run length, load) with ``k`` seeds, each of the
    ``k x indicators`` p-values against ``alpha / (k x indicators)`` (Bonferroni). Adds ``level``,
    ``growing`` (any indicator) and ``stable_at_load`` (no seed of the group grows)."""
    ev = evidence.copy()
    ev["engine_options"] = _engine_options(ev)
    group = ["workload", "policy", "engine_options", "n_tasks", "load"]
    k = ev.groupby(group)["seed"].transform("nunique")
    ev["level"] = alpha / (k * len(indicators))
    ev["growing"] = np.logical_or.reduce([ev[f"{i}_p_value"] < ev["level"] for i in indicators])
    ev["stable_at_load"] = ~ev.groupby(group)["growing"].transform("any")
    return ev


# --------------------------------------------------------------------------------------------
# The grid, ascending with the stopping rule

def _experiment(workload: str, policy: str, load: float, seed: int, n_tasks: int) -> Experiment:
    return Experiment(workload, policy, {}, load=float(load), seed=int(seed), n_tasks=int(n_tasks))


def capacity_grid_runs(size: ProtocolSize, store: Any = None, evidence_path: Path | None = None,
                       jobs: int | None = None, progress: bool = False) -> pd.DataFrame:
    """Run the grid (module docstring: ascending loads, the stopping rule) and return the evidence
    of every run with :func:`seed_verdicts`' columns. All (workload, policy) pairs still ascending
    run each load together, so the sweep keeps every core busy."""
    from topas.experiments import ResultStore, run_sweep

    store = store if isinstance(store, ResultStore) else ResultStore(store)
    active = [(w, p) for w in size.workloads for p in size.policies]
    failed: dict[tuple[str, str], set[int]] = {wp: set() for wp in active}
    frames = []
    for load in size.loads:
        if not active:
            break
        exps = [_experiment(w, p, load, s, size.n_tasks[w]) for (w, p) in active for s in size.seeds]
        run_sweep(exps, store, jobs=jobs, progress=progress, desc=f"protocol grid, load {load:g}", tables=False)
        ev = seed_verdicts(evidence_for(exps, store, evidence_path), size.alpha)
        frames.append(ev)
        for (w, p), g in ev.groupby(["workload", "policy"], sort=False):
            failed[(w, p)].update(int(s) for s in g.loc[g["growing"], "seed"])
        active = [wp for wp in active if not failed[wp]]
    return pd.concat(frames, ignore_index=True)


# --------------------------------------------------------------------------------------------
# The claims

#: :func:`capacity_rows`: per workload and policy, the capacity, its grid bracket, the seeds'
#: spread, the loads run, whether the workload is held out, and against the best baseline.
CAPACITY_COLUMNS = ("workload", "sample", "policy", "capacity", "lower", "upper", "seed_low", "seed_high",
                    "n_seeds", "n_tasks", "loads_run", "best_baseline", "baseline_capacity", "baseline_upper",
                    "capacity_verdict")


def sample_of(workload: str) -> str:
    """``in-sample`` for a workload TOPAS's defaults and TOPAS+ were selected on (:data:`IN_SAMPLE`), else
    ``held-out``."""
    return "in-sample" if workload in IN_SAMPLE else "held-out"


def _capacity(ev: pd.DataFrame, what: str):
    v = ev[["load", "seed"]].assign(stable=~ev["growing"].to_numpy())
    return grid_capacity(v, 1.0, what=what)


def capacity_rows(evidence: pd.DataFrame, baselines: Sequence[str] = PROTOCOL_BASELINES) -> pd.DataFrame:
    """Capacity per (workload, policy) from :func:`capacity_grid_runs`' evidence, and each
    policy against the workload's best baseline by capacity (the largest capacity; ties: the
    narrower bracket). ``capacity_verdict`` (grid resolution): ``higher`` when the policy's
    capacity is at least the baseline's first rejected load (``upper``), ``lower`` when its own
    first rejected load is at most the baseline's capacity, ``same bracket`` otherwise; the best
    baseline itself says ``best baseline``."""
    rows = []
    for (w, p), g in evidence.groupby(["workload", "policy"], sort=False):
        c = _capacity(g, f"{w}/{p}")
        rows.append({"workload": w, "sample": sample_of(w), "policy": p, "capacity": c.capacity, "lower": c.lower,
                     "upper": c.upper, "seed_low": c.seed_low, "seed_high": c.seed_high, "n_seeds": c.n_seeds,
                     "n_tasks": int(g["n_tasks"].iloc[0]), "loads_run": len(c.loads)})
    out = pd.DataFrame(rows)
    verdicts = []
    for w, g in out.groupby("workload", sort=False):
        base = g[g["policy"].isin(baselines)]
        if base.empty:
            for _ in range(len(g)):
                verdicts.append((None, math.nan, math.nan, "no baseline"))
            continue
        key = base.assign(c=base["capacity"].fillna(0.0)).sort_values(["c", "upper"], ascending=[False, True])
        b = key.iloc[0]
        for r in g.itertuples():
            cap = 0.0 if math.isnan(r.capacity) else r.capacity
            bcap = 0.0 if math.isnan(b["capacity"]) else b["capacity"]
            if r.policy == b["policy"]:
                v = "best baseline"
            elif cap >= b["upper"]:
                v = "higher"
            elif r.upper <= bcap:
                v = "lower"
            else:
                v = "same bracket"
            verdicts.append((b["policy"], b["capacity"], b["upper"], v))
    out[["best_baseline", "baseline_capacity", "baseline_upper", "capacity_verdict"]] = pd.DataFrame(
        verdicts, index=out.index)
    return out[list(CAPACITY_COLUMNS)]


#: :func:`latency_rows`: per (workload, candidate, load within both capacities), the paired
#: comparison with the best baseline there, for the mean JCT (t) and p99 JCT (BCa bootstrap).
LATENCY_COLUMNS = ("workload", "sample", "load", "candidate", "baseline", "n_seeds", "n_tasks", "candidate_jct",
                   "baseline_jct", "jct_diff_s", "jct_low_s", "jct_high_s", "jct_rel_pct", "jct_rel_low_pct",
                   "jct_rel_high_pct", "jct_verdict", "p99_diff_s", "p99_low_s", "p99_high_s", "p99_rel_pct",
                   "p99_rel_low_pct", "p99_rel_high_pct", "p99_verdict", "near_capacity")


def _within_capacity(evidence: pd.DataFrame) -> dict[tuple[str, str], float]:
    return {(w, p): _capacity(g, f"{w}/{p}").capacity for (w, p), g in evidence.groupby(["workload", "policy"])}


def latency_rows(evidence: pd.DataFrame, candidates: Sequence[str] = CANDIDATES,
                 baselines: Sequence[str] = PROTOCOL_BASELINES) -> pd.DataFrame:
    """Latency claims (module docstring). ``near_capacity`` marks, per (workload, candidate), the
    highest load compared: the operating point closest to capacity where the claim is allowed."""
    caps = _within_capacity(evidence)
    rows = []
    for w, gw in evidence.groupby("workload", sort=False):
        for cand in candidates:
            if (w, cand) not in caps:
                continue
            cand_rows = []
            for load, gl in gw.groupby("load", sort=True):
                inside = [p for p in baselines if (w, p) in caps and not math.isnan(caps[(w, p)])
                          and load <= caps[(w, p)] + 1e-9]
                cc = caps[(w, cand)]
                if not inside or math.isnan(cc) or load > cc + 1e-9:
                    continue
                means = {p: gl.loc[gl["policy"] == p, "jct_mean"].mean() for p in inside}
                base = min(inside, key=lambda p: (means[p], p))
                vals = {p: dict(zip(gl.loc[gl["policy"] == p, "seed"].astype(int), gl.loc[gl["policy"] == p, m]))
                        for p in (cand, base) for m in ("jct_mean",)}
                p99 = {p: dict(zip(gl.loc[gl["policy"] == p, "seed"].astype(int), gl.loc[gl["policy"] == p, "jct_p99"]))
                       for p in (cand, base)}
                stable = {cand: True, base: True}  # both within capacity: stable at this load and below
                m = compare_latency(vals, cand, base, stable, float(load), w, "jct_mean")
                t = compare_latency(p99, cand, base, stable, float(load), w, "jct_p99")
                cand_rows.append({
                    "workload": w, "sample": sample_of(w), "load": float(load), "candidate": cand, "baseline": base,
                    "n_seeds": m.n, "n_tasks": int(gl["n_tasks"].iloc[0]),
                    "candidate_jct": float(np.mean(list(vals[cand].values()))),
                    "baseline_jct": float(np.mean(list(vals[base].values()))),
                    "jct_diff_s": m.difference, "jct_low_s": m.low, "jct_high_s": m.high,
                    "jct_rel_pct": 100 * m.relative, "jct_rel_low_pct": 100 * m.relative_low,
                    "jct_rel_high_pct": 100 * m.relative_high, "jct_verdict": m.verdict,
                    "p99_diff_s": t.difference, "p99_low_s": t.low, "p99_high_s": t.high,
                    "p99_rel_pct": 100 * t.relative, "p99_rel_low_pct": 100 * t.relative_low,
                    "p99_rel_high_pct": 100 * t.relative_high, "p99_verdict": t.verdict,
                    "near_capacity": False})
            if cand_rows:
                cand_rows[-1]["near_capacity"] = True
            rows.extend(cand_rows)
    return pd.DataFrame(rows, columns=list(LATENCY_COLUMNS))


#: :func:`overload_rows`: per (workload, policy), the first grid load above its capacity.
OVERLOAD_COLUMNS = ("workload", "sample", "policy", "load", "capacity", "n_growing", "n_seeds", "completion_ratio",
                    "throughput_rps", "jct_mean", "in_system_growth")


def overload_rows(evidence: pd.DataFrame) -> pd.DataFrame:
    """Overload, labelled as such: per (workload, policy) the first grid load above its capacity
    (the one that bounds its bracket): how many seeds' runs grow, the completed share and
    throughput, mean JCT and the fitted growth of the tasks in the system over the kept window
    (seeds' means). Empty for a policy stable at the top of the grid."""
    rows = []
    caps = _within_capacity(evidence)
    for (w, p), g in evidence.groupby(["workload", "policy"], sort=False):
        c = caps[(w, p)]
        above = g[g["load"] > (0.0 if math.isnan(c) else c) + 1e-9]
        if above.empty:
            continue
        load = float(above["load"].min())
        at = above[above["load"] == load]
        rows.append({"workload": w, "sample": sample_of(w), "policy": p, "load": load, "capacity": c,
                     "n_growing": int(at["growing"].sum()), "n_seeds": int(at["seed"].nunique()),
                     "completion_ratio": float(at["completion_ratio"].mean()),
                     "throughput_rps": float(at["throughput_rps"].mean()), "jct_mean": float(at["jct_mean"].mean()),
                     "in_system_growth": float(at["in_system_growth"].replace([np.inf], np.nan).mean())})
    return pd.DataFrame(rows, columns=list(OVERLOAD_COLUMNS))


#: :func:`convergence_rows`: per (policy, load, run length), the verdict over the seeds.
CONVERGENCE_COLUMNS = ("workload", "policy", "load", "n_tasks", "n_seeds", "n_growing", "stable", "jct_mean",
                       "jct_sd", "min_in_system_p", "min_jct_p", "level")


def convergence_experiments(size: ProtocolSize) -> list[Experiment]:
    """The convergence study's runs: every (policy, load, run length, seed) of its grid."""
    return [_experiment(size.convergence_workload, p, l, s, n) for p in size.convergence_policies
            for l in size.convergence_loads for n in size.convergence_lengths for s in size.seeds]


def grid_bound(size: ProtocolSize) -> list[Experiment]:
    """Every run the protocol can make: each (workload, policy, grid load, seed) and the
    convergence study's runs. The stopping rule runs a subset (a pair stops at its first load where
    a seed grows), so this is the most the grid can cost (``make reproduce``'s plan)."""
    return [_experiment(w, p, l, s, size.n_tasks[w]) for w in size.workloads for p in size.policies
            for l in size.loads for s in size.seeds] + convergence_experiments(size)


def convergence_rows(size: ProtocolSize, store: Any = None, evidence_path: Path | None = None,
                     jobs: int | None = None, progress: bool = False) -> pd.DataFrame:
    """The convergence study: every (policy, load, run length, seed) of the size's convergence
    grid, tested over the seeds per (policy, load, run length)."""
    from topas.experiments import ResultStore, run_sweep

    store = store if isinstance(store, ResultStore) else ResultStore(store)
    exps = convergence_experiments(size)
    run_sweep(exps, store, jobs=jobs, progress=progress, desc="protocol convergence", tables=False)
    ev = seed_verdicts(evidence_for(exps, store, evidence_path), size.alpha)
    rows = []
    for (p, l, n), g in ev.groupby(["policy", "load", "n_tasks"], sort=False):
        rows.append({"workload": size.convergence_workload, "policy": p, "load": float(l), "n_tasks": int(n),
                     "n_seeds": int(g["seed"].nunique()), "n_growing": int(g["growing"].sum()),
                     "stable": bool(g["stable_at_load"].iloc[0]), "jct_mean": float(g["jct_mean"].mean()),
                     "jct_sd": float(g["jct_mean"].std(ddof=1)) if len(g) > 1 else math.nan,
                     "min_in_system_p": float(g["in_system_p_value"].min()), "min_jct_p": float(g["jct_p_value"].min()),
                     "level": float(g["level"].iloc[0])})
    return pd.DataFrame(rows, columns=list(CONVERGENCE_COLUMNS))


def protocol_tables(quick: bool = False, store: Any = None, evidence_path: Path | None = None,
                    workloads: Iterable[str] | None = None, jobs: int | None = None,
                    progress: bool = False) -> dict[str, pd.DataFrame]:
    """Run (or read from the store) the protocol's grid and convergence study and build every table:
    ``runs`` (the evidence with the verdicts), ``capacity``, ``latency``, ``overload``,
    ``convergence``. ``workloads``: a subset of the size's (e.g. the traces present)."""
    size = protocol_size(quick)
    if workloads is not None:
        size = restricted(size, (w for w in size.workloads if w in set(workloads)))
    if quick:
        evidence_path = quick_evidence_path(store, evidence_path)
    runs = capacity_grid_runs(size, store, evidence_path, jobs, progress)
    guarded = [b for b in GUARDED_BASELINES if b in size.policies]
    return {"runs": runs, "capacity": capacity_rows(runs), "latency": latency_rows(runs),
            # the same claims against the guarded baselines (each candidate, and each stock baseline)
            "capacity_guarded": capacity_rows(runs, guarded),
            "latency_guarded": latency_rows(runs, baselines=guarded),
            "overload": overload_rows(runs), "convergence": convergence_rows(size, store, evidence_path, jobs, progress)}


#: The quick run of the notebooks that read the protocol's grid for their own workloads
#: (:func:`protocol_runs`): four policies, one load, 2 seeds of 60 tasks (MetaGPT: 40).
QUICK_PER_NOTEBOOK = {"policies": ("fcfs", "lpm", "topas", "topas-plus"), "loads": (1.0,), "n_seeds": 2,
                      "n_tasks": 60, "metagpt_tasks": 40}


def restricted(size: ProtocolSize, workloads: Iterable[str]) -> ProtocolSize:
    """``size`` on ``workloads`` only (its run lengths); ``ValueError`` naming a workload it does not run."""
    workloads = tuple(dict.fromkeys(workloads))
    unknown = [w for w in workloads if w not in size.workloads]
    if unknown:
        raise ValueError(f"the protocol's grid does not run {', '.join(unknown)}; it runs {', '.join(size.workloads)}")
    return ProtocolSize(workloads, size.policies, size.loads, size.n_seeds, {w: size.n_tasks[w] for w in workloads},
                        size.convergence_workload, size.convergence_policies, size.convergence_loads,
                        size.convergence_lengths, size.alpha)


def protocol_runs(workloads: Iterable[str], quick: bool = False, store: Any = None, evidence_path: Path | None = None,
                  jobs: int | None = None, progress: bool = False) -> pd.DataFrame:
    """The protocol grid's runs (:func:`capacity_grid_runs`' evidence) on ``workloads``: the same
    runs, keys and verdicts as notebook 16's, so a notebook that shows them against load (02, 03)
    or beside the paper's numbers (08) runs nothing notebook 16 does not. ``quick``: a small grid
    of its own on any workload (:data:`QUICK_PER_NOTEBOOK`), for tests."""
    workloads = tuple(dict.fromkeys(workloads))
    if quick:
        evidence_path = quick_evidence_path(store, evidence_path)
        q = QUICK_PER_NOTEBOOK
        size = ProtocolSize(workloads, q["policies"], q["loads"], q["n_seeds"],
                            {w: q["metagpt_tasks"] if w.startswith("metagpt") else q["n_tasks"] for w in workloads})
    else:
        size = restricted(FULL, workloads)
    return capacity_grid_runs(size, store, evidence_path, jobs, progress)
