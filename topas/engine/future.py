"""The true future of a run, for the offline eviction bound (``belady``; docs/method.md, "The offline bound").

**An offline bound, not a policy.** This module reads what no scheduler can know: every task's
arrival time and DAG before the task arrives, and every later prompt's segments. Only the
``belady`` eviction strategy (:mod:`topas.engine.belady`) uses it, to say how far the best
eviction order could go; no policy may import it.

The reference order. Belady's rule (evict the entry whose next use is furthest in the future) is
optimal for a fixed sequence of references. In a serving engine the sequence is the order in
which requests are admitted, and that order depends on the schedule, which depends on what the
cache holds. So the bound fixes a reference order from the trace alone, schedule-independent:
requests are referenced in the order of their task's arrival time, and within a task in the order
of the stage's depth in the DAG (the length of its longest chain of parents; parallel branches
share a depth), then the task's topological order. This is first-come-first-served admission over
tasks. Under another admission order the "next use" it gives is an estimate, exact only where the
engine admits in that order: the bound is Belady's optimum *for that admission order*.

An entry's next use is the earliest request in that order, among the requests not yet finished
(waiting, running, retracted, not yet ready, or of a task yet to arrive), whose prompt holds the
entry: an agent prefix is held by every request of its agent; a segment node (``topas.trace/2``;
:mod:`topas.engine.radix_cache`) by every request whose prompt has that segment id below that
agent's prefix. A finished request's output leaf (``\\0out/<rid>``) is held by no prompt: it is
never used again. A running request holds its nodes locked, so what matters is the use after it.

Cost: building the index is linear in the trace's segments; :meth:`NextUse.next_use` is amortised
O(1) (a pointer per entry skips finished requests, which never come back).
"""

from __future__ import annotations

import math
from typing import Iterable

from topas.workload.model import Task, Trace

__all__ = ["NEVER", "NextUse", "reference_order"]

#: The next use of an entry that no unfinished request holds.
NEVER = math.inf


def _depths(task: Task) -> dict[str, int]:
    """Each stage's depth: 0 for a root, else 1 + its deepest parent's."""
    depth: dict[str, int] = {}
    for sid in task.topo_order:
        parents = task.stage_map[sid].parents
        depth[sid] = 1 + max(depth[p] for p in parents) if parents else 0
    return depth


def reference_order(tasks: Iterable[Task]) -> list[tuple[float, int, int, str]]:
    """Every request of ``tasks`` as ``(task arrival, stage depth, topological index, rid)``,
    sorted: the bound's reference order (module docstring). ``rid`` is the engine's
    ``task/stage`` (:func:`topas.engine.entities.start_task`)."""
    out = []
    for t in tasks:
        depth = _depths(t)
        for k, sid in enumerate(t.topo_order):
            out.append((t.arrival, depth[sid], k, f"{t.id}/{sid}"))
    out.sort()
    return out


class NextUse:
    """The next use of each cache entry in the reference order, as requests finish (module docstring).

    Keys: ``(agent,)`` for an agent prefix, ``(agent, segment id)`` for a segment node below it.
    :meth:`next_use` returns the position (0, 1, ...) in the reference order of the earliest
    unfinished request holding the key, or :data:`NEVER`.
    """

    def __init__(self, trace: Trace) -> None:
        order = reference_order(trace.tasks)
        #: the request ids in reference order (tasks by arrival: the order they reach the engine)
        self.rids: tuple[str, ...] = tuple(rid for *_, rid in order)
        self.position: dict[str, int] = {rid: i for i, rid in enumerate(self.rids)}
        stages = {f"{t.id}/{s.id}": s for t in trace.tasks for s in t.stages}
        uses: dict[tuple[str, ...], list[int]] = {}
        for i, (_, _, _, rid) in enumerate(order):
            s = stages[rid]
            uses.setdefault((s.agent,), []).append(i)
            if s.segments is not None:
                prefix = trace.agents[s.agent].prefix_tokens
                pos = 0
                for seg in s.segments:
                    if pos >= prefix:
                        lst = uses.setdefault((s.agent, seg.id), [])
                        if not lst or lst[-1] != i:  # a segment id once per prompt
                            lst.append(i)
                    pos += seg.tokens
        self._uses = uses  # positions, ascending (built in reference order)
        self._head: dict[tuple[str, ...], int] = {k: 0 for k in uses}
        self._finished = [False] * len(order)

    def finish(self, rid: str) -> None:
        """Request ``rid`` finished: it uses nothing any more. An unknown rid raises ``KeyError`` naming it."""
        try:
            self._finished[self.position[rid]] = True
        except KeyError:
            raise KeyError(f"NextUse.finish: request {rid!r} is not in the trace") from None

    def next_use(self, key: tuple[str, ...]) -> float:
        """The reference position of the earliest unfinished request holding ``key``, or :data:`NEVER`."""
        lst = self._uses.get(key)
        if lst is None:
            return NEVER
        h = self._head[key]
        fin = self._finished
        while h < len(lst) and fin[lst[h]]:
            h += 1
        self._head[key] = h
        return float(lst[h]) if h < len(lst) else NEVER
