"""FCFS: first come, first served, as SGLang's default policy serves its waiting queue.

Requests are served in the order they reached the scheduler: a request becomes ready when all its
parent stages have finished (or at its task's arrival for a root stage); equal ready times go by
request id, so the order is deterministic. A request retracted by the engine (or preempted) rejoins
at the *end* of the queue, as SGLang re-appends it (``Scheduler._add_request_to_queue``; its FCFS
does not sort). Prefixes are left to the engine (SGLang's radix cache: load on demand, LRU
eviction).
"""

from __future__ import annotations

from topas.engine.view import Decision, EngineView, RequestView
from topas.policies.base import Policy, register
from topas.policies.queue import WaitingQueue


@register
class FCFS(Policy):
    name = "fcfs"
    reads_tasks = False  # it orders the waiting requests alone

    def reset(self) -> None:
        self._queue = WaitingQueue()

    def on_preempt(self, request: RequestView, time: float, by_engine: bool) -> None:
        self._queue.requeue(request.rid, time)

    def decide(self, view: EngineView) -> Decision:
        order = self._queue.current(view)
        self._queue.keep(order)
        return Decision(admit=tuple(r.rid for r in order))
