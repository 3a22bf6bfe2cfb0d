"""The results store itself: :class:`ResultStore`, one directory of Parquet tables per experiment,
keyed by :meth:`Experiment.key`, read from a working store and the shipped packs
(:mod:`topas.experiments.store` describes the layout, the atomic writes, the packs and the checks
on read).
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from topas.engine.metrics import SimResult
from topas.experiments.spec import Experiment
from topas.experiments.store_layout import (
    META,
    TABLES,
    TMP_PREFIX,
    default_packs,
    default_store_root,
    log,
    pack_tables,
)
from topas.experiments.store_meta import result_meta, summary_row, write_meta
from topas.experiments.verify import result_problem, table_checksums

__all__ = ["DamagedResultWarning", "ResultStore", "TrimmedResult"]


class TrimmedResult(LookupError):
    """A shipped pack holds this experiment, but not the table asked for."""


class DamagedResultWarning(UserWarning):
    """A stored result failed its check (:mod:`topas.experiments.verify`) and is treated as absent."""


#: Verdicts of :func:`topas.experiments.verify.result_problem` by folder, valid while the folder's
#: files keep their sizes and modification times (a sweep asks about every result more than once).
_VERDICTS: dict[str, tuple[tuple, str | None]] = {}


def _stat_key(d: Path) -> tuple:
    try:
        return tuple(sorted((p.name, st.st_size, st.st_mtime_ns) for p in d.iterdir() for st in [p.stat()]))
    except OSError:
        return ()


class ResultStore:
    """Results of experiments on disk, keyed by :meth:`Experiment.key` (see :mod:`topas.experiments.store`)."""

    def __init__(self, root: str | os.PathLike[str] | None = None,
                 packs: Iterable[str | os.PathLike[str]] | None = None) -> None:
        """``root``: where results are written (default ``data/results/store``). ``packs``:
        read-only stores looked in after ``root`` (default: the shipped packs when ``root`` is
        the default, none when a ``root`` is given)."""
        self.root = Path(root) if root is not None else default_store_root()
        if packs is None:
            packs = default_packs() if root is None else []
        self.packs = [Path(p) for p in packs]

    def __repr__(self) -> str:
        extra = f", packs={[str(p) for p in self.packs]!r}" if self.packs else ""
        return f"ResultStore({str(self.root)!r}{extra})"

    def locate(self, key: str) -> Path | None:
        """The directory holding the complete, verified result of ``key``: in ``root``, else in a
        pack. A damaged one (:mod:`topas.experiments.store`) is skipped, with a
        :class:`DamagedResultWarning`."""
        for base in (self.root, *self.packs):
            d = base / key[:2] / key
            if (d / META).is_file() and self.problem(d) is None:
                return d
        return None

    def kept_tables(self, d: Path) -> list[str] | None:
        """The table files a pack's manifest says the result in ``d`` kept (None: not in a pack,
        or not listed: every table)."""
        base = d.parent.parent
        if base != self.root and base in self.packs:
            kept = pack_tables(base).get(d.name)
            if kept is not None:
                return [f"{t}.parquet" for t in kept]
        return None

    def problem(self, d: Path) -> str | None:
        """What is wrong with the stored result in ``d`` (:func:`topas.experiments.verify.result_problem`),
        or None; a problem is warned about once per process."""
        stamp = _stat_key(d)
        cached = _VERDICTS.get(str(d))
        if cached is not None and cached[0] == stamp:
            return cached[1]
        kept = self.kept_tables(d)
        problem = result_problem(d, kept if kept is not None else [f"{t}.parquet" for t in TABLES], kept=kept)
        _VERDICTS[str(d)] = (stamp, problem)
        if problem is not None:
            warnings.warn(f"the stored result {d.name[:12]} in {d.parent.parent} is damaged: {problem}; treated "
                          f"as absent (the next sweep runs it again)", DamagedResultWarning, stacklevel=3)
        return problem

    def damaged(self, key: str) -> str | None:
        """Why the result of ``key`` is damaged wherever it is stored (None: not damaged, or absent)."""
        for base in (self.root, *self.packs):
            d = base / key[:2] / key
            if (d / META).is_file():
                p = self.problem(d)
                if p is not None:
                    return f"{d}: {p}"
        return None

    # ------------------------------------------------------------------ paths
    def path(self, key_or_exp: str | Experiment) -> Path:
        """The final directory of a key (or an experiment's key); it may not exist."""
        key = key_or_exp.key() if isinstance(key_or_exp, Experiment) else key_or_exp
        if not isinstance(key, str) or len(key) < 3 or not key.isalnum():
            raise ValueError(f"not an experiment key: {key!r}")
        return self.root / key[:2] / key

    # ------------------------------------------------------------------ queries
    def has(self, key_or_exp: str | Experiment) -> bool:
        """Whether a complete, undamaged result is stored (its directory holds ``meta.json`` and
        its tables pass their check), here or in a pack."""
        return self.locate(self.path(key_or_exp).name) is not None

    def keys(self, packs: bool = True) -> list[str]:
        """Keys of the complete results, sorted (those in the packs too unless ``packs=False``)."""
        out: set[str] = set()
        for base in (self.root, *(self.packs if packs else ())):
            if not base.is_dir():
                continue
            for shard in base.iterdir():
                if not shard.is_dir() or shard.name.startswith("."):
                    continue
                out.update(d.name for d in shard.iterdir()
                           if d.is_dir() and not d.name.startswith(".") and (d / META).is_file())
        return sorted(out)

    def meta(self, key_or_exp: str | Experiment) -> dict[str, Any]:
        """The stored ``meta.json``; ``KeyError`` naming the experiment when not stored."""
        key = self.path(key_or_exp).name
        d = self.locate(key)
        if d is None:
            what = key_or_exp.label() if isinstance(key_or_exp, Experiment) else key_or_exp
            damaged = self.damaged(key)
            if damaged is not None:
                raise KeyError(f"the stored result of {what} is damaged ({damaged}); treated as absent: run it "
                               f"again (a sweep does)")
            raise KeyError(f"no result for {what} in {self.root}")
        return json.loads((d / META).read_text())

    def load(self, key_or_exp: str | Experiment):
        """The stored result as a :class:`~topas.engine.metrics.SimResult` (tables from Parquet,
        ``summary`` from ``meta.json``). :class:`TrimmedResult` when a pack left a table out."""
        meta = self.meta(key_or_exp)
        d = self.locate(meta["key"])
        missing = [name for name in TABLES if not (d / f"{name}.parquet").is_file()]
        if missing and not self._trimmed(d, missing):
            raise KeyError(f"the stored result {meta.get('label', meta['key'])} in {d} lacks {', '.join(missing)}"
                           f".parquet; run it again")
        if missing:
            raise TrimmedResult(
                f"the shipped results in {d.parent.parent} keep only the {', '.join(t for t in TABLES if t not in missing)}"
                f" table(s) of {meta.get('label', meta['key'])}; {', '.join(missing)} were left out to keep the "
                f"repository small. Run it again (run_sweep into data/results/store, or `make reproduce`) "
                f"to get every table.")
        log("load", meta["key"])
        tables = {name: pd.read_parquet(d / f"{name}.parquet") for name in TABLES}
        return SimResult(summary=dict(meta["summary"]), **tables)

    def load_table(self, key_or_exp: str | Experiment, table: str) -> pd.DataFrame:
        """One stored table (it may come from a trimmed pack, as long as the pack kept it)."""
        if table not in TABLES:
            raise ValueError(f"unknown table {table!r}; tables: {', '.join(TABLES)}")
        meta = self.meta(key_or_exp)
        log("table", f"{meta['key']} {table}")  # a pack ships every table a notebook reads
        p = self.locate(meta["key"]) / f"{table}.parquet"
        if not p.is_file():
            if not self._trimmed(p.parent, [table]):
                raise KeyError(f"the stored result {meta.get('label', meta['key'])} in {p.parent} lacks "
                               f"{table}.parquet; run it again")
            raise TrimmedResult(f"table {table!r} of {meta.get('label', meta['key'])} is not in {p.parent}")
        return pd.read_parquet(p)

    def _trimmed(self, d: Path, missing: list[str]) -> bool:
        """Whether the ``missing`` tables of the result in ``d`` were left out on purpose (a pack
        whose manifest does not list them), not lost."""
        base = d.parent.parent
        if base not in self.packs:
            return False
        kept = pack_tables(base).get(d.name)
        return kept is not None and not set(missing) & set(kept)

    def rows(self, keys: Iterable[str]) -> list[dict[str, Any]]:
        """The summary rows of ``keys`` in that order, laid out exactly like
        :func:`topas.experiments.local.run_row` (no provenance columns)."""
        return [summary_row(self.meta(k), provenance=False) for k in keys]

    def summaries(self, keys: Iterable[str] | None = None) -> pd.DataFrame:
        """One row per stored experiment (all of them sorted by key, or ``keys`` in that order):
        the spec, ``key``, the resolved ``rate``, the summary and the provenance columns."""
        ks = [k for k in self.keys() if self.locate(k) is not None] if keys is None else list(keys)
        return pd.DataFrame([summary_row(self.meta(k)) for k in ks])

    # ------------------------------------------------------------------ writing
    def put(self, exp: Experiment, result: Any) -> Path:
        """Store ``result`` (a SimResult) of ``exp`` atomically and return its directory.

        When a complete result is already there (e.g. another process just wrote it) it is kept
        and the new one dropped; an incomplete directory (no ``meta.json``) is replaced.
        """
        key = exp.key()
        final = self.path(key)
        self.clean_tmp()
        tmp = self.root / f"{TMP_PREFIX}{key}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        try:
            for name in TABLES:
                getattr(result, name).to_parquet(tmp / f"{name}.parquet", index=False, compression="zstd")
            checksums = table_checksums(tmp, [f"{name}.parquet" for name in TABLES])
            write_meta(tmp / META, result_meta(exp, result, checksums))  # last: its presence marks the result complete
            final.parent.mkdir(parents=True, exist_ok=True)
            if final.exists():
                if (final / META).is_file() and self.problem(final) is None:
                    shutil.rmtree(tmp)
                    return final
                shutil.rmtree(final)  # an incomplete or damaged result: never served, replace it
            try:
                os.rename(tmp, final)
            except OSError:
                if (final / META).is_file():  # lost a race to another writer of the same key
                    shutil.rmtree(tmp, ignore_errors=True)
                    return final
                raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final

    def clean_tmp(self) -> list[Path]:
        """Remove the temporary folders (``.tmp-<key>-<pid>``) of writers no longer running (a
        killed sweep's); return them. :meth:`put` calls it before every write."""
        removed: list[Path] = []
        if not self.root.is_dir():
            return removed
        for p in self.root.glob(f"{TMP_PREFIX}*"):
            pid = p.name.rsplit("-", 1)[-1]
            if p.is_dir() and not (pid.isdigit() and _alive(int(pid))):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
        return removed

    def clean(self) -> list[Path]:
        """Remove left-over temporary directories (``.tmp-*``) of processes no longer running and
        result directories without ``meta.json``; return what was removed."""
        removed: list[Path] = []
        if not self.root.is_dir():
            return removed
        for p in sorted(self.root.iterdir()):
            if p.name.startswith(TMP_PREFIX) and p.is_dir():
                pid = p.name.rsplit("-", 1)[-1]
                if pid.isdigit() and _alive(int(pid)):
                    continue
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
            elif p.is_dir() and not p.name.startswith("."):
                for d in sorted(p.iterdir()):
                    if d.is_dir() and not (d / META).is_file():
                        shutil.rmtree(d, ignore_errors=True)
                        removed.append(d)
        return removed

def _alive(pid: int) -> bool:
    """Whether process ``pid`` is running: a zombie (exited, not yet reaped: a killed sweep's
    worker whose new parent does not reap it, as in some containers) is not."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """``pid``'s state is Z in ``/proc/<pid>/stat`` (False where there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] == b"Z"  # the state follows the command name's ")"
