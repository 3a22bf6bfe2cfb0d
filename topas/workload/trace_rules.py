"""The trace schemas' vocabulary (versions, fields, segment kinds) and the rules that
:func:`~topas.workload.validate.validate_dict` and :func:`~topas.workload.validate.validate_trace`
share: value checks (token lengths, ids, fields) and the semantic rules on agents, tasks and
segments (listed in :mod:`topas.workload.validate`'s docstring). Each raises
:class:`~topas.workload.trace_error.TraceError` on the first violation, in item order."""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterable, Mapping, Sequence

from topas.workload.dag_order import find_cycle
from topas.workload.trace_error import TraceError

SCHEMA_V1 = "topas.trace/1"
SCHEMA_V2 = "topas.trace/2"
SUPPORTED_SCHEMAS: tuple[str, ...] = (SCHEMA_V1, SCHEMA_V2)

TOP_FIELDS = ("schema", "name", "meta", "agents", "tasks")
AGENT_FIELDS = ("name", "prefix_tokens", "expected_output_tokens")
TASK_FIELDS = ("id", "arrival", "workflow", "stages")
STAGE_FIELDS = ("id", "agent", "input_tokens", "output_tokens", "parents")
#: Optional stage fields: ``max_new_tokens`` (the client's output cap; default: ``output_tokens``).
STAGE_OPTIONAL = ("max_new_tokens",)
#: ``topas.trace/2``: the top level's ``segments`` table and every stage's ``segments`` (ids).
SEGMENT_FIELDS = ("id", "tokens", "kind")
SEGMENT_OPTIONAL = ("task", "origin")
SEGMENT_KINDS = ("prefix", "shared", "context", "unique")
#: The largest token length a trace may give (a prompt, an output, a segment, an agent's expected
#: output): far beyond any model's context, small enough that no run's arithmetic overflows.
MAX_TOKENS = 10**9
#: The latest arrival a task may have, in seconds (about 31.7 years): beyond it a double can no
#: longer tell a decode step (milliseconds) from the next, so the simulated clock would stall.
MAX_ARRIVAL_S = 1e9
#: How deep the free-form ``meta`` object may nest (objects and arrays inside one another).
MAX_META_DEPTH = 64


# ----------------------------------------------------------------------------- value checks


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, str):
        return "string"
    if isinstance(v, numbers.Integral):
        return "integer"
    if isinstance(v, numbers.Real):
        return "number"
    if isinstance(v, Mapping):
        return "object"
    if isinstance(v, (list, tuple)):
        return "array"
    return type(v).__name__


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _finite(v: Any) -> bool:
    """A finite number (an integer too large for a double is not)."""
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def meta_depth_problem(meta: Any) -> str | None:
    """The free-form ``meta`` must nest at most :data:`MAX_META_DEPTH` deep (checked without
    recursion, so a hostile document cannot exhaust the stack)."""
    stack = [(meta, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_META_DEPTH:
            return f"meta nests deeper than {MAX_META_DEPTH} levels"
        if isinstance(v, Mapping):
            stack.extend((x, depth + 1) for x in v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend((x, depth + 1) for x in v)
    return None


def _length_problem(field: str, v: Any) -> str | None:
    """A token length must be an integer >= 1 (``3.0`` and booleans are not integers)."""
    if not _is_int(v):
        return f"{field} must be a positive integer, got {v!r} ({_type_name(v)})"
    if v <= 0:
        return f"{field} must be a positive integer, got {v} ({'zero' if v == 0 else 'negative'})"
    if v > MAX_TOKENS:
        return f"{field} must be at most {MAX_TOKENS:,} tokens, got {_short(v)}"
    return None


def _short(v: Any) -> str:
    """A value for a message, cut to 40 characters (a 5,000-digit integer is not repeated)."""
    text = repr(v) if not _is_int(v) or v.bit_length() < 128 else f"an integer of {len(str(v))} digits"
    return text if len(text) <= 40 else text[:37] + "..."


def text_problem(field: str, v: str) -> str | None:
    """A name or id must be printable text: no control characters, no lone surrogates (which
    cannot be written as UTF-8)."""
    if not v.isprintable():
        bad = next(c for c in v if not c.isprintable())
        return f"{field} must be printable text, got {v[:40]!r} (character U+{ord(bad):04X} is not printable)"
    return None


def _id_problem(field: str, v: Any) -> str | None:
    if not isinstance(v, str):
        return f"{field} must be a string, got {v!r} ({_type_name(v)})"
    if not v:
        return f"{field} must be a non-empty string"
    return text_problem(field, v)


def _loc(obj: Any, key: str, fallback: str, kind: str) -> dict[str, str]:
    """Where an item is: by its id when it has a usable one, else by its position."""
    if isinstance(obj, Mapping) and isinstance(obj.get(key), str) and obj[key]:
        return {kind: obj[key]}
    return {"where": fallback}


def _fields(obj: Any, required: Sequence[str], source: str, *, what: str, optional: Sequence[str] = (),
            **loc: str) -> None:
    """``obj`` is an object holding the ``required`` fields and no others but ``optional`` ones."""
    if not isinstance(obj, Mapping):
        raise TraceError(source, f"{what} must be an object, got {_type_name(obj)}", **loc)
    for f in required:
        if f not in obj:
            raise TraceError(source, f"missing field '{f}'", **loc)
    extra = sorted(str(k) for k in obj if k not in required and k not in optional)
    if extra:
        allowed = ", ".join(list(required) + [f"{o} (optional)" for o in optional])
        raise TraceError(source, f"unknown field '{extra[0]}' (allowed: {allowed})", **loc)


# ----------------------------------------------------------------------------- shared rules


def _check_budget(kv_budget: Any, source: str) -> None:
    if kv_budget is not None and (not _is_int(kv_budget) or kv_budget <= 0):
        raise ValueError(f"{source}: kv_budget must be a positive integer, got {kv_budget!r}")


def _check_agents(agents: Iterable[tuple[str, Any, Any]], source: str) -> None:
    seen: set[str] = set()
    for name, prefix, expected in agents:
        if name in seen:
            raise TraceError(source, "duplicate agent name (agent names must be unique)", agent=name)
        seen.add(name)
        p = _length_problem("prefix_tokens", prefix)
        if p:
            raise TraceError(source, p, agent=name)
        if not _is_number(expected) or not _finite(expected) or expected <= 0 or expected > MAX_TOKENS:
            raise TraceError(
                source,
                f"expected_output_tokens must be a finite number > 0 and at most {MAX_TOKENS:,}, "
                f"got {_short(expected)}",
                agent=name,
            )


def check_arrival(tid: str, arrival: Any, prev: tuple[str, float] | None, source: str) -> None:
    """A task's arrival rules: a finite number >= 0, not earlier than ``prev``'s (the preceding
    task's id and arrival; None for the first task)."""
    if not _is_number(arrival) or not _finite(arrival) or arrival < 0:
        raise TraceError(source, f"arrival must be a finite number >= 0, got {_short(arrival)}", task=tid)
    if arrival > MAX_ARRIVAL_S:
        raise TraceError(source, f"arrival {arrival:.4g} s is beyond the longest horizon a run may span "
                         f"({MAX_ARRIVAL_S:g} s, about 31.7 years)", task=tid)
    if prev is not None and arrival < prev[1]:
        raise TraceError(
            source,
            f"arrival {arrival!r} is earlier than the arrival {prev[1]!r} of the preceding task "
            f"{prev[0]} (tasks must be in non-decreasing arrival order)",
            task=tid,
        )


def _check_tasks(
    tasks: Iterable[tuple[str, Any, list[tuple[str, str, Any, Any, tuple[str, ...]]]]],
    agents: Mapping[str, int],
    source: str,
    kv_budget: int | None,
) -> None:
    if kv_budget is not None:
        for name, prefix in agents.items():
            if prefix > kv_budget:
                raise TraceError(
                    source,
                    f"prefix of {prefix} tokens is larger than the KV budget of {kv_budget} tokens",
                    agent=name,
                )
    seen_tasks: set[str] = set()
    prev: tuple[str, float] | None = None
    for tid, arrival, stages in tasks:
        if "/" in tid:
            raise TraceError(source, "task id must not contain '/' (request ids are 'task/stage')", task=tid)
        if tid in seen_tasks:
            raise TraceError(source, "duplicate task id (task ids must be unique)", task=tid)
        seen_tasks.add(tid)
        check_arrival(tid, arrival, prev, source)
        prev = (tid, arrival)
        if not stages:
            raise TraceError(source, "a task must have at least one stage", task=tid)
        ids: set[str] = set()
        for sid, agent, x, y, parents, _m in stages:
            if "/" in sid:
                raise TraceError(
                    source, "stage id must not contain '/' (request ids are 'task/stage')", task=tid, stage=sid
                )
            if sid in ids:
                raise TraceError(source, "duplicate stage id within the task", task=tid, stage=sid)
            ids.add(sid)
        for sid, agent, x, y, parents, _m in stages:
            if agent not in agents:
                raise TraceError(source, f"unknown agent '{agent}' (not in the agents table)", task=tid, stage=sid)
            for field, v in (("input_tokens", x), ("output_tokens", y)):
                p = _length_problem(field, v)
                if p:
                    raise TraceError(source, p, task=tid, stage=sid)
            if _m is not None:
                p = _length_problem("max_new_tokens", _m)
                if p:
                    raise TraceError(source, p, task=tid, stage=sid)
                if _m < y:
                    raise TraceError(source, f"max_new_tokens {_m} is smaller than output_tokens {y} (the "
                                     "server would stop the request early)", task=tid, stage=sid)
            seen_parents: set[str] = set()
            for q in parents:
                if q not in ids:
                    raise TraceError(source, f"parent '{q}' does not exist in the task", task=tid, stage=sid)
                if q in seen_parents:
                    raise TraceError(source, f"parent '{q}' is listed twice", task=tid, stage=sid)
                seen_parents.add(q)
        cycle = find_cycle([(sid, parents) for sid, _a, _x, _y, parents, _m in stages])
        if cycle:
            raise TraceError(
                source,
                "the stages form a cycle: " + " -> ".join(cycle + [cycle[0]]),
                task=tid,
                stage=cycle[0],
            )
        if kv_budget is not None:
            for sid, agent, x, y, parents, _m in stages:
                out, what = (y, "output") if _m is None else (_m, "max_new_tokens")
                need = agents[agent] + x + out
                if need > kv_budget:
                    raise TraceError(
                        source,
                        f"request does not fit in the KV budget: prefix {agents[agent]} + input {x} "
                        f"+ {what} {out} = {need} tokens > budget {kv_budget} tokens",
                        task=tid,
                        stage=sid,
                    )


_RANK = {k: i for i, k in enumerate(SEGMENT_KINDS)}


def _check_segments(
    tasks: Iterable[tuple[str, list[tuple[str, str, int, tuple[str, ...], list[tuple[str, Any, Any, Any, Any]]]]]],
    agents: Mapping[str, int],
    source: str,
    table: Mapping[str, tuple[str, Any, Any, Any, Any]] | None = None,
) -> None:
    """The segment rules (module docstring) over ``(task, [(stage, agent, x_v, parents, segments)])``
    with every task's stages in topological order; ``table`` (a document's) must be held entirely."""
    parent_of: dict[str, str | None] = {}
    holders: dict[str, list[tuple[str, str]]] = {}
    kind_of: dict[str, str] = {}
    for tid, stages in tasks:
        for sid, agent, x, _parents, segs in stages:
            loc = {"task": tid, "stage": sid}
            if not segs:
                raise TraceError(source, "segments must not be empty (the prompt's segments in order)", **loc)
            prefix = agents[agent]
            total = sum(g[1] for g in segs)
            if total != prefix + x:
                raise TraceError(source, f"segments add up to {total} tokens, not the prompt's prefix_tokens "
                                 f"{prefix} + input_tokens {x} = {prefix + x}", **loc)
            cum, boundary, prev, seen = 0, prefix == 0, None, set()
            rank = 0
            for g in segs:
                gid, n, kind, gtask, origin = g
                if gid in seen:
                    raise TraceError(source, f"segment '{gid}' is listed twice", **loc)
                seen.add(gid)
                cum += n
                boundary = boundary or cum == prefix
                if kind == "prefix" and cum > prefix:
                    raise TraceError(source, f"prefix segment '{gid}' ends at token {cum}, beyond the agent "
                                     f"prefix of {prefix} tokens", **loc)
                if _RANK[kind] < rank:
                    raise TraceError(source, f"{kind} segment '{gid}' after a {SEGMENT_KINDS[rank]} one (along "
                                     "a prompt: prefix, shared, context, unique)", **loc)
                rank = _RANK[kind]
                if kind in ("context", "unique"):
                    if gtask is None or origin is None:
                        raise TraceError(source, f"{kind} segment '{gid}' must name its task and origin", **loc)
                    if gtask != tid:
                        raise TraceError(source, f"{kind} segment '{gid}' belongs to task {gtask}, not to this "
                                         "one", **loc)
                elif gtask is not None or origin is not None:
                    raise TraceError(source, f"{kind} segment '{gid}' must not name a task or origin (only "
                                     "context and unique segments belong to a task)", **loc)
                if gid in parent_of:
                    if parent_of[gid] != prev:
                        raise TraceError(source, f"segment '{gid}' follows {prev or 'nothing'!r} here but "
                                         f"{parent_of[gid] or 'nothing'!r} elsewhere (a segment has one "
                                         "predecessor: the segments form a tree)", **loc)
                else:
                    parent_of[gid] = prev
                holders.setdefault(gid, []).append((tid, sid))
                kind_of[gid] = kind
                prev = gid
            if not boundary:
                raise TraceError(source, f"no segment boundary at the agent prefix (prefix_tokens {prefix}): "
                                 "the agent prefix must be a leading run of segments", **loc)
            for gid, _n, kind, gtask, origin in segs:
                if kind in ("context", "unique") and holders[gid][0] == (tid, sid) and origin != sid:
                    raise TraceError(source, f"{kind} segment '{gid}' names origin '{origin}', but the "
                                     "first stage of the task (topological order) that holds it is this one", **loc)
    for gid, hs in holders.items():
        if kind_of[gid] == "unique" and len(hs) > 1:
            (t1, s1), (t2, s2) = hs[0], hs[1]
            raise TraceError(source, f"unique segment '{gid}' is also held by stage {s1} (a unique segment "
                             "belongs to one stage; shared ones are context or shared)", task=t2, stage=s2)
    if table is not None:
        for gid in table:
            if gid not in holders:
                raise TraceError(source, "segment is held by no stage (the table lists the stages' "
                                 "segments only)", where=f"segment {gid}")
