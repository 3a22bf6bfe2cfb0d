"""The engine's radix tree of token segments beyond the agent prefixes (docs/design.md, "Engine model").

SGLang's radix cache (``mem_cache/radix_cache.py``) keeps the KV of every prompt it has seen as a
tree of token runs: a request matches its longest cached prefix, nodes that running requests use
are locked (``lock_ref``), and eviction takes unlocked leaves, least recently used first
(``evict_policy.LRUStrategy``: the node's ``last_access_time``). Here the tokens are the segments
of a ``topas.trace/2`` trace (``topas.workload.model.Segment``): a node is one segment, identified
by its id, so two prompts share exactly the nodes of their common leading run of segments and a
node boundary sits wherever two prompts diverge (the segments are already split there). Cost grows
with segments, never with tokens.

The agent prefix ``l_a`` stays the :class:`topas.engine.entities.Prefix` the policies name; its
node is the root of that agent's subtree here (one root per agent, 0 tokens of its own: the
prefix's KV is accounted by the prefix). Partial matches follow from leaf-only eviction: a node is
in the tree only with all its ancestors, so a request whose deeper node was evicted matches the
nodes above it.

Eviction order: LRU through the heap here (:meth:`SegmentCache.peek_lru`); any other
``topas.engine.eviction`` strategy scans :meth:`SegmentCache.evictable_leaves`. Nodes keep what
the strategies read (``hit_count``, ``priority``, ``depth``, ``history``: the engine updates the
first two, ``topas.engine.eviction`` cites the rules).

Ties: SGLang's clock is wall time, so equal ``last_access_time`` hardly occur there and it leaves
them to heap order; the simulated clock ties often (nodes inserted in one iteration), so ties go
to the node created first (SGLang's ``TreeNode.id`` counter order).
"""

from __future__ import annotations

import heapq
import sys
from typing import Iterable, Mapping, Sequence


class SegmentNode:
    """One cached segment: ``tokens`` of KV under ``parent``; ``lock_ref`` running requests use it."""

    __slots__ = ("id", "tokens", "parent", "children", "lock_ref", "last_access", "serial", "agent", "owner",
                 "alive", "hit_count", "priority", "depth", "history")

    def __init__(self, id: str, tokens: int, parent: "SegmentNode | None", agent: str, owner: str,
                 serial: int, now: float) -> None:
        self.id = id
        self.tokens = tokens
        self.parent = parent
        self.children: dict[str, SegmentNode] = {}
        self.lock_ref = 0
        self.last_access = now
        self.serial = serial
        self.agent = agent
        self.owner = owner  # the request whose KV it was (the prefix may share its radix node)
        self.alive = True
        #: insertions through it and the highest priority among them (``topas.engine.eviction``)
        self.hit_count = 0
        self.priority = NO_PRIORITY
        #: tokens from the root through it (agent prefix included) and its branch's deepest ever
        self.depth = (parent.depth if parent is not None else 0) + tokens
        self.history = self.depth


#: a node's priority before any request inserted through it (SGLang's root: ``-sys.maxsize``)
NO_PRIORITY = -sys.maxsize


#: a segment of a prompt beyond its agent prefix: (id, tokens)
Seg = tuple[str, int]


class SegmentCache:
    """The segments cached below each agent prefix, their locks and their LRU order.

    Token counts are returned to the caller (the simulator's memory accounting), which keeps the
    pool's totals: :attr:`locked_tokens` (nodes some running request uses) and the evictable rest.
    """

    def __init__(self, agents: Iterable[str], heap: bool = True, history: bool = False,
                 prefix_tokens: Mapping[str, int] | None = None) -> None:
        """``heap``: keep the LRU heap (else the candidates :meth:`evictable_leaves` scans);
        ``history``: raise the ancestors' ``history`` at each new node (``tlru``); a root's
        ``depth`` is its agent's ``prefix_tokens`` (0 if not given)."""
        self._serial = 0
        self._heap = heap
        self._history = history
        self.roots: dict[str, SegmentNode] = {a: self._node(a, 0, None, a, "", 0.0) for a in agents}
        for a, n in self.roots.items():
            n.depth = n.history = (prefix_tokens or {}).get(a, 0)
        self._lru: list[tuple[float, int, SegmentNode]] = []  # evictable leaves, lazily invalidated
        self._cands: dict[int, SegmentNode] = {}  # (no heap) evictable leaves by serial, lazily invalidated
        self.locked_tokens = 0
        #: per agent, bumped whenever a node below its prefix comes or goes: what :meth:`match`
        #: finds there is unchanged while its count is
        self.versions: dict[str, int] = {a: 0 for a in self.roots}

    def _node(self, id: str, tokens: int, parent: SegmentNode | None, agent: str, owner: str,
              now: float) -> SegmentNode:
        self._serial += 1
        n = SegmentNode(id, tokens, parent, agent, owner, self._serial, now)
        if self._history:  # _set_tlru_lens_and_raise_history
            a = parent
            while a is not None and a.history < n.depth:
                a.history = n.depth
                a = a.parent
        return n

    # ---------------------------------------------------------------- matching and locks
    def match(self, agent: str, segs: Sequence[Seg]) -> list[SegmentNode]:
        """The nodes of the longest cached run of ``segs`` below ``agent``'s prefix (``match_prefix``)."""
        node, out = self.roots[agent], []
        for sid, _ in segs:
            node = node.children.get(sid)
            if node is None:
                break
            out.append(node)
        return out

    def lock(self, nodes: Sequence[SegmentNode], now: float) -> int:
        """Lock ``nodes`` for one more request (``inc_lock_ref``), touching them at ``now``;
        returns the tokens that were evictable and are locked now."""
        newly = 0
        for n in nodes:
            n.last_access = now
            if n.lock_ref == 0:
                newly += n.tokens
            n.lock_ref += 1
        self.locked_tokens += newly
        return newly

    def unlock(self, nodes: Sequence[SegmentNode], now: float) -> int:
        """Release one request's lock on ``nodes`` (``dec_lock_ref``) at ``now``; returns the
        tokens that became evictable."""
        freed = 0
        for n in nodes:
            n.lock_ref -= 1
            n.last_access = now
            if n.lock_ref == 0:
                freed += n.tokens
                self._offer(n)
        self.locked_tokens -= freed
        return freed

    # ---------------------------------------------------------------- insertion
    def insert(self, agent: str, below: SegmentNode | None, segs: Sequence[Seg], owner: str,
               now: float) -> tuple[list[SegmentNode], int, int]:
        """Insert ``segs`` under ``below`` (None: the agent's root), locked by the inserting
        request (``cache_unfinished_req``). Returns the nodes, the tokens of nodes another
        request had inserted meanwhile (the caller frees its own copy of them) and, of those,
        the tokens that were evictable and are locked now."""
        node = below if below is not None else self.roots[agent]
        out: list[SegmentNode] = []
        dup = dup_unlocked = 0
        for sid, tokens in segs:
            child = node.children.get(sid)
            if child is None:
                child = self._node(sid, tokens, node, agent, owner, now)
                node.children[sid] = child
                self.versions[agent] += 1
                child.lock_ref = 1
                self.locked_tokens += tokens
            else:
                dup += child.tokens
                dup_unlocked += self.lock([child], now)
            out.append(child)
            node = child
        return out, dup, dup_unlocked

    def add_leaf(self, agent: str, below: SegmentNode | None, id: str, tokens: int, owner: str,
                 now: float, priority: int = 0) -> SegmentNode:
        """An unlocked, evictable leaf (a finished request's output: ``cache_finished_req``), one
        hit, of its request's ``priority`` (a new node: ``_add_new_node``)."""
        parent = below if below is not None else self.roots[agent]
        leaf = self._node(id, tokens, parent, agent, owner, now)
        leaf.hit_count = 1
        leaf.priority = priority
        parent.children[id] = leaf
        self.versions[agent] += 1
        self._offer(leaf)
        return leaf

    # ---------------------------------------------------------------- eviction
    def _offer(self, n: SegmentNode) -> None:
        if n.alive and n.lock_ref == 0 and not n.children and n.parent is not None:
            if self._heap:
                heapq.heappush(self._lru, (n.last_access, n.serial, n))
            else:
                self._cands[n.serial] = n

    @staticmethod
    def evictable(n: SegmentNode) -> bool:
        return n.alive and n.lock_ref == 0 and not n.children and n.parent is not None

    def evictable_leaves(self) -> list[SegmentNode]:
        """Every evictable leaf now (a tree built with ``heap=False``), in creation order."""
        cands = self._cands
        for k in [k for k, n in cands.items() if not self.evictable(n)]:
            del cands[k]
        return [cands[k] for k in sorted(cands)]

    def peek_lru(self) -> SegmentNode | None:
        """The least recently used evictable leaf (ties: created first), or None."""
        h = self._lru
        while h:
            t, _, n = h[0]
            if n.alive and n.lock_ref == 0 and not n.children and n.last_access == t:
                return n
            heapq.heappop(h)
        return None

    def evict(self, n: SegmentNode) -> None:
        """Remove the evictable leaf ``n``; its parent may become an evictable leaf."""
        assert n.lock_ref == 0 and not n.children and n.parent is not None
        n.alive = False
        parent = n.parent
        del parent.children[n.id]
        self.versions[n.agent] += 1
        if parent.parent is not None:
            self._offer(parent)

    def has_children(self, agent: str) -> bool:
        return bool(self.roots[agent].children)

    def drop_agent(self, agent: str) -> int:
        """Drop every node below ``agent``'s prefix (the prefix itself left the GPU: SGLang has
        evicted its descendants first); returns their tokens. None may be locked."""
        dropped, stack = 0, list(self.roots[agent].children.values())
        while stack:
            n = stack.pop()
            if n.lock_ref:
                raise AssertionError(f"segment {n.id} of agent {agent!r} is locked while its prefix is dropped")
            n.alive = False
            dropped += n.tokens
            stack.extend(n.children.values())
        root = self.roots[agent]
        root.children = {}
        root.history = root.depth
        self.versions[agent] += 1
        return dropped


def prompt_tail(segments: Sequence, prefix_tokens: int) -> tuple[Seg, ...]:
    """The segments of a prompt beyond its agent prefix (the trace puts a segment boundary at
    ``l_a``), as (id, tokens)."""
    pos, out = 0, []
    for s in segments:
        if pos >= prefix_tokens:
            out.append((s.id, s.tokens))
        pos += s.tokens
    return tuple(out)
