"""What a cluster run produces: the single-engine tables for the whole cluster (with an
``engine`` column), one :class:`~topas.engine.metrics.SimResult` per engine, a per-engine table,
and the prefix copies across engines over time.

Cluster summary (beside every key of the single-engine summary, computed over all tasks and
requests; ``kv_util_mean`` is the mean of the engines' time-weighted KV use):

* ``n_engines``, ``router``;
* load balance: ``requests_per_engine_min`` / ``_max`` and ``requests_per_engine_cv`` (the
  coefficient of variation, population standard deviation / mean, of requests per engine: 0 is
  perfectly even);
* prefix copies (an engine holds an agent's prefix while its KV is on that GPU: resident, or
  unpinned and still cached): ``prefix_copies_mean`` (over agents, the time-weighted mean number
  of engines holding the agent's prefix from the first arrival to the last finish),
  ``prefix_copies_max`` (the most engines that held one agent's prefix at once) and
  ``prefix_copies_end`` (mean over agents at the end);
* ``router_hold_mean``: mean time a request waited in the router before it was sent (0 but for
  a router that holds requests, ``kairos``); the requests table adds ``engine``,
  ``became_ready`` (its parents finished, or its task arrived), ``routed`` (the router sent it)
  and ``router_hold`` (the difference); ``ready`` and ``queue_time`` stay the engine's (when it
  reached the engine's scheduler, time queued there);
* ``routing_wall_s``: wall time spent in the router.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from topas.engine.metrics import WALL_CLOCK_KEYS, RunRecords, SimResult, build_result

CLUSTER_WALL_CLOCK_KEYS = (*WALL_CLOCK_KEYS, "routing_wall_s")


@dataclass
class ClusterResult(SimResult):
    #: one row per engine: requests, KV use, batching, prefix activity
    engines: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: (time, agent, copies): the number of engines holding the agent's prefix, at each change
    prefix_copies: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: each engine's own result (its requests, events, timeline, decisions, summary)
    per_engine: list[SimResult] = field(default_factory=list)

    def deterministic_summary(self) -> dict[str, Any]:
        return {k: v for k, v in self.summary.items() if k not in CLUSTER_WALL_CLOCK_KEYS}

    def to_parquet(self, directory: str | Path) -> None:
        super().to_parquet(directory)
        self.engines.to_parquet(Path(directory) / "engines.parquet", index=False)
        self.prefix_copies.to_parquet(Path(directory) / "prefix_copies.parquet", index=False)


def coefficient_of_variation(counts: list[int]) -> float:
    """Population standard deviation / mean (0 for perfectly even counts, nan for no requests)."""
    a = np.asarray(counts, dtype=float)
    return float(a.std() / a.mean()) if len(a) and a.mean() > 0 else float("nan")


def copies_table(events: list[tuple[float, int, str, bool]]) -> pd.DataFrame:
    """From (time, engine, agent, held) changes, the number of engines holding each agent's prefix
    after each change: rows (time, agent, copies)."""
    count: dict[str, int] = {}
    rows = []
    for t, _, a, held in events:
        count[a] = count.get(a, 0) + (1 if held else -1)
        rows.append((t, a, count[a]))
    return pd.DataFrame(rows, columns=["time", "agent", "copies"])


def copies_stats(copies: pd.DataFrame, agents: list[str], t0: float, t1: float) -> dict[str, float]:
    """Time-weighted mean copies per agent over [t0, t1] (averaged over agents), the maximum, and
    the mean at the end."""
    if not agents:
        return {"prefix_copies_mean": float("nan"), "prefix_copies_max": 0, "prefix_copies_end": float("nan")}
    means, ends = [], []
    for a in agents:
        c = copies[copies["agent"] == a]
        times = np.clip(c["time"].to_numpy(dtype=float), t0, t1)
        vals = c["copies"].to_numpy(dtype=float)
        edges = np.concatenate([[t0], times, [t1]])
        levels = np.concatenate([[0.0], vals])
        span = t1 - t0
        means.append(float((np.diff(edges) * levels).sum() / span) if span > 0 else float(levels[-1]))
        ends.append(float(levels[-1]))
    return {
        "prefix_copies_mean": float(np.mean(means)),
        "prefix_copies_max": int(copies["copies"].max()) if len(copies) else 0,
        "prefix_copies_end": float(np.mean(ends)),
    }


def build_cluster_result(sim: Any, wall_seconds: float) -> ClusterResult:
    """The result of a finished :class:`topas.cluster.simulator.ClusterSimulator` ``sim`` (its
    engines' tables merged, each engine's own result kept)."""
    engines = sim.engines
    per_engine = [build_result(e.records(), wall_seconds=0.0) for e in engines]
    for r, e in zip(per_engine, engines):
        r.summary["engine"] = e.index
    decisions = sorted((d for e in engines for d in e.decisions), key=lambda d: d[0])
    events = sorted((ev for e in engines for ev in e.memory.prefix_events), key=lambda ev: ev[0])
    records = [e.records() for e in engines]
    whole = build_result(RunRecords(
        tasks=sim.tasks, requests=sim.requests, prefixes=engines[0].memory.prefixes, prefix_events=events,
        timeline=[], decisions=decisions, policy=engines[0].policy,
        decode_batch_area=sum(r.decode_batch_area for r in records),
        decode_steps=sum(r.decode_steps for r in records), busy_time=sum(r.busy_time for r in records),
        budget=sum(r.budget for r in records),
        dup_copies=sum(r.dup_copies for r in records), dup_tokens=sum(r.dup_tokens for r in records),
        preempt_unused=sum(r.preempt_unused for r in records),
    ), wall_seconds)
    s = whole.summary

    def tagged(name: str) -> pd.DataFrame:
        parts = [getattr(r, name).assign(engine=e.index) for r, e in zip(per_engine, engines)]
        parts = [p for p in parts if len(p)]
        if not parts:
            return getattr(whole, name).assign(engine=pd.Series(dtype=int))
        return pd.concat(parts, ignore_index=True).sort_values(["time", "engine"], kind="stable",
                                                               ignore_index=True)

    requests = whole.requests.copy()
    requests["engine"] = requests["rid"].map(sim.assignment).astype("Int64")
    # a holding router (kairos) sends a request later than it became ready (``ready`` stays when
    # it reached its engine's scheduler, as for a single engine)
    requests["became_ready"] = requests["rid"].map(sim.ready_at)
    requests["routed"] = requests["rid"].map(sim.sent_at)
    requests["router_hold"] = requests["routed"] - requests["became_ready"]
    n_req = [int((requests["engine"] == e.index).sum()) for e in engines]
    s["kv_util_mean"] = float(np.mean([r.summary["kv_util_mean"] for r in per_engine]))
    t0 = float(whole.tasks["arrival"].min()) if len(whole.tasks) else 0.0
    t1 = float(whole.tasks["finish"].max()) if len(whole.tasks) else 0.0
    copies = copies_table(sim.holding_events)
    s.update({
        "n_engines": len(engines),
        "router": sim.router.name,
        "requests_per_engine_min": min(n_req),
        "requests_per_engine_max": max(n_req),
        "requests_per_engine_cv": coefficient_of_variation(n_req),
        **copies_stats(copies, sorted(sim.trace.agents), t0, t1),
        "router_hold_mean": float(requests["router_hold"].mean()) if len(requests) else float("nan"),
        "routing_wall_s": sim.routing_wall,
    })
    cols = ("n_requests", "busy_time", "kv_util_mean", "avg_decode_batch", "decode_steps", "prefix_hits",
            "prefix_loads_prefill", "prefix_loads_swap", "prefix_evictions", "retractions", "preemptions",
            "queue_time_mean", "n_decisions")
    engines_table = pd.DataFrame([{"engine": e.index, "kv_budget": e.memory.budget, **{c: r.summary[c] for c in cols},
                                   "prefixes_held_end": len(e.held_prefixes())}
                                  for r, e in zip(per_engine, engines)])
    return ClusterResult(
        tasks=whole.tasks, requests=requests, prefix_events=tagged("prefix_events"), timeline=tagged("timeline"),
        decisions=tagged("decisions"), summary=s, engines=engines_table, prefix_copies=copies,
        per_engine=per_engine,
    )
