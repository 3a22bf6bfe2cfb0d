"""The way to one engine's scheduler: task arrivals and the request path (docs/design.md,
"Engine parts").

:class:`RequestPath` owns what has not reached the scheduler yet: the trace's tasks not yet
arrived (in arrival order) and the requests that became ready and are on their request path, in
a heap by the time they reach the scheduler. A root stage's request travels half of
``EngineConfig.request_latency_s`` (the way in); a later stage's a whole one (its parents' replies
out, then its own request in). An engine of a cluster has no arrivals of its own: its router
:meth:`send`\\ s each request it routes there.
"""

from __future__ import annotations

import heapq
from typing import Iterable, Iterator

from topas.engine.entities import Request
from topas.workload.model import Task


class RequestPath:
    """Tasks still to arrive and requests on their way to the scheduler."""

    def __init__(self, tasks: Iterable[Task], request_latency_s: float) -> None:
        #: half of the request latency: a request's way in (or a reply's way out)
        self.half_latency = 0.5 * request_latency_s
        self._tasks = list(tasks)
        self._next = 0  # the first task not arrived yet
        self._on_way: list[tuple[float, int, Request]] = []  # (reaches the scheduler, seq, request)
        self._seq = 0

    @property
    def n_tasks(self) -> int:
        """The tasks of the trace this path delivers (arrived or not)."""
        return len(self._tasks)

    def next_arrival(self) -> float | None:
        """When the next task arrives (None: every task has)."""
        return self._tasks[self._next].arrival if self._next < len(self._tasks) else None

    def arrived(self, now: float) -> list[Task]:
        """The tasks arriving by ``now``, in arrival order (each returned once)."""
        tasks, i = self._tasks, self._next
        j = i
        while j < len(tasks) and tasks[j].arrival <= now:
            j += 1
        self._next = j
        return tasks[i:j]

    def delay(self, r: Request) -> float:
        """``r``'s request path: half the latency for a root, the whole for a later stage."""
        return self.half_latency if not r.stage.parents else 2 * self.half_latency

    def send(self, r: Request, t: float) -> None:
        """``r`` became ready at ``t``: it reaches the scheduler its :meth:`delay` later."""
        self._seq += 1
        heapq.heappush(self._on_way, (t + self.delay(r), self._seq, r))

    def next_delivery(self) -> float | None:
        """When the next request on its way reaches the scheduler (None: none is on its way)."""
        return self._on_way[0][0] if self._on_way else None

    def delivered(self, now: float) -> Iterator[tuple[float, Request]]:
        """(time it reached the scheduler, request) of each request that has by ``now``, in that
        order (each once)."""
        on_way = self._on_way
        while on_way and on_way[0][0] <= now:
            t, _, r = heapq.heappop(on_way)
            yield t, r

    def on_way(self) -> int:
        """The number of requests on their way."""
        return len(self._on_way)
