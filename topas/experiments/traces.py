"""The traces an experiment names: the ones in ``data/traces/``, a name or a path resolved to its
file, each file's sha256 (part of an experiment's key) and the trace read and validated once per
process.
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from topas.errors import ExperimentError
from topas.paths import traces_dir
from topas.workload.trace_io import read_trace
from topas.workload.validate import TraceError

if TYPE_CHECKING:  # pragma: no cover
    from topas.workload.model import Trace

__all__ = ["available_traces", "resolve_trace_path", "trace_sha256"]

_TRACE_SUFFIXES = (".json.gz", ".json")


def available_traces() -> list[str]:
    """Names of the traces in ``data/traces/`` (``<name>.json.gz`` or ``<name>.json``), sorted.

    A trace name has no dot: the provenance files beside the traces (e.g.
    ``metagpt_sop.runs.json``, the MetaGPT runs a trace was converted from) are not traces, nor is
    ``schema.json`` (the format's JSON Schema)."""
    d = traces_dir()
    if not d.is_dir():
        return []
    names = set()
    for p in d.iterdir():
        for suf in _TRACE_SUFFIXES:
            if p.is_file() and p.name.endswith(suf) and "." not in p.name[: -len(suf)] and p.name != "schema.json":
                names.add(p.name[: -len(suf)])
    return sorted(names)


def resolve_trace_path(workload: str | os.PathLike[str]) -> Path:
    """The trace file of ``workload``: a name under ``data/traces/`` or a path to a file.

    A string with a path separator or a ``.json``/``.json.gz`` suffix, or one naming an existing
    file, is a path; a missing path raises ``FileNotFoundError``. Any other string is a trace
    name; an unknown one raises :class:`ExperimentError` listing the available traces.
    """
    s = os.fspath(workload)
    if not s:
        raise ExperimentError("workload is empty; give a trace name or a trace file")
    p = Path(s)
    looks_like_path = isinstance(workload, Path) or os.sep in s or "/" in s or s.endswith(_TRACE_SUFFIXES)
    if p.is_file():
        return p
    if looks_like_path:
        if p.is_dir():
            raise ExperimentError(f"trace file {s}: is a directory, not a trace file")
        raise FileNotFoundError(f"trace file {s}: no such file")
    for suf in _TRACE_SUFFIXES:
        cand = traces_dir() / f"{s}{suf}"
        if cand.is_file():
            return cand
    avail = available_traces()
    raise ExperimentError(
        f"unknown workload {s!r}: no trace file {s}.json.gz in {traces_dir()} and no such file; "
        f"available traces: {', '.join(avail) if avail else '(none)'}"
    )


def _file_stamp(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return (str(path.resolve()), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=64)
def _sha256_file(stamp: tuple[str, int, int]) -> str:
    return hashlib.sha256(Path(stamp[0]).read_bytes()).hexdigest()


def trace_sha256(path: Path) -> str:
    """sha256 (hex) of a trace file's bytes (cached per process by path, mtime and size)."""
    return _sha256_file(_file_stamp(path))


#: Traces kept parsed per process: more than the shipped traces (12), so a sweep or a pack check that
#: interleaves every workload does not re-read and re-validate one per experiment.
@lru_cache(maxsize=32)
def _read_trace_cached(stamp: tuple[str, int, int], kv_budget: int | None) -> "Trace":
    return read_trace(stamp[0], kv_budget=kv_budget)


@lru_cache(maxsize=64)
def _head_cached(stamp: tuple[str, int, int], n: int) -> "Trace":
    return _read_trace_cached(stamp, None).head(n)


def read_head(path: Path, n: int | None) -> "Trace":
    """The first ``n`` tasks of a trace (all of them when ``n`` is None), the same object for the
    same file and ``n`` in a process: a sweep's worker runs many experiments on one ``(trace, n)``,
    and ``validate_trace`` then checks its tasks once (``topas.workload.model.CHECKED``)."""
    trace = _read_trace(path)
    return trace if n is None else _head_cached(_file_stamp(path), n)


def _read_trace(path: Path, kv_budget: int | None = None) -> "Trace":
    """Read (and validate) a trace, cached per process: a sweep reads each file once per worker.

    Errors name the path as given, not the resolved one."""
    try:
        return _read_trace_cached(_file_stamp(path), kv_budget)
    except TraceError:
        return read_trace(path, kv_budget=kv_budget)  # re-raise with the path as the user gave it
