"""Longest-remaining-path helpers: reverse topological dynamic programming over a task's DAG.

For a task with per-stage time estimates ``z_v`` (seconds), the longest path starting at stage
``v`` is ``LP(v) = z_v + max_{c in children(v)} LP(c)`` (0 for no children), computed in reverse
topological order. The task's longest remaining path over a set of unfinished stages is the
maximum of ``LP`` over those stages, with finished (or excluded) stages contributing 0 time.
This is the deterministic kernel of TOPAS's ``L_i(H, t)`` (docs/method.md) and of SPF.
"""

from __future__ import annotations

from typing import Callable, Collection, Mapping, Sequence


def longest_path_from(
    topo_order: Sequence[str],
    children: Mapping[str, Sequence[str]],
    time_of: Callable[[str], float] | Mapping[str, float],
) -> dict[str, float]:
    """``LP(v)`` for every stage: the longest path (sum of times) from ``v`` to a sink, ``v`` included."""
    get = time_of if callable(time_of) else time_of.__getitem__
    lp: dict[str, float] = {}
    for v in reversed(topo_order):
        tail = max((lp[c] for c in children[v]), default=0.0)
        lp[v] = get(v) + tail
    return lp


def longest_remaining_path(
    topo_order: Sequence[str],
    children: Mapping[str, Sequence[str]],
    time_of: Callable[[str], float] | Mapping[str, float],
    zero: Collection[str] = (),
) -> float:
    """The longest path through the DAG where stages in ``zero`` take no time.

    Pass the finished stages (and, for TOPAS, the committed set ``H``) as ``zero``. Returns 0 for
    an empty DAG.
    """
    get = time_of if callable(time_of) else time_of.__getitem__
    lp = longest_path_from(topo_order, children, lambda v: 0.0 if v in zero else get(v))
    return max(lp.values(), default=0.0)
