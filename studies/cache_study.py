"""What the cache holds, and what it does to the MetaGPT verdict (notebook 03).

Each MetaGPT workload is run twice over the protocol's evaluation seeds: with the engine's cache
of *agent prefixes only* (``segment_cache`` off: a request shares nothing with another beyond its
agent's static prefix, the engine model before token-level sharing) and with the default engine,
whose cache is a radix tree of the trace's token segments (task context shared between the calls
of a task, as SGLang's radix cache shares it). Under each, TOPAS and TOPAS+ are compared with
LPM by the protocol (docs/protocol.md): steady state tested over the seeds, latency compared only
where every compared policy is stable, paired differences on common random numbers (each seed the
same arrivals for every policy) with a 95% t interval, and win / tie / loss only where the
interval excludes zero.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from topas.experiments.protocol.paired import compare_latency
from topas.experiments.protocol.seeds import EVALUATION_SEEDS, first
from topas.experiments.protocol.steady import steady_state
from topas.experiments.spec import Experiment
from topas.sets import METAGPT

__all__ = ["BASELINE", "CACHES", "LOAD", "POLICIES", "VERDICT_COLUMNS", "WORKLOADS", "cache_study_grid", "cache_study_tables"]

WORKLOADS = METAGPT
BASELINE = "lpm"
POLICIES = (BASELINE, "topas", "topas-plus")
#: the load, as a multiple of each trace's nominal rate
LOAD = 1.0
#: the cache models compared: name -> the engine's ``segment_cache`` switch
CACHES = {"agent prefixes only": False, "segment radix tree": True}
N_SEEDS, QUICK_SEEDS, QUICK_TASKS = 5, 2, 40
#: the columns of the verdict table (the interval's columns empty where nothing is compared)
VERDICT_COLUMNS = ("workload", "cache", "policy", "baseline", "load", "seeds", "verdict", "difference_s", "low_s",
                   "high_s", "relative_pct", "relative_low_pct", "relative_high_pct", "method")


def _seeds(quick: bool) -> list[int]:
    return first(EVALUATION_SEEDS, QUICK_SEEDS if quick else N_SEEDS, "cache study")


def _cell(workload: str, policy: str, cache: str, seed: int, quick: bool) -> Experiment:
    opts = {} if CACHES[cache] else {"segment_cache": False}  # the default engine's key as it is
    return Experiment(workload, policy, {}, load=LOAD, seed=seed, n_tasks=QUICK_TASKS if quick else None,
                      engine_options=opts)


def cache_study_grid(workloads: tuple[str, ...] = WORKLOADS, quick: bool = False) -> list[Experiment]:
    """Every run of the study: workload x policy x cache model x evaluation seed."""
    return [_cell(w, p, c, s, quick) for w in workloads for c in CACHES for p in POLICIES for s in _seeds(quick)]


def cache_study_tables(workloads: tuple[str, ...] = WORKLOADS, quick: bool = False, store: Any = None,
                       progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run (or read) the study; ``(runs, verdict)``.

    ``runs``: one row per (workload, cache, policy): the seeds' mean of the share of prompt tokens
    served from the cache (``cached_pct``, percent), of mean and p99 JCT, and the steady-state
    verdict. ``verdict``: one row per (workload, cache, policy other than LPM): the paired
    difference in mean JCT against LPM (seconds, and percent of LPM's) with its 95% interval and
    win / tie / loss, or why it is not compared."""
    from topas.experiments.store import ResultStore, run_sweep

    store = store if isinstance(store, ResultStore) else ResultStore(store)
    exps = cache_study_grid(workloads, quick)
    run_sweep(exps, store, progress=progress, desc="cache study")
    seeds = _seeds(quick)
    runs, verdict = [], []
    for w in workloads:
        for cache in CACHES:
            cells = {p: {s: _cell(w, p, cache, s, quick) for s in seeds} for p in POLICIES}
            jct, stable = {}, {}
            for p, by_seed in cells.items():
                meta = {s: store.meta(e)["summary"] for s, e in by_seed.items()}
                st = steady_state({s: store.load_table(e, "tasks") for s, e in by_seed.items()},
                                  what=f"{w}/{p}, {cache}")
                stable[p], jct[p] = st.stable, {s: float(m["jct_mean"]) for s, m in meta.items()}
                share = [m["cached_tokens"] / m["prompt_tokens"] for m in meta.values() if m.get("prompt_tokens")]
                runs.append({"workload": w, "cache": cache, "policy": p, "load": LOAD, "seeds": len(seeds),
                             "tasks": int(next(iter(meta.values()))["n_tasks"]),
                             "cached_pct": 100 * sum(share) / len(share) if share else float("nan"),
                             "jct_mean": sum(jct[p].values()) / len(seeds),
                             "jct_p99": sum(float(m["jct_p99"]) for m in meta.values()) / len(seeds),
                             "stable": st.stable, "growing_seeds": len(st.growing_seeds)})
            for p in POLICIES[1:]:
                row = {"workload": w, "cache": cache, "policy": p, "baseline": BASELINE, "load": LOAD,
                       "seeds": len(seeds)}
                unstable = [q for q in (p, BASELINE) if not stable[q]]
                if unstable:
                    row.update(verdict=f"not compared: {', '.join(unstable)} not stable")
                else:
                    c = compare_latency(jct, p, BASELINE, stable, LOAD, w)
                    row.update(difference_s=c.difference, low_s=c.low, high_s=c.high, relative_pct=100 * c.relative,
                               relative_low_pct=100 * c.relative_low, relative_high_pct=100 * c.relative_high,
                               method=c.method, verdict=c.verdict)
                verdict.append(row)
    return pd.DataFrame(runs), pd.DataFrame(verdict).reindex(columns=list(VERDICT_COLUMNS))
