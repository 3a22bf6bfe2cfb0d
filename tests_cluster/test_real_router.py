"""Two real CPU SGLang servers (topas plugin) behind the real ``sglang-router`` 0.3.2 (``cache_aware``).

Run by ``make test-cluster`` inside ``.venvs/sglang-cpu`` (tools/sglang_cpu/build_env.sh installs
the router layer and writes the tiny model's tokenizer); not collected by ``make test``.

The servers load the tiny model's tokenizer (:mod:`topas.sglang.text`: one character per token
id) instead of ``--skip-tokenizer-init``, so the replay sends text (``send_text``) whose tokens
share exactly each agent's prefix, which the router's text tree matches. A fresh router serves
each run: its tree outlives ``/flush_cache`` and would remember the previous run's prefixes.

What must hold (times on a CPU mean nothing and are not asserted):

* every task completes, every request with exactly its trace's output length;
* the workflow metadata reaches each server's plugin through the router (which drops
  ``custom_params``: it travels in the request id): every request is admitted by exactly one
  worker's plugin, which decided for it under the run's policy; on DAG-4 the rule uses both
  workers whatever the timing (see the test), so both plugins must have seen metadata;
  Chain-3 may stay on one worker (it does when no A is in flight as B becomes ready);
* the router's choices (read from the workers' decision logs: ``topas.fidelity.real_router``)
  follow the cache-aware rule where the rule does not depend on timing: with prefixes of 89%
  (chain-3) / 86% (dag-4) of every prompt, far over ``cache_threshold`` 0.3, all of an agent's
  requests go to the worker its first request went to, and loads never differ by 64, so the
  imbalance branch never runs;
* the simulator's ``sglang-cache-aware`` fed the real run (order and loads, ``rule_choices``)
  agrees on every request. An agent's first request (a miss) goes to the least-loaded worker,
  and the router reads the loads at an instant the client does not see (it reads them before
  counting the request itself, so two requests routed at once, as DAG-4's B and C are when their
  parent finishes, both see the loads without the other; it stops counting a request before the
  client has its answer, which a busy client may read long after the server finished it): the
  servers run with ``--enable-metrics``, and each request's receipt and finish on its server
  bound when the router counted it; a miss is checked against every reading of the loads those
  bounds allow (``topas.fidelity.real_router.rule_choices``). The numbers, with the bounds and
  strictly on the client's clock, are printed and recorded in docs/cluster.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

pytest.importorskip("sglang")
pytest.importorskip("sglang_router")

from topas.fidelity.real_router import (TIMING_WINDOW_S, agreement, choices_from_logs, per_agent,  # noqa: E402
                                       rule_choices, simulated_choices)
from topas.cluster.routers import make_router  # noqa: E402
from topas.engine.config import EngineConfig  # noqa: E402
from topas.engine.cost import load_profile  # noqa: E402
from topas.experiments.spec import Prepared  # noqa: E402
from topas.policies.base import make_policy  # noqa: E402
from topas.sglang import launcher  # noqa: E402
from topas.sglang import server as srv  # noqa: E402
from topas.sglang.replay import read_decision_log, run_replay, wait_healthy  # noqa: E402
from topas.workload.synthetic import scaled_down  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODEL = Path(os.environ.get("TOPAS_TINY_MODEL", ROOT / ".venvs/sglang-cpu/tiny-llama"))
CPU_PROFILE = ROOT / "data" / "profiles" / "cpu_tiny-llama.json"
N_TASKS = 4
#: the workers' KV pool (tokens): every run's requests fit many times over
KV_POOL = 4096
#: where the measured choices go (OUT=... make test-cluster): docs/cluster.md quotes them
RESULT_OUT = os.environ.get("TOPAS_CLUSTER_RESULT")


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    if not (MODEL / "tokenizer.json").is_file():
        pytest.fail(f"{MODEL} has no tokenizer.json: run `bash tools/sglang_cpu/build_env.sh` (make test-cluster does)")
    d = tmp_path_factory.mktemp("cluster")
    procs, urls, logs = [], [], []
    t0 = time.perf_counter()
    try:
        for k in range(2):
            port = launcher.free_port()
            log = d / f"decisions{k}.jsonl"
            env = launcher.server_env("fcfs", {}, decision_log=log)
            # --enable-metrics: each request's receipt and finish on the server (replay's
            # server_received / server_finished), which bound when the router counted it
            procs.append(launcher.start([*launcher.cpu_test_args(MODEL, port, KV_POOL, tokenizer=True), "--enable-metrics"],
                                        env, d / f"server{k}.log"))
            urls.append(f"http://127.0.0.1:{port}")
            logs.append(log)
        for u in urls:
            asyncio.run(wait_healthy(u, 300))
        print(f"\ntwo SGLang CPU servers up in {time.perf_counter() - t0:.1f} s")
        yield {"urls": urls, "logs": logs, "dir": d, "procs": procs}
    except BaseException:
        for k in range(len(procs)):
            p = d / f"server{k}.log"
            print(p.read_text()[-3000:] if p.exists() else "(no server log)")
        raise
    finally:
        for p in procs:
            launcher.stop(p)


def _router(workers, name):
    port = launcher.free_port()
    log = workers["dir"] / f"router-{name}.log"
    proc = launcher.start_router(workers["urls"], port, log)
    url = f"http://127.0.0.1:{port}"
    try:
        # generous: with two busy processes beside the servers on 2 cores, a router once did not
        # answer within 60 s
        asyncio.run(wait_healthy(url, 240))
        deadline = time.monotonic() + 60
        while set(srv.router_workers(url) or ()) != set(workers["urls"]) and time.monotonic() < deadline:
            time.sleep(0.3)  # the router registers its workers in the background
        order = srv.router_workers(url)
        assert set(order or ()) == set(workers["urls"]), f"router workers {order}"
    except BaseException:
        launcher.stop(proc)
        print(log.read_text()[-3000:] if log.exists() else "(no router log)")
        raise
    return proc, url, order


def _run(workers, workload, policy):
    trace = scaled_down(workload, N_TASKS)
    prep = Prepared(None, trace, Path(workload), None, None, make_policy(policy), load_profile(), EngineConfig(), None)
    proc, url, order = _router(workers, f"{workload}-{policy}")
    # worker i = the router's i-th worker (GET /workers): the order its policy scans for the least
    # load, which is the order it registered them in, not always --worker-urls'
    logs = [workers["logs"][workers["urls"].index(u)] for u in order]
    try:
        res = run_replay(prep, url, decision_log=[str(p) for p in logs], timeout_s=400, wait_healthy_s=30,
                         send_text=True)
        assert srv.router_workers(url) == order, "the router's worker order changed during the run"
    finally:
        launcher.stop(proc)
    recs = [read_decision_log(p, "") for p in logs]
    return trace, res, recs


@pytest.mark.parametrize("workload,policy", [("chain-3", "fcfs"), ("dag-4", "topas")])
def test_replay_through_the_router(workers, workload, policy):
    trace, res, recs = _run(workers, workload, policy)
    run = res.summary["run_id"]
    # every task completes, every output exactly as long as the trace says
    assert len(res.tasks) == len(trace.tasks) and res.tasks["finish"].notna().all()
    want = {f"{t.id}/{s.id}": s.output_tokens for t in trace.tasks for s in t.stages}
    assert dict(zip(res.requests["rid"], res.requests["output_tokens"])) == want
    # text prompts: the servers tokenized exactly l_a + x_v tokens
    plen = {r: trace.agents[a].prefix_tokens + x for r, a, x in
            zip(res.requests["rid"], res.requests["agent"], res.requests["input_tokens"])}
    assert dict(zip(res.requests["rid"], res.requests["prompt_tokens"].astype(int))) == plen

    # the metadata reached the workers' plugins: every request admitted by exactly one plugin, and
    # each worker's plugin decided for the run, under its policy, exactly when it got requests, and
    # saw exactly those requests waiting
    choices = choices_from_logs(recs, run)
    assert set(choices) == set(want)
    for k, rs in enumerate(recs):
        decs = [r for r in rs if r.get("kind") == "decision" and r.get("run") == run]
        mine = {r for r, w in choices.items() if w == k}
        assert bool(decs) == bool(mine), f"worker {k}: {len(decs)} decisions, {len(mine)} requests"
        assert all(r["policy"] == policy and r["fallback"] is None for r in decs), f"worker {k}"
        assert {rid for r in decs for rid in r["waiting"]} == mine, f"worker {k}"
    if workload == "dag-4":
        # the rule uses both workers on DAG-4 whatever the timing: A's first request goes to worker 0
        # (equal loads); B and C become ready together when an A finishes, and the first of them
        # raises its worker's load, so one of them goes to worker 1 unless worker 0 has A requests
        # in flight, in which case the first one already goes there
        assert set(choices.values()) == {0, 1}
    assert res.summary["plugin_decisions_per_server"] == [
        sum(1 for r in rs if r.get("kind") == "decision" and r.get("run") == run) for rs in recs]

    # the rule where it does not depend on timing: each agent stays on one worker
    agent_of = dict(zip(res.requests["rid"], res.requests["agent"]))
    by_agent = per_agent(choices, agent_of)
    assert all(len(ws) == 1 for ws in by_agent.values()), by_agent

    # the simulator's router: fed the real run, and simulating the whole cluster; the servers'
    # stamps of every request bound when the router counted it (rule_choices)
    stamps = res.requests[["server_received", "server_finished"]]
    assert stamps.notna().all().all(), "the servers gave no receipt / finish stamps (--enable-metrics)"
    prefix = {a: ag.prefix_tokens for a, ag in trace.agents.items()}
    resolved: set[str] = set()
    rule = rule_choices(res.requests, prefix, make_router("sglang-cache-aware"), choices, 2,
                        window_s=TIMING_WINDOW_S, resolved=resolved)
    a_rule = agreement(choices, rule)
    strict = agreement(choices, rule_choices(res.requests, prefix, make_router("sglang-cache-aware"), choices, 2))
    from topas.fidelity.run import sim_engine

    cost, cfg = sim_engine(CPU_PROFILE, KV_POOL)
    sim = simulated_choices(trace, policy, make_router("sglang-cache-aware"), cost, cfg, 2)
    a_sim = agreement(choices, sim)
    old = agreement(choices, rule_choices(res.requests, prefix, make_router("sglang-cache-aware", on_miss="smallest-tree"),
                                          choices, 2))
    n_agents = len(trace.agents)
    print(f"\n{workload}/{policy}: {len(choices)} requests, per worker "
          f"{[sum(1 for w in choices.values() if w == k) for k in range(2)]}, agents {by_agent}; agreement: "
          f"rule on the real run {a_rule.fraction:.3f} (differ {list(a_rule.differ)}; misses read within the "
          f"servers' stamps: {sorted(resolved)}; strictly on the client's clock {strict.fraction:.3f}), "
          f"simulated cluster {a_sim.fraction:.3f} (differ {list(a_sim.differ)}), "
          f"older smallest-tree rule {old.fraction:.3f}; replay wall {res.summary['sim_wall_s']:.1f} s")
    if RESULT_OUT:
        rows = [{"workload": workload, "policy": policy, "rid": r, "agent": agent_of[r], "ready": round(float(rd), 4),
                 "finish": round(float(fi), 4), "server_received": round(float(sr), 4),
                 "server_finished": round(float(sf), 4), "router": choices[r], "rule": rule[r], "simulated": sim[r]}
                for r, rd, fi, sr, sf in zip(res.requests["rid"], res.requests["ready"], res.requests["finish"],
                                             res.requests["server_received"], res.requests["server_finished"])]
        with open(RESULT_OUT, "a", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    assert a_rule.same == len(choices), (a_rule, n_agents)


def test_topas_replay_command_through_the_router(workers, tmp_path):
    """`topas replay --server ROUTER --send-text` replays through the router: tables written, both
    servers' plugins saw the run's requests (the router splits DAG-4's agents over them)."""
    import subprocess
    import sys

    import pandas as pd

    from topas.workload.trace_io import write_trace

    trace_file = write_trace(scaled_down("dag-4", 3), tmp_path / "dag-4-small.json.gz")
    proc, url, order = _router(workers, "cli")
    logs = [workers["logs"][workers["urls"].index(u)] for u in order]
    out = tmp_path / "run"
    try:
        p = subprocess.run([sys.executable, "-m", "topas.cli", "replay", "--trace", str(trace_file), "--policy", "fcfs",
                            "--rate", "2", "--seed", "1", "--server", url, "--send-text", "--out", str(out),
                            *[a for lg in logs for a in ("--decision-log", str(lg))], "--timeout", "300"],
                           capture_output=True, text=True, timeout=400)
    finally:
        launcher.stop(proc)
    assert p.returncode == 0, p.stderr
    assert "JCT (s)" in p.stdout and url in p.stdout
    run = json.loads(p.stdout.strip().splitlines()[-1])["run_id"]
    reqs = pd.read_parquet(out / "requests.parquet")
    assert len(reqs) == 12 and reqs["first_admit"].notna().all()  # admissions read from both logs
    choices = choices_from_logs([read_decision_log(lg, "") for lg in logs], run)
    assert set(choices) == set(reqs["rid"])
    assert pd.read_parquet(out / "summary.parquet")["policy"].tolist() == ["fcfs"]
