"""The replay client's results have the simulator's format (no server needed)."""

from __future__ import annotations

import json
import math

import pytest

from topas.engine.cost import load_profile
from topas.engine.simulator import simulate
from topas.policies.base import make_policy
from topas.sglang.replay import (NAN_REQUEST_COLUMNS, NAN_SUMMARY_KEYS, ReplayError, _Done,
                                 build_replay_result, write_result_atomic)
from topas.workload.synthetic import scaled_down


def _fake_replay(trace, with_log=True):
    done, finish = [], {}
    for t in trace.tasks:
        clock = t.arrival
        for s in t.stages:
            done.append(_Done(f"{t.id}/{s.id}", t.id, s.id, s.agent, s.input_tokens, clock, clock + 1.0,
                              {"completion_tokens": s.output_tokens, "cached_tokens": 0, "prompt_tokens": 1,
                               "num_retractions": 0, "e2e_latency": 1.0}))
            clock += 1.0
        finish[t.id] = clock
    log = None
    if with_log:
        t0 = t = trace.tasks[0]
        log = [{"kind": "decision", "run": "r", "seq": 1, "time": 0.0, "wall_s": 1e-4, "n_waiting": 1,
                "n_running": 0, "admit": [f"{t0.id}/A"], "preempt": [], "evict": [], "load": [], "info": {"x": 1.0},
                "fallback": None},
               {"kind": "admit", "run": "r", "time": 0.01, "decided": True, "fallback": False, "decision_seq": 1,
                "admitted": [{"rid": f"{t0.id}/A", "erid": "e", "cached": 0}]}]
    return build_replay_result(trace, "fcfs", done, finish, 5.0, log, "r", 0.0)


@pytest.mark.parametrize("with_log", [True, False])
def test_replay_result_has_the_simulator_format(with_log, tmp_path):
    trace = scaled_down("dag-4", 3)
    sim = simulate(trace, make_policy("fcfs"), load_profile().with_budget(4096))
    rep = _fake_replay(trace, with_log)
    for name in ("tasks", "requests", "prefix_events", "timeline", "decisions"):
        want, got = list(getattr(sim, name).columns), list(getattr(rep, name).columns)
        if name == "decisions":
            want = [c for c in want if not c.startswith("info_")]
        assert got[: len(want)] == want, name  # the same columns first, in the same order; extras after
    assert set(sim.summary) <= set(rep.summary)
    for k in NAN_SUMMARY_KEYS:
        assert math.isnan(rep.summary[k])
    for c in NAN_REQUEST_COLUMNS:
        assert rep.requests[c].isna().all()
    assert rep.summary["n_tasks"] == 3 and rep.summary["jct_mean"] == pytest.approx(4.0)  # 4 stages, 1 s each
    if with_log:
        assert rep.decisions["n_admitted"].tolist() == [1] and rep.summary["n_decisions"] == 1
        assert rep.requests["first_admit"].notna().sum() == 1
    else:
        assert math.isnan(rep.summary["n_decisions"]) and rep.requests["first_admit"].isna().all()
    out = write_result_atomic(rep, tmp_path / "run")
    assert sorted(p.name for p in out.iterdir() if p.name != ".topas-output") == sorted(
        f"{n}.parquet" for n in ("tasks", "requests", "prefix_events", "timeline", "decisions", "summary"))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dir left


def test_replay_against_no_server_fails_cleanly(tmp_path):
    pytest.importorskip("aiohttp")
    from topas.engine.config import EngineConfig
    from topas.experiments.spec import Prepared
    from topas.sglang.launcher import free_port
    from topas.sglang.replay import run_replay

    trace = scaled_down("chain-3", 1)
    prep = Prepared(None, trace, tmp_path, None, None, make_policy("fcfs"), load_profile(), EngineConfig())
    with pytest.raises(ReplayError, match="not healthy"):
        run_replay(prep, f"http://127.0.0.1:{free_port()}", out=tmp_path / "out", wait_healthy_s=1.0)
    assert not (tmp_path / "out").exists()


def test_profile_gpu_script_without_a_gpu(tmp_path):
    """scripts/profile_gpu.py: the swap part says so and changes nothing where no CUDA GPU is visible."""
    import runpy

    from topas.paths import REPO_ROOT

    mod = runpy.run_path(str(REPO_ROOT / "scripts" / "profile_gpu.py"), run_name="profile_gpu")
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is visible: the swap is measured for real")
    except ImportError:
        pass
    assert mod["measure_swap"]() is None
    prof = tmp_path / "p.json"
    prof.write_text("{}")
    assert mod["main"](["--swap-only", "--out", str(prof)]) == 1
    assert prof.read_text() == "{}"
    with pytest.raises(SystemExit):
        mod["main"]([])  # --server and --out are needed


def test_topas_serve_dry_run_sets_the_plugin_environment(tmp_path):
    from click.testing import CliRunner

    from topas.cli import main

    r = CliRunner().invoke(main, ["serve", "--policy", "topas", "--param", "beta=0.5", "--decision-log",
                                  str(tmp_path / "d.jsonl"), "--dry-run", "--", "--model-path", "m", "--port", "1"])
    assert r.exit_code == 0, r.output
    assert "SGLANG_PLUGINS=topas" in r.output and "TOPAS_POLICY=topas" in r.output
    assert 'TOPAS_POLICY_PARAMS={"beta": "0.5"}' in r.output
    assert r.output.strip().endswith("-m sglang.launch_server --model-path m --port 1")
    r = CliRunner().invoke(main, ["serve", "--policy", "nope", "--dry-run"])
    assert r.exit_code == 1 and "unknown policy 'nope'" in r.output
    r = CliRunner().invoke(main, ["serve", "--policy", "topas", "--param", "no_such=1", "--dry-run"])
    assert r.exit_code == 1 and "no_such" in r.output


def test_topas_serve_dummy_weights_needs_no_download():
    """`topas serve --dummy-weights qwen2.5-32b-instruct` points SGLang at the shipped config.json with
    random weights and no tokenizer; the config is Qwen2.5-32B-Instruct's (its KV per token is the
    shipped A100 profile's)."""
    from click.testing import CliRunner

    from topas.cli import main
    from topas.engine.cost import load_profile
    from topas.fidelity.profile_server import _kv_bytes_per_token
    from topas.paths import REPO_ROOT
    from topas.sglang.launcher import dummy_model_dir

    d = REPO_ROOT / "data" / "models" / "qwen2.5-32b-instruct"
    assert dummy_model_dir("qwen2.5-32b-instruct") == d
    r = CliRunner().invoke(main, ["serve", "--policy", "fcfs", "--dummy-weights", "qwen2.5-32b-instruct",
                                  "--dry-run", "--", "--port", "30000", "--enable-metrics"])
    assert r.exit_code == 0, r.output
    assert r.output.strip().endswith(f"-m sglang.launch_server --model-path {d} --load-format dummy "
                                     "--skip-tokenizer-init --port 30000 --enable-metrics")
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["num_hidden_layers"] == 64
    assert cfg["vocab_size"] > 31000  # the replay's token ids (topas.sglang.tokens.ID_HIGH) fit
    mu, _ = _kv_bytes_per_token(str(d))
    assert mu == load_profile("a100-80gb_qwen2.5-32b").kv_bytes_per_token == 2 * 64 * 8 * 128 * 2
    r = CliRunner().invoke(main, ["serve", "--dummy-weights", "gpt-5", "--dry-run"])
    assert r.exit_code == 1 and "unknown dummy model 'gpt-5'" in r.output and "qwen2.5-32b-instruct" in r.output
    r = CliRunner().invoke(main, ["serve", "--dummy-weights", "qwen2.5-32b-instruct", "--dry-run", "--",
                                  "--model-path", "m"])
    assert r.exit_code == 1 and "not both" in r.output


def test_replay_keeps_the_servers_own_timestamps_in_run_time():
    """With --enable-metrics the server reports when its tokenizer manager received and finished
    each request (wall clock); the result has them as seconds since the run's start."""
    trace = scaled_down("chain-3", 1)
    t0 = 1_700_000_000.0
    done = []
    for i, s in enumerate(trace.tasks[0].stages):
        mi = {"completion_tokens": s.output_tokens, "cached_tokens": 0, "prompt_tokens": 1}
        if i == 0:
            mi.update(request_received_ts=t0 + 0.25, request_finished_ts=t0 + 0.75)
        done.append(_Done(f"{trace.tasks[0].id}/{s.id}", trace.tasks[0].id, s.id, s.agent, s.input_tokens,
                          float(i), i + 1.0, mi))
    rep = build_replay_result(trace, "fcfs", done, {trace.tasks[0].id: 3.0}, 3.0, None, "r", t0)
    req = rep.requests.set_index("stage_id")
    first = trace.tasks[0].stages[0].id
    assert req.loc[first, "server_received"] == pytest.approx(0.25)
    assert req.loc[first, "server_finished"] == pytest.approx(0.75)
    assert req.drop(index=first)[["server_received", "server_finished"]].isna().all().all()


def test_the_scheduler_arrival_is_the_forward_entry_minus_the_queue_wait():
    """SGLang reports when a prefill batch first took the request (``forward_entry_time``, wall
    clock) and how long it waited in the scheduler's queue before (``queue_time``): their
    difference is when it entered the queue, in the replay's run time. NaN where it cannot be
    told: no timestamps (no --enable-metrics: queue_time 0 and no forward_entry_time), or a
    retracted request (its queue_time sums several waits)."""
    from topas.sglang.replay import scheduler_arrival

    t0 = 1_700_000_000.0
    assert scheduler_arrival({"forward_entry_time": t0 + 0.5, "queue_time": 0.125}, t0) == pytest.approx(0.375)
    assert scheduler_arrival({"forward_entry_time": t0 + 0.5, "queue_time": 0.0}, t0) == pytest.approx(0.5)
    for mi in ({"queue_time": 0.0}, {"forward_entry_time": t0 + 0.5}, {},
               {"forward_entry_time": t0 + 0.5, "queue_time": float("nan")},
               {"forward_entry_time": t0 + 0.5, "queue_time": -0.1},
               {"forward_entry_time": t0 + 0.5, "queue_time": 0.1, "num_retractions": 1}):
        assert math.isnan(scheduler_arrival(mi, t0)), mi
    # in the replay's requests table
    trace = scaled_down("chain-3", 1)
    done = []
    for i, s in enumerate(trace.tasks[0].stages):
        mi = {"completion_tokens": s.output_tokens, "cached_tokens": 0, "prompt_tokens": 1}
        if i == 0:
            mi.update(forward_entry_time=t0 + 0.25, queue_time=0.05)
        done.append(_Done(f"{trace.tasks[0].id}/{s.id}", trace.tasks[0].id, s.id, s.agent, s.input_tokens,
                          float(i), i + 1.0, mi))
    req = build_replay_result(trace, "fcfs", done, {trace.tasks[0].id: 3.0}, 3.0, None, "r", t0).requests
    assert req["server_queued"].iloc[0] == pytest.approx(0.20)
    assert req["server_queued"].iloc[1:].isna().all()
