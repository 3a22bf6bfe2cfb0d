"""End to end on a real SGLang server (CPU, tiny dummy-weight Llama, the topas plugin).

Run by ``make test-sglang`` inside ``.venvs/sglang-cpu`` (tools/sglang_cpu/build_env.sh); not
collected by ``make test``. One server serves every run: each run's metadata names its policy
(the plugin switches per run). Times on a CPU mean nothing and are not asserted.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

pytest.importorskip("sglang")

from topas.engine.config import EngineConfig  # noqa: E402
from topas.engine.cost import load_profile  # noqa: E402
from topas.experiments.spec import Prepared  # noqa: E402
from topas.policies.base import make_policy  # noqa: E402
from topas.sglang import launcher  # noqa: E402
from topas.sglang.replay import read_decision_log, run_replay  # noqa: E402
from topas.workload.synthetic import scaled_down  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODEL = Path(os.environ.get("TOPAS_TINY_MODEL", ROOT / ".venvs/sglang-cpu/tiny-llama"))
N_TASKS = 6
#: the plugin's default TOPAS_RECHECK_STEPS (the fixture's server does not set it)
RECHECK_STEPS = 32


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("sglang")
    log, srv_log = d / "decisions.jsonl", d / "server.log"
    port = launcher.free_port()
    env = launcher.server_env("fcfs", {}, decision_log=log, policy_modules=["topas.sglang.testing"])
    t0 = time.perf_counter()
    proc = launcher.start(launcher.cpu_test_args(MODEL, port), env, srv_log)
    url = f"http://127.0.0.1:{port}"
    try:
        import asyncio

        from topas.sglang.replay import wait_healthy

        asyncio.run(wait_healthy(url, 240))
        print(f"\nSGLang CPU server up in {time.perf_counter() - t0:.1f} s")
        yield {"url": url, "log": log, "server_log": srv_log, "proc": proc}
    except BaseException:
        print(srv_log.read_text()[-4000:] if srv_log.exists() else "(no server log)")
        raise
    finally:
        launcher.stop(proc)


def _replay(server, workload, policy, params=None, seed=0, n_tasks=N_TASKS, output_tokens=None, knowledge=None):
    import topas.sglang.testing  # noqa: F401  (registers the misbehaving test policies here too)

    trace = scaled_down(workload, n_tasks, seed=seed)
    if output_tokens is not None:
        trace = _with_outputs(trace, output_tokens)
    prep = Prepared(None, trace, Path(workload), None, None, make_policy(policy, params or {}),
                    load_profile(), EngineConfig(), knowledge)
    assert server["proc"].poll() is None, "the server died"
    res = run_replay(prep, server["url"], decision_log=server["log"], timeout_s=300, wait_healthy_s=30)
    recs = [r for r in read_decision_log(server["log"], "") if r.get("run") == res.summary["run_id"]]
    return trace, res, recs


def _with_outputs(trace, y):
    """``trace`` with every stage's output length set to ``y``."""
    from dataclasses import replace

    return replace(trace, tasks=tuple(replace(t, stages=tuple(replace(s, output_tokens=y) for s in t.stages))
                                      for t in trace.tasks))


def _check_complete(trace, res):
    assert len(res.tasks) == len(trace.tasks) and res.tasks["finish"].notna().all()
    assert (res.tasks["jct"] > 0).all()
    assert len(res.requests) == trace.num_requests
    want = {f"{t.id}/{s.id}": s.output_tokens for t in trace.tasks for s in t.stages}
    assert dict(zip(res.requests["rid"], res.requests["output_tokens"])) == want


def _check_admission_follows_decisions(recs):
    decisions = {r["seq"]: r for r in recs if r["kind"] == "decision"}
    admits = [r for r in recs if r["kind"] == "admit"]
    assert admits
    for a in admits:
        got = [x["rid"] for x in a["admitted"]]
        if a["fallback"]:
            continue  # SGLang's own policy ran this step
        assert a["decided"], f"admitted {got} in a step without a decision"
        d = decisions[a["decision_seq"]]
        assert d["fallback"] is None
        assert got == d["admit"][: len(got)], f"admitted {got}, the policy said {d['admit']}"


@pytest.mark.parametrize("workload", ["chain-3", "dag-4"])
@pytest.mark.parametrize("policy", ["fcfs", "topas", "topas-plus"])
def test_replay_under_a_policy(server, workload, policy):
    trace, res, recs = _replay(server, workload, policy)
    _check_complete(trace, res)
    # the plugin saw the workflow metadata: every request, by the policy's rid, with its task
    seen = {rid for r in recs if r["kind"] == "decision" for rid in r["waiting"]}
    assert seen == set(res.requests["rid"])
    assert all(r["policy"] == policy for r in recs if r["kind"] == "decision")
    assert not [r for r in recs if r["kind"] == "decision" and r["fallback"]]
    _check_admission_follows_decisions(recs)
    assert res.summary["n_decisions"] == len(res.decisions) > 0
    assert set(res.tasks.columns) >= {"task_id", "workflow", "arrival", "finish", "jct", "n_stages"}
    if policy == "topas":
        _check_pinned_prefixes_are_cached(server, trace, res)


def _check_pinned_prefixes_are_cached(server, trace, res):
    """A request admitted while its agent's prefix was pinned reports the whole prefix cached."""
    recs = read_decision_log(server["log"], "")
    run = res.summary["run_id"]
    t0 = min(r["epoch"] - r["time"] for r in recs if r.get("run") == run and r["kind"] == "decision")
    pins: dict[str, list[tuple[float, str]]] = {}
    for r in recs:
        if r["kind"] in ("pin", "unpin") and r["epoch"] >= t0:
            pins.setdefault(r["agent"], []).append((r["epoch"] - t0, r["kind"]))
    assert pins, "TOPAS pinned no prefix"
    admitted_at = {x["rid"]: a["time"] for a in recs if a.get("run") == run and a["kind"] == "admit"
                   for x in a["admitted"]}
    checked = 0
    for row in res.requests.itertuples():
        events = [k for t, k in pins.get(row.agent, []) if t < admitted_at[row.rid]]
        if events and events[-1] == "pin":
            assert row.cached_tokens >= trace.agents[row.agent].prefix_tokens, row
            checked += 1
    assert checked > 0, "no request was admitted under a pinned prefix"
    print(f"\n{checked} requests admitted under a pinned prefix; cached tokens: "
          f"{res.requests['cached_tokens'].sum():.0f} in all")


@pytest.mark.parametrize("policy,params,why", [
    ("test-raising", {"every": 2}, "policy raised RuntimeError"),
    ("test-infeasible", {}, "infeasible decision"),
])
def test_a_failing_policy_does_not_break_the_server(server, policy, params, why):
    trace, res, recs = _replay(server, "dag-4", policy, params, seed=1)
    _check_complete(trace, res)
    fallbacks = [r for r in recs if r["kind"] == "decision" and r["fallback"]]
    assert fallbacks and all(why in r["fallback"] for r in fallbacks)
    _check_admission_follows_decisions(recs)
    # and the server still serves a normal run afterwards
    trace, res, _ = _replay(server, "chain-3", "fcfs", seed=2)
    _check_complete(trace, res)


def test_preempted_requests_resume_and_complete(server):
    """The plugin's preemption (release the KV, re-queue after the step) loses no request and no
    token: every request still returns exactly its output length.

    Deterministic: the test policy holds requests back until the one it admitted decodes, and each
    request decodes for longer than the adapter's re-check interval (``TOPAS_RECHECK_STEPS``,
    32 iterations), so a decision sees a decoding request while others wait, whatever the timing."""
    trace, res, recs = _replay(server, "dag-4", "test-preempting", {"times": 3}, seed=5, n_tasks=3,
                               output_tokens=2 * RECHECK_STEPS)
    _check_complete(trace, res)
    preempted = [rid for r in recs if r["kind"] == "decision" for rid in r["preempt"]]
    assert preempted, "the policy found nothing to preempt"
    assert [r for r in recs if r["kind"] == "preempt"]
    assert res.summary["preemptions"] == len(preempted)
    assert not [r for r in recs if r["kind"] == "decision" and r["fallback"]]
    _check_admission_follows_decisions(recs)


def test_autellix_with_preemption_is_accepted_by_the_plugin(server):
    """Autellix-LAS with ``preempt=True`` does not manage prefixes but declares ``may_preempt``:
    the adapter accepts its decisions (no fallback), and whatever it preempts resumes and
    completes. (Whether a preemption fires on this small run depends on the server's timing.)"""
    trace, res, recs = _replay(server, "dag-4", "autellix-las", {"preempt": True}, seed=3)
    _check_complete(trace, res)
    assert not [r for r in recs if r["kind"] == "decision" and r["fallback"]]
    preempted = [rid for r in recs if r["kind"] == "decision" for rid in r["preempt"]]
    assert res.summary["preemptions"] == len(preempted)
    print(f"\nautellix-las preempt=True: {len(preempted)} preemptions")


def test_a_burst_misses_its_prefix_where_the_simulator_says(server, tmp_path):
    """Contention, request by request (topas.fidelity.contention): three agents' requests at t=0
    on a pool that holds two of their prefixes, under FCFS. The server's ``cached_tokens`` say which
    requests found their prefix cached; the simulator (the engine model as configured for the
    server, the CPU profile, the server's pool) must name exactly the same requests as misses.
    (FCFS: which requests miss does not hinge on when the burst's requests reach the scheduler;
    under LPM and TOPAS it can, see data/results/fidelity/contention/.)"""
    policy = "fcfs"
    from topas.engine.cost import load_profile as _load
    from topas.fidelity import contention as ct
    from topas.fidelity.run import Point, prefix_tokens, sim_engine, simulate_point

    case = ct.CASES["burst-ci"]
    trace_file = ct.write_case_trace(case, tmp_path)
    cost, config = sim_engine(_load(ROOT / "data/profiles/cpu_tiny-llama.json"), kv_budget=case.pool_tokens)
    sim, trace = simulate_point(Point(str(trace_file), policy, rate=None), cost, config)
    prep = Prepared(None, trace, trace_file, None, None, make_policy(policy, {}), cost, EngineConfig())
    res = run_replay(prep, server["url"], decision_log=server["log"], timeout_s=300, wait_healthy_s=30)
    _check_complete(trace, res)
    tab = ct.request_table(sim.requests, res.requests, prefix_tokens(trace))
    ag = ct.agreement(tab)
    print(f"\nburst-ci {policy}: server misses {ag['misses_server']}, simulator {ag['misses_sim']} of {ag['n_requests']}")
    assert ag["same_misses"], (f"misses only in the simulator: {ag['miss_only_sim'] or '-'}; "
                               f"only on the server: {ag['miss_only_server'] or '-'}\n{tab.to_string()}")


def test_the_shipped_qwen_config_is_what_sglang_builds_the_model_from():
    """`topas serve --dummy-weights qwen2.5-32b-instruct`: SGLang reads the shipped config.json alone
    (no weights, no tokenizer) into the model's shape (no server needed)."""
    from sglang.srt.configs.model_config import ModelConfig

    from topas.sglang.launcher import dummy_model_dir

    m = ModelConfig(str(dummy_model_dir("qwen2.5-32b-instruct")))
    assert m.hf_config.architectures == ["Qwen2ForCausalLM"]
    assert (m.num_hidden_layers, m.get_num_kv_heads(1), m.head_dim, m.context_len) == (64, 8, 128, 32768)


@pytest.mark.parametrize("policy", ["test-online-view", "topas", "spf"])
def test_knowledge_settings_reach_the_plugin(server, policy):
    """Issue 16: noisy priors and online DAGs travel in the request metadata; the plugin's view is
    filtered (``test-online-view`` raises, i.e. falls back, on any unreached stage it is shown)."""
    from topas.engine.knowledge import Knowledge

    know = Knowledge(prior_noise=0.8, prior_bias=1.5, dag_visibility="online", seed=2)
    trace, res, recs = _replay(server, "dag-4", policy, knowledge=know)
    _check_complete(trace, res)
    decisions = [r for r in recs if r["kind"] == "decision"]
    assert decisions and not [r for r in decisions if r["fallback"]], [r["fallback"] for r in decisions if r["fallback"]]
    _check_admission_follows_decisions(recs)


def test_decision_log_lines_are_json(server):
    lines = Path(server["log"]).read_text().splitlines()
    assert lines and all(json.loads(x)["kind"] for x in lines)


def _generate(url, ids, max_new=1):
    import urllib.request

    body = json.dumps({"input_ids": ids, "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True}})
    req = urllib.request.Request(f"{url}/generate", body.encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())["meta_info"]


def _cached_after_flood(server, agent, l_a):
    """Flood the KV pool with unrelated plain requests, then ask for the agent's prefix."""
    from topas.sglang.tokens import prefix_ids, suffix_ids

    for k in range(12):  # 12 x 600 tokens through a 4,096-token pool: evicts everything unpinned
        _generate(server["url"], suffix_ids("flood", k, "f", str(k), 600))
    return _generate(server["url"], prefix_ids(agent, l_a) + suffix_ids("probe", 0, "p", agent, 16))["cached_tokens"]


def test_a_pinned_prefix_survives_memory_pressure(server):
    """After a TOPAS run its prefixes stay pinned (locked in the radix tree): a flood of unrelated
    requests evicts everything else, and the agent's prefix is still served from the cache. After
    an FCFS run (which pins nothing, and whose start releases TOPAS's pins) the same flood evicts it."""
    trace, res, recs = _replay(server, "chain-3", "topas", seed=3)
    _check_complete(trace, res)
    pinned = [r for r in read_decision_log(server["log"], "") if r["kind"] == "pin"]
    agent = pinned[-1]["agent"]
    l_a = trace.agents[agent].prefix_tokens
    with_pin = _cached_after_flood(server, agent, l_a)
    trace, res, _ = _replay(server, "chain-3", "fcfs", seed=4)
    _check_complete(trace, res)
    without_pin = _cached_after_flood(server, agent, l_a)
    print(f"\ncached tokens of a {l_a}-token prefix after a flood: {with_pin} pinned (TOPAS), "
          f"{without_pin} unpinned (FCFS)")
    assert with_pin >= l_a
    assert without_pin < l_a


def test_topas_replay_command(server, tmp_path):
    """`topas replay` writes the simulator's tables; against a dead server it exits 1 and writes nothing."""
    import subprocess
    import sys

    import pandas as pd

    from topas.sglang.launcher import free_port
    from topas.workload.trace_io import write_trace

    trace_file = write_trace(scaled_down("dag-4", 3), tmp_path / "dag-4-small.json.gz")
    topas = [sys.executable, "-m", "topas.cli"]
    out = tmp_path / "run"
    p = subprocess.run([*topas, "replay", "--trace", str(trace_file), "--policy", "topas", "--rate", "2",
                        "--seed", "1", "--server", server["url"], "--out", str(out),
                        "--decision-log", str(server["log"]), "--timeout", "300"],
                       capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr
    assert "JCT (s)" in p.stdout
    tasks = pd.read_parquet(out / "tasks.parquet")
    assert len(tasks) == 3 and tasks["jct"].notna().all()
    assert pd.read_parquet(out / "summary.parquet")["policy"].tolist() == ["topas"]
    dead = tmp_path / "dead"
    p = subprocess.run([*topas, "replay", "--trace", str(trace_file), "--policy", "fcfs", "--server",
                        f"http://127.0.0.1:{free_port()}", "--out", str(dead), "--timeout", "5"],
                       capture_output=True, text=True, timeout=200)
    assert p.returncode == 3 and "cannot reach the SGLang server" in p.stderr  # refused at once, as reproduce.py
    assert not dead.exists()


def test_two_calls_of_a_task_share_its_context_on_the_server(server, tmp_path):
    """A topas.trace/2 trace (tokens.stage_ids): each task's first and last call (agent a) hold
    a's 100-token prefix, a 50-token shared header and the task's 300-token context, then 20
    tokens of their own. The last call's ``cached_tokens`` is exactly 100 + 50 + 300 = 450: the
    CPU server's radix cache has page size 1 (token granularity), the first call's prompt is in
    the tree when the last call is scheduled (the 4,096-token pool holds all of it), and 450 is
    below the prompt's 470 - 1 tokens (SGLang never matches a prompt's last token, so that bound
    does not bite). The next task's first call shares only prefix + header (150)."""
    from topas.workload.model import Agent, Segment, Stage, Task, Trace
    from topas.workload.trace_io import write_trace

    pa, pb, hdr = Segment("pa", 100, "prefix"), Segment("pb", 80, "prefix"), Segment("hdr", 50, "shared")
    tasks = []
    for i in range(2):
        t = f"t{i}"
        ctx = Segment(f"ctx{i}", 300, "context", t, "x")
        u = {s: Segment(f"u{i}{s}", 20, "unique", t, s) for s in "xwy"}
        tasks.append(Task(t, 2.0 * i, (
            Stage("x", "a", 370, 8, (), segments=(pa, hdr, ctx, u["x"])),
            Stage("w", "b", 20, 8, ("x",), segments=(pb, u["w"])),
            Stage("y", "a", 370, 8, ("w",), segments=(pa, hdr, ctx, u["y"])))))
    trace = Trace("seg-ctx", {"a": Agent("a", 100, 8.0), "b": Agent("b", 80, 8.0)}, tuple(tasks))
    trace_file = write_trace(trace, tmp_path / "seg-ctx.json.gz")
    policy = "fcfs"
    prep = Prepared(None, trace, trace_file, None, None, make_policy(policy, {}),
                    load_profile(ROOT / "data/profiles/cpu_tiny-llama.json"), EngineConfig())
    res = run_replay(prep, server["url"], decision_log=server["log"], timeout_s=300, wait_healthy_s=30)
    _check_complete(trace, res)
    r = res.requests
    cached = {f"{t}/{s}": int(c) for t, s, c in zip(r["task_id"], r["stage_id"], r["cached_tokens"])}
    print(f"\nseg-ctx cached_tokens: {cached}")
    assert cached["t0/y"] == 450 and cached["t1/y"] == 450
    assert cached["t1/x"] == 150
    assert cached["t0/x"] == 0


def test_topas_computes_a_cold_prefix_once(server, tmp_path):
    """The in-batch guard on the server (topas.fidelity.contention's ``cold-burst``: one cold
    agent, six requests at once): TOPAS admits one request of the agent while its prefix is not
    in the radix tree and holds the others until it is, so every other request reports the whole
    prefix cached (no request computes its own copy), whenever the burst's requests reach the
    scheduler; the held requests are admitted at the first decision after the prefix entered the
    tree, not at the next finish."""
    from topas.fidelity import contention as ct

    case = ct.CASES["cold-burst"]
    trace_file = ct.write_case_trace(case, tmp_path)
    trace = ct.case_trace(case)
    prep = Prepared(None, trace, trace_file, None, None, make_policy("topas", {"in_batch_guard": True}),
                    load_profile(ROOT / "data/profiles/cpu_tiny-llama.json"), EngineConfig())
    res = run_replay(prep, server["url"], decision_log=server["log"], timeout_s=300, wait_healthy_s=30)
    _check_complete(trace, res)
    recs = [r for r in read_decision_log(server["log"], "") if r.get("run") == res.summary["run_id"]]
    assert not [r for r in recs if r["kind"] == "decision" and r["fallback"]]
    _check_admission_follows_decisions(recs)
    req = res.requests.sort_values("first_admit")
    first, rest = req.iloc[0], req.iloc[1:]
    assert first["cached_tokens"] == 0
    assert (rest["cached_tokens"] >= case.prefix_tokens).all(), req[["rid", "cached_tokens"]]
    assert rest["first_admit"].max() < first["finish"], "the held requests waited for the first finish"
