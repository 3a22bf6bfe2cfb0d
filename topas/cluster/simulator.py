"""A cluster of engines behind a router, on one clock (docs/cluster.md).

N engines of the single-GPU engine model (:class:`topas.cluster.engine.ClusterEngine`, the
unchanged :class:`~topas.engine.simulator.Simulator`), each with its own instance of the named
policy and its own profile (one for all, or one per engine). Tasks arrive at the cluster; each
request, when it becomes ready (its task arrived, for a root stage; its last parent finished, on
whichever engine), is routed at once by the router to one engine, where it stays (a preempted or
retracted request is requeued on its engine, as in a real server).

The clock: the engine whose next action is earliest steps next (one scheduler iteration); task
arrivals are routed before any engine steps past them. A closed-form decode run is cut at the
earliest time another engine could finish a request (:meth:`ClusterEngine.emit_bound`), so no
engine runs past a request that could be sent to it. A request routed to an engine whose
iteration is in progress waits for that iteration's end (as in SGLang). The router sees each
engine as of its last completed iteration.

A task's state is shared by the engines it runs on: each engine's policy sees the tasks that
have a request on that engine, with their whole progress (which stages are done anywhere and
their observed outputs): the workflow metadata a client sends with each request.

Deterministic: engines are scanned in index order, ties go to the lowest index, and random
routers are seeded by the experiment's seed.
"""

from __future__ import annotations

import heapq
import time as _time
from typing import Sequence

from tqdm.auto import tqdm

from topas.cluster.engine import INF, ClusterEngine
from topas.cluster.metrics import build_cluster_result
from topas.cluster.routers.base import Router
from topas.cluster.state import ClusterInfo, EngineState, RouteRequest
from topas.engine.config import EngineConfig
from topas.engine.cost import CostModel
from topas.engine.entities import Request, TaskState, add_reply_latency, roots, start_task
from topas.engine.knowledge import Knowledge
from topas.engine.simulator import SimulationStuck
from topas.policies.base import Policy
from topas.workload.model import Trace
from topas.workload.validate import validate_trace


class ClusterSimulator:
    def __init__(
        self,
        trace: Trace,
        policies: Sequence[Policy],
        router: Router,
        cost: CostModel | Sequence[CostModel],
        config: EngineConfig | None = None,
        knowledge: Knowledge | None = None,
        seed: int = 0,
    ) -> None:
        n = len(policies)
        if n < 1:
            raise ValueError("a cluster needs at least one engine (one policy instance per engine)")
        if len({id(p) for p in policies}) != n:
            raise ValueError("each engine needs its own policy instance (the same object was given twice)")
        costs = [cost] * n if isinstance(cost, CostModel) else list(cost)
        if len(costs) != n:
            raise ValueError(f"{len(costs)} profiles for {n} engines: give one profile or one per engine")
        self.trace = trace
        self.router = router
        # each engine's next-action time and finish bound, in heaps with lazy deletion: an entry
        # (time, index, version) is current while the engine's version is
        self._version = [0] * n
        self._states: list[EngineState | None] = [None] * n  # what routers see, until it changes
        self._dirty: set[int] = set()
        self._next_heap: list[tuple[float, int, int]] = []
        self._bound_heap: list[tuple[float, int, int]] = []
        self.engines = [ClusterEngine(i, self, trace, p, c, config, knowledge) for i, (p, c) in
                        enumerate(zip(policies, costs))]
        self._dirty = set(range(n))
        # every request must fit every engine it may be routed to
        validate_trace(trace, kv_budget=min(e.memory.budget for e in self.engines))
        self.knowledge = knowledge or Knowledge()
        agents = trace.agents
        router.reset(n, seed, ClusterInfo(
            prefix_tokens={a: ag.prefix_tokens for a, ag in agents.items()},
            output_priors={a: self.knowledge.prior(a, ag.expected_output_tokens) for a, ag in agents.items()},
            costs=tuple(e.cost for e in self.engines)))
        self.held: dict[str, Request] = {}  # requests a holding router has not sent yet
        self._arrivals = list(trace.tasks)
        self._next_arrival = 0
        self.tasks: dict[str, TaskState] = {}
        self.requests: dict[str, Request] = {}
        self.assignment: dict[str, int] = {}  # rid -> engine index
        self.ready_at: dict[str, float] = {}  # rid -> when it became ready
        self.sent_at: dict[str, float] = {}  # rid -> when the router sent it
        self.in_flight = [0] * n
        self.finished_tasks = 0
        self.routing_wall = 0.0
        #: (time, engine, agent, held): an engine's copy of an agent's prefix appears or goes
        self.holding_events: list[tuple[float, int, str, bool]] = []
        self._held: list[frozenset[str]] = [frozenset()] * n

    # ------------------------------------------------------------------ the loop
    def run(self, progress: bool = False):
        wall0 = _time.perf_counter()
        bar = tqdm(total=len(self._arrivals), desc=f"cluster {self.router.name}", unit="task", disable=not progress,
                   delay=2.0)  # (shown only for a run longer than 2 s)
        done = 0
        while True:
            t_e, e = self._earliest()
            t_a = self._arrivals[self._next_arrival].arrival if self._next_arrival < len(self._arrivals) else INF
            if t_a < INF and t_a <= t_e:
                self._arrive(t_a)
                continue
            if t_e == INF:
                if self.held:
                    raise SimulationStuck(
                        f"router {self.router.name!r} holds {len(self.held)} requests (e.g. {next(iter(self.held))}) "
                        "and sends none while every engine is idle")
                stuck = next((x for x in self.engines if x.waiting), None)
                if stuck is not None:
                    raise SimulationStuck(
                        f"policy {stuck.policy.name!r} on engine {stuck.index} admitted none of the "
                        f"{len(stuck.waiting)} waiting requests (e.g. {next(iter(stuck.waiting))}) while the engine "
                        f"is idle at t={stuck.now:.6f}s and nothing else can arrive")
                break
            e.step()
            self._record_holding(e)
            if self.finished_tasks != done:
                bar.update(self.finished_tasks - done)
                done = self.finished_tasks
        bar.close()
        add_reply_latency(self.tasks.values(), self.engines[0].path.half_latency)  # once per task
        return build_cluster_result(self, wall_seconds=_time.perf_counter() - wall0)

    def _arrive(self, t: float) -> None:
        while self._next_arrival < len(self._arrivals) and self._arrivals[self._next_arrival].arrival <= t:
            task = self._arrivals[self._next_arrival]
            self._next_arrival += 1
            ts = start_task(task)
            self.tasks[task.id] = ts
            self.requests.update((r.rid, r) for r in ts.requests.values())
            for r in roots(ts):
                self.ready(r, task.arrival)

    # ------------------------------------------------------------------ engine callbacks
    def ready(self, r: Request, t: float) -> None:
        """``r`` became ready at ``t``: the router picks its engine."""
        req = RouteRequest(rid=r.rid, task_id=r.task.task.id, stage_id=r.stage.id, agent=r.agent,
                           prefix_tokens=self.engines[0].memory.prefixes[r.agent].tokens, input_tokens=r.x, time=t,
                           task=r.task.view(self.knowledge.online))
        self.ready_at[r.rid] = t
        t0 = _time.perf_counter()
        i = self.router.route(req, self.engine_states())
        self.routing_wall += _time.perf_counter() - t0
        if i is None and self.router.holds:
            self.held[r.rid] = r
        else:
            self._send(r, i, t)
        self._dispatch(t)

    def _send(self, r: Request, i: object, t: float) -> None:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(self.engines):
            raise ValueError(f"router {self.router.name!r} sent {r.rid} to engine {i!r}; "
                             f"engines are 0..{len(self.engines) - 1}")
        self.assignment[r.rid] = i
        self.sent_at[r.rid] = t
        self.in_flight[i] += 1
        self._states[i] = None
        self.engines[i].deliver(r, t)

    def _dispatch(self, t: float) -> None:
        """A holding router's chance to send held requests (after a request became ready or finished)."""
        if not self.held:
            return
        t0 = _time.perf_counter()
        sends = self.router.dispatch(self.engine_states(), t)
        self.routing_wall += _time.perf_counter() - t0
        for rid, i in sends:
            r = self.held.pop(rid, None)
            if r is None:
                raise ValueError(f"router {self.router.name!r} dispatched {rid}, which it does not hold")
            self._send(r, i, t)

    def responded(self, r: Request, engine: ClusterEngine) -> None:
        """``r`` finished on ``engine``: the router counts it complete (before its children are
        made ready)."""
        self.in_flight[engine.index] -= 1
        self._states[engine.index] = None
        self.router.on_finish(r.rid, engine.index, engine.now)

    def finished(self, r: Request, engine: ClusterEngine) -> None:
        """After ``r``'s finish was processed (its children routed): a holding router may send
        what it held; a finished task leaves every engine's view."""
        self._dispatch(engine.now)
        ts = r.task
        if ts.finish_time is not None:  # the task's last stage: no engine shows it any more
            self.finished_tasks += 1
            for e in self.engines:
                e.active_tasks.pop(ts.task.id, None)

    def engine_states(self) -> list[EngineState]:
        """Each engine as a router sees it (rebuilt only for engines that changed since)."""
        states = self._states
        for i, st in enumerate(states):
            if st is None:
                e = self.engines[i]
                m = e.memory
                states[i] = EngineState(index=i, in_flight=self.in_flight[i],
                                        waiting=len(e.waiting) + e.path.on_way(),
                                        running=e.batch.n_running(),
                                        kv_budget=m.budget, kv_used=m.prefix_tokens + m.request_tokens,
                                        resident=e.view_resident())
        return list(states)

    def horizon(self, engine: ClusterEngine) -> float:
        """The earliest time something may be delivered to ``engine`` from outside: the next
        task arrival or another engine's next possible finish."""
        t = self._arrivals[self._next_arrival].arrival if self._next_arrival < len(self._arrivals) else INF
        i = engine.index
        self._flush(skip=i)  # (``engine`` is stepping: its own times are read when the step ends)
        heap, own = self._bound_heap, None
        self._clean(heap)
        if heap and heap[0][1] == i:
            own = heapq.heappop(heap)
            self._clean(heap)
        if heap and heap[0][0] < t:
            t = heap[0][0]
        if own is not None:
            heapq.heappush(heap, own)
        return t

    # ------------------------------------------------------------------ the engines' times
    def touched(self, i: int) -> None:
        """Engine ``i`` stepped or received a request: its times are read again."""
        self._version[i] += 1
        self._dirty.add(i)
        self._states[i] = None

    def _flush(self, skip: int = -1) -> None:
        """Push the current times of the engines that changed (all but ``skip``, which stays to
        be pushed later) onto the heaps."""
        dirty = self._dirty
        if not dirty:
            return
        version, engines = self._version, self.engines
        for i in dirty:
            if i != skip:
                pending, bound = engines[i].times()
                heapq.heappush(self._next_heap, (pending, i, version[i]))
                heapq.heappush(self._bound_heap, (bound, i, version[i]))
        skipped = skip in dirty
        dirty.clear()
        if skipped:
            dirty.add(skip)

    def _clean(self, heap: list[tuple[float, int, int]]) -> None:
        while heap and heap[0][2] != self._version[heap[0][1]]:
            heapq.heappop(heap)

    def _earliest(self) -> tuple[float, ClusterEngine]:
        """The engine whose next action is earliest (ties: the lowest index) and its time."""
        self._flush()
        self._clean(self._next_heap)
        t, i, _ = self._next_heap[0]
        return t, self.engines[i]

    def _record_holding(self, e: ClusterEngine) -> None:
        held = e.held_prefixes()
        old = self._held[e.index]
        if held != old:
            for a in sorted(held - old):
                self.holding_events.append((e.now, e.index, a, True))
            for a in sorted(old - held):
                self.holding_events.append((e.now, e.index, a, False))
            self._held[e.index] = held


def simulate_cluster(trace: Trace, policies: Sequence[Policy], router: Router, cost, config=None,
                     knowledge: Knowledge | None = None, seed: int = 0, progress: bool = False):
    """Run ``trace`` on a cluster of ``len(policies)`` engines behind ``router``."""
    return ClusterSimulator(trace, policies, router, cost, config, knowledge, seed).run(progress=progress)
