"""Reading recorded MetaGPT calls (format ``topas.metagpt-calls/1``, tools/metagpt/README.md): a
calls file's records (:func:`read_calls`), each record's fields checked (:func:`_check_record`) and
its timestamps as epoch seconds (:func:`_ts`). Bad input raises
:class:`~topas.workload.trace_error.TraceError` naming the file, line and call."""

from __future__ import annotations

import datetime as _dt
import gzip
import json
import lzma
import math
import numbers
import os
from pathlib import Path
from typing import Any, Mapping

from topas.workload.trace_error import TraceError

RECORD_VERSION = "topas.metagpt-calls/1"

#: Fields every call record must have.
REQUIRED = ("run_id", "call_id", "role", "action", "parents", "t_start", "t_end", "messages", "completion_tokens")


def _ts(v: Any, source: str, where: str, field: str) -> float:
    if isinstance(v, bool):
        raise TraceError(source, f"{field} must be a number of seconds or an ISO-8601 string, got {v!r}", where=where)
    if isinstance(v, numbers.Real):
        f = float(v)
    elif isinstance(v, str):
        try:
            d = _dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
        except ValueError:
            raise TraceError(source, f"{field} {v!r} is not an ISO-8601 time", where=where) from None
        if d.tzinfo is None:
            d = d.replace(tzinfo=_dt.timezone.utc)
        f = d.timestamp()
    else:
        raise TraceError(source, f"{field} must be a number of seconds or an ISO-8601 string, got {v!r}", where=where)
    if not math.isfinite(f):
        raise TraceError(source, f"{field} must be finite, got {v!r}", where=where)
    return f


def read_calls(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a calls file (``.jsonl``, ``.jsonl.gz`` or ``.jsonl.xz``), each with ``_line`` (1-based)
    and ``_source`` added. A line that is not a JSON object raises :class:`TraceError`."""
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    elif raw[:6] == b"\xfd7zXZ\x00":
        raw = lzma.decompress(raw)
    out = []
    for k, line in enumerate(raw.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(str(path), f"not valid JSON ({e})", where=f"line {k}") from None
        if not isinstance(rec, dict):
            raise TraceError(str(path), "a call record must be a JSON object", where=f"line {k}")
        rec["_line"] = k
        rec["_source"] = str(path)
        out.append(rec)
    return out


def _check_record(rec: Mapping[str, Any], source: str) -> str:
    where = f"line {rec.get('_line', '?')}"
    if "call_id" in rec and "run_id" in rec:
        where += f" (run {rec['run_id']} call {rec['call_id']})"
    for f in REQUIRED:
        if f not in rec:
            raise TraceError(source, f"missing field '{f}'", where=where)
    for f in ("run_id", "call_id", "role", "action"):
        if not isinstance(rec[f], str) or not rec[f]:
            raise TraceError(source, f"'{f}' must be a non-empty string, got {rec[f]!r}", where=where)
    if "/" in rec["run_id"] or "/" in rec["call_id"]:
        raise TraceError(source, "run_id and call_id must not contain '/'", where=where)
    if not isinstance(rec["parents"], list) or not all(isinstance(p, str) for p in rec["parents"]):
        raise TraceError(source, f"'parents' must be a list of call ids, got {rec['parents']!r}", where=where)
    msgs = rec["messages"]
    if not isinstance(msgs, list) or not msgs or not all(
        isinstance(m, dict) and isinstance(m.get("content"), str) and isinstance(m.get("role"), str) for m in msgs
    ):
        raise TraceError(source, "'messages' must be a non-empty list of {role, content} strings", where=where)
    ct = rec["completion_tokens"]
    if isinstance(ct, bool) or not isinstance(ct, numbers.Integral) or ct < 0:
        raise TraceError(source, f"'completion_tokens' must be an integer >= 0, got {ct!r}", where=where)
    return where

