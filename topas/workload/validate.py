"""Validation of workload traces: every rule of the ``topas.trace/1`` and ``topas.trace/2`` schemas,
in one place (the JSON Schema ``data/traces/topas.trace-2.schema.json`` covers the structure only).

Two entry points share the same rules:

- :func:`validate_dict` checks a decoded trace document (what ``json.load`` gives) *before* any
  :class:`~topas.workload.model.Trace` is built, so a bad file is never half-loaded;
- :func:`validate_trace` checks an already-built ``Trace`` (e.g. after re-timing or slicing).

Every violation raises :class:`TraceError` whose message names the file (``source``), the task and
stage (or the agent) and the rule broken, e.g.::

    data/x.json.gz: task t00003 stage C: parent 'Z' does not exist in the task

The first violation found is reported, deterministically: the document's structure (fields and
JSON types) is checked first, then the rules below, item by item in file order. The rules (see data/traces/README.md for the schema itself):

- ``schema`` present and one of :data:`SUPPORTED_SCHEMAS`;
- every required field present with the right JSON type, no unknown fields (a typo such as
  ``parent`` for ``parents`` must not be silently ignored; free-form information goes into the
  top-level ``meta`` object);
- agent names unique; task ids unique; stage ids unique within their task; task and stage ids
  non-empty and free of ``/`` (the request id is ``f"{task_id}/{stage_id}"``);
- every stage's agent exists; every parent exists in the task, is not listed twice; no cycles
  (the stages on the cycle are named);
- token lengths (``prefix_tokens``, ``input_tokens``, ``output_tokens`` and the optional
  ``max_new_tokens``, which must be >= ``output_tokens``) are integers >= 1:
  zero, negative, non-integer values, floats such as ``3.0`` and booleans are rejected;
- ``arrival`` finite and >= 0, tasks in non-decreasing arrival order;
- ``expected_output_tokens`` a finite number > 0;
- with a KV budget ``B``: every agent prefix ``l_a <= B`` and every request
  ``l_a + x_v + y_v <= B`` (the request must be able to run alone with its prefix resident);
- ``topas.trace/2`` only, the segments (:func:`_check_segments`): ids unique in the table, every
  stage's segments known, not repeated, adding up to ``l_a + x_v`` with a segment boundary at
  ``l_a``; ``prefix`` segments inside ``l_a``; kinds in the order prefix, shared, context, unique
  along the prompt; a segment has the same predecessor in every stage that holds it (the
  segments form a tree); ``context`` and ``unique`` segments name their task and origin (the
  task's first stage, in topological order, that holds it) and are held by that task's stages
  only, a ``unique`` one by a single stage; every segment of the table is held by some stage.
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from topas.workload.model import Trace

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


class TraceError(ValueError):
    """An invalid trace. ``str(err)`` is the full message; the attributes locate the problem.

    Attributes: ``source`` (file or other origin), ``task``, ``stage``, ``agent`` (``None`` when
    not applicable) and ``rule`` (the message without the location prefix).
    """

    def __init__(
        self,
        source: str,
        rule: str | None = None,
        *,
        task: str | None = None,
        stage: str | None = None,
        agent: str | None = None,
        where: str | None = None,
    ) -> None:
        self.source = source
        self.rule = rule
        self.task = task
        self.stage = stage
        self.agent = agent
        if rule is None:  # TraceError("a whole message"), also how a pickled error is rebuilt
            super().__init__(source)
            return
        parts = [source]
        if where is not None:
            parts.append(where)
        else:
            if agent is not None:
                parts.append(f"agent {agent}")
            if task is not None:
                parts.append(f"task {task}" + (f" stage {stage}" if stage is not None else ""))
        super().__init__(": ".join(parts + [rule]))

    def __reduce__(self):  # keep the location attributes across processes (sweeps pickle errors)
        return (_rebuild, (self.source, self.rule, self.task, self.stage, self.agent, str(self)))


def _rebuild(source, rule, task, stage, agent, message) -> TraceError:
    e = TraceError(message)
    e.source, e.rule, e.task, e.stage, e.agent = source, rule, task, stage, agent
    return e


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


def _length_problem(field: str, v: Any) -> str | None:
    """A token length must be an integer >= 1 (``3.0`` and booleans are not integers)."""
    if not _is_int(v):
        return f"{field} must be a positive integer, got {v!r} ({_type_name(v)})"
    if v <= 0:
        return f"{field} must be a positive integer, got {v} ({'zero' if v == 0 else 'negative'})"
    return None


def _id_problem(field: str, v: Any) -> str | None:
    if not isinstance(v, str):
        return f"{field} must be a string, got {v!r} ({_type_name(v)})"
    if not v:
        return f"{field} must be a non-empty string"
    return None


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


# ----------------------------------------------------------------------------- structure


def validate_dict(d: Any, source: str = "<dict>", kv_budget: int | None = None) -> None:
    """Check a decoded ``topas.trace/1`` document; raise :class:`TraceError` on the first problem."""
    if not isinstance(d, Mapping):
        raise TraceError(source, f"a trace must be a JSON object, got {_type_name(d)}")
    supported = ", ".join(SUPPORTED_SCHEMAS)
    if "schema" not in d:
        raise TraceError(source, f"missing field 'schema' (supported schema versions: {supported})")
    if d["schema"] not in SUPPORTED_SCHEMAS:
        raise TraceError(
            source,
            f"unsupported schema version {d['schema']!r} (supported schema versions: {supported})",
        )
    _check_budget(kv_budget, source)
    v2 = d["schema"] == SCHEMA_V2
    _fields(d, TOP_FIELDS + (("segments",) if v2 else ()), source, what="the trace", where="top level")
    p = _id_problem("name", d["name"])
    if p:
        raise TraceError(source, p, where="top level")
    if not isinstance(d["meta"], Mapping):
        raise TraceError(source, f"meta must be an object, got {_type_name(d['meta'])}", where="top level")
    for f in ("agents", "tasks") + (("segments",) if v2 else ()):
        if not isinstance(d[f], (list, tuple)):
            raise TraceError(source, f"{f} must be an array, got {_type_name(d[f])}", where="top level")

    # agents: structure, then the shared semantic rules
    for k, a in enumerate(d["agents"]):
        loc = _loc(a, "name", f"agents[{k}]", "agent")
        _fields(a, AGENT_FIELDS, source, **loc, what="an agent")
        p = _id_problem("name", a["name"])
        if p:
            raise TraceError(source, p, **loc)
    _check_agents(((a["name"], a["prefix_tokens"], a["expected_output_tokens"]) for a in d["agents"]), source)

    for k, t in enumerate(d["tasks"]):
        loc = _loc(t, "id", f"tasks[{k}]", "task")
        _fields(t, TASK_FIELDS, source, **loc, what="a task")
        p = _id_problem("id", t["id"])
        if p:
            raise TraceError(source, p, **loc)
        if not isinstance(t["workflow"], str):
            raise TraceError(source, f"workflow must be a string, got {_type_name(t['workflow'])}", **loc)
        if not isinstance(t["stages"], (list, tuple)):
            raise TraceError(source, f"stages must be an array, got {_type_name(t['stages'])}", **loc)
        for j, s in enumerate(t["stages"]):
            sloc = _loc(s, "id", f"task {t['id']} stages[{j}]", "stage")
            sloc["task"] = t["id"]
            _fields(s, STAGE_FIELDS + (("segments",) if v2 else ()), source, **sloc, what="a stage",
                    optional=STAGE_OPTIONAL)
            p = _id_problem("id", s["id"]) or _id_problem("agent", s["agent"])
            if p:
                raise TraceError(source, p, **sloc)
            if v2:
                if not isinstance(s["segments"], (list, tuple)):
                    raise TraceError(source, f"segments must be an array, got {_type_name(s['segments'])}", **sloc)
                for q in s["segments"]:
                    p = _id_problem("a segment id", q)
                    if p:
                        raise TraceError(source, p, **sloc)
            if not isinstance(s["parents"], (list, tuple)):
                raise TraceError(source, f"parents must be an array, got {_type_name(s['parents'])}", **sloc)
            for q in s["parents"]:
                p = _id_problem("a parent", q)
                if p:
                    raise TraceError(source, p, **sloc)

    agents = {a["name"]: a["prefix_tokens"] for a in d["agents"]}
    _check_tasks(
        (
            (
                t["id"],
                t["arrival"],
                [
                    (s["id"], s["agent"], s["input_tokens"], s["output_tokens"], tuple(s["parents"]),
                     s.get("max_new_tokens"))
                    for s in t["stages"]
                ],
            )
            for t in d["tasks"]
        ),
        agents,
        source,
        kv_budget,
    )
    if v2:
        table = _segment_table(d["segments"], source)
        stages_of = []
        for t in d["tasks"]:
            by_id = {s["id"]: s for s in t["stages"]}
            order = topological_order([(s["id"], s["parents"]) for s in t["stages"]])
            assert order is not None  # checked above: acyclic
            rows = []
            for sid in order:
                s = by_id[sid]
                segs = []
                for q in s["segments"]:
                    if q not in table:
                        raise TraceError(source, f"unknown segment '{q}' (not in the segments table)",
                                         task=t["id"], stage=sid)
                    segs.append(table[q])
                rows.append((sid, s["agent"], s["input_tokens"], tuple(s["parents"]), segs))
            stages_of.append((t["id"], rows))
        _check_segments(stages_of, agents, source, table=table)


def _segment_table(rows: Any, source: str) -> dict[str, tuple[str, Any, Any, Any, Any]]:
    """The ``segments`` table of a ``topas.trace/2`` document: id -> (id, tokens, kind, task, origin)."""
    table: dict[str, tuple[str, Any, Any, Any, Any]] = {}
    for k, g in enumerate(rows):
        loc = {"where": f"segment {g['id']}"} if isinstance(g, Mapping) and isinstance(g.get("id"), str) and g["id"] \
            else {"where": f"segments[{k}]"}
        _fields(g, SEGMENT_FIELDS, source, what="a segment", optional=SEGMENT_OPTIONAL, **loc)
        p = _id_problem("id", g["id"]) or _length_problem("tokens", g["tokens"])
        if p:
            raise TraceError(source, p, **loc)
        if g["kind"] not in SEGMENT_KINDS:
            raise TraceError(source, f"kind must be one of {', '.join(SEGMENT_KINDS)}, got {g['kind']!r}", **loc)
        for f in SEGMENT_OPTIONAL:
            if f in g:
                p = _id_problem(f, g[f])
                if p:
                    raise TraceError(source, p, **loc)
        if g["id"] in table:
            raise TraceError(source, "duplicate segment id (segment ids must be unique)", **loc)
        table[g["id"]] = (g["id"], g["tokens"], g["kind"], g.get("task"), g.get("origin"))
    return table


def validate_trace(trace: "Trace", kv_budget: int | None = None, source: str | None = None) -> None:
    """Check an already-built :class:`~topas.workload.model.Trace` with the same rules."""
    source = source if source is not None else f"<trace {trace.name}>"
    _check_budget(kv_budget, source)
    p = _id_problem("name", trace.name)
    if p:
        raise TraceError(source, p, where="top level")
    for key, a in trace.agents.items():
        if key != a.name:
            raise TraceError(source, f"agents table key {key!r} differs from the agent's name", agent=a.name)
    _check_agents(((a.name, a.prefix_tokens, a.expected_output_tokens) for a in trace.agents.values()), source)
    for t in trace.tasks:
        p = _id_problem("id", t.id)
        if p:
            raise TraceError(source, p, where=f"task {t.id!r}")
        for s in t.stages:
            p = _id_problem("id", s.id) or _id_problem("agent", s.agent)
            if p:
                raise TraceError(source, p, task=t.id, where=f"task {t.id} stage {s.id!r}")
    agents = {a.name: a.prefix_tokens for a in trace.agents.values()}
    _check_tasks(
        (
            (t.id, t.arrival, [(s.id, s.agent, s.input_tokens, s.output_tokens, tuple(s.parents), s.max_new_tokens)
                          for s in t.stages])
            for t in trace.tasks
        ),
        agents,
        source,
        kv_budget,
    )
    with_segments = [s.segments is not None for t in trace.tasks for s in t.stages]
    if any(with_segments):
        if not all(with_segments):
            t, s = next((t, s) for t in trace.tasks for s in t.stages if s.segments is None)
            raise TraceError(source, "stage has no segments while others have (all stages or none)",
                             task=t.id, stage=s.id)
        table: dict[str, tuple[str, Any, Any, Any, Any]] = {}
        rows_of: dict[int, tuple[str, Any, Any, Any, Any]] = {}  # a Segment shared by stages: checked once
        stages_of = []
        for t in trace.tasks:
            rows = []
            for sid in t.topo_order:
                s = t.stage_map[sid]
                segs = []
                for g in s.segments or ():
                    row = rows_of.get(id(g))
                    if row is not None:
                        segs.append(row)
                        continue
                    row = rows_of[id(g)] = (g.id, g.tokens, g.kind, g.task, g.origin)
                    p = _id_problem("a segment id", g.id) or _length_problem(f"segment {g.id}: tokens", g.tokens)
                    if p:
                        raise TraceError(source, p, task=t.id, stage=s.id)
                    if g.kind not in SEGMENT_KINDS:
                        raise TraceError(source, f"segment {g.id}: kind must be one of {', '.join(SEGMENT_KINDS)}, "
                                         f"got {g.kind!r}", task=t.id, stage=s.id)
                    old = table.setdefault(g.id, row)
                    if old != row:
                        raise TraceError(source, f"segment {g.id} is {row[1:]} here but {old[1:]} in another stage "
                                         "(one id, one segment)", task=t.id, stage=s.id)
                    segs.append(row)
                rows.append((s.id, s.agent, s.input_tokens, tuple(s.parents), segs))
            stages_of.append((t.id, rows))
        _check_segments(stages_of, agents, source)


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
        if not _is_number(expected) or not math.isfinite(expected) or expected <= 0:
            raise TraceError(
                source,
                f"expected_output_tokens must be a finite number > 0, got {expected!r}",
                agent=name,
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
        if not _is_number(arrival) or not math.isfinite(arrival) or arrival < 0:
            raise TraceError(source, f"arrival must be a finite number >= 0, got {arrival!r}", task=tid)
        if prev is not None and arrival < prev[1]:
            raise TraceError(
                source,
                f"arrival {arrival!r} is earlier than the arrival {prev[1]!r} of the preceding task "
                f"{prev[0]} (tasks must be in non-decreasing arrival order)",
                task=tid,
            )
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


# ----------------------------------------------------------------------------- graph helpers


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
    import heapq

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
