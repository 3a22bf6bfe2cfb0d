"""Checking a stored result before it is served (issue 44): its tables' checksums and structure.

:meth:`topas.experiments.result_store.ResultStore.put` records in ``meta.json`` the sha256 and
size of every table it wrote (``"checksums": {"tasks.parquet": {"sha256": ..., "bytes": ...}, ...}``).
:func:`result_problem` says what is wrong with a stored result, or ``None``:

- ``meta.json`` unreadable or not a JSON object with a key (a truncated write, a damaged disk);
- with checksums: a table missing, of another size, or whose sha256 differs (a flipped bit, a
  table swapped with another result's, a truncated file); a pack's ``meta.json`` holds the
  checksums of the tables it ships only (``scripts/pack_results.py``: ``{}`` for a summary-only
  run, which then has nothing to check but its ``meta.json``);
- without checksums (results written before them): each table expected is
  present and looks like a whole Parquet file (``PAR1`` at both ends); a pack's manifest says
  which tables it kept (``expected``), a working store keeps them all.

A result with a problem is treated as absent: never served, re-run by the next sweep.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable

__all__ = ["CHECKSUMS", "file_checksum", "read_meta", "result_problem", "table_checksums"]

CHECKSUMS = "checksums"
META = "meta.json"
_PARQUET_MAGIC = b"PAR1"


def file_checksum(path: Path) -> dict[str, Any]:
    """``{"sha256": hex digest, "bytes": size}`` of one file."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    return {"sha256": h.hexdigest(), "bytes": size}


def table_checksums(folder: Path, files: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The checksums of ``files`` (names) in ``folder``, for ``meta.json``."""
    return {name: file_checksum(Path(folder) / name) for name in files}


def read_meta(folder: Path) -> dict[str, Any]:
    """A stored ``meta.json`` as a dict; ``ValueError`` naming the file when it is unreadable,
    not JSON or not an object with a ``key``."""
    path = Path(folder) / META
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: unreadable ({e})") from None
    except ValueError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("key"), str):
        raise ValueError(f"{path}: not a result's meta.json (no key)")
    return meta


def _looks_whole(path: Path) -> str | None:
    try:
        size = path.stat().st_size
        if size < 12:
            return f"{path.name} is truncated ({size} bytes)"
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(-4, os.SEEK_END)
            tail = f.read(4)
    except OSError as e:
        return f"{path.name} is unreadable ({e.strerror or e})"
    if head != _PARQUET_MAGIC or tail != _PARQUET_MAGIC:
        return f"{path.name} is not a whole Parquet file (truncated or overwritten)"
    return None


def result_problem(folder: Path, expected: Iterable[str], meta: dict[str, Any] | None = None,
                   kept: Iterable[str] | None = None) -> str | None:
    """What is wrong with the stored result in ``folder`` (module docstring), or ``None``.
    ``expected``: the table files it should hold when ``meta.json`` records no checksums;
    ``kept``: in a pack, the table files its manifest says it kept (others recorded in the
    checksums were left out on purpose)."""
    folder = Path(folder)
    if meta is None:
        try:
            meta = read_meta(folder)
        except ValueError as e:
            return str(e).replace(f"{folder / META}: ", "meta.json is ")
    if meta.get("key") != folder.name:
        return f"meta.json names key {str(meta.get('key'))[:16]}..., not this folder's"
    sums = meta.get(CHECKSUMS)
    if isinstance(sums, dict):
        kept = None if kept is None else set(kept)
        for name, want in sums.items():
            p = folder / name
            if kept is not None and name not in kept:
                continue  # a pack left it out (its manifest says so)
            if not p.is_file():
                return f"{name} is missing"
            if not isinstance(want, dict) or p.stat().st_size != want.get("bytes"):
                return f"{name} has {p.stat().st_size} bytes, not the {want.get('bytes') if isinstance(want, dict) else '?'} recorded"
            try:
                got = file_checksum(p)["sha256"]
            except OSError as e:
                return f"{name} is unreadable ({e.strerror or e})"
            if got != want.get("sha256"):
                return f"{name} does not match its recorded sha256 (damaged or replaced)"
        return None
    for name in expected:
        p = folder / name
        if not p.is_file():
            return f"{name} is missing"
        problem = _looks_whole(p)
        if problem:
            return problem
    return None
