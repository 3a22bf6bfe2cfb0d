"""The simulator's eviction by a strategy (``EngineConfig.eviction``, ``topas.engine.eviction``)
and the bookkeeping the strategies read: hit counts and priorities raised at insertion and at a
request's finish, a request's priority fixed when it reaches the scheduler.

:class:`StrategyEviction` is a part of :class:`topas.engine.simulator.Simulator` (a mixin over its
state: ``prefixes``, ``_leaves``, ``_tree``, ``_cached_by_agent``), kept apart so each file has
one job; it is not used on its own. ``lru`` keeps the heaps of ``topas.engine.memory`` (its fast
path); any other strategy evicts here, as SGLang's ``FullComponent._evict_device_start`` does:
one heap of every evictable entry by the strategy's key, built when a pass starts, a parent (a
prefix) pushed when its last cached child goes, whole entries evicted until the need is met.
"""

from __future__ import annotations

import heapq

from topas.engine.entities import Prefix, Request
from topas.engine.eviction import LEAF, PREFIX, SEGMENT, Evictable, EvictionStrategy, OfflineFuture, eviction_strategy
from topas.engine.radix_cache import NO_PRIORITY, SegmentCache, SegmentNode
from topas.engine.policy_api import PolicyAPI, PolicyError, overrides


def check_policy_eviction(policy: PolicyAPI, strategy: EvictionStrategy | str) -> None:
    """``PolicyError`` if ``strategy`` (a strategy or its spec) orders by the policy's own values
    (:attr:`EvictionStrategy.reads_policy`) and ``policy`` does not give any
    (``Policy.eviction_values`` not overridden)."""
    ev = eviction_strategy(strategy) if isinstance(strategy, str) else strategy
    if ev.reads_policy and not overrides(policy, "eviction_values"):
        raise PolicyError(f"eviction {ev.name!r} orders by the policy's eviction values, and policy "
                          f"{policy.name!r} has none (Policy.eviction_values); use a policy that does")


class StrategyEviction:
    """Eviction in a strategy's order, and the entries' hit counts and priorities."""

    _eviction: EvictionStrategy

    def _init_eviction(self) -> None:
        self._eviction = eviction_strategy(self.config.eviction)
        #: the policy sets request priorities (it overrides ``Policy.request_priority``) and the
        #: strategy reads them
        self._sets_priority = self._eviction.reads_priority and overrides(self.policy, "request_priority")
        check_policy_eviction(self.policy, self._eviction)

    def _new_tree(self) -> SegmentCache:
        """The segment tree for this engine's strategy (LRU heap or scanned candidates)."""
        ev = self._eviction
        return SegmentCache(self.prefixes, heap=ev.heap_fast_path, history=ev.needs_history,
                            prefix_tokens={a: p.tokens for a, p in self.prefixes.items()})

    # ------------------------------------------------------------------ bookkeeping
    def _set_request_priority(self, r: Request) -> None:
        """``r`` reached the scheduler (once: a retracted request keeps its priority), its
        priority is fixed by ``Policy.request_priority`` (a policy without one: 0)."""
        if self._sets_priority:
            r.priority = int(self.policy.request_priority(r.view(self.now), self.view()))

    def _count_insert(self, r: Request) -> None:
        """``r``'s prompt entered the radix tree (``cache_unfinished_req``: ``_insert_walk_step``,
        ``_finish_insert_walk_node``): each node its insertion walked through, the prefix included,
        gets one more hit and at least ``r``'s priority; a node it created starts there (one hit)."""
        p = self.prefixes[r.agent]
        p.hit_count += 1
        p.priority = max(p.priority, r.priority)
        for n in r.seg_nodes:
            n.hit_count += 1
            n.priority = max(n.priority, r.priority)

    def _count_finish(self, r: Request) -> None:
        """``r`` finished (``checkpoint_into_tree``): its prompt path is inserted once more at
        ``priority + 1`` (the prompt-boundary split; no hits: ``inserted_len`` covers it), so it
        outlives the output leaf (priority ``r.priority``, one hit) under ``priority``."""
        up = r.priority + 1
        p = self.prefixes[r.agent]
        p.priority = max(p.priority, up)
        for n in r.seg_nodes:
            n.priority = max(n.priority, up)

    def _reset_prefix_counts(self, p: Prefix) -> None:
        """A prefix computed afresh is a new radix node: no hits yet, the priority of the first
        request inserting it (a policy's load: 0)."""
        p.hit_count = 0
        p.priority = 0 if self.manages else NO_PRIORITY
        p.history = p.tokens

    # ------------------------------------------------------------------ entries
    def _prefix_entry(self, p: Prefix) -> Evictable:
        a = p.agent.name
        hist = self._tree.roots[a].history if self._tree is not None else p.history
        return Evictable(PREFIX, a, p.tokens, p.last_used, p.hit_count, p.priority, 0, (1, a), a, p.tokens, hist)

    def _leaf_entry(self, leaf: tuple) -> Evictable:
        t, seq, a, kv, _, rid, prio = leaf
        p = self.prefixes[a]
        return Evictable(LEAF, a, kv, t, 1, prio, seq, (0, seq), rid, p.tokens + kv, p.history)

    def _node_entry(self, n: SegmentNode) -> Evictable:
        tokens = n.depth if self._merged_with_prefix(n) else n.tokens
        return Evictable(SEGMENT, n.agent, tokens, n.last_access, n.hit_count, n.priority, n.serial,
                         (0, n.serial), n.id, n.depth, n.history)

    def _merged_with_prefix(self, n: SegmentNode) -> bool:
        """Whether ``n`` is part of the one radix node SGLang keeps for an agent prefix and the
        prompt of the request that computed it (``_merged``), until a later match splits it: the
        nodes from the root to ``n`` all that request's, each its parent's only child. The
        entry then has the whole node's length (``tlru`` reads where the node starts); a
        finished output is a node of its own (inserted at finish)."""
        if n.id.startswith("\0out/") or self._merged.get(n.agent) != n.owner:
            return False
        m = n
        while m.parent is not None:
            if len(m.parent.children) != 1 or (m.parent.parent is not None and m.parent.owner != n.owner):
                return False
            m = m.parent
        return True

    def _prefix_order(self, p: Prefix) -> tuple:
        e = self._prefix_entry(p)
        return (self._eviction.priority(e), e.tie)

    def _prepare_eviction(self) -> None:
        """A dynamic strategy's :meth:`EvictionStrategy.prepare` before a pass."""
        ev = self._eviction
        if ev.needs_view or ev.bound:
            future = (OfflineFuture(self.trace, self.now, {rid: r.state for rid, r in self.requests.items()})
                      if ev.bound else None)
            ev.prepare(self.view(), future)
        if ev.reads_policy:
            values = self.policy.eviction_values(self.view())
            if values is None:
                raise ValueError(f"policy {self.policy.name!r} returned no eviction values for eviction {ev.name!r}")
            ev.take_values(values)

    # ------------------------------------------------------------------ the pass
    def _settle_by_strategy(self, deficit: int) -> None:
        """Evict entries, smallest strategy key first (ties: :attr:`Evictable.tie`), until
        ``deficit`` tokens are freed or nothing evictable is left."""
        self._prepare_eviction()
        key = self._eviction.priority
        heap: list[tuple] = []
        seq = iter(range(1 << 62))

        def push(e: Evictable, obj: object) -> None:
            heapq.heappush(heap, (key(e), e.tie, next(seq), obj))

        for p in self.prefixes.values():
            if self._prefix_evictable(p):
                push(self._prefix_entry(p), p)
        live = [leaf for leaf in self._leaves if leaf[4] == self._generation[leaf[2]]]
        if len(live) != len(self._leaves):
            self._leaves = live
            heapq.heapify(self._leaves)
        for leaf in live:
            push(self._leaf_entry(leaf), leaf)
        if self._tree is not None:
            for n in self._tree.evictable_leaves():
                push(self._node_entry(n), n)
        while deficit > 0 and heap:
            obj = heapq.heappop(heap)[3]
            if isinstance(obj, Prefix):
                if self._prefix_evictable(obj):
                    deficit -= self._evict_cached_prefix(obj)
                continue
            if isinstance(obj, SegmentNode):
                if not SegmentCache.evictable(obj):
                    continue
                parent, a = obj.parent, obj.agent
                deficit -= self._seg_evict(obj)
                if parent is not None and parent.parent is not None and SegmentCache.evictable(parent):
                    push(self._node_entry(parent), parent)
            else:
                a = obj[2]
                if obj[4] != self._generation[a]:
                    continue  # dropped with its prefix
                self._leaves.remove(obj)
                heapq.heapify(self._leaves)
                deficit -= self._evict_leaf(obj)
            p = self.prefixes[a]
            if self._prefix_evictable(p):
                push(self._prefix_entry(p), p)

