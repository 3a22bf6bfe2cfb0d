"""The simulator's KV memory (docs/design.md "Engine model"): what a request reserves, making room
by evicting the radix cache's LRU leaves (other orders: ``topas.engine.evict_pass``), loading and evicting agent prefixes, and settling the
cache after a change.

:class:`KVMemory` is a part of :class:`topas.engine.simulator.Simulator` (a mixin over its state:
``prefixes``, ``budget``, ``prefix_tokens``, ``request_tokens``, the cache's ghosts), kept apart
so each file has one job; it is not used on its own.
"""

from __future__ import annotations

import heapq

from topas.engine.entities import WAITING, Prefix, Request
from topas.engine.reservation import output_reserve


#: ``Simulator._merged`` value: a prefix loaded whose computing request has not started yet
_PENDING = "\0pending"


class KVMemory:
    """KV memory of one engine: reservations, room, prefixes loaded and evicted, the cache settled."""

    def _reserve(self, r: Request) -> int:
        """SGLang's reservation for r's future output, ``min(max_new - generated, clip)`` scaled:
        in full for a request being admitted (``full_output_reserve``; with the slot of its first
        output token, allocated at admission, this is ``add_one_req``'s strict
        ``extend_input_len + max_new_tokens < rem_total_tokens``), in full for a running
        ``ignore_eos`` request, else by ``new_token_ratio``."""
        cfg = self.config
        full = cfg.full_output_reserve if r.state == WAITING else cfg.ignore_eos
        return output_reserve(r.max_new, r.generated, cfg.clip_max_new_tokens, full, self.new_token_ratio)

    def _reserved(self) -> int:
        return sum(self._reserve(r) for r in self._running())

    def _make_room(self, tokens: int, exclude: Prefix | None = None) -> bool:
        """Evict unreferenced prefixes (LRU, or ``EngineConfig.eviction``'s order) until
        ``tokens`` fit; False if they cannot."""
        free = self.budget - self.prefix_tokens - self.request_tokens
        if free >= tokens:
            return True
        victims = [p for p in self.prefixes.values() if p.resident and p.refcount == 0 and p is not exclude
                   and p.agent.name not in self._loading]
        if self._eviction.heap_fast_path:
            victims.sort(key=lambda p: (p.last_used, p.agent.name))
        else:
            self._prepare_eviction()
            victims.sort(key=self._prefix_order)
        if free + sum(p.tokens for p in victims) < tokens:
            return False
        for p in victims:
            if free >= tokens:
                break
            self._evict(p)
            free += p.tokens
        return True

    def _evict(self, p: Prefix) -> None:
        a = p.agent.name
        if self.config.radix_cache and self.manages and not self._settling and not self.config.host_tier:
            # the plugin only unpins: a computed prefix stays cached, an LRU leaf like any other
            computed = p.prefill_left == 0
            self._drop(p, "evict_unpin" if computed else "evict_free")
            if computed:
                self._ghost[a] = True
                self.evictable_tokens += p.tokens
            return
        tokens = p.tokens
        # A prefix whose first prefill has not finished has no complete KV to save: it is
        # dropped (free), and a later load prefills it again.
        if self.config.host_tier and not p.on_host and p.prefill_left == 0:
            self._pending_move_time += self.cost.swap_time(tokens)
            p.on_host = True
            self._drop(p, "evict_swap", tokens * self.cost.kv_bytes_per_token)
        else:
            self._drop(p, "evict_free")
        # its cached children went first (a radix node is evicted only as a leaf)
        if self._tree is not None:
            self._tree.drop_agent(a)
        self.evictable_tokens -= self._cached_by_agent[a]
        self._cached_by_agent[a] = 0
        self._generation[a] += 1
        self._merged[a] = None

    def _drop(self, p: Prefix, event: str, nbytes: float = 0.0) -> None:
        self._record_prefix(event, p, nbytes)
        p.resident = False
        p.prefill_left = 0
        self._computing.discard(p.agent.name)
        self.prefix_tokens -= p.tokens

    def _load(self, p: Prefix) -> None:
        a = p.agent.name
        if self._ghost.get(a):  # unpinned but still cached: pinning it again costs nothing
            self._ghost[a] = False
            self.evictable_tokens -= p.tokens
            self._record_prefix("load_cached", p, 0.0)
        elif p.on_host:
            self._pending_move_time += self.cost.swap_time(p.tokens)
            self._record_prefix("load_swap", p, p.tokens * self.cost.kv_bytes_per_token)
        else:
            p.prefill_left = p.tokens
            self._reset_prefix_counts(p)
            self._record_prefix("load_prefill", p, 0.0)
            if self.config.radix_cache and not self.manages:
                self._merged[a] = _PENDING  # the request that computes it holds it in its own node
        p.resident = True
        p.last_used = self.now
        self.prefix_tokens += p.tokens

    def _record_prefix(self, kind: str, p: Prefix, nbytes: float) -> None:
        self.prefix_events.append((self.now, p.agent.name, kind, p.tokens, nbytes))

    def _settle(self) -> None:
        """The radix cache's allocation: evict leaves (finished requests' KV; prefixes nobody uses
        and whose children are gone) until everything fits the pool, least recently used first
        or in the order of ``EngineConfig.eviction`` (``topas.engine.evict_pass``)."""
        if not self.config.radix_cache:
            return
        self._settling = True
        try:
            deficit = self.prefix_tokens + self.request_tokens + self.evictable_tokens - self.budget
            if deficit > 0 and not self._eviction.heap_fast_path:
                self._settle_by_strategy(deficit)
                return
            while deficit > 0:
                while self._leaves and self._leaves[0][4] != self._generation[self._leaves[0][2]]:
                    heapq.heappop(self._leaves)  # dropped with its prefix
                leaf = self._leaves[0] if self._leaves else None
                node = self._tree.peek_lru() if self._tree is not None else None
                leaf_time = leaf[0] if leaf is not None else (node.last_access if node is not None else None)
                prefix = min((p for p in self.prefixes.values() if self._prefix_evictable(p)),
                             key=lambda p: (p.last_used, p.agent.name), default=None)
                if prefix is not None and (leaf_time is None or prefix.last_used < leaf_time):
                    deficit -= self._evict_cached_prefix(prefix)
                elif leaf is not None:
                    heapq.heappop(self._leaves)
                    deficit -= self._evict_leaf(leaf)
                elif node is not None:
                    deficit -= self._seg_evict(node)
                else:
                    break
        finally:
            self._settling = False

    def _prefix_evictable(self, p: Prefix) -> bool:
        """A cached prefix the radix cache may evict: a leaf (no cached children), unpinned (a
        managing policy's ghost) or, for other policies, unused, computed and not being computed."""
        a = p.agent.name
        if self._cached_by_agent[a]:
            return False
        if self.manages:  # pinned prefixes stay; unpinned ones are leaves
            return bool(self._ghost.get(a))
        return (p.resident and p.refcount == 0 and p.prefill_left == 0 and a not in self._computing
                and a not in self._loading)

    def _evict_cached_prefix(self, p: Prefix) -> int:
        """Evict the cached prefix ``p`` (:meth:`_prefix_evictable`); returns its tokens."""
        if self.manages:
            self._drop_ghost(p)
        else:
            self._evict(p)
        return p.tokens

    def _evict_leaf(self, leaf: tuple) -> int:
        """Evict a finished request's KV leaf (popped from ``_leaves``), and its prefix if the
        prefix was part of the leaf's radix node; returns the tokens freed."""
        _, _, a, kv, _, rid, _ = leaf
        self._cached_by_agent[a] -= kv
        self.evictable_tokens -= kv
        freed = kv
        p = self.prefixes[a]
        if self._merged.get(a) == rid and p.resident and p.refcount == 0 and p.prefill_left == 0:
            freed += p.tokens  # the prefix was part of this node
            self._evict(p)
        return freed

    def _drop_ghost(self, p: Prefix) -> None:
        a = p.agent.name
        self._ghost[a] = False
        self.evictable_tokens -= p.tokens
        self._generation[a] += 1
        self._record_prefix("lru_drop", p, 0.0)  # an unpinned prefix leaves the cache
