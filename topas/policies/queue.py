"""SGLang's waiting queue as an order that lasts between scheduling points.

SGLang keeps one list, ``Scheduler.waiting_queue``: a request is appended when it reaches the
scheduler, a retracted request is appended again (``_add_request_to_queue``), admitted requests
leave it, and a cache-aware policy sorts it *in place* (``list.sort``, stable), so equal keys
keep the order of the last sort. FCFS (without priorities) never sorts: it serves the list as it
stands. :class:`WaitingQueue` mirrors that list for a policy that must order ties as SGLang does.
"""

from __future__ import annotations

from topas.engine.view import EngineView, RequestView


class WaitingQueue:
    """The waiting requests in SGLang's queue order."""

    def __init__(self) -> None:
        self._rids: list[str] = []
        self._requeued: dict[str, float] = {}  # rid -> when it re-entered the queue

    def current(self, view: EngineView) -> list[RequestView]:
        """The queue now: requests already queued in their last order, then the new ones in the
        order they reached it (ready time, or the time a retracted request re-entered; then id)."""
        waiting = {r.rid: r for r in view.waiting}
        kept = [waiting.pop(rid) for rid in self._rids if rid in waiting]
        entered = self._requeued
        return kept + sorted(waiting.values(), key=lambda r: (entered.get(r.rid, r.ready_time), r.rid))

    def keep(self, order: list[RequestView]) -> None:
        """The queue's order after this scheduling point (a policy's in-place sort)."""
        self._rids = [r.rid for r in order]
        if self._requeued:  # (rarely any: only retracted or preempted requests)
            for r in order:
                self._requeued.pop(r.rid, None)

    def requeue(self, rid: str, time: float) -> None:
        """A running request was retracted or preempted at ``time``: it re-enters at the end."""
        if rid in self._rids:
            self._rids.remove(rid)
        self._requeued[rid] = time
