"""The replay's HTTP client: submit a trace's tasks to an SGLang server at their arrival times.

:func:`replay_requests` submits each task at its arrival time, each stage as soon as all its
parents have finished, as ``/generate`` calls (``input_ids`` from :mod:`topas.sglang.tokens`, or
their text for a text-matching router; ``max_new_tokens`` = the trace's output length with
``ignore_eos``; the workflow metadata in ``sampling_params.custom_params["topas"]``, or in the
request id through a router; with a priority rule (:mod:`topas.sglang.priority`), the request's
eviction priority as the top-level ``"priority"`` integer) and returns what each request and task did, on the client's clock.
Connection errors before a request reaches the server (refused, reset while connecting) and
HTTP 503 are retried with backoff; anything else that fails raises :class:`ReplayError`.
:func:`require_client` names the install command when the client's dependency is missing.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from topas.sglang.adapter import RequestMeta, rid_with_meta
from topas.sglang.priority import PriorityContext, check_priority, client_priority
from topas.sglang.text import ids_to_text
from topas.sglang.tokens import stage_ids
from topas.workload.model import Trace

if TYPE_CHECKING:  # pragma: no cover
    from topas.sglang.priority import PriorityRule

__all__ = ["ReplayError", "CLIENT_INSTALL", "require_client", "wait_healthy", "replay_requests", "priority_body"]

#: How to install the replay client's dependency (aiohttp), quoted when it is missing.
CLIENT_INSTALL = "pip install -e '.[sglang]'"


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
    priority: int | None = None  # the top-level "priority" sent (None: none sent)


def priority_body(body: dict, priority: int | None) -> int | None:
    """Put ``priority`` into a ``/generate`` body as SGLang takes it: a top-level ``"priority"``
    integer (``GenerateReqInput.priority``, ``managers/io_struct.py``); nothing for None. Returns it."""

    p = check_priority(priority, f"request {body.get('rid')}")
    if p is not None:
        body["priority"] = p
    return p


def require_client() -> None:
    """:class:`ReplayError` naming the install command unless the client's HTTP library (aiohttp,
    in the ``sglang`` extra) can be imported."""
    try:
        import aiohttp  # noqa: F401  (lazy: optional, the replay client's only)
    except ImportError:
        raise ReplayError(f"the replay client needs aiohttp, which is not installed: {CLIENT_INSTALL} "
                          f"(or pip install aiohttp)") from None


async def _post(session, url: str, body: dict, retries: int, what: str, want_json: bool = True) -> Any:
    import aiohttp  # lazy: optional, the replay client's only

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
    import aiohttp  # lazy: optional, the replay client's only

    deadline = time.monotonic() + timeout_s
    last = "no answer"
    per = min(10.0, timeout_s)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=per, sock_connect=per, sock_read=per)) as s:
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

async def replay_requests(trace: Trace, server: str, policy: str | None, params: dict, run_id: str,
                  timeout_s: float, request_timeout_s: float, retries: int, flush: bool,
                  on_progress: Callable[[int, int], None] | None,
                  knowledge: tuple[tuple[str, Any], ...] = (),
                  send_text: bool = False, meta_in_rid: bool = False,
                  priority_rule: "PriorityRule | None" = None, cost: Any = None,
                  ) -> tuple[list[_Done], dict[str, float], float]:
    import aiohttp  # lazy: optional, the replay client's only

    agents = tuple((a.name, a.prefix_tokens, float(a.expected_output_tokens)) for a in trace.agents.values())
    index = {}
    for task in trace.tasks:
        for s in task.stages:
            index[(task.id, s.id)] = len(index)
    done: list[_Done] = []
    task_finish: dict[str, float] = {}
    in_flight: dict[str, set[str]] = {}  # task id -> its finished stages, while the task runs
    by_id = {t.id: t for t in trace.tasks}
    # --timeout bounds connecting, each read and the whole request as well as the run
    request_timeout_s = min(request_timeout_s, timeout_s)
    timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=min(10.0, request_timeout_s),
                                    sock_read=request_timeout_s)
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
            ids = stage_ids(trace, task.id, s, run_id, index[(task.id, s.id)])
            rid = f"{run_id}:{task.id}/{s.id}"
            body = {
                "rid": rid_with_meta(rid, meta) if meta_in_rid else rid,
                **({"text": ids_to_text(ids)} if send_text else {"input_ids": ids}),
                "sampling_params": {"max_new_tokens": int(s.output_tokens), "ignore_eos": True,
                                    "temperature": 0.0, "custom_params": {"topas": meta.to_json()}},
            }
            prio = None
            if priority_rule is not None:
                ctx = PriorityContext(trace=trace, task=task, stage=s, now=ready, cost=cost,
                                      done={t: frozenset(v) for t, v in in_flight.items()}, index=by_id)
                prio = priority_body(body, client_priority(priority_rule, ctx))
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
            done.append(_Done(f"{task.id}/{s.id}", task.id, s.id, s.agent, s.input_tokens, ready, now(), mi, prio))
            in_flight[task.id].add(s.id)
            finished.set()

        async def run_task(task) -> None:
            delay = task.arrival - now()
            if delay > 0:
                await asyncio.sleep(delay)
            events = {s.id: asyncio.Event() for s in task.stages}
            in_flight[task.id] = set()
            await asyncio.gather(*(run_stage(task, s, [events[p] for p in s.parents], events[s.id])
                                   for s in task.stages))
            task_finish[task.id] = now()
            del in_flight[task.id]
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
