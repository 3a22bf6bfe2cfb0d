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
  with ``window_s`` (:data:`TIMING_WINDOW_S`) it reads each miss within the client's timing
  uncertainty.
* :func:`simulated_choices`: the whole cluster simulated on the same trace (own timing from a
  cost profile): the rule plus the simulator's timing, as a sweep would use it.

:func:`agreement` gives the fraction of requests both sent to the same worker.
"""

from __future__ import annotations

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
#: order the router saw them in (:func:`rule_choices`'s ``window_s``).
TIMING_WINDOW_S = 0.1


def rule_choices(requests: Any, prefix_tokens: Mapping[str, int], router: Any, choices: Mapping[str, int],
                 n_workers: int, window_s: float = 0.0, resolved: set[str] | None = None) -> dict[str, int]:
    """The router model's choice of every request, fed the real run (module docstring).

    ``requests``: the replay's requests table (``rid``, ``task_id``, ``stage_id``, ``agent``,
    ``input_tokens``, ``ready``, ``finish``); ``choices``: where the real router sent each one
    (for the loads); ``router``: a fresh router object (``make_router("sglang-cache-aware")``).
    Ties in ``ready`` go in rid order.

    ``window_s`` (0: the client's clock is taken as the router's): a *miss* (a request whose
    prefix no worker's tree holds: the router sends it to the least-loaded worker) is decided by
    the loads at the instant the router reads them, which the client knows only up to the path
    between them. ``sgl-model-gateway``'s HTTP router reads every worker's load in
    ``select_worker`` before it counts the request (two requests routed at once both read the
    loads without the other) and drops its load guard when it has read the worker's answer,
    before the client receives it. So another request sent or finished within ``window_s`` of a
    miss may or may not count: the miss is checked against every one of those load readings;
    when the real choice is the least-loaded worker of one of them, the model takes it (and its
    rid is added to ``resolved``); otherwise the model's own reading stands. Hits (the prefix is
    on a worker's tree) do not depend on the loads and are never resolved so
    (docs/cluster.md, 'Real servers behind a real router')."""
    rows = sorted(requests.itertuples(index=False), key=lambda r: (float(r.ready), str(r.rid)))
    router.reset(n_workers)
    out: dict[str, int] = {}
    for r in rows:
        t = float(r.ready)
        loads, near = _loads_read(rows, r, t, choices, n_workers, window_s)
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


def _loads_read(rows: Sequence[Any], r: Any, t: float, choices: Mapping[str, int], n_workers: int,
                window_s: float) -> tuple[list[int], list[tuple[int, int]]]:
    """Each worker's load when ``r`` reaches the router at ``t`` (the requests sent to it before
    ``r`` that have not finished), and the requests sent or finished within ``window_s`` of
    ``t``, as ``(worker, +1 / -1)``: counting them or not is a reading the router may have made."""
    loads = [0] * n_workers
    near: list[tuple[int, int]] = []
    for q in rows:
        if q.rid == r.rid or q.rid not in choices:
            continue
        counted = float(q.ready) <= t < float(q.finish) and (float(q.ready), str(q.rid)) < (t, str(r.rid))
        if counted:
            loads[choices[q.rid]] += 1
        if window_s > 0 and (abs(float(q.ready) - t) <= window_s or abs(float(q.finish) - t) <= window_s):
            near.append((choices[q.rid], -1 if counted else +1))
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
