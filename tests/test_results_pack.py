"""The results shipped with the repository (data/results/sim/, a "pack") and how the store uses
them: read after the working store, never written, trimmed tables named, store-only mode, and
the committed pack is complete for the full grid and not stale."""

from __future__ import annotations

import importlib.util
import json
import os

import pandas as pd
import pytest

from topas.experiments import Experiment, ResultStore, run_sweep
from studies import grid
from studies.cluster import grid as cluster_grid
from topas.experiments.store import experiment_of
from topas.experiments.store import (
    MANIFEST,
    STORE_ONLY_ENV,
    TABLES,
    USE_PACKS_ENV,
    MissingResults,
    TrimmedResult,
    default_packs,
)
from topas.paths import REPO_ROOT

PACK = REPO_ROOT / "data" / "results" / "sim"


def exp(seed: int = 0, **kw) -> Experiment:
    return Experiment(**{**dict(workload="dag-4", policy="fcfs", load=1.2, seed=seed, n_tasks=10), **kw})


def load_pack_script():
    spec = importlib.util.spec_from_file_location("pack_results", REPO_ROOT / "scripts" / "pack_results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def packed(tmp_path, monkeypatch):
    """A pack built by scripts/pack_results.py from a store of three runs (seeds 0-2), seed 1
    loaded in full."""
    work = tmp_path / "work"
    data = tmp_path / "data"  # the default store and packs live here; traces and profiles are ours
    data.mkdir()
    for sub in ("traces", "profiles"):
        (data / sub).symlink_to(REPO_ROOT / "data" / sub)
    monkeypatch.setenv("TOPAS_DATA", str(data))
    exps = [exp(0), exp(1), exp(2), exp(3), exp(0, prior_bias=2.0)]
    run_sweep(exps, ResultStore(work), jobs=1, progress=False)
    log = tmp_path / "log.txt"
    log.write_text("".join(f"sweep {e.key()}\n" for e in exps[:3]) + f"load {exps[1].key()}\n"
                   f"summary {exps[3].key()}\nsweep {exps[4].key()}\nsummary {exps[0].key()}\n")
    mod = load_pack_script()
    monkeypatch.setattr(mod, "ResultStore", lambda: ResultStore(work))
    # the rule under test (seed 0 ships its per-request table), for a workload the shipped pack
    # keeps that detail for (it leaves the synthetic ones out for size)
    monkeypatch.setattr(mod, "NO_REQUEST_DETAIL", ("metagpt-",))
    dest = tmp_path / "data" / "results" / "sim"
    dest.mkdir(parents=True)
    manifest = mod.build_pack(*mod.read_log(log), "sim", dest, allow_dirty=True)  # a dev tree may be dirty
    return exps, dest, manifest, work


def test_pack_holds_tasks_of_all_requests_of_seed_0_and_every_table_of_the_loaded(packed):
    exps, dest, manifest, _ = packed
    assert manifest["n_experiments"] == 5 and manifest["n_full_tables"] == 1
    assert json.loads((dest / MANIFEST).read_text()) == manifest
    tables = {e["key"]: e["tables"] for e in manifest["experiments"]}
    assert tables[exps[0].key()] == ["tasks", "requests"]  # swept too: a summary use does not trim it
    assert tables[exps[1].key()] == list(TABLES)
    assert tables[exps[2].key()] == ["tasks"]
    assert tables[exps[3].key()] == []  # only its summary was used: meta.json alone

    assert tables[exps[4].key()] == ["tasks"]  # seed 0, but degraded knowledge (notebook 14): no requests
    assert sorted(p.name for p in (dest / exps[3].key()[:2] / exps[3].key()).iterdir()) == ["meta.json"]


def test_a_packed_meta_json_keeps_the_checksums_of_the_shipped_tables_only(packed, tmp_path):
    """The pack's meta.json is the store's but for the checksums of the tables the pack left out
    (a summary-only run's: none); such a run still reads and verifies, and a shipped table is still
    checked against its sha256."""
    exps, dest, manifest, work = packed
    tables = {e["key"]: e["tables"] for e in manifest["experiments"]}
    for e in exps:
        packed_meta = json.loads((dest / e.key()[:2] / e.key() / "meta.json").read_text())
        stored = ResultStore(work).meta(e)
        assert sorted(packed_meta["checksums"]) == sorted(f"{t}.parquet" for t in tables[e.key()])
        assert all(packed_meta["checksums"][n] == stored["checksums"][n] for n in packed_meta["checksums"])
        assert {k: v for k, v in packed_meta.items() if k != "checksums"} == \
            {k: v for k, v in stored.items() if k != "checksums"}
    summary_only, tasks_only = exps[3], exps[2]
    assert tables[summary_only.key()] == [] and tables[tasks_only.key()] == ["tasks"]
    store = ResultStore(tmp_path / "empty", packs=[dest])
    assert store.has(summary_only) and store.damaged(summary_only.key()) is None
    assert store.meta(summary_only)["summary"] == ResultStore(work).meta(summary_only)["summary"]
    with pytest.raises(TrimmedResult):
        store.load(summary_only)  # its tables were left out on purpose: not damage
    spec = importlib.util.spec_from_file_location("check_results", REPO_ROOT / "scripts" / "check_results.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    assert check.verify(dest, []) == 0  # check_results.py --verify over the pack
    # a shipped table with a changed byte (same size, still PAR1 at both ends) fails its checksum
    p = dest / tasks_only.key()[:2] / tasks_only.key() / "tasks.parquet"
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    p.write_bytes(bytes(raw))
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a new stamp: the verdict is not cached
    with pytest.warns(UserWarning, match="does not match its recorded sha256"):
        assert not store.has(tasks_only)
    assert check.verify(dest, []) == 1


def test_a_table_read_one_by_one_is_shipped_whatever_the_rule_says(packed, tmp_path, monkeypatch):
    exps, _, _, work = packed
    mod = load_pack_script()
    monkeypatch.setattr(mod, "ResultStore", lambda: ResultStore(work))
    log = tmp_path / "log2.txt"
    log.write_text(f"summary {exps[3].key()}\ntable {exps[3].key()} decisions\n")
    dest = tmp_path / "pack2"
    dest.mkdir()
    manifest = mod.build_pack(*mod.read_log(log), "sim", dest, allow_dirty=True, tables_read=mod.read_tables(log))
    assert {e["key"]: e["tables"] for e in manifest["experiments"]} == {exps[3].key(): ["decisions"]}


def test_default_store_reads_the_pack_after_the_working_store(packed, tmp_path):
    exps, dest, _, work = packed
    store = ResultStore()
    assert store.packs == [dest] and store.root == tmp_path / "data" / "results" / "store"
    assert all(store.has(e) for e in exps) and store.keys() == sorted(e.key() for e in exps)
    assert run_sweep([exps[3]], store, jobs=1, progress=False, tables=False)["jct_mean"].notna().all()
    assert store.keys(packs=False) == []
    full = store.load(exps[1])
    pd.testing.assert_frame_equal(full.requests, ResultStore(work).load(exps[1]).requests)
    with pytest.raises(TrimmedResult, match=r"dag-4/fcfs@load=1.2,seed=0.*decisions, prefix_events, timeline"):
        store.load(exps[0])
    pd.testing.assert_frame_equal(store.load_table(exps[0], "requests"),
                                  ResultStore(work).load(exps[0]).requests)
    with pytest.raises(TrimmedResult, match=r"table 'requests' of dag-4/fcfs@load=1.2,seed=2"):
        store.load_table(exps[2], "requests")
    # a sweep over packed results runs nothing and writes nothing
    df = run_sweep(exps, store, jobs=1, progress=False)
    assert list(df["key"]) == [e.key() for e in exps]
    assert not store.root.exists()


def test_reproduce_can_ignore_the_packs(packed, monkeypatch):
    monkeypatch.setenv(USE_PACKS_ENV, "0")
    assert default_packs() == [] and not ResultStore().has(packed[0][0])


def test_store_only_mode_names_what_is_missing_and_runs_nothing(packed, monkeypatch):
    exps, *_ = packed
    monkeypatch.setenv(STORE_ONLY_ENV, "1")
    store = ResultStore()
    run_sweep(exps, store, jobs=1, progress=False)  # all stored: fine
    with pytest.raises(MissingResults, match=r"(?s)1 experiment\(s\).*dag-4/fcfs@load=1.2,seed=7,tasks=10"):
        run_sweep(exps + [exp(7)], store, jobs=1, progress=False)
    assert not store.root.exists()


def test_store_log_records_sweeps_and_full_loads(tmp_path, monkeypatch):
    log = tmp_path / "log.txt"
    monkeypatch.setenv("TOPAS_STORE_LOG", str(log))
    s = ResultStore(tmp_path / "s")
    run_sweep([exp(0), exp(1)], s, jobs=1, progress=False)
    s.load(exp(1))
    assert log.read_text().split("\n")[:-1] == [f"sweep {exp(0).key()}", f"sweep {exp(1).key()}",
                                                f"load {exp(1).key()}"]
    run_sweep([exp(2)], s, jobs=1, progress=False, tables=False)
    assert log.read_text().split("\n")[-2] == f"summary {exp(2).key()}"
    keys, loaded, summary_only = load_pack_script().read_log(log)
    assert keys == [exp(0).key(), exp(1).key(), exp(2).key()] and loaded == {exp(1).key()}
    assert summary_only == {exp(2).key()}
    s.load_table(exp(2), "decisions")  # one table of a run whose summary alone was used
    assert log.read_text().split("\n")[-2] == f"table {exp(2).key()} decisions"
    assert load_pack_script().read_log(log)[2] == {exp(2).key()}
    assert load_pack_script().read_tables(log) == {exp(2).key(): {"decisions"}}
    (tmp_path / "bad.txt").write_text("sweep abc\nnonsense\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: not a store-log line"):
        load_pack_script().read_log(tmp_path / "bad.txt")


# ----------------------------------------------------------------------------- the committed pack


@pytest.fixture(scope="module")
def manifest():
    if not (PACK / MANIFEST).is_file():
        pytest.fail(f"{PACK / MANIFEST} is missing: run `make reproduce && make pack` and commit it")
    return json.loads((PACK / MANIFEST).read_text())


def test_committed_pack_is_small_and_complete(manifest):
    size = sum(f.stat().st_size for f in PACK.rglob("*") if f.is_file())
    assert size < 50e6, f"the shipped results are {size / 1e6:.1f} MB (limit 50 MB)"
    assert manifest["schema"] == "topas.results-pack/1" and manifest["engine"] == "sim"
    for e in manifest["experiments"]:
        d = PACK / e["key"][:2] / e["key"]
        assert (d / "meta.json").is_file(), e["label"]
        assert sorted(p.stem for p in d.glob("*.parquet")) == sorted(e["tables"]), e["label"]


def test_committed_pack_is_not_stale(manifest):
    """Every shipped result still has the key its spec gets today: a changed trace, profile,
    parameter default or line of the engine/policy/workload code makes this fail until the results
    are re-run and re-packed (`make reproduce && make pack`)."""
    for e in manifest["experiments"]:
        meta = json.loads((PACK / e["key"][:2] / e["key"] / "meta.json").read_text())
        fresh = experiment_of(meta)
        what = ("the code changed since it was packed" if meta["canonical"].get("code") != fresh.canonical()["code"]
                else "its inputs changed since it was packed")
        assert fresh.key() == e["key"], f"stale shipped result: {e['label']} ({what}; make reproduce && make pack)"


def test_committed_pack_covers_the_full_grid(manifest):
    keys = {e["key"] for e in manifest["experiments"]}
    timed = [e for e in grid.notebook_grid() if e.workload == "dag-10-wide" and e.policy == "topas" and e.load == 1.4]
    full = (timed + grid.ablations(["dag-4", "metagpt-tl"], 1.2, quick=False) + grid.sensitivity("dag-4")
            + grid.engine_model(quick=False) + grid.robustness(quick=False)
            + cluster_grid.cluster_grid(quick=False) + cluster_grid.cluster_scaling_grid(quick=False))
    missing = [e.label() for e in full if e.key() not in keys]
    assert not missing, f"{len(missing)} full-grid results not shipped, e.g. {missing[:3]}"


def test_committed_pack_holds_every_protocol_run(manifest):
    """Notebooks 02, 03, 08 and 16 read the protocol's grid: every run its stopping rule reaches
    (per workload, policy and run length the loads up to the first one at which a seed grows; the
    convergence study's every load) is shipped. The cached evidence also holds runs of the first
    pass above that load, which no notebook reads."""
    import pandas as pd

    from studies.protocol_runs.study import (FULL, TEST_VERSION, default_engine_rows, default_evidence_path,
                                             read_evidence, seed_verdicts)

    keys = {e["key"] for e in manifest["experiments"]}
    ev = default_engine_rows(read_evidence(default_evidence_path(None)))  # the cache holds other studies' runs too
    ev = ev[ev["test"] == TEST_VERSION]
    conv = ev[ev["workload"] == FULL.convergence_workload]
    grid = ev[ev["workload"].map(FULL.n_tasks) == ev["n_tasks"]]
    v = seed_verdicts(grid)
    first_fail = v[v["growing"]].groupby(["workload", "policy"])["load"].min()
    reached = v[[load <= first_fail.get((w, p), float("inf")) + 1e-9
                 for w, p, load in zip(v["workload"], v["policy"], v["load"])]]
    runs = pd.concat([reached, conv])
    assert len(runs) > 1000
    missing = [f"{r.workload}/{r.policy}@{r.load}x seed {r.seed}" for r in runs.itertuples() if r.key not in keys]
    assert not missing, f"{len(missing)} protocol runs not shipped, e.g. {missing[:3]}"


def test_the_eviction_study_ships_tasks_only():
    """Notebook 15 reads its runs' summaries and tasks: a seed-0 run of the default engine in its
    grid keeps no per-request table (the pack's size limit), a loaded one keeps every table."""
    mod = load_pack_script()
    keys = mod.eviction_study_keys()
    from studies.eviction.study import eviction_study_grid

    default = [e for e in eviction_study_grid() if e.seed == 0 and not e.engine_options]
    assert default and all(e.key() in keys for e in default)
    fields = {"seed": 0, "engine_model": "stock"}
    assert mod.shipped_tables(fields, loaded=False) == ["tasks", "requests"]
    assert mod.shipped_tables(fields, loaded=False, tasks_only=True) == ["tasks"]
    assert mod.shipped_tables(fields, loaded=True, tasks_only=True) == list(TABLES)



def test_the_eviction_full_length_stage_ships_summaries_only(tmp_path):
    """Notebook 15's full-length stage reads its runs' summaries and the cached evidence: its sweep
    logs ``summary`` lines, so the pack ships their meta.json alone (not the screen's tasks-only
    rule; their tasks tables would take the pack over 50 MB)."""
    import pandas as pd

    from studies.eviction.study import full_length_grid

    mod = load_pack_script()
    screen = pd.DataFrame([{"workload": "dag-4", "host_tier": h, "admission": a, "eviction": e, "jct_mean": 1.0}
                           for h in ("none", "hicache") for a, e in (("lpm", "lru"), ("lpm", "kvflow"),
                                                                      ("topas-both", "policy"))])
    full = full_length_grid(screen)
    assert full and not {e.key() for e in full} & mod.eviction_study_keys()
    log = tmp_path / "log.txt"
    log.write_text("".join(f"summary {e.key()}\n" for e in full))
    keys, loaded, summary_only = mod.read_log(log)
    assert summary_only == {e.key() for e in full} and not loaded
    fields = {"seed": 0, "engine_model": "stock", "workload": "dag-4"}
    assert mod.shipped_tables(fields, loaded=False, summary_only=True,
                              tasks_only=full[0].key() in mod.eviction_study_keys()) == []
