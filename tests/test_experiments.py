"""topas.experiments: spec keys, run_experiment, run_many, and scripts/reproduce.py end to end."""

from __future__ import annotations

import csv
import json
import pickle
import re
import os
import subprocess
import sys

import pytest

from topas.policies import policy_class

from topas.engine.cost import DEFAULT_PROFILE, ProfileError, available_profiles
from topas.engine.metrics import WALL_CLOCK_KEYS
from topas.experiments import Experiment, ExperimentError, ExperimentFailed, run_experiment, run_many
from studies import grid
from topas.paths import REPO_ROOT, profiles_dir
from topas.policies import PolicyError
from topas.workload.trace_io import read_trace, write_trace

BASE = dict(workload="dag-4", policy="topas", params={"beta": 0.5}, load=1.2, seed=0, n_tasks=10)


def exp(**kw) -> Experiment:
    return Experiment(**{**BASE, **kw})


# ----------------------------------------------------------------------------- the spec


def test_spec_is_hashable_and_normalises_params():
    a = exp(params={"rho": 2, "beta": 0.5})
    b = exp(params=[("beta", 0.5), ("rho", 2)])
    assert a.params == (("beta", 0.5), ("rho", 2))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert pickle.loads(pickle.dumps(a)) == a


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(rate=0.2, load=1.0), "either rate or load"),
        (dict(load=0), "load"),
        (dict(load=None, rate=-1.0), "rate"),
        (dict(seed=1.5), "seed"),
        (dict(n_tasks=0), "n_tasks"),
        (dict(engine="gpu"), "unknown engine 'gpu'"),
        (dict(params={"beta": [1]}), "beta"),
    ],
)
def test_spec_rejects_bad_fields(kw, message):
    with pytest.raises(ExperimentError, match=message):
        exp(**kw)


def test_resolve_rate():
    assert exp().resolve_rate() == pytest.approx(1.2 * 0.15)
    assert exp(load=None, rate=0.3).resolve_rate() == 0.3
    assert exp(load=None).resolve_rate() is None


def test_key_is_stable_across_processes():
    e = exp()
    code = (
        "from topas.experiments import Experiment;"
        "print(Experiment('dag-4', 'topas', {'beta': 0.5}, load=1.2, seed=0, n_tasks=10).key())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    assert out.stdout.strip() == e.key()
    assert len(e.key()) == 64 and e.key() == exp().key()
    assert pickle.loads(pickle.dumps(e)).key() == e.key()


def test_key_is_canonical():
    # CLI strings and typed values, load and the equal rate, defaults given or not: one key
    assert exp(params={"beta": "0.5"}).key() == exp().key()
    assert exp(load=None, rate=1.2 * 0.15).key() == exp().key()
    default_rho = policy_class("topas").Params().rho
    assert exp(params={"beta": 0.5, "rho": default_rho}).key() == exp().key()
    # the profile by path or by name
    path = str(profiles_dir() / f"{DEFAULT_PROFILE}.json")
    assert exp(profile=path).key() == exp().key()
    # without re-timing, the (unused) seed does not matter
    assert exp(load=None, seed=1).key() == exp(load=None, seed=2).key()


@pytest.mark.parametrize(
    "change",
    [
        dict(params={"beta": 0.6}),
        dict(params={"beta": 0.5, "rho": 0.0}),
        dict(policy="topas-base", params={}),
        dict(seed=1),
        dict(load=1.3),
        dict(load=None),
        dict(n_tasks=11),
        dict(workload="chain-3"),
        dict(kv_budget=30000),
    ],
)
def test_key_changes_with_the_spec(change):
    assert exp(**change).key() != exp().key()


def test_key_changes_with_the_profile(tmp_path):
    others = [p for p in available_profiles() if p != DEFAULT_PROFILE]
    assert others
    assert exp(profile=others[0]).key() != exp().key()
    d = json.loads((profiles_dir() / f"{DEFAULT_PROFILE}.json").read_text())
    same = tmp_path / "same.json"
    same.write_text(json.dumps(d))
    assert exp(profile=str(same)).key() == exp().key()  # same numbers, another name
    d["decode"]["c0"] *= 1.01
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(d))
    assert exp(profile=str(changed)).key() != exp().key()


def test_a_profile_rewritten_in_place_gives_a_new_key_in_the_same_process(tmp_path):
    # the key's parts that experiments share are memoised per process, per profile file stamp
    d = json.loads((profiles_dir() / f"{DEFAULT_PROFILE}.json").read_text())
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    before = exp(profile=str(path)).key()
    d["decode"]["c0"] *= 1.01
    path.write_text(json.dumps(d) + " " * 8)  # another size: the stamp differs even on a coarse clock
    assert exp(profile=str(path)).key() != before


def test_a_bad_parameter_is_refused_at_every_key_not_only_the_first():
    with pytest.raises(PolicyError, match="no_such"):
        exp(params={"no_such": 1}).key()
    with pytest.raises(PolicyError, match="no_such"):
        exp(params={"no_such": 1}).key()


def test_canonical_forms_share_no_dict_a_caller_could_change():
    a, b = exp(), exp()
    a.canonical()["params"]["beta"] = "changed"
    a.canonical()["engine_config"]["recheck_steps"] = -1
    assert b.canonical()["params"].get("beta") != "changed"
    assert b.canonical()["engine_config"]["recheck_steps"] != -1
    assert b.key() == exp().key()


def test_key_changes_with_the_trace_content(tmp_path):
    t = read_trace(REPO_ROOT / "data" / "traces" / "dag-4.json.gz")
    copy = write_trace(t, tmp_path / "dag-4.json.gz")
    assert exp(workload=str(copy)).key() == exp().key()  # same bytes under another path
    first = t.tasks[0]
    s0 = first.stages[0]
    edited = type(s0)(id=s0.id, agent=s0.agent, input_tokens=s0.input_tokens + 1,
                      output_tokens=s0.output_tokens, parents=s0.parents)
    tasks = (type(first)(id=first.id, arrival=first.arrival, stages=(edited, *first.stages[1:]),
                         workflow=first.workflow), *t.tasks[1:])
    changed = write_trace(type(t)(name=t.name, agents=t.agents, tasks=tasks, meta=t.meta), tmp_path / "x.json.gz")
    assert exp(workload=str(changed)).key() != exp().key()


@pytest.mark.parametrize(
    "kw, error, message",
    [
        (dict(workload="no-such"), ExperimentError, "available traces: chain-2, chain-3, dag-10-wide, dag-4"),
        (dict(workload="missing/trace.json.gz"), FileNotFoundError, "missing/trace.json.gz"),
        (dict(policy="nope"), PolicyError, "valid policies"),
        (dict(params={"bogus": 1}), PolicyError, "valid parameters"),
        (dict(profile="nope"), ProfileError, "available profiles"),
    ],
)
def test_errors_name_the_bad_item(kw, error, message):
    e = exp(**kw)
    with pytest.raises(error, match=message):
        e.key()
    with pytest.raises(error, match=message):
        run_experiment(e)


def test_run_experiment():
    r = run_experiment(exp())
    assert r.summary["n_tasks"] == 10 and r.summary["n_requests"] == 40
    assert r.tasks["arrival"].iloc[0] == 0.0
    assert r.deterministic_summary() == run_experiment(exp()).deterministic_summary()


# ----------------------------------------------------------------------------- run_many


def _deterministic(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in WALL_CLOCK_KEYS}


def test_run_many_parallel_equals_serial():
    exps = [exp(policy=p, params={}, seed=s, n_tasks=8) for p in ("fcfs", "parrot-fcfs", "topas") for s in (0, 1)]
    exps.append(exp(workload="chain-3", n_tasks=8))
    serial = run_many(exps, jobs=1, progress=False, store=False)
    parallel = run_many(exps, jobs=2, progress=False, store=False)
    assert [_deterministic(r) for r in serial] == [_deterministic(r) for r in parallel]
    assert [r["key"] for r in serial] == [e.key() for e in exps]
    assert [(r["policy"], r["seed"]) for r in serial] == [(e.policy, e.seed) for e in exps]
    row = serial[-1]
    assert row["workload"] == "chain-3" and row["params"] == '{"beta":0.5}'
    assert row["rate"] == pytest.approx(1.2 * 0.2) and row["load"] == 1.2 and row["rate_given"] is None
    assert row["n_tasks"] == 8 and row["n_tasks_limit"] == 8
    for k in ("jct_mean", "jct_p99", "throughput_rps", *WALL_CLOCK_KEYS):
        assert k in row


def test_run_many_checks_specs_before_running():
    with pytest.raises(PolicyError, match="unknown policy 'nope'"):
        run_many([exp(), exp(policy="nope")], jobs=1, progress=False)
    assert run_many([], progress=False) == []
    with pytest.raises(ValueError, match="jobs"):
        run_many([exp()], jobs=0, progress=False)


def test_topas_jobs_sets_the_workers_of_a_sweep_that_does_not_say(monkeypatch):
    from topas.experiments import dispatch

    seen = []
    real = dispatch.map_experiments

    def spy(fn, exps, jobs=1, progress=True, desc="experiments"):
        seen.append(jobs)
        return real(fn, exps, jobs=1, progress=progress, desc=desc)  # (in this process: the count is the point)

    monkeypatch.setattr("topas.experiments.local.map_experiments", spy)
    exps = [exp(n_tasks=4, seed=s) for s in range(3)]
    monkeypatch.setenv("TOPAS_JOBS", "1")
    run_many(exps, progress=False, store=False)
    monkeypatch.setenv("TOPAS_JOBS", " 2 ")
    run_many(exps, progress=False, store=False)
    run_many(exps, jobs=3, progress=False, store=False)  # a sweep that says wins
    monkeypatch.delenv("TOPAS_JOBS")
    run_many(exps, progress=False, store=False)
    assert seen == [1, 2, 3, min(len(exps), os.cpu_count() or 1)]


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_topas_jobs_is_refused_naming_it(monkeypatch, value):
    monkeypatch.setenv("TOPAS_JOBS", value)
    with pytest.raises(ValueError, match=rf"\$TOPAS_JOBS='{re.escape(value)}': worker processes must be a whole number"):
        run_many([exp(n_tasks=4)], progress=False, store=False)


def test_run_many_names_a_failing_experiment(monkeypatch, tmp_path):
    import topas.experiments.local as local

    def boom(p, *a, **k):
        raise RuntimeError("kaput")

    monkeypatch.setattr("topas.engine.simulator.simulate", boom)
    for store in (False, tmp_path / "store"):
        with pytest.raises(ExperimentFailed, match=r"dag-4/topas\[beta=0.5\]@load=1.2,seed=0,tasks=10.*kaput"):
            local.run_many([exp()], jobs=1, progress=False, store=store)


# ----------------------------------------------------------------------------- reproduce.py

SCRIPT = REPO_ROOT / "scripts" / "reproduce.py"


def reproduce(*args, store=None, **kw):
    """Run scripts/reproduce.py; ``store``: the working results store (``$TOPAS_STORE``)."""
    env = {**os.environ, **({"TOPAS_STORE": str(store)} if store is not None else {})}
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          cwd=REPO_ROOT, env=env, **kw)


@pytest.mark.slow
@pytest.mark.search_kernel
def test_reproduce_quick_end_to_end(tmp_path):
    out = tmp_path / "figs"
    # the notebooks are executed by tests/test_notebooks.py (each against a temporary store)
    r = reproduce("--quick", "--tasks", 20, "--seeds", 1, "--jobs", 2, "--out-dir", out, "--no-progress",
                  "--no-notebooks", store=tmp_path / "store", timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    # the plan first, then every workload's runs in one pool
    n = 3 * len(grid.swept_policies())  # every policy but those that decide eviction
    assert "plan (grid quick, on the simulator):" in r.stdout and f"results table: {n} simulations" in r.stdout
    assert f"{n} simulations to run (0 already stored, skipped)" in r.stdout
    with open(out / "results_synthetic.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    policies = grid.swept_policies()
    assert {(x["workload"], x["policy"]) for x in rows} == {
        (w, p) for w in ("chain-3", "dag-4", "dag-10-wide") for p in policies}
    assert len(rows) == 3 * len(policies)
    topas = [x for x in rows if x["policy"] == "topas"]
    paper = {"chain-3": ("-27.5", "-31.7"), "dag-4": ("-39.8", "-49.4"), "dag-10-wide": ("-27.7", "-30.8")}
    baselines = {"fcfs", "lpm", "spf", "parrot-fcfs", "autellix-las"}
    for x in topas:
        assert (x["paper_mean_vs_best_pct"], x["paper_p99_vs_best_pct"]) == paper[x["workload"]]
        assert x["best_baseline_mean"] in baselines and x["best_baseline_p99"] in baselines
        base = [float(y["jct_mean"]) for y in rows if y["workload"] == x["workload"] and y["policy"] in baselines]
        assert float(x["mean_vs_best_pct"]) == pytest.approx(100 * (float(x["jct_mean"]) - min(base)) / min(base))
    assert all(x["kind"] == ("ours" if x["policy"] == "topas-plus" else "ablation")
               for x in rows if x["policy"].startswith("topas-"))
    assert all(x["paper_mean_vs_best_pct"] == "" for x in rows if x["policy"] != "topas")
    md = (out / "results_synthetic.md").read_text()
    assert "paper (reported)" in md and "| dag-10-wide | **topas** |" in md
    assert "topas-base (ablation)" in md
    runs = list(csv.DictReader(open(out / "results_synthetic_runs.csv", newline="")))
    assert len(runs) == 3 * len(policies)
    inputs = json.loads((out / "results_synthetic_inputs.json").read_text())
    assert inputs["settings"]["tasks"] == 20 and len(inputs["runs"]) == 3 * len(policies)
    assert {r["key"] for r in inputs["runs"]} == {r["key"] for r in runs}
    assert inputs["environment"]["numpy"] and "git_dirty" in inputs["environment"]
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*"))

    # --figures-only re-renders the same table from the CSV, without simulating
    before = md
    (out / "results_synthetic.md").unlink()
    r = reproduce("--figures-only", "--out-dir", out, "--no-notebooks", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "no simulation" in r.stdout
    assert (out / "results_synthetic.md").read_text() == before


def test_reproduce_figures_only_needs_the_csv(tmp_path):
    r = reproduce("--figures-only", "--out-dir", tmp_path, timeout=60)
    assert r.returncode != 0 and "results_synthetic.csv" in r.stderr and "not found" in r.stderr


def test_reproduce_on_sglang_needs_a_server(tmp_path):
    r = reproduce("--engine", "sglang", "--out-dir", tmp_path, timeout=60)
    assert r.returncode == 2 and "--server" in r.stderr and "TOPAS_SGLANG_URL" in r.stderr


def test_sglang_experiments_need_a_server_url(monkeypatch):
    from topas.sglang.urls import SGLANG_URL_ENV

    monkeypatch.delenv(SGLANG_URL_ENV, raising=False)
    monkeypatch.delenv("TOPAS_SGLANG_IDENTITY", raising=False)
    e = Experiment("dag-4", "fcfs", load=1.2, n_tasks=5, engine="sglang")
    # the key names the server (tests/test_sglang_server.py), so without one there is no key
    with pytest.raises(ExperimentError, match="TOPAS_SGLANG_URL"):
        e.key()
    with pytest.raises(ExperimentError, match="TOPAS_SGLANG_URL"):
        run_experiment(e)


def test_grids_take_their_engine_from_the_environment(monkeypatch):
    monkeypatch.delenv("TOPAS_ENGINE", raising=False)
    assert {e.engine for e in grid.jct_vs_load(["dag-4"], quick=True)} == {"sim"}
    monkeypatch.setenv("TOPAS_ENGINE", "sglang")
    assert {e.engine for e in grid.jct_vs_load(["dag-4"], quick=True)} == {"sglang"}
    assert {e.engine for e in grid.sensitivity("dag-4", quick=True)} == {"sglang"}
    assert {e.engine for e in grid.one_run_per_policy(["dag-4"], ["fcfs"], 1.2, 0, 5)} == {"sglang"}
    monkeypatch.setenv("TOPAS_ENGINE", "gpu")
    with pytest.raises(ExperimentError, match=r"TOPAS_ENGINE='gpu' is not an engine"):
        grid.jct_vs_load(["dag-4"], quick=True)


def test_sglang_sweeps_run_one_at_a_time_in_this_process(tmp_path, monkeypatch):
    """Replays share one server, so a sweep never runs two at once (whatever jobs says)."""
    import os

    from topas.engine.simulator import simulate
    from topas.experiments import spec as spec_mod
    from topas.experiments.store import ResultStore, run_sweep

    calls = []

    def fake_replay(p, url, progress=False):  # stands in for topas.sglang.replay.run_replay
        calls.append((os.getpid(), url, p.experiment.seed))
        return simulate(p.trace, p.policy, p.cost, p.config)

    from topas.sglang import engine as sglang_engine
    from topas.sglang.urls import SGLANG_URL_ENV

    monkeypatch.setenv(SGLANG_URL_ENV, "http://127.0.0.1:1")

    monkeypatch.setattr(sglang_engine, "sglang_server_identity", lambda policy=None: {"device": "test"})  # no handshake
    monkeypatch.setattr(spec_mod, "run_prepared",
                        lambda p, progress=False: fake_replay(p, sglang_engine.sglang_url(), progress))
    exps = [Experiment("dag-4", "fcfs", load=1.2, seed=s, n_tasks=5, engine="sglang") for s in range(3)]
    df = run_sweep(exps, ResultStore(tmp_path), jobs=2, progress=False)
    assert calls == [(os.getpid(), "http://127.0.0.1:1", s) for s in range(3)]
    assert list(df["engine"]) == ["sglang"] * 3
    assert ResultStore(tmp_path).meta(exps[0])["engine"] == "sglang"


def test_engine_options_configure_the_simulator_under_their_own_key():
    from dataclasses import replace

    from topas.engine.config import LEGACY_ENGINE, EngineConfig
    from topas.engine.simulator import simulate
    from topas.experiments.spec import ExperimentError, prepare

    e = Experiment("dag-4", "fcfs", load=1.2, seed=0, n_tasks=15, engine_options={"host_tier": "true"})
    base = Experiment("dag-4", "fcfs", load=1.2, seed=0, n_tasks=15)
    assert e.key() != base.key() and e.engine_config() == replace(EngineConfig(), host_tier=True)
    assert e.engine_options == (("host_tier", True),) and e.engine_model == "host_tier=True"
    assert base.engine_model == "stock" and base.engine_config() == EngineConfig()
    assert Experiment("dag-4", "fcfs", engine_options=LEGACY_ENGINE).engine_model == "legacy"
    assert "engine[host_tier=True]" in e.label()
    p = prepare(e)
    want = simulate(p.trace, p.policy, p.cost, replace(EngineConfig(), host_tier=True))
    assert run_experiment(e).deterministic_summary() == want.deterministic_summary()
    with pytest.raises(ExperimentError, match="unknown engine option 'host_teir'.*host_tier"):
        Experiment("dag-4", "fcfs", engine_options={"host_teir": True})
    with pytest.raises(ExperimentError, match="host_tier='maybe'"):
        Experiment("dag-4", "fcfs", engine_options={"host_tier": "maybe"})
    with pytest.raises(ExperimentError, match="simulator only"):
        Experiment("dag-4", "fcfs", engine="sglang", engine_options={"host_tier": True})
