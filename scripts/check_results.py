#!/usr/bin/env python3
"""Check that the current code reproduces stored results: did a refactor change any result?

An experiment's key covers the code (``topas.provenance``), so after any edit to the engine,
policies or workload code no stored result is reused: the keys differ. To check that an edit
meant as a pure refactor changed no *result*, this script takes stored experiments (a random
sample, or all), re-runs each one's spec with the code as it is now, without storing anything,
and compares the deterministic summary (every key but the wall-clock ones) with the stored one,
exactly::

    python scripts/check_results.py --sample 20            # 20 stored results, seed 0
    python scripts/check_results.py --all --jobs 2
    python scripts/check_results.py --store DIR --packs    # another store; include the shipped packs
    # after `make reproduce`: the shipped results against the fresh ones it stored, no re-run
    python scripts/check_results.py --store /tmp/empty --packs --all --fresh-from data/results/store
    python scripts/check_results.py --packs --policy 'topas*' --sample 20   # TOPAS and its variants only

A result whose trace, profile or parameters (resolved defaults included) are no longer what
they were is reported as ``inputs changed`` and not compared: its summary could differ for that
reason alone. Exit status: 0 when every compared result matches, 1 when any differs (each is
named, with the first differing summary keys), 2 when nothing could be compared.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from topas.cluster.metrics import CLUSTER_WALL_CLOCK_KEYS  # noqa: E402
from topas.experiments import Experiment, ResultStore, map_experiments  # noqa: E402
from topas.experiments.store import experiment_of  # noqa: E402

#: Canonical fields that are inputs (not code): when one differs, the comparison is meaningless.
INPUT_FIELDS = ("trace_sha256", "n_tasks", "rate", "seed", "policy", "params", "profile_hash", "engine",
                "engine_config")


def rerun_summary(exp: Experiment) -> dict:
    """The deterministic summary of a fresh run (module-level: runs in worker processes)."""
    from topas.experiments.spec import run_experiment

    return run_experiment(exp).deterministic_summary()


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:  # NaN == NaN here
        return True
    return a == b


def _only_new_fields(stored: dict | None, fresh: dict | None) -> bool:
    """The fresh engine config adds fields (new engine switches) and keeps every stored one as it was."""
    if not isinstance(stored, dict) or not isinstance(fresh, dict) or set(fresh) <= set(stored):
        return False
    return all(k in fresh and json.dumps(fresh[k], default=str) == json.dumps(v, default=str) for k, v in stored.items())


def compare(stored: dict, fresh: dict, new_keys: bool = False) -> list[str]:
    """Summary keys whose values differ (wall-clock keys excluded, a cluster's time in its router
    too: a fresh run's deterministic summary drops it), sorted. ``new_keys``: a key only the fresh
    summary has (a metric added since) is not a difference."""
    keys = (set(stored) if new_keys else set(stored) | set(fresh)) - set(CLUSTER_WALL_CLOCK_KEYS)
    return sorted(k for k in keys if not _same(stored.get(k), fresh.get(k)))


def verify(root: Path | None, packs: list[Path]) -> int:
    """``--verify``: check every result folder under ``root`` (a store, or a pack: a folder with a
    ``manifest.json``) and ``packs`` (:func:`topas.experiments.verify.result_problem`); print each
    damaged one and a total. 0 when all are whole, 1 otherwise."""
    import warnings

    from topas.experiments.store import MANIFEST, DamagedResultWarning, default_store_root

    root = Path(root) if root is not None else default_store_root()
    bases = list(dict.fromkeys([root, *packs]))
    n = bad = 0
    for base in bases:
        is_pack = (base / MANIFEST).is_file()  # a pack: its manifest says which tables each result kept
        store = ResultStore(base / ".no-store", packs=[base]) if is_pack else ResultStore(base, packs=[])
        if not base.is_dir():
            continue
        for shard in sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith(".")):
            for d in sorted(p for p in shard.iterdir() if p.is_dir() and not p.name.startswith(".")):
                n += 1
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DamagedResultWarning)
                    problem = "meta.json is missing (an incomplete write)" if not (d / "meta.json").is_file() \
                        else store.problem(d)
                if problem is not None:
                    bad += 1
                    print(f"damaged  {d}: {problem}")
    where = ", ".join(str(b) for b in bases)
    print(f"verified {n} stored result(s) in {where}: {bad} damaged"
          + (" (treated as absent: a sweep runs them again)" if bad else ""))
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", type=Path, default=None, help="the results store (default: data/results/store)")
    ap.add_argument("--packs", action="store_true", help="also sample the shipped packs (data/results/<engine>/)")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--sample", type=int, default=10, help="how many stored results to check (default: 10)")
    group.add_argument("--all", action="store_true", help="check every stored result")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random sample (default: 0)")
    ap.add_argument("--engine", action="append", default=None,
                    help="only results of this engine (repeatable; default: sim; sglang replays need a server)")
    ap.add_argument("--policy", action="append", default=None, metavar="PATTERN",
                    help="only results of policies matching this shell pattern, e.g. 'topas*' (repeatable; "
                         "default: every policy)")
    ap.add_argument("--fresh-from", type=Path, default=None, metavar="STORE",
                    help="take a fresh result from this store where it holds the experiment's current key "
                         "(e.g. data/results/store after make reproduce: the comparison then costs no run); "
                         "re-run only what it lacks")
    ap.add_argument("--new-engine-fields", action="store_true",
                    help="also compare results whose engine config differs only by fields added since (a new "
                         "engine switch at the value the current spec gives it: does it keep the old "
                         "behaviour?), and ignore summary keys the stored results lack (metrics added since)")
    ap.add_argument("--trace-changed", action="store_true",
                    help="also compare results whose only changed input is the trace file's bytes (a trace "
                         "rewritten with fields the engine does not read)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default: 1)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--verify", action="store_true",
                    help="only check that every stored result is whole (checksums, tables, meta.json) in the store "
                         "(or the pack --store names; --packs: the shipped packs too); exit 1 naming each damaged one")
    args = ap.parse_args(argv)
    engines = set(args.engine or ("sim",))

    from topas.experiments.store import default_packs

    if args.verify:
        return verify(args.store, default_packs() if args.packs else [])
    store = ResultStore(args.store, packs=default_packs() if args.packs else [])
    metas = [m for m in (store.meta(k) for k in store.keys() if store.locate(k) is not None) if m["experiment"]["engine"] in engines
             and (args.policy is None or any(fnmatch.fnmatchcase(m["experiment"]["policy"], pat) for pat in args.policy))]
    if not metas:
        which = f" {' or '.join(args.policy)}" if args.policy else ""
        print(f"error: no stored {'/'.join(sorted(engines))}{which} results in {store.root}"
              f"{' or the packs' if store.packs else ''}", file=sys.stderr)
        return 2
    if not args.all and args.sample < len(metas):
        metas = random.Random(args.seed).sample(metas, args.sample)

    todo: list[tuple[dict, Experiment]] = []
    changed: list[str] = []
    for m in metas:
        try:
            exp = experiment_of(m)
            canon = exp.canonical()
        except Exception as e:  # an input that no longer exists or no longer validates
            changed.append(f"{m.get('label', m['key'])}: {e}")
            continue
        diff = [f for f in INPUT_FIELDS if json.dumps(canon.get(f), sort_keys=True, default=str)
                != json.dumps(m["canonical"].get(f), sort_keys=True, default=str)]
        if args.new_engine_fields and "engine_config" in diff and _only_new_fields(
                m["canonical"].get("engine_config"), canon.get("engine_config")):
            diff.remove("engine_config")
        if diff and not (args.trace_changed and diff == ["trace_sha256"]):
            changed.append(f"{m.get('label', m['key'])}: {', '.join(diff)} changed")
        else:
            todo.append((m, exp))
    for line in changed:
        print(f"inputs changed, not compared: {line}")
    if not todo:
        print("error: nothing to compare", file=sys.stderr)
        return 2
    fresh_store = ResultStore(args.fresh_from, packs=[]) if args.fresh_from is not None else None
    fresh: list[dict | None] = [None] * len(todo)
    if fresh_store is not None:
        for i, (_, exp) in enumerate(todo):
            if fresh_store.has(exp.key()):
                fresh[i] = fresh_store.meta(exp.key())["summary"]
        print(f"{sum(f is not None for f in fresh)} of {len(todo)} fresh results read from {fresh_store.root}")
    rerun = [i for i, f in enumerate(fresh) if f is None]
    for i, summary in zip(rerun, map_experiments(rerun_summary, [todo[i][1] for i in rerun], jobs=args.jobs,
                                                 progress=not args.no_progress, desc="re-running")):
        fresh[i] = summary
    bad = 0
    for (m, exp), summary in zip(todo, fresh):
        diff = compare(m["summary"], summary, new_keys=args.new_engine_fields)
        same_code = m["canonical"].get("code") == exp.canonical()["code"]
        tag = "same code" if same_code else "code changed"
        if m["canonical"].get("trace_sha256") != exp.canonical().get("trace_sha256"):
            tag += ", trace rewritten"
        if diff:
            bad += 1
            detail = ", ".join(f"{k}: {m['summary'].get(k)!r} -> {summary.get(k)!r}" for k in diff[:3])
            print(f"DIFFERS  {exp.label()} ({tag}): {detail}{' ...' if len(diff) > 3 else ''}")
        else:
            print(f"same     {exp.label()} ({tag})")
    print(f"\n{len(todo) - bad} of {len(todo)} re-run results match their stored summaries"
          + (f"; {len(changed)} not compared (inputs changed)" if changed else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
