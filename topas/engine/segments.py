"""The simulator's side of the segment radix tree (``topas.engine.radix_cache``): what a request
matches at admission, its prompt inserted after its prefill, its locks released, its output left
as a leaf, and a leaf evicted, each kept in step with the pool's token totals.

:class:`SegmentMemory` is a part of :class:`topas.engine.simulator.Simulator` (a mixin over its
state: ``_tree``, ``request_tokens``, ``evictable_tokens``, ``_cached_by_agent``), kept apart so
each file has one job; it is not used on its own. The tree exists only for a ``topas.trace/2``
trace under the radix cache: without segments none of this runs and the engine is the agent-prefix
engine it always was.

Accounting: a node locked by a running request counts in ``request_tokens`` once (whoever many
lock it), an unlocked node in ``evictable_tokens`` and its agent's ``_cached_by_agent``.
"""

from __future__ import annotations

from topas.engine.entities import Request
from topas.engine.radix_cache import Seg, SegmentNode, prompt_tail


class SegmentMemory:
    """Matching, locking, inserting and evicting a request's segments beyond its agent prefix."""

    def _seg_tail(self, r: Request) -> tuple[Seg, ...]:
        tail = self._tails.get(r.rid)
        if tail is None:
            tail = self._tails[r.rid] = prompt_tail(r.stage.segments or (), self.prefixes[r.agent].tokens)
        return tail

    def _seg_match(self, r: Request) -> tuple[list[SegmentNode], int, int]:
        """The nodes ``r`` matches below its (matched) agent prefix, the tokens it need not
        prefill, and the tokens locking them takes out of the evictable KV. SGLang matches at
        most all but one token of the prompt (``max_prefix_len = len(input_ids) - 1``): a
        readmitted request whose whole prompt is cached still computes its last token."""
        nodes = self._tree.match(r.agent, self._seg_tail(r))
        m = sum(n.tokens for n in nodes)
        if r.generated == 0 and m >= r.x:
            m = r.x - 1
        return nodes, m, sum(n.tokens for n in nodes if n.lock_ref == 0)

    def _seg_lock(self, r: Request, nodes: list[SegmentNode], matched: int) -> None:
        newly = self._tree.lock(nodes, self.now)
        self._to_locked(r.agent, newly)
        r.seg_nodes = tuple(nodes)
        r.seg_ctx = sum(n.tokens for n in nodes)
        r.seg_matched = matched
        r.cached_tokens += matched

    def _to_locked(self, agent: str, tokens: int) -> None:
        self.evictable_tokens -= tokens
        self._cached_by_agent[agent] -= tokens
        self.request_tokens += tokens

    def _seg_insert(self, r: Request) -> None:
        """``cache_unfinished_req``: r's prompt enters the tree (locked by r); the prompt KV it
        computed moves from its own KV to the tree, and its copy of a segment that another
        request inserted meanwhile is freed."""
        r.seg_pending = False
        below = r.seg_nodes[-1] if r.seg_nodes else None
        new, dup, dup_unlocked = self._tree.insert(r.agent, below, self._seg_tail(r)[len(r.seg_nodes):], r.rid,
                                                   self.now)
        computed = r.x - r.seg_matched
        r.kv -= computed
        # its copy of the matched part it recomputed (all but one token matched) and of duplicates
        self.request_tokens -= (r.seg_ctx - r.seg_matched) + dup
        self._to_locked(r.agent, dup_unlocked)
        r.seg_nodes += tuple(new)
        r.seg_ctx = r.x
        r.seg_matched = r.x
        self._count_insert(r)

    def _seg_release(self, r: Request) -> None:
        """r leaves the running batch: its locks go (the nodes stay cached, evictable once no
        other request locks them); a prompt not yet inserted is freed with r's own KV."""
        if r.seg_pending:
            r.seg_pending = False
            self._insert_after_next.remove(r)
        freed = self._tree.unlock(r.seg_nodes, self.now)
        self.request_tokens -= freed
        self.evictable_tokens += freed
        self._cached_by_agent[r.agent] += freed
        r.seg_nodes = ()
        r.seg_ctx = r.seg_matched = 0

    def _seg_leave_output(self, r: Request, below: SegmentNode | None, kv: int) -> None:
        """``cache_finished_req``: a finished request's remaining own KV (its output) stays
        cached as an evictable leaf below its prompt."""
        self._tree.add_leaf(r.agent, below, f"\0out/{r.rid}", kv, r.rid, self.now, r.priority)
        self._cached_by_agent[r.agent] += kv
        self.evictable_tokens += kv

    def _seg_evict(self, n: SegmentNode) -> int:
        """Evict the leaf ``n`` (and its agent prefix if the prefix shared the radix node of the
        request whose KV ``n`` was, and nothing else hangs below it); returns the tokens freed."""
        self._tree.evict(n)
        a = n.agent
        self._cached_by_agent[a] -= n.tokens
        self.evictable_tokens -= n.tokens
        freed = n.tokens
        p = self.prefixes[a]
        if (not self._tree.has_children(a) and self._merged.get(a) == n.owner and p.resident
                and p.refcount == 0 and p.prefill_left == 0):
            freed += p.tokens
            self._evict(p)
        return freed

    def _seg_matches(self) -> dict[str, int]:
        """Per waiting request, the tokens beyond its agent prefix that the tree holds for it now
        (what ``match_prefix`` returns, less the prefix): a policy's view of the tree."""
        if self._tree is None:
            return {}
        tree = self._tree
        return {rid: sum(n.tokens for n in tree.match(r.agent, self._seg_tail(r)))
                for rid, r in self.waiting.items()}
