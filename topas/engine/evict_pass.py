"""Which cached KV one engine evicts, and when (docs/design.md, "Engine parts" and "Eviction").

:class:`Eviction` owns the eviction strategy (``EngineConfig.eviction``, ``topas.engine.eviction``)
and decides what goes: when the radix cache's pool is over its budget after an allocation
(:meth:`Eviction.settle`) and when a request needs room without the radix cache or decode runs
out of memory (:meth:`Eviction.make_room`). It keeps the bookkeeping the strategies read: hit
counts and priorities raised at insertion and at a request's finish, a request's priority fixed
when it reaches the scheduler. What it evicts it evicts through the pool
(:class:`topas.engine.memory.KVMemory`) and the segment tree
(:class:`topas.engine.segments.SegmentMemory`), which own the entries.

``lru`` walks the pool's LRU heaps (its fast path); any other strategy evicts in a pass, as
SGLang's ``FullComponent._evict_device_start`` does: one heap of every evictable entry by the
strategy's key, built when a pass starts, a parent (a prefix) pushed when its last cached child
goes, whole entries evicted until the need is met.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Callable

from topas.engine.clock import Clock
from topas.engine.config import EngineConfig
from topas.engine.entities import Prefix, Request
from topas.engine.eviction import LEAF, PREFIX, SEGMENT, Evictable, EvictionStrategy, OfflineFuture, eviction_strategy
from topas.engine.memory import KVMemory
from topas.engine.policy_api import PolicyAPI, PolicyError, overrides
from topas.engine.radix_cache import SegmentCache, SegmentNode
from topas.engine.segments import SegmentMemory
from topas.engine.view_cache import seal

if TYPE_CHECKING:
    from topas.engine.view import EngineView


def check_policy_eviction(policy: PolicyAPI, strategy: EvictionStrategy | str) -> None:
    """``PolicyError`` if ``strategy`` (a strategy or its spec) orders by the policy's own values
    (:attr:`EvictionStrategy.reads_policy`) and ``policy`` does not give any
    (``Policy.eviction_values`` not overridden)."""
    ev = eviction_strategy(strategy) if isinstance(strategy, str) else strategy
    if ev.reads_policy and not overrides(policy, "eviction_values"):
        raise PolicyError(f"eviction {ev.name!r} orders by the policy's eviction values, and policy "
                          f"{policy.name!r} has none (Policy.eviction_values); use a policy that does")




class Eviction:
    """What the engine evicts, in LRU or a strategy's order, and the entries' hit counts and
    priorities. Owns :attr:`strategy` and whether the policy sets request priorities."""

    def __init__(self, strategy: EvictionStrategy, memory: KVMemory, segments: SegmentMemory | None,
                 config: EngineConfig, clock: Clock, policy: PolicyAPI, view: Callable[[], "EngineView"],
                 future: Callable[[], OfflineFuture]) -> None:
        """``view``: the engine's view now (a dynamic strategy's and ``request_priority``'s; its
        running requests built at their first read, sealed once the call that reads it returns);
        ``future``: the run's true future (an offline bound's only)."""
        check_policy_eviction(policy, strategy)
        self.strategy = strategy
        self.memory = memory
        self.segments = segments
        self.config = config
        self.clock = clock
        self.policy = policy
        self._view = view
        self._future = future
        #: the policy sets request priorities (it overrides ``Policy.request_priority``) and the
        #: strategy reads them
        self.sets_priority = strategy.reads_priority and overrides(policy, "request_priority")

    # ------------------------------------------------------------------ bookkeeping
    def set_request_priority(self, r: Request) -> None:
        """``r`` reached the scheduler (once: a retracted request keeps its priority), its
        priority is fixed by ``Policy.request_priority`` (a policy without one: 0)."""
        if self.sets_priority:
            view = self._view()
            r.priority = int(self.policy.request_priority(r.view(self.clock.now), view))
            seal(view)

    def count_insert(self, r: Request) -> None:
        """``r``'s prompt entered the radix tree (``cache_unfinished_req``: ``_insert_walk_step``,
        ``_finish_insert_walk_node``): each node its insertion walked through, the prefix included,
        gets one more hit and at least ``r``'s priority; a node it created starts there (one hit)."""
        p = self.memory.prefixes[r.agent]
        p.hit_count += 1
        p.priority = max(p.priority, r.priority)
        for n in r.seg_nodes:
            n.hit_count += 1
            n.priority = max(n.priority, r.priority)

    def count_finish(self, r: Request) -> None:
        """``r`` finished (``checkpoint_into_tree``): its prompt path is inserted once more at
        ``priority + 1`` (the prompt-boundary split; no hits: ``inserted_len`` covers it), so it
        outlives the output leaf (priority ``r.priority``, one hit) under ``priority``."""
        up = r.priority + 1
        p = self.memory.prefixes[r.agent]
        p.priority = max(p.priority, up)
        for n in r.seg_nodes:
            n.priority = max(n.priority, up)

    # ------------------------------------------------------------------ entries
    def _prefix_entry(self, p: Prefix) -> Evictable:
        a = p.agent.name
        hist = self.segments.history(a) if self.segments is not None else p.history
        return Evictable(PREFIX, a, p.tokens, p.last_used, p.hit_count, p.priority, 0, (1, a), a, p.tokens, hist)

    def _leaf_entry(self, leaf: tuple) -> Evictable:
        t, seq, a, kv, _, rid, prio = leaf
        p = self.memory.prefixes[a]
        return Evictable(LEAF, a, kv, t, 1, prio, seq, (0, seq), rid, p.tokens + kv, p.history)

    def _node_entry(self, n: SegmentNode) -> Evictable:
        tokens = n.depth if self._merged_with_prefix(n) else n.tokens
        return Evictable(SEGMENT, n.agent, tokens, n.last_access, n.hit_count, n.priority, n.serial,
                         (0, n.serial), n.id, n.depth, n.history)

    def _merged_with_prefix(self, n: SegmentNode) -> bool:
        """Whether ``n`` is part of the one radix node SGLang keeps for an agent prefix and the
        prompt of the request that computed it (:meth:`KVMemory.prefix_node_owner`), until a
        later match splits it: the nodes from the root to ``n`` all that request's, each its
        parent's only child. The entry then has the whole node's length (``tlru`` reads where
        the node starts); a finished output is a node of its own (inserted at finish)."""
        if n.id.startswith("\0out/") or self.memory.prefix_node_owner(n.agent) != n.owner:
            return False
        m = n
        while m.parent is not None:
            if len(m.parent.children) != 1 or (m.parent.parent is not None and m.parent.owner != n.owner):
                return False
            m = m.parent
        return True

    def _prefix_order(self, p: Prefix) -> tuple:
        e = self._prefix_entry(p)
        return (self.strategy.priority(e), e.tie)

    def prepare(self) -> None:
        """A dynamic strategy's :meth:`EvictionStrategy.prepare` before a pass."""
        ev = self.strategy
        if ev.needs_view or ev.bound:  # (a bound that reads no view gets None: a view per pass is costly)
            view = self._view() if ev.needs_view else None
            ev.prepare(view, self._future() if ev.bound else None)
            if view is not None:
                seal(view)
        if ev.reads_policy:
            view = self._view()
            values = self.policy.eviction_values(view)
            seal(view)
            if values is None:
                raise ValueError(f"policy {self.policy.name!r} returned no eviction values for eviction {ev.name!r}")
            ev.take_values(values)

    # ------------------------------------------------------------------ when memory must be freed
    def make_room(self, tokens: int, exclude: Prefix | None = None) -> bool:
        """Evict unreferenced prefixes (LRU, or the strategy's order) until ``tokens`` fit beside
        resident prefixes and running requests; False if they cannot."""
        memory = self.memory
        free = memory.free_tokens()
        if free >= tokens:
            return True
        victims = memory.idle_prefixes(exclude)
        if self.strategy.heap_fast_path:
            victims.sort(key=lambda p: (p.last_used, p.agent.name))
        else:
            self.prepare()
            victims.sort(key=self._prefix_order)
        if free + sum(p.tokens for p in victims) < tokens:
            return False
        for p in victims:
            if free >= tokens:
                break
            memory.evict(p)
            free += p.tokens
        return True

    def settle(self) -> None:
        """The radix cache's allocation: evict leaves (finished requests' KV; prefixes nobody uses
        and whose children are gone) until everything fits the pool, least recently used first
        or in the strategy's order (:meth:`strategy_pass`)."""
        if not self.config.radix_cache:
            return
        memory, segments = self.memory, self.segments
        deficit = memory.overflow()
        if deficit > 0 and not self.strategy.heap_fast_path:
            self.strategy_pass(deficit)
            return
        prefix = memory.lru_evictable_prefix() if deficit > 0 else None
        while deficit > 0:
            leaf = memory.oldest_leaf()
            node = segments.tree.peek_lru() if segments is not None else None
            leaf_time = leaf[0] if leaf is not None else (node.last_access if node is not None else None)
            if prefix is not None and (leaf_time is None or prefix.last_used < leaf_time):
                agent = prefix.agent.name
                deficit -= memory.evict_cached_prefix(prefix)
            elif leaf is not None:
                agent = leaf[2]
                deficit -= memory.evict_oldest_leaf()
            elif node is not None:
                agent = node.agent
                deficit -= segments.evict(node)
            else:
                break
            prefix = self._next_lru_prefix(prefix, memory.prefixes[agent])

    def _next_lru_prefix(self, best: Prefix | None, touched: Prefix) -> Prefix | None:
        """:meth:`KVMemory.lru_evictable_prefix` after an eviction in :meth:`settle`, from the one
        before it (``best``): an eviction changes only its own agent's prefix (``touched``: its
        cached KV, its residence), and the clock stands still in a pass, so only ``touched`` is
        looked at again, unless it was ``best`` and went (then every prefix is scanned again)."""
        memory = self.memory
        if not memory.prefix_evictable(touched):
            return memory.lru_evictable_prefix() if touched is best else best
        if best is None or (touched.last_used, touched.agent.name) < (best.last_used, best.agent.name):
            return touched
        return best

    def strategy_pass(self, deficit: int) -> None:
        """Evict entries, smallest strategy key first (ties: :attr:`Evictable.tie`), until
        ``deficit`` tokens are freed or nothing evictable is left."""
        memory, segments = self.memory, self.segments
        self.prepare()
        key = self.strategy.priority
        heap: list[tuple] = []
        seq = iter(range(1 << 62))

        def push(e: Evictable, obj: object) -> None:
            heapq.heappush(heap, (key(e), e.tie, next(seq), obj))

        for p in memory.prefixes.values():
            if memory.prefix_evictable(p):
                push(self._prefix_entry(p), p)
        for leaf in memory.live_leaves():
            push(self._leaf_entry(leaf), leaf)
        if segments is not None:
            for n in segments.tree.evictable_leaves():
                push(self._node_entry(n), n)
        while deficit > 0 and heap:
            obj = heapq.heappop(heap)[3]
            if isinstance(obj, Prefix):
                if memory.prefix_evictable(obj):
                    deficit -= memory.evict_cached_prefix(obj)
                continue
            if isinstance(obj, SegmentNode):
                if not SegmentCache.evictable(obj):
                    continue
                parent, a = obj.parent, obj.agent
                deficit -= segments.evict(obj)  # type: ignore[union-attr]
                if parent is not None and parent.parent is not None and SegmentCache.evictable(parent):
                    push(self._node_entry(parent), parent)
            else:
                a = obj[2]
                if not memory.leaf_live(obj):
                    continue  # dropped with its prefix
                deficit -= memory.evict_leaf(obj)
            p = memory.prefixes[a]
            if memory.prefix_evictable(p):
                push(self._prefix_entry(p), p)
