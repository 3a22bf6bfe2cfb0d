"""What a perfect prefix cache reuses in a trace: the share of prompt tokens that a radix cache of
unbounded size, holding every earlier request's prompt, would serve instead of prefilling.

Request ``r``'s reuse is the longest token prefix it shares with any *earlier* request, earlier
in trace order (tasks in arrival order, a task's stages in the trace's topological order): in a
``topas.trace/2`` trace, the tokens of the longest leading run of ``r``'s segments that an earlier
request's segments begin with (data/traces/README.md, "Segments"); in a ``topas.trace/1`` trace the
agent-prefix model's, where a prompt is the agent prefix ``l_a`` (shared by all the agent's calls)
and then ``x_v`` tokens of its own, so ``r`` reuses ``l_a`` unless it is its agent's first call.

The reuse is split by where it comes from: **cross-task**, the prefix ``r`` shares with earlier
requests of *other* tasks; **within-task**, what its own task's earlier requests add beyond that
(a task's documents, code and history repeated by its later calls). Computed from the trace alone,
in one pass over the segments (no token lists).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from topas.workload.model import SEGMENT_KINDS, Trace


@dataclass(frozen=True)
class Reuse:
    """Prompt tokens of a trace and the tokens a perfect radix cache reuses of them."""

    requests: int
    prompt_tokens: int
    cross_task: int
    within_task: int

    @property
    def reused(self) -> int:
        return self.cross_task + self.within_task

    def share(self, tokens: int) -> float:
        """``tokens`` as a share of the prompt tokens (0 for an empty trace)."""
        return tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def request_segments(trace: Trace) -> Iterator[tuple[str, list[tuple[str, int]]]]:
    """``(task id, [(segment id, tokens), ...])`` of every request in trace order; a stage without
    segments (``topas.trace/1``) is its agent prefix ``prefix:<agent>`` then its own input."""
    for t in trace.tasks:
        for s in t.stages:
            if s.segments is not None:
                yield t.id, [(g.id, g.tokens) for g in s.segments]
            else:
                yield t.id, [(f"prefix:{s.agent}", trace.agents[s.agent].prefix_tokens),
                             (f"input:{t.id}/{s.id}", s.input_tokens)]


class _Node:
    __slots__ = ("kids", "task", "tasks_many")

    def __init__(self, task: str) -> None:
        self.kids: dict[str, _Node] = {}
        self.task = task  # the first task whose request passed here
        self.tasks_many = False  # whether requests of more than one task did


def request_reuse(trace: Trace) -> Iterator[tuple[str, int, int, int]]:
    """Per request in trace order: ``(task id, prompt tokens, cross-task, within-task reuse)``."""
    root = _Node("")
    for tid, segs in request_segments(trace):
        prompt = cross = within = 0
        node: _Node | None = root
        crossing = True
        for gid, n in segs:
            prompt += n
            kid = node.kids.get(gid) if node is not None else None
            if kid is not None:
                if crossing and (kid.tasks_many or kid.task != tid):
                    cross += n
                else:
                    crossing = False
                    within += n
            node = kid
        node = root  # then the request's prompt is in the cache
        for gid, _n in segs:
            kid = node.kids.get(gid)
            if kid is None:
                kid = node.kids[gid] = _Node(tid)
            elif kid.task != tid:
                kid.tasks_many = True
            node = kid
        yield tid, prompt, cross, within


def perfect_cache_reuse(trace: Trace) -> Reuse:
    """The :class:`Reuse` of ``trace`` (module docstring)."""
    requests = prompt = cross = within = 0
    for _tid, p, c, w in request_reuse(trace):
        requests += 1
        prompt, cross, within = prompt + p, cross + c, within + w
    return Reuse(requests=requests, prompt_tokens=prompt, cross_task=cross, within_task=within)


def segment_counts(trace: Trace) -> dict[str, tuple[int, int]]:
    """Per segment kind: (distinct segments, tokens they hold), for a ``topas.trace/2`` trace."""
    seen: dict[str, tuple[str, int]] = {}
    for t in trace.tasks:
        for s in t.stages:
            for g in s.segments or ():
                seen.setdefault(g.id, (g.kind, g.tokens))
    out = {k: (0, 0) for k in SEGMENT_KINDS}
    for kind, n in seen.values():
        c, tok = out[kind]
        out[kind] = (c + 1, tok + n)
    return out


def reuse_lines(trace: Trace) -> list[str]:
    """The prefix-sharing part of ``topas trace describe``: the segments (if any) and the perfect
    radix cache's reuse, split cross-task / within-task."""
    lines = []
    if trace.has_segments:
        counts = segment_counts(trace)
        total = sum(c for c, _n in counts.values())
        lines.append(f"segments   {total:,} distinct (topas.trace/2): "
                     + ", ".join(f"{k} {c:,} ({n:,} tokens)" for k, (c, n) in counts.items()))
        model = "over the segments (topas.trace/2)"
    else:
        model = "agent-prefix model (topas.trace/1): each prompt = agent prefix + its own input"
    r = perfect_cache_reuse(trace)
    lines.append(f"reuse      a perfect radix cache reuses {100 * r.share(r.reused):.1f}% of "
                 f"{r.prompt_tokens:,} prompt tokens (cross-task {100 * r.share(r.cross_task):.1f}%, "
                 f"within-task {100 * r.share(r.within_task):.1f}%)")
    lines.append(f"           {model}; a request reuses its longest prefix shared with an earlier one")
    return lines
