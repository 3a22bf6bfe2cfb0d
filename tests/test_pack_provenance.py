"""`make pack` refuses a dirty tree and results produced from one, unless --allow-dirty, which the
manifest records; "dirty" leaves out the folders a reproduction writes (figures/, data/results/)."""

from __future__ import annotations

import importlib.util
import json
import subprocess

import pytest

import topas.experiments.store_meta as store_meta
import topas.provenance as provenance
from topas.experiments import Experiment, ResultStore, run_sweep
from topas.paths import REPO_ROOT


def pack_script():
    spec = importlib.util.spec_from_file_location("pack_results", REPO_ROOT / "scripts" / "pack_results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def small_store(tmp_path, monkeypatch, dirty: bool):
    """A store of two short runs recorded with ``git_dirty = dirty``, and a store log naming them."""
    work = tmp_path / "work"
    monkeypatch.setattr(store_meta, "git_dirty", lambda: dirty)
    exps = [Experiment("dag-4", "fcfs", load=1.2, seed=s, n_tasks=6) for s in (0, 1)]
    run_sweep(exps, ResultStore(work), jobs=1, progress=False)
    log = tmp_path / "log.txt"
    log.write_text("".join(f"sweep {e.key()}\n" for e in exps))
    return work, log


def test_a_dirty_tree_is_refused_with_the_changes_listed():
    mod = pack_script()
    with pytest.raises(SystemExit, match=r"uncommitted changes outside figures, data/results:\n   M topas/x\.py") as e:
        mod.check_clean_tree([" M topas/x.py"], allow_dirty=False)
    assert "--allow-dirty" in str(e.value)
    with pytest.raises(SystemExit, match="not a git checkout"):
        mod.check_clean_tree(None, allow_dirty=False)
    mod.check_clean_tree([" M topas/x.py"], allow_dirty=True)
    mod.check_clean_tree([], allow_dirty=False)


def test_main_refuses_a_dirty_tree_before_running_anything(monkeypatch):
    mod = pack_script()
    monkeypatch.setattr(mod, "dirty_entries", lambda: [" M topas/policies/lpm.py"])

    def never(*a, **k):
        raise AssertionError("the notebooks ran although the tree is dirty")

    monkeypatch.setattr(mod, "record_notebook_log", never)
    with pytest.raises(SystemExit, match="topas/policies/lpm.py"):
        mod.main([])


def test_results_from_a_dirty_tree_are_refused(tmp_path, monkeypatch):
    mod = pack_script()
    work, log = small_store(tmp_path, monkeypatch, dirty=True)
    monkeypatch.setattr(mod, "ResultStore", lambda: ResultStore(work))
    dest = tmp_path / "pack"
    dest.mkdir()
    with pytest.raises(SystemExit, match=r"2 of the 2 results to pack were produced from a dirty tree.*dag-4/fcfs"):
        mod.build_pack(*mod.read_log(log), "sim", dest)


def test_allow_dirty_packs_and_the_manifest_records_it(tmp_path, monkeypatch):
    mod = pack_script()
    work, log = small_store(tmp_path, monkeypatch, dirty=True)
    monkeypatch.setattr(mod, "ResultStore", lambda: ResultStore(work))
    monkeypatch.setattr(mod, "REPO", tmp_path)  # the pack lands in tmp_path/data/results/sim
    monkeypatch.setattr(mod, "dirty_entries", lambda: ["?? notes.txt"])
    assert mod.main(["--log", str(log), "--allow-dirty"]) == 0
    m = json.loads((tmp_path / "data" / "results" / "sim" / "manifest.json").read_text())
    assert m["allow_dirty"] is True and m["tree_dirty"] is True and m["dirty_entries"] == ["?? notes.txt"]
    assert m["any_result_dirty"] is True and m["n_experiments"] == 2


def test_a_clean_tree_and_clean_results_pack_without_the_flag(tmp_path, monkeypatch):
    mod = pack_script()
    work, log = small_store(tmp_path, monkeypatch, dirty=False)
    monkeypatch.setattr(mod, "ResultStore", lambda: ResultStore(work))
    monkeypatch.setattr(mod, "REPO", tmp_path)
    monkeypatch.setattr(mod, "dirty_entries", lambda: [])
    assert mod.main(["--log", str(log)]) == 0
    m = json.loads((tmp_path / "data" / "results" / "sim" / "manifest.json").read_text())
    assert (m["allow_dirty"], m["tree_dirty"], m["any_result_dirty"], m["dirty_entries"]) == (False, False, False, [])


def test_dirty_means_changed_outside_what_a_reproduction_writes(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "topas").mkdir(parents=True)
    (repo / "figures").mkdir()
    (repo / "topas" / "a.py").write_text("x = 1\n")
    (repo / "figures" / "t.csv").write_text("a\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    monkeypatch.setattr(provenance, "PACKAGE_DIR", repo / "topas")
    assert provenance.dirty_entries() == []
    (repo / "figures" / "t.csv").write_text("b\n")  # a re-rendered table
    (repo / "data" / "results").mkdir(parents=True)
    (repo / "data" / "results" / "new.json").write_text("{}")
    assert provenance.dirty_entries() == []
    (repo / "topas" / "a.py").write_text("x = 2\n")
    assert provenance.dirty_entries() == [" M topas/a.py"]


def test_a_pack_ships_per_request_detail_for_seed_0_of_the_default_engine_and_knowledge_only():
    ship = pack_script().shipped_tables
    stock = {"seed": 0, "engine_model": "stock", "prior_noise": 0.0, "prior_bias": 1.0, "dag_visibility": "full",
             "arrivals": "poisson"}
    assert ship(stock, loaded=False) == ["tasks", "requests"]
    assert ship({**stock, "seed": 1}, loaded=False) == ["tasks"]
    for variant in ({"engine_model": "segment_cache=False"}, {"engine_model": "legacy"}, {"prior_bias": 0.5}):
        assert ship({**stock, **variant}, loaded=False) == ["tasks"], variant
    assert ship({**stock, "engine_model": "legacy"}, loaded=True) == list(pack_script().TABLES)
    assert ship(stock, loaded=False, summary_only=True) == []
    # the MetaGPT and synthetic-workload runs keep their per-request tables only when loaded
    assert ship({**stock, "workload": "metagpt-tl"}, loaded=False) == ["tasks"]
    assert ship({**stock, "workload": "dag-4"}, loaded=False) == ["tasks"]
    assert ship({**stock, "workload": "metagpt-sop"}, loaded=True) == list(pack_script().TABLES)
    # the held-out random workflows keep seed 0's
    assert ship({**stock, "workload": "random-dag-1000"}, loaded=False) == ["tasks", "requests"]
