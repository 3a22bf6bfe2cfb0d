#!/usr/bin/env python3
"""Pack the results the figures need into ``data/results/<engine>/``, the results shipped with
the repository (``make pack``; run it after ``make reproduce``, then commit the pack).

What goes in: every experiment the notebooks' sweeps return (they are executed here in
store-only mode, with ``$TOPAS_STORE_LOG`` recording what they touch, so nothing is simulated
and a missing result fails, naming it), with its ``meta.json`` (spec, summary, provenance) and
its per-task table; the per-request table of every experiment with arrival seed 0 and the
default knowledge settings on the default engine, so every configuration of the figures' grids
ships per-request detail for one seed (the other seeds are replicas with other arrival draws;
the MetaGPT and synthetic-workload runs are left out of this (:data:`NO_REQUEST_DETAIL`; the pack's 50 MB; runs a notebook loads in full keep every table); the MetaGPT ones'
per-request tables were 14 MB of the 50, and the protocol's ~1,600 summaries needed the room;
notebook 14's degraded-knowledge variants and the engine variants, such as notebook 11's legacy
model, the host tier and the cache study's prefixes-only cache, ship their tasks only, and so do
the eviction study's screen (:func:`eviction_study_keys`: notebook 15 reads its runs' summaries and
tasks; the per-request tables of its default-engine cells would take the pack over 50 MB)); the
eviction study's full-length stage ships its summaries only, its meta.json compact (every packed
meta.json is compact and keeps the checksums of the tables the pack ships only, none for a
summary-only run: :func:`packed_meta`) (its sweep uses
their summaries, ``tables=False``, and its stability is read from the cached evidence,
``data/results/protocol/evidence.csv``, as the protocol's runs'; their tasks tables would be ~24 MB); and every table of the experiments the
notebooks load in full (mechanism and overhead), and every table a notebook reads one by one
(``ResultStore.load_table``: the store log's ``table`` lines, :func:`read_tables`; notebook 06
reads the decisions of its plan runs). Experiments whose sweeps use only their summaries
(``run_sweep(..., tables=False)``: notebook 12's capacity probes, operating points and ~1,000
runs over the space of readings) ship their ``meta.json`` alone, which holds the summary and the
stability indicators. All tables of all runs would be over 70 MB (the MetaGPT runs have ~4,000
requests each); the issue's limit is 50 MB. Results of other engines are left out (``--engine``
picks one).

``manifest.json`` lists every experiment (key, label, engine, the tables shipped, the commit that
produced it, whether its tree was dirty, its code fingerprint) with the package version, the
commit at packing time, the environment (Python and library versions) and the pack's size. The pack
is written beside the old one and swapped in with renames, so an interrupted run leaves the old
pack whole; a pack over ``--max-mb`` (default 50) is refused.

**Provenance.** The pack is refused, with the changes listed, when the working tree is dirty
(changes outside ``figures/`` and ``data/results/``, the folders a reproduction writes:
:func:`topas.provenance.dirty_entries`) or when any result to pack was produced from a dirty tree
(its ``meta.json`` ``git_dirty``): the shipped results must come from committed code. For an
experiment, ``--allow-dirty`` packs anyway and says so in the manifest (``allow_dirty``,
``tree_dirty``, ``dirty_entries``).

Measured results (``--engine sglang``) are packed from what the store holds of the chosen grid
(``--grid full|quick|gpu-afternoon``, :func:`studies.grid.named_grid`), without running
the notebooks and without a server (the keys use the server identity the stored replays record):
a GPU box that ran part of a grid ships that part; the manifest says how much of the grid it is.

Usage: ``python scripts/pack_results.py [--engine sim] [--grid G] [--max-mb 50] [--log FILE] [--allow-dirty]``
(``--log`` reuses a store log from an earlier notebook run instead of executing the notebooks).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from topas.experiments.store import (  # noqa: E402
    MANIFEST,
    META,
    STORE_LOG_ENV,
    STORE_ONLY_ENV,
    TABLES,
    ResultStore,
    git_commit,
)
from topas.experiments.verify import CHECKSUMS  # noqa: E402
from topas.provenance import OUTPUT_PATHS, dirty_entries, environment  # noqa: E402

SCHEMA = "topas.results-pack/1"


#: The knowledge settings of an experiment that the figures' grids use (notebook 14 degrades them).
DEFAULT_KNOWLEDGE = {"prior_noise": 0.0, "prior_bias": 1.0, "dag_visibility": "full", "arrivals": "poisson"}
#: The engine model of the default engine (an experiment's ``engine_model`` field); engine variants
#: (notebook 11's legacy model, the host tier, the cache study's prefixes-only cache) ship tasks only.
DEFAULT_ENGINE_MODEL = "stock"


#: Workload-name prefixes whose runs ship no per-request table unless a notebook loads them in full.
NO_REQUEST_DETAIL = ("metagpt-", "dag-10-wide", "dag-4", "chain-")


def shipped_tables(experiment: dict, loaded: bool, summary_only: bool = False, tasks_only: bool = False) -> list[str]:
    """The tables a pack keeps of one experiment (its ``meta.json`` ``experiment`` fields; see the
    module docstring)."""
    if loaded:
        return list(TABLES)
    if summary_only:
        return []
    if tasks_only:
        return ["tasks"]
    default = all(experiment.get(k, v) == v for k, v in DEFAULT_KNOWLEDGE.items())
    default = default and experiment.get("engine_model", DEFAULT_ENGINE_MODEL) == DEFAULT_ENGINE_MODEL
    default = default and not str(experiment.get("workload", "")).startswith(NO_REQUEST_DETAIL)
    return ["tasks", "requests"] if experiment.get("seed") == 0 and default else ["tasks"]


def packed_meta(meta: dict, tables: list[str]) -> dict:
    """The ``meta.json`` a pack ships for a result whose ``tables`` it keeps: the store's, with the
    checksums of those tables only (:data:`~topas.experiments.verify.CHECKSUMS`; none, ``{}``, for a
    summary-only run). The checksums of the tables left out were ~2.8 of the pack's 47.5 MB and
    nothing reads them: :func:`~topas.experiments.verify.result_problem` skips what the manifest
    says a result did not keep, and still checks every shipped table's sha256 and size."""
    sums = meta.get(CHECKSUMS)
    if not isinstance(sums, dict):  # a result written before the checksums: checked structurally
        return meta
    names = {f"{t}.parquet" for t in tables}
    return {**meta, CHECKSUMS: {n: v for n, v in sums.items() if n in names}}


def eviction_study_keys() -> frozenset[str]:
    """The keys of notebook 15's screen (:func:`studies.eviction.study.eviction_study_grid`):
    shipped with their tasks only (the screen's stability reads them). Not its full-length stage's
    (:func:`~studies.eviction.study.full_length_grid`): those ship their ``meta.json`` alone, as
    the store log's ``summary`` lines say (module docstring)."""
    from studies.eviction.study import eviction_study_grid

    return frozenset(e.key() for e in eviction_study_grid())


def read_log(path: Path) -> tuple[list[str], set[str], set[str]]:
    """The keys the sweeps returned (first-seen order), the keys loaded in full and the keys
    whose summaries alone were used (``summary`` lines; a key also swept or loaded is not one)."""
    swept: dict[str, None] = {}
    loaded: set[str] = set()
    summary_only: set[str] = set()
    tabled: set[str] = set()
    for n, line in enumerate(path.read_text().splitlines(), 1):
        kind, _, key = line.partition(" ")
        if kind == "summary":
            swept[key] = None
            summary_only.add(key)
        elif kind == "sweep":
            swept[key] = None
            tabled.add(key)
        elif kind == "load":
            loaded.add(key)
            swept[key] = None
        elif kind == "table":  # one table read (ResultStore.load_table): read_tables lists them
            swept[key.split(" ", 1)[0]] = None
        else:
            raise ValueError(f"{path}:{n}: not a store-log line: {line!r}")
    return list(swept), loaded, summary_only - tabled - loaded


def record_notebook_log(log: Path, engine: str) -> None:
    """Execute every notebook on the full grid in store-only mode, logging the store's use."""
    from studies.grid import ENGINE_ENV
    from pipeline.notebooks import execute_notebooks

    os.environ[ENGINE_ENV] = engine  # the grids name this engine's experiments
    os.environ[STORE_LOG_ENV] = str(log)
    os.environ[STORE_ONLY_ENV] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        execute_notebooks({"quick": False, "out_dir": str(Path(tmp) / "figures")},
                          executed_dir=Path(tmp) / "executed", progress=True)


def measured_keys(grid: str) -> tuple[list[str], set[str], int]:
    """The stored replays of a named grid (keys, those to ship in full: none, and the grid's size);
    exits with one line when the store holds none of them."""
    from studies.grid import named_grid
    from topas.sglang.server import ServerError, stored_identity
    from topas.sglang.urls import SGLANG_IDENTITY_ENV, SGLANG_URL_ENV

    store = ResultStore()
    try:
        ident = stored_identity(store)
    except ServerError as e:
        raise SystemExit(f"error: {e}") from None
    if ident is None:
        raise SystemExit("error: the results store holds no replays (engine sglang); run "
                         "`make reproduce ENGINE=sglang SERVER=URL` first")
    os.environ.pop(SGLANG_URL_ENV, None)
    os.environ[SGLANG_IDENTITY_ENV] = json.dumps(ident)
    exps = named_grid(grid, engine="sglang")
    keys = list(dict.fromkeys(e.key() for e in exps))
    have = [k for k in keys if store.has(k)]
    if not have:
        raise SystemExit(f"error: the results store holds none of the {len(keys)} replays of grid {grid}; run "
                         f"`make reproduce ENGINE=sglang GRID={grid} SERVER=URL` first")
    print(f"{len(have)} of the {len(keys)} replays of grid {grid} are stored; packing them", flush=True)
    return have, set(), len(keys)


#: The engines whose results each pack holds (the simulated pack holds every engine model of the
#: simulator, notebook 11's too).
PACKED_ENGINES = {"sim": ("sim",), "sglang": ("sglang",)}


#: Dirty entries listed in a refusal (and kept in the manifest), at most.
SHOW_DIRTY = 20


def check_clean_tree(entries: list[str] | None, allow_dirty: bool) -> None:
    """Refuse (``SystemExit`` with the changes listed) a dirty tree, or one outside git, unless
    ``allow_dirty``."""
    if allow_dirty:
        return
    if entries is None:
        raise SystemExit("error: not a git checkout: a pack must name the commit its results come from; "
                         "pass --allow-dirty to pack anyway (recorded in the manifest)")
    if entries:
        shown = "\n  ".join(entries[:SHOW_DIRTY]) + (f"\n  ... ({len(entries)} in all)" if len(entries) > SHOW_DIRTY else "")
        raise SystemExit(f"error: the working tree has uncommitted changes outside {', '.join(OUTPUT_PATHS)}:\n  {shown}\n"
                         "The shipped results must come from committed code: commit (or stash) the changes, "
                         "re-run what they affect, then pack; or pass --allow-dirty for an experiment "
                         "(recorded in the manifest)")


def read_tables(path: Path) -> dict[str, set[str]]:
    """Per key, the tables the notebooks read one by one (``table`` lines of the store log): the
    pack ships them whatever :func:`shipped_tables` says (notebook 06 reads the decisions of runs
    whose summaries its sweep used)."""
    out: dict[str, set[str]] = {}
    for line in path.read_text().splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "table":
            key, _, table = rest.partition(" ")
            out.setdefault(key, set()).add(table)
    return out


def build_pack(keys: list[str], loaded: set[str], summary_only: set[str], engine: str, dest: Path,
               allow_dirty: bool = False, provenance: dict | None = None,
               tasks_only: frozenset[str] = frozenset(), tables_read: dict[str, set[str]] | None = None) -> dict:
    """Copy the results into ``dest`` (a new folder) and return the manifest. A result produced
    from a dirty tree is refused (``SystemExit`` naming it) unless ``allow_dirty``; ``provenance``
    (the pack's own: ``allow_dirty``, ``tree_dirty``, ``dirty_entries``) goes into the manifest;
    ``tables_read`` (:func:`read_tables`): tables shipped besides :func:`shipped_tables`'."""
    store = ResultStore()
    experiments = []
    size = 0
    metas = {}
    for key in sorted(keys):
        meta = store.meta(key)
        if meta.get("engine", "sim") in PACKED_ENGINES[engine]:
            metas[key] = meta
    dirty = [m["label"] for m in metas.values() if m.get("git_dirty")]
    if dirty and not allow_dirty:
        raise SystemExit(f"error: {len(dirty)} of the {len(metas)} results to pack were produced from a dirty tree "
                         f"(git_dirty in their meta.json), e.g. {dirty[0]}; re-run them from a clean commit "
                         "(remove them from data/results/store first), or pass --allow-dirty for an experiment")
    for key, meta in metas.items():
        src = store.locate(key)
        out = dest / key[:2] / key
        out.mkdir(parents=True)
        tables = shipped_tables(meta["experiment"], key in loaded, key in summary_only, key in tasks_only)
        extra = (tables_read or {}).get(key, set()) - set(tables)
        tables += [t for t in TABLES if t in extra]
        for t in tables:
            if not (src / f"{t}.parquet").is_file():
                raise FileNotFoundError(f"{src / f'{t}.parquet'} is missing: re-run {meta['label']}")
            shutil.copyfile(src / f"{t}.parquet", out / f"{t}.parquet")
        # compact: the pack's meta.json files were 23 of its 50 MB with the store's indentation
        (out / META).write_text(json.dumps(packed_meta(meta, tables), separators=(",", ":")) + "\n")
        size += sum(f.stat().st_size for f in out.iterdir())
        experiments.append({"key": key, "label": meta["label"], "engine": meta.get("engine", "sim"), "tables": tables,
                            "git_commit": meta["git_commit"], "git_dirty": meta.get("git_dirty"),
                            "topas_version": meta["topas_version"], "code": meta["canonical"].get("code")})
    if not experiments:
        raise SystemExit(f"error: no {engine!r} results to pack")
    import topas

    manifest = {
        "schema": SCHEMA,
        "engine": engine,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "topas_version": topas.__version__,
        "packed_at_commit": git_commit(),
        "result_commits": sorted({e["git_commit"] for e in experiments}),
        "any_result_dirty": any(bool(e["git_dirty"]) for e in experiments),
        "allow_dirty": bool(allow_dirty),
        **(provenance or {}),
        "code_fingerprints": sorted({str(e["code"]) for e in experiments}),
        "environment": environment(),
        "n_experiments": len(experiments),
        "n_full_tables": sum(len(e["tables"]) == len(TABLES) for e in experiments),
        "bytes": size,
        "experiments": experiments,
    }
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", default="sim", choices=("sim", "sglang"))
    ap.add_argument("--max-mb", type=float, default=50.0)
    ap.add_argument("--grid", default="full", choices=("full", "quick", "gpu-afternoon"),
                    help="--engine sglang: pack what the store holds of this grid (default: full)")
    ap.add_argument("--log", type=Path, default=None,
                    help="a store log from an earlier notebook run (default: run the notebooks now)")
    ap.add_argument("--allow-dirty", action="store_true",
                    help="pack even from a dirty tree or dirty results (an experiment; recorded in the manifest)")
    args = ap.parse_args(argv)
    entries = dirty_entries()
    check_clean_tree(entries, args.allow_dirty)
    provenance = {"tree_dirty": None if entries is None else bool(entries),
                  "dirty_entries": (entries or [])[:SHOW_DIRTY]}
    if args.allow_dirty and (entries or entries is None):
        print("warning: packing from a dirty tree (--allow-dirty); the manifest records it", flush=True)

    grid_size = None
    if args.engine == "sglang" and args.log is None:
        keys, loaded, grid_size = measured_keys(args.grid)
        summary_only: set[str] = set()
    else:
        if args.log is None:
            args.log = Path(tempfile.mkstemp(prefix="topas-store-log-", suffix=".txt")[1])
            print(f"executing the notebooks in store-only mode (log: {args.log})", flush=True)
            record_notebook_log(args.log, args.engine)
        keys, loaded, summary_only = read_log(args.log)
    final = REPO / "data" / "results" / args.engine
    tmp = final.parent / f".tmp-pack-{args.engine}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        manifest = build_pack(keys, loaded, summary_only, args.engine, tmp, args.allow_dirty, provenance,
                              eviction_study_keys() if args.engine == "sim" else frozenset(),
                              read_tables(args.log) if args.log is not None else None)
        if grid_size is not None:
            manifest.update({"grid": args.grid, "grid_experiments": grid_size})
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        mb = (manifest["bytes"] + (tmp / MANIFEST).stat().st_size) / 1e6  # what the repository holds
        if mb > args.max_mb:
            raise SystemExit(f"error: the pack would be {mb:.1f} MB, over --max-mb {args.max_mb:g}")
        old = final.parent / f".old-pack-{args.engine}-{os.getpid()}"
        if final.exists():
            os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    of = f" of the {grid_size} of grid {args.grid}" if grid_size is not None else ""
    print(f"packed {manifest['n_experiments']}{of} experiments ({manifest['n_full_tables']} with every table), "
          f"{mb:.1f} MB -> {final.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
