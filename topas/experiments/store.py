"""The results store: one directory of Parquet tables per experiment, keyed by its key.

Layout (``root`` defaults to ``data/results/store``)::

    <root>/<key[:2]>/<key>/tasks.parquet          the SimResult tables, zstd-compressed
                           requests.parquet
                           decisions.parquet
                           prefix_events.parquet
                           timeline.parquet
                           meta.json              spec, key, canonical inputs, summary, provenance

``key`` is :meth:`topas.experiments.Experiment.key`, which covers everything a result depends on
(trace bytes, resolved parameters, resolved rate, seed, profile numbers, engine), so a changed
trace, profile or parameter gets a new key and never reuses a stale result.

Writes are atomic: :meth:`ResultStore.put` writes every file into ``<root>/.tmp-<key>-<pid>``
(``meta.json`` last), then renames that directory to its final place. A directory without
``meta.json`` (or a left-over ``.tmp-*``) is never taken as a result. A killed sweep therefore
loses at most the runs in flight; :func:`run_sweep` re-run on the same store runs only the
experiments that are missing. Each worker process writes its own result, so results already
finished survive the parent being killed.

``meta.json`` also records ``topas_version``, ``git_commit`` (``git rev-parse HEAD`` of the
repository, ``"unknown"`` outside git), ``profile_hash``, ``engine`` and ``created`` (UTC, ISO 8601).
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from topas.experiments.spec import Experiment

__all__ = ["ResultStore", "TABLES", "default_store_root", "git_commit", "run_sweep"]

#: The SimResult tables the store keeps, one Parquet file each.
TABLES = ("tasks", "requests", "decisions", "prefix_events", "timeline")
META = "meta.json"
_TMP_PREFIX = ".tmp-"


def default_store_root() -> Path:
    """``data/results/store`` (under ``$TOPAS_DATA`` when set)."""
    from topas.paths import data_dir

    return data_dir() / "results" / "store"


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """``git rev-parse HEAD`` of the repository the package runs from, or ``"unknown"``."""
    from topas.paths import REPO_ROOT

    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and len(sha) == 40 else "unknown"


def _row(meta: dict[str, Any]) -> dict[str, Any]:
    """One summary row from a meta.json, laid out like :func:`topas.experiments.local.run_row`
    plus the provenance columns."""
    spec = meta["experiment"]
    row: dict[str, Any] = {"key": meta["key"]}
    for k in ("workload", "policy", "params", "profile", "engine", "kv_budget", "load"):
        row[k] = spec[k]
    row["rate_given"] = spec["rate"]
    row["rate"] = meta["canonical"]["rate"]
    row["seed"] = spec["seed"]
    row["n_tasks_limit"] = spec["n_tasks"]
    summary = dict(meta["summary"])
    summary.pop("policy", None)
    row.update(summary)
    for k in ("topas_version", "git_commit", "profile_hash", "created"):
        row[k] = meta[k]
    return row


class ResultStore:
    """Results of experiments on disk, keyed by :meth:`Experiment.key` (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root) if root is not None else default_store_root()

    def __repr__(self) -> str:
        return f"ResultStore({str(self.root)!r})"

    # ------------------------------------------------------------------ paths
    def path(self, key_or_exp: str | Experiment) -> Path:
        """The final directory of a key (or an experiment's key); it may not exist."""
        key = key_or_exp.key() if isinstance(key_or_exp, Experiment) else key_or_exp
        if not isinstance(key, str) or len(key) < 3 or not key.isalnum():
            raise ValueError(f"not an experiment key: {key!r}")
        return self.root / key[:2] / key

    # ------------------------------------------------------------------ queries
    def has(self, key_or_exp: str | Experiment) -> bool:
        """Whether a complete result is stored (its directory holds ``meta.json``)."""
        return (self.path(key_or_exp) / META).is_file()

    def keys(self) -> list[str]:
        """Keys of the complete results, sorted."""
        if not self.root.is_dir():
            return []
        out = []
        for shard in sorted(self.root.iterdir()):
            if not shard.is_dir() or shard.name.startswith("."):
                continue
            for d in sorted(shard.iterdir()):
                if d.is_dir() and not d.name.startswith(".") and (d / META).is_file():
                    out.append(d.name)
        return out

    def meta(self, key_or_exp: str | Experiment) -> dict[str, Any]:
        """The stored ``meta.json``; ``KeyError`` naming the experiment when not stored."""
        p = self.path(key_or_exp) / META
        if not p.is_file():
            what = key_or_exp.label() if isinstance(key_or_exp, Experiment) else key_or_exp
            raise KeyError(f"no result for {what} in {self.root}")
        return json.loads(p.read_text())

    def load(self, key_or_exp: str | Experiment):
        """The stored result as a :class:`~topas.engine.metrics.SimResult` (tables from Parquet,
        ``summary`` from ``meta.json``)."""
        from topas.engine.metrics import SimResult

        meta = self.meta(key_or_exp)
        d = self.path(key_or_exp)
        tables = {name: pd.read_parquet(d / f"{name}.parquet") for name in TABLES}
        return SimResult(summary=dict(meta["summary"]), **tables)

    def summaries(self, keys: Iterable[str] | None = None) -> pd.DataFrame:
        """One row per stored experiment (all of them sorted by key, or ``keys`` in that order):
        the spec, ``key``, the resolved ``rate``, the summary and the provenance columns."""
        ks = self.keys() if keys is None else list(keys)
        return pd.DataFrame([_row(self.meta(k)) for k in ks])

    # ------------------------------------------------------------------ writing
    def put(self, exp: Experiment, result: Any) -> Path:
        """Store ``result`` (a SimResult) of ``exp`` atomically and return its directory.

        When a complete result is already there (e.g. another process just wrote it) it is kept
        and the new one dropped; an incomplete directory (no ``meta.json``) is replaced.
        """
        key = exp.key()
        final = self.path(key)
        tmp = self.root / f"{_TMP_PREFIX}{key}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        try:
            for name in TABLES:
                getattr(result, name).to_parquet(tmp / f"{name}.parquet", index=False, compression="zstd")
            canonical = exp.canonical()
            meta = {
                "key": key,
                "label": exp.label(),
                "experiment": exp.fields(),
                "canonical": canonical,
                "summary": dict(result.summary),
                "topas_version": _version(),
                "git_commit": git_commit(),
                "profile_hash": canonical["profile_hash"],
                "engine": exp.engine,
                "created": _dt.datetime.now(_dt.timezone.utc).isoformat(),
            }
            with open(tmp / META, "w") as f:  # last: its presence marks the result complete
                json.dump(meta, f, indent=1, default=_json_default)  # insertion order: the summary keeps its column order
                f.flush()
                os.fsync(f.fileno())
            final.parent.mkdir(parents=True, exist_ok=True)
            if final.exists():
                if (final / META).is_file():
                    shutil.rmtree(tmp)
                    return final
                shutil.rmtree(final)  # an incomplete result: never served, replace it
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


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


def run_experiment(exp: Experiment):
    """Run one experiment (module-level so tests can count or slow the runs)."""
    from topas.experiments.spec import run_experiment as _run

    return _run(exp)


def run_sweep(
    experiments: Iterable[Experiment],
    store: ResultStore | str | os.PathLike[str] | None = None,
    jobs: int | None = None,
    progress: bool = True,
    desc: str = "sweep",
    ray_address: str | None = None,
) -> pd.DataFrame:
    """Run the experiments that ``store`` does not hold yet and return the summaries of all of
    them (one row per experiment, in the input order; see :meth:`ResultStore.summaries`).

    Every spec is checked first (a bad workload, policy, parameter or profile raises its own
    error before anything runs). Experiments with equal keys run once. ``jobs``: worker processes
    (``None``: one per CPU core; ``1``: in this process). ``ray_address`` (or
    ``$TOPAS_RAY_ADDRESS``): run on Ray instead (:mod:`topas.experiments.ray_backend`); each result
    is written here, by this process, as it arrives. A failing experiment stops the sweep
    with :class:`topas.experiments.ExperimentFailed` naming it; results already stored are kept,
    so re-running the sweep resumes where it stopped.
    """
    from topas.experiments.local import check_sweep, map_experiments
    from topas.experiments.ray_backend import map_experiments_ray, resolve_address

    if not isinstance(store, ResultStore):
        store = ResultStore(store)
    exps, jobs = check_sweep(experiments, jobs, "run_sweep")
    todo: list[Experiment] = []
    seen: set[str] = set()
    for e in exps:  # input order; ``seen`` is only a membership test
        k = e.key()
        if k not in seen and not store.has(k):
            todo.append(e)
        seen.add(k)
    if todo:
        store.root.mkdir(parents=True, exist_ok=True)
        address = resolve_address(ray_address)
        if address is not None:
            map_experiments_ray(run_experiment, todo, address, progress=progress, desc=desc,
                                on_result=store.put)
            return store.summaries([e.key() for e in exps])
        fn = functools.partial(run_and_store, root=str(store.root))
        map_experiments(fn, todo, jobs=min(jobs, len(todo)), progress=progress, desc=desc)
    return store.summaries([e.key() for e in exps])
