"""`topas simulate` and `topas policies` (click.testing.CliRunner)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from conftest import run_cli as run
from topas.policies import available_policies, param_names





def tiny_trace(tmp_path, name="tiny.json", **overrides):
    stages = [
        {"id": "A", "agent": "a", "input_tokens": 64, "output_tokens": 16, "parents": []},
        {"id": "B", "agent": "b", "input_tokens": 64, "output_tokens": 16, "parents": ["A"]},
    ]
    d = {
        "schema": "topas.trace/1",
        "name": "tiny",
        "meta": {"rate": 0.5},
        "agents": [
            {"name": "a", "prefix_tokens": 256, "expected_output_tokens": 16.0},
            {"name": "b", "prefix_tokens": 512, "expected_output_tokens": 16.0},
        ],
        "tasks": [
            {"id": f"t{i}", "arrival": float(i), "workflow": "tiny", "stages": json.loads(json.dumps(stages))}
            for i in range(4)
        ],
    }
    d.update(overrides)
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


SUMMARY_LABELS = ("workload", "policy", "profile", "arrivals", "tasks", "JCT (s)", "throughput",
                  "batching", "prefixes", "rework", "decisions", "wall time")


def test_simulate_prints_summary_and_writes_parquet(runner, tmp_path):
    out = tmp_path / "out"
    r = run(runner, "simulate", "--trace", "dag-4", "--policy", "topas", "--param", "beta=0.5",
            "--load", "1.2", "--seed", "1", "--tasks", "12", "--out", out, "--no-progress")
    assert r.exit_code == 0, r.output + r.stderr
    for label in SUMMARY_LABELS:
        assert any(line.startswith(label) for line in r.output.splitlines()), label
    assert "topas  beta=0.5" in r.output
    assert "load 1.2 x nominal 0.15" in r.output
    assert "12 tasks, 48 requests" in r.output
    for table in ("tasks", "requests", "prefix_events", "timeline", "decisions", "summary"):
        assert (out / f"{table}.parquet").is_file(), table
    tasks = pd.read_parquet(out / "tasks.parquet")
    assert len(tasks) == 12 and (tasks["jct"] > 0).all()
    summary = pd.read_parquet(out / "summary.parquet")
    assert summary.loc[0, "policy"] == "topas"
    assert f"mean {tasks['jct'].mean():.2f}" in r.output
    inputs = json.loads((out / "inputs.json").read_text())  # the inputs beside the tables
    assert inputs["trace"]["name"] == "dag-4" and len(inputs["trace"]["sha256"]) == 64
    assert (inputs["load"], inputs["seed"], inputs["n_tasks"]) == (1.2, 1, 12)
    assert inputs["rate"] == pytest.approx(0.18) and inputs["params"]["beta"] == 0.5
    assert inputs["profile"]["name"] == "a100-80gb_qwen2.5-32b" and inputs["key"]
    for lib in ("python", "numpy", "pandas", "pyarrow", "matplotlib", "seaborn", "topas", "git_commit"):
        assert lib in inputs["environment"], lib
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary folder left


def test_simulate_out_is_checked_before_the_run(runner, tmp_path, monkeypatch):
    """An --out that cannot be written fails at once, before any simulation."""
    import topas.engine.simulator as sim

    ran = []
    monkeypatch.setattr(sim, "simulate", lambda *a, **k: ran.append(1))
    (tmp_path / "file").write_text("x")
    for bad in (tmp_path / "file", tmp_path / "file" / "sub"):
        r = run(runner, "simulate", "--trace", "dag-4", "--policy", "fcfs", "--tasks", "5", "--out", bad)
        assert r.exit_code != 0 and str(bad) in (r.stderr + r.output), r.output
    assert ran == []


def test_simulate_out_replaces_atomically_and_keeps_the_summary_on_failure(runner, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("an earlier run")
    r = run(runner, "simulate", "--trace", "dag-4", "--policy", "fcfs", "--tasks", "5", "--load", "1", "--out", out,
            "--force")  # a folder of other files is replaced only with --force (issue 44)
    assert r.exit_code == 0, r.output
    assert not (out / "old.txt").exists() and (out / "inputs.json").is_file()  # replaced as a whole
    import topas.engine.metrics as metrics

    def broken(self, directory):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(metrics.SimResult, "to_parquet", broken)
    before = sorted(p.name for p in out.iterdir())
    r = run(runner, "simulate", "--trace", "dag-4", "--policy", "lpm", "--tasks", "5", "--load", "1", "--out", out)
    assert r.exit_code == 1 and "No space left on device" in r.stderr
    assert "JCT (s)" in r.output  # the summary of the run is printed all the same
    assert sorted(p.name for p in out.iterdir()) == before  # the earlier result is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_simulate_says_when_tasks_exceeds_the_trace(runner):
    r = run(runner, "simulate", "--trace", "chain-3", "--policy", "fcfs", "--tasks", "5000", "--load", "0.5",
            "--no-progress")
    assert r.exit_code == 0, r.output
    assert "(the whole trace: it has 1000 tasks, --tasks asked for 5000)" in r.output
    assert "first 5000" not in r.output


def test_simulate_trace_file_and_own_arrivals(runner, tmp_path):
    p = tiny_trace(tmp_path)
    r = run(runner, "simulate", "--trace", p, "--policy", "fcfs", "--kv-budget", "4096")
    assert r.exit_code == 0, r.output + r.stderr
    assert "the trace's own arrival times" in r.output
    assert "4 tasks, 8 requests" in r.output and "KV budget 4,096 tokens" in r.output


def test_simulate_rate_and_progress_bar(runner, tmp_path):
    p = tiny_trace(tmp_path)
    r = run(runner, "simulate", "--trace", p, "--policy", "lpm", "--rate", "2", "--seed", "3", "--progress")
    assert r.exit_code == 0, r.output + r.stderr
    assert "Poisson 2 tasks/s, seed 3" in r.output
    assert "simulate lpm" in r.stderr  # the tqdm bar


@pytest.mark.parametrize(
    "args, message",
    [
        (["--trace", "dag-4", "--policy", "nope"], ["unknown policy 'nope'", "valid policies:", "topas", "fcfs"]),
        (["--trace", "dag-4", "--policy", "topas", "--param", "bogus=1"],
         ["no parameter 'bogus'", "valid parameters:", "beta"]),
        (["--trace", "dag-4", "--policy", "topas", "--param", "beta"], ["'beta'", "NAME=VALUE"]),
        (["--trace", "dag-4", "--policy", "topas", "--param", "=1"], ["'=1'", "NAME=VALUE"]),
        (["--trace", "dag-4", "--policy", "topas", "--param", "beta=abc"], ["'beta'", "'abc'", "float"]),
        (["--trace", "dag-4", "--policy", "topas-base", "--param", "reuse=true"], ["fixes parameter 'reuse'"]),
        (["--trace", "no-such-workload", "--policy", "fcfs"],
         ["unknown workload 'no-such-workload'", "available traces:", "chain-3", "dag-4", "dag-10-wide"]),
        (["--trace", "dag-4", "--policy", "fcfs", "--profile", "nope"],
         ["nope", "not found", "available profiles", "a100-80gb_qwen2.5-32b"]),
        (["--trace", "dag-4", "--policy", "fcfs", "--kv-budget", "100"], ["dag4.A", "larger than the KV budget"]),
    ],
)
def test_simulate_bad_inputs(runner, args, message):
    r = run(runner, "simulate", *args)
    assert r.exit_code == 1, r.output
    for m in message:
        assert m in r.stderr, (m, r.stderr)


def test_simulate_missing_trace_file(runner, tmp_path):
    r = run(runner, "simulate", "--trace", tmp_path / "missing.json.gz", "--policy", "fcfs")
    assert r.exit_code == 1
    assert "missing.json.gz" in r.stderr and "no such file" in r.stderr


def test_simulate_invalid_trace(runner, tmp_path):
    bad = tiny_trace(tmp_path, "bad.json")
    d = json.loads(bad.read_text())
    d["tasks"][1]["stages"][1]["agent"] = "ghost"
    bad.write_text(json.dumps(d))
    r = run(runner, "simulate", "--trace", bad, "--policy", "fcfs")
    assert r.exit_code == 1
    assert "bad.json" in r.stderr and "ghost" in r.stderr and "t1" in r.stderr
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    r = run(runner, "simulate", "--trace", garbage, "--policy", "fcfs")
    assert r.exit_code == 1 and "garbage.json" in r.stderr and "JSON" in r.stderr


def test_simulate_rate_and_load_are_exclusive(runner):
    r = run(runner, "simulate", "--trace", "dag-4", "--policy", "fcfs", "--rate", "1", "--load", "1")
    assert r.exit_code != 0
    assert "--rate" in r.stderr and "--load" in r.stderr and "not both" in r.stderr


@pytest.mark.parametrize("opt", ["--rate", "--load"])
def test_simulate_rejects_nonpositive_rate(runner, opt):
    r = run(runner, "simulate", "--trace", "dag-4", "--policy", "fcfs", opt, "0")
    assert r.exit_code != 0 and opt in r.stderr


def test_policies_lists_every_policy_with_parameters(runner):
    r = run(runner, "policies")
    assert r.exit_code == 0, r.stderr
    names = [line.split()[0] for line in r.output.splitlines() if line and not line.startswith(" ")]
    assert names == available_policies()
    assert "    beta: float = 4.0" in r.output
    assert "reuse: bool = False  (fixed by this ablation)" in r.output
    for name in available_policies():
        for p in param_names(name):
            assert f"    {p}: " in r.output


def test_help_lists_new_commands(runner):
    r = run(runner, "--help")
    assert r.exit_code == 0
    assert "simulate" in r.output and "policies" in r.output and "trace" in r.output
