"""Reading a real router's misses within the client's timing uncertainty (``make test-cluster``).

:func:`topas.cluster.real_router.rule_choices` feeds the simulator's ``sglang-cache-aware`` the
real run: the requests in the order the client sent them, each worker's load the requests in
flight on the client's clock. An agent's first request (a miss: no worker's tree holds its prefix)
goes to the least-loaded worker, and the real router reads those loads at an instant the client
knows only within a few milliseconds (``sgl-model-gateway``'s HTTP router reads every worker's
load in ``select_worker`` and counts the request only afterwards, with a load guard dropped once
it has read the worker's answer, before the client receives it; requests are handled
concurrently). :func:`rule_choices_windowed` reads each such miss against every load vector the
router may have read: each request sent or finished within ``window_s`` counted or not
(docs/cluster.md, 'Real servers behind a real router').

It lives here, not in ``topas.cluster``, because ``topas/cluster`` is part of every cluster
result's code fingerprint (:mod:`topas.provenance`): a comparison helper there would make every
shipped cluster result stale.
"""

from __future__ import annotations

from typing import Any, Mapping

from topas.cluster.state import EngineState, RouteRequest

__all__ = ["TIMING_WINDOW_S", "rule_choices_windowed"]


#: How far apart (seconds, on the client's clock) two events must be for the client to know the
#: order the router saw them in (:func:`rule_choices`).
TIMING_WINDOW_S = 0.1


def rule_choices_windowed(requests: Any, prefix_tokens: Mapping[str, int], router: Any, choices: Mapping[str, int],
                 n_workers: int, window_s: float = 0.0, resolved: set[str] | None = None) -> dict[str, int]:
    """:func:`topas.cluster.real_router.rule_choices` (the router model's choice of every request,
    fed the real run) with its misses read within ``window_s``.

    ``requests``: the replay's requests table (``rid``, ``task_id``, ``stage_id``, ``agent``,
    ``input_tokens``, ``ready``, ``finish``); ``choices``: where the real router sent each one
    (for the loads); ``router``: a fresh router object (``make_router("sglang-cache-aware")``).
    Ties in ``ready`` go in rid order.

    ``window_s``: a *miss* (a request whose prefix no worker's tree holds: the router sends it to
    the least-loaded worker) is decided by the loads at the instant the router reads them, which
    the client knows only up to the path between them. The router reads the loads before it counts
    the request (``select_worker``, then the load guard: two requests routed at once both read the
    loads without the other) and stops counting a request when it has read the worker's answer,
    before the client receives it. So another request sent or finished within ``window_s`` of a
    miss may or may not count: the miss is checked against every one of those load readings; when
    the real choice is the least-loaded worker of one of them, the model takes it (and its rid is
    added to ``resolved``); otherwise the model's own reading stands. Hits (the prefix is on a
    worker's tree) do not depend on the loads and are never resolved so."""
    from itertools import product

    rows = sorted(requests.itertuples(index=False), key=lambda r: (float(r.ready), str(r.rid)))
    router.reset(n_workers)
    out: dict[str, int] = {}
    for r in rows:
        t = float(r.ready)
        loads = [0] * n_workers
        near: list[tuple[int, int]] = []  # (worker, +1 / -1): a request that may or may not count
        for q in rows:
            if q.rid == r.rid or q.rid not in choices:
                continue
            counted = float(q.ready) <= t < float(q.finish) and (float(q.ready), str(q.rid)) < (t, str(r.rid))
            if counted:
                loads[choices[q.rid]] += 1
            if window_s > 0 and (abs(float(q.ready) - t) <= window_s or abs(float(q.finish) - t) <= window_s):
                near.append((choices[q.rid], -1 if counted else +1))
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
