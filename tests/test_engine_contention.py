"""The engine where prefixes compete for the KV pool: stock SGLang 0.5.x's behaviours, each also
reachable as an EngineConfig switch (issue 12). Round-number costs (conftest.ROUND_COST)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import ROUND_COST as C
from conftest import stage, task, trace
from topas.engine.config import LEGACY_ENGINE, EngineConfig
from topas.engine.simulator import simulate
from topas.policies.fcfs import FCFS
from topas.workload.model import Stage


def _req(res):
    return res.requests.set_index("rid")


def _burst(n: int, prefix: int = 300, x: int = 50, y: int = 10):
    """``n`` single-stage tasks of agent A, all arriving at t = 0 (FCFS order t0, t1, ...)."""
    return trace({"A": prefix}, [task(f"t{i}", 0.0, stage("S", "A", x, y)) for i in range(n)])


def test_the_defaults_are_stock_sglang():
    c = EngineConfig()
    assert not c.host_tier and c.radix_cache and not c.prefill_prefix_sharing
    assert c.admission_gate and c.full_output_reserve and not c.ignore_eos and c.request_latency_s == 0


def test_requests_of_one_prefill_batch_each_compute_an_uncached_prefix():
    # Both fit with their own copy of the 300-token prefix (2 x 361 <= 800): SGLang matched none
    # of it for either, so both report 0 cached tokens and the second is charged the copy.
    res = simulate(_burst(2), FCFS(), C, EngineConfig(kv_budget=800))
    r = _req(res)
    assert list(r["cached_tokens"]) == [0, 0] and r["first_admit"].tolist() == [0.0, 0.0]
    # the copy is prefilled: the batch costs the prefix once plus (prefix + suffix) once more
    first_iteration = res.timeline["time"].iloc[0]
    assert first_iteration == pytest.approx(C.prefill_time([(300, 0), (50, 300), (350, 0)]))
    # the copy is freed when the prefix enters the tree: under the overlap scheduler, when the
    # batch's result is processed, one iteration after the prefill; without it, at the prefill's
    # end: both then hold their own 50 + 1 tokens only
    assert res.timeline["request_tokens"].iloc[0] == 2 * 51 + 300
    plain = simulate(_burst(2), FCFS(), C, EngineConfig(kv_budget=800, overlap_schedule=False))
    assert plain.timeline["request_tokens"].iloc[0] == 2 * 51
    shared = simulate(_burst(2), FCFS(), C, EngineConfig(kv_budget=800, prefill_prefix_sharing=True))
    assert shared.timeline["time"].iloc[0] == pytest.approx(C.prefill_time([(300, 0), (50, 300), (50, 300)]))


def test_the_copy_counts_in_the_admission_reservation_of_the_same_step():
    # 300 + 361 + 361 = 1022 > 772: the third request's copy does not fit beside the second's.
    res = simulate(_burst(3), FCFS(), C, EngineConfig(kv_budget=772))
    first = res.decisions.iloc[0]
    assert (first["n_proposed"], first["n_admitted"]) == (3, 2)
    r = _req(res)
    assert r.loc["t2/S", "cached_tokens"] == 300  # it ran later, on the cached prefix
    assert list(r["cached_tokens"][:2]) == [0, 0]


def test_an_admission_that_fails_while_nothing_decodes_reopens_after_that_prefill():
    # 700 holds one request with the prefix (361) but not a second with its own copy: the second
    # waits for the first's prefill only (SGLang replaces the empty running batch, and its
    # batch_is_full flag, with the prefill batch), not for the first to finish; then it hits.
    # (Without the overlap scheduler: with it, see the next test.)
    res = simulate(_burst(2), FCFS(), C, EngineConfig(kv_budget=700, overlap_schedule=False))
    r = _req(res)
    prefill_end = res.timeline["time"].iloc[0]
    assert r.loc["t1/S", "first_admit"] == pytest.approx(prefill_end)
    assert r.loc["t1/S", "first_admit"] < r.loc["t0/S", "finish"]
    assert r["cached_tokens"].tolist() == [0, 300]


def test_the_batch_scheduled_right_after_a_prefill_does_not_match_its_prefix():
    # SGLang's overlap scheduler schedules the next batch before it processes the prefill's result,
    # which is when the prefix enters the radix tree: so t1, tried again right after t0's prefill,
    # still needs its own copy, does not fit beside t0 (2 x 361 > 700) and the gate stays shut
    # until t0 leaves; then the prefix is cached and t1 hits.
    res = simulate(_burst(2), FCFS(), C, EngineConfig(kv_budget=700))
    r = _req(res)
    assert r.loc["t1/S", "first_admit"] == pytest.approx(r.loc["t0/S", "finish"])
    assert r["cached_tokens"].tolist() == [0, 300]
    # a batch scheduled later (here: after one decode step) matches it: with room for t1 beside t0
    # but t0 still prefilling when t1 arrives, t1 enters the batch right after t0's prefill and
    # computes its own copy; t2, arriving during t0's decoding, hits
    tr = trace({"A": 300}, [task("t0", 0.0, stage("S", "A", 50, 10)), task("t1", 0.001, stage("S", "A", 50, 10)),
                            task("t2", 0.06, stage("S", "A", 50, 10))])
    r = _req(simulate(tr, FCFS(), C, EngineConfig(kv_budget=2000)))
    assert r["cached_tokens"].tolist() == [0, 0, 300]
    r = _req(simulate(tr, FCFS(), C, EngineConfig(kv_budget=2000, overlap_schedule=False)))
    assert r["cached_tokens"].tolist() == [0, 300, 300]


def test_the_duplicate_copy_is_held_until_the_prefix_enters_the_tree():
    # t0 and t1 compute the prefix in one batch (2 x 361 = 722 <= 1000, each reserving its 61
    # tokens); t2 (another 361) does not fit then. Right after that prefill t1's copy is still held (SGLang frees it in
    # cache_unfinished_req, with the prefix's insertion, when the overlap scheduler processes the
    # batch's result), so t2 still does not fit and waits for a request to leave; then it hits.
    # Had the copy been freed at once (300 + 2 x 61 + 361 = 783), t2 would have fitted right after
    # the prefill and, the
    # prefix not yet in the tree, computed its own copy (the contention suite's burst cases).
    res = simulate(_burst(3), FCFS(), C, EngineConfig(kv_budget=1000))
    r = _req(res)
    assert r["cached_tokens"].tolist() == [0, 0, 300]
    assert r.loc["t2/S", "first_admit"] == pytest.approx(r.loc["t0/S", "finish"])
    # without the overlap scheduler the copy goes and the prefix is cached at the prefill's end
    r = _req(simulate(_burst(3), FCFS(), C, EngineConfig(kv_budget=1000, overlap_schedule=False)))
    assert r["cached_tokens"].tolist() == [0, 0, 300]
    assert r.loc["t2/S", "first_admit"] < r.loc["t0/S", "finish"]


def test_while_requests_decode_a_failed_admission_waits_for_a_request_to_leave():
    # t0 decodes; t1 (arriving at 0.5 s) does not fit beside t0's whole-output reservation
    # (ignore_eos: 550 - 151 - 199 < 51 + 200), so admission stays shut (no re-decision) until t0
    # finishes
    tr = trace({"A": 100}, [task("t0", 0.0, stage("S", "A", 50, 200)), task("t1", 0.5, stage("S", "A", 50, 200))])
    res = simulate(tr, FCFS(), C, EngineConfig(kv_budget=550, ignore_eos=True))
    r = _req(res)
    assert r.loc["t1/S", "first_admit"] == pytest.approx(r.loc["t0/S", "finish"])
    between = res.decisions[(res.decisions["time"] > 0.5) & (res.decisions["time"] < r.loc["t0/S", "finish"])]
    assert len(between) == 1  # the failed one; then the gate holds
    ungated = simulate(tr, FCFS(), C, EngineConfig(kv_budget=550, ignore_eos=True, admission_gate=False))
    assert len(ungated.decisions) > len(res.decisions)


def _lru_tie():
    # t0 (P) and t1 (R) run together and finish together: P and R are cached with the same last
    # use. At 10 s, t2 (a new agent Q) and t3 (P's) arrive, FCFS order t2, t3.
    return trace({"P": 300, "Q": 300, "R": 300}, [
        task("t0", 0.0, stage("S", "P", 50, 10)), task("t1", 0.0, stage("S", "R", 50, 10)),
        task("t2", 10.0, stage("S", "Q", 50, 10)), task("t3", 10.0, stage("S", "P", 50, 10))])


def test_evictions_happen_after_the_admission_walk_has_locked_every_admitted_prefix():
    res = simulate(_lru_tie(), FCFS(), C, EngineConfig(kv_budget=800))
    r = _req(res)
    assert r.loc["t3/S", "cached_tokens"] == 300  # P was kept for t3, R went
    ev = res.prefix_events[res.prefix_events["time"] >= 10.0]
    assert list(zip(ev["agent"], ev["event"])) == [("Q", "load_prefill"), ("R", "evict_free")]
    # evicting during the walk (the legacy reading), t2's room is made by P (the LRU tie's first
    # name), and t3 recomputes it
    eager = simulate(_lru_tie(), FCFS(), C, EngineConfig(kv_budget=800, radix_cache=False))
    assert _req(eager).loc["t3/S", "cached_tokens"] == 0


def test_without_a_host_tier_an_evicted_prefix_is_recomputed_and_with_one_swapped_back():
    tr = trace({"P": 600, "Q": 600}, [task(f"t{i}", 10.0 * i, stage("S", a, 100, 50)) for i, a in enumerate("PQP")])
    stock = simulate(tr, FCFS(), C, EngineConfig(kv_budget=1000))
    assert "load_swap" not in set(stock.prefix_events["event"])
    assert _req(stock)["cached_tokens"].tolist() == [0, 0, 0]
    hicache = simulate(tr, FCFS(), C, EngineConfig(kv_budget=1000, host_tier=True))
    assert list(hicache.prefix_events["event"]).count("load_swap") == 1
    assert _req(hicache)["cached_tokens"].tolist() == [0, 0, 600]  # a swap-in is not recomputed


def test_a_stage_max_new_tokens_is_what_admission_reserves():
    # output 10, but the client asks for up to 400: admission needs prefix + input + 400 + 1
    capped = trace({"A": 100}, [task("t0", 0.0, Stage("S", "A", 50, 10, (), max_new_tokens=400)),
                                task("t1", 0.0, Stage("S", "A", 50, 10, (), max_new_tokens=400))])
    plain = trace({"A": 100}, [task("t0", 0.0, stage("S", "A", 50, 10)), task("t1", 0.0, stage("S", "A", 50, 10))])
    cfg = EngineConfig(kv_budget=700)
    assert simulate(plain, FCFS(), C, cfg).decisions.iloc[0]["n_admitted"] == 2
    res = simulate(capped, FCFS(), C, cfg)
    assert res.decisions.iloc[0]["n_admitted"] == 1 and res.tasks["finish"].notna().all()
    assert (res.requests["output_tokens"] == 10).all()  # the output is still the true one


def test_the_legacy_engine_model_is_one_set_of_switches():
    cfg = replace(EngineConfig(), **LEGACY_ENGINE)
    assert cfg.host_tier and not cfg.radix_cache and cfg.prefill_prefix_sharing
    assert not cfg.admission_gate and not cfg.full_output_reserve
    res = simulate(_burst(3), FCFS(), C, replace(cfg, kv_budget=772))
    assert res.decisions.iloc[0]["n_admitted"] == 3  # the prefix shared while being computed
