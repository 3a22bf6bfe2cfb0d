"""Fidelity comparison logic, profile fitting and orchestration, without a server (synthetic runs)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from topas.engine.cost import CostModel, load_profile
from topas.engine.metrics import SimResult
from topas.fidelity import compare as fc
from topas.fidelity.profile_server import fit_server_profile, server_settings
from topas.fidelity.run import Point, run_fidelity, sim_engine, simulate_point


def _result(jcts, cached=None, queue=None, retractions=0, agent="a", prefix_hit=None):
    n = len(jcts)
    tasks = pd.DataFrame({"task_id": [f"t{i}" for i in range(n)], "arrival": np.arange(n, dtype=float),
                          "finish": np.arange(n, dtype=float) + np.asarray(jcts, float),
                          "jct": np.asarray(jcts, float), "n_stages": 1})
    req = pd.DataFrame({"rid": [f"t{i}/s" for i in range(n)], "task_id": tasks["task_id"], "agent": agent,
                        "ready": tasks["arrival"], "first_admit": tasks["arrival"] + (queue or 0.0),
                        "finish": tasks["finish"], "retractions": [retractions] + [0] * (n - 1)})
    if cached is not None:
        req["cached_tokens"] = cached
    if prefix_hit is not None:
        req["prefix_hit"] = prefix_hit
    empty = pd.DataFrame()
    return SimResult(tasks, req, empty, empty, empty, {"retractions": retractions})


def _runs(sim_jct: dict, meas_jct: dict, cached=(100.0, 100.0)):
    rows = []
    for pol, v in sim_jct.items():
        rows.append({"workload": "w", "load": 1.0, "policy": pol, "seed": 0, "engine": "sim", "repeat": 0,
                     "jct_mean": v, "jct_p99": 2 * v, "cached_tokens": cached[0]})
    for pol, vs in meas_jct.items():
        for rep, v in enumerate(vs):
            rows.append({"workload": "w", "load": 1.0, "policy": pol, "seed": 0, "engine": "sglang", "repeat": rep,
                         "jct_mean": v, "jct_p99": 2 * v, "cached_tokens": cached[1]})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- run_metrics
def test_run_metrics_measured_columns():
    r = _result([1.0, 2.0, 3.0, 10.0], cached=[5, 5, 0, 0], queue=0.5, retractions=2)
    m = fc.run_metrics(r)
    assert m["jct_mean"] == pytest.approx(4.0)
    assert m["jct_p99"] == pytest.approx(np.percentile([1, 2, 3, 10], 99))
    assert m["cached_tokens"] == 10
    assert m["queue_mean"] == pytest.approx(0.5)
    assert m["e2e_mean"] == pytest.approx(4.0)
    assert m["retractions"] == 2
    assert m["n_tasks"] == 4


def test_run_metrics_sim_cached_from_prefix_hits():
    r = _result([1.0, 1.0, 1.0], prefix_hit=[False, True, True])
    assert fc.run_metrics(r, {"a": 64})["cached_tokens"] == 128
    assert math.isnan(fc.run_metrics(r)["cached_tokens"])  # no prefix lengths, no cached column


def test_rel_error_edges():
    assert fc.rel_error(1.1, 1.0) == pytest.approx(0.1)
    assert fc.rel_error(0.0, 0.0) == 0.0
    assert math.isnan(fc.rel_error(1.0, 0.0))
    assert math.isnan(fc.rel_error(float("nan"), 1.0))


# ----------------------------------------------------------------------------- compare
def test_compare_errors_bars_and_spread():
    runs = _runs({"fcfs": 1.1, "lpm": 2.0}, {"fcfs": [0.9, 1.0, 1.1], "lpm": [1.0, 1.5, 2.0]})
    t = fc.compare(runs)
    row = t[(t.policy == "fcfs") & (t.metric == "jct_mean")].iloc[0]
    assert row.measured == pytest.approx(1.0)
    assert row.rel_err == pytest.approx(0.1)
    assert (row.measured_min, row.measured_max) == (pytest.approx(0.9), pytest.approx(1.1))
    assert row.measured_cv == pytest.approx(0.1)
    assert row.ok == True and row.bar == 0.15 and row.n_measured == 3
    lpm = t[(t.policy == "lpm") & (t.metric == "jct_mean")].iloc[0]
    assert lpm.rel_err == pytest.approx(1 / 3) and lpm.ok == False
    cached = t[(t.policy == "lpm") & (t.metric == "cached_tokens")].iloc[0]
    assert cached.rel_err == 0 and cached.ok == True
    # a metric without a bar is reported with ok None
    assert t[(t.policy == "lpm") & (t.metric == "jct_p99")].iloc[0].ok == False  # 25% bar, +33%
    t2 = fc.compare(runs, bars=fc.CI_BARS)
    assert t2[(t2.metric == "jct_p99")]["ok"].isna().all()
    assert t2[(t2.policy == "lpm") & (t2.metric == "jct_mean")].iloc[0].ok == False  # 33% > 30%


def test_compare_needs_both_engines_and_known_columns():
    runs = _runs({"fcfs": 1.0}, {"lpm": [1.0]})
    assert fc.compare(runs).empty
    with pytest.raises(ValueError, match="lacks column"):
        fc.compare(runs.drop(columns=["repeat"]))
    with pytest.raises(ValueError, match="unknown engine"):
        fc.compare(runs.assign(engine="vllm"))


def test_compare_averages_seeds_before_the_error():
    rows = []
    for seed, (s, m) in enumerate(((1.0, 2.0), (3.0, 2.0))):
        rows.append({"workload": "w", "load": 1, "policy": "p", "seed": seed, "engine": "sim", "repeat": 0, "jct_mean": s})
        rows.append({"workload": "w", "load": 1, "policy": "p", "seed": seed, "engine": "sglang", "repeat": 0, "jct_mean": m})
    t = fc.compare(pd.DataFrame(rows), metrics=["jct_mean"])
    assert t.iloc[0].rel_err == pytest.approx(0.0)


def test_rank_agreement_ignores_close_pairs():
    # sim: fcfs 1.0 < topas 1.05 (tie, within 10%) < lpm 2.0; measured: topas < fcfs < lpm
    runs = _runs({"fcfs": 1.0, "topas": 1.05, "lpm": 2.0}, {"fcfs": [1.2], "topas": [1.1], "lpm": [2.2]})
    r = fc.rank_agreement(runs).iloc[0]
    assert r.pairs_checked == 2 and r.pairs_agree == 2 and r.agree
    assert r.sim_order == "fcfs < topas < lpm" and r.measured_order == "topas < fcfs < lpm"
    runs = _runs({"fcfs": 1.0, "lpm": 2.0}, {"fcfs": [2.0], "lpm": [1.0]})
    r = fc.rank_agreement(runs).iloc[0]
    assert not r.agree and r.disagree == "fcfs/lpm"


def test_task_pairs_match_by_task_and_average_repeats():
    sim = _result([1.0, 2.0, 3.0]).tasks
    m1, m2 = _result([2.0, 2.0]).tasks, _result([4.0, 2.0]).tasks
    p = fc.task_pairs(sim, [m1, m2]).set_index("task_id")
    assert list(p.index) == ["t0", "t1"]
    assert p.loc["t0", "measured_jct"] == 3.0 and p.loc["t0", "measured_min"] == 2.0 and p.loc["t0", "sim_jct"] == 1.0


def test_comparison_roundtrip_and_verdict(tmp_path):
    runs = _runs({"fcfs": 1.0, "lpm": 2.0}, {"fcfs": [1.0, 1.1], "lpm": [2.0, 2.1]})
    c = fc.build_comparison(runs, meta={"server": "http://x"})
    assert c.passed
    fc.write_comparison(c, tmp_path)
    back = fc.read_comparison(tmp_path)
    assert back.passed and back.meta["server"] == "http://x" and back.meta["bars"] == fc.BENCHMARK_BARS
    pd.testing.assert_frame_equal(back.table.drop(columns=["ok"]), c.table.drop(columns=["ok"]), check_dtype=False)
    text = (tmp_path / "comparison.md").read_text()
    assert "| w | 1 | fcfs | jct_mean |" in text and "fcfs < lpm" in text
    with pytest.raises(FileNotFoundError, match="no comparison"):
        fc.read_comparison(tmp_path / "none")


# ----------------------------------------------------------------------------- profile fitting
def test_fit_server_profile_recovers_coefficients():
    truth = dict(p=(0.02, 3e-5, 1e-8, 2e-9, 5e-9), d=(0.008, 4e-4, 2e-7))
    pre = [{"new": n, "cached": c, "seconds": truth["p"][0] + truth["p"][1] * n + truth["p"][2] * n * c
            + truth["p"][3] * n * n + truth["p"][4] * c * c}
           for n in (16, 128, 512, 1024, 2048) for c in (0, 256, 1024)]
    dec = [{"batch": b, "total_kv": t, "seconds": truth["d"][0] + truth["d"][1] * b + truth["d"][2] * t}
           for b in (1, 4, 16) for t in (100 * b, 1000 * b)]
    settings = server_settings({"max_total_num_tokens": 4096, "chunked_prefill_size": 2048, "version": "x",
                                "internal_states": [{"page_size": 1}]})
    prof = fit_server_profile("cpu-test", pre, dec, settings, 512.0, {"server_s": 0.05, "client_wall_s": 0.06})
    m = CostModel.from_profile_dict(json.loads(json.dumps(prof)))
    assert m.kv_budget_tokens == 4096 and m.max_prefill_tokens == 2048
    assert m.prefill_c0 == pytest.approx(0.02, rel=1e-3) and m.decode_c_kv == pytest.approx(2e-7, rel=1e-3)
    assert m.prefill_c_cached_sq == pytest.approx(5e-9, rel=1e-3)
    assert m.prefill_time([(16, 1024)]) == pytest.approx(
        0.02 + 3e-5 * 16 + 1e-8 * 16 * 1024 + 2e-9 * 256 + 5e-9 * 1024 ** 2, rel=1e-3)
    assert prof["fit_error"]["prefill"]["max_rel_err"] < 1e-4
    assert prof["overhead"]["request_s"] == pytest.approx(0.06 - (0.02 + 3e-5 + 2e-9), rel=1e-3)
    p2 = fit_server_profile("x", pre, dec, settings, 1.0, {"server_s": 0.05, "client_wall_s": 0.06, "prefill_iteration_s": 0.03})
    assert p2["overhead"]["request_s"] == pytest.approx(0.03)
    with pytest.raises(ValueError, match="need >= 4 prefill"):
        fit_server_profile("x", pre[:2], dec, settings, 1.0)


# ----------------------------------------------------------------------------- orchestration
def test_run_fidelity_against_a_simulated_server(tmp_path):
    """The 'server' is the simulator itself with a 10% slower profile: errors come out near -9%."""
    base = load_profile("a100-80gb_llama3-8b").with_budget(30000)
    slow = CostModel(**{**base.numeric_fields(), "name": "slow",
                        **{k: v * 1.1 for k, v in base.numeric_fields().items() if k.startswith(("prefill_c", "decode_c"))}})
    cost, config = sim_engine(base, settings={"kv_budget_tokens": 30000})
    assert not config.host_tier and cost.kv_budget_tokens == 30000
    _, slow_config = sim_engine(slow, settings={"kv_budget_tokens": 30000})

    def measure(p, rep):
        return simulate_point(p, slow, slow_config)[0]

    points = [Point("dag-4", pol, rate=0.02, seed=0, n_tasks=6) for pol in ("fcfs", "lpm")]
    c = run_fidelity(points, measure, base, tmp_path, repeats=2, settings={"kv_budget_tokens": 30000}, log=None)
    t = c.table.set_index(["policy", "metric"])
    for pol in ("fcfs", "lpm"):
        assert -0.1 < t.loc[(pol, "jct_mean"), "rel_err"] < -0.05
        assert t.loc[(pol, "cached_tokens"), "rel_err"] == 0
        assert t.loc[(pol, "jct_mean"), "measured_cv"] == 0
    assert len(c.runs) == 2 * 3 and len(c.tasks) == 2 * 6
    assert (tmp_path / "comparison.csv").is_file() and (tmp_path / "raw" / "sim").is_dir()
    assert fc.read_comparison(tmp_path).meta["kv_budget_tokens"] == 30000


def test_optional_cached_term_keeps_old_profiles_and_hashes():
    base = load_profile("a100-80gb_llama3-8b")
    assert base.prefill_c_cached_sq == 0 and "prefill_c_cached_sq" not in base.numeric_fields()
    with_term = CostModel(**{**base.numeric_fields(), "name": "x", "prefill_c_cached_sq": 1e-9})
    assert with_term.profile_hash != base.profile_hash
    assert with_term.prefill_time([(10, 1000), (5, 0), (0, 50)]) == pytest.approx(
        base.prefill_time([(10, 1000), (5, 0), (0, 50)]) + 1e-9 * 1000 ** 2)
    back = CostModel.from_profile_dict(with_term.to_profile_fields())
    assert back.prefill_c_cached_sq == 1e-9
    assert CostModel.from_profile_dict(base.to_profile_fields()).profile_hash == base.profile_hash


# ----------------------------------------------------------------------------- the SGLang engine model
def test_request_latency_adds_the_request_path_and_the_gate_completes_every_task():
    from topas.engine.config import EngineConfig
    from topas.engine.simulator import Simulator
    from topas.fidelity.run import point_trace
    from topas.policies.base import make_policy

    cost = load_profile("a100-80gb_llama3-8b").with_budget(20000)
    tr = point_trace(Point("chain-3", "fcfs", rate=0.01, seed=0, n_tasks=3))  # no overlap between tasks
    base = Simulator(tr, make_policy("fcfs"), cost, EngineConfig()).run()
    lat = Simulator(tr, make_policy("fcfs"), cost, EngineConfig(request_latency_s=0.01)).run()
    # three stages in a chain: 3 request paths per task (half in, full between stages, half out)
    assert (lat.tasks["jct"] - base.tasks["jct"]).to_numpy() == pytest.approx([0.03] * 3, abs=1e-9)
    # heavier traffic still completes every task under every policy, with the gate on
    tr = point_trace(Point("dag-4", "fcfs", rate=0.5, seed=0, n_tasks=20))
    for pol in ("fcfs", "lpm", "topas"):
        r = Simulator(tr, make_policy(pol), cost.with_budget(12000), EngineConfig(request_latency_s=0.005)).run()
        assert r.tasks["finish"].notna().all() and len(r.tasks) == 20


def test_busy_calibration_recovers_the_speed_of_a_slower_server(tmp_path):
    """A 'server' 25% slower than the profile, reporting its busy time: the calibrated simulation
    finds the factor and its JCTs match; the static one is ~20% fast."""
    from topas.fidelity.run import scale_cost

    base = load_profile("a100-80gb_llama3-8b").with_budget(30000)
    cost, config = sim_engine(base, settings={"kv_budget_tokens": 30000})
    slow = scale_cost(cost, 1.25)

    def measure(p, rep):
        r = simulate_point(p, slow, config)[0]
        r.summary["server_busy_s"] = r.summary["busy_time"]
        return r

    pts = [Point("chain-3", "fcfs", rate=0.05, seed=0, n_tasks=8)]
    c = run_fidelity(pts, measure, base, tmp_path, repeats=2, settings={"kv_budget_tokens": 30000}, log=None)
    t = c.table.set_index(["policy", "metric"])
    assert abs(t.loc[("fcfs", "jct_mean"), "rel_err"]) < 0.01
    cal = c.runs[c.runs["engine"] == "sim-calibrated"]
    assert cal["speed_factor"].to_numpy() == pytest.approx([1.25, 1.25], rel=0.01)
    s = c.table_static.set_index(["policy", "metric"])
    assert -0.25 < s.loc[("fcfs", "jct_mean"), "rel_err"] < -0.1
    assert c.meta["sim_engine"] == "sim-calibrated"


def test_run_metrics_separates_sglang_retractions_from_plugin_preemptions():
    r = _result([1.0, 2.0], retractions=3)
    r.requests["preemptions"] = [2, 0]
    assert fc.run_metrics(r)["retractions"] == 3 and fc.run_metrics(r)["preemptions"] == 2  # the simulator's
    r.summary["engine"] = "sglang"  # SGLang's num_retractions includes the plugin's preemptions
    m = fc.run_metrics(r)
    assert m["retractions"] == 1 and m["preemptions"] == 2


# ----------------------------------------------------------------------------- the server against itself
def test_ci90_and_self_error():
    assert fc.ci90_half_width([1.0, 1.0, 1.0]) == 0.0
    # mean 2, sd 1, n 3: t(0.95, 2 dof) = 2.920 -> 2.920 / sqrt(3) / 2
    assert fc.ci90_half_width([1.0, 2.0, 3.0]) == pytest.approx(2.920 / math.sqrt(3) / 2)
    assert math.isnan(fc.ci90_half_width([1.0])) and math.isnan(fc.ci90_half_width([float("nan"), 1.0]))
    # each run against the mean of the others: |1/2.5 - 1| = 0.6, |2/2 - 1| = 0, |3/1.5 - 1| = 1
    assert fc.self_error([1.0, 2.0, 3.0]) == pytest.approx(0.6)
    assert math.isnan(fc.self_error([2.0]))


def test_a_miss_inside_the_measured_noise_is_told_apart_from_one_beyond_it():
    # noisy: measured 1.2, 1.6, 2.0 (mean 1.6, 90% CI +-42%): sim 1.0 misses the 15% bar by noise
    # tight: measured 1.6, 1.6, 1.61: the same sim misses it beyond noise
    runs = _runs({"noisy": 1.0, "tight": 1.0}, {"noisy": [1.2, 1.6, 2.0], "tight": [1.6, 1.6, 1.61]})
    t = fc.compare(runs).set_index(["policy", "metric"])
    noisy, tight = t.loc[("noisy", "jct_mean")], t.loc[("tight", "jct_mean")]
    assert noisy.ok == False and noisy.within_noise == True
    assert noisy.measured_ci90 == pytest.approx(2.920 * 0.4 / math.sqrt(3) / 1.6)
    assert tight.ok == False and tight.within_noise == False
    s = fc.noise_summary(fc.compare(runs)).set_index("metric").loc["jct_mean"]
    assert (s.points, s.met, s.missed_within_noise, s.missed_beyond_noise) == (2, 0, 1, 1)
    assert s.self_err_over_bar == 1  # the noisy point's runs differ from each other by more than 15%


# ----------------------------------------------------------------------------- SGLang engine model: memory
def _sglang_sim(**kw):
    from topas.engine.config import EngineConfig
    from topas.engine.simulator import Simulator
    from topas.fidelity.run import point_trace
    from topas.policies.base import make_policy

    tr = point_trace(Point("chain-3", "fcfs", rate=0.01, seed=0, n_tasks=3))
    cost = load_profile("a100-80gb_llama3-8b").with_budget(20000)
    return Simulator(tr, make_policy(kw.pop("policy", "fcfs")), cost, EngineConfig(ignore_eos=True, **kw))


def test_sglang_reserves_a_new_requests_whole_output_and_ignore_eos_requests_keep_it():
    from topas.engine.entities import DECODE, WAITING

    sim = _sglang_sim()
    sim._admit_arrivals()  # the first task arrives at 0
    r = next(iter(sim.requests.values()))
    r.state, r.generated = WAITING, 0
    # add_one_req: max_new_tokens (with the first output token's slot, allocated at admission,
    # this is its strict extend_input_len + max_new_tokens < rem_total_tokens)
    batch = sim.batch  # (the running batch reserves, by its config and new_token_ratio)
    assert batch.reserve(r) == r.y
    r.state, r.generated = DECODE, 3
    assert batch.reserve(r) == r.y - 3  # ignore_eos: ratio 1 while running
    batch.config = replace(batch.config, ignore_eos=False)
    assert batch.reserve(r) == int(batch.new_token_ratio * (r.y - 3))  # the early-EOS estimate
    batch.config = replace(batch.config, full_output_reserve=False)
    r.state = WAITING
    assert batch.reserve(r) == int(batch.new_token_ratio * (r.y - 3))  # the ratio for admissions too
    # a stage's max_new_tokens, when the trace gives one, is what is reserved for
    r.max_new = r.y + 100
    batch.config = replace(batch.config, full_output_reserve=True)
    assert batch.reserve(r) == r.y + 100 - 3


def test_finished_kv_stays_cached_and_leaves_are_evicted_oldest_first():
    """Radix-cache LRU over leaves: an unreferenced prefix older than another agent's finished
    request is evicted first; a prefix with cached children is not a leaf."""
    sim = _sglang_sim()
    memory = sim.memory
    a, b, c = (memory.prefixes[x] for x in ("chain3.A", "chain3.B", "chain3.C"))
    for p, t in ((a, 1.0), (b, 3.0), (c, 0.5)):
        memory.load(p)
        p.prefill_left, p.last_used = 0, t
    sim.clock.now = 2.0
    # a finished request of C (time 2.0): C has a cached child, so C is not a leaf
    memory.cache_leaf("chain3.C", 1000, "t9/C")
    # pool: 3 x 4096 prefixes + 1000 cached = 13288; shrink the budget to need 1 token back
    memory.budget = 13287
    sim.eviction.settle()
    assert not a.resident and b.resident and c.resident  # A (1.0) is the oldest leaf; C is no leaf
    assert memory.evictable_tokens == 1000
    memory.budget = 4096 + 1000 - 1  # now C's child (2.0) goes, then C (0.5) is a leaf and the oldest
    sim.eviction.settle()
    assert memory.evictable_tokens == 0 and not c.resident and b.resident


def test_the_pool_stays_within_the_budget_with_finished_kv_cached():
    from topas.engine.config import EngineConfig
    from topas.engine.simulator import Simulator
    from topas.fidelity.run import point_trace
    from topas.policies.base import make_policy

    cost = load_profile("a100-80gb_llama3-8b").with_budget(12000)
    tr = point_trace(Point("dag-4", "fcfs", rate=0.5, seed=0, n_tasks=20))
    for pol in ("fcfs", "lpm", "topas"):
        sim = Simulator(tr, make_policy(pol), cost, EngineConfig(ignore_eos=True))
        worst = [0]
        settle = sim.eviction.settle

        def checked():
            settle()
            worst[0] = max(worst[0], sim.memory.overflow())

        sim.eviction.settle = checked
        r = sim.run()
        assert r.tasks["finish"].notna().all() and len(r.tasks) == 20, pol
        assert worst[0] <= 0, pol


def test_request_path_splits_a_measured_request_into_its_parts():
    req = pd.DataFrame({"ready": [0.0, 1.0], "server_received": [0.004, 1.002], "first_admit": [0.010, 1.102],
                        "server_finished": [0.210, 1.302], "finish": [0.213, 1.305]})
    p = fc.request_path(req)
    assert p["path_in"] == pytest.approx(0.003) and p["scheduler_queue"] == pytest.approx(0.053)
    assert p["server_time"] == pytest.approx(0.2) and p["path_out"] == pytest.approx(0.003)
    # without the server's timestamps (no --enable-metrics) the parts are unknown, not zero
    assert math.isnan(fc.request_path(req.drop(columns=["server_received", "server_finished"]))["path_in"])


def test_rank_disagreement_is_flagged_when_the_measurement_cannot_order_the_pair():
    # sim: lpm 20% better than fcfs; measured: a tie (1.50 vs 1.52) with repeats 1.2-1.9
    runs = _runs({"fcfs": 1.5, "lpm": 1.2}, {"fcfs": [1.3, 1.5, 1.7], "lpm": [1.2, 1.5, 1.86]})
    r = fc.rank_agreement(runs).iloc[0]
    assert not r.agree and r.disagree == "fcfs/lpm" and r.disagree_within_noise == 1
    # a clear measured reversal is not noise
    runs = _runs({"fcfs": 1.5, "lpm": 1.2}, {"fcfs": [1.0, 1.01, 1.0], "lpm": [2.0, 2.01, 2.0]})
    assert fc.rank_agreement(runs).iloc[0].disagree_within_noise == 0


def test_a_managing_policys_eviction_leaves_a_computed_prefix_cached_and_a_reload_free():
    sim = _sglang_sim(policy="topas")
    memory = sim.memory
    a, b = memory.prefixes["chain3.A"], memory.prefixes["chain3.B"]
    for p in (a, b):
        memory.load(p)
    a.prefill_left = 0  # A computed; B still being prefilled
    memory.evict(a)
    memory.evict(b)
    assert not a.resident and memory.evictable_tokens == a.tokens  # A: unpinned, still cached
    assert not b.resident and not memory.cached_unpinned("chain3.B")  # B: never complete, dropped
    sim.clock.now = 5.0
    memory.load(a)  # pinning it again: no prefill, and the next admission is a hit
    assert a.resident and a.prefill_left == 0 and memory.evictable_tokens == 0
    assert memory.prefix_events[-1][1:3] == ("chain3.A", "load_cached")
    memory.load(b)
    assert b.prefill_left == b.tokens  # recomputed


def test_resimulate_rebuilds_a_stored_comparison_from_its_measured_runs(tmp_path):
    # `scripts/fidelity_cpu.py --resimulate`: no server; the shipped CI comparison's measured side
    # is kept exactly, the simulated side is the current simulator's
    import shutil
    import sys

    from topas.fidelity.compare import read_comparison
    from topas.paths import REPO_ROOT

    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    import fidelity_cpu

    out = tmp_path / "ci"
    shutil.copytree(REPO_ROOT / "data/results/fidelity/cpu-tiny-llama-ci", out)
    before = read_comparison(out)
    rc = fidelity_cpu.main(["--ci", "--resimulate", "--out", str(out)])
    after = read_comparison(out)
    assert rc in (0, 3)
    measured = lambda c: c.runs[c.runs["engine"] == "sglang"].reset_index(drop=True)  # noqa: E731
    pd.testing.assert_frame_equal(measured(before), measured(after))
    assert set(after.runs["engine"]) == set(before.runs["engine"])
    assert "resimulated" in after.meta
