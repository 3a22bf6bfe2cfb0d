"""``belady``: the offline eviction bound (docs/method.md, "The offline bound").

**An offline bound that no scheduler can reach, not a policy.** It evicts the entry whose next
use is furthest in the future, and it knows that future only because the engine hands an
:attr:`~topas.engine.eviction.EvictionStrategy.bound` strategy the run's
:class:`~topas.engine.eviction.OfflineFuture`: the whole trace (every task's arrival time and DAG
before it arrives, every later prompt's segments) and every arrived request's state. No server
could run it; its results say how far a better eviction order could go, never what a scheduler
achieves.

The next use of an entry is :class:`topas.engine.future.NextUse`'s: its position in a fixed
reference order of requests (tasks by arrival, stages by DAG depth), among the requests not yet
finished whose prompt holds it; so this is Belady's optimum for that admission order and an
estimate under another (:mod:`topas.engine.future`). Entries:

* an agent prefix (:data:`~topas.engine.eviction.PREFIX`): held by every request of its agent;
* a segment node (:data:`~topas.engine.eviction.SEGMENT`): held by every request whose prompt
  has that segment id below that agent's prefix; a finished request's output node (id
  ``\\0out/<rid>``) by none;
* a finished request's KV leaf on a trace without segments (:data:`~topas.engine.eviction.LEAF`):
  held by none (no later prompt shares a request's own tokens there).

Key: ``(-next use, last access)``: never used again first, then the furthest next use; equal next
uses (the same request holds both) least recently used first, as SGLang's LRU. Belady minimises
misses of entries of one size; entries here differ in size and a miss costs a prefill, not a
fixed price, so this is not the JCT optimum (docs/method.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topas.engine.eviction import LEAF, PREFIX, SEGMENT, Evictable, EvictionStrategy, OfflineFuture, register_eviction
from topas.engine.future import NEVER, NextUse

if TYPE_CHECKING:
    from topas.engine.view import EngineView

__all__ = ["Belady"]

_DONE = "done"


@register_eviction
class Belady(EvictionStrategy):
    """Furthest next use first, from the run's true future (an offline bound; module docstring)."""

    name = "belady"
    description = "OFFLINE BOUND (reads the true future, not a policy): furthest next use first"
    bound = True  # (reads the future only: no view)

    def __init__(self, **kw: int) -> None:
        super().__init__(**kw)
        self._future: NextUse | None = None
        self._trace_id: int | None = None
        self._arrived = 0  # requests of the reference order seen in ``states`` so far
        self._open: list[str] = []  # of those, the ones not finished yet

    def prepare(self, view: "EngineView | None", future: OfflineFuture | None = None) -> None:
        """Mark the requests finished since the last pass (``future.states``). Tasks reach the
        engine in arrival order, the reference order's, so only the requests seen unfinished so
        far, and those arrived since, are looked at."""
        if future is None:
            raise ValueError("eviction 'belady' is an offline bound: the engine must give it the run's "
                             "OfflineFuture (EvictionStrategy.bound)")
        if self._future is None or self._trace_id != id(future.trace):
            self._future, self._trace_id, self._arrived, self._open = NextUse(future.trace), id(future.trace), 0, []
        nu, states, rids = self._future, future.states, self._future.rids
        while self._arrived < len(rids) and rids[self._arrived] in states:
            self._open.append(rids[self._arrived])
            self._arrived += 1
        if len(states) > self._arrived:  # a request the trace's future does not hold (a cluster's engine)
            stray = next(rid for rid in states if rid not in nu.position or nu.position[rid] >= self._arrived)
            raise ValueError(f"eviction 'belady': request {stray!r} reached the engine out of its trace's future "
                             "(an engine of a cluster sees only the tasks routed to it: the bound needs the whole "
                             "future of one engine)")
        still = []
        for rid in self._open:
            if states[rid] == _DONE:
                nu.finish(rid)
            else:
                still.append(rid)
        self._open = still

    def next_use(self, e: Evictable) -> float:
        """The reference position of the next request that holds ``e`` (:data:`NEVER`: none)."""
        if self._future is None:
            raise ValueError("eviction 'belady': priority asked before prepare (no OfflineFuture yet)")
        if e.kind == PREFIX:
            return self._future.next_use((e.agent,))
        if e.kind == SEGMENT:
            return self._future.next_use((e.agent, e.key))
        if e.kind == LEAF:
            return NEVER
        raise ValueError(f"eviction 'belady': unknown entry kind {e.kind!r} ({e.key!r})")

    def priority(self, e: Evictable) -> tuple:
        return (-self.next_use(e), e.last_access)
