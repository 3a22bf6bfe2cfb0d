"""The token-prefix tree of a set of prompts, as the segments of ``topas.trace/2``.

A radix tree over token sequences (SGLang's radix cache without eviction): every node is a run of
tokens, children of a node start with different tokens, and a node boundary sits wherever two of
the sequences diverge, where a sequence ends, and at every extra *cut* a caller asks for (the
converters cut at the agent prefix ``l_a``). A sequence's **path** is the list of nodes from the
root to its end; two sequences share exactly the tokens of the leading nodes their paths share,
which is what makes the paths usable as the segments of a trace (data/traces/README.md,
"Segments").

Nodes are identified by a chained hash (:func:`node_id`): the hash of the parent's id and the
node's own tokens, so an id names the whole token prefix up to the node's end (as a block hash of a
paged KV cache does) and equal ids mean equal prefixes.

Pure Python, deterministic; cost O(total tokens x log) in slice comparisons.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass, field
from typing import Sequence

Tokens = Sequence[int]


@dataclass(eq=False)
class Node:
    """A run of tokens ``seq[start:end]`` of the sequence ``seq`` (index into the input)."""

    seq: int
    start: int
    end: int
    children: dict[int, "Node"] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return self.end - self.start


def _mismatch(a: Tokens, a0: int, b: Tokens, b0: int, n: int) -> int:
    """The number of leading tokens ``a[a0:a0+n]`` and ``b[b0:b0+n]`` share (both have >= n)."""
    if a[a0:a0 + n] == b[b0:b0 + n]:
        return n
    lo, hi = 0, n  # a[a0:a0+lo] == b[b0:b0+lo], a[a0:a0+hi] != b[b0:b0+hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[a0:a0 + mid] == b[b0:b0 + mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _compact(s: Tokens) -> Sequence:
    """Token ids as a machine-int array (prompts hold millions of tokens); other tokens (a test's
    words) as a list."""
    try:
        return array("q", s)
    except TypeError:
        return list(s)


class RadixTree:
    """The radix tree of ``seqs`` (token sequences); :meth:`cut` adds boundaries."""

    def __init__(self, seqs: Sequence[Tokens]) -> None:
        self.seqs = [_compact(s) for s in seqs]
        self.root = Node(seq=-1, start=0, end=0)
        for k in range(len(self.seqs)):
            self._insert(k)

    def _split(self, node: Node, k: int) -> None:
        """Split ``node`` after its first ``k`` tokens (0 < k < length): the node keeps the head."""
        tail = Node(seq=node.seq, start=node.start + k, end=node.end, children=node.children)
        node.end = node.start + k
        node.children = {self.seqs[tail.seq][tail.start]: tail}

    def _insert(self, k: int) -> None:
        s = self.seqs[k]
        node, pos = self.root, 0
        while pos < len(s):
            child = node.children.get(s[pos])
            if child is None:
                node.children[s[pos]] = Node(seq=k, start=pos, end=len(s))
                return
            n = min(child.length, len(s) - pos)
            m = _mismatch(s, pos, self.seqs[child.seq], child.start, n)
            if m < child.length:
                self._split(child, m)
            node, pos = child, pos + m
        # the sequence ends at a node boundary (split above if it ended inside a node)

    def cut(self, k: int, at: int) -> None:
        """Put a node boundary ``at`` tokens into sequence ``k`` (0 < at < len; no-op if one is there)."""
        s = self.seqs[k]
        if not 0 < at < len(s):
            raise ValueError(f"cut at {at} is outside sequence {k} of {len(s)} tokens")
        node, pos = self.root, 0
        while pos < at:
            child = node.children[s[pos]]
            if pos + child.length > at:
                self._split(child, at - pos)
                return
            node, pos = child, pos + child.length

    def path(self, k: int) -> list[Node]:
        """The nodes from the root to the end of sequence ``k``."""
        s = self.seqs[k]
        out: list[Node] = []
        node, pos = self.root, 0
        while pos < len(s):
            node = node.children[s[pos]]
            out.append(node)
            pos += node.length
        return out

    def node_tokens(self, node: Node) -> Tokens:
        """The node's token ids."""
        return self.seqs[node.seq][node.start:node.end]


def node_id(parent_id: str, tokens: Tokens) -> str:
    """The chained id of a node: 16 hex digits of sha256(parent id, the node's tokens, written as
    text joined by ``,``, UTF-8)."""
    h = hashlib.sha256(parent_id.encode("ascii") + b"|" + ",".join(map(str, tokens)).encode("utf-8"))
    return h.hexdigest()[:16]


def reuse_of_sequences(seqs: Sequence[Tokens]) -> list[int]:
    """For each sequence in order, the longest token prefix it shares with any earlier one (the
    reference the segment trees are checked against; a plain trie walk, independent of
    :class:`RadixTree`'s splitting)."""
    root: dict = {}
    out = []
    for s in seqs:
        node, m, matching = root, 0, True
        for t in s:
            nxt = node.get(t)
            if nxt is None:
                matching = False
                nxt = node[t] = {}
            elif matching:
                m += 1
            node = nxt
        out.append(m)
    return out
