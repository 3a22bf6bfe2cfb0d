"""The order of a task's stages: :func:`topological_order` (declaration order breaks ties) and
:func:`find_cycle` (the stages on a cycle, for the error message), over ``[(stage_id, parents)]``."""

from __future__ import annotations

import heapq
from typing import Sequence


def topological_order(stages: Sequence[tuple[str, Sequence[str]]]) -> list[str] | None:
    """Stage ids in topological order, ties broken by declaration order; ``None`` if cyclic.

    ``stages`` is ``[(stage_id, parents), ...]`` with unique ids and existing parents.
    """
    index = {sid: k for k, (sid, _p) in enumerate(stages)}
    indeg = {sid: len(set(p)) for sid, p in stages}
    kids: dict[str, list[str]] = {sid: [] for sid, _p in stages}
    for sid, parents in stages:
        for q in sorted(set(parents), key=index.__getitem__):
            kids[q].append(sid)

    ready = [index[sid] for sid, _p in stages if indeg[sid] == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        sid = stages[heapq.heappop(ready)][0]
        order.append(sid)
        for c in kids[sid]:
            indeg[c] -= 1
            if indeg[c] == 0:
                heapq.heappush(ready, index[c])
    return order if len(order) == len(stages) else None


def find_cycle(stages: Sequence[tuple[str, Sequence[str]]]) -> list[str]:
    """The stages on one cycle (edge order parent -> child, starting at the earliest-declared
    stage on it), or ``[]`` if the stages form a DAG. Deterministic: follows declaration order."""
    if topological_order(stages) is not None:
        return []
    index = {sid: k for k, (sid, _p) in enumerate(stages)}
    kids: dict[str, list[str]] = {sid: [] for sid, _p in stages}
    for sid, parents in stages:
        for q in parents:
            if sid not in kids[q]:
                kids[q].append(sid)
    for sid in kids:
        kids[sid].sort(key=index.__getitem__)
    state: dict[str, int] = {}  # 1 = on the DFS stack, 2 = done
    for root, _p in stages:
        if state.get(root):
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path: list[str] = [root]
        state[root] = 1
        while stack:
            node, k = stack[-1]
            if k < len(kids[node]):
                stack[-1] = (node, k + 1)
                c = kids[node][k]
                if state.get(c) == 1:
                    cyc = path[path.index(c):]
                    start = min(range(len(cyc)), key=lambda i: index[cyc[i]])
                    return cyc[start:] + cyc[:start]
                if not state.get(c):
                    state[c] = 1
                    stack.append((c, 0))
                    path.append(c)
            else:
                state[node] = 2
                stack.pop()
                path.pop()
    raise AssertionError("a cyclic graph without a cycle")  # pragma: no cover
