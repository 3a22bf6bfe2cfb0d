"""The KV pool of one engine (docs/design.md, "Engine parts" and "Engine model").

:class:`KVMemory` owns the pool and the agent prefixes in it: the budget ``B`` and what occupies
it (resident prefixes, running requests' own KV, cached KV that is evictable), each agent's
:class:`~topas.engine.entities.Prefix`, the radix cache's agent-level state (finished requests'
KV leaves, which prefixes a managing policy unpinned, which request's radix node holds a prefix,
which prefixes a running request is computing), the swap time owed to the next iteration and
the log of prefix events. Other parts change its totals through its methods only: the segment
tree (:class:`topas.engine.segments.SegmentMemory`) moves tokens between locked and cached, the
running batch (:class:`topas.engine.iterations.Batch`) allocates and frees requests' KV, the
eviction pass (:class:`topas.engine.evict_pass.Eviction`) decides what goes and calls the
``evict_*`` methods here.

It reads two other parts: the segment tree below the prefixes (an evicted prefix's subtree goes
with it) and the host link (:class:`topas.engine.prefetch.Prefetch`: a prefix whose copy is in
progress is locked and not matchable), given by :meth:`KVMemory.connect`.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Mapping

from topas.engine.clock import Clock
from topas.engine.config import EngineConfig
from topas.engine.cost import CostModel
from topas.engine.entities import Prefix, Request
from topas.engine.radix_cache import NO_PRIORITY

if TYPE_CHECKING:
    from topas.engine.prefetch import Prefetch
    from topas.engine.segments import SegmentMemory

#: :meth:`KVMemory.prefix_node_owner` value: a prefix loaded whose computing request has not started yet
_PENDING = "\0pending"


class KVMemory:
    """The KV pool: its token totals, the agent prefixes, the radix cache's agent-level state.

    Read-only outside this class: :attr:`budget`, :attr:`prefixes` (the dict; its entities are
    shared), :attr:`prefix_tokens`, :attr:`request_tokens`, :attr:`evictable_tokens`,
    :attr:`computing`, :attr:`move_time`, :attr:`prefix_events`."""

    def __init__(self, prefixes: Mapping[str, Prefix], budget: int, config: EngineConfig, cost: CostModel,
                 clock: Clock, manages: bool) -> None:
        self.config = config
        self.cost = cost
        self.clock = clock
        #: the policy pins and loads/evicts prefixes itself (TOPAS); else the radix cache manages them
        self.manages = manages
        self.budget = budget
        self.prefixes: dict[str, Prefix] = dict(prefixes)
        self.prefix_tokens = 0  # resident prefixes
        self.request_tokens = 0  # running requests' own KV (and segment nodes they lock)
        #: radix cache: cached KV that occupies the pool but is evictable and free to the
        #: policy's view (finished requests' leaves, prefixes a managing policy unpinned)
        self.evictable_tokens = 0
        #: agents whose prefix a running request is computing
        self.computing: set[str] = set()
        #: swap time (host <-> GPU) the next iteration pays
        self.move_time = 0.0
        #: (time, agent, event, tokens, bytes) of every prefix load and eviction
        self.prefix_events: list[tuple] = []
        self._leaves: list[tuple[float, int, str, int, int, str, int]] = []  # (finish, seq, agent, kv, gen, rid, prio)
        self._seq = 0
        self._cached_by_agent: dict[str, int] = {a: 0 for a in self.prefixes}
        self._generation: dict[str, int] = {a: 0 for a in self.prefixes}  # bumped when a prefix goes
        self._ghost: dict[str, bool] = {}  # prefixes a managing policy unpinned, still cached
        self._merged: dict[str, str | None] = {}  # agent -> rid whose radix node holds the prefix
        self.segments: SegmentMemory | None = None
        self.prefetch: Prefetch | None = None

    def connect(self, segments: "SegmentMemory | None", prefetch: "Prefetch") -> None:
        """The parts this one reads: the segment tree (None without one) and the host link."""
        self.segments = segments
        self.prefetch = prefetch

    # ------------------------------------------------------------------ what the pool holds
    def free_tokens(self) -> int:
        """Tokens neither resident prefixes nor running requests hold (cached KV counts as free)."""
        return self.budget - self.prefix_tokens - self.request_tokens

    def overflow(self) -> int:
        """Tokens over the budget, cached KV included (> 0: the radix cache must evict)."""
        return self.prefix_tokens + self.request_tokens + self.evictable_tokens - self.budget

    def locked(self, p: Prefix) -> bool:
        """A resident prefix that cannot be evicted: pinned by a managing policy, used by a running
        request, being computed or loading from host."""
        a = p.agent.name
        return p.resident and (self.manages or bool(p.refcount or p.prefill_left) or a in self.computing
                               or a in self.prefetch.loading)

    def locked_prefix_tokens(self) -> int:
        if self.manages:
            return self.prefix_tokens  # pinned
        return sum(p.tokens for p in self.prefixes.values() if self.locked(p))

    def locked_room(self, locked_prefix_tokens: int | None = None) -> int:
        """The pool less what is locked: free plus evictable KV (``PrefillAdder``'s view);
        ``locked_prefix_tokens``: :meth:`locked_prefix_tokens`, if the caller keeps it."""
        if locked_prefix_tokens is None:
            locked_prefix_tokens = self.locked_prefix_tokens()
        return self.budget - self.request_tokens - locked_prefix_tokens

    def in_tree(self, agent: str) -> bool:
        """``agent``'s prefix is complete in the radix tree: a request admitted now matches it."""
        p = self.prefixes[agent]
        return (p.resident and p.prefill_left == 0 and agent not in self.computing
                and agent not in self.prefetch.loading)

    def cached_unpinned(self, agent: str) -> bool:
        """A managing policy unpinned ``agent``'s prefix and it is still cached (a free reload)."""
        return self._ghost.get(agent, False)

    def cached_tokens(self, agent: str) -> int:
        """Evictable KV cached below ``agent``'s prefix (finished requests' KV, unlocked segments)."""
        return self._cached_by_agent[agent]

    def prefix_node_owner(self, agent: str) -> str | None:
        """The request whose radix node also holds ``agent``'s prefix (the request that computed it,
        until another request matched it and the node split), else None."""
        return self._merged.get(agent)

    def prefix_prefill_pending(self) -> bool:
        """A prefix load is still being prefilled."""
        return any(p.prefill_left > 0 for p in self.prefixes.values())

    def finished_computing(self) -> list[str]:
        """Agents being computed whose prefix's prefill has completed."""
        return [a for a in self.computing if self.prefixes[a].prefill_left == 0]

    def idle_prefixes(self, exclude: Prefix | None = None) -> list[Prefix]:
        """Resident prefixes no running request uses and no host copy is filling (``exclude`` aside)."""
        loading = self.prefetch.loading
        return [p for p in self.prefixes.values() if p.resident and p.refcount == 0 and p is not exclude
                and p.agent.name not in loading]

    def take_move_time(self) -> float:
        """The swap time owed, paid by the iteration that asks (zero after)."""
        t, self.move_time = self.move_time, 0.0
        return t

    # ------------------------------------------------------------------ requests' KV
    def allocate(self, tokens: int) -> None:
        """A running request's own KV grows by ``tokens``."""
        self.request_tokens += tokens

    def free(self, tokens: int) -> None:
        """A running request's own KV shrinks by ``tokens``."""
        self.request_tokens -= tokens

    def lock_cached(self, agent: str, tokens: int) -> None:
        """Cached KV below ``agent``'s prefix is locked by a running request (counted once)."""
        self.evictable_tokens -= tokens
        self._cached_by_agent[agent] -= tokens
        self.request_tokens += tokens

    def unlock_cached(self, agent: str, tokens: int) -> None:
        """KV a running request locked below ``agent``'s prefix is cached again (evictable)."""
        self.request_tokens -= tokens
        self.evictable_tokens += tokens
        self._cached_by_agent[agent] += tokens

    def cache(self, agent: str, tokens: int) -> None:
        """New evictable KV below ``agent``'s prefix (a finished request's output)."""
        self._cached_by_agent[agent] += tokens
        self.evictable_tokens += tokens

    def uncache(self, agent: str, tokens: int) -> None:
        """Evictable KV below ``agent``'s prefix was evicted."""
        self._cached_by_agent[agent] -= tokens
        self.evictable_tokens -= tokens

    def admit(self, r: Request, p: Prefix) -> None:
        """``r`` is admitted on its resident prefix ``p``: it computes the prefix if nobody does
        yet, and it matches (splits) the radix node of the request that computed it."""
        computes = p.prefill_left > 0 and r.agent not in self.computing
        if self.config.radix_cache:
            m = self._merged.get(r.agent)
            if m == _PENDING:
                self._merged[r.agent] = r.rid
            elif m is not None and m != r.rid:
                self._merged[r.agent] = None  # another request matched the prefix: the node splits
        if computes:
            self.computing.add(r.agent)

    def acquire(self, p: Prefix) -> None:
        """A running request uses ``p``."""
        p.refcount += 1
        p.last_used = self.clock.now

    def release(self, p: Prefix) -> None:
        """A running request stops using ``p``."""
        p.refcount -= 1
        p.last_used = self.clock.now

    def done_computing(self, agent: str) -> None:
        """``agent``'s prefix is in the radix tree: requests admitted from now on match it."""
        self.computing.discard(agent)

    def cache_finished(self, r: Request, kv: int) -> None:
        """SGLang's ``cache_finished_req`` without a segment tree: ``r``'s KV stays cached, a leaf
        under its prefix."""
        self.cache_leaf(r.agent, kv, r.rid, r.priority)

    def cache_leaf(self, agent: str, kv: int, rid: str, priority: int = 0) -> None:
        """A finished request ``rid``'s ``kv`` tokens cached now as a leaf under ``agent``'s prefix."""
        self._seq += 1
        heapq.heappush(self._leaves, (self.clock.now, self._seq, agent, kv, self._generation[agent], rid, priority))
        p = self.prefixes[agent]
        p.history = max(p.history, p.tokens + kv)
        self.cache(agent, kv)

    # ------------------------------------------------------------------ prefixes loaded and evicted
    def load(self, p: Prefix) -> None:
        """Make ``p`` resident: free if it is still cached (unpinned), a swap from host, else a
        prefill (by the request that needs it, or the engine for a managing policy)."""
        a = p.agent.name
        if self._ghost.get(a):  # unpinned but still cached: pinning it again costs nothing
            self._ghost[a] = False
            self.evictable_tokens -= p.tokens
            self._record_prefix("load_cached", p, 0.0)
        elif p.on_host:
            self.move_time += self.cost.swap_time(p.tokens)
            self._record_prefix("load_swap", p, p.tokens * self.cost.kv_bytes_per_token)
        else:
            p.prefill_left = p.tokens
            # a prefix computed afresh is a new radix node: no hits yet, the priority of the first
            # request inserting it (a policy's load: 0)
            p.hit_count = 0
            p.priority = 0 if self.manages else NO_PRIORITY
            p.history = p.tokens
            self._record_prefix("load_prefill", p, 0.0)
            if self.config.radix_cache and not self.manages:
                self._merged[a] = _PENDING  # the request that computes it holds it in its own node
        p.resident = True
        p.last_used = self.clock.now
        self.prefix_tokens += p.tokens

    def load_from_host(self, p: Prefix) -> None:
        """``p``'s KV allocated and locked for a background copy from host (KVFlow's prefetch; the
        host link, :class:`topas.engine.prefetch.Prefetch`, times the copy)."""
        self._record_prefix("prefetch_swap", p, p.tokens * self.cost.kv_bytes_per_token)
        p.resident = True
        p.prefill_left = 0
        p.last_used = self.clock.now
        self.prefix_tokens += p.tokens

    def evict(self, p: Prefix, by_cache: bool = False) -> None:
        """Evict the resident prefix ``p``, and its cached children with it (a radix node goes
        only as a leaf). A policy's evict or the engine's room-making (``by_cache`` False) under a
        managing policy on the radix cache without a host tier only unpins: a computed prefix
        stays cached, an LRU leaf like any other. With a host tier a computed prefix is swapped
        out; otherwise (or not yet computed) it is dropped."""
        a = p.agent.name
        if self.config.radix_cache and self.manages and not by_cache and not self.config.host_tier:
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
            self.move_time += self.cost.swap_time(tokens)
            p.on_host = True
            self._drop(p, "evict_swap", tokens * self.cost.kv_bytes_per_token)
        else:
            self._drop(p, "evict_free")
        if self.segments is not None:
            self.segments.drop_agent(a)
        self.evictable_tokens -= self._cached_by_agent[a]
        self._cached_by_agent[a] = 0
        self._generation[a] += 1
        self._merged[a] = None

    def _drop(self, p: Prefix, event: str, nbytes: float = 0.0) -> None:
        self._record_prefix(event, p, nbytes)
        p.resident = False
        p.prefill_left = 0
        self.computing.discard(p.agent.name)
        self.prefix_tokens -= p.tokens

    def _record_prefix(self, kind: str, p: Prefix, nbytes: float) -> None:
        self.prefix_events.append((self.clock.now, p.agent.name, kind, p.tokens, nbytes))

    # ------------------------------------------------------------------ the radix cache's entries
    def prefix_evictable(self, p: Prefix) -> bool:
        """A cached prefix the radix cache may evict: a leaf (no cached children), unpinned (a
        managing policy's ghost) or, for other policies, unused, computed and not being computed."""
        a = p.agent.name
        if self._cached_by_agent[a]:
            return False
        if self.manages:  # pinned prefixes stay; unpinned ones are leaves
            return bool(self._ghost.get(a))
        return (p.resident and p.refcount == 0 and p.prefill_left == 0 and a not in self.computing
                and a not in self.prefetch.loading)

    def lru_evictable_prefix(self) -> Prefix | None:
        """The evictable prefix least recently used (ties: by agent name), if any."""
        return min((p for p in self.prefixes.values() if self.prefix_evictable(p)),
                   key=lambda p: (p.last_used, p.agent.name), default=None)

    def evict_cached_prefix(self, p: Prefix) -> int:
        """The cache evicts the prefix ``p`` (:meth:`prefix_evictable`); returns its tokens."""
        if self.manages:
            a = p.agent.name
            self._ghost[a] = False
            self.evictable_tokens -= p.tokens
            self._generation[a] += 1
            self._record_prefix("lru_drop", p, 0.0)  # an unpinned prefix leaves the cache
        else:
            self.evict(p, by_cache=True)
        return p.tokens

    def oldest_leaf(self) -> tuple | None:
        """The finished request's KV leaf cached longest (leaves dropped with their prefix
        forgotten), if any."""
        leaves, gen = self._leaves, self._generation
        while leaves and leaves[0][4] != gen[leaves[0][2]]:
            heapq.heappop(leaves)  # dropped with its prefix
        return leaves[0] if leaves else None

    def evict_oldest_leaf(self) -> int:
        """Evict :meth:`oldest_leaf`; returns the tokens freed (:meth:`_free_leaf`)."""
        return self._free_leaf(heapq.heappop(self._leaves))

    def live_leaves(self) -> tuple:
        """Every cached leaf not dropped with its prefix (the stale ones forgotten)."""
        live = [leaf for leaf in self._leaves if leaf[4] == self._generation[leaf[2]]]
        if len(live) != len(self._leaves):
            self._leaves = live
            heapq.heapify(self._leaves)
        return tuple(live)

    def leaf_live(self, leaf: tuple) -> bool:
        """``leaf`` was not dropped with its prefix."""
        return leaf[4] == self._generation[leaf[2]]

    def evict_leaf(self, leaf: tuple) -> int:
        """Evict the cached leaf ``leaf`` (:meth:`live_leaves`); returns the tokens freed."""
        self._leaves.remove(leaf)
        heapq.heapify(self._leaves)
        return self._free_leaf(leaf)

    def _free_leaf(self, leaf: tuple) -> int:
        """Free a finished request's KV leaf, and its prefix if the prefix was part of the leaf's
        radix node; returns the tokens freed."""
        _, _, a, kv, _, rid, _ = leaf
        self.uncache(a, kv)
        freed = kv
        p = self.prefixes[a]
        if self._merged.get(a) == rid and p.resident and p.refcount == 0 and p.prefill_left == 0:
            freed += p.tokens  # the prefix was part of this node
            self.evict(p, by_cache=True)
        return freed
