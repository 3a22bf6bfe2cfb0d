"""A finished replay as the simulator's result: its tables, summary and the plugin's decision log.

:func:`build_replay_result` turns what the client saw (:class:`topas.sglang.client._Done`, each
task's finish) and the plugin's decision log (:func:`read_decision_logs`, when readable) into a
:class:`topas.engine.metrics.SimResult` with the simulator's columns and summary keys (what a
server cannot tell is NaN: :data:`NAN_REQUEST_COLUMNS`, :data:`NAN_SUMMARY_KEYS`; the columns
and keys beyond the simulator's are listed in :mod:`topas.sglang.replay`).
:func:`write_result_atomic` writes one all at once.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from topas.engine.metrics import SimResult, completion_ratio, percentile, stability_ratio
from topas.out_dir import mark
from topas.paths import usual_mode
from topas.sglang.adapter import DECISION_COLUMNS
from topas.sglang.client import _Done
from topas.workload.model import Trace

NAN_REQUEST_COLUMNS = ("prefill_time", "decode_time", "recomputed_tokens")
NAN_SUMMARY_KEYS = ("avg_decode_batch", "decode_steps", "busy_time", "prefix_loads_swap",
                    "prefix_loads_prefill", "prefix_evictions", "bytes_swapped", "recomputed_tokens",
                    "kv_util_mean")
REQUEST_COLUMNS = ["rid", "task_id", "stage_id", "agent", "input_tokens", "output_tokens", "ready",
                   "first_admit", "finish", "queue_time", "prefill_time", "decode_time", "preemptions",
                   "retractions", "recomputed_tokens", "prefix_hit", "cached_tokens", "prompt_tokens",
                   "e2e_latency", "server_received", "server_finished", "server_admitted", "server_prefilled",
                   "server_queued"]
TASK_COLUMNS = ["task_id", "workflow", "arrival", "finish", "jct", "n_stages"]
PREFIX_EVENT_COLUMNS = ["time", "agent", "event", "tokens", "bytes"]
TIMELINE_COLUMNS = ["time", "prefix_tokens", "request_tokens", "decode_batch", "prefill_queue", "waiting",
                    "evictable_tokens"]


# ----------------------------------------------------------------------------- the decision log


def read_decision_log(path: str | os.PathLike, run_id: str) -> list[dict]:
    """The plugin's JSONL records of one run (``run`` field; pin events by time window)."""
    recs = []
    p = Path(path)
    if not p.exists():
        return recs
    with open(p, encoding="utf-8") as f:
        for line in f:
            try:
                recs.append(json.loads(line))
            except ValueError:
                continue  # a line being written
    return recs


def read_decision_logs(paths: str | os.PathLike | Sequence[str | os.PathLike], run_id: str) -> list[dict]:
    """:func:`read_decision_log` of one file, or of several (one per server behind a router): then
    each record's ``seq`` / ``decision_seq`` becomes ``(file index, seq)`` (each server numbers its
    decisions from 1) and gains ``server`` (the file index)."""
    if isinstance(paths, (str, os.PathLike)):
        return read_decision_log(paths, run_id)
    recs = []
    for i, p in enumerate(paths):
        for r in read_decision_log(p, run_id):
            for k in ("seq", "decision_seq"):
                if k in r:
                    r[k] = (i, r[k])
            r["server"] = i
            recs.append(r)
    return recs


def _from_log(recs: list[dict], run_id: str, t0: float, t_end: float):
    decisions, admits, pins, preempts = [], {}, [], {}
    per_seq_admitted: dict[int, int] = {}
    for r in recs:
        kind = r.get("kind")
        if kind == "decision" and r.get("run") == run_id:
            decisions.append(r)
        elif kind == "admit" and r.get("run") == run_id:
            for a in r.get("admitted", []):
                admits.setdefault(a["rid"], r["time"])
            if r.get("decided") and not r.get("fallback"):
                per_seq_admitted[r["decision_seq"]] = per_seq_admitted.get(r["decision_seq"], 0) + len(r["admitted"])
        elif kind in ("pin", "unpin") and t0 <= r.get("epoch", -1) <= t_end:
            pins.append((r["epoch"] - t0, r["agent"], kind, int(r["tokens"]), 0.0))
    for d in decisions:
        for rid in d.get("preempt", []):
            preempts[rid] = preempts.get(rid, 0) + 1
    return decisions, admits, pins, preempts, per_seq_admitted


# ----------------------------------------------------------------------------- results


def _run_time(epoch: Any, t0: float) -> float:
    """A server wall-clock timestamp (seconds since the epoch) as seconds since the run's start."""
    return float(epoch) - t0 if isinstance(epoch, (int, float)) and epoch > 0 else float("nan")


def scheduler_arrival(meta_info: dict[str, Any], t0: float) -> float:
    """When the request entered the scheduler's waiting queue, in run time (seconds since ``t0``,
    the client's ``time.time()`` at the run's start); NaN when the server does not say.

    SGLang 0.5.x (``sglang/srt/observability/req_time_stats.py``, ``SchedulerReqTimeStats``) stamps
    ``wait_queue_entry_time`` when the scheduler's event loop ingests the request
    (``Scheduler._add_request_to_queue``, at an iteration boundary) and ``forward_entry_time``
    when a prefill batch first takes it; ``queue_duration_s`` adds ``forward - wait_queue_entry``
    for every entry into the queue, and ``meta_info["queue_time"]`` is that sum
    (``get_queueing_time``). ``meta_info["forward_entry_time"]`` is the scheduler's
    ``perf_counter`` stamp converted to wall-clock time (``time.time()`` of the server's host;
    the replay runs on the same host, so it shares ``t0``'s clock). Hence the arrival is
    ``forward_entry_time - queue_time``, exact for a request queued once. A retracted or preempted
    request (``num_retractions`` > 0) re-enters the queue and its ``queue_time`` sums every wait,
    so the difference is no arrival: NaN. Both keys need ``--enable-metrics`` (without it the
    scheduler sends no timestamps and the tokenizer reports ``queue_time`` = 0 with no
    ``forward_entry_time``: NaN)."""
    fwd, queued = meta_info.get("forward_entry_time"), meta_info.get("queue_time")
    if not (isinstance(fwd, (int, float)) and fwd > 0 and isinstance(queued, (int, float))
            and math.isfinite(queued) and queued >= 0):
        return float("nan")
    if int(meta_info.get("num_retractions", 0) or 0) > 0:
        return float("nan")
    return float(fwd) - float(queued) - t0


def build_replay_result(trace: Trace, policy_name: str, done: list[_Done], task_finish: dict[str, float],
                        wall_s: float, log: list[dict] | None, run_id: str, t0: float) -> SimResult:
    """The SimResult of a finished replay (see the module docstring for what is NaN)."""
    nan = float("nan")
    have_log = log is not None
    decisions, admits, pins, preempts, per_seq = _from_log(log or [], run_id, t0, t0 + wall_s + 60)
    tasks = pd.DataFrame([
        {"task_id": t.id, "workflow": t.workflow, "arrival": t.arrival, "finish": task_finish[t.id],
         "jct": task_finish[t.id] - t.arrival, "n_stages": len(t.stages)} for t in trace.tasks
    ], columns=TASK_COLUMNS)
    by_rid = {d.rid: d for d in done}
    rows = []
    for t in trace.tasks:
        for s in t.stages:
            d = by_rid[f"{t.id}/{s.id}"]
            mi = d.meta_info
            cached = mi.get("cached_tokens")
            first = admits.get(d.rid, nan) if have_log else nan
            rows.append({
                "rid": d.rid, "task_id": t.id, "stage_id": s.id, "agent": s.agent, "input_tokens": s.input_tokens,
                "output_tokens": int(mi.get("completion_tokens", s.output_tokens)), "ready": d.ready,
                "first_admit": first, "finish": d.finish,
                "queue_time": first - d.ready if have_log else nan,
                "prefill_time": nan, "decode_time": nan,
                "preemptions": preempts.get(d.rid, 0) if have_log else nan,
                "retractions": int(mi.get("num_retractions", 0) or 0),
                "recomputed_tokens": nan,
                "prefix_hit": bool(cached is not None and cached >= trace.agents[s.agent].prefix_tokens),
                "cached_tokens": cached if cached is not None else nan,
                "prompt_tokens": mi.get("prompt_tokens", nan),
                "e2e_latency": mi.get("e2e_latency", nan),
                "server_received": _run_time(mi.get("request_received_ts"), t0),
                "server_finished": _run_time(mi.get("request_finished_ts"), t0),
                "server_admitted": _run_time(mi.get("forward_entry_time"), t0),
                "server_prefilled": _run_time(mi.get("prefill_finished_time"), t0),
                "server_queued": scheduler_arrival(mi, t0),
            })
    requests = pd.DataFrame(rows, columns=REQUEST_COLUMNS)
    if any(getattr(d, "priority", None) is not None for d in done):  # --eviction-priority sent some
        requests["eviction_priority"] = pd.array([by_rid[r].priority for r in requests["rid"]], dtype="Int64")
    prefix_events = pd.DataFrame(sorted(pins), columns=PREFIX_EVENT_COLUMNS)
    timeline = pd.DataFrame([], columns=TIMELINE_COLUMNS)
    drows = [[d["time"], d["wall_s"], d["n_waiting"], d["n_running"], len(d["admit"]),
              per_seq.get(d["seq"], 0), len(d["preempt"]), len(d["evict"]), len(d["load"])] for d in decisions]
    dec = pd.DataFrame(drows, columns=DECISION_COLUMNS)
    dec["fallback"] = pd.Series([d.get("fallback") for d in decisions], dtype=object)
    infos = pd.DataFrame([d.get("info", {}) for d in decisions])
    if len(infos.columns):
        dec = pd.concat([dec, infos.add_prefix("info_")], axis=1)

    jct = tasks["jct"].to_numpy(dtype=float)
    makespan = float(tasks["finish"].max() - tasks["arrival"].min()) if len(tasks) else 0.0
    wall = dec["wall_s"].to_numpy(dtype=float)
    summary: dict[str, Any] = {
        "policy": policy_name,
        "n_tasks": len(tasks),
        "n_requests": len(requests),
        "jct_mean": float(jct.mean()) if len(jct) else nan,
        "jct_p50": percentile(jct, 50),
        "jct_p90": percentile(jct, 90),
        "jct_p99": percentile(jct, 99),
        "jct_last_first_quarter": stability_ratio(tasks) if len(tasks) else nan,
        "completion_ratio": completion_ratio(tasks) if len(tasks) else nan,
        "makespan": makespan,
        "throughput_rps": len(requests) / makespan if makespan > 0 else nan,
        "throughput_tps": len(tasks) / makespan if makespan > 0 else nan,
        "avg_decode_batch": nan, "decode_steps": nan, "busy_time": nan,
        "prefix_hits": int(requests["prefix_hit"].sum()),
        "prefix_loads_swap": nan, "prefix_loads_prefill": nan, "prefix_evictions": nan, "bytes_swapped": nan,
        "recomputed_tokens": nan,
        "preemptions": int(requests["preemptions"].sum()) if have_log else nan,
        "retractions": int(requests["retractions"].sum()),
        # what the simulator counts inside the engine (duplicate prefix copies, the plan against the
        # admissions, unused preemptions): not observable from the server's replies
        "prefix_dup_copies": nan, "prefix_dup_tokens": nan, "planned_admits": nan, "admitted": nan,
        "preempt_unused": nan,
        "queue_time_mean": float(requests["queue_time"].mean()) if have_log else nan,
        "kv_util_mean": nan,
        "n_decisions": len(dec) if have_log else nan,
        "sim_wall_s": wall_s,
        "decision_wall_mean_ms": float(wall.mean() * 1e3) if len(wall) else nan,
        "decision_wall_p50_ms": percentile(wall, 50) * 1e3 if len(wall) else nan,
        "decision_wall_p99_ms": percentile(wall, 99) * 1e3 if len(wall) else nan,
        "decision_wall_share": float(wall.sum() / makespan) if len(wall) and makespan > 0 else nan,
        "engine": "sglang",
        "cached_tokens": float(np.nansum(requests["cached_tokens"].to_numpy(dtype=float))),
        "prompt_tokens": float(np.nansum(requests["prompt_tokens"].to_numpy(dtype=float))),
        "fallbacks": int(dec["fallback"].notna().sum()) if have_log else nan,
    }
    return SimResult(tasks, requests, prefix_events, timeline, dec, summary)

def write_result_atomic(result: SimResult, out: str | os.PathLike) -> Path:
    """Write ``result`` to ``out`` (a directory) all at once: into a sibling temp dir, then rename."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        result.to_parquet(tmp)
        mark(tmp, "replay")
        usual_mode(tmp)  # mkdtemp made it 0700
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
