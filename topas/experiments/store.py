"""The results store: one directory of Parquet tables per experiment, keyed by its key.

Layout (``root`` defaults to ``data/results/store``)::

    <root>/<key[:2]>/<key>/tasks.parquet          the SimResult tables, zstd-compressed
                           requests.parquet
                           decisions.parquet
                           prefix_events.parquet
                           timeline.parquet
                           meta.json              spec, key, canonical inputs, summary, provenance

``key`` is :meth:`topas.experiments.Experiment.key`, which covers everything a result depends on
(trace bytes, resolved parameters, resolved rate, seed, profile numbers, engine, and the source
code of the engine, policies and workload packages), so a changed trace, profile, parameter or
line of that code gets a new key and never reuses a stale result.

Writes are atomic: :meth:`ResultStore.put` writes every file into ``<root>/.tmp-<key>-<pid>``
(``meta.json`` last), then renames that directory to its final place. A directory without
``meta.json`` (or a left-over ``.tmp-*``) is never taken as a result. A killed sweep therefore
loses at most the runs in flight; :func:`run_sweep` re-run on the same store runs only the
experiments that are missing. Each worker process writes its own result, so results already
finished survive the parent being killed.

``meta.json`` also records ``topas_version``, ``git_commit`` (``git rev-parse HEAD`` of the
repository, ``"unknown"`` outside git), ``git_dirty`` (whether the working tree had changes),
``environment`` (:func:`topas.provenance.environment`: the versions of Python, numpy, pandas,
pyarrow, matplotlib, seaborn, networkx and topas, commit and dirty flag), ``profile_hash``,
``engine`` and ``created`` (UTC, ISO 8601). The key itself covers the code
(:func:`topas.provenance.engine_fingerprint`), so a result of edited code is never served for
the committed code, nor the reverse.

**Shipped results (packs).** The repository ships the results of the full grid as read-only
*packs*, one per engine: ``data/results/sim/`` (and ``data/results/sglang/`` once GPU-box runs
are committed), laid out like a store plus a ``manifest.json`` (``scripts/pack_results.py``
writes them). The default store (``ResultStore()``) looks in ``data/results/store`` first and then
in the packs, so a fresh clone re-renders every figure without simulating; new results are always
written to ``data/results/store``, never into a pack. To keep the repository small a pack holds
every experiment's summary and ``tasks`` table, the ``requests`` table of arrival seed 0, and every
table only of the experiments whose full tables the notebooks read (``scripts/pack_results.py``);
loading a table a pack left out raises :class:`TrimmedResult`, naming it.

**Verified on read (issue 44).** ``meta.json`` records the sha256 and size of every table
(``"checksums"``); a result is checked before it is served (:mod:`topas.experiments.verify`, once
per process while its files are unchanged): a table missing, damaged, truncated or swapped, or an
unreadable ``meta.json``, makes it *damaged*: a :class:`DamagedResultWarning` names it and it is
treated as absent (:meth:`ResultStore.has` is False, a sweep re-runs it and :meth:`ResultStore.put`
replaces it). Results written before the checksums (the shipped pack) are checked structurally:
every table they should hold (all of them, or those the pack's manifest lists) is present and a
whole Parquet file. :meth:`ResultStore.put` also removes the temporary folders of writers that
were killed (:meth:`ResultStore.clean_tmp`).

**Store-only mode.** With ``$TOPAS_STORE_ONLY=1`` (``make figures`` sets it) :func:`run_sweep`
runs nothing: a missing result raises :class:`MissingResults` naming the experiments.
``$TOPAS_STORE_LOG=<file>`` appends ``sweep <key>`` for every experiment a sweep returns
(``summary <key>`` for a sweep that uses only the summaries: ``run_sweep(..., tables=False)``) and
``load <key>`` for every full load, which is how ``scripts/pack_results.py`` learns what to ship.
``$TOPAS_STORE=<dir>`` moves the default store's root (the working store) elsewhere.
``$TOPAS_USE_PACKS=0`` makes the default store ignore the packs (``make reproduce`` sets it, so a
reproduction simulates everything instead of reading the shipped results).
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from topas.engines import get_engine
# run_experiment is looked up in this module at each run, so a test can count or slow a sweep's runs
# (monkeypatch store.run_experiment); it is defined once, in spec.
from topas.experiments.spec import ENGINES, KNOWLEDGE_FIELDS, Experiment, run_experiment
from topas.provenance import environment, git_commit, git_dirty

__all__ = [
    "DamagedResultWarning",
    "MissingResults",
    "ResultStore",
    "TABLES",
    "TrimmedResult",
    "default_packs",
    "default_store_root",
    "git_commit",
    "ensure_stored",
    "run_sweep",
]

#: The columns :meth:`ResultStore.summaries` adds to a summary row: where the result came from.
PROVENANCE_COLUMNS = ("topas_version", "git_commit", "git_dirty", "profile_hash", "created")
#: The SimResult tables the store keeps, one Parquet file each.
TABLES = ("tasks", "requests", "decisions", "prefix_events", "timeline")
META = "meta.json"
MANIFEST = "manifest.json"
_TMP_PREFIX = ".tmp-"
#: Engines whose shipped packs the default store reads, in this order (``data/results/<engine>``):
#: the engines an experiment may name (the simulator first).
PACK_ENGINES = ENGINES
STORE_ONLY_ENV = "TOPAS_STORE_ONLY"
STORE_ENV = "TOPAS_STORE"
STORE_LOG_ENV = "TOPAS_STORE_LOG"
USE_PACKS_ENV = "TOPAS_USE_PACKS"


class MissingResults(LookupError):
    """Store-only mode (``$TOPAS_STORE_ONLY``) and a sweep needs results the store lacks."""


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


def _pack_tables(pack: Path) -> dict[str, list[str]]:
    """The tables a pack's manifest says it kept, by key (``{}`` if it lists none)."""
    return _pack_tables_cached(str(pack), (pack / MANIFEST).stat().st_mtime_ns if (pack / MANIFEST).is_file() else 0)


@functools.lru_cache(maxsize=8)
def _pack_tables_cached(pack: str, _mtime: int) -> dict[str, list[str]]:
    try:
        manifest = json.loads((Path(pack) / MANIFEST).read_text())
        return {e["key"]: list(e.get("tables", [])) for e in manifest.get("experiments", [])}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}


def default_store_root() -> Path:
    """``$TOPAS_STORE`` when set, else ``data/results/store`` (under ``$TOPAS_DATA`` when set)."""
    from topas.paths import data_dir

    root = os.environ.get(STORE_ENV, "").strip()
    return Path(root) if root else data_dir() / "results" / "store"


def default_packs() -> list[Path]:
    """The shipped read-only packs that exist: ``data/results/<engine>`` for each engine; none
    when ``$TOPAS_USE_PACKS=0`` (``make reproduce`` sets it, so that it simulates everything)."""
    from topas.paths import data_dir

    if os.environ.get(USE_PACKS_ENV, "1") == "0":
        return []
    packs = [data_dir() / "results" / engine for engine in PACK_ENGINES]
    return [p for p in packs if (p / MANIFEST).is_file()]


def _log(kind: str, key: str) -> None:
    path = os.environ.get(STORE_LOG_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{kind} {key}\n")


def _row(meta: dict[str, Any], provenance: bool = True) -> dict[str, Any]:
    """One summary row from a meta.json, laid out like :func:`topas.experiments.local.run_row`
    plus (``provenance=True``) the provenance columns."""
    spec = meta["experiment"]
    row: dict[str, Any] = {"key": meta["key"]}
    for k in ("workload", "policy", "params", "profile", "engine", "kv_budget", "load"):
        row[k] = spec[k]
    row["engine_model"] = spec.get("engine_model", "stock")
    row["rate_given"] = spec["rate"]
    row["rate"] = meta["canonical"]["rate"]
    row["seed"] = spec["seed"]
    row["n_tasks_limit"] = spec["n_tasks"]
    for k, default in KNOWLEDGE_FIELDS.items():  # absent from results stored before issue 16
        row[k] = spec.get(k, default)
    summary = dict(meta["summary"])
    summary.pop("policy", None)
    row.update(summary)
    if provenance:
        for k in PROVENANCE_COLUMNS:
            row[k] = meta.get(k)
    return row


class ResultStore:
    """Results of experiments on disk, keyed by :meth:`Experiment.key` (see the module docstring)."""

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
        pack. A damaged one (module docstring) is skipped, with a :class:`DamagedResultWarning`."""
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
            kept = _pack_tables(base).get(d.name)
            if kept is not None:
                return [f"{t}.parquet" for t in kept]
        return None

    def problem(self, d: Path) -> str | None:
        """What is wrong with the stored result in ``d`` (:func:`topas.experiments.verify.result_problem`),
        or None; a problem is warned about once per process."""
        from topas.experiments.verify import result_problem

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
        from topas.engine.metrics import SimResult

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
        _log("load", meta["key"])
        tables = {name: pd.read_parquet(d / f"{name}.parquet") for name in TABLES}
        return SimResult(summary=dict(meta["summary"]), **tables)

    def load_table(self, key_or_exp: str | Experiment, table: str) -> pd.DataFrame:
        """One stored table (it may come from a trimmed pack, as long as the pack kept it)."""
        if table not in TABLES:
            raise ValueError(f"unknown table {table!r}; tables: {', '.join(TABLES)}")
        meta = self.meta(key_or_exp)
        _log("table", f"{meta['key']} {table}")  # a pack ships every table a notebook reads
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
        kept = _pack_tables(base).get(d.name)
        return kept is not None and not set(missing) & set(kept)

    def rows(self, keys: Iterable[str]) -> list[dict[str, Any]]:
        """The summary rows of ``keys`` in that order, laid out exactly like
        :func:`topas.experiments.local.run_row` (no provenance columns)."""
        return [_row(self.meta(k), provenance=False) for k in keys]

    def summaries(self, keys: Iterable[str] | None = None) -> pd.DataFrame:
        """One row per stored experiment (all of them sorted by key, or ``keys`` in that order):
        the spec, ``key``, the resolved ``rate``, the summary and the provenance columns."""
        ks = [k for k in self.keys() if self.locate(k) is not None] if keys is None else list(keys)
        return pd.DataFrame([_row(self.meta(k)) for k in ks])

    # ------------------------------------------------------------------ writing
    def put(self, exp: Experiment, result: Any) -> Path:
        """Store ``result`` (a SimResult) of ``exp`` atomically and return its directory.

        When a complete result is already there (e.g. another process just wrote it) it is kept
        and the new one dropped; an incomplete directory (no ``meta.json``) is replaced.
        """
        from topas.experiments.verify import CHECKSUMS, table_checksums

        key = exp.key()
        final = self.path(key)
        self.clean_tmp()
        tmp = self.root / f"{_TMP_PREFIX}{key}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        try:
            for name in TABLES:
                getattr(result, name).to_parquet(tmp / f"{name}.parquet", index=False, compression="zstd")
            checksums = table_checksums(tmp, [f"{name}.parquet" for name in TABLES])
            canonical = exp.canonical()
            meta = {
                "key": key,
                "label": exp.label(),
                "experiment": exp.fields(),
                "canonical": canonical,
                "summary": dict(result.summary),
                "topas_version": _version(),
                "git_commit": git_commit(),
                "git_dirty": git_dirty(),
                "environment": environment(),
                "profile_hash": canonical["profile_hash"],
                "engine": exp.engine,
                "created": _dt.datetime.now(_dt.timezone.utc).isoformat(),
                CHECKSUMS: checksums,
            }
            with open(tmp / META, "w") as f:  # last: its presence marks the result complete
                json.dump(meta, f, indent=1, default=_json_default)  # insertion order: the summary keeps its column order
                f.flush()
                os.fsync(f.fileno())
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
        for p in self.root.glob(f"{_TMP_PREFIX}*"):
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
            if p.name.startswith(_TMP_PREFIX) and p.is_dir():
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


def experiment_of(meta: dict[str, Any]) -> Experiment:
    """The :class:`Experiment` a stored result's ``meta.json`` describes: its spec, the knowledge
    settings (defaults when the result predates them), for the simulator the engine options (the
    fields of its ``engine_config`` that differ from the default, stock-SGLang one) and, for a
    cluster, its engines, router and router parameters (issue 15). Its key
    equals the stored one exactly when nothing it depends on (inputs or code) has changed."""
    import dataclasses

    from topas.engine.config import EngineConfig

    s = meta["experiment"]
    opts: dict[str, Any] = {}
    if s["engine"] in ENGINES and get_engine(s["engine"]).options:  # the simulator's engine options
        default = json.loads(json.dumps(dataclasses.asdict(EngineConfig())))
        stored = meta["canonical"].get("engine_config") or {}
        opts = {k: v for k, v in stored.items() if k in default and default[k] != v and k != "kv_budget"}
    # a spec has the cluster columns only for a cluster (Experiment.spec); router_params as JSON, as params
    cluster = ({"engines": s["engines"], "router": s["router"], "router_params": json.loads(s["router_params"])}
               if "router" in s else {})
    return Experiment(s["workload"], s["policy"], json.loads(s["params"]), profile=s["profile"], rate=s["rate"],
                      load=s["load"], seed=s["seed"], n_tasks=s["n_tasks"], engine=s["engine"],
                      kv_budget=s["kv_budget"], engine_options=opts,
                      **{k: s.get(k, v) for k, v in KNOWLEDGE_FIELDS.items()}, **cluster)


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


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    return str(o)


def _version() -> str:
    import topas

    return getattr(topas, "__version__", "unknown")


# ----------------------------------------------------------------------------- sweeps


def run_and_store(exp: Experiment, root: str) -> str:
    """Run ``exp`` and write its result into the store at ``root`` (in this process); return
    its key. This is what a sweep's worker runs, so a finished run is on disk even if the
    process that started the sweep dies."""
    store = ResultStore(root)
    if not store.has(exp):
        store.put(exp, run_experiment(exp))
    return exp.key()


def run_sweep(
    experiments: Iterable[Experiment],
    store: ResultStore | str | os.PathLike[str] | None = None,
    jobs: int | None = None,
    progress: bool = True,
    desc: str = "sweep",
    ray_address: str | None = None,
    tables: bool = True,
) -> pd.DataFrame:
    """Run the experiments that ``store`` does not hold yet and return the summaries of all of
    them (one row per experiment, in the input order; see :meth:`ResultStore.summaries`).
    ``tables=False`` says the caller uses the summaries only: a pack then ships these
    experiments' ``meta.json`` without their tables (notebook 12's ~1,000 runs).

    Every spec is checked first (a bad workload, policy, parameter or profile raises its own
    error before anything runs). Experiments with equal keys run once. ``jobs``: worker processes
    (``None``: one per CPU core; ``1``: in this process). ``ray_address`` (or
    ``$TOPAS_RAY_ADDRESS``): run on Ray instead (:mod:`topas.experiments.ray_backend`); each result
    is written here, by this process, as it arrives. Experiments on the ``sglang`` engine always
    run one at a time, in this process: they share one server. A failing experiment stops the sweep
    with :class:`topas.experiments.ExperimentFailed` naming it; results already stored are kept,
    so re-running the sweep resumes where it stopped (so does a sweep stopped by Ctrl-C).
    """
    store, keys = ensure_stored(experiments, store, jobs, progress, desc, ray_address, "run_sweep",
                                log="sweep" if tables else "summary")
    return store.summaries(keys)


def ensure_stored(
    experiments: Iterable[Experiment],
    store: ResultStore | str | os.PathLike[str] | None = None,
    jobs: int | None = None,
    progress: bool = True,
    desc: str = "sweep",
    ray_address: str | None = None,
    caller: str = "run_sweep",
    log: str = "sweep",
) -> tuple[ResultStore, list[str]]:
    """Run what ``store`` lacks of ``experiments`` (each result stored as it finishes) and return
    the store and the experiments' keys in the input order: the engine of :func:`run_sweep` and
    :func:`topas.experiments.run_many`. On several workers the runs start longest first
    (:func:`topas.experiments.run_cost.longest_first`, priced by the plan's measured costs when
    the store holds them), so a sweep does not end on one long run with a core idle."""
    from topas.experiments.dispatch import check_sweep, map_experiments, workers
    from topas.experiments.ray_backend import map_experiments_ray

    if not isinstance(store, ResultStore):
        store = ResultStore(store)
    exps, jobs = check_sweep(experiments, jobs, caller)
    todo: list[Experiment] = []
    seen: set[str] = set()
    for e in exps:  # input order; ``seen`` is only a membership test
        k = e.key()
        if k not in seen and not store.has(k):
            todo.append(e)
        seen.add(k)
    if todo and os.environ.get(STORE_ONLY_ENV, "") not in ("", "0"):
        names = "\n  ".join(e.label() for e in todo[:10]) + ("\n  ..." if len(todo) > 10 else "")
        raise MissingResults(
            f"{len(todo)} experiment(s) are not in the results store ({store.root}"
            f"{' or the shipped packs' if store.packs else ''}) and ${STORE_ONLY_ENV} forbids running "
            f"them:\n  {names}\nRun `make reproduce` (or unset {STORE_ONLY_ENV}) to simulate them.")
    if todo:
        store.root.mkdir(parents=True, exist_ok=True)
        jobs, address = workers(todo, jobs, ray_address)
        if jobs > 1 or address is not None:  # several workers: the longest runs first
            from topas.experiments.run_cost import cached_costs, longest_first

            todo = longest_first(todo, cached_costs(store.root))  # the plan's costs, if measured
        if address is not None:
            map_experiments_ray(run_experiment, todo, address, progress=progress, desc=desc,
                                on_result=store.put)
        else:
            fn = functools.partial(run_and_store, root=str(store.root))
            map_experiments(fn, todo, jobs=min(jobs, len(todo)), progress=progress, desc=desc)
    keys = [e.key() for e in exps]
    for k in keys:
        _log(log, k)
    return store, keys
