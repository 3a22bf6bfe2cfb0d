"""`topas trace validate` and `topas trace describe` (click.testing.CliRunner)."""

from __future__ import annotations

import json
import re

import pytest

from topas import __version__
from conftest import good_trace_dict, run_cli as run
from topas.paths import REPO_ROOT

TRACES = REPO_ROOT / "data" / "traces"


def good() -> dict:
    """conftest's valid two-task trace, its second task arriving at 2 s (the tests read that span)."""
    d = good_trace_dict()
    d["tasks"][1]["arrival"] = 2.0
    return d


def write(tmp_path, d, name="x.json"):
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p



def test_version(runner):
    r = run(runner, "--version")
    assert r.exit_code == 0 and __version__ in r.output


def test_help_lists_trace_commands(runner):
    r = run(runner, "trace", "--help")
    assert r.exit_code == 0 and "validate" in r.output and "describe" in r.output


def test_validate_ok(runner, tmp_path):
    r = run(runner, "trace", "validate", write(tmp_path, good()))
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == ("OK: 2 tasks, 8 requests, 2 agents (fits the KV budget of the default profile "
                                "a100-80gb_qwen2.5-32b: 18,358 tokens)")


def test_validate_without_profile_checks_the_default_profiles_budget(runner, tmp_path):
    """A trace `topas simulate` would reject (a prefix over the default profile's budget) fails
    `trace validate` too, and the message names the budget checked."""
    d = good()
    d["agents"][1]["prefix_tokens"] = 18_359
    p = write(tmp_path, d)
    r = run(runner, "trace", "validate", p)
    assert r.exit_code == 1 and "larger than the KV budget of 18358 tokens" in r.stderr
    r = run(runner, "trace", "validate", p, "--kv-budget", 20_000)
    assert r.exit_code == 0 and "(fits the KV budget of --kv-budget: 20,000 tokens)" in r.stdout


def test_trace_commands_accept_trace_names(runner):
    """`simulate --trace dag-4` takes a name; so do `trace describe` and `trace validate`."""
    r = run(runner, "trace", "describe", "dag-4")
    assert r.exit_code == 0, r.output
    assert "trace      dag-4" in r.stdout and "dag-4.json.gz" in r.stdout
    r = run(runner, "trace", "validate", "chain-3")
    assert r.exit_code == 0 and r.stdout.startswith("OK: 1000 tasks")
    r = run(runner, "trace", "describe", "no-such-trace")
    assert r.exit_code == 1 and "unknown workload 'no-such-trace'" in r.stderr and "dag-4" in r.stderr


def test_validate_committed_traces(runner):
    for name, req, ag in (("chain-3", 3000, 3), ("dag-4", 4000, 4), ("dag-10-wide", 10000, 10)):
        r = run(runner, "trace", "validate", TRACES / f"{name}.json.gz")
        assert r.exit_code == 0, r.output
        assert r.stdout.startswith(f"OK: 1000 tasks, {req} requests, {ag} agents")


def test_validate_with_kv_budget(runner, tmp_path):
    p = write(tmp_path, good())
    r = run(runner, "trace", "validate", p, "--kv-budget", 1000)
    assert r.exit_code == 0 and "fits the KV budget of --kv-budget: 1,000 tokens" in r.stdout
    r = run(runner, "trace", "validate", p, "--kv-budget", 150)
    assert r.exit_code == 1
    assert "agent b: prefix of 200 tokens is larger than the KV budget of 150 tokens" in r.stderr
    assert r.stdout == ""


def cases():
    d1 = good()
    d1["tasks"][1]["stages"][2]["parents"] = ["Z"]
    d2 = good()
    d2["tasks"][0]["stages"][0]["parents"] = ["D"]
    d3 = good()
    d3["tasks"][1]["stages"][3]["output_tokens"] = 3.0
    d4 = good()
    d4["tasks"][0]["arrival"] = 5.0
    d5 = good()
    d5["schema"] = "topas.trace/0"
    d6 = good()
    d6["tasks"][1]["stages"][1]["agent"] = "ghost"
    return [
        (d1, "task t00001 stage C: parent 'Z' does not exist in the task"),
        (d2, "task t00000 stage A: the stages form a cycle: A -> B -> D -> A"),
        (d3, "task t00001 stage D: output_tokens must be a positive integer, got 3.0"),
        (d4, "task t00001: arrival 2.0 is earlier than the arrival 5.0 of the preceding task t00000"),
        (d5, "unsupported schema version 'topas.trace/0' (supported schema versions: topas.trace/1, topas.trace/2)"),
        (d6, "task t00001 stage B: unknown agent 'ghost'"),
    ]


@pytest.mark.parametrize("d, message", cases())
def test_validate_rejects_with_the_message(runner, tmp_path, d, message):
    p = write(tmp_path, d, "bad.json")
    r = run(runner, "trace", "validate", p)
    assert r.exit_code == 1
    assert f"{p}: {message}" in r.stderr
    assert "Traceback" not in r.stdout + r.stderr


def test_validate_missing_file(runner, tmp_path):
    r = run(runner, "trace", "validate", tmp_path / "nope.json.gz")
    assert r.exit_code == 1
    assert r.stderr.strip() == f"error: {tmp_path / 'nope.json.gz'}: no such file"


def test_validate_directory_and_garbage(runner, tmp_path):
    r = run(runner, "trace", "validate", tmp_path)
    assert r.exit_code == 1 and "is a directory" in r.stderr
    p = tmp_path / "garbage.json"
    p.write_text("]]")
    r = run(runner, "trace", "validate", p)
    assert r.exit_code == 1 and "garbage.json: not valid JSON" in r.stderr


def test_profile_and_budget_are_exclusive(runner, tmp_path):
    r = run(runner, "trace", "validate", write(tmp_path, good()), "--profile", "x", "--kv-budget", 5)
    assert r.exit_code == 2 and "not both" in r.stderr


def test_validate_with_profile(runner, tmp_path):
    cost = pytest.importorskip("topas.engine.cost", reason="topas.engine.cost (load_profile) not available yet")
    try:
        budget = cost.load_profile("a100-80gb_qwen2.5-32b").kv_budget_tokens
    except ValueError as e:
        pytest.skip(f"default profile not available: {e}")
    r = run(runner, "trace", "validate", TRACES / "dag-4.json.gz", "--profile", "a100-80gb_qwen2.5-32b")
    assert r.exit_code == 0, r.output
    assert f"fits the KV budget of profile a100-80gb_qwen2.5-32b: {budget:,} tokens" in r.stdout
    d = good()
    d["agents"][1]["prefix_tokens"] = budget + 1
    r = run(runner, "trace", "validate", write(tmp_path, d), "--profile", "a100-80gb_qwen2.5-32b")
    assert r.exit_code == 1
    assert f"agent b: prefix of {budget + 1} tokens is larger than the KV budget of {budget} tokens" in r.stderr


def test_validate_with_unknown_profile(runner, tmp_path):
    pytest.importorskip("topas.engine.cost", reason="topas.engine.cost (load_profile) not available yet")
    r = run(runner, "trace", "validate", write(tmp_path, good()), "--profile", "no-such-gpu_no-model")
    assert r.exit_code == 1 and "no-such-gpu_no-model" in r.stderr


def test_describe(runner, tmp_path):
    r = run(runner, "trace", "describe", TRACES / "dag-4.json.gz")
    assert r.exit_code == 0, r.output
    out = r.stdout
    for expected in ("trace      dag-4", "tasks      1000", "requests   4000", "agents     4",
                     "mean rate", "stages     per task: mean 4.0, min 4, max 4",
                     "depth      stages on the longest path: mean 3.0, min 3, max 3", "dag4.D"):
        assert expected in out, expected
    assert len(out.splitlines()) <= 40  # one screen


def test_describe_per_agent_statistics(runner, tmp_path):
    r = run(runner, "trace", "describe", write(tmp_path, good()))
    assert r.exit_code == 0, r.output
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line.startswith(("a ", "b "))}
    # agent, calls, prefix, exp.out, in.mean, in.min, in.max, out.mean, out.min, out.max
    assert rows["a"] == ["a", "4", "100", "5", "25.0", "10", "40", "5.0", "5", "5"]
    assert rows["b"] == ["b", "4", "200", "5", "25.0", "20", "30", "5.0", "5", "5"]
    assert "arrivals   0.000 .. 2.000 s (span 2.000 s), mean rate 0.5 tasks/s" in r.stdout


def test_describe_bad_file(runner, tmp_path):
    d = good()
    d["agents"].append(d["agents"][0])
    r = run(runner, "trace", "describe", write(tmp_path, d))
    assert r.exit_code == 1 and "agent a: duplicate agent name" in r.stderr


def test_describe_prints_the_perfect_cache_reuse(runner, tmp_path):
    from conftest import good_trace_v2_dict

    r = run(runner, "trace", "describe", write(tmp_path, good_trace_v2_dict()))
    assert r.exit_code == 0, r.output
    # tests/test_reuse.py works the numbers out: 17 of 49 prompt tokens, 6 cross-task, 11 within
    assert ("reuse      a perfect radix cache reuses 34.7% of 49 prompt tokens (cross-task 12.2%, "
            "within-task 22.4%)") in r.stdout
    assert "segments   8 distinct (topas.trace/2): prefix 2 (7 tokens), shared 1 (2 tokens)" in r.stdout
    r = run(runner, "trace", "describe", TRACES / "dag-4.json.gz")  # /1: the agent-prefix model
    assert "reuses 85.6% of 14,336,000 prompt tokens (cross-task 85.6%, within-task 0.0%)" in r.stdout
    assert "agent-prefix model (topas.trace/1)" in r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name, share", [("metagpt-sop", 48.7), ("metagpt-tl", 84.5), ("metagpt-tl-raw", 5.0)])
def test_describe_metagpt_reuse_is_that_of_the_real_token_sequences(runner, name, share):
    r = run(runner, "trace", "describe", name)
    assert r.exit_code == 0, r.output
    line = next(x for x in r.stdout.splitlines() if x.startswith("reuse "))
    got = float(re.search(r"reuses ([\d.]+)%", line).group(1))
    assert abs(got - share) <= 2.0, line
