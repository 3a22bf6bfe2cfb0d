"""The ``topas.trace/2`` segments of MetaGPT calls: the nodes of the radix tree of every call's
sharing text (:mod:`topas.workload.radix`), with a boundary at the agent prefix ``l_a``
(:mod:`topas.workload.metagpt`, "the segments")."""

from __future__ import annotations

from typing import Sequence

from topas.workload.model import Segment
from topas.workload.radix import RadixTree, node_id


def prompt_segments(
    tasks: Sequence[Sequence[tuple[str, str, Sequence[int], int, int]]],
) -> list[list[tuple[Segment, ...]]]:
    """The segments of every call: ``tasks[k][j] = (task id, stage id, sharing tokens, l_a,
    surplus)`` in trace order -> ``out[k][j]``, the nodes of the calls' radix tree with a boundary
    at ``l_a``, then a ``unique`` segment of ``surplus`` tokens when ``surplus > 0`` (the counted
    text's extra tokens). Kinds: ``prefix`` if the node ends within ``l_a`` of every call holding
    it, else ``shared`` (calls of several tasks), ``context`` (several calls of one task) or
    ``unique``; a segment's id is its chained hash (:func:`topas.workload.radix.node_id`)."""
    flat = [c for calls in tasks for c in calls]
    tree = RadixTree([c[2] for c in flat])
    for k, c in enumerate(flat):
        if 0 < c[3] < len(c[2]):
            tree.cut(k, c[3])
    paths = [tree.path(k) for k in range(len(flat))]
    holders: dict[int, list[int]] = {}
    for k, path in enumerate(paths):
        for node in path:
            holders.setdefault(id(node), []).append(k)
    made: dict[int, Segment] = {}
    out: list[list[tuple[Segment, ...]]] = []
    k = 0
    for calls in tasks:
        row = []
        for tid, sid, _toks, prefix, surplus in calls:
            segs: list[Segment] = []
            parent, depth = "", 0
            for node in paths[k]:
                depth += node.length
                g = made.get(id(node))
                if g is None:
                    hs = holders[id(node)]
                    g_id = node_id(parent, tree.node_tokens(node))
                    if all(depth <= flat[h][3] for h in hs):
                        g = Segment(g_id, node.length, "prefix")
                    elif len({flat[h][0] for h in hs}) > 1:
                        g = Segment(g_id, node.length, "shared")
                    else:  # hs in trace order: the first holder is the task's first (topological order)
                        g = Segment(g_id, node.length, "context" if len(hs) > 1 else "unique", task=tid,
                                    origin=flat[hs[0]][1])
                    made[id(node)] = g
                segs.append(g)
                parent = g.id
            if surplus > 0:
                # the id: as a node holding one pseudo-token that names the request
                segs.append(Segment(node_id(parent, [f"masked:{tid}/{sid}"]), surplus, "unique", task=tid,
                                    origin=sid))
            elif surplus < 0:
                raise ValueError(f"task {tid} call {sid}: the counted text has {-surplus} tokens fewer than "
                                 "the sharing text")
            row.append(tuple(segs))
            k += 1
        out.append(row)
    return out
