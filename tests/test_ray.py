"""Sweeps on Ray: the same results as local processes, written by the driver, resumable, and a
failing experiment named. Runs against a real local Ray instance with two CPUs."""

from __future__ import annotations

import pandas as pd
import pytest

ray = pytest.importorskip("ray", reason="the Ray extra is installed by `make install`")

from topas.experiments import Experiment, ExperimentFailed, ResultStore, run_many, run_sweep  # noqa: E402
from topas.experiments.ray_backend import RAY_ADDRESS_ENV, resolve_address  # noqa: E402
from topas.engine.metrics import WALL_CLOCK_KEYS  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def exp(seed: int = 0, **kw) -> Experiment:
    return Experiment(**{**dict(workload="dag-4", policy="fcfs", load=1.2, seed=seed, n_tasks=10), **kw})


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _deterministic(df: pd.DataFrame) -> pd.DataFrame:
    drop = [c for c in df.columns if c in WALL_CLOCK_KEYS or c in ("created",)]
    return df.drop(columns=drop).reset_index(drop=True)


def test_address_comes_from_the_argument_then_the_environment(monkeypatch):
    monkeypatch.delenv(RAY_ADDRESS_ENV, raising=False)
    assert resolve_address(None) is None
    monkeypatch.setenv(RAY_ADDRESS_ENV, "auto")
    assert resolve_address(None) == "auto"
    assert resolve_address("local") == "local"
    monkeypatch.setenv(RAY_ADDRESS_ENV, "  ")
    assert resolve_address(None) is None


def test_ray_sweep_stores_the_same_results_as_local_processes(tmp_path, local_ray):
    exps = [exp(s, policy=p) for p in ("fcfs", "topas") for s in (0, 1)]
    on_ray = run_sweep(exps, ResultStore(tmp_path / "ray"), ray_address="local", progress=False)
    local = run_sweep(exps, ResultStore(tmp_path / "local"), jobs=1, progress=False)
    pd.testing.assert_frame_equal(_deterministic(on_ray), _deterministic(local))
    ray_store, local_store = ResultStore(tmp_path / "ray"), ResultStore(tmp_path / "local")
    for e in exps:
        pd.testing.assert_frame_equal(ray_store.load(e).requests, local_store.load(e).requests)


def test_ray_run_many_matches_local(local_ray):
    exps = [exp(0), exp(1, policy="lpm")]
    on_ray = pd.DataFrame(run_many(exps, ray_address="local", progress=False, store=False))
    local = pd.DataFrame(run_many(exps, jobs=1, progress=False, store=False))
    pd.testing.assert_frame_equal(_deterministic(on_ray), _deterministic(local))


def test_ray_sweep_resumes_with_only_the_missing_runs(tmp_path, local_ray):
    s = ResultStore(tmp_path)
    exps = [exp(i) for i in range(4)]
    run_sweep(exps[:2], s, jobs=1, progress=False)  # a sweep that stopped after two runs
    created = {k: s.meta(k)["created"] for k in s.keys()}
    run_sweep(exps, s, ray_address="local", progress=False)
    assert sorted(s.keys()) == sorted(e.key() for e in exps)
    assert {k: s.meta(k)["created"] for k in created} == created  # finished runs were not redone


def test_ray_sweep_names_a_failing_experiment_and_keeps_the_others(tmp_path, local_ray):
    s = ResultStore(tmp_path)
    bad = exp(5, kv_budget=1000)  # a valid spec whose prefix cannot fit: fails when run
    with pytest.raises(ExperimentFailed, match=r"dag-4/fcfs.*seed=5.*larger than the KV budget"):
        run_sweep([exp(0), bad], s, ray_address="local", progress=False)
    assert not s.has(bad)
    assert not list(tmp_path.glob(".tmp-*"))
