"""Hostile but fair inputs (issue 44): every one gives a one-line error naming the item and a
non-zero exit, never a traceback, a hang or silently accepted nonsense; ``--out`` never deletes a
user's files."""

from __future__ import annotations

import gzip
import json
import zlib

import pytest

from conftest import run_cli as run





def doc(**top) -> dict:
    d = {
        "schema": "topas.trace/1", "name": "tiny", "meta": {"rate": 0.5},
        "agents": [{"name": "a", "prefix_tokens": 64, "expected_output_tokens": 8.0}],
        "tasks": [{"id": f"t{i}", "arrival": float(i), "workflow": "w",
                   "stages": [{"id": "A", "agent": "a", "input_tokens": 16, "output_tokens": 4, "parents": []}]}
                  for i in range(3)],
    }
    d.update(top)
    return d


def write(tmp_path, d, name="t.json") -> str:
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return str(p)


def assert_one_line_error(result, *needles):
    assert result.exit_code != 0, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    err = result.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, err


def simulate(runner, trace, *extra):
    return run(runner, "simulate", "--trace", trace, "--policy", "fcfs", "--no-progress", *extra)


# ----------------------------------------------------------------------------- traces


def test_a_gzip_with_a_corrupt_deflate_stream_is_refused_naming_the_file(runner, tmp_path):
    raw = bytearray(gzip.compress(json.dumps(doc()).encode()))
    raw[12:20] = b"\xff" * 8  # inside the deflate stream
    p = tmp_path / "bad.json.gz"
    p.write_bytes(bytes(raw))
    for cmd in (("trace", "validate", p), ("simulate", "--trace", p, "--policy", "fcfs")):
        assert_one_line_error(run(runner, *cmd), "bad.json.gz", "gzip")


def test_deeply_nested_json_is_refused(runner, tmp_path):
    p = tmp_path / "deep.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    assert_one_line_error(run(runner, "trace", "validate", p), "deep.json")


@pytest.mark.parametrize("depth", [200, 5000])
def test_a_valid_trace_whose_meta_nests_deep_is_refused(runner, tmp_path, depth):
    # json.dumps itself recurses: splice the nesting in as text
    text = json.dumps(doc(meta={})).replace('"meta": {}', '"meta": ' + '{"x": ' * depth + "{}" + "}" * depth)
    p = tmp_path / "meta.json"
    p.write_text(text)
    for r in (run(runner, "trace", "validate", p), simulate(runner, p)):
        assert_one_line_error(r, "meta.json", *(["meta nests deeper than 64"] if depth == 200 else []))


def test_a_5000_digit_integer_is_refused(runner, tmp_path):
    p = tmp_path / "big.json"
    p.write_text(json.dumps(doc()).replace('"input_tokens": 16', '"input_tokens": ' + "9" * 5000, 1))
    assert_one_line_error(run(runner, "trace", "validate", p), "big.json")
    p.write_text(json.dumps(doc()).replace('"input_tokens": 16', '"input_tokens": ' + "9" * 4000, 1))
    assert_one_line_error(run(runner, "trace", "validate", p), "input_tokens must be at most")


def test_a_lone_surrogate_in_an_agent_name_is_refused_before_anything_runs(runner, tmp_path):
    d = doc()
    d["agents"][0]["name"] = "a\ud800"
    for t in d["tasks"]:
        t["stages"][0]["agent"] = "a\ud800"
    p = write(tmp_path, d)
    assert_one_line_error(run(runner, "trace", "validate", p), "printable")
    out = tmp_path / "out"
    assert_one_line_error(simulate(runner, p, "--out", out), "printable")
    assert not out.exists()


def test_control_characters_in_names_are_refused(runner, tmp_path):
    d = doc()
    d["tasks"][1]["id"] = "t\x1b[2J"
    assert_one_line_error(run(runner, "trace", "validate", write(tmp_path, d)), "printable")


def test_an_empty_task_list_is_refused(runner, tmp_path):
    p = write(tmp_path, doc(tasks=[]))
    assert_one_line_error(run(runner, "trace", "validate", p), "tasks must not be empty")
    assert_one_line_error(simulate(runner, p), "tasks must not be empty")


@pytest.mark.parametrize("arrival", [1e300, 1e18])
def test_arrivals_beyond_any_sane_horizon_are_refused(runner, tmp_path, arrival):
    d = doc()
    d["tasks"][2]["arrival"] = arrival
    p = write(tmp_path, d)
    assert_one_line_error(run(runner, "trace", "validate", p), "task t2", "horizon")
    assert_one_line_error(simulate(runner, p), "task t2", "horizon")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("flag", [("--load", "1e-300"), ("--rate", "1e-300"), ("--load", "1e-12")])
def test_a_load_whose_horizon_is_absurd_is_refused_at_once(runner, tmp_path, flag):
    assert_one_line_error(simulate(runner, write(tmp_path, doc()), *flag), "horizon", "raise the rate or load")


def test_a_profile_pointed_at_a_trace_is_refused_naming_it(runner):
    assert_one_line_error(simulate(runner, "chain-3", "--tasks", "2", "--profile", "data/traces/chain-3.json.gz"),
                          "--profile", "chain-3.json.gz")


def test_trace_validate_with_a_profile_pointed_at_a_trace_names_it(runner):
    assert_one_line_error(run(runner, "trace", "validate", "chain-3", "--profile", "data/traces/chain-3.json.gz"),
                          "--profile", "chain-3.json.gz", "not a profile file")


def test_a_negative_seed_is_a_usage_error(runner):
    r = simulate(runner, "chain-3", "--tasks", "2", "--seed", "-1", "--load", "1")
    assert r.exit_code == 2 and "--seed" in r.stderr and "Traceback" not in r.stderr


# ----------------------------------------------------------------------------- parameters


@pytest.mark.parametrize("policy,param", [
    ("topas", "beta=inf"), ("topas", "rho=inf"), ("topas", "output_reserve=inf"), ("topas", "beta=nan"),
    ("lpm", "fcfs_fallback_queue=-1"), ("spf", "prior_weight=-5"), ("topas", "samples=0"),
])
def test_a_parameter_out_of_range_is_refused_naming_it(runner, policy, param):
    r = run(runner, "simulate", "--trace", "chain-3", "--tasks", "2", "--policy", policy, "--param", param)
    assert_one_line_error(r, repr(param.split("=")[0]), "out of range")


def test_make_params_refuses_non_finite_and_negative_values():
    from topas.policies.base import PolicyError, make_policy

    with pytest.raises(PolicyError, match="'beta'.*out of range"):
        make_policy("topas", beta=float("inf"))
    with pytest.raises(PolicyError, match="'prior_weight'.*out of range"):
        make_policy("spf", prior_weight=-5)
    assert make_policy("topas", beta=0.0).params.beta == 0.0  # the edge of the range is fine


# ----------------------------------------------------------------------------- --out


def test_out_refuses_a_folder_of_other_files_and_keeps_them(runner, tmp_path):
    out = tmp_path / "thesis"
    (out / "data").mkdir(parents=True)
    (out / "draft.tex").write_text("my thesis")
    (out / "data" / "x.csv").write_text("1,2\n")
    r = simulate(runner, "chain-3", "--tasks", "2", "--out", out)
    assert_one_line_error(r, str(out), "--force")
    assert (out / "draft.tex").read_text() == "my thesis" and (out / "data" / "x.csv").is_file()


def test_out_force_replaces_a_folder_of_other_files(runner, tmp_path):
    out = tmp_path / "scratch"
    out.mkdir()
    (out / "junk.txt").write_text("x")
    r = simulate(runner, "chain-3", "--tasks", "2", "--out", out, "--force")
    assert r.exit_code == 0, r.stderr
    assert not (out / "junk.txt").exists() and (out / "tasks.parquet").is_file()


def test_out_replaces_an_earlier_simulate_output_without_force(runner, tmp_path):
    out = tmp_path / "run"
    assert simulate(runner, "chain-3", "--tasks", "2", "--out", out).exit_code == 0
    r = simulate(runner, "chain-3", "--tasks", "3", "--out", out)
    assert r.exit_code == 0, r.stderr
    assert json.loads((out / "inputs.json").read_text())["n_tasks"] == 3


def test_an_empty_out_is_refused_before_simulating(runner):
    assert_one_line_error(simulate(runner, "chain-3", "--tasks", "2", "--out", ""), "--out is empty")


def test_an_empty_folder_is_a_fine_out(runner, tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    assert simulate(runner, "chain-3", "--tasks", "2", "--out", out).exit_code == 0


def test_profile_server_refuses_to_overwrite_a_file_that_is_not_a_profile(runner, tmp_path):
    notes = tmp_path / "notes.json"
    notes.write_text("my notes")
    r = run(runner, "profile-server", "--server", "http://127.0.0.1:9", "--out", notes)
    assert_one_line_error(r, str(notes), "--force")
    assert notes.read_text() == "my notes"
    assert_one_line_error(run(runner, "profile-server", "--server", "http://127.0.0.1:9", "--out", ""), "empty")


# ----------------------------------------------------------------------------- one error path


def test_an_unexpected_failure_is_one_line_and_debug_shows_the_traceback(runner, monkeypatch):
    import topas.experiments.spec as spec

    def boom(*a, **k):
        raise OSError(28, "No space left on device", "/full/disk/tasks.parquet")

    monkeypatch.setattr(spec, "run_prepared", boom)
    r = simulate(runner, "chain-3", "--tasks", "2")
    assert_one_line_error(r, "/full/disk/tasks.parquet", "no space left on device")
    r = run(runner, "--debug", "simulate", "--trace", "chain-3", "--policy", "fcfs", "--tasks", "2")
    assert r.exit_code != 0 and isinstance(r.exception, OSError)


def test_capacity_reports_a_full_disk_in_one_line(runner, tmp_path, monkeypatch):
    import topas.experiments.capacity as capacity

    def full(*a, **k):
        raise OSError(28, "No space left on device", str(tmp_path / "store" / "ab"))

    monkeypatch.setattr(capacity, "capacity_table", full)
    r = run(runner, "capacity", "chain-3", "--policies", "fcfs", "--tasks", "8", "--store", tmp_path / "store")
    assert_one_line_error(r, "no space left on device", str(tmp_path / "store"))


def test_reproduce_reports_a_full_disk_in_one_line(monkeypatch, capsys):
    from pipeline import reproduce

    def full(argv=None):
        raise OSError(28, "No space left on device", "data/results/store/ab/abc/meta.json")

    monkeypatch.setattr(reproduce, "main", full)
    assert reproduce.cli(["--quick"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "meta.json" in err and "no space left" in err
    with pytest.raises(OSError):
        reproduce.cli(["--quick", "--debug"])


def test_zlib_errors_are_expected_failures():
    from topas.cli_errors import error_line

    assert error_line(zlib.error("invalid stored block lengths")).startswith("error: ")
    assert error_line(RecursionError()).startswith("error: ")
    assert error_line(TypeError("x")).startswith("internal error: TypeError")
