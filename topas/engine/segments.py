"""The segment radix tree below the agent prefixes, on one engine's pool (docs/design.md, "Engine
parts"; the tree itself is ``topas.engine.radix_cache``).

:class:`SegmentMemory` owns the tree (:attr:`SegmentMemory.tree`) and each request's prompt cut
into segments beyond its agent prefix: what a request matches at admission, its prompt inserted
after its prefill, its locks released, its output left as a leaf, a leaf evicted. It keeps the
pool's totals in step through :class:`topas.engine.memory.KVMemory`'s methods: a node locked by
running requests counts in ``request_tokens`` once (however many lock it), an unlocked node in
``evictable_tokens`` and its agent's cached tokens.

The tree exists only for a ``topas.trace/2`` trace under the radix cache (the engine has no
:class:`SegmentMemory` otherwise): without segments none of this runs and the engine is the
agent-prefix engine it always was.
"""

from __future__ import annotations

from typing import Mapping

from topas.engine.clock import Clock
from topas.engine.entities import Request
from topas.engine.memory import KVMemory
from topas.engine.radix_cache import Seg, SegmentCache, SegmentNode, prompt_tail


class SegmentMemory:
    """Matching, locking, inserting and evicting a request's segments beyond its agent prefix."""

    def __init__(self, memory: KVMemory, clock: Clock, heap: bool, history: bool) -> None:
        """``heap``: keep the tree's LRU heap (the ``lru`` strategy); ``history``: keep each
        branch's deepest length (``needs_history`` strategies)."""
        self.memory = memory
        self.clock = clock
        prefixes = memory.prefixes
        self.tree = SegmentCache(prefixes, heap=heap, history=history,
                                 prefix_tokens={a: p.tokens for a, p in prefixes.items()})
        self._tails: dict[str, tuple[Seg, ...]] = {}  # rid -> its prompt's segments beyond its prefix
        #: rid -> (its agent's tree version, :meth:`matches`'s tokens then): kept until the tree
        #: below its prefix changes
        self._matched: dict[str, tuple[int, int]] = {}

    def _tail(self, r: Request) -> tuple[Seg, ...]:
        tail = self._tails.get(r.rid)
        if tail is None:
            tail = self._tails[r.rid] = prompt_tail(r.stage.segments or (), self.memory.prefixes[r.agent].tokens)
        return tail

    def match(self, r: Request) -> tuple[list[SegmentNode], int, int]:
        """The nodes ``r`` matches below its (matched) agent prefix, the tokens it need not
        prefill, and the tokens locking them takes out of the evictable KV. SGLang matches at
        most all but one token of the prompt (``max_prefix_len = len(input_ids) - 1``): a
        readmitted request whose whole prompt is cached still computes its last token."""
        nodes = self.tree.match(r.agent, self._tail(r))
        m = sum(n.tokens for n in nodes)
        if r.generated == 0 and m >= r.x:
            m = r.x - 1
        return nodes, m, sum(n.tokens for n in nodes if n.lock_ref == 0)

    def lock(self, r: Request, nodes: list[SegmentNode], matched: int) -> None:
        """``r`` is admitted on the nodes it matched (:meth:`match`): it locks them."""
        newly = self.tree.lock(nodes, self.clock.now)
        self.memory.lock_cached(r.agent, newly)
        r.seg_nodes = tuple(nodes)
        r.seg_ctx = sum(n.tokens for n in nodes)
        r.seg_matched = matched
        r.cached_tokens += matched

    def insert(self, r: Request) -> None:
        """``cache_unfinished_req``: r's prompt enters the tree (locked by r); the prompt KV it
        computed moves from its own KV to the tree, and its copy of a segment that another
        request inserted meanwhile is freed."""
        below = r.seg_nodes[-1] if r.seg_nodes else None
        new, dup, dup_unlocked = self.tree.insert(r.agent, below, self._tail(r)[len(r.seg_nodes):], r.rid,
                                                  self.clock.now)
        computed = r.x - r.seg_matched
        r.kv -= computed
        # its copy of the matched part it recomputed (all but one token matched) and of duplicates
        self.memory.free((r.seg_ctx - r.seg_matched) + dup)
        self.memory.lock_cached(r.agent, dup_unlocked)
        r.seg_nodes += tuple(new)
        r.seg_ctx = r.x
        r.seg_matched = r.x

    def release(self, r: Request) -> None:
        """r leaves the running batch: its locks go (the nodes stay cached, evictable once no
        other request locks them)."""
        freed = self.tree.unlock(r.seg_nodes, self.clock.now)
        self.memory.unlock_cached(r.agent, freed)
        r.seg_nodes = ()
        r.seg_ctx = r.seg_matched = 0

    def leave_output(self, r: Request, below: SegmentNode | None, kv: int) -> None:
        """``cache_finished_req``: a finished request's remaining own KV (its output) stays
        cached as an evictable leaf below its prompt."""
        self.tree.add_leaf(r.agent, below, f"\0out/{r.rid}", kv, r.rid, self.clock.now, r.priority)
        self.memory.cache(r.agent, kv)

    def evict(self, n: SegmentNode) -> int:
        """Evict the leaf ``n`` (and its agent prefix if the prefix shared the radix node of the
        request whose KV ``n`` was, and nothing else hangs below it); returns the tokens freed."""
        memory = self.memory
        self.tree.evict(n)
        a = n.agent
        memory.uncache(a, n.tokens)
        freed = n.tokens
        p = memory.prefixes[a]
        if (not self.tree.has_children(a) and memory.prefix_node_owner(a) == n.owner and p.resident
                and p.refcount == 0 and p.prefill_left == 0):
            freed += p.tokens
            memory.evict(p, by_cache=True)
        return freed

    def drop_agent(self, agent: str) -> None:
        """``agent``'s prefix was evicted: everything cached below it goes with it."""
        self.tree.drop_agent(agent)

    def history(self, agent: str) -> int:
        """The deepest ``agent``'s branch ever reached (``tlru``'s history)."""
        return self.tree.roots[agent].history

    def matches(self, waiting: Mapping[str, Request]) -> dict[str, int]:
        """Per waiting request, the tokens beyond its agent prefix that the tree holds for it now
        (what ``match_prefix`` returns, less the prefix): a policy's view of the tree."""
        tree, versions, kept = self.tree, self.tree.versions, self._matched
        out: dict[str, int] = {}
        for rid, r in waiting.items():
            v = versions[r.agent]
            k = kept.get(rid)
            if k is None or k[0] != v:
                k = kept[rid] = (v, sum(n.tokens for n in tree.match(r.agent, self._tail(r))))
            out[rid] = k[1]
        return out
