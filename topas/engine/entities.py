"""The simulator's mutable entities: requests, tasks in flight, agent prefixes.

These are engine-internal (they hold the true output length ``y``); policies see them only
through the immutable views in ``topas.engine.view``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Iterable, Iterator, Mapping

from topas.engine.knowledge import reveal
from topas.engine.view import RequestView, StageView, TaskView, request_view
from topas.workload.model import Agent, Stage, Task

# Request states.
PENDING, WAITING, PREFILL, DECODE, DONE = "pending", "waiting", "prefill", "decode", "done"


@dataclass(slots=True, eq=False)
class Request:
    rid: str
    task: "TaskState"
    stage: Stage
    agent: str
    x: int  # suffix input tokens x_v
    y: int  # true output tokens y_v (engine only)
    max_new: int  # output cap reserved for at admission (stage max_new_tokens, else y; engine only)
    state: str = PENDING
    ready_time: float = float("nan")
    generated: int = 0  # y_r(t)
    kv: int = 0  # own KV tokens held on the GPU
    prefill_left: int = 0  # tokens still to prefill in the current admission
    prefill_total: int = 0
    admitted_time: float | None = None
    first_admit_time: float | None = None
    finish_time: float | None = None
    state_since: float = 0.0
    queue_time: float = 0.0
    prefill_time: float = 0.0
    decode_time: float = 0.0
    preemptions: int = 0  # by the policy
    retractions: int = 0  # by the engine (decode out of memory)
    recomputed_tokens: int = 0
    #: SGLang's ``cached_tokens``: prompt tokens found cached when a prefill was scheduled,
    #: summed over the request's admissions (its agent's prefix, or 0)
    cached_tokens: int = 0
    #: prefix tokens this request computes in its own prefill (a prefix not yet cached when it
    #: was admitted beside another request computing it: SGLang matched none of it)
    own_prefix: int = 0
    #: segment traces (``topas.engine.radix_cache``): the tree nodes beyond the agent prefix this
    #: running request locks, their tokens (its context held by the tree, not by ``kv``), the
    #: tokens of them matched at admission (not prefilled), and whether its prompt still waits
    #: to be inserted (overlap scheduler: one batch after its prefill)
    seg_nodes: tuple = ()
    seg_ctx: int = 0
    seg_matched: int = 0
    seg_pending: bool = False
    #: SGLang's ``Req.priority`` (the ``/generate`` request's ``priority``): fixed when it first
    #: reaches the scheduler, by ``Policy.request_priority`` (read by the ``priority`` eviction)
    priority: int = 0
    _waiting_view: RequestView | None = None  # a waiting request's view does not change

    @property
    def service_time(self) -> float:
        return self.prefill_time + self.decode_time

    def enter(self, state: str, now: float) -> None:
        """Move to ``state`` at ``now``, accounting the time spent in the previous one."""
        spent = now - self.state_since
        if self.state == WAITING:
            self.queue_time += spent
        elif self.state == PREFILL:
            self.prefill_time += spent
        elif self.state == DECODE:
            self.decode_time += spent
        self.state = state
        self.state_since = now
        self._waiting_view = None

    def view(self, now: float, reserve: int = 0) -> RequestView:
        """The request as a policy sees it; ``reserve``: the engine's output reservation for it
        now (``topas.engine.reservation``)."""
        if self.state == WAITING and self._waiting_view is not None and self._waiting_view.reserve == reserve:
            return self._waiting_view
        running = self.state in (PREFILL, DECODE)
        service = self.service_time + (now - self.state_since if running else 0.0)
        # (built at every scheduling point for each running request: ``request_view``, the fields
        # in RequestView's order)
        v = request_view(self.rid, self.task.task.id, self.stage.id, self.agent, self.x, self.generated,
                         self.ready_time, self.kv + self.seg_ctx, service, self.preemptions + self.retractions,
                         self.admitted_time if running else None, reserve)
        if self.state == WAITING:
            self._waiting_view = v
        return v


@dataclass(slots=True, eq=False)
class TaskState:
    task: Task
    requests: dict[str, Request] = field(default_factory=dict)  # by stage id
    done: set[str] = field(default_factory=set)
    finish_time: float | None = None
    _stage_views: Mapping[str, StageView] | None = None
    _view: TaskView | None = None

    def view(self, online: bool = False) -> TaskView:
        """The task as a policy sees it; ``online``: only the stages reached so far
        (``topas.engine.knowledge.reveal``). Cached until :meth:`invalidate` or, online, until
        another stage is reached (an engine may make a stage ready later than its parent's end)."""
        reached: list[str] | None = None
        if online:
            reached = [s for s, r in self.requests.items() if r.state != PENDING]
            if self._view is not None and len(self._view.stages) != len(reached):
                self._view = None
        if self._view is None:
            t = self.task
            if self._stage_views is None:
                kids = t.children
                # read-only: this mapping is shared by every view of the task
                self._stage_views = MappingProxyType({
                    s.id: StageView(s.id, s.agent, s.input_tokens, s.parents, kids[s.id]) for s in t.stages
                })
            stages, order = self._stage_views, t.topo_order
            if online:
                shown, order = reveal(stages, order, reached)
                stages = MappingProxyType(shown)
            self._view = TaskView(
                id=t.id,
                arrival=t.arrival,
                workflow=t.workflow,
                stages=stages,
                topo_order=order,
                done=frozenset(self.done),
                observed_output={s: self.requests[s].y for s in sorted(self.done)},
                complete=not online,
            )
        return self._view

    def invalidate(self) -> None:
        self._view = None


@dataclass(slots=True, eq=False)
class Prefix:
    agent: Agent
    resident: bool = False
    on_host: bool = False
    refcount: int = 0
    last_used: float = -1.0
    prefill_left: int = 0  # > 0 while a first-ever load is being prefilled
    #: what the eviction strategies read (``topas.engine.eviction``): insertions through the
    #: prefix since it was last computed, the highest priority among them, and (traces without
    #: segments) the deepest leaf below it ever (prefix + the leaf's KV)
    hit_count: int = 0
    priority: int = 0
    history: int = 0

    @property
    def tokens(self) -> int:
        return self.agent.prefix_tokens


def start_task(task: Task) -> TaskState:
    """A task's run state when it arrives: one :class:`Request` per stage, in stage order, each
    ``rid`` = ``task/stage``, of the stage's input ``x``, output ``y`` and ``max_new``."""
    ts = TaskState(task=task)
    for s in task.stages:
        ts.requests[s.id] = Request(rid=f"{task.id}/{s.id}", task=ts, stage=s, agent=s.agent, x=s.input_tokens,
                                    y=s.output_tokens, max_new=s.max_new)
    return ts


def roots(ts: TaskState) -> Iterator[Request]:
    """The requests of a task's root stages (no parents: ready when the task arrives), in stage order."""
    return (ts.requests[s.id] for s in ts.task.stages if not s.parents)


def add_reply_latency(tasks: Iterable[TaskState], half_latency: float) -> None:
    """Add the last reply's way back to the client (half a request path) to every finished task's
    finish time (nothing when there is no request path)."""
    if half_latency > 0:
        for ts in tasks:
            if ts.finish_time is not None:
                ts.finish_time += half_latency
