"""Clusters as experiments and on the command line: ``Experiment(..., engines=N, router=NAME)``,
``topas simulate --engines N --router NAME``, ``topas routers`` (docs/cluster.md)."""

from __future__ import annotations

import dataclasses

import pytest

from topas.cli import main
from topas.cluster import ClusterResult
from topas.cluster.routers import available_routers, router_class
from topas.experiments.spec import Experiment, ExperimentError, prepare, run_prepared
from topas.provenance import code_fingerprint, engine_fingerprint

BASE = dict(workload="dag-4", policy="fcfs", load=2.0, n_tasks=12, seed=1)


def test_a_single_engine_keys_as_before_clusters_existed():
    exp = Experiment(**BASE)
    canon = exp.canonical()
    assert "cluster" not in canon and canon["code"] == engine_fingerprint("sim")
    assert set(canon) == {"schema", "code", "engine", "engine_config", "trace_sha256", "n_tasks", "rate", "seed",
                          "policy", "params", "profile_hash"}
    assert Experiment(**BASE, engines=1, router=None).key() == exp.key()
    assert "engines" not in exp.fields() and "engines=" not in exp.label()


def test_a_cluster_key_has_the_engines_the_router_its_parameters_and_the_cluster_code():
    exp = Experiment(**BASE, engines=3, router="sglang-cache-aware", router_params={"cache_threshold": "0.5"})
    canon = exp.canonical()
    assert canon["code"] == code_fingerprint(("engine", "policies", "workload", "cluster")) != engine_fingerprint("sim")
    assert canon["cluster"]["engines"] == 3 and canon["cluster"]["router"] == "sglang-cache-aware"
    assert canon["cluster"]["router_params"]["cache_threshold"] == 0.5
    assert canon["cluster"]["router_params"]["balance_abs_threshold"] == 64  # resolved defaults
    same = Experiment(**BASE, engines=3, router="sglang-cache-aware", router_params={"cache_threshold": 0.5})
    assert same.key() == exp.key()
    keys = {exp.key(), Experiment(**BASE, engines=2, router="sglang-cache-aware").key(),
            Experiment(**BASE, engines=3, router="round-robin").key(),
            Experiment(**BASE, engines=1, router="round-robin").key(), Experiment(**BASE).key()}
    assert len(keys) == 5
    assert exp.label().endswith(",engines=3,router=sglang-cache-aware[cache_threshold=0.5]")
    assert exp.fields()["engines"] == 3 and exp.fields()["router"] == "sglang-cache-aware"


@pytest.mark.parametrize("kw, message", [
    ({"engines": 0, "router": "round-robin"}, r"engines must be an integer >= 1, got engines=0"),
    ({"engines": True, "router": "round-robin"}, r"engines must be an integer >= 1, got engines=True"),
    ({"engines": 2}, r"engines=2 needs a router \(router=NAME\); valid routers: .*least-load"),
    ({"engines": 2, "router": "rr"}, r"unknown router 'rr'; valid routers: .*round-robin"),
    ({"engines": 2, "router": "sglang-cache-aware", "router_params": {"x": 1}},
     r"router 'sglang-cache-aware' has no parameter 'x'"),
    ({"router_params": {"x": 1}}, r"router_params \{'x': 1\} given without a router"),
    ({"engines": 2, "router": "least-load", "engine": "sglang"}, r"runs on the simulator only, not engine 'sglang'"),
])
def test_bad_clusters_name_the_offending_item(kw, message):
    with pytest.raises(ExperimentError, match=message):
        Experiment(**BASE, **kw)


def test_a_cluster_experiment_runs_and_one_engine_behind_a_router_is_the_single_engine():
    single = run_prepared(prepare(Experiment(**BASE)))
    one = run_prepared(prepare(Experiment(**BASE, engines=1, router="least-load")))
    assert one.tasks.equals(single.tasks)
    two = run_prepared(prepare(Experiment(**BASE, engines=2, router="least-load")))
    assert isinstance(two, ClusterResult) and two.summary["n_engines"] == 2
    assert set(two.requests["engine"]) == {0, 1} and len(two.tasks) == 12
    again = run_prepared(prepare(dataclasses.replace(Experiment(**BASE, engines=2, router="least-load"))))
    assert again.deterministic_summary() == two.deterministic_summary()




def test_routers_lists_every_router_with_its_parameters(runner):
    r = runner.invoke(main, ["routers"])
    assert r.exit_code == 0, r.output
    names = [line.split()[0] for line in r.output.splitlines() if line and not line.startswith(" ")]
    assert names == available_routers()
    for name in names:
        for f in dataclasses.fields(router_class(name).Params):
            assert f"    {f.name}: " in r.output
    assert "    cache_threshold: float = 0.3" in r.output
    heads = {line.split()[0]: line for line in r.output.splitlines() if line and not line.startswith(" ")}
    assert heads["flowguard"].endswith("(from the abstract).") and heads["wasma"].endswith("(from the abstract).")
    assert heads["prefixplace"].endswith("(from the issue's summary of the paper).")


def test_simulate_a_cluster_on_the_command_line(runner, tmp_path):
    out = tmp_path / "run"
    r = runner.invoke(main, ["simulate", "--trace", "dag-4", "--policy", "lpm", "--load", "2", "--tasks", "10",
                             "--engines", "2", "--router", "power-of-two", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "cluster      2 engines x lpm, router power-of-two" in r.output
    assert "balance      requests per engine" in r.output and "copies " in r.output
    assert (out / "engines.parquet").is_file() and (out / "prefix_copies.parquet").is_file()
    bad = runner.invoke(main, ["simulate", "--trace", "dag-4", "--policy", "lpm", "--tasks", "5", "--engines", "2",
                               "--router", "nope"])
    assert bad.exit_code == 1 and "unknown router 'nope'; valid routers:" in bad.stderr
    bad = runner.invoke(main, ["simulate", "--trace", "dag-4", "--policy", "lpm", "--tasks", "5", "--engines", "2"])
    assert bad.exit_code == 1 and "engines=2 needs a router" in bad.stderr


def test_a_cluster_result_round_trips_through_the_store(tmp_path):
    from topas.experiments import run_many
    from topas.experiments.store import ResultStore

    store = ResultStore(tmp_path)
    exp = Experiment(**BASE, engines=2, router="topas")
    [row] = run_many([exp], jobs=1, progress=False, store=store)
    assert row["router"] == "topas" and row["n_engines"] == 2
    back = store.load(exp)
    assert back.summary["requests_per_engine_cv"] == row["requests_per_engine_cv"]
    assert set(back.requests["engine"]) == {0, 1} and "router_hold" in back.requests
    # the spec read back from meta.json is the same cluster experiment (what the stale-pack check uses)
    from topas.experiments.store import experiment_of

    assert experiment_of(store.meta(exp)).key() == exp.key()
    tuned = Experiment(**BASE, engines=2, router="kairos", router_params={"slot_s": 0.5})
    run_many([tuned], jobs=1, progress=False, store=store)
    assert experiment_of(store.meta(tuned)).key() == tuned.key()
