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
import dataclasses
import os
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

from tqdm.auto import tqdm

from topas.engine.metrics import SimResult
from topas.sglang import server as srv
from topas.sglang.client import ReplayError, _Done, require_client, wait_healthy  # noqa: F401
from topas.sglang.client import replay_requests as _replay
from topas.sglang.priority import make_rule
from topas.sglang.replay_result import (NAN_REQUEST_COLUMNS, NAN_SUMMARY_KEYS, PREFIX_EVENT_COLUMNS,  # noqa: F401
                                        REQUEST_COLUMNS, TASK_COLUMNS, TIMELINE_COLUMNS, build_replay_result,
                                        read_decision_log, read_decision_logs, scheduler_arrival,
                                        write_result_atomic)
from topas.workload.model import Trace


def check_server(server: str, trace: Trace, policy: str | None) -> None:
    """The handshake before a replay (see the module docstring); :class:`ReplayError` naming the fix."""

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
    eviction_priority: str | None = None,
) -> SimResult:
    """Replay an experiment's trace against the SGLang server at ``server_url``.

    ``prepared_or_experiment`` is a prepared experiment (:class:`topas.experiments.spec.Prepared`:
    its ``trace``, already re-timed, its ``policy``, its ``knowledge``; an experiment is prepared
    by its caller, so this engine does not import the experiment layer).
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
    ``eviction_priority``: a rule of :mod:`topas.sglang.priority` (``none``, ``policy``, ...) giving
    each request the top-level ``"priority"`` SGLang's ``--radix-eviction-policy priority`` orders
    the radix tree's leaves by (the requests table then has an ``eviction_priority`` column and the
    summary the rule's name); None or ``none``: no priority sent.
    ``server_url`` may be an SGLang router (``sglang-router``: it answers ``GET /workers``): the
    handshake then checks every worker (same identity, the plugin, the policy), the plugin's
    decisions after the run are summed over the workers (``summary["plugin_decisions_per_server"]``,
    in the router's worker order), ``/flush_cache`` goes through the router (it flushes every
    worker), and ``decision_log`` may be a list of files (one per worker).
    Raises :class:`ReplayError` if any request fails or the run exceeds ``timeout_s``, the server
    fails the handshake, or the plugin made no decision for the run.
    """

    require_client()
    prepared = prepared_or_experiment
    trace: Trace = prepared.trace
    policy = prepared.policy
    fixed = getattr(type(policy), "FIXED", None) or {}  # an ablation's fixed values may not be passed
    params = {k: v for k, v in dataclasses.asdict(policy.params).items() if k not in fixed}
    run_id = uuid.uuid4().hex[:12]

    try:
        rule = make_rule(eviction_priority, policy)
    except ValueError as e:
        raise ReplayError(str(e)) from None

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
                             send_text, meta_in_rid=bool(workers), priority_rule=rule,
                             cost=getattr(prepared, "cost", None))

    bar = None
    if progress is True:
        bar = tqdm(total=len(trace.tasks), desc=f"replay {policy.name}", unit="task")
        progress = lambda k, n: bar.update(1)  # noqa: E731
    elif not callable(progress):
        progress = None
    if decision_log is None and os.environ.get("TOPAS_DECISION_LOG"):
        if Path(os.environ["TOPAS_DECISION_LOG"]).exists():
            decision_log = os.environ["TOPAS_DECISION_LOG"]
    w0 = time.perf_counter()
    async def bounded():  # the whole replay, handshake and flush included, within timeout_s
        try:
            return await asyncio.wait_for(main(), timeout=timeout_s)
        except asyncio.TimeoutError:
            raise ReplayError(f"replay timed out after {timeout_s:g} s (server {server})") from None

    try:
        done, task_finish, t0 = asyncio.run(bounded())
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
    if rule is not None:
        result.summary["eviction_priority"] = eviction_priority
    if plugin_runs is not None:
        result.summary["plugin_decisions"] = plugin_runs["decisions"]
        result.summary["plugin_fallbacks"] = plugin_runs["fallbacks"]
        if len(plugin_runs.get("per_server", ())) > 1:
            result.summary["plugin_decisions_per_server"] = list(plugin_runs["per_server"])
    if out is not None:
        write_result_atomic(result, out)
    return result
