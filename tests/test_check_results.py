"""scripts/check_results.py: re-runs stored experiments and says whether their summaries changed."""

from __future__ import annotations

import json
import subprocess
import sys

from topas.experiments import Experiment, ResultStore, run_sweep
from topas.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "check_results.py"


def check(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args), "--no-progress"], capture_output=True,
                          text=True, cwd=REPO_ROOT, timeout=300)


def test_unchanged_results_match_and_a_changed_one_is_named(tmp_path):
    store = ResultStore(tmp_path / "store")
    exps = [Experiment("chain-3", p, load=1.2, n_tasks=6) for p in ("fcfs", "topas")]
    exps.append(Experiment("chain-3", "lpm", load=1.2, n_tasks=6, engine_options={"host_tier": True}))
    run_sweep(exps, store, jobs=1, progress=False)
    r = check("--store", store.root, "--all")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 of 3 re-run results match" in r.stdout and "(same code)" in r.stdout
    assert "chain-3/lpm@load=1.2,seed=0,tasks=6,engine[host_tier=True]" in r.stdout  # re-run with its options

    meta_path = store.path(exps[1]) / "meta.json"  # as if the code now gave another JCT
    meta = json.loads(meta_path.read_text())
    meta["summary"]["jct_mean"] += 1.0
    meta_path.write_text(json.dumps(meta))
    r = check("--store", store.root, "--all")
    assert r.returncode == 1
    assert "DIFFERS  chain-3/topas@load=1.2,seed=0,tasks=6" in r.stdout and "jct_mean" in r.stdout
    assert "2 of 3 re-run results match" in r.stdout

    meta["canonical"]["trace_sha256"] = "0" * 64  # a result of another trace is not compared
    meta_path.write_text(json.dumps(meta))
    r = check("--store", store.root, "--sample", 5)
    assert r.returncode == 0 and "inputs changed, not compared: chain-3/topas" in r.stdout


def test_an_empty_store_is_an_error(tmp_path):
    r = check("--store", tmp_path / "none")
    assert r.returncode == 2 and "no stored" in r.stderr


def test_policy_patterns_select_which_results_are_re_run(tmp_path):
    store = ResultStore(tmp_path / "store")
    exps = [Experiment("chain-3", p, load=1.2, n_tasks=6) for p in ("fcfs", "topas", "topas-no-reuse")]
    run_sweep(exps, store, jobs=1, progress=False)
    r = check("--store", store.root, "--all", "--policy", "topas*")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 of 2 re-run results match" in r.stdout and "chain-3/fcfs" not in r.stdout
    r = check("--store", store.root, "--all", "--policy", "lpm")
    assert r.returncode == 2 and "no stored sim lpm results" in r.stderr


def test_a_clusters_router_wall_time_is_not_a_difference():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_results", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    stored = {"jct_mean": 1.5, "sim_wall_s": 3.0, "routing_wall_s": 0.5}
    assert mod.compare(stored, {"jct_mean": 1.5}) == []  # a fresh run's summary omits both
    assert mod.compare(stored, {"jct_mean": 1.25}) == ["jct_mean"]


def test_fresh_results_are_read_from_another_store_and_a_rewritten_trace_compared_on_request(tmp_path):
    """After `make reproduce` the fresh results are already stored: --fresh-from reads them instead
    of re-running (a planted JCT there is reported, so it was read, not re-run); --trace-changed
    compares a result whose only changed input is the trace's bytes."""
    old, new = ResultStore(tmp_path / "old"), ResultStore(tmp_path / "new")
    exps = [Experiment("chain-3", p, load=1.2, n_tasks=6) for p in ("fcfs", "lpm")]
    run_sweep(exps, old, jobs=1, progress=False)
    run_sweep(exps, new, jobs=1, progress=False)
    r = check("--store", old.root, "--all", "--fresh-from", new.root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 of 2 fresh results read from" in r.stdout and "2 of 2 re-run results match" in r.stdout

    fresh_meta = new.path(exps[1]) / "meta.json"
    meta = json.loads(fresh_meta.read_text())
    meta["summary"]["jct_mean"] += 1.0
    fresh_meta.write_text(json.dumps(meta))
    r = check("--store", old.root, "--all", "--fresh-from", new.root)
    assert r.returncode == 1 and "DIFFERS  chain-3/lpm@load=1.2,seed=0,tasks=6" in r.stdout

    old_meta = old.path(exps[0]) / "meta.json"  # as if stored from an earlier trace file
    meta = json.loads(old_meta.read_text())
    meta["canonical"]["trace_sha256"] = "0" * 64
    old_meta.write_text(json.dumps(meta))
    r = check("--store", old.root, "--policy", "fcfs", "--all", "--fresh-from", new.root)
    assert r.returncode == 2 and "inputs changed, not compared: chain-3/fcfs" in r.stdout
    r = check("--store", old.root, "--policy", "fcfs", "--all", "--fresh-from", new.root, "--trace-changed")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "same     chain-3/fcfs@load=1.2,seed=0,tasks=6 (same code, trace rewritten)" in r.stdout


def test_a_new_engine_switch_and_a_new_metric_are_not_differences_when_asked():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_results", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    old = {"radix_cache": True, "host_tier": False}
    assert mod._only_new_fields(old, {**old, "segment_cache": True})
    assert not mod._only_new_fields(old, dict(old))  # nothing added
    assert not mod._only_new_fields(old, {**old, "host_tier": True, "segment_cache": True})  # one changed
    assert not mod._only_new_fields(old, {"radix_cache": True, "segment_cache": True})  # one dropped
    stored, fresh = {"jct_mean": 1.5}, {"jct_mean": 1.5, "cached_tokens": 7}
    assert mod.compare(stored, fresh) == ["cached_tokens"]
    assert mod.compare(stored, fresh, new_keys=True) == []
    assert mod.compare(stored, {"jct_mean": 2.0, "cached_tokens": 7}, new_keys=True) == ["jct_mean"]
