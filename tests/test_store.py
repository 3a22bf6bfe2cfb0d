"""topas.experiments.store: atomic Parquet results store and resumable sweeps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pandas as pd
import pytest

import topas
import topas.experiments.sweep as sweep_mod
from topas.engine.metrics import WALL_CLOCK_KEYS
from topas.experiments import Experiment, ExperimentFailed, run_experiment
from topas.experiments.store import TABLES, ResultStore, run_sweep
from topas.paths import REPO_ROOT


def exp(seed: int = 0, **kw) -> Experiment:
    return Experiment(**{**dict(workload="dag-4", policy="fcfs", load=1.2, seed=seed, n_tasks=10), **kw})


def _det(table: pd.DataFrame) -> pd.DataFrame:
    return table.drop(columns=["wall_s"]) if "wall_s" in table.columns else table


def test_put_has_load_round_trip(tmp_path):
    s = ResultStore(tmp_path)
    e = exp(policy="topas", params={"beta": 0.5})  # decisions carry info_ columns
    assert not s.has(e) and s.keys() == []
    r = run_experiment(e)
    d = s.put(e, r)
    assert d == tmp_path / e.key()[:2] / e.key()
    assert sorted(p.name for p in d.iterdir()) == sorted([f"{t}.parquet" for t in TABLES] + ["meta.json"])
    assert s.has(e) and s.has(e.key()) and s.keys() == [e.key()]
    assert not list(tmp_path.glob(".tmp-*"))

    back = s.load(e)
    fresh = run_experiment(e)  # the stored tables equal a fresh run's deterministic tables
    for name in TABLES:
        pd.testing.assert_frame_equal(_det(getattr(back, name)), _det(getattr(fresh, name)), obj=name)
    assert {k: v for k, v in back.summary.items() if k not in WALL_CLOCK_KEYS} == fresh.deterministic_summary()

    meta = s.meta(e)
    assert meta["key"] == e.key() and meta["experiment"] == e.fields()
    assert meta["topas_version"] == topas.__version__
    assert meta["git_commit"] == "unknown" or len(meta["git_commit"]) == 40
    assert meta["git_dirty"] in (True, False, None) and meta["environment"]["git_dirty"] == meta["git_dirty"]
    for lib in ("python", "numpy", "pandas", "pyarrow", "matplotlib", "seaborn", "topas"):
        assert meta["environment"][lib] and meta["environment"][lib] != "not installed", lib
    assert meta["canonical"]["code"] == e.canonical()["code"]
    assert meta["profile_hash"] == e.load_cost().profile_hash and meta["engine"] == "sim"
    assert meta["created"]

    df = s.summaries()
    assert list(df["key"]) == [e.key()] and df["policy"].iloc[0] == "topas"
    assert df["rate"].iloc[0] == pytest.approx(1.2 * 0.15) and df["jct_mean"].iloc[0] == r.summary["jct_mean"]
    # a second put of the same key keeps the first result
    s.put(e, fresh)
    assert s.meta(e)["created"] == meta["created"]
    with pytest.raises(KeyError, match="seed=1"):
        s.load(exp(seed=1))


def test_incomplete_results_are_ignored(tmp_path):
    s = ResultStore(tmp_path)
    e, f = exp(0), exp(1)
    # a left-over temp dir of a killed writer, complete but for its rename
    s.put(e, run_experiment(e))
    os.rename(s.path(e), tmp_path / f".tmp-{e.key()}-999999999")
    # a final directory without meta.json
    partial = s.path(f)
    partial.mkdir(parents=True)
    (partial / "tasks.parquet").write_bytes(b"junk")
    assert s.keys() == [] and not s.has(e) and not s.has(f)
    assert s.summaries().empty

    df = run_sweep([e, f], s, jobs=1, progress=False)
    assert list(df["key"]) == [e.key(), f.key()] and s.has(e) and s.has(f)
    assert len(s.load(f).tasks) == 10  # the junk directory was replaced
    # the killed writer's temp dir went with the next write (issue 44): nothing left to clean
    assert not (tmp_path / f".tmp-{e.key()}-999999999").exists() and s.clean() == []


def test_changed_spec_is_not_served_from_the_store(tmp_path, counted):
    s = ResultStore(tmp_path)
    run_sweep([exp(0)], s, jobs=1, progress=False)
    assert len(counted) == 1
    run_sweep([exp(0)], s, jobs=1, progress=False)
    assert len(counted) == 1  # served from the store
    changed = [exp(1), exp(0, load=1.3), exp(0, policy="topas", params={"beta": 0.5}),
               exp(0, policy="topas", params={"beta": 0.6})]
    df = run_sweep(changed, s, jobs=1, progress=False)
    assert counted[1:] == [c.key() for c in changed]
    assert len(set(df["key"])) == 4 and exp(0).key() not in set(df["key"])
    assert len(s.keys()) == 5


def test_sweep_dedupes_keeps_order_and_runs_in_parallel(tmp_path):
    s = ResultStore(tmp_path)
    exps = [exp(2), exp(0), exp(1), exp(0, params={})]  # the last equals exp(0)
    df = run_sweep(exps, s, jobs=2, progress=False)
    assert list(df["key"]) == [e.key() for e in exps] and list(df["seed"]) == [2, 0, 1, 0]
    assert len(s.keys()) == 3
    for e in exps[:3]:
        fresh = run_experiment(e)
        pd.testing.assert_frame_equal(s.load(e).requests, fresh.requests)


def test_a_sweep_on_several_workers_starts_the_longest_runs_first(tmp_path, monkeypatch):
    import topas.experiments.dispatch as dispatch
    from topas.experiments.run_cost import longest_first

    started: list[str] = []
    monkeypatch.setattr(dispatch, "map_experiments",
                        lambda fn, exps, **kw: started.extend(e.label() for e in exps) or [fn(e) for e in exps])
    exps = [Experiment("chain-3", "fcfs", n_tasks=n, seed=0) for n in (2, 6, 4)]
    summaries = run_sweep(exps, tmp_path, jobs=2, progress=False)
    assert started == [exps[1].label(), exps[2].label(), exps[0].label()]  # 6, 4, 2 tasks
    assert list(summaries["n_tasks"]) == [2, 6, 4]  # the summaries in the input order all the same
    # priced by the plan's per-task costs where they are measured: a costlier policy goes first
    costs = {"fcfs": {"chain-3": 0.001}, "topas": {"chain-3": 0.01}}
    mixed = [Experiment("chain-3", "fcfs", n_tasks=6), Experiment("chain-3", "topas", n_tasks=2)]
    assert [e.policy for e in longest_first(mixed, costs)] == ["topas", "fcfs"]
    assert [e.policy for e in longest_first(mixed, {})] == ["fcfs", "topas"]
    # a run of the whole trace is priced by the trace's tasks, with or without measured costs
    whole = Experiment("chain-3", "fcfs")
    for c in (costs, {}):
        assert longest_first([exps[1], whole], c)[0] is whole


def test_sweep_names_a_failing_experiment_and_keeps_finished_results(tmp_path, monkeypatch):
    s = ResultStore(tmp_path)
    real = sweep_mod.run_experiment

    def flaky(e):
        if e.seed == 1:
            raise RuntimeError("kaput")
        return real(e)

    monkeypatch.setattr(sweep_mod, "run_experiment", flaky)
    with pytest.raises(ExperimentFailed, match=r"dag-4/fcfs@load=1.2,seed=1,tasks=10.*kaput"):
        run_sweep([exp(0), exp(1), exp(2)], s, jobs=1, progress=False)
    assert s.keys() == [exp(0).key()]
    assert not list(tmp_path.glob(".tmp-*"))


KILLED_SWEEP = textwrap.dedent(
    """
    import sys, time
    import topas.experiments.sweep as st
    from topas.experiments import Experiment

    real = st.run_experiment
    def slow(e):
        time.sleep(0.4)
        return real(e)
    st.run_experiment = slow
    exps = [Experiment("dag-4", "fcfs", load=1.2, seed=s, n_tasks=10) for s in range(6)]
    st.run_sweep(exps, st.ResultStore(sys.argv[1]), jobs=1, progress=False)
    """
)


def test_killed_sweep_resumes_with_only_the_missing_runs(tmp_path, counted):
    s = ResultStore(tmp_path)
    exps = [exp(i) for i in range(6)]
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SWEEP, str(tmp_path)], cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not s.keys():
            assert proc.poll() is None, proc.communicate()[1].decode()
            assert time.monotonic() < deadline, "no result appeared in the store"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    done_before = s.keys()
    assert 1 <= len(done_before) < 6
    created = {k: s.meta(k)["created"] for k in done_before}

    df = run_sweep(exps, s, jobs=1, progress=False)
    missing = [e.key() for e in exps if e.key() not in done_before]
    assert counted == missing  # only the missing runs ran, in the input order
    assert sorted(s.keys()) == sorted(e.key() for e in exps)
    assert list(df["key"]) == [e.key() for e in exps]
    assert {k: s.meta(k)["created"] for k in done_before} == created  # finished runs were kept
    # and a third run runs nothing
    run_sweep(exps, s, jobs=1, progress=False)
    assert counted == missing


def test_sweep_checks_specs_first(tmp_path):
    from topas.policies import PolicyError

    with pytest.raises(PolicyError, match="unknown policy 'nope'"):
        run_sweep([exp(0), exp(0, policy="nope")], ResultStore(tmp_path), jobs=1, progress=False)
    assert ResultStore(tmp_path).keys() == []
    with pytest.raises(ValueError, match="jobs"):
        run_sweep([exp(0)], ResultStore(tmp_path), jobs=0, progress=False)
    assert run_sweep([], ResultStore(tmp_path), progress=False).empty


def test_meta_json_is_valid_json(tmp_path):
    s = ResultStore(tmp_path)
    run_sweep([exp(0)], s, jobs=1, progress=False)
    text = (s.path(exp(0)) / "meta.json").read_text()
    assert json.loads(text)["canonical"] == exp(0).canonical()
