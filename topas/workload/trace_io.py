"""Reading and writing traces in the ``topas.trace/1`` and ``topas.trace/2`` schemas (documented in
data/traces/README.md; ``/2`` adds the prompts' segments, its JSON Schema is
``data/traces/topas.trace-2.schema.json``). A trace whose stages carry segments is written as
``/2``, any other as ``/1``, byte for byte as before.

A trace file is one JSON document, gzipped (``<name>.json.gz``) or plain (``.json``; the reader
tells them apart by the gzip magic bytes, not the suffix). Writing is byte-deterministic: keys
sorted, fixed separators, ASCII only, gzip header with ``mtime=0`` and no file name, so the same
``Trace`` always gives the same bytes (given the same zlib).

Loading validates the whole document (:func:`topas.workload.validate.validate_dict`) before any
object is built, so a bad file raises :class:`~topas.workload.validate.TraceError` and is never
half-loaded. Stages are stored in a deterministic topological order (ties broken by their order
in the file).
"""

from __future__ import annotations

import copy
import gzip
import io
import json
import numbers
import os
import zlib
from pathlib import Path
from typing import Any, Mapping

from topas.workload.model import Agent, Segment, Stage, Task, Trace
from topas.workload.validate import (
    SCHEMA_V1,
    SCHEMA_V2,
    TraceError,
    topological_order,
    validate_dict,
    validate_trace,
)

GZIP_MAGIC = b"\x1f\x8b"


def request_id(task_id: str, stage_id: str) -> str:
    """The request id used everywhere: ``f"{task_id}/{stage_id}"``."""
    return f"{task_id}/{stage_id}"


def trace_from_dict(d: Mapping[str, Any], kv_budget: int | None = None, source: str = "<dict>") -> Trace:
    """Build a :class:`Trace` from a decoded document, after validating all of it."""
    validate_dict(d, source=source, kv_budget=kv_budget)
    agents = {
        a["name"]: Agent(
            name=a["name"],
            prefix_tokens=int(a["prefix_tokens"]),
            expected_output_tokens=float(a["expected_output_tokens"]),
        )
        for a in d["agents"]
    }
    segments = {
        g["id"]: Segment(id=g["id"], tokens=int(g["tokens"]), kind=g["kind"], task=g.get("task"),
                         origin=g.get("origin"))
        for g in d.get("segments", ())
    }
    tasks = []
    for t in d["tasks"]:
        by_id = {
            s["id"]: Stage(
                id=s["id"],
                agent=s["agent"],
                input_tokens=int(s["input_tokens"]),
                output_tokens=int(s["output_tokens"]),
                parents=tuple(s["parents"]),
                max_new_tokens=None if s.get("max_new_tokens") is None else int(s["max_new_tokens"]),
                segments=tuple(segments[q] for q in s["segments"]) if "segments" in s else None,
            )
            for s in t["stages"]
        }
        order = topological_order([(s["id"], s["parents"]) for s in t["stages"]])
        assert order is not None  # validated: acyclic
        tasks.append(
            Task(
                id=t["id"],
                arrival=float(t["arrival"]),
                stages=tuple(by_id[sid] for sid in order),
                workflow=t["workflow"],
            )
        )
    return Trace(name=d["name"], agents=agents, tasks=tuple(tasks), meta=copy.deepcopy(dict(d["meta"])))


def trace_to_dict(trace: Trace) -> dict[str, Any]:
    """The document of a trace (agents in table order, tasks and stages in order): ``topas.trace/2``
    with the segments table (in order of first use) if its stages carry segments, else ``/1``."""
    d = {
        "schema": SCHEMA_V1,
        "name": trace.name,
        "meta": copy.deepcopy(dict(trace.meta)),
        "agents": [
            {
                "name": a.name,
                "prefix_tokens": _int(a.prefix_tokens),
                "expected_output_tokens": float(a.expected_output_tokens),
            }
            for a in trace.agents.values()
        ],
        "tasks": [
            {
                "id": t.id,
                "arrival": float(t.arrival),
                "workflow": t.workflow,
                "stages": [
                    _stage_dict(s)
                    for s in t.stages
                ],
            }
            for t in trace.tasks
        ],
    }
    if trace.has_segments:
        table: dict[str, Segment] = {}
        for t in trace.tasks:
            for s in t.stages:
                for g in s.segments or ():
                    table.setdefault(g.id, g)
        d["schema"] = SCHEMA_V2
        d["segments"] = [_segment_dict(g) for g in table.values()]
    return d


def _segment_dict(g: Segment) -> dict[str, Any]:
    d = {"id": g.id, "tokens": _int(g.tokens), "kind": g.kind}
    if g.task is not None:
        d["task"] = g.task
    if g.origin is not None:
        d["origin"] = g.origin
    return d


def _stage_dict(s: Stage) -> dict[str, Any]:
    d = {
        "id": s.id,
        "agent": s.agent,
        "input_tokens": _int(s.input_tokens),
        "output_tokens": _int(s.output_tokens),
        "parents": list(s.parents),
    }
    if s.max_new_tokens is not None:  # optional: absent means output_tokens
        d["max_new_tokens"] = _int(s.max_new_tokens)
    if s.segments is not None:  # topas.trace/2
        d["segments"] = [g.id for g in s.segments]
    return d


def _int(v: Any) -> Any:
    """numpy integers -> int for JSON; anything else is left for validation to reject."""
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        return int(v)
    return v


def dumps(d: Mapping[str, Any]) -> bytes:
    """Canonical JSON bytes of a document: sorted keys, fixed separators, ASCII, trailing newline."""
    return (json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False) + "\n").encode(
        "ascii"
    )


def write_trace(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Validate ``trace`` and write it to ``path`` (gzipped if the name ends in ``.gz``).

    The bytes depend only on the trace: gzip ``mtime=0``, no file name in the header, level 9.
    The file is written to a temporary name and renamed, so a reader never sees half a file.
    """
    path = Path(path)
    validate_trace(trace, source=str(path))
    payload = dumps(trace_to_dict(trace))
    if path.name.endswith(".gz"):
        buf = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
            gz.write(payload)
        payload = buf.getvalue()
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(payload)
    os.replace(tmp, path)
    return path


def read_trace(path: str | os.PathLike[str], kv_budget: int | None = None) -> Trace:
    """Read and validate a trace file (``.json.gz`` or ``.json``).

    Raises ``FileNotFoundError`` for a missing file and :class:`TraceError` (naming the file) for
    anything wrong with its content, including bad gzip or JSON.
    """
    path = Path(path)
    source = str(path)
    raw = path.read_bytes()
    if raw[:2] == GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise TraceError(source, f"not a valid gzip file ({e})") from None
    try:
        d = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise TraceError(source, f"not UTF-8 text ({e})") from None
    except json.JSONDecodeError as e:
        raise TraceError(source, f"not valid JSON ({e})") from None
    except RecursionError:
        raise TraceError(source, "not valid JSON (nested too deeply)") from None
    except ValueError as e:  # e.g. an integer literal of more digits than Python converts
        raise TraceError(source, f"not valid JSON ({str(e).splitlines()[0][:120]})") from None
    return trace_from_dict(d, kv_budget=kv_budget, source=source)
