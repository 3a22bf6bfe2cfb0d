"""``wasma``: WaSMa's KV-reuse, low-transfer routing and dependency-informed batching (from the abstract).

Source: WaSMa, as its abstract states it (no full text is public), in our issue's summary: at
the cluster level it routes a workflow's requests for KV reuse and less KV transfer; at the engine
level it batches requests informed by the workflows' dependencies. Everything below beyond those
two sentences is our interpretation, and every constant is ours.

The engine-level part cannot live in the engines here (their policies are the unchanged
single-GPU ones), so it lives in the router: the router holds the ready requests and releases
them to an engine in batches formed from the workflows' dependencies (a join's parents together)
and from shared prefixes, and the engine serves them first come, first served (run it with
``--policy fcfs``).

Interpretations:

* **Order.** Workflows in arrival order (a workflow never overtakes an older one: under load,
  sending the requests with the most dependents first would favour new workflows' roots and
  starve those under way); inside a workflow, the request more stages depend on (directly or
  not) first; then ready time, then request id. The DAG is the one the policies see (under
  ``online`` DAGs, the stages reached so far).
* **Batch** (dependency-informed). The head goes out together with, up to ``batch_size``
  requests in all: first its held co-parents (requests of its workflow whose stages share a child
  with its stage: the join waits for all of them, so they run side by side in one engine's batch
  rather than one lagging behind), then held requests of its agent (which share its prefix), each
  group in queue order; all to the same engine. A batch counts once against the queue gate.
* **Where** (reuse and transfer). Among the engines with room (fewer than ``max_queue`` requests
  queued there, counting batches sent in this dispatch; or nothing of ours unfinished there) the
  head's batch goes to the smallest ``J_e + T_e + W_e``:

  * ``J_e`` (KV reuse): 0 if the agent's prefix is resident on e, else its recompute there,
    ``c_e.prefill_time([(l_a, 0)])``;
  * ``T_e`` (transfer): for each parent of the head's stage that ran on another engine, moving
    the parent's output KV (its observed output length) to e over the profile's host link,
    ``c_e.swap_time(y_parent)``. The simulated engines do not move KV between them (a child's
    input is computed on its engine whatever its parents did), so this term only steers a
    workflow towards the engines its parents ran on, as WaSMa's abstract intends; it costs nothing
    in the simulation;
  * ``W_e`` (load): the requests of ours unfinished there, served ``ref_batch`` at a time, each
    about as long as the head (Kairos's profile, :func:`~topas.cluster.routers.profile.
    expected_duration`): ``(in_flight_e + sent_e) / ref_batch x D_e``.

  Ties go to the lowest index. When no engine has room, the head waits, and so does everything
  behind it.
* **When.** As ``kairos``: at every ready and finish event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from topas.cluster.routers.base import Router, RouterError, has_room, register
from topas.cluster.routers.profile import descendants, expected_duration
from topas.cluster.state import ClusterInfo, EngineState, RouteRequest


@dataclass(frozen=True)
class WasmaParams:
    #: at most this many requests (a join's parents, then the agent's) released together to one engine
    batch_size: int = 4
    #: an engine takes another batch only while fewer than this many requests are queued there
    max_queue: int = 2
    #: the decode batch the duration profile assumes
    ref_batch: int = 8

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.max_queue < 1 or self.ref_batch < 1:
            raise ValueError("batch_size, max_queue and ref_batch must be >= 1")


@register
class Wasma(Router):
    name = "wasma"
    Params = WasmaParams
    holds = True

    def reset(self, n_engines: int, seed: int = 0, info: ClusterInfo | None = None) -> None:
        super().reset(n_engines, seed, info)
        if info is None:
            raise RouterError("router 'wasma' needs the agents' profile and the engines' cost models (ClusterInfo)")
        self.pending: dict[str, RouteRequest] = {}
        self.keys: dict[str, tuple] = {}  # rid -> its place in the sending order
        self.ran_on: dict[str, int] = {}  # rid -> the engine it was sent to (kept: children read it)

    def route(self, request: RouteRequest, engines: Sequence[EngineState]) -> None:
        self.pending[request.rid] = request
        arrival = request.task.arrival if request.task is not None else request.time
        self.keys[request.rid] = (arrival, -descendants(request.task, request.stage_id), request.time, request.rid)
        return None

    def batch(self, head: RouteRequest, order: list[str]) -> list[str]:
        """The head, its held co-parents, then held requests of its agent (queue order), at most
        ``batch_size`` in all."""
        tv = head.task
        children = set(tv.stages[head.stage_id].children) if tv is not None and head.stage_id in tv.stages else set()
        rest = [self.pending[rid] for rid in order if rid != head.rid]
        co = [q.rid for q in rest if children and q.task_id == head.task_id and q.stage_id in tv.stages
              and children & set(tv.stages[q.stage_id].children)]
        same = [q.rid for q in rest if q.agent == head.agent and q.rid not in co]
        return [head.rid, *co, *same][:self.params.batch_size]

    # ------------------------------------------------------------------ scores
    def transfer(self, req: RouteRequest, engine: int) -> float:
        """``T_e``: moving each parent's output KV from another engine to ``engine``."""
        tv = req.task
        if tv is None or req.stage_id not in tv.stages:
            return 0.0
        cost, t = self.info.costs[engine], 0.0
        for p in tv.stages[req.stage_id].parents:
            where = self.ran_on.get(f"{req.task_id}/{p}")
            if where is not None and where != engine:
                t += cost.swap_time(tv.observed_output.get(p, 0))
        return t

    def score(self, req: RouteRequest, e: EngineState, sent: int = 0) -> float:
        """``J_e + T_e + W_e`` (module docstring)."""
        c = self.info.costs[e.index]
        reuse = 0.0 if req.agent in e.resident else c.prefill_time([(req.prefix_tokens, 0)])
        d = expected_duration(self.info, req.agent, req.input_tokens, e.index, self.params.ref_batch)
        return reuse + self.transfer(req, e.index) + (e.in_flight + sent) / self.params.ref_batch * d

    # ------------------------------------------------------------------ dispatch
    def dispatch(self, engines: Sequence[EngineState], now: float) -> list[tuple[str, int]]:
        p = self.params
        sent = [0] * len(engines)  # requests sent in this dispatch
        batches = [0] * len(engines)  # batches sent in this dispatch (the queue gate counts these)
        sends: list[tuple[str, int]] = []
        order = sorted(self.pending, key=self.keys.__getitem__)
        while order:
            head = self.pending[order[0]]
            best: tuple[float, int] | None = None
            for e in engines:
                if not has_room(e, batches[e.index], p.max_queue):
                    continue
                s = self.score(head, e, sent[e.index])
                if best is None or s < best[0]:
                    best = (s, e.index)
            if best is None:
                break  # head-of-line blocking
            i = best[1]
            batch = self.batch(head, order)
            for rid in batch:
                del self.pending[rid], self.keys[rid]
                self.ran_on[rid] = i
                sends.append((rid, i))
            sent[i] += len(batch)
            batches[i] += 1
            taken = set(batch)
            order = [rid for rid in order if rid not in taken]
        return sends
