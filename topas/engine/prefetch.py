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
that prefetches (:attr:`Prefetch.prefetcher`); otherwise nothing here runs and the engine is
unchanged.

:class:`Prefetch` owns the host link: the prefixes whose copy is queued or in progress
(:attr:`Prefetch.loading`), the link's queue, the agents KVFlow protects at this decision point.
A loading prefix's KV is the pool's (:class:`topas.engine.memory.KVMemory`), allocated when the
load starts; the eviction part (:class:`topas.engine.evict_pass.Eviction`) makes room for it.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Callable, Sequence

from topas.engine.clock import Clock
from topas.engine.cost import CostModel
from topas.engine.entities import Prefix
from topas.engine.memory import KVMemory

if TYPE_CHECKING:
    from topas.engine.evict_pass import Eviction
    from topas.engine.view import EngineView

#: what to prefetch at a decision point: (agent, steps to execution) from the view, nearest first
Prefetcher = Callable[["EngineView"], tuple[tuple[str, int], ...]]


class Prefetch:
    """Asynchronous prefix loads from the host tier, and the admission skip while they run."""

    def __init__(self, memory: KVMemory, eviction: "Eviction", clock: Clock, cost: CostModel,
                 prefetcher: Prefetcher | None) -> None:
        """``prefetcher``: the agents to prefetch, read from the view (the ``kvflow`` strategy's;
        None: no prefetch, the default engine)."""
        self.memory = memory
        self.eviction = eviction
        self.clock = clock
        self.cost = cost
        self.prefetcher = prefetcher
        #: agent -> when its copy completes (None: queued, not yet on the link)
        self.loading: dict[str, float | None] = {}
        #: the agent whose copy is on the link (None: the link is idle)
        self.on_link: str | None = None
        self._queue: list[tuple[int, int, str]] = []  # (priority, queued order, agent)
        self._queued = 0
        #: (agent, steps) due within L steps, nearest first, at the last decision point
        self.protected: tuple[tuple[str, int], ...] = ()

    @property
    def enabled(self) -> bool:
        """The engine prefetches (and skips requests whose prefix is loading)."""
        return self.prefetcher is not None

    def plan(self, view: "EngineView") -> None:
        """KVFlow's agents due within ``L`` steps at this decision point (:attr:`protected`)."""
        self.protected = self.prefetcher(view)  # type: ignore[misc]

    def dispatch(self) -> None:
        """KVFlow's ``DispatchLoadTasks``: start the loads of the :attr:`protected` agents."""
        if self.protected:
            self.prefetch(self.protected)

    def prefetch(self, agents: Sequence[tuple[str, int]], demand: bool = False) -> int:
        """Start background loads of the host-resident prefixes of ``agents`` ((agent, steps),
        nearest first), each only if it fits; stop at the first that does not
        (``DispatchLoadTasks``' ``to_break``). ``demand``: the load of a waiting request's prefix
        (the fork's ``load_back(priority=0, check_reserve=True)`` in the admission walk), which
        may evict anything unlocked. Returns the number started."""
        room = self.memory.locked_room() if demand else self._prefetch_room()
        prefixes = self.memory.prefixes
        started = 0
        for a, steps in agents:
            p = prefixes[a]
            if p.resident or not p.on_host or a in self.loading:
                continue
            if p.tokens > room:
                break
            # the fork's load priorities: 0 for a waiting request's prefix, steps + 1 for a prefetch
            self._start_load(p, 0 if demand else steps + 1)
            room -= p.tokens
            started += 1
        if started:
            self.eviction.settle()  # the load's allocation evicts what no longer fits
        return started

    def _prefetch_room(self) -> int:
        """KV a load may take: the pool less what is locked (``load_back(check_reserve=True)``:
        free plus evictable) and less the cached KV of the agents due within ``L`` steps (our
        choice: a load never evicts another agent KVFlow protects, or loads would evict each
        other's prefixes before their requests are admitted)."""
        memory = self.memory
        room = memory.locked_room()
        for a, _ in self.protected:
            p = memory.prefixes[a]
            if p.resident and not memory.locked(p):
                room -= p.tokens
            room -= memory.cached_tokens(a)
        return room

    def _start_load(self, p: Prefix, priority: int) -> None:
        """Allocate and lock the prefix's KV now (``cache_controller.load``) and queue its copy
        on the host link (a priority queue: lower first, then the order queued)."""
        a = p.agent.name
        self.loading[a] = None
        self._queued += 1
        heapq.heappush(self._queue, (priority, self._queued, a))
        self.memory.load_from_host(p)
        if self.on_link is None:
            self._link_next(self.clock.now)

    def _link_next(self, t: float) -> None:
        """The link, free from ``t``, starts the first queued copy."""
        _, _, a = heapq.heappop(self._queue)
        self.on_link = a
        self.loading[a] = t + self.cost.swap_time(self.memory.prefixes[a].tokens)

    def loads_done(self) -> int:
        """Copies completed by now: their prefixes become matchable (admission runs again).
        Returns how many completed."""
        done = 0
        while self.on_link is not None and self.loading[self.on_link] <= self.clock.now:  # type: ignore[operator]
            t = self.loading.pop(self.on_link)
            self.on_link = None
            done += 1
            if self._queue:
                self._link_next(t)  # type: ignore[arg-type]
        return done

    def next_load(self) -> float | None:
        """When the copy on the link completes (None: the link is idle)."""
        return self.loading[self.on_link] if self.on_link is not None else None

    def skip_loading(self, agent: str) -> bool:
        """Admission skips a request of ``agent`` (KVFlow's ``REQ_IS_LOADING``/``REQ_IS_EVICTED``):
        its prefix is loading, or is on host only (its load is started here if it fits)."""
        if agent in self.loading:
            return True
        p = self.memory.prefixes[agent]
        if not p.resident and p.on_host:
            self.prefetch(((agent, 0),), demand=True)
            return True
        return False
