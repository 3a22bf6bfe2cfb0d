"""``flowguard``: FlowGuard's slack-ordered global queue and KV/queue-aware dispatcher (from the abstract).

Source: FlowGuard, as its abstract states it (no full text is public), in our issue's summary:
each request has a slack against its workflow's deadline; requests that cannot make their
deadline any more are deprioritised; a dispatcher weighs each engine's KV pressure and queue
depth. Everything below beyond those three sentences is our interpretation, and every constant is
ours. Inside the engines: FCFS (run it with ``--policy fcfs``), so the order the router sends in is
the order the engines serve in.

Interpretations:

* **Profile.** A stage's expected duration is Kairos's profile (:func:`~topas.cluster.routers.
  profile.expected_duration`: its prefill on the cached prefix plus ``prior_a`` decode steps in a
  batch of ``ref_batch``), on engine 0; the critical path of a task is the longest sum of those
  over its DAG (as the policies see it).
* **Deadline** (only what is known at arrival): ``d_i = arrival_i + deadline_factor x CP_i``,
  ``CP_i`` the task's critical path from its root, fixed when the router first sees one of its
  requests (under ``online`` DAG visibility the DAG shown then: its root stages only).
* **Slack** of request r (stage v of task i) at time t: ``s_r(t) = d_i - t - R_v``, ``R_v`` the
  expected longest path from v to the task's end, v included.
* **Queue.** The router holds every request. At each dispatch (time t), the requests that can
  still make it (``s_r(t) >= 0``) come first, least slack first; those that cannot
  (``s_r(t) < 0``) are deprioritised: after all others, in the order they became ready. Ties by
  ready time, then request id.
* **Dispatcher.** The head of the queue needs ``n_e = x + prior_a`` tokens of KV on engine e, plus
  ``l_a`` if a's prefix is not resident there. Engine e may take it when it has room (fewer than
  ``max_queue`` requests queued there, or nothing of ours unfinished there) and
  ``kv_used_e + n_e <= kv_limit x kv_budget_e`` (or nothing of ours unfinished there). Among those,
  the smallest ``kv_weight x (kv_used_e + n_e) / kv_budget_e + queue_weight x q_e`` (``q_e``:
  requests queued there, including those sent in this dispatch) gets it; ties to the lowest
  index. When no engine may take the head, it waits and so does everything behind it (head-of-line
  blocking keeps the slack order). Requests sent in the same dispatch count in ``kv_used`` and
  ``q`` of their engine.
* **When.** As ``kairos``: at every ready and finish event (the engines' queues and KV are read
  then, as of their last completed iteration).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from topas.cluster.routers.base import Router, RouterError, has_room, register
from topas.cluster.routers.profile import expected_duration, path_to_end, remaining_path
from topas.cluster.state import ClusterInfo, EngineState, RouteRequest


@dataclass(frozen=True)
class FlowGuardParams:
    #: a task's deadline is its arrival plus this many times its profiled critical path
    deadline_factor: float = 2.0
    #: the decode batch the duration profile assumes
    ref_batch: int = 8
    #: an engine takes more only while fewer than this many requests are queued there
    max_queue: int = 2
    #: an engine takes a request only while its KV after it stays <= this x its budget
    kv_limit: float = 1.0
    #: weight of the KV pressure (fraction of the budget) in the engine score
    kv_weight: float = 1.0
    #: weight of each queued request in the engine score
    queue_weight: float = 0.1

    def __post_init__(self) -> None:
        if not self.deadline_factor > 0 or self.ref_batch < 1 or self.max_queue < 1 or not self.kv_limit > 0:
            raise ValueError("deadline_factor must be > 0, ref_batch >= 1, max_queue >= 1 and kv_limit > 0")
        if not (self.kv_weight >= 0 and self.queue_weight >= 0):
            raise ValueError("kv_weight and queue_weight must be >= 0")


@register
class FlowGuard(Router):
    name = "flowguard"
    Params = FlowGuardParams
    holds = True

    def reset(self, n_engines: int, seed: int = 0, info: ClusterInfo | None = None) -> None:
        super().reset(n_engines, seed, info)
        if info is None:
            raise RouterError("router 'flowguard' needs the agents' profile and the engines' cost models (ClusterInfo)")
        self.pending: dict[str, RouteRequest] = {}
        self.deadlines: dict[str, float] = {}  # task id -> d_i
        self.latest: dict[str, float] = {}  # rid -> d_i - R_v (its latest start)

    # ------------------------------------------------------------------ slack
    def deadline(self, req: RouteRequest) -> float:
        """``d_i``: the task's arrival plus ``deadline_factor`` x its critical path (fixed at first sight)."""
        d = self.deadlines.get(req.task_id)
        if d is None:
            tv, b = req.task, self.params.ref_batch
            if tv is None:
                cp, arrival = expected_duration(self.info, req.agent, req.input_tokens, 0, b), req.time
            else:
                st = tv.stages
                paths = path_to_end(tv, lambda s: expected_duration(self.info, st[s].agent, st[s].input_tokens, 0, b))
                cp, arrival = max(paths.values(), default=0.0), tv.arrival
            d = self.deadlines[req.task_id] = arrival + self.params.deadline_factor * cp
        return d

    def slack(self, rid: str, now: float) -> float:
        """``s_r(now) = d_i - now - R_v`` of a held request."""
        return self.latest[rid] - now

    def order(self, now: float) -> list[str]:
        """Held requests in sending order at ``now``: can still make it (least slack first), then
        those that cannot, by ready time."""
        def key(rid: str):
            r, s = self.pending[rid], self.slack(rid, now)
            return (0, s, r.time, rid) if s >= 0 else (1, r.time, 0.0, rid)
        return sorted(self.pending, key=key)

    # ------------------------------------------------------------------ routing
    def route(self, request: RouteRequest, engines: Sequence[EngineState]) -> None:
        self.pending[request.rid] = request
        self.latest[request.rid] = self.deadline(request) - remaining_path(self.info, request, self.params.ref_batch)
        return None

    def need(self, req: RouteRequest, e: EngineState) -> float:
        """KV tokens the request would take on ``e``: its input and output prior, plus its prefix
        where that is not resident."""
        prefix = 0 if req.agent in e.resident else req.prefix_tokens
        return req.input_tokens + self.info.output_priors[req.agent] + prefix

    def score(self, req: RouteRequest, e: EngineState, kv_sent: float = 0.0, sent: int = 0) -> float:
        """``kv_weight x (kv_used + sent KV + n_e) / budget + queue_weight x (queued + sent)``."""
        p = self.params
        kv = (e.kv_used + kv_sent + self.need(req, e)) / max(1, e.kv_budget)
        return p.kv_weight * kv + p.queue_weight * (e.waiting + sent)

    def dispatch(self, engines: Sequence[EngineState], now: float) -> list[tuple[str, int]]:
        p = self.params
        sent = [0] * len(engines)
        kv_sent = [0.0] * len(engines)
        sends: list[tuple[str, int]] = []
        for rid in self.order(now):
            req = self.pending[rid]
            best: tuple[float, int] | None = None
            for e in engines:
                i = e.index
                if not has_room(e, sent[i], p.max_queue):
                    continue
                fits = e.kv_used + kv_sent[i] + self.need(req, e) <= p.kv_limit * e.kv_budget
                if not fits and e.in_flight + sent[i] > 0:
                    continue
                s = self.score(req, e, kv_sent[i], sent[i])
                if best is None or s < best[0]:
                    best = (s, i)
            if best is None:
                break  # head-of-line blocking: the most urgent request waits, and so does the rest
            i = best[1]
            kv_sent[i] += self.need(req, engines[i])
            sent[i] += 1
            del self.pending[rid], self.latest[rid]
            sends.append((rid, i))
        return sends
