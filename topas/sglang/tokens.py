"""Token ids for replaying a trace without a tokenizer (SGLang ``input_ids``).

Requests of the same agent share *exactly* the agent's prefix: ``l_a`` ids drawn from a
generator seeded by the agent's name (stable across processes, machines and runs: the plugin
recomputes them to pin a prefix in the radix tree). The suffix of every request is unique: its
first ids encode a run salt and the request's index in the run, so no two requests share a
token past the agent prefix (and a request never shares its suffix with an earlier run's), and
the rest are drawn from a generator seeded by (run, task, stage).

A ``topas.trace/2`` stage (one with ``segments``, data/traces/README.md "Segments") is spelled
segment by segment (:func:`stage_ids`), so the server's radix tree sees the trace's token-prefix
tree: the agent prefix (the segments up to ``l_a``) is :func:`prefix_ids` as above (what the plugin
pins); every later ``shared`` or ``context`` segment is ids drawn from a generator seeded by
(run, segment id), so equal segments (equal ids: same tokens, same predecessors) are equal ids at
the same positions; the trailing ``unique`` segments are the call's unique suffix, exactly
:func:`suffix_ids` of their total length. Segments inside the agent prefix that several agents
hold are *not* shared: each agent's prefix is its own ids, as the plugin recomputes them from the
name alone. Sibling segments begin with pseudo-random ids, so two of them begin with the same id
(and share one token more than the tree says) with probability about 1/30,000 per pair.

Ids lie in ``[ID_LOW, ID_HIGH)``, inside any vocabulary of at least 32,000 tokens and above the
usual special-token range.
"""

from __future__ import annotations

import hashlib

from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from topas.workload.model import Segment, Stage, Trace

ID_LOW = 1000
ID_HIGH = 31000
_SPAN = ID_HIGH - ID_LOW


def _seed(*parts: str) -> int:
    h = hashlib.sha256("\x1f".join(parts).encode("utf-8")).digest()
    return int.from_bytes(h[:8], "little")


def prefix_ids(agent: str, n: int) -> list[int]:
    """The agent's prefix: ``n`` ids, a deterministic function of the agent's name."""
    if n <= 0:
        return []
    rng = np.random.default_rng(_seed("topas-prefix", agent))
    return (rng.integers(0, _SPAN, size=n) + ID_LOW).tolist()


def suffix_ids(run: str, index: int, task: str, stage: str, n: int) -> list[int]:
    """``n`` suffix ids, unique to (run, request index): see the module docstring.

    The first id is ``(salt + index) mod span``: distinct for every request of a run of fewer than
    30,000 requests, so no two requests share a token past the agent prefix, and shifted by the
    run's salt so that a later run on an unflushed server rarely hits an earlier run's suffix.
    Then ``index // span`` and the salt; the rest is pseudo-random."""
    if n <= 0:
        return []
    salt = _seed("topas-run", run) % _SPAN
    head = [ID_LOW + (salt + index) % _SPAN, ID_LOW + (index // _SPAN) % _SPAN, ID_LOW + salt]
    rng = np.random.default_rng(_seed("topas-suffix", run, task, stage))
    rest = (rng.integers(0, _SPAN, size=max(n - 3, 0)) + ID_LOW).tolist()
    return (head + rest)[:n]


def request_ids(agent: str, prefix_tokens: int, run: str, index: int, task: str, stage: str,
                input_tokens: int) -> list[int]:
    """A request's full ``input_ids``: the agent prefix then its unique suffix (``x_v`` tokens)."""
    return prefix_ids(agent, prefix_tokens) + suffix_ids(run, index, task, stage, input_tokens)


def segment_ids(run: str, segment: str, n: int) -> list[int]:
    """A ``shared`` or ``context`` segment's ``n`` ids: a deterministic function of (run, segment
    id), so the requests of a run that hold the segment send the same ids, and a later run (new
    run id) on an unflushed server does not hit them."""
    if n <= 0:
        return []
    rng = np.random.default_rng(_seed("topas-segment", run, segment))
    return (rng.integers(0, _SPAN, size=n) + ID_LOW).tolist()


def segmented_ids(agent: str, prefix_tokens: int, segments: "Sequence[Segment]", run: str, index: int,
                  task: str, stage: str) -> list[int]:
    """A ``topas.trace/2`` request's ``input_ids`` (module docstring): the agent prefix, each later
    ``shared``/``context`` segment's :func:`segment_ids`, then the unique part's :func:`suffix_ids`.
    ``ValueError`` naming the request when the segments do not end at ``prefix_tokens`` on a
    boundary or a ``unique`` segment is followed by another kind (what validation guarantees)."""
    where = f"task {task} stage {stage}"
    pos, k = 0, 0
    while pos < prefix_tokens and k < len(segments):
        pos += segments[k].tokens
        k += 1
    if pos != prefix_tokens:
        raise ValueError(f"{where}: no segment boundary at the agent prefix ({prefix_tokens} tokens)")
    ids = prefix_ids(agent, prefix_tokens)
    unique = 0
    for g in segments[k:]:
        if g.kind == "unique":
            unique += g.tokens
        elif unique:
            raise ValueError(f"{where}: {g.kind} segment {g.id!r} follows the call's unique part")
        else:
            ids += segment_ids(run, g.id, g.tokens)
    return ids + suffix_ids(run, index, task, stage, unique)


def stage_ids(trace: "Trace", task: str, stage: "Stage", run: str, index: int) -> list[int]:
    """The ``input_ids`` the replay sends for ``stage`` of ``task``, request ``index`` of ``run``:
    :func:`segmented_ids` when the stage carries segments, else :func:`request_ids` (a
    ``topas.trace/1`` stage: byte-identical to the ids before segments existed)."""
    l_a = trace.agents[stage.agent].prefix_tokens
    if stage.segments is None:
        return request_ids(stage.agent, l_a, run, index, task, stage.id, stage.input_tokens)
    return segmented_ids(stage.agent, l_a, stage.segments, run, index, task, stage.id)
