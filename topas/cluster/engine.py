"""One engine of a cluster: the single-GPU simulator, stepped from outside.

:class:`ClusterEngine` subclasses :class:`topas.engine.simulator.Simulator` without changing its
model, through the simulator's public interface only (its hooks ``make_ready``,
``stage_finished``, ``next_event``, ``idle_until``, ``view`` and ``step``, and its parts'
methods): it has no task arrivals of its own (``routed``: the cluster delivers each request it
routes here), runs the single engine's own :meth:`~topas.engine.simulator.Simulator.step` per
:meth:`step`, sends the requests its finishes make ready back to the cluster (which routes them,
possibly to another engine), and bounds its closed-form decode runs by the earliest time another
engine may deliver a request (:meth:`next_event`). Idle, it waits for its own next delivery only
(:meth:`idle_until`), never past it to that horizon.

The cluster is seen through :class:`Cluster` (what the engine calls back), so this module does
not import the cluster simulator.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Protocol

from topas.engine.cost import CostModel
from topas.engine.config import EngineConfig
from topas.engine.entities import Request
from topas.engine.knowledge import Knowledge
from topas.engine.simulator import Simulator
from topas.engine.view import EngineView, RequestView
from topas.policies.base import Policy
from topas.workload.model import Trace

INF = math.inf


class Cluster(Protocol):
    """What a :class:`ClusterEngine` calls back (:class:`topas.cluster.simulator.ClusterSimulator`)."""

    #: request id -> the engine it was routed to
    assignment: Mapping[str, int]

    def touched(self, i: int) -> None: ...
    def ready(self, r: Request, t: float) -> None: ...
    def responded(self, r: Request, engine: "ClusterEngine") -> None: ...
    def finished(self, r: Request, engine: "ClusterEngine") -> None: ...
    def horizon(self, engine: "ClusterEngine") -> float: ...


class ClusterEngine(Simulator):
    cache_task_views = False  # other engines finish this engine's tasks' stages

    def __init__(self, index: int, cluster: Cluster, trace: Trace, policy: Policy, cost: CostModel,
                 config: EngineConfig | None = None, knowledge: Knowledge | None = None) -> None:
        # tasks arrive at the cluster, not here: the engine gets the trace's agents and no tasks
        # (the cluster validates the whole trace once, against the smallest engine; the engine
        # checks its first task against its own budget)
        super().__init__(trace, policy, cost, config, knowledge, routed=True)
        self.index = index
        self.cluster = cluster
        self._local: dict[str, int] = {}  # task id -> its requests routed here and not finished
        self._prefix_len = {a: p.tokens for a, p in self.memory.prefixes.items()}  # l_a (fixed for a run)
        # (pending_time, emit_bound) change only when this engine steps or receives a request
        # (_touch: the cluster re-reads them then)
        self._times: tuple[float, float] | None = None
        # the prefixes held / resident change only with a prefix event (each KVMemory load and
        # eviction records one): cached per number of prefix events seen
        self._held: tuple[int, frozenset[str]] = (-1, frozenset())
        self._resident: tuple[int, frozenset[str]] = (-1, frozenset())

    def _touch(self) -> None:
        self._times = None
        self.cluster.touched(self.index)

    # ------------------------------------------------------------------ delivery
    def deliver(self, r: Request, t: float) -> None:
        """``r`` became ready at ``t`` and was routed here: it reaches this scheduler after the
        request path (``RequestPath.send``, as ``Simulator.make_ready``), always on that path, so
        an engine whose clock is behind ``t`` does not see it early."""
        self._touch()
        ts = r.task
        tid = ts.task.id
        self.requests[r.rid] = r
        self.tasks.setdefault(tid, ts)
        self.active_tasks.setdefault(tid, ts)
        self._local[tid] = self._local.get(tid, 0) + 1
        self.path.send(r, t)

    def make_ready(self, r: Request, t: float) -> None:
        self.cluster.ready(r, t)  # a parent finished here: the router decides where r runs

    def stage_finished(self, r: Request, view: RequestView) -> None:
        # the response reaches the router before the client sends the children
        self.cluster.responded(r, self)
        super().stage_finished(r, view)
        tid = r.task.task.id
        self._local[tid] -= 1
        if not self._local[tid]:  # none of its requests is here any more: this engine stops showing it
            del self._local[tid]
            self.active_tasks.pop(tid, None)
        self.cluster.finished(r, self)

    def view(self, lazy_running: bool = False, with_tasks: bool = True) -> EngineView:
        """The single-engine view, with each task's stages that are routed to another engine and
        not finished shown as done: not this engine's to run (a single engine's policy reads a
        stage that is neither done nor waiting/running here as one whose parents have not finished)."""
        v = super().view(lazy_running, with_tasks)
        if not with_tasks:
            return v
        owner = self.cluster.assignment
        task_views = {}
        for tid, tv in v.tasks.items():
            ts = self.active_tasks[tid]
            away = frozenset(s for s, r in ts.requests.items()
                             if s in tv.stages and r.finish_time is None and owner.get(r.rid, self.index) != self.index)
            task_views[tid] = dataclasses.replace(tv, done=tv.done | away) if away else tv
        return dataclasses.replace(v, tasks=task_views)

    # ------------------------------------------------------------------ time
    def _own_next(self) -> float | None:
        """This engine's next delivery or, with KVFlow's prefetch, the end of its host copy in
        progress (``topas.engine.prefetch``), whichever comes first (None: neither)."""
        own = self.path.next_delivery()
        t = self.prefetch.next_load()
        if t is not None and (own is None or t < own):
            own = t
        return own

    def next_event(self) -> float | None:
        own = self._own_next()
        h = self.cluster.horizon(self)
        if h < INF and (own is None or h < own):
            return h
        return own

    def busy(self) -> bool:
        return bool(self.batch.prefill_queue or self.batch.decoding or self.memory.prefix_prefill_pending())

    def times(self) -> tuple[float, float]:
        """(:meth:`pending_time`, :meth:`emit_bound`), computed once per change of this engine."""
        if self._times is None:
            self._times = self._compute_times()
        return self._times

    def pending_time(self) -> float:
        """When this engine next has something to do on its own (INF: nothing until a request is
        delivered): now while it runs or has a decision to take, else its next delivery."""
        return self.times()[0]

    def emit_bound(self) -> float:
        """A lower bound on when this engine next finishes a request (and so may make another
        request ready): now while it prefills or may admit; else, decoding only, the end of its
        earliest finish if nothing else ran (admissions only delay it), or its next delivery."""
        return self.times()[1]

    def _compute_times(self) -> tuple[float, float]:
        now = self.now
        decoding = self.batch.decoding
        prefilling = bool(self.batch.prefill_queue) or self.memory.prefix_prefill_pending()
        own = self._own_next()
        delivery = own if own is not None else INF
        if prefilling or decoding or delivery <= now or self.decision_pending():
            pending = now
        else:
            pending = max(now, delivery) if delivery < INF else INF
        if prefilling or (self.waiting and pending == now):
            return pending, now
        bound = delivery
        if decoding:
            # one pass for the batch's fewest steps to a finish and its total context (prefixes
            # counted once per request, as Batch.decode_until_event counts them)
            prefix_len = self._prefix_len
            steps, kv0 = None, 0
            for r in decoding.values():
                kv0 += prefix_len[r.agent] + r.kv
                left = r.y - r.generated
                if steps is None or left < steps:
                    steps = left
            bound = min(bound, now + self.cost.decode_steps_time(len(decoding), kv0, max(steps, 1)))
        return pending, (max(now, bound) if bound < INF else INF)

    def step(self) -> bool:
        """One step of the single engine (:meth:`Simulator.step`), the cluster told before and
        after; False when the engine has nothing to do until a request is delivered (an idle
        engine, or waiting requests its policy declined)."""
        self._touch()
        try:
            return super().step()
        finally:
            self._touch()

    def idle_until(self) -> float | None:
        # an idle engine waits for its own next delivery only: the cluster's horizon (another
        # engine's possible finish) may deliver nothing, and the cluster steps that engine first
        return self._own_next()

    def held_prefixes(self) -> frozenset[str]:
        """Agents whose prefix KV is on this GPU: resident (pinned, or in the radix cache) or
        unpinned but still cached."""
        memory = self.memory
        n = len(memory.prefix_events)
        if self._held[0] != n:
            self._held = (n, frozenset(a for a, p in memory.prefixes.items()
                                       if p.resident or memory.cached_unpinned(a)))
        return self._held[1]

    def view_resident(self) -> frozenset[str]:
        """Agents whose prefix is resident (what ``EngineView.resident`` shows this engine's policy)."""
        n = len(self.memory.prefix_events)
        if self._resident[0] != n:
            self._resident = (n, frozenset(a for a, p in self.memory.prefixes.items() if p.resident))
        return self._resident[1]
