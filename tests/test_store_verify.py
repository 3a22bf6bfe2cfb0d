"""Stored results are verified on read (issue 44): checksums in meta.json, a damaged result named
and treated as absent (never served, re-run by the next sweep), stale temp folders removed on the
next write, ``check_results.py --verify`` over a whole store or pack."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings

import pytest

from topas.experiments import Experiment
from topas.experiments.store import TABLES, DamagedResultWarning, ResultStore, TrimmedResult, run_sweep
from topas.paths import REPO_ROOT

pytestmark = pytest.mark.filterwarnings("ignore::topas.experiments.store.DamagedResultWarning")


def exp(seed: int = 0) -> Experiment:
    return Experiment(workload="chain-3", policy="fcfs", load=1.0, seed=seed, n_tasks=4)


@pytest.fixture
def stored(tmp_path, counted):
    """A store holding seeds 0 and 1, and a counter of the runs a sweep makes."""
    s = ResultStore(tmp_path / "store")
    run_sweep([exp(0), exp(1)], s, jobs=1, progress=False)
    counted.clear()
    return s, counted


def test_every_new_result_records_the_checksums_of_its_tables(stored):
    s, _ = stored
    sums = s.meta(exp(0))["checksums"]
    assert sorted(sums) == sorted(f"{t}.parquet" for t in TABLES)
    assert all(len(v["sha256"]) == 64 and v["bytes"] > 0 for v in sums.values())


def damage_bit_flip(d):
    p = d / "requests.parquet"
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    p.write_bytes(bytes(raw))


def damage_swap(d):  # the table of the other stored result
    other = next(x for x in d.parent.parent.glob("*/*") if x.is_dir() and x != d)
    shutil.copy(other / "tasks.parquet", d / "tasks.parquet")


def damage_truncate(d):
    p = d / "decisions.parquet"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def damage_delete(d):
    (d / "timeline.parquet").unlink()


def damage_meta(d):
    p = d / "meta.json"
    p.write_text(p.read_text()[:100])


@pytest.mark.parametrize("damage", [damage_bit_flip, damage_swap, damage_truncate, damage_delete, damage_meta])
def test_a_damaged_result_is_named_never_served_and_rerun_by_the_next_sweep(stored, damage):
    s, runs = stored
    e = exp(0)
    damage(s.path(e))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not ResultStore(s.root).has(e)
    assert any(issubclass(w.category, DamagedResultWarning) and e.key()[:12] in str(w.message) for w in caught)
    with pytest.raises(KeyError, match="damaged"):
        s.load(e)
    assert "left out to keep the repository small" not in str(s.damaged(e.key()))
    df = run_sweep([e, exp(1)], s, jobs=1, progress=False)  # resumes: re-runs only the damaged one
    assert runs == [e.key()]
    assert s.has(e) and len(s.load(e).tasks) == 4 and df["jct_mean"].notna().all()


def test_a_result_without_checksums_still_loads_if_whole(stored):
    s, runs = stored
    d = s.path(exp(0))
    meta = json.loads((d / "meta.json").read_text())
    del meta["checksums"]  # as the committed pack was written
    (d / "meta.json").write_text(json.dumps(meta))
    s2 = ResultStore(s.root)
    assert s2.has(exp(0)) and len(s2.load(exp(0)).tasks) == 4
    damage_truncate(d)  # structural check: a truncated Parquet file is caught all the same
    assert not ResultStore(s.root).has(exp(0))


def test_a_deleted_table_of_a_pack_is_trimmed_only_if_the_manifest_says_so(stored, tmp_path):
    s, _ = stored
    pack = tmp_path / "pack"
    shutil.copytree(s.root, pack)
    e0, e1 = exp(0), exp(1)
    manifest = {"experiments": [{"key": e0.key(), "tables": ["tasks"]}, {"key": e1.key(), "tables": list(TABLES)}]}
    (pack / "manifest.json").write_text(json.dumps(manifest))
    for t in TABLES[1:]:
        (pack / e0.key()[:2] / e0.key() / f"{t}.parquet").unlink()
    (pack / e1.key()[:2] / e1.key() / "timeline.parquet").unlink()
    p = ResultStore(tmp_path / "empty", packs=[pack])
    with pytest.raises(TrimmedResult, match="left out"):
        p.load(e0)  # the pack left them out: said so
    assert not p.has(e1)  # lost, not left out: damaged, absent
    with pytest.raises(KeyError, match="timeline.parquet is missing"):
        p.load(e1)


def test_stale_temp_folders_of_killed_writers_go_with_the_next_write(stored):
    s, _ = stored
    stale = s.root / f".tmp-{exp(5).key()}-999999999"
    stale.mkdir()
    (stale / "tasks.parquet").write_bytes(b"half")
    live = s.root / f".tmp-{exp(6).key()}-{os.getpid()}"
    live.mkdir()
    run_sweep([exp(2)], s, jobs=1, progress=False)
    assert not stale.exists() and live.exists()


def check_verify(*args):
    return subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "check_results.py"), "--verify", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_check_results_verify_names_each_damaged_result(stored):
    s, _ = stored
    r = check_verify("--store", s.root)
    assert r.returncode == 0 and "verified 2 stored result(s)" in r.stdout and "0 damaged" in r.stdout
    damage_meta(s.path(exp(0)))
    damage_bit_flip(s.path(exp(1)))
    r = check_verify("--store", s.root)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert f"{exp(0).key()}: meta.json is not valid JSON" in r.stdout
    assert f"{exp(1).key()}: requests.parquet does not match its recorded sha256" in r.stdout


def test_a_dead_writers_temp_folder_goes_with_the_next_write_even_while_it_is_an_unreaped_zombie(tmp_path):
    """A killed sweep's workers may linger as zombies (exited, never reaped: their new parent in a
    container need not reap them); they hold nothing, so their temp folders are removed."""
    import time

    from topas.experiments.result_store import _alive

    pid = os.fork()
    if pid == 0:  # the child exits at once; the parent does not wait for it yet: a zombie
        os._exit(0)
    try:
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _alive(pid)
        s = ResultStore(tmp_path / "store")
        (s.root / f".tmp-{'0' * 64}-{pid}").mkdir(parents=True)
        (s.root / f".tmp-{'1' * 64}-{os.getpid()}").mkdir()  # this process's: a live writer
        assert [p.name for p in s.clean_tmp()] == [f".tmp-{'0' * 64}-{pid}"]
    finally:
        os.waitpid(pid, 0)
