"""The eviction study's second stage: the cells that decide its claims, at the protocol's run length.

The first stage (:mod:`studies.eviction.study`, the *screen*) runs the whole grid, admission x
eviction x host tier, at 100 tasks per run. At that length the steady-state test is not reliable
(arrival seed 4 reads as growth under most policies), so latency cannot be compared on most
workloads. The second stage re-runs, per (workload, host tier), only the cells the verdict
compares, at the protocol's run length (:data:`studies.protocol_runs.study.FULL`'s ``n_tasks``:
1,000 tasks, 600 on MetaGPT), over the same evaluation seeds:

* per admission policy, its **best eviction order on the screen** (the lowest seeds' mean JCT
  among the non-bound orders; the screen's stability is not used, since at 100 tasks it is what is
  in doubt) and **LRU** (SGLang's default; the reference of "where eviction matters");
* **LPM+KVFlow** (KVFlow as published: LPM admission with its eviction order); KVFlow under another
  admission enters only as that admission's best order;
* **LPM+Belady**, the offline bound, for the Belady gap of LPM's cells (never a candidate);
* the **declared** candidate (:data:`studies.eviction.study.DECLARED`: TOPAS-both with its own
  eviction order), which was chosen before either stage.

**The screen picks, the full runs compare.** The screen's runs are the first 100 tasks of the same
arrival streams (same seeds; a run of n tasks is the first n of the trace), so a pick made on the
screen is made on a tenth of the data it is then compared on (a sixth on MetaGPT). That favours the
picked cells a little (a winner's curse): on the baseline side it favours the baseline, which is
conservative for our candidates; on our side only the in-sample row's candidates are picked, and
that row is labelled in-sample already. The declared row's candidate is not picked at all. Picking
on other seeds would need a second screen; the overlap is stated where the verdict is shown.

**Evidence, cached.** The stage's stability verdict reads each run's steady-state evidence from the
protocol's cache (:func:`studies.protocol_runs.study.evidence_for`: the same columns, test version
and file, ``data/results/protocol/evidence.csv``, keyed by the experiment key; a cell of the default
engine at a load the protocol ran is the protocol's run and shares its row), and everything else
(mean and p99 JCT, prompt and cached tokens) from the runs' summaries: the results pack ships these
runs' ``meta.json`` alone (``scripts/pack_results.py``), ``make reproduce`` writes their evidence
rows while notebook 15 runs (a quick run's go to the store), and ``make figures`` builds the stage's
tables from the pack and that file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

import pandas as pd

from topas.experiments.protocol.seeds import EVALUATION_SEEDS, first
from studies.protocol_runs.study import FULL as PROTOCOL

__all__ = ["CELL_COLUMNS", "FULL_LENGTH", "FullLengthSize", "QUICK_LENGTH", "deciding_cells", "full_length_size",
           "run_length", "seeds"]

CELL_COLUMNS = ("workload", "host_tier", "admission", "eviction", "why")


@dataclass(frozen=True)
class FullLengthSize:
    """The second stage's size: ``n_tasks`` (None: the protocol's run length per workload,
    :func:`run_length`), seeds, and the workloads and host tiers it runs (None: every one the
    screen ran)."""

    n_tasks: int | None
    n_seeds: int
    workloads: tuple[str, ...] | None = None
    host_tiers: tuple[str, ...] | None = None


#: ``make reproduce``: the protocol's run length and its 5 evaluation seeds, on every workload and
#: host tier of the screen
FULL_LENGTH = FullLengthSize(n_tasks=None, n_seeds=5)
#: a check that the notebook runs (``make test``): 60 tasks, 2 seeds, DAG-4 without a host tier
QUICK_LENGTH = FullLengthSize(n_tasks=60, n_seeds=2, workloads=("dag-4",), host_tiers=("none",))


def full_length_size(quick: bool) -> FullLengthSize:
    return QUICK_LENGTH if quick else FULL_LENGTH


def run_length(workload: str, quick: bool = False) -> int:
    """Tasks per run of the second stage: the protocol's run length for ``workload``
    (:data:`studies.protocol_runs.study.FULL`), or the quick size's."""
    size = full_length_size(quick)
    if size.n_tasks is not None:
        return size.n_tasks
    if workload not in PROTOCOL.n_tasks:
        raise ValueError(f"eviction study: the protocol declares no run length for {workload!r}")
    return int(PROTOCOL.n_tasks[workload])


def seeds(quick: bool = False) -> list[int]:
    return first(EVALUATION_SEEDS, full_length_size(quick).n_seeds, "eviction study, full length")


def deciding_cells(screen: pd.DataFrame, own_eviction: Mapping[str, str], bound: str,
                   workloads: Iterable[str] | None = None, host_tiers: Iterable[str] | None = None) -> pd.DataFrame:
    """The second stage's cells, picked on the screen's ``runs`` table (one row per cell: workload,
    host_tier, admission, eviction, jct_mean), one row per cell with ``why`` it is there (module
    docstring). ``own_eviction``: the admissions that run with their own order only (that cell is
    kept as it is); ``bound``: the offline bound's name (kept only under LPM). ``workloads`` /
    ``host_tiers``: a subset (None: every one in the screen)."""
    rows: dict[tuple[str, str, str, str], list[str]] = {}
    df = screen
    if workloads is not None:
        df = df[df["workload"].isin(list(workloads))]
    if host_tiers is not None:
        df = df[df["host_tier"].isin(list(host_tiers))]

    def add(key: tuple[str, str, str, str], why: str) -> None:
        rows.setdefault(key, []).append(why)

    for (w, host, a), g in df.groupby(["workload", "host_tier", "admission"], sort=False):
        present = set(g["eviction"])
        if a in own_eviction:
            if own_eviction[a] in present:
                add((w, host, a, own_eviction[a]), "its own order (declared)")
            continue
        online = g[g["eviction"] != bound]
        if not online.empty:
            best = online.sort_values("jct_mean", kind="stable").iloc[0]["eviction"]
            add((w, host, a, best), "best on the screen")
        if "lru" in present:
            add((w, host, a, "lru"), "LRU (SGLang's default)")
        if a == "lpm" and "kvflow" in present:
            add((w, host, a, "kvflow"), "KVFlow (LPM+KVFlow)")
        if a == "lpm" and bound in present:
            add((w, host, a, bound), "the offline bound (never a candidate)")
    out = [{"workload": k[0], "host_tier": k[1], "admission": k[2], "eviction": k[3], "why": "; ".join(v)}
           for k, v in rows.items()]
    return pd.DataFrame(out).reindex(columns=list(CELL_COLUMNS))
