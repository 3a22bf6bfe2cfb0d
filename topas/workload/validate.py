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

The structure checks are here; the schema's field lists and the shared rules are in
:mod:`topas.workload.trace_rules`, the error in :mod:`topas.workload.trace_error`, the stage order
in :mod:`topas.workload.dag_order`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from topas.workload.dag_order import find_cycle, topological_order
from topas.workload.model import CHECKED
from topas.workload.trace_error import TraceError
from topas.workload.trace_rules import (
    AGENT_FIELDS,
    SCHEMA_V1,
    SCHEMA_V2,
    SEGMENT_FIELDS,
    SEGMENT_KINDS,
    SEGMENT_OPTIONAL,
    STAGE_FIELDS,
    STAGE_OPTIONAL,
    SUPPORTED_SCHEMAS,
    TASK_FIELDS,
    TOP_FIELDS,
    _check_agents,
    _check_budget,
    _check_segments,
    _check_tasks,
    _fields,
    _id_problem,
    _length_problem,
    _loc,
    _type_name,
    check_arrival,
    meta_depth_problem,
    text_problem,
)

if TYPE_CHECKING:  # pragma: no cover
    from topas.workload.model import Trace

__all__ = [
    "SCHEMA_V1",
    "SCHEMA_V2",
    "SUPPORTED_SCHEMAS",
    "TraceError",
    "find_cycle",
    "topological_order",
    "validate_dict",
    "validate_trace",
]


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
    p = meta_depth_problem(d["meta"])
    if p:
        raise TraceError(source, p, where="top level")
    for f in ("agents", "tasks") + (("segments",) if v2 else ()):
        if not isinstance(d[f], (list, tuple)):
            raise TraceError(source, f"{f} must be an array, got {_type_name(d[f])}", where="top level")
    if not d["tasks"]:
        raise TraceError(source, "tasks must not be empty (a trace has at least one task)", where="top level")

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
        p = text_problem("workflow", t["workflow"])
        if p:
            raise TraceError(source, p, **loc)
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
    """Check an already-built :class:`~topas.workload.model.Trace` with the same rules.

    A trace checked once (under ``kv_budget``, or under any budget when ``kv_budget`` is None),
    or the first tasks or re-timed copy of one (``topas.workload.model.CHECKED``), has only its
    arrival times checked again: a run's trace is checked by the experiment, the re-timing and
    the simulator in turn, and a sweep runs the same tasks many times."""

    source = source if source is not None else f"<trace {trace.name}>"
    _check_budget(kv_budget, source)
    checked = trace.__dict__.get(CHECKED, frozenset())
    if kv_budget in checked or (kv_budget is None and checked):
        _check_arrivals(trace, source)
        return
    _check_all(trace, kv_budget, source)
    trace.__dict__[CHECKED] = checked | {kv_budget}


def _check_arrivals(trace: "Trace", source: str) -> None:
    """The arrival rules of ``_check_tasks`` alone (``check_arrival``)."""
    prev = None
    for t in trace.tasks:
        check_arrival(t.id, t.arrival, prev, source)
        prev = (t.id, t.arrival)


def _check_all(trace: "Trace", kv_budget: int | None, source: str) -> None:
    p = _id_problem("name", trace.name)
    if p:
        raise TraceError(source, p, where="top level")
    if not trace.tasks:
        raise TraceError(source, "tasks must not be empty (a trace has at least one task)", where="top level")
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
