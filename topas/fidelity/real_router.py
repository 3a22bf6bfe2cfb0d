"""A real router's choices against the simulator's router model (``make test-cluster``).

A replay through ``sglang-router`` (``topas replay --server ROUTER``) does not learn from the
router where each request went. The servers do: each worker's topas plugin writes every request
it admits to its decision log (``admit`` records, by the policy's request id ``task/stage``), so
:func:`choices_from_logs` reads the router's choice of every request from the workers' logs
(worker ``i`` = the router's i-th worker, ``GET /workers``, the order of ``--worker-urls``).

Two comparisons with the simulator's :mod:`~topas.cluster.routers.sglang_cache_aware`:

* :func:`rule_choices`: the router model fed the real run: the requests in the order they reached
  the router (the client's send time, ``requests.ready``), each worker's load the requests the
  router had sent it that had not finished (``ready <= t < finish`` on the client's clock; the
  router counts the same requests between its send and the response). It checks the *rule*;
  with ``window_s`` (:data:`TIMING_WINDOW_S`) it reads each miss within what the run's stamps
  leave open of when the router counted each request (the servers' receipt and finish stamps
  where the table has them, else ``window_s`` on the client's clock).
* :func:`simulated_choices`: the whole cluster simulated on the same trace (own timing from a
  cost profile): the rule plus the simulator's timing, as a sweep would use it.

:func:`agreement` gives the fraction of requests both sent to the same worker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product
from typing import Any, Iterable, Mapping, Sequence

from topas.cluster.simulator import simulate_cluster
from topas.cluster.state import EngineState, RouteRequest
from topas.policies.base import make_policy


def choices_from_logs(logs: Sequence[Iterable[Mapping[str, Any]]], run_id: str) -> dict[str, int]:
    """``{rid: worker index}`` of one run from each worker's plugin decision-log records
    (:func:`topas.sglang.replay.read_decision_log`): the workers whose ``admit`` records of
    ``run_id`` name the request. ``ValueError`` naming a request admitted by two workers."""
    out: dict[str, int] = {}
    for i, recs in enumerate(logs):
        for r in recs:
            if r.get("kind") != "admit" or r.get("run") != run_id:
                continue
            for a in r.get("admitted", ()):
                rid = a["rid"]
                if out.get(rid, i) != i:
                    raise ValueError(f"request {rid} of run {run_id} was admitted by workers {out[rid]} and {i}")
                out[rid] = i
    return out


#: How far apart (seconds, on the client's clock) two events must be for the client to know the
#: order the router saw them in, where the server gave no timestamps (:func:`rule_choices`'s
#: ``window_s``).
TIMING_WINDOW_S = 0.1


def rule_choices(requests: Any, prefix_tokens: Mapping[str, int], router: Any, choices: Mapping[str, int],
                 n_workers: int, window_s: float = 0.0, resolved: set[str] | None = None) -> dict[str, int]:
    """The router model's choice of every request, fed the real run (module docstring).

    ``requests``: the replay's requests table (``rid``, ``task_id``, ``stage_id``, ``agent``,
    ``input_tokens``, ``ready``, ``finish``; optionally ``server_received`` and
    ``server_finished``); ``choices``: where the real router sent each one (for the loads);
    ``router``: a fresh router object (``make_router("sglang-cache-aware")``). Ties in ``ready``
    go in rid order.

    ``window_s`` (0: the client's clock is taken as the router's, strictly): a *miss* (a request
    whose prefix no worker's tree holds: the router sends it to the least-loaded worker) is decided
    by the loads at the instant the router reads them, which the client does not see.
    ``sgl-model-gateway``'s HTTP router reads every worker's load in ``select_worker`` before it
    counts the request, and drops its load guard when it has read the worker's answer. So with
    ``window_s`` > 0 each request's stay in the router's count is known only within bounds
    (:func:`_stay_bounds`): it starts after the client sent it and before the server received it,
    and ends after the server finished it and before the client had its answer; a miss's reading
    lies between its own send and its server's receipt. Where the requests table has the
    server's stamps (``server_received`` / ``server_finished``, servers run with
    ``--enable-metrics``) they are the bounds; where it has not, ``window_s`` past the client's
    send and before its receipt. Every request whose counting those bounds leave open is counted
    or not, each way (:func:`_loads_read`); when the real choice is the least-loaded worker of one
    of those readings, the model takes it (and its rid is added to ``resolved``); otherwise the
    model's own reading stands. Hits (the prefix is on a worker's tree) do not depend on the loads
    and are never resolved so (docs/cluster.md, 'Real servers behind a real router')."""
    rows = sorted(requests.itertuples(index=False), key=lambda r: (float(r.ready), str(r.rid)))
    bounds = {str(r.rid): _stay_bounds(r, window_s) for r in rows} if window_s > 0 else None
    router.reset(n_workers)
    out: dict[str, int] = {}
    for r in rows:
        t = float(r.ready)
        loads, near = _loads_read(rows, r, t, choices, n_workers, bounds)
        req = RouteRequest(rid=str(r.rid), task_id=str(r.task_id), stage_id=str(r.stage_id), agent=str(r.agent),
                           prefix_tokens=int(prefix_tokens[r.agent]), input_tokens=int(r.input_tokens), time=t)
        real = choices.get(str(r.rid))
        miss = getattr(router, "holder", None) is not None and router.holder(str(r.agent)) is None
        if near and miss and real is not None:
            for flips in product((0, 1), repeat=min(len(near), 12)):
                alt = list(loads)
                for (w, d), f in zip(near, flips):
                    alt[w] += d * f
                if min(range(n_workers), key=lambda i: (alt[i], i)) == real:
                    if alt != loads and resolved is not None:
                        resolved.add(str(r.rid))
                    loads = alt
                    break
        states = [EngineState(index=i, in_flight=max(0, loads[i])) for i in range(n_workers)]
        out[str(r.rid)] = int(router.route(req, states))
    return out


#: Slack (seconds) between the client's clock (the event loop's monotonic clock) and the server's
#: stamps (wall clock, converted with the run's start): both are read on one host.
CLOCK_SLACK_S = 0.002


def _stay_bounds(r: Any, window_s: float) -> tuple[float, float]:
    """``(latest start, earliest end)`` of request ``r``'s stay in the router's load count: it starts
    at or after the client's ``ready`` and at the latest when the server received it
    (``server_received``, else ``ready + window_s``), and it ends at the earliest when the server
    finished it (``server_finished``, else ``finish - window_s``) and at the latest at the client's
    ``finish``."""
    received = float(getattr(r, "server_received", float("nan")))
    finished = float(getattr(r, "server_finished", float("nan")))
    start = received + CLOCK_SLACK_S if math.isfinite(received) else float(r.ready) + window_s
    end = finished - CLOCK_SLACK_S if math.isfinite(finished) else float(r.finish) - window_s
    return max(start, float(r.ready)), min(end, float(r.finish))


def _loads_read(rows: Sequence[Any], r: Any, t: float, choices: Mapping[str, int], n_workers: int,
                bounds: Mapping[str, tuple[float, float]] | None) -> tuple[list[int], list[tuple[int, int]]]:
    """Each worker's load when ``r`` reaches the router at ``t`` on the client's clock (the requests
    sent to it before ``r`` that have not finished), and, with ``bounds`` (:func:`_stay_bounds` of
    every request), the requests the router may have counted otherwise when it read the loads for
    ``r`` (at some instant from ``r``'s send to its latest start), as ``(worker, +1 / -1)``."""
    loads = [0] * n_workers
    near: list[tuple[int, int]] = []
    if bounds is not None:
        read_from, read_to = t, bounds[str(r.rid)][0]
    for q in rows:
        if q.rid == r.rid or q.rid not in choices:
            continue
        counted = float(q.ready) <= t < float(q.finish) and (float(q.ready), str(q.rid)) < (t, str(r.rid))
        if counted:
            loads[choices[q.rid]] += 1
        if bounds is None:
            continue
        start, end = bounds[str(q.rid)]
        may_count = float(q.ready) <= read_to and float(q.finish) >= read_from
        may_not = start > read_from or end < read_to
        if counted and may_not:
            near.append((choices[q.rid], -1))
        elif not counted and may_count:
            near.append((choices[q.rid], +1))
    return loads, near


def simulated_choices(trace: Any, policy: str, router: Any, cost: Any, config: Any, n_workers: int,
                      seed: int = 0) -> dict[str, int]:
    """``{rid: engine}`` of the cluster simulator on ``trace`` (``policy`` on every engine)."""

    res = simulate_cluster(trace, [make_policy(policy) for _ in range(n_workers)], router, cost, config, seed=seed)
    return {str(k): int(v) for k, v in zip(res.requests["rid"], res.requests["engine"])}


@dataclass(frozen=True)
class Agreement:
    """How often two assignments of the same requests agree."""

    n: int
    same: int
    differ: tuple[str, ...]  # the rids routed differently

    @property
    def fraction(self) -> float:
        return self.same / self.n if self.n else float("nan")


def agreement(a: Mapping[str, int], b: Mapping[str, int]) -> Agreement:
    """The requests ``a`` and ``b`` route to the same worker; ``ValueError`` unless both cover the
    same requests (naming the first one missing)."""
    if set(a) != set(b):
        miss = sorted(set(a) ^ set(b))[0]
        raise ValueError(f"request {miss} is routed in one assignment only")
    differ = tuple(sorted(r for r in a if a[r] != b[r]))
    return Agreement(len(a), len(a) - len(differ), differ)


def per_agent(choices: Mapping[str, int], agent_of: Mapping[str, str]) -> dict[str, list[int]]:
    """``{agent: sorted workers its requests went to}``."""
    out: dict[str, set[int]] = {}
    for rid, w in choices.items():
        out.setdefault(agent_of[rid], set()).add(w)
    return {a: sorted(ws) for a, ws in sorted(out.items())}
