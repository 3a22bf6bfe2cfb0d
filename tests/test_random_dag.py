"""The held-out family of random workflows (topas/workload/random_dag.py): valid topas.trace/1
traces, heterogeneous (prefixes, fan-in, fan-out, chain lengths), deterministic, at the synthetic
workloads' offered output-token rate, seeded outside every tuning seed, committed files regenerate."""

from __future__ import annotations

import gzip
import importlib.util

import pytest

from topas.engine.cost import load_profile
from topas.experiments.protocol.seeds import EVALUATION_SEEDS, HELD_OUT_WORKFLOW_SEEDS, TUNING_SEEDS
from topas.paths import REPO_ROOT, traces_dir
from topas.workload import read_trace, trace_to_dict, validate_dict, write_trace
from topas.workload.random_dag import NOMINAL_OUTPUT_TOKENS_PER_S, generate, trace_name
from topas.workload.synthetic import DEFAULTS, SHAPES


def test_generator_seeds_are_held_out_from_tuning_and_evaluation():
    assert not set(HELD_OUT_WORKFLOW_SEEDS) & set(TUNING_SEEDS)
    assert not set(HELD_OUT_WORKFLOW_SEEDS) & set(EVALUATION_SEEDS)


def test_a_generated_trace_is_valid_for_the_default_kv_budget():
    t = generate(1000, n_tasks=200)
    validate_dict(trace_to_dict(t), source="random-dag", kv_budget=load_profile().kv_budget_tokens)
    assert t.name == "random-dag-1000" and len(t.tasks) == 200
    assert t.meta["generator"] == "topas.workload.random_dag.generate" and t.meta["seed"] == 1000


def test_the_family_is_heterogeneous():
    traces = [generate(s, n_tasks=300) for s in HELD_OUT_WORKFLOW_SEEDS]
    prefixes = {a.prefix_tokens for t in traces for a in t.agents.values()}
    assert min(prefixes) < 512 and max(prefixes) > 2048
    fan_in = fan_out = 0
    depths = set()
    for t in traces:
        for task in t.tasks:
            fan_in = max(fan_in, max(len(s.parents) for s in task.stages))
            fan_out = max(fan_out, max(len(c) for c in task.children.values()))
        depths |= {w["depth"] for w in t.meta["workflows"]}
        assert len({task.workflow for task in t.tasks}) > 1  # a mix of workflows per trace
        # tasks of one workflow differ in length (per-task factors)
        w0 = [task for task in t.tasks if task.workflow == "w0"]
        assert len({tuple(s.output_tokens for s in task.stages) for task in w0}) > 1
    assert fan_in >= 2 and fan_out >= 2 and len(depths) >= 3


def test_same_seed_same_bytes_and_meta_regenerates(tmp_path):
    a = write_trace(generate(1001, n_tasks=100), tmp_path / "a.json.gz").read_bytes()
    b = write_trace(generate(1001, n_tasks=100), tmp_path / "b.json.gz").read_bytes()
    c = write_trace(generate(1002, n_tasks=100), tmp_path / "c.json.gz").read_bytes()
    assert a == b and a != c
    t = read_trace(tmp_path / "a.json.gz")
    assert generate(t.meta["seed"], **t.meta["params"]) == t


def test_nominal_rate_offers_the_synthetic_workloads_output_token_rate():
    for name, shape in SHAPES.items():
        d = DEFAULTS[name]
        assert d["rate"] * len(shape) * d["output_tokens"] == pytest.approx(NOMINAL_OUTPUT_TOKENS_PER_S)
    t = generate(1000, n_tasks=10)
    # rate x the expected output of a task (workflows equally likely) is that token rate
    per_workflow = {}
    for task in generate(1000, n_tasks=400).tasks:
        per_workflow.setdefault(task.workflow, sum(t.agents[s.agent].expected_output_tokens for s in task.stages))
    mean = sum(per_workflow.values()) / len(per_workflow)
    assert len(per_workflow) == 4 and t.meta["rate"] * mean == pytest.approx(NOMINAL_OUTPUT_TOKENS_PER_S)


def test_bad_parameters_are_named():
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        generate(-1)
    with pytest.raises(ValueError, match="n_workflows must be an integer >= 1"):
        generate(1000, n_workflows=0)


def test_committed_held_out_traces_regenerate_bit_for_bit(tmp_path):
    spec = importlib.util.spec_from_file_location("make_traces", REPO_ROOT / "scripts" / "make_traces.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    written = mod.main(["--out", str(tmp_path), "--held-out"])
    assert [p.name for p in written] == [f"{trace_name(s)}.json.gz" for s in HELD_OUT_WORKFLOW_SEEDS]
    for p in written:
        committed = (traces_dir() / p.name).read_bytes()
        assert gzip.decompress(p.read_bytes()) == gzip.decompress(committed), f"{p.name}: content differs"
        assert p.read_bytes() == committed, f"{p.name}: same content, different gzip bytes"
