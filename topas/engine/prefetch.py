"""Background host -> GPU prefetch of agent prefixes and the admission skip of requests whose
prefix is still loading (KVFlow's overlapped prefetch, arXiv 2507.07400 section 4.2;
docs/method.md, "KVFlow").

KVFlow's SGLang fork (``Scheduler.DispatchLoadTasks``, ``HiRadixCache.load_back``) walks the agents
due within ``load_ahead_step`` steps, nearest first, and for each whose prefix was evicted to host
memory starts an asynchronous load (``cache_controller.load``) if the prefix fits in the free plus
evictable pool (``check_reserve``), stopping at the first that does not. The load's GPU memory is
allocated at once and locked (``inc_lock_ref``) until the copy completes. Its admission walk
(``get_new_batch_prefill``) skips (``continue``, not ``break``) a request whose prefix is still
loading, and for a request whose prefix is on host only it starts that load and skips it too: a
host-resident prefix is never loaded in the request's own iteration.

Our choices (docs/method.md, "KVFlow"): the agents to prefetch are computed at every decision
point, before the admission walk, and loaded after it (so a load never takes the room of a
request admitted now); a load never evicts the cached KV of an agent due within ``L`` steps
(:meth:`Prefetch._prefetch_room`; the load of a waiting request's own prefix may). Here a load occupies the host link for ``CostModel.swap_time(l_a)`` (the profile's bandwidth),
loads queue on one link by the fork's priorities (its ``load_queue`` is a ``PriorityQueue``: 0
for a waiting request's prefix, ``steps + 1`` for a prefetch; then the order queued; a copy in
progress is not interrupted, the fork's ``enable_interrupt`` being off by default), and a loading prefix is resident (its KV
counted and locked) but not matchable until its load completes; the engine's clock stops at each
completion (an event) and re-runs admission. Only with ``EngineConfig.host_tier`` and a strategy
that prefetches (:attr:`Simulator._prefetcher`); otherwise nothing here runs and the engine is
unchanged.

:class:`Prefetch` is a part of :class:`topas.engine.simulator.Simulator` (a mixin over its state:
``prefixes``, ``prefix_tokens``, ``_loading``), kept apart so each file has one job.
"""

from __future__ import annotations

import heapq
from typing import Sequence

from topas.engine.entities import Prefix


class Prefetch:
    """Asynchronous prefix loads from the host tier, and the admission skip while they run."""

    def _prefetch(self, agents: Sequence[tuple[str, int]], demand: bool = False) -> int:
        """Start background loads of the host-resident prefixes of ``agents`` ((agent, steps),
        nearest first), each only if it fits; stop at the first that does not
        (``DispatchLoadTasks``' ``to_break``). ``demand``: the load of a waiting request's prefix
        (the fork's ``load_back(priority=0, check_reserve=True)`` in the admission walk), which
        may evict anything unlocked. Returns the number started."""
        room = self._locked_room() if demand else self._prefetch_room()
        started = 0
        for a, steps in agents:
            p = self.prefixes[a]
            if p.resident or not p.on_host or a in self._loading:
                continue
            if p.tokens > room:
                break
            # the fork's load priorities: 0 for a waiting request's prefix, steps + 1 for a prefetch
            self._start_load(p, 0 if demand else steps + 1)
            room -= p.tokens
            started += 1
        if started:
            self._settle()  # the load's allocation evicts what no longer fits
        return started

    def _locked_room(self) -> int:
        """The pool less what is locked: free plus evictable KV (``check_reserve``)."""
        return self.budget - self.request_tokens - self._locked_prefix_tokens()

    def _prefetch_room(self) -> int:
        """KV a load may take: the pool less what is locked (``load_back(check_reserve=True)``:
        free plus evictable) and less the cached KV of the agents due within ``L`` steps (our
        choice: a load never evicts another agent KVFlow protects, or loads would evict each
        other's prefixes before their requests are admitted)."""
        room = self._locked_room()
        for a, _ in self._protected:
            p = self.prefixes[a]
            if p.resident and not self._locked(p):
                room -= p.tokens
            room -= self._cached_by_agent[a]
        return room

    def _start_load(self, p: Prefix, priority: int) -> None:
        """Allocate and lock the prefix's KV now (``cache_controller.load``) and queue its copy
        on the host link (a priority queue: lower first, then the order queued)."""
        a = p.agent.name
        self._loading[a] = None
        heapq.heappush(self._link_queue, (priority, len(self.prefix_events), a))  # (queued order)
        self._record_prefix("prefetch_swap", p, p.tokens * self.cost.kv_bytes_per_token)
        p.resident = True
        p.prefill_left = 0
        p.last_used = self.now
        self.prefix_tokens += p.tokens
        if self._link_current is None:
            self._link_next(self.now)

    def _link_next(self, t: float) -> None:
        """The link, free from ``t``, starts the first queued copy."""
        _, _, a = heapq.heappop(self._link_queue)
        self._link_current = a
        self._loading[a] = t + self.cost.swap_time(self.prefixes[a].tokens)

    def _loads_done(self) -> None:
        """Copies completed by now: their prefixes become matchable; admission runs again."""
        while self._link_current is not None and self._loading[self._link_current] <= self.now:
            t = self._loading.pop(self._link_current)
            self._link_current = None
            self._dirty = True
            if self._link_queue:
                self._link_next(t)

    def _next_load(self) -> float | None:
        """When the copy on the link completes (None: the link is idle)."""
        return self._loading[self._link_current] if self._link_current is not None else None

    def _skip_loading(self, agent: str) -> bool:
        """Admission skips a request of ``agent`` (KVFlow's ``REQ_IS_LOADING``/``REQ_IS_EVICTED``):
        its prefix is loading, or is on host only (its load is started here if it fits)."""
        if agent in self._loading:
            return True
        p = self.prefixes[agent]
        if not p.resident and p.on_host:
            self._prefetch(((agent, 0),), demand=True)
            return True
        return False
