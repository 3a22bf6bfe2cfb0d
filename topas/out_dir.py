"""Output folders a command replaces as a whole (``topas simulate --out``, ``topas replay --out``,
``topas fidelity --out``): never a user's own files.

A folder a command writes holds a marker file, :data:`MARKER`, naming the kind of output
(``simulate``, ``replay``, ``fidelity``). :func:`check_out_dir` refuses, before anything runs, an
output path that is empty, that is a file, that cannot be written, or that is a non-empty folder
other than an earlier output of the same kind (with ``force=True`` such a folder is replaced).
Folders written before the marker existed are recognised by their content: only the tables of a
result (``<table>.parquet``) and ``inputs.json``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

__all__ = ["MARKER", "OutDirError", "check_out_dir", "check_out_file", "is_output_of", "mark"]

MARKER = ".topas-output"
#: What a result folder written before the marker holds (the SimResult tables and the inputs).
_LEGACY_FILES = frozenset({"tasks.parquet", "requests.parquet", "decisions.parquet", "prefix_events.parquet",
                           "timeline.parquet", "summary.parquet", "engines.parquet", "prefix_copies.parquet",
                           "inputs.json"})


class OutDirError(ValueError):
    """An output path that must not be written (the message names it and why)."""


def mark(folder: Path, kind: str) -> None:
    """Write the marker saying ``folder`` is a topas output of ``kind``."""
    (Path(folder) / MARKER).write_text(json.dumps({"kind": kind}) + "\n")


def is_output_of(folder: Path, kind: str) -> bool:
    """Whether ``folder`` is an earlier topas output of ``kind`` (its marker, or for a result
    folder written before the marker, only result tables and ``inputs.json``)."""
    folder = Path(folder)
    marker = folder / MARKER
    if marker.is_file():
        try:
            return json.loads(marker.read_text()).get("kind") == kind
        except (OSError, ValueError, AttributeError):
            return False
    if kind not in ("simulate", "replay"):
        return False
    entries = list(folder.iterdir())
    return bool(entries) and all(p.is_file() and p.name in _LEGACY_FILES for p in entries)


def check_out_dir(out: Path | str, kind: str, force: bool = False, option: str = "--out") -> Path:
    """Refuse (:class:`OutDirError`, naming ``out``) an output folder that must not be written,
    before any work is done; return it as a ``Path``. See the module docstring."""
    if str(out).strip() == "":
        raise OutDirError(f"{option} is empty: give the folder to write")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutDirError(f"{option} {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not is_output_of(out, kind) and not force:
        raise OutDirError(f"{option} {out}: the folder holds other files, not an earlier `topas {kind}` output; "
                          f"it would be replaced as a whole: give an empty or new folder, or --force to replace it")
    base = out
    while not base.exists():
        if base.parent == base:
            break
        base = base.parent
    if not base.is_dir():
        raise OutDirError(f"{option} {out}: {base} is not a directory")
    try:
        tempfile.TemporaryDirectory(prefix=".topas-write-check-", dir=base).cleanup()
    except OSError as e:
        raise OutDirError(f"{option} {out}: cannot write in {base}: {e.strerror or e}") from None
    return out


def check_out_file(out: Path | str, schema_prefix: str, force: bool = False, option: str = "--out") -> Path:
    """Refuse (:class:`OutDirError`) an output *file* that is empty, a folder, or an existing file
    that is not an earlier topas output (a JSON object whose ``schema`` starts with
    ``schema_prefix``, e.g. ``topas.profile/``) unless ``force``; return it as a ``Path``."""
    if str(out).strip() == "":
        raise OutDirError(f"{option} is empty: give the file to write")
    out = Path(out)
    if out.is_dir():
        raise OutDirError(f"{option} {out}: is a directory, not a file")
    if out.exists() and not force:
        try:
            d = json.loads(out.read_text())
            ours = isinstance(d, dict) and str(d.get("schema", "")).startswith(schema_prefix)
        except (OSError, ValueError):
            ours = False
        if not ours:
            raise OutDirError(f"{option} {out}: the file exists and is not an earlier {schema_prefix}* file; give "
                              f"a new name, or --force to overwrite it")
    return out
