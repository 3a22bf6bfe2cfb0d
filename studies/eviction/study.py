"""Which KV entries the engine evicts, and what that does to JCT (notebook 15).

The grid: admission (the scheduler: FCFS, LPM, SPF, TOPAS, TOPAS+) x eviction (the engine's
order of evicting cached KV: ``lru``, SGLang's; ``lfu``; ``priority``, the admission policy's own
request priorities; ``kvflow``, KVFlow's steps-to-execution; ``belady``, the offline bound) x host
tier (``none``, stock SGLang; ``hicache``, an evicted entry kept in host memory) on the five
workloads and the four held-out random workflows at nominal load, over the protocol's 5
evaluation seeds.

**The bound.** ``belady`` reads the run's true future (every task's arrival and DAG before it
arrives; :mod:`topas.engine.future`): it is an offline bound that no scheduler can reach, not a
policy, and it is never a candidate for a win. It is Belady's optimum for one reference order of
requests (tasks by arrival, stages by depth), so under another admission order it is an estimate
of the best eviction, and since Belady minimises misses of equal-sized entries, not JCT, another
eviction order can beat it on JCT (a negative gap says so). The *Belady gap* of an eviction order
is its difference from ``belady`` under the same admission and host tier: in uncached prompt
tokens (the prompt tokens prefilled rather than found cached: what eviction can save) and in mean
JCT.

The protocol (docs/protocol.md): every cell of one seed sees the same arrivals (common random
numbers), so cells are compared seed by seed with a paired 95% t interval
(:func:`topas.experiments.protocol.paired.compare_latency`); latency is compared only where both
compared cells are stable by the steady-state test over the seeds; "win" / "loss" only where the
interval of the per-seed differences (in seconds; the relative difference's interval is shown beside it
and may differ at its edge) excludes zero. The verdict per workload and host tier, against the best baseline cell (FCFS, LPM or SPF with
any non-bound eviction, LPM+KVFlow included; the best by the seeds' mean JCT among the stable
cells, a choice on the compared seeds that favours the baseline), has two rows: the *declared*
candidate (:data:`DECLARED`: TOPAS-both with its own eviction order, whose reading was selected on
tuning seeds and synthetic workloads before these runs; MetaGPT is held out for it), and the best
TOPAS / TOPAS+ / TOPAS-both cell of the grid, labelled *in-sample*: picked by the same seeds' means
it is compared on, which favours it (the interval does not correct for that).

**Two stages.** This grid is the *screen*, 100 tasks per run (:func:`screen_label`): at that
length the steady-state test is not reliable, so the verdict is taken on a second stage, the cells
that decide it re-run at the protocol's run length (:mod:`studies.eviction.full_length`:
:func:`full_length_tables`); the screen picks them, the full-length runs compare them. The screen's
stability is read from its runs' tasks tables (the pack ships them); the full-length stage's from
its runs' cached evidence, in the protocol's cache (``data/results/protocol/evidence.csv``), so the
pack ships those runs' summaries only.

Size (it must fit ``make reproduce``'s budget): :data:`FULL` and :data:`QUICK`; the host-tier half
runs fewer admissions (:attr:`EvictionSize.host_admissions`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd

from topas.experiments.protocol.paired import compare_latency
from topas.experiments.protocol.seeds import EVALUATION_SEEDS, first
from topas.experiments.protocol.steady import steady_state
from studies.protocol_runs.study import sample_of
from topas.sets import HELD_OUT, IN_SAMPLE, RANDOM_DAGS
from topas.experiments.spec import Experiment

__all__ = ["ADMISSIONS", "BASELINE_ADMISSIONS", "BOUND", "EVICTIONS", "EvictionSize", "FULL", "GAP_COLUMNS",
           "HOST_TIERS", "LOAD", "MATTERS_COLUMNS", "QUICK", "RUN_COLUMNS", "SEED_COLUMNS", "VERDICT_COLUMNS", "WORKLOADS",
           "build_tables", "cached_stability", "eviction_size", "study_workloads", "eviction_study_grid", "eviction_study_tables",
           "full_length_cells", "full_length_grid", "full_length_tables", "screen_label", "full_label"]

#: the protocol's workloads: the synthetic ones TOPAS-both's (and TOPAS+'s) selection saw, then the
#: held-out MetaGPT workflows and random DAGs (:data:`topas.sets.HELD_OUT`)
WORKLOADS = IN_SAMPLE + HELD_OUT
BASELINE_ADMISSIONS = ("fcfs", "lpm", "spf")
ADMISSIONS = BASELINE_ADMISSIONS + ("topas", "topas-plus", "topas-both")
#: admissions that decide eviction themselves: they run with that order only (TOPAS-both's
#: ``policy``: its own next-use values; with ``lru`` it is TOPAS+)
OWN_EVICTION: dict[str, str] = {"topas-both": "policy"}
#: the one candidate declared before the runs (selected on tuning seeds and synthetic workloads
#: only: docs/topas_plus.md), beside the best-of-the-grid candidate the verdict also reports
DECLARED = ("topas-both", "policy")
#: the offline bound (never a candidate)
BOUND = "belady"
#: the engine's eviction orders (``EngineConfig.eviction``); ``lru`` is the default engine
EVICTIONS = ("lru", "lfu", "priority", "kvflow", BOUND)
#: host tier name -> the engine options that give it (``none``: the default engine)
HOST_TIERS: dict[str, dict[str, Any]] = {"none": {}, "hicache": {"host_tier": True}}
#: the load, as a multiple of each trace's nominal rate
LOAD = 1.0


@dataclass(frozen=True)
class EvictionSize:
    """How much of the grid runs: tasks and seeds of the no-host-tier half, and of the host-tier
    half (with only ``host_admissions``); ``admissions``: those of the no-host-tier half (None:
    every one of :data:`ADMISSIONS`)."""

    n_tasks: int
    n_seeds: int
    host_n_tasks: int
    host_n_seeds: int
    host_admissions: tuple[str, ...]
    admissions: tuple[str, ...] | None = None
    #: the workloads it runs on (None: every one of :data:`WORKLOADS`)
    workloads: tuple[str, ...] | None = None


#: the protocol's 5 evaluation seeds on its nine workloads, 100 tasks per run (short, for
#: ``make reproduce``'s budget): 1,665 runs; the host-tier half leaves out FCFS, SPF and TOPAS
FULL = EvictionSize(n_tasks=100, n_seeds=5, host_n_tasks=100, host_n_seeds=5,
                    host_admissions=("lpm", "topas-plus", "topas-both"))
#: a check that the notebook runs (``make test``), not a result: a baseline and our two on one
#: in-sample workload and one held-out random DAG (the MetaGPT runs are most of the time), 64 runs
QUICK = EvictionSize(n_tasks=40, n_seeds=2, host_n_tasks=40, host_n_seeds=2, host_admissions=("lpm",),
                     admissions=("lpm", "topas-plus", "topas-both"), workloads=("dag-4",) + RANDOM_DAGS[:1])

RUN_COLUMNS = ("workload", "host_tier", "admission", "eviction", "bound", "load", "seeds", "tasks", "cached_pct",
               "uncached_tokens", "jct_mean", "jct_p99", "stable", "growing_seeds", "growing")
GAP_COLUMNS = ("workload", "host_tier", "admission", "eviction", "seeds", "uncached_tokens", "bound_uncached_tokens",
               "uncached_gap_pct", "jct_mean", "bound_jct_mean", "jct_gap_pct", "jct_gap_low_pct", "jct_gap_high_pct",
               "note")
MATTERS_COLUMNS = ("workload", "host_tier", "admission", "best_eviction", "seeds", "difference_s", "low_s", "high_s",
                   "relative_pct", "relative_low_pct", "relative_high_pct", "verdict", "spread_pct")
SEED_COLUMNS = ("seed", "cells", "cells_growing")
VERDICT_COLUMNS = ("workload", "sample", "host_tier", "selection", "candidate", "baseline", "seeds", "difference_s", "low_s", "high_s",
                   "relative_pct", "relative_low_pct", "relative_high_pct", "verdict")


def eviction_size(quick: bool) -> EvictionSize:
    return QUICK if quick else FULL


def study_workloads(quick: bool) -> tuple[str, ...]:
    """The workloads the study runs on at this size."""
    return eviction_size(quick).workloads or WORKLOADS


def _admissions(host: str, size: EvictionSize) -> tuple[str, ...]:
    if host != "none":
        return size.host_admissions
    return size.admissions if size.admissions is not None else ADMISSIONS


def _seeds(host: str, size: EvictionSize) -> list[int]:
    n = size.n_seeds if host == "none" else size.host_n_seeds
    return first(EVALUATION_SEEDS, n, "eviction study")


def _cell(workload: str, admission: str, eviction: str, host: str, seed: int, size: EvictionSize) -> Experiment:
    opts = dict(HOST_TIERS[host])
    if eviction != "lru":  # the default engine's key as it is
        opts["eviction"] = eviction
    return Experiment(workload, admission, {}, load=LOAD, seed=seed,
                      n_tasks=size.n_tasks if host == "none" else size.host_n_tasks, engine_options=opts)


def _cells(workloads: Iterable[str], size: EvictionSize, evictions: tuple[str, ...]):
    for w in workloads:
        for host in HOST_TIERS:
            for a in _admissions(host, size):
                for e in ((OWN_EVICTION[a],) if a in OWN_EVICTION else evictions):
                    yield (w, host, a, e), {s: _cell(w, a, e, host, s, size) for s in _seeds(host, size)}


def eviction_study_grid(workloads: tuple[str, ...] | None = None, quick: bool = False,
                        evictions: tuple[str, ...] = EVICTIONS) -> list[Experiment]:
    """Every run of the study: workload (default :func:`study_workloads`) x host tier x admission x
    eviction x evaluation seed."""
    workloads = study_workloads(quick) if workloads is None else workloads
    return [e for _, by_seed in _cells(workloads, eviction_size(quick), evictions) for e in by_seed.values()]


def eviction_study_tables(workloads: tuple[str, ...] | None = None, quick: bool = False, store: Any = None,
                          progress: bool = False, evictions: tuple[str, ...] = EVICTIONS
                          ) -> dict[str, pd.DataFrame]:
    """Run (or read) the study's screen; the tables of :func:`build_tables`."""
    size = eviction_size(quick)
    workloads = study_workloads(quick) if workloads is None else workloads
    tables = _run_and_tabulate(dict(_cells(workloads, size, evictions)), store, progress, "eviction study")
    return _labelled(tables, screen_label(quick))


def _labelled(tables: Mapping[str, pd.DataFrame], label: str) -> dict[str, pd.DataFrame]:
    """Each table with a first column ``stage``: which stage's runs it reads."""
    return {k: t.assign(stage=label)[["stage", *t.columns]] for k, t in tables.items()}


def _run_and_tabulate(cells: Mapping[tuple[str, str, str, str], Mapping[int, Experiment]], store: Any,
                      progress: bool, desc: str, evidence: bool = False,
                      evidence_path: Path | None = None) -> dict[str, pd.DataFrame]:
    """Run (or read) ``cells`` and build the tables. Stability: with ``evidence``, from the runs'
    cached evidence (:func:`studies.protocol_runs.study.evidence_for`, cache at ``evidence_path``,
    None: the store's default; the runs' summaries are all the rest reads, so a pack ships their
    ``meta.json`` alone), else from each run's tasks table (the screen's, shipped with its runs)."""
    from topas.experiments.store import ResultStore, run_sweep

    store = store if isinstance(store, ResultStore) else ResultStore(store)
    exps = [e for by_seed in cells.values() for e in by_seed.values()]
    run_sweep(exps, store, progress=progress, desc=desc, tables=not evidence)
    summaries, stable = {}, {}
    if evidence:
        from studies.protocol_runs.study import evidence_for

        rows = evidence_for(exps, store, evidence_path).set_index("key", drop=False)
    for key, by_seed in cells.items():
        summaries[key] = {s: store.meta(e)["summary"] for s, e in by_seed.items()}
        if evidence:
            stable[key] = cached_stability(rows.loc[[e.key() for e in by_seed.values()]])
        else:
            st = steady_state({s: store.load_table(e, "tasks") for s, e in by_seed.items()}, what="/".join(key))
            stable[key] = (st.stable, st.growing_seeds)
    return build_tables(summaries, stable)


def cached_stability(evidence: pd.DataFrame) -> tuple[bool, tuple[int, ...]]:
    """One cell's stability from its runs' evidence rows (one per seed): the steady-state test of
    :func:`topas.experiments.protocol.steady.steady_state` (Bonferroni over the seeds and indicators,
    every seed stable), as :func:`studies.protocol_runs.study.seed_verdicts` reads it; (stable, the
    seeds whose run grows)."""
    from studies.protocol_runs.study import seed_verdicts

    v = seed_verdicts(evidence.reset_index(drop=True))
    growing = tuple(sorted(int(s) for s in v.loc[v["growing"], "seed"]))
    return not growing, growing


def full_label(quick: bool = False) -> str:
    """The label of the second stage's tables (:func:`full_length_tables`): its run lengths."""
    from studies.eviction import full_length as fl

    if quick:
        return f"full-length stage, quick: {fl.run_length('dag-4', True)} tasks"
    lengths = sorted({fl.run_length(w) for w in WORKLOADS})
    return f"full length, {' / '.join(str(n) for n in lengths)} tasks"


def screen_label(quick: bool = False) -> str:
    """The label of the screen's tables: ``screen, 100 tasks`` (its run length)."""
    size = eviction_size(quick)
    lengths = sorted({size.n_tasks, size.host_n_tasks})
    return f"screen, {' / '.join(str(n) for n in lengths)} tasks"


def full_length_cells(screen_runs: pd.DataFrame, quick: bool = False) -> pd.DataFrame:
    """The second stage's cells (:func:`studies.eviction.full_length.deciding_cells`), picked on the
    screen's ``runs`` table, on the workloads and host tiers of its size."""
    from studies.eviction import full_length as fl

    size = fl.full_length_size(quick)
    return fl.deciding_cells(screen_runs, OWN_EVICTION, BOUND, size.workloads, size.host_tiers)


def _full_cells(cells: pd.DataFrame, quick: bool):
    from studies.eviction import full_length as fl

    for r in cells.itertuples():
        n = fl.run_length(r.workload, quick)
        yield ((r.workload, r.host_tier, r.admission, r.eviction),
               {s: _cell(r.workload, r.admission, r.eviction, r.host_tier, s,
                         EvictionSize(n, 1, n, 1, ())) for s in fl.seeds(quick)})


def full_length_grid(screen_runs: pd.DataFrame, quick: bool = False) -> list[Experiment]:
    """Every run of the second stage: the cells of :func:`full_length_cells` at the protocol's run
    length x the evaluation seeds."""
    return [e for _, by in _full_cells(full_length_cells(screen_runs, quick), quick) for e in by.values()]


def full_length_tables(screen_runs: pd.DataFrame, quick: bool = False, store: Any = None,
                       progress: bool = False, evidence_path: Path | None = None) -> dict[str, pd.DataFrame]:
    """Run (or read) the second stage; the tables of :func:`build_tables` on its cells (the
    ``verdict`` is the study's), with ``cells``: which cells ran and why. Stability is read from
    the runs' cached evidence, in the protocol's cache (:func:`studies.protocol_runs.study.evidence_for`:
    ``data/results/protocol/evidence.csv`` for the default store, where ``make reproduce`` writes
    these runs' rows; a quick run's go to the store, :func:`~studies.protocol_runs.study.quick_evidence_path`),
    so ``make figures`` builds these tables from the pack's summaries and that file."""
    from studies.protocol_runs.study import quick_evidence_path

    if quick:
        evidence_path = quick_evidence_path(store, evidence_path)
    cells = full_length_cells(screen_runs, quick)
    tables = _run_and_tabulate(dict(_full_cells(cells, quick)), store, progress, "eviction study, full length",
                               evidence=True, evidence_path=evidence_path)
    return _labelled({"cells": cells, **tables}, full_label(quick))


def _uncached(summary: Mapping[str, Any]) -> float:
    """Prompt tokens prefilled rather than found cached (what eviction can save)."""
    return float(summary["prompt_tokens"]) - float(summary["cached_tokens"])


def _mean(values: Iterable[float]) -> float:
    v = list(values)
    return sum(v) / len(v) if v else math.nan


def build_tables(summaries: Mapping[tuple[str, str, str, str], Mapping[int, Mapping[str, Any]]],
                 stable: Mapping[tuple[str, str, str, str], tuple[bool, tuple[int, ...]]]) -> dict[str, pd.DataFrame]:
    """The study's tables from each cell's per-seed summaries and its stability.

    ``summaries[(workload, host tier, admission, eviction)][seed]``: a run's summary (``jct_mean``,
    ``jct_p99``, ``prompt_tokens``, ``cached_tokens``, ``n_tasks``); ``stable[cell]``: (stable by the
    steady-state test, the seeds whose run grows). Returns

    * ``runs``: one row per cell: seeds' means of the cached share, uncached prompt tokens, mean
      and p99 JCT, and stability (``growing``: the seeds whose run grows);
    * ``seeds``: per arrival seed, in how many of the cells its run grows (a seed whose arrivals
      read as growth in many cells, every policy's, says the run length is short for the test);
    * ``gap``: the Belady gap, one row per cell with a non-bound eviction whose bound cell ran:
      uncached tokens and mean JCT against the bound's (percent), the JCT gap's paired 95% interval
      where both are stable;
    * ``matters``: per (workload, host tier, admission), the best non-bound eviction against
      ``lru``: the paired difference in mean JCT (seconds) with its 95% interval, on which the
      verdict is (a win only where it excludes zero), the relative difference with its own
      interval beside it, and the spread of the non-bound evictions' mean JCT (max / min - 1, percent);
    * ``verdict``: per (workload, host tier), two candidates against the best baseline cell
      (module docstring): the declared one (:data:`DECLARED`) and the best of our cells.
    """
    runs, gap, matters, verdict = [], [], [], []
    jct = {k: {s: float(m["jct_mean"]) for s, m in v.items()} for k, v in summaries.items()}
    for key, by_seed in summaries.items():
        w, host, a, e = key
        ms = list(by_seed.values())
        share = [m["cached_tokens"] / m["prompt_tokens"] for m in ms if m.get("prompt_tokens")]
        runs.append({"workload": w, "host_tier": host, "admission": a, "eviction": e, "bound": e == BOUND,
                     "load": LOAD, "seeds": len(ms), "tasks": int(ms[0]["n_tasks"]),
                     "cached_pct": 100 * _mean(share), "uncached_tokens": _mean(_uncached(m) for m in ms),
                     "jct_mean": _mean(jct[key].values()), "jct_p99": _mean(float(m["jct_p99"]) for m in ms),
                     "stable": bool(stable[key][0]), "growing_seeds": len(stable[key][1]),
                     "growing": " ".join(str(x) for x in stable[key][1])})

    def is_stable(k: tuple) -> bool:
        return bool(stable[k][0])

    def paired(p: tuple, b: tuple):
        names = {"/".join(p): jct[p], "/".join(b): jct[b]}
        st = {"/".join(p): True, "/".join(b): True}
        return compare_latency(names, "/".join(p), "/".join(b), st, LOAD, p[0])

    groups = list(dict.fromkeys(k[:3] for k in summaries))  # in the grid's order
    for w, host, a in groups:
        if a in OWN_EVICTION:
            continue  # one eviction order: no gap to the bound, nothing to compare with lru
        bound = (w, host, a, BOUND)
        own = [k for k in summaries if k[:3] == (w, host, a) and k[3] != BOUND]
        for k in own:
            if bound not in summaries:
                continue
            u, ub = _mean(_uncached(m) for m in summaries[k].values()), \
                _mean(_uncached(m) for m in summaries[bound].values())
            row = {"workload": w, "host_tier": host, "admission": a, "eviction": k[3], "seeds": len(summaries[k]),
                   "uncached_tokens": u, "bound_uncached_tokens": ub,
                   "uncached_gap_pct": 100 * (u / ub - 1) if ub else math.nan,
                   "jct_mean": _mean(jct[k].values()), "bound_jct_mean": _mean(jct[bound].values())}
            unstable = [x[3] for x in (k, bound) if not is_stable(x)]
            if unstable:
                row["note"] = f"JCT not compared: {', '.join(unstable)} not stable"
            else:
                c = paired(k, bound)
                row.update(jct_gap_pct=100 * c.relative, jct_gap_low_pct=100 * c.relative_low,
                           jct_gap_high_pct=100 * c.relative_high, note="")
            gap.append(row)
        lru = (w, host, a, "lru")
        rest = [k for k in own if k != lru]
        row = {"workload": w, "host_tier": host, "admission": a, "seeds": len(summaries[own[0]]) if own else 0}
        means = {k: _mean(jct[k].values()) for k in own}
        if len(means) > 1:
            row["spread_pct"] = 100 * (max(means.values()) / min(means.values()) - 1)
        cand = [k for k in rest if is_stable(k)]
        if lru not in summaries or not rest:
            row["verdict"] = "not compared: no lru or no other eviction"
        elif not is_stable(lru) or not cand:
            row["verdict"] = "not compared: " + ("lru not stable" if not is_stable(lru) else "no other stable eviction")
        else:
            best = min(cand, key=lambda k: means[k])
            c = paired(best, lru)
            row.update(best_eviction=best[3], difference_s=c.difference, low_s=c.low, high_s=c.high,
                       relative_pct=100 * c.relative, relative_low_pct=100 * c.relative_low,
                       relative_high_pct=100 * c.relative_high, verdict=c.verdict)
        matters.append(row)
    for w, host in dict.fromkeys(k[:2] for k in summaries):
        cells = [k for k in summaries if k[:2] == (w, host) and k[3] != BOUND]
        base = [k for k in cells if k[2] in BASELINE_ADMISSIONS and is_stable(k)]
        ours = [k for k in cells if k[2] not in BASELINE_ADMISSIONS]
        declared = (w, host, *DECLARED)
        picks = []  # (selection, candidate cell or None, why not)
        if declared in summaries:
            picks.append(("declared: selected on tuning seeds", declared if is_stable(declared) else None,
                          "the declared cell is not stable"))
        stable_ours = [k for k in ours if is_stable(k)]
        picks.append((f"in-sample: best of {len(ours)} cells on these seeds",
                       min(stable_ours, key=lambda k: _mean(jct[k].values())) if stable_ours else None,
                       "no stable TOPAS / TOPAS+ / TOPAS-both cell"))
        for selection, p, why in picks:
            row = {"workload": w, "sample": sample_of(w), "host_tier": host,
                   "selection": selection,
                   "seeds": len(summaries[cells[0]]) if cells else 0}
            if not base or p is None:
                row["verdict"] = "not compared: " + ("no stable baseline cell" if not base else why)
            else:
                b = min(base, key=lambda k: _mean(jct[k].values()))
                c = paired(p, b)
                row.update(candidate=f"{p[2]}+{p[3]}", baseline=f"{b[2]}+{b[3]}", difference_s=c.difference,
                           low_s=c.low, high_s=c.high, relative_pct=100 * c.relative,
                           relative_low_pct=100 * c.relative_low, relative_high_pct=100 * c.relative_high,
                           verdict=c.verdict)
            verdict.append(row)
    seeds = sorted({x for by_seed in summaries.values() for x in by_seed})
    growing = [{"seed": x, "cells": len(stable), "cells_growing": sum(x in g for _, g in stable.values())}
               for x in seeds]
    return {"runs": pd.DataFrame(runs).reindex(columns=list(RUN_COLUMNS)),
            "seeds": pd.DataFrame(growing).reindex(columns=list(SEED_COLUMNS)),
            "gap": pd.DataFrame(gap).reindex(columns=list(GAP_COLUMNS)),
            "matters": pd.DataFrame(matters).reindex(columns=list(MATTERS_COLUMNS)),
            "verdict": pd.DataFrame(verdict).reindex(columns=list(VERDICT_COLUMNS))}
