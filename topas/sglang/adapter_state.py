"""What the SGLang adapter (:mod:`topas.sglang.adapter`) tracks between scheduler iterations: each
request with topas metadata (:class:`TrackedRequest`), each task learned from that metadata
(:class:`TrackedTask`) and each agent's prefix (:class:`TrackedPrefix`), and how each shows in the
policy's :class:`~topas.engine.view.EngineView` (``RequestView``, ``TaskView``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from topas.engine.knowledge import reveal
from topas.engine.view import PrefixView, RequestView, StageView, TaskView
from topas.sglang.metadata import RequestMeta
from topas.workload.model import Task

__all__ = ["RUNNING", "VIEW_COMPUTING", "VIEW_RESERVE", "WAITING", "TrackedPrefix", "TrackedRequest", "TrackedTask"]

#: whether this topas's RequestView carries ``reserve`` (the engine's output reservation)
VIEW_RESERVE = "reserve" in RequestView.__dataclass_fields__
#: whether this topas's PrefixView carries ``computing`` (a running request computes the prefix)
VIEW_COMPUTING = "computing" in PrefixView.__dataclass_fields__

#: A tracked request's states: waiting in SGLang's queue, or running in its batch.
WAITING, RUNNING = "waiting", "running"


@dataclass(eq=False)
class TrackedRequest:
    """A request with topas metadata that SGLang holds, waiting or running, as the adapter tracks it."""

    erid: str  # SGLang rid
    meta: RequestMeta
    ready_time: float
    state: str = WAITING
    generated: int = 0
    kv: int = 0
    service: float = 0.0  # completed running intervals
    admitted_time: float | None = None
    preemptions: int = 0
    retractions: int = 0
    first_admit: float | None = None
    reserve: int = 0  # the engine's output reservation now (ReqSnap.reserve)

    def view(self, now: float) -> RequestView:
        running = self.state == RUNNING
        service = self.service + (now - self.admitted_time if running and self.admitted_time is not None else 0.0)
        m = self.meta
        return RequestView(
            rid=m.rid, task_id=m.task, stage_id=m.stage, agent=m.agent, input_tokens=m.input_tokens,
            generated=self.generated, ready_time=self.ready_time, kv_tokens=self.kv if running else 0,
            service_time=service, preemptions=self.preemptions + self.retractions,
            admitted_time=self.admitted_time if running else None,
            **({"reserve": self.reserve} if VIEW_RESERVE else {}),
        )


@dataclass(eq=False)
class TrackedTask:
    """A task learned from its requests' metadata: its DAG (without output lengths), the stages done
    (with their observed outputs) and the stages reached so far."""

    task: Task
    stage_views: Mapping[str, StageView]
    done: set[str] = field(default_factory=set)
    observed: dict[str, int] = field(default_factory=dict)
    reached: set[str] = field(default_factory=set)  # stages seen waiting or running, or done
    _view: TaskView | None = None

    def reach(self, stage: str) -> None:
        if stage not in self.reached:
            self.reached.add(stage)
            self._view = None

    def view(self, online: bool = False) -> TaskView:
        """The task as the policy sees it; ``online``: only the stages reached so far
        (:func:`topas.engine.knowledge.reveal`, as the simulator does)."""
        if self._view is None:
            t = self.task
            stages, order = self.stage_views, t.topo_order
            if online:
                shown, order = reveal(stages, order, self.reached | self.done)
                stages = MappingProxyType(shown)
            self._view = TaskView(
                id=t.id, arrival=t.arrival, workflow=t.workflow, stages=stages,
                topo_order=order, done=frozenset(self.done),
                observed_output={s: self.observed[s] for s in sorted(self.done)},
                complete=not online,
            )
        return self._view


@dataclass
class TrackedPrefix:
    """An agent's prefix: its length, its expected output and when a request last used it."""

    name: str
    tokens: int
    expected_output: float
    last_used: float = -1.0
