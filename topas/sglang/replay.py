"""Replay a workflow trace against a running SGLang server; results in the simulator's format.

:func:`run_replay` (and ``topas replay``) submits each task at its arrival time (the trace's own
times, or Poisson arrivals re-timed by :func:`topas.workload.arrivals.retime`), each stage as soon
as all its parents have finished, as ``/generate`` calls with:

* ``input_ids`` from :mod:`topas.sglang.tokens` (requests of an agent share exactly its prefix),
* ``max_new_tokens`` = the trace's output length with ``ignore_eos`` (so the server produces
  exactly ``y_v`` tokens; the server-side policy never sees it),
* the workflow metadata in ``sampling_params.custom_params["topas"]``
  (:class:`topas.sglang.adapter.RequestMeta`, a JSON string), including the run's policy and
  parameters, which the plugin runs for this run.

The result is a :class:`topas.engine.metrics.SimResult` with the simulator's tables and summary
keys, so notebooks plot either engine unchanged. What a server cannot tell is NaN (see
``NAN_REQUEST_COLUMNS`` / ``NAN_SUMMARY_KEYS``); with the plugin's decision log readable
(``decision_log``, the server's ``TOPAS_DECISION_LOG`` on the same host) the decisions table,
first admission times, queue times, preemptions and pin events are filled from it. Extra
columns: ``requests.cached_tokens``, ``prompt_tokens``, ``e2e_latency`` (server-reported),
``server_received`` and ``server_finished`` (when the server's tokenizer manager received the
request and saw it finish, in run time: ``meta_info.request_received_ts`` /
``request_finished_ts`` - the run's start, both wall clocks of this host; NaN unless the server
runs with ``--enable-metrics``; they split a request's latency into the path to the server, the
server's own time and the path back), ``server_admitted`` and ``server_prefilled`` (when the
scheduler first put the request into a prefill batch, ``meta_info.forward_entry_time``, one
timestamp per batch, and when that prefill finished: the admission wave without the plugin's
log; also NaN without ``--enable-metrics``), ``server_queued`` (when the request reached the
scheduler's waiting queue, see :func:`scheduler_arrival`; NaN without ``--enable-metrics`` and
for a retracted request), ``decisions.fallback``; extra summary keys: ``engine``, ``cached_tokens``, ``fallbacks``.
Caveat: ``requests.retractions`` is the server's ``num_retractions``, which also counts the
plugin's preemptions (it re-queues them as retracted requests); engine retractions alone are
``retractions - preemptions`` (``topas.fidelity.compare`` subtracts them).
Times are seconds since the run's start (client clock); JCT = the client's receipt of the last
stage's response - the task's scheduled arrival.

Before the first request, the server is checked (:mod:`topas.sglang.server`, ``handshake``): it
must run the topas plugin, able to run the run's policy, and its KV pool must hold every request's
prompt and output (``l_a + x_v + y_v`` tokens), else SGLang would cut the output short. After the
run, the plugin's decision count for it is read from ``/server_info``: a run the plugin made no
decision for was scheduled by SGLang alone and raises :class:`ReplayError` (nothing is stored).

Failure is loud: a request that fails (HTTP error, malformed response, aborted by the server),
or a run that exceeds ``timeout_s``, raises :class:`ReplayError` and nothing is written.
Connection errors before a request reaches the server (refused, reset while connecting) and
HTTP 503 are retried with backoff, up to ``retries`` times per request.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from topas.engine.metrics import SimResult, completion_ratio, percentile, stability_ratio
from topas.sglang.adapter import DECISION_COLUMNS, RequestMeta, rid_with_meta
from topas.sglang.text import ids_to_text
from topas.sglang.tokens import request_ids
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


class ReplayError(RuntimeError):
    """The replay did not complete: a request failed, or the run timed out."""


@dataclass
class _Done:
    rid: str
    task_id: str
    stage_id: str
    agent: str
    x: int
    ready: float
    finish: float
    meta_info: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- the client


async def _post(session, url: str, body: dict, retries: int, what: str, want_json: bool = True) -> Any:
    import aiohttp

    delay = 0.2
    for attempt in range(retries + 1):
        try:
            async with session.post(url, json=body) as resp:
                text = await resp.text()
                if resp.status == 503 and attempt < retries:
                    raise _Retry(f"HTTP 503: {text[:200]}")
                if resp.status != 200:
                    raise ReplayError(f"{what}: HTTP {resp.status}: {text[:500]}")
                if not want_json:
                    return text
                try:
                    return json.loads(text)
                except ValueError:
                    raise ReplayError(f"{what}: response is not JSON: {text[:200]!r}") from None
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, ConnectionResetError, _Retry) as e:
            # ServerDisconnectedError on a keep-alive connection closed by the server before our
            # request was read; a request the server did accept never disconnects like this.
            if attempt >= retries:
                raise ReplayError(f"{what}: {type(e).__name__}: {e} (after {retries} retries)") from e
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
    raise AssertionError("unreachable")


class _Retry(Exception):
    pass


async def wait_healthy(server: str, timeout_s: float = 120.0) -> None:
    """Wait until ``server`` answers ``GET /health`` with 200 (raises ReplayError on timeout)."""
    import aiohttp

    deadline = time.monotonic() + timeout_s
    last = "no answer"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        while time.monotonic() < deadline:
            try:
                async with s.get(f"{server}/health") as r:
                    if r.status == 200:
                        return
                    last = f"HTTP {r.status}"
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                last = f"{type(e).__name__}: {e}"
            await asyncio.sleep(0.5)
    raise ReplayError(f"server {server} not healthy after {timeout_s:g} s ({last})")


async def _replay(trace: Trace, server: str, policy: str | None, params: dict, run_id: str,
                  timeout_s: float, request_timeout_s: float, retries: int, flush: bool,
                  on_progress: Callable[[int, int], None] | None,
                  knowledge: tuple[tuple[str, Any], ...] = (),
                  send_text: bool = False, meta_in_rid: bool = False) -> tuple[list[_Done], dict[str, float], float]:
    import aiohttp

    agents = tuple((a.name, a.prefix_tokens, float(a.expected_output_tokens)) for a in trace.agents.values())
    index = {}
    for task in trace.tasks:
        for s in task.stages:
            index[(task.id, s.id)] = len(index)
    done: list[_Done] = []
    task_finish: dict[str, float] = {}
    timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=10)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:
        if flush:
            await _post(session, f"{server}/flush_cache", {}, retries, "flush_cache", want_json=False)
        loop = asyncio.get_running_loop()
        t0 = time.time()
        m0 = loop.time()

        def now() -> float:
            return loop.time() - m0

        async def run_stage(task, s, parents_done: list[asyncio.Event], finished: asyncio.Event) -> None:
            for ev in parents_done:
                await ev.wait()
            ready = now()
            meta = RequestMeta(
                run=run_id, t0=t0, task=task.id, stage=s.id, workflow=task.workflow, arrival=task.arrival,
                ready=ready, dag=tuple((q.id, q.agent, q.input_tokens, tuple(q.parents)) for q in task.stages),
                agents=agents, policy=policy, params=tuple(sorted(params.items())), knowledge=knowledge,
            )
            ids = request_ids(s.agent, trace.agents[s.agent].prefix_tokens, run_id, index[(task.id, s.id)],
                              task.id, s.id, s.input_tokens)
            rid = f"{run_id}:{task.id}/{s.id}"
            body = {
                "rid": rid_with_meta(rid, meta) if meta_in_rid else rid,
                **({"text": ids_to_text(ids)} if send_text else {"input_ids": ids}),
                "sampling_params": {"max_new_tokens": int(s.output_tokens), "ignore_eos": True,
                                    "temperature": 0.0, "custom_params": {"topas": meta.to_json()}},
            }
            out = await _post(session, f"{server}/generate", body, retries, f"request {task.id}/{s.id}")
            mi = out.get("meta_info") or {}
            fr = mi.get("finish_reason") or {}
            if isinstance(fr, dict) and fr.get("type") == "abort":
                raise ReplayError(f"request {task.id}/{s.id} aborted by the server: {fr.get('message')}")
            got = mi.get("completion_tokens")
            if got is not None and int(got) != int(s.output_tokens):
                need = len(ids) + int(s.output_tokens)
                raise ReplayError(
                    f"request {task.id}/{s.id}: {got} output tokens, expected {s.output_tokens}; SGLang stops a "
                    f"request early when its prompt + output ({need} tokens) do not fit its KV pool or context "
                    f"length: give the server a larger pool (--max-total-tokens / --mem-fraction-static) or "
                    f"--context-length")
            done.append(_Done(f"{task.id}/{s.id}", task.id, s.id, s.agent, s.input_tokens, ready, now(), mi))
            finished.set()

        async def run_task(task) -> None:
            delay = task.arrival - now()
            if delay > 0:
                await asyncio.sleep(delay)
            events = {s.id: asyncio.Event() for s in task.stages}
            await asyncio.gather(*(run_stage(task, s, [events[p] for p in s.parents], events[s.id])
                                   for s in task.stages))
            task_finish[task.id] = now()
            if on_progress is not None:
                on_progress(len(task_finish), len(trace.tasks))

        jobs = [asyncio.ensure_future(run_task(t)) for t in trace.tasks]
        try:
            await asyncio.wait_for(asyncio.gather(*jobs), timeout=timeout_s)
        except asyncio.TimeoutError:
            raise ReplayError(
                f"replay timed out after {timeout_s:g} s: {len(task_finish)} of {len(trace.tasks)} tasks "
                f"and {len(done)} of {trace.num_requests} requests finished") from None
        finally:
            for j in jobs:
                j.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
    return done, task_finish, t0


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
        "fallbacks": int(dec["fallback"].notna().sum()) if have_log else nan,
    }
    return SimResult(tasks, requests, prefix_events, timeline, dec, summary)


def check_server(server: str, trace: Trace, policy: str | None) -> None:
    """The handshake before a replay (see the module docstring); :class:`ReplayError` naming the fix."""
    from topas.sglang import server as srv

    try:
        targets = srv.servers_behind(server)
        ident = srv.common_identity(targets)
        if policy is not None:
            for u in targets:
                srv.check_policy(u, policy)
    except srv.ServerError as e:
        raise ReplayError(str(e)) from None
    need, worst = 0, ""
    for t in trace.tasks:
        for s in t.stages:
            n = trace.agents[s.agent].prefix_tokens + s.input_tokens + s.output_tokens
            if n > need:
                need, worst = n, f"{t.id}/{s.id}"
    if need > ident.kv_pool_tokens:
        raise ReplayError(
            f"the KV pool of {server} ({ident.kv_pool_tokens} tokens) cannot hold request {worst} (prefix + "
            f"input + output = {need} tokens), so SGLang would cut its output short: give the server a larger "
            f"pool (--max-total-tokens / --mem-fraction-static) or replay fewer/shorter tasks")


def check_decisions(server: str, run_id: str, policy: str) -> dict[str, Any]:
    """The plugin's decision count of a finished run; :class:`ReplayError` when it made none (SGLang's
    own scheduler ran every request, so the result would be mislabelled ``policy``)."""
    from topas.sglang import server as srv

    try:
        targets = srv.servers_behind(server)
        runs = combine_runs([srv.run_decisions(u, run_id) for u in targets])
    except srv.ServerError as e:
        raise ReplayError(f"after the replay: {e}") from None
    if not runs or runs["decisions"] == 0:
        raise ReplayError(
            f"the topas plugin on {server} made no decision for run {run_id} (policy {policy}): SGLang's own "
            f"scheduler ran it, so it is not a {policy} result and is not kept; check the server's log for "
            f"'topas' errors ({srv.PLUGIN_FIX})")
    return runs


def combine_runs(runs: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """One run's plugin counts summed over servers (a router's workers; ``None``: that server saw
    none of the run), with ``per_server`` the decisions of each when there are several; ``None``
    when none saw it."""
    seen = [r for r in runs if r]
    if not seen:
        return None
    out = {"policy": seen[0].get("policy"), "decisions": sum(int(r.get("decisions", 0)) for r in seen),
           "fallbacks": sum(int(r.get("fallbacks", 0)) for r in seen)}
    if len(runs) > 1:
        out["per_server"] = [int(r.get("decisions", 0)) if r else 0 for r in runs]
    return out


def write_result_atomic(result: SimResult, out: str | os.PathLike) -> Path:
    """Write ``result`` to ``out`` (a directory) all at once: into a sibling temp dir, then rename."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        from topas.paths import usual_mode

        result.to_parquet(tmp)
        usual_mode(tmp)  # mkdtemp made it 0700
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


# ----------------------------------------------------------------------------- the entry point


def run_replay(
    prepared_or_experiment: Any,
    server_url: str,
    *,
    decision_log: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    out: str | os.PathLike | None = None,
    timeout_s: float = 3600.0,
    request_timeout_s: float = 1800.0,
    retries: int = 5,
    flush_cache: bool = True,
    send_policy: bool = True,
    wait_healthy_s: float = 60.0,
    progress: bool | Callable[[int, int], None] | None = None,
    handshake: bool = True,
    send_text: bool = False,
) -> SimResult:
    """Replay an experiment's trace against the SGLang server at ``server_url``.

    ``prepared_or_experiment`` is a :class:`topas.experiments.spec.Prepared` (its ``trace``, already
    re-timed, its ``policy``) or an :class:`~topas.experiments.spec.Experiment` (prepared here).
    With ``send_policy`` the run's metadata names the policy and its resolved parameters, which the
    plugin then runs for this run (one server serves a whole sweep); otherwise the server's
    ``TOPAS_POLICY`` decides. ``decision_log``: the server's ``TOPAS_DECISION_LOG`` file when it is
    readable here (fills decisions, admissions, preemptions, pins; default: ``$TOPAS_DECISION_LOG``
    if that file exists here). ``progress``: True for a progress bar on stderr, or a callable
    ``(tasks finished, tasks)``. ``flush_cache``: start from an
    empty radix cache (``POST /flush_cache``). ``out``: also write the tables there (atomically).
    ``handshake``: check the server first (plugin, policy, KV pool) and the plugin's decisions
    after (see the module docstring).
    ``send_text``: send each request's prompt as text (:func:`topas.sglang.text.ids_to_text`, one
    character per token id) instead of ``input_ids``, for a router that routes on text
    (``sglang-router``'s ``cache_aware``); the servers must load the matching tokenizer
    (``tools/sglang_cpu/make_tiny_model.py`` writes it for the tiny CPU model), not
    ``--skip-tokenizer-init``. The tokens the servers see are the same either way.
    ``server_url`` may be an SGLang router (``sglang-router``: it answers ``GET /workers``): the
    handshake then checks every worker (same identity, the plugin, the policy), the plugin's
    decisions after the run are summed over the workers (``summary["plugin_decisions_per_server"]``,
    in the router's worker order), ``/flush_cache`` goes through the router (it flushes every
    worker), and ``decision_log`` may be a list of files (one per worker).
    Raises :class:`ReplayError` if any request fails or the run exceeds ``timeout_s``, the server
    fails the handshake, or the plugin made no decision for the run.
    """
    import dataclasses

    if not hasattr(prepared_or_experiment, "trace"):  # an Experiment, prepared here (as on the simulator)
        exp = prepared_or_experiment
        prepared = replace(exp, engine="sim").prepare() if exp.engine != "sim" else exp.prepare()
    else:
        prepared = prepared_or_experiment
    trace: Trace = prepared.trace
    policy = prepared.policy
    fixed = getattr(type(policy), "FIXED", None) or {}  # an ablation's fixed values may not be passed
    params = {k: v for k, v in dataclasses.asdict(policy.params).items() if k not in fixed}
    run_id = uuid.uuid4().hex[:12]
    from topas.sglang import server as srv

    try:
        server = srv.check_url(server_url)
    except srv.ServerError as e:
        raise ReplayError(str(e)) from None
    # what the plugin's policy may know (issue 16): sent with every request, applied by the adapter
    knowledge = tuple(sorted(prepared.knowledge.settings().items())) if prepared.knowledge is not None else ()

    workers = None  # the workers behind a router (set once the router is healthy)

    async def main():
        nonlocal workers
        await wait_healthy(server, wait_healthy_s)
        workers = srv.router_workers(server)
        if handshake:
            check_server(server, trace, policy.name if send_policy else None)
        return await _replay(trace, server, policy.name if send_policy else None, params if send_policy else {},
                             run_id, timeout_s, request_timeout_s, retries, flush_cache, progress, knowledge,
                             send_text, meta_in_rid=bool(workers))

    bar = None
    if progress is True:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(trace.tasks), desc=f"replay {policy.name}", unit="task")
        progress = lambda k, n: bar.update(1)  # noqa: E731
    elif not callable(progress):
        progress = None
    if decision_log is None and os.environ.get("TOPAS_DECISION_LOG"):
        if Path(os.environ["TOPAS_DECISION_LOG"]).exists():
            decision_log = os.environ["TOPAS_DECISION_LOG"]
    w0 = time.perf_counter()
    try:
        done, task_finish, t0 = asyncio.run(main())
    finally:
        if bar is not None:
            bar.close()
    wall = time.perf_counter() - w0
    if len(task_finish) != len(trace.tasks) or len(done) != trace.num_requests:  # pragma: no cover - guarded above
        raise ReplayError(f"incomplete replay: {len(task_finish)} of {len(trace.tasks)} tasks")
    log = None
    if decision_log is not None:
        time.sleep(0.2)  # the scheduler logs the last admissions asynchronously to our receipt
        log = read_decision_logs(decision_log, run_id)
    if send_policy:
        name = policy.name
    else:  # the server's own policy ran it: label the result with the policy the plugin names
        first = (workers or [server])[0]  # the router's workers, read once the router was healthy
        name = str(srv.plugin_block(first, refresh=True).get("policy")) if handshake else "server"
    plugin_runs = check_decisions(server, run_id, name) if handshake else None
    result = build_replay_result(trace, name, done, task_finish, wall, log, run_id, t0)
    result.summary["run_id"] = run_id
    if plugin_runs is not None:
        result.summary["plugin_decisions"] = plugin_runs["decisions"]
        result.summary["plugin_fallbacks"] = plugin_runs["fallbacks"]
        if len(plugin_runs.get("per_server", ())) > 1:
            result.summary["plugin_decisions_per_server"] = list(plugin_runs["per_server"])
    if out is not None:
        write_result_atomic(result, out)
    return result
