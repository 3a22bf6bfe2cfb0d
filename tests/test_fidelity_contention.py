"""The contention suite's per-request comparison (no server: hand-made request tables)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from topas.fidelity import contention as ct

PT = {"a": 100, "b": 100}


def _req(rids, agents, cached=None, prefix_hit=None, admit=None, finish=None, server=False):
    d = pd.DataFrame({"rid": rids, "agent": agents})
    if cached is not None:
        d["cached_tokens"] = cached
    if prefix_hit is not None:
        d["prefix_hit"] = prefix_hit
    d["first_admit" if not server else "server_admitted"] = admit if admit is not None else [0.0] * len(rids)
    d["finish" if not server else "server_finished"] = finish if finish is not None else range(len(rids))
    return d


def test_a_request_hits_when_its_whole_prefix_was_cached():
    r = _req(["x", "y", "z"], ["a", "b", "a"], cached=[100, 99, 164])
    assert ct.request_hits(r, PT).tolist() == [True, False, True]
    # without cached_tokens (older simulators): prefix_hit
    r = _req(["x", "y"], ["a", "b"], prefix_hit=[False, True])
    assert ct.request_hits(r, PT).tolist() == [False, True]
    with pytest.raises(ValueError, match="neither"):
        ct.request_hits(_req(["x"], ["a"]), PT)


def test_admission_waves_group_one_prefill_batch():
    r = _req(list("pqrst"), ["a"] * 5, admit=[0.5, 0.1, 0.1, 0.9, float("nan")])
    assert ct.admission_waves(r).tolist() == [1, 0, 0, 2, -1]
    # the server's batch timestamp wins over first_admit when every request has one
    s = _req(list("pq"), ["a"] * 2, admit=[0.2, 0.2], server=True).assign(first_admit=[0.0, 1.0])
    assert ct.admission_waves(s).tolist() == [0, 0]


def test_order_agreement_counts_pairs_the_first_side_orders():
    assert ct.order_agreement([1, 2, 3], [10, 20, 30]) == 1.0
    assert ct.order_agreement([1, 2, 3], [30, 20, 10]) == 0.0
    assert ct.order_agreement([1, 1, 2], [5, 4, 6]) == 1.0  # the tied pair does not count
    assert math.isnan(ct.order_agreement([1, 1], [1, 2]))


def test_agreement_names_the_requests_that_miss_on_one_side_only():
    sim = _req(["x", "y", "z"], ["a", "b", "a"], cached=[0, 0, 100], admit=[0, 0, 1], finish=[1, 1, 2])
    srv = _req(["z", "y", "x"], ["a", "b", "a"], cached=[100, 100, 0], admit=[1.0, 0.5, 0.5],
               finish=[3.0, 2.0, 1.5], server=True)
    tab = ct.request_table(sim, srv, PT)
    assert tab["rid"].tolist() == ["z", "y", "x"]  # the server's order, matched by rid
    ag = ct.agreement(tab)
    assert ag["hit_agree"] == pytest.approx(2 / 3)
    assert (ag["misses_sim"], ag["misses_server"], ag["same_misses"]) == (2, 1, False)
    assert ag["miss_only_sim"] == "y" and ag["miss_only_server"] == ""
    assert ag["wave_agree"] == 1.0 and ag["waves_sim"] == ag["waves_server"] == 2
    assert ag["order_agree"] == 1.0  # x, y finish together in the simulation; z last in both
    with pytest.raises(ValueError, match="different requests"):
        ct.request_table(sim.iloc[:2], srv, PT)


def test_the_servers_noise_is_its_repeats_against_each_other():
    a = _req(["x", "y"], ["a", "b"], cached=[0, 100], server=True)
    b = _req(["x", "y"], ["a", "b"], cached=[0, 0], server=True)
    n = ct.run_noise([a, a, b], PT)
    assert n["noise_hit_agree"] == pytest.approx((1 + 0.5 + 0.5) / 3)
    assert math.isnan(ct.run_noise([a], PT)["noise_hit_agree"])


def test_summary_applies_the_issue_bars():
    base = {"case": "c", "mode": "plugin", "policy": "fcfs", "wave_agree": 1.0, "order_agree": 1.0,
            "misses_sim": 1, "misses_server": 1, "noise_hit_agree": 1.0, "noise_wave_agree": 1.0,
            "noise_order_agree": 1.0}
    runs = pd.DataFrame([{**base, "kind": "burst", "repeat": 0, "hit_agree": 1.0, "same_misses": True},
                         {**base, "kind": "burst", "repeat": 1, "hit_agree": 0.9, "same_misses": False}])
    s = ct.summarize(runs)
    assert not s["ok"].iloc[0] and s["same_misses_any"].iloc[0] and s["hit_agree_min"].iloc[0] == 0.9
    runs = pd.DataFrame([{**base, "case": "p", "kind": "poisson", "repeat": 0, "hit_agree": 0.96, "same_misses": False}])
    jct = pd.DataFrame([{"case": "p", "mode": "plugin", "policy": "fcfs", "metric": "jct_mean", "sim": 1.1,
                         "measured": 1.0, "rel_err": 0.1, "measured_ci90": 0.05}])
    assert ct.summarize(runs, jct)["ok"].iloc[0]
    assert not ct.summarize(runs.assign(hit_agree=0.94), jct)["ok"].iloc[0]
    assert not ct.summarize(runs, jct.assign(rel_err=0.2))["ok"].iloc[0]


def test_case_traces_are_deterministic_and_fit_their_pool():
    for case in ct.CASES.values():
        t1, t2 = ct.case_trace(case), ct.case_trace(case)
        assert [(t.id, t.arrival) for t in t1.tasks] == [(t.id, t.arrival) for t in t2.tasks]
        assert len(t1.agents) == case.agents
        if case.name not in ct.GUARD_CASES:  # (the cold burst: one agent's prefix, copies of it)
            assert 2 * case.prefix_tokens < case.pool_tokens < 3 * case.prefix_tokens  # about two prefixes
    burst = ct.case_trace(ct.CASES["burst-3x3"])
    assert [t.stages[0].agent[-1] for t in burst.tasks] == list("abcabcabc")
    assert burst.tasks[-1].arrival == pytest.approx(8 * 0.002)
    with pytest.raises(ValueError, match="per_agent"):
        ct.Case("x", "burst", agents=2, prefix_tokens=10, input_tokens=1, output_tokens=1, pool_tokens=30)


def _measured_burst(queued):
    trace = ct.case_trace(ct.CASES["burst-3x3"])
    rids = [f"{t.id}/{t.stages[0].id}" for t in trace.tasks]
    received = [0.004 + 0.002 * k for k in range(len(rids))]
    return trace, pd.DataFrame({"rid": rids, "server_received": received, "server_queued": queued})


def test_scheduler_arrivals_time_each_task_by_when_its_request_entered_the_queue():
    """``arrivals="scheduler"``: a task arrives ``lead_s`` (the engine's way in) before its
    request entered the server's waiting queue (``server_queued``); without that timestamp it
    falls back to the tokenizer's receipt (counted); ``observed`` uses the receipt."""
    queued = [0.003] + [0.045 + 0.0001 * k for k in range(7)] + [math.nan]
    trace, m = _measured_burst(queued)
    sched, fell_back = ct.observed_trace(trace, m, lead_s=0.001, column="server_queued")
    arr = {t.id: t.arrival for t in sched.tasks}
    assert fell_back == 1
    assert arr["t000"] == pytest.approx(0.002) and arr["t001"] == pytest.approx(0.044)
    assert arr["t008"] == pytest.approx(m["server_received"].iloc[8] - 0.001)  # the fallback
    assert [t.id for t in sched.tasks] == sorted(arr, key=arr.get)  # re-sorted by arrival
    obs, fell_back = ct.observed_trace(trace, m, lead_s=0.001)
    assert fell_back == 0 and obs.tasks[1].arrival == pytest.approx(m["server_received"].iloc[1] - 0.001)
    # a run measured before server_queued existed: every task falls back
    _, fell_back = ct.observed_trace(trace, m.drop(columns="server_queued"), column="server_queued")
    assert fell_back == len(trace.tasks)
    assert "scheduler" in ct.ARRIVALS and ct.ARRIVAL_COLUMN["scheduler"] == "server_queued"


def test_the_simulator_driven_by_scheduler_arrivals_queues_each_request_then():
    """The simulated request enters the waiting queue exactly at its measured scheduler arrival
    (the engine's half request path is the lead), and when it arrives decides what it finds:
    a follow-up of agent a that reaches the scheduler while a's prefix is still being computed
    misses it; one that arrives after that prefill is cached hits it."""
    from dataclasses import replace

    from topas.engine.cost import load_profile
    from topas.engine.simulator import simulate
    from topas.fidelity.run import prefix_tokens, sim_engine
    from topas.paths import REPO_ROOT
    from topas.policies.base import make_policy

    case = ct.CASES["burst-3x3"]
    cost, config = sim_engine(load_profile(REPO_ROOT / "data/profiles/cpu_tiny-llama.json"), case.pool_tokens)
    config = replace(config, request_latency_s=0.004)
    queued = [0.003] + [0.045 + 0.0001 * k for k in range(8)]
    trace, m = _measured_burst(queued)
    sched, _ = ct.observed_trace(trace, m, lead_s=0.002, column="server_queued")
    sim = simulate(sched, make_policy("fcfs", {}), cost, config).requests.set_index("rid")
    assert sim.loc[m["rid"], "ready"].to_numpy() == pytest.approx(queued)
    assert (sim["first_admit"] >= sim["ready"] - 1e-12).all()

    def hit_of_a_follow_up(t):  # t003 (agent a, like t000) reaches the scheduler at t, alone after t000
        q = [0.001, 9.0, 9.0, t, 9.0, 9.0, 9.0, 9.0, 9.0]
        tr, mm = _measured_burst(q)
        s, _ = ct.observed_trace(tr, mm, column="server_queued")
        res = simulate(s, make_policy("fcfs", {}), cost, replace(config, request_latency_s=0.0)).requests
        return bool(ct.request_hits(res, prefix_tokens(tr)).loc["t003/s"])

    assert not hit_of_a_follow_up(0.0015)  # t000's prefill is still running
    assert hit_of_a_follow_up(1.0)  # long after: cached


def test_the_ingest_window_runs_from_the_last_iteration_start_to_the_queue_entry():
    """A request taken in at an iteration start (``server_queued``) reached the scheduler after
    the previous known iteration start (another request's queue entry or a prefill batch) and
    after the tokenizer received it; ``scheduler-mid`` times it in the middle of that window."""
    m = pd.DataFrame({"rid": ["x", "y", "z", "w"],
                      "server_received": [0.001, 0.010, 0.030, 0.040],
                      "server_queued": [0.002, 0.050, 0.050, math.nan],
                      "server_admitted": [0.006, 0.052, 0.100, 0.100]})
    mid = ct.ingest_window_mid(m)
    assert mid.iloc[0] == pytest.approx(0.0015)  # nothing before: from its receipt
    assert mid.iloc[1] == pytest.approx(0.5 * (0.010 + 0.050))  # the batch at 6 ms started before it came
    assert mid.iloc[2] == pytest.approx(0.5 * (0.030 + 0.050))  # received after that batch started
    assert math.isnan(mid.iloc[3])
    assert "scheduler-mid" in ct.ARRIVALS


def test_the_arrivals_table_puts_each_timing_of_the_same_runs_side_by_side(tmp_path):
    from topas.fidelity.report import contention_arrivals_table

    base = {"case": "c", "mode": "plugin", "policy": "fcfs", "repeats": 3, "noise_hit_agree": 0.9}
    pd.DataFrame([{**base, "same_misses_all": True, "hit_agree": 1.0}]).to_csv(tmp_path / "summary_a.csv", index=False)
    pd.DataFrame([{**base, "same_misses_all": False, "hit_agree": 0.8}]).to_csv(tmp_path / "summary_b.csv", index=False)
    t = contention_arrivals_table(tmp_path, ["a", "b"])
    assert t.iloc[0][["a: exact", "a: hit/miss agree", "b: exact", "b: hit/miss agree"]].tolist() == [True, 1.0, False, 0.8]
    assert t.iloc[0]["server vs itself: hit/miss"] == 0.9
    with pytest.raises(FileNotFoundError, match="summary_x.csv"):
        contention_arrivals_table(tmp_path, ["a", "x"])


def test_the_current_table_reads_each_case_from_its_newest_runs(tmp_path):
    from topas.fidelity.report import contention_current_table

    def summary(folder, rows):
        (tmp_path / folder).mkdir()
        pd.DataFrame([{"case": c, "mode": m, "policy": p, "repeats": 3, "hit_agree": h, "same_misses_all": h == 1.0}
                      for c, m, p, h in rows]).to_csv(tmp_path / folder / "summary_sim-observed.csv", index=False)

    summary("old", [("b", "plugin", "lpm", 0.5), ("b", "plugin", "fcfs", 1.0)])
    summary("new", [("b", "plugin", "lpm", 1.0), ("p", "stock", "lpm", 0.9)])
    t = contention_current_table(tmp_path, ["new", "old"])
    got = {(r["case"], r["policy"]): (r["runs"], r["hit/miss agree"]) for _, r in t.iterrows()}
    assert got == {("b", "fcfs"): ("old", 1.0), ("b", "lpm"): ("new", 1.0), ("p", "lpm"): ("new", 0.9)}
    with pytest.raises(FileNotFoundError, match="nowhere"):
        contention_current_table(tmp_path, ["new", "nowhere"])


def test_the_plugin_prices_its_decisions_with_the_simulations_profile(monkeypatch, tmp_path):
    """measure_cases starts the plugin's server with the profile the simulation uses (TOPAS's
    costs would differ otherwise); stock SGLang gets none; handshakes only with the plugin."""
    import contextlib

    import topas.fidelity.contention.suite as suite

    started, measured = [], []

    @contextlib.contextmanager
    def fake_server(**kw):
        started.append(kw)
        yield "http://127.0.0.1:1"

    monkeypatch.setattr(suite, "cpu_server", fake_server)
    monkeypatch.setattr(suite, "server_kv_settings",
                        lambda url: {"kv_budget_tokens": ct.CASES["burst-4x2"].pool_tokens})
    monkeypatch.setattr(suite, "replay_measure",
                        lambda url, decision_log=None, handshake=True: measured.append(handshake))
    monkeypatch.setattr(suite, "run_fidelity", lambda *a, **k: None)
    ct.measure_cases([ct.CASES["burst-4x2"]], [ct.MODES["plugin"], ct.MODES["sglang-fcfs"]], "my-profile.json",
                     tmp_path, repeats=1, log=None, server_log_dir=tmp_path)
    assert [(s["plugin"], s["profile"]) for s in started] == [(True, "my-profile.json"), (False, None)]
    assert measured == [True, False]
    started.clear()
    ct.measure_cases([ct.CASES["burst-4x2"]], [ct.MODES["plugin"]], "p.json", tmp_path, repeats=1, log=None,
                     server_log_dir=tmp_path, plugin_profile=False)
    assert started[0]["profile"] is None


def test_a_stored_run_finds_its_profile_from_any_clone(tmp_path):
    from topas.fidelity.run import recorded_profile
    from topas.paths import profiles_dir

    name = "cpu_tiny-llama"
    here = str(profiles_dir() / f"{name}.json")
    # recorded in another worktree: the same file of this checkout
    assert recorded_profile({"profile_source": f"/elsewhere/wt/data/profiles/{name}.json", "profile": name}) == here
    # recorded relative to the checkout (as runs are written now)
    assert recorded_profile({"profile_source": f"data/profiles/{name}.json", "profile": name}) == here
    # an existing file is used as recorded; nothing recorded: the profile's name
    own = tmp_path / "p.json"
    own.write_text("{}")
    assert recorded_profile({"profile_source": str(own), "profile": name}) == str(own)
    assert recorded_profile({"profile": name}) == name


def test_context_cases_share_a_task_context():
    from topas.workload.reuse import request_reuse

    for name in ("ctx-evict", "ctx-pool2"):
        case = ct.CASES[name]
        trace = ct.case_trace(case)
        assert trace.has_segments and case in ct.comparable_cases()
        reuse = {f"{tid}/{s.id}": c + w for (tid, _, c, w), s in
                 zip(request_reuse(trace), (s for t in trace.tasks for s in t.stages))}
        last = f"s{len(case.chain) - 1}"
        # a perfect cache gives the task's last call its agent prefix and the context of its first
        assert reuse[f"t001/{last}"] == case.prefix_tokens + case.context_tokens


@pytest.mark.parametrize("name", ["ctx-evict", "ctx-pool2"])
def test_the_default_engine_reproduces_the_servers_cached_tokens_on_shared_context(name):
    """The recorded CPU-server runs (FCFS and LPM, two repeats each): every request's
    ``cached_tokens`` in the simulation equals the server's, partial matches included."""
    case = ct.CASES[name]
    d = ct.OUT_DIR / name / "plugin"
    reqs, runs = ct.compare_runs(d, case, "plugin", "sglang", ct.OUT_DIR / "traces", "observed")
    assert len(runs) == 4 and (runs["cached_agree"] == 1.0).all(), runs[["policy", "repeat", "cached_agree"]]
    cached = reqs["cached_server"]
    if name == "ctx-evict":  # the context evicted while the agent prefix stays: partial matches
        assert (cached == case.prefix_tokens).any() and not (cached > case.prefix_tokens).any()
    else:  # the second call of a task finds its prefix and the task's context
        assert (cached == case.prefix_tokens + case.context_tokens).any()


@pytest.mark.parametrize("name", ["evict-freq", "evict-reuse", "evict-steps"])
def test_the_eviction_cases_agree_request_by_request_under_every_policy(name):
    """The recorded CPU-server runs of the eviction cases (stock fcfs, 3 repeats per
    ``--radix-eviction-policy``, priority with no rule, ``reuse`` and ``steps``): the server
    separates the policies (a call of each task hits under some, misses under others), and the
    simulator with the same eviction (and priority rule) gives every request the server's
    ``cached_tokens`` in every run."""
    case = ct.CASES[name]
    # the call that separates the policies: the last one (a or b again); in evict-steps the first
    # task's second b call (the second task's follows from the first's leftover priorities)
    probe = "t000/s3" if name == "evict-steps" else "/s4"
    last = {}
    for mode in ct.EVICTION_MODES.values():
        d = ct.OUT_DIR / name / mode.name
        if not (d / "runs.csv").exists():
            continue
        reqs, runs = ct.compare_runs(d, case, mode, "sglang", ct.OUT_DIR / "traces", "observed")
        assert len(runs) == 3 and (runs["noise_hit_agree"] == 1.0).all()  # the server repeats itself
        assert (runs["cached_agree"] == 1.0).all(), (mode.name, runs[["repeat", "cached_agree"]])
        last[mode.name] = tuple(reqs[reqs["rid"].str.endswith(probe)]["cached_server"].astype(int))
    assert {"evict-lru", "evict-lfu", "evict-priority", "evict-priority-steps"} <= set(last)
    p = case.prefix_tokens
    if name == "evict-freq":  # a's prefix: evicted under lru, kept under lfu and the reuse and steps priorities
        assert set(last["evict-lru"]) == {0}
        assert set(last["evict-lfu"]) == set(last["evict-priority"]) == set(last["evict-priority-steps"]) == {p}
    elif name == "evict-reuse":  # b's prefix: kept under lru and the reuse priorities, evicted under lfu and
        # steps (a's prefix keeps the 5 of a's first call, due again at once; b's call gave 4)
        assert set(last["evict-lfu"]) == set(last["evict-priority-steps"]) == {0}
        assert set(last["evict-lru"]) == set(last["evict-priority"]) == {p}
    else:  # b's prefix, older and used less often than a's but due sooner: kept only under steps
        assert set(last) == set(ct.EVICTION_MODES)
        assert {m: set(v) for m, v in last.items()} == {m: {p} if m == "evict-priority-steps" else {0}
                                                         for m in ct.EVICTION_MODES}


def test_a_cold_agents_burst_duplicates_its_prefix_unless_the_in_batch_guard_holds_it():
    """The recorded CPU-server runs of ``cold-burst`` (one cold agent, six requests at once;
    3 runs per mode; the first request reaches the server alone and is prefilled alone). TOPAS
    without its in-batch guard admits the next three while that prefill's prefix is not in the
    tree yet: each computes its own copy (``cached_tokens`` 0), the last two hit it later; with
    the guard it holds them until the prefix is in the tree, then all five hit. The simulator
    gives every request the server's ``cached_tokens`` and admission wave in every run of both.
    Stock fcfs and lpm (whose in-batch check only sorts the copies behind other requests, and
    there are none) duplicate the prefix as TOPAS without the guard; the simulator agrees
    request by request in at least 2 of their 3 runs (the other: a follow-up reaching the
    scheduler within a few ms of the first prefill's end, on one side of it on the server and on
    the other in the calibrated simulation)."""
    case = ct.CASES["cold-burst"]
    p = case.prefix_tokens
    dup, guarded = [0, 0, 0, 0, p, p], [0, p, p, p, p, p]
    for name in ("plugin-guard-off", "plugin-guard-on", "sglang-fcfs", "sglang-lpm"):
        mode = ct.find_mode(name)
        reqs, runs = ct.compare_runs(ct.OUT_DIR / case.name / name, case, mode, "sglang", ct.OUT_DIR / "traces",
                                     "observed")
        assert len(runs) == 3, name
        server = [g.sort_values("rid")["cached_server"].astype(int).tolist() for _, g in reqs.groupby("repeat")]
        if name.startswith("plugin-"):
            assert (runs["cached_agree"] == 1.0).all() and (runs["wave_agree"] == 1.0).all(), \
                (name, runs[["repeat", "cached_agree", "wave_agree"]])
            assert server == [guarded if name == "plugin-guard-on" else dup] * 3, (name, server)
        else:
            assert (runs["cached_agree"] == 1.0).sum() >= 2, (name, runs[["repeat", "cached_agree"]])
            assert server.count(dup) >= 2, (name, server)
    # the simulator counts the copies (the trace's times: the six requests reach it together,
    # the guard admits one, then five; without it four start at once, three with their own copy)
    from topas.engine.cost import load_profile
    from topas.engine.simulator import simulate
    from topas.fidelity.run import sim_engine
    from topas.paths import REPO_ROOT
    from topas.policies.base import make_policy

    cost, config = sim_engine(load_profile(REPO_ROOT / "data/profiles/cpu_tiny-llama.json"), case.pool_tokens)
    for guard, copies in ((False, 3), (True, 0)):
        s = simulate(ct.case_trace(case), make_policy("topas", {"in_batch_guard": guard}), cost, config).summary
        assert (s["prefix_dup_copies"], s["prefix_dup_tokens"]) == (copies, copies * p)
