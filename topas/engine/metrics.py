"""What a run produces: per-task and per-request tables, prefix events, a KV timeline, decisions,
and a summary (docs/method.md "Setup and metrics": mean and p99 task JCT, request throughput, decision overhead).

Everything but the decision wall times is a deterministic function of the inputs; wall times
live only in ``decisions.wall_s`` and the ``*_wall_*`` summary keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

WALL_CLOCK_KEYS = ("sim_wall_s", "decision_wall_mean_ms", "decision_wall_p50_ms",
                   "decision_wall_p99_ms", "decision_wall_share")


@dataclass
class SimResult:
    tasks: pd.DataFrame
    requests: pd.DataFrame
    prefix_events: pd.DataFrame
    timeline: pd.DataFrame
    decisions: pd.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)

    def deterministic_summary(self) -> dict[str, Any]:
        """The summary without wall-clock measurements (identical across identical runs)."""
        return {k: v for k, v in self.summary.items() if k not in WALL_CLOCK_KEYS}

    def to_parquet(self, directory: str | Path) -> None:
        """Write each table as ``<name>.parquet`` in ``directory`` (created if missing)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        for name in ("tasks", "requests", "prefix_events", "timeline", "decisions"):
            getattr(self, name).to_parquet(d / f"{name}.parquet", index=False)
        pd.DataFrame([self.summary]).to_parquet(d / "summary.parquet", index=False)


def cached_share(requests: pd.DataFrame) -> float:
    """The share of prompt tokens served from the cache: SGLang's ``cached_tokens`` summed over
    requests / their prompt tokens (``l_a + x_v``)."""
    total = requests["prompt_tokens"].sum() if len(requests) and "prompt_tokens" in requests else 0
    return float(requests["cached_tokens"].sum() / total) if total else float("nan")


def percentile(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


@dataclass(frozen=True)
class RunRecords:
    """What a finished run recorded, gathered from the simulator's parts
    (:meth:`topas.engine.simulator.Simulator.records`; a cluster sums its engines'): the input
    of :func:`build_result`."""

    tasks: Mapping[str, Any]  # task id -> TaskState
    requests: Mapping[str, Any]  # rid -> Request
    prefixes: Mapping[str, Any]  # agent -> Prefix
    prefix_events: Sequence[tuple]
    timeline: Sequence[tuple]
    decisions: Sequence[tuple]
    policy: Any
    decode_batch_area: int
    decode_steps: int
    busy_time: float
    budget: int
    dup_copies: int
    dup_tokens: int
    preempt_unused: int


def build_result(sim: RunRecords, wall_seconds: float) -> SimResult:
    """The tables and summary of a finished run's records ``sim`` (``wall_seconds``: the run's
    wall time)."""
    # built column by column (what pandas infers from a list of row dicts, at a fraction of the cost)
    states = list(sim.tasks.values())
    tasks = pd.DataFrame({
        "task_id": [ts.task.id for ts in states],
        "workflow": [ts.task.workflow for ts in states],
        "arrival": [ts.task.arrival for ts in states],
        "finish": [ts.finish_time for ts in states],
        "jct": [ts.finish_time - ts.task.arrival for ts in states],
        "n_stages": [len(ts.task.stages) for ts in states],
    })
    reqs = list(sim.requests.values())
    prefix_len = [sim.prefixes[r.agent].tokens for r in reqs]
    requests = pd.DataFrame({
        "rid": [r.rid for r in reqs],
        "task_id": [r.task.task.id for r in reqs],
        "stage_id": [r.stage.id for r in reqs],
        "agent": [r.agent for r in reqs],
        "input_tokens": [r.x for r in reqs],
        "output_tokens": [r.y for r in reqs],
        "ready": [r.ready_time for r in reqs],
        "first_admit": [r.first_admit_time for r in reqs],
        "finish": [r.finish_time for r in reqs],
        "queue_time": [r.queue_time for r in reqs],
        "prefill_time": [r.prefill_time for r in reqs],
        "decode_time": [r.decode_time for r in reqs],
        "preemptions": [r.preemptions for r in reqs],
        "retractions": [r.retractions for r in reqs],
        "recomputed_tokens": [r.recomputed_tokens for r in reqs],
        # as the replay defines it from the server's cached_tokens
        "prefix_hit": [r.cached_tokens >= n for r, n in zip(reqs, prefix_len)],
        "cached_tokens": [r.cached_tokens for r in reqs],
        "prompt_tokens": [n + r.x for r, n in zip(reqs, prefix_len)],
    })
    prefix_events = pd.DataFrame(sim.prefix_events, columns=["time", "agent", "event", "tokens", "bytes"])
    timeline = pd.DataFrame(
        sim.timeline, columns=["time", "prefix_tokens", "request_tokens", "decode_batch", "prefill_queue", "waiting",
                               "evictable_tokens"]
    )
    decisions = pd.DataFrame(
        [d[:9] for d in sim.decisions],
        columns=["time", "wall_s", "n_waiting", "n_running", "n_proposed", "n_admitted",
                 "n_preempt", "n_evict", "n_load"],
    )
    infos = pd.DataFrame([d[9] for d in sim.decisions])
    if len(infos.columns):
        decisions = pd.concat([decisions, infos.add_prefix("info_")], axis=1)

    jct = tasks["jct"].to_numpy(dtype=float)
    makespan = float(tasks["finish"].max() - tasks["arrival"].min()) if len(tasks) else 0.0
    ev = prefix_events["event"] if len(prefix_events) else pd.Series([], dtype=str)
    wall = decisions["wall_s"].to_numpy(dtype=float)
    summary: dict[str, Any] = {
        "policy": sim.policy.name,
        "n_tasks": len(tasks),
        "n_requests": len(requests),
        "jct_mean": float(jct.mean()) if len(jct) else float("nan"),
        "jct_p50": percentile(jct, 50),
        "jct_p90": percentile(jct, 90),
        "jct_p99": percentile(jct, 99),
        # stability indicators (issue 13; topas.experiments.capacity)
        "jct_last_first_quarter": stability_ratio(tasks) if len(tasks) else float("nan"),
        "completion_ratio": completion_ratio(tasks) if len(tasks) else float("nan"),
        "makespan": makespan,
        "throughput_rps": len(requests) / makespan if makespan > 0 else float("nan"),
        "throughput_tps": len(tasks) / makespan if makespan > 0 else float("nan"),
        "avg_decode_batch": sim.decode_batch_area / sim.decode_steps if sim.decode_steps else 0.0,
        "decode_steps": sim.decode_steps,
        "busy_time": sim.busy_time,
        "prefix_hits": int(requests["prefix_hit"].sum()) if len(requests) else 0,
        # SGLang's cached_tokens summed over requests, and the prompt tokens (cached_share's terms)
        "cached_tokens": int(requests["cached_tokens"].sum()) if len(requests) else 0,
        "prompt_tokens": int(requests["prompt_tokens"].sum()) if len(requests) else 0,
        "prefix_loads_swap": int((ev == "load_swap").sum()),
        "prefix_loads_prefill": int((ev == "load_prefill").sum()),
        "prefix_evictions": int(ev.str.startswith("evict").sum()) if len(ev) else 0,
        "bytes_swapped": float(prefix_events["bytes"].sum()) if len(prefix_events) else 0.0,
        "recomputed_tokens": int(requests["recomputed_tokens"].sum()) if len(requests) else 0,
        "preemptions": int(requests["preemptions"].sum()) if len(requests) else 0,
        # plan against execution (docs/design.md "Plan and execution"): duplicate prefix copies,
        # admissions planned (policies that plan them) and made, preemptions whose room went unused
        "prefix_dup_copies": int(sim.dup_copies),
        "prefix_dup_tokens": int(sim.dup_tokens),
        "planned_admits": (int(decisions["n_proposed"].sum()) if getattr(sim.policy, "plans_admissions", False)
                           else None),
        "admitted": int(decisions["n_admitted"].sum()),
        "preempt_unused": int(sim.preempt_unused),
        "retractions": int(requests["retractions"].sum()) if len(requests) else 0,
        "queue_time_mean": float(requests["queue_time"].mean()) if len(requests) else float("nan"),
        "kv_util_mean": _time_weighted_util(timeline, sim.budget),
        "n_decisions": len(decisions),
        "sim_wall_s": wall_seconds,
        "decision_wall_mean_ms": float(wall.mean() * 1e3) if len(wall) else 0.0,
        "decision_wall_p50_ms": percentile(wall, 50) * 1e3 if len(wall) else 0.0,
        "decision_wall_p99_ms": percentile(wall, 99) * 1e3 if len(wall) else 0.0,
        "decision_wall_share": float(wall.sum() / makespan) if makespan > 0 else 0.0,
    }
    return SimResult(tasks, requests, prefix_events, timeline, decisions, summary)


def _time_weighted_util(timeline: pd.DataFrame, budget: int) -> float:
    """Mean KV occupancy (prefixes + requests) / B over time, each sample held until the next."""
    if len(timeline) < 2:
        return 0.0
    t = timeline["time"].to_numpy(dtype=float)
    used = (timeline["prefix_tokens"] + timeline["request_tokens"]).to_numpy(dtype=float)
    dt = np.diff(t)
    total = dt.sum()
    return float((used[:-1] * dt).sum() / total / budget) if total > 0 else 0.0


def stability_ratio(tasks: pd.DataFrame) -> float:
    """Last-quarter / first-quarter mean JCT, tasks ordered by arrival: near 1 when the queue is
    bounded, well above 1 when it keeps growing (the load is beyond the policy's capacity).
    Blind to a policy that starves old tasks (LPM): its first quarter waits as long as its last."""
    t = tasks.sort_values("arrival", kind="stable")
    q = max(1, len(t) // 4)
    return float(t["jct"].iloc[-q:].mean() / t["jct"].iloc[:q].mean())


def completion_ratio(tasks: pd.DataFrame, skip: float = 0.25) -> float:
    """Tasks completed / tasks arrived over the arrival window after warm-up: from the arrival
    of the ``skip`` quantile task to the last arrival. A bounded queue completes what arrives
    (ratio near 1, up to the change in the number of tasks in the system); an overloaded engine
    completes at its own rate ``mu < lambda`` (ratio near ``mu / lambda``), whichever tasks it
    starves. Robust where :func:`stability_ratio` is not."""
    arr = np.sort(tasks["arrival"].to_numpy(dtype=float))
    fin = tasks["finish"].to_numpy(dtype=float)
    i0 = int(math.floor(skip * (len(arr) - 1)))
    t0, t1 = arr[i0], arr[-1]
    arrived = len(arr) - 1 - i0
    if arrived < 1 or not t1 > t0:
        return float("nan")
    done = int(((fin > t0) & (fin <= t1)).sum())
    return done / arrived
