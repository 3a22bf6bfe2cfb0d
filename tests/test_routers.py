"""Each router's rule, exactly, on hand-built cluster states (topas/cluster/routers, docs/cluster.md)."""

from __future__ import annotations

import random

import pytest

from topas.cluster.routers import RouterError, available_routers, make_router, router_class
from topas.cluster.routers.sglang_cache_aware import CacheAwareParams
from topas.cluster.state import EngineState, RouteRequest


def engines(*loads: int) -> list[EngineState]:
    return [EngineState(index=i, in_flight=n) for i, n in enumerate(loads)]


def req(rid: str, agent: str = "A", l: int = 100, x: int = 50, t: float = 0.0) -> RouteRequest:
    return RouteRequest(rid=rid, task_id=rid.split("/")[0], stage_id=rid.split("/")[-1], agent=agent,
                        prefix_tokens=l, input_tokens=x, time=t)


def fresh(name: str, n: int, seed: int = 0, **params):
    r = make_router(name, params)
    r.reset(n, seed)
    return r


# ----------------------------------------------------------------------------- registry


def test_registry_lists_the_routers_and_names_the_valid_ones_on_a_bad_name():
    assert {"round-robin", "least-load", "power-of-two", "sglang-cache-aware", "autellix-locality", "kairos",
            "topas", "prefixplace", "flowguard", "wasma"} <= set(available_routers())
    with pytest.raises(RouterError, match=r"unknown router 'nope'; valid routers: .*round-robin"):
        router_class("nope")


def test_router_parameters_are_checked_and_coerced_from_strings():
    r = make_router("sglang-cache-aware", {"cache_threshold": "0.5", "balance_abs_threshold": "8"})
    assert r.params.cache_threshold == 0.5 and r.params.balance_abs_threshold == 8
    with pytest.raises(RouterError, match=r"has no parameter 'beta'; valid parameters: .*cache_threshold"):
        make_router("sglang-cache-aware", {"beta": 1})
    with pytest.raises(RouterError, match=r"'balance_abs_threshold': 'many' is not a valid int"):
        make_router("sglang-cache-aware", {"balance_abs_threshold": "many"})
    with pytest.raises(RouterError, match=r"cache_threshold must be in \[0, 1\]"):
        make_router("sglang-cache-aware", {"cache_threshold": 2})
    with pytest.raises(RouterError, match=r"'round-robin' has no parameter 'x'; valid parameters: \(none\)"):
        make_router("round-robin", {"x": 1})


# ----------------------------------------------------------------------------- simple routers


def test_round_robin_cycles_through_the_engines_from_0_and_restarts_on_reset():
    r = fresh("round-robin", 3)
    assert [r.route(req(f"t{i}/A"), engines(9, 0, 0)) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    r.reset(3)
    assert r.route(req("u/A"), engines(0, 0, 0)) == 0


def test_least_load_picks_the_fewest_in_flight_ties_to_the_lowest_index():
    r = fresh("least-load", 4)
    assert r.route(req("t/A"), engines(3, 1, 2, 5)) == 1
    assert r.route(req("t/A"), engines(2, 1, 1, 5)) == 1
    assert r.route(req("t/A"), engines(0, 0, 0, 0)) == 0


def test_power_of_two_takes_the_less_loaded_of_two_seeded_draws():
    loads = (5, 0, 9, 3)
    r = fresh("power-of-two", 4, seed=7)
    rng = random.Random("power-of-two:7")  # the documented draw
    for i in range(50):
        a, b = rng.sample(range(4), 2)
        want = b if loads[b] < loads[a] else a
        assert r.route(req(f"t{i}/A"), engines(*loads)) == want
    # deterministic per seed; the heaviest engine is never chosen

    def picks(seed: int) -> list[int]:
        r = fresh("power-of-two", 4, seed=seed)
        return [r.route(req(f"t{i}/A"), engines(*loads)) for i in range(20)]

    assert picks(3) == picks(3) and picks(3) != picks(4)
    r = fresh("power-of-two", 4, seed=1)
    assert 2 not in {r.route(req(f"t{i}/A"), engines(*loads)) for i in range(100)}
    assert fresh("power-of-two", 1).route(req("t/A"), engines(4)) == 0


def test_power_of_two_ties_go_to_the_first_engine_drawn():
    r = fresh("power-of-two", 2, seed=0)
    rng = random.Random("power-of-two:0")
    for i in range(10):
        a, _ = rng.sample(range(2), 2)
        assert r.route(req(f"t{i}/A"), engines(4, 4)) == a


# ----------------------------------------------------------------------------- sglang-cache-aware


def test_cache_aware_defaults_are_sglang_router_0_3_2_cli_defaults():
    p = CacheAwareParams()
    assert (p.cache_threshold, p.balance_abs_threshold, p.balance_rel_threshold, p.eviction_interval_secs,
            p.max_tree_size) == (0.3, 64, 1.5, 60.0, 2**26)


def test_cache_aware_a_miss_goes_to_the_least_loaded_worker_first_on_ties():
    """sglang-router 0.3.2 (the default ``on_miss``): a miss goes to the least-loaded worker,
    whatever the trees' sizes; ties to the first worker."""
    r = fresh("sglang-cache-aware", 2)
    assert r.route(req("t1/A", l=500, x=50), engines(0, 0)) == 0
    # engine 0's tree is large and engine 1's empty, loads equal: still engine 0
    assert r.route(req("t2/B", agent="B", l=10, x=10), engines(0, 0)) == 0
    # engine 0 busier: engine 1 (the smaller tree too: both rules agree here)
    assert r.route(req("t3/C", agent="C", l=10, x=10), engines(1, 0)) == 1
    # engine 1 busier: engine 0 (the smallest-tree rule would say engine 1)
    assert r.route(req("t4/D", agent="D", l=10, x=10), engines(0, 3)) == 0
    assert fresh("sglang-cache-aware", 2, on_miss="smallest-tree").params.on_miss == "smallest-tree"
    with pytest.raises(RouterError, match="on_miss must be one of least-load, smallest-tree"):
        make_router("sglang-cache-aware", {"on_miss": "random"})


def test_cache_aware_cold_start_goes_to_the_smallest_tree_then_follows_the_prefix():
    r = fresh("sglang-cache-aware", 3, on_miss="smallest-tree")
    # empty trees: no match, smallest tree (all 0) -> lowest index
    assert r.route(req("t1/A", l=100, x=50), engines(0, 0, 0)) == 0
    assert r.trees[0].size == 150
    # same agent: match 100/150 > 0.3 -> the worker holding the prefix, although it is busier
    assert r.route(req("t2/A", l=100, x=50), engines(5, 0, 0)) == 0
    assert r.trees[0].size == 200  # the prefix is counted once, each input once
    # another agent: no match -> smallest tree (engine 1, then engine 2)
    assert r.route(req("t3/B", agent="B", l=10, x=10), engines(2, 0, 0)) == 1
    assert r.route(req("t4/C", agent="C", l=10, x=30), engines(2, 1, 0)) == 2


def test_cache_aware_match_rate_must_exceed_the_threshold():
    r = fresh("sglang-cache-aware", 2, on_miss="smallest-tree")
    assert r.route(req("t1/A", l=30, x=70), engines(0, 0)) == 0  # cold: engine 0
    # rate 30/100 = 0.3, not > 0.3: the smallest tree (engine 1, empty)
    assert r.route(req("t2/A", l=30, x=70), engines(0, 0)) == 1
    # rate 30/99 > 0.3: the holder of the prefix node (the lowest index of 0 and 1)
    assert r.route(req("t3/A", l=30, x=69), engines(0, 0)) == 0


def test_cache_aware_imbalance_needs_both_thresholds_and_goes_to_the_least_loaded():
    r = fresh("sglang-cache-aware", 2)
    r.route(req("t0/A"), engines(0, 0))  # engine 0 holds A's prefix
    # 70 - 0 > 64 and 70 > 1.5 * 0: imbalanced -> least loaded, despite the match
    assert r.route(req("t1/A"), engines(70, 0)) == 1
    assert "A" in r.trees[1].prefixes  # the tree is updated in the imbalanced branch too
    # difference 60 <= 64: balanced -> the prefix holder
    assert r.route(req("t2/A"), engines(100, 40)) == 0
    # difference 65 > 64 but 200 <= 1.5 * 135: balanced
    assert r.route(req("t3/A"), engines(200, 135)) == 0
    # difference 65 and 200 > 1.5 * 130 = 195: imbalanced
    assert r.route(req("t4/A"), engines(200, 130)) == 1


def test_cache_aware_evicts_lru_leaves_per_worker_every_interval():
    r = fresh("sglang-cache-aware", 2, max_tree_size=120, eviction_interval_secs=10, on_miss="smallest-tree")
    r.route(req("t1/A", l=100, x=50, t=0.0), engines(0, 0))
    r.route(req("t2/A", l=100, x=40, t=1.0), engines(0, 0))
    assert r.trees[0].size == 190  # over the limit, but no round has run yet
    r.route(req("t3/B", agent="B", l=10, x=5, t=5.0), engines(0, 0))  # -> engine 1 (smaller tree)
    assert r.trees[0].size == 190
    # the round at t=10 runs before this request: t1's input (the oldest leaf) goes, then t2's:
    # 190 -> 140 -> 100 <= 120, so the prefix node stays
    r.route(req("t4/C", agent="C", l=1, x=1, t=12.0), engines(0, 0))
    assert set(r.trees[0].leaves) == set() and "A" in r.trees[0].prefixes and r.trees[0].size == 100
    # a prefix node is evicted once its inputs are gone and the tree is still too big
    r2 = fresh("sglang-cache-aware", 1, max_tree_size=0, eviction_interval_secs=10)
    r2.route(req("t1/A", t=0.0), engines(0))
    r2.route(req("t2/B", agent="B", t=20.0), engines(0))
    assert r2.trees[0].prefixes.keys() == {"B"} and r2.trees[0].size == 150


# ----------------------------------------------------------------------------- autellix-locality


def test_autellix_short_requests_go_to_the_least_used_engine_long_ones_stay_with_their_program():
    r = fresh("autellix-locality", 3)
    assert r.params.long_prefill_tokens == 2048  # the paper's threshold
    # short (1500 + 548 = 2048 <= 2048): least used
    assert r.route(req("t1/A", l=1500, x=548), engines(2, 1, 3)) == 1
    assert r.program_engine == {}  # a short request does not set the program's engine
    # long (2049): the program has no engine yet -> least used, remembered
    assert r.route(req("t1/B", l=1500, x=549), engines(2, 5, 0)) == 2
    # the program's next long request goes there, however loaded; another program's does not
    assert r.route(req("t1/C", l=3000, x=10), engines(0, 0, 9)) == 2
    assert r.route(req("t2/A", l=3000, x=10), engines(0, 0, 9)) == 0
    # its short requests still go to the least used
    assert r.route(req("t1/D", l=100, x=10), engines(4, 0, 9)) == 1
    r = fresh("autellix-locality", 2, long_prefill_tokens=100)
    assert r.route(req("t1/A", l=100, x=1), engines(3, 2)) == 1 and r.program_engine == {"t1": 1}


# ----------------------------------------------------------------------------- kairos

from conftest import ROUND_COST  # noqa: E402
from topas.cluster.routers.kairos import _Entry  # noqa: E402
from topas.cluster.state import ClusterInfo  # noqa: E402
from topas.engine.view import StageView, TaskView  # noqa: E402


def kairos(n: int, budgets=None, **params):
    info = ClusterInfo(prefix_tokens={"A": 100, "B": 100, "C": 100}, output_priors={"A": 20.0, "B": 20.0, "C": 20.0},
                       costs=[ROUND_COST] * n)
    r = make_router("kairos", params)
    r.reset(n, 0, info)
    return r


def kv_engines(*budgets: int) -> list[EngineState]:
    return [EngineState(index=i, in_flight=0, kv_budget=b) for i, b in enumerate(budgets)]


def chain(tid: str) -> TaskView:
    stages = {"A": StageView("A", "A", 10, (), ("B",)), "B": StageView("B", "B", 10, ("A",), ("C",)),
              "C": StageView("C", "C", 10, ("B",), ())}
    return TaskView(tid, 0.0, "chain", stages, ("A", "B", "C"), frozenset(), {})


def test_kairos_projects_kv_per_time_slot_with_the_prefix_once_per_engine():
    r = kairos(1, slot_s=1.0)
    r.ledger[0]["old"] = _Entry("A", 100, 10, 20.0, 0.0, 4.0)
    new = _Entry("A", 100, 5, 10.0, 0.0, 2.0)
    # slots [0,1): 10+20*.25 + 5+10*.5 = 25; [1,2): 20 + 15 = 35; [2,3): 25; [3,4): 30 (+100 prefix)
    assert r.projected_peak(0, new, 0.0) == pytest.approx(135.0)
    other = _Entry("B", 100, 5, 10.0, 0.0, 2.0)  # another agent: its prefix counts too
    assert r.projected_peak(0, other, 0.0) == pytest.approx(235.0)
    # a request past its expected end still counts, in full, in the current slot
    assert r.projected_peak(0, _Entry("A", 100, 0, 0.0, 9.0, 0.5), 9.0) == pytest.approx(130.0)


def test_kairos_places_on_the_engine_a_scan_of_every_projected_peak_picks():
    """``place`` skips engines whose first slot already loses: the same engine as the scan of
    every engine's peak (feasible, smallest, ties to the lowest index), on random ledgers."""
    rng = random.Random(7)
    for trial in range(200):
        n = rng.randrange(1, 7)
        r = kairos(n, slot_s=rng.choice([1.0, 0.37, 2.5]))
        now = rng.choice([0.0, 3.3, 1e4 + 0.1])
        for i in range(n):
            for k in range(rng.choice([0, 0, 1, 3, 6])):  # a few sent "later" (another engine's clock)
                r.ledger[i][f"r{i}.{k}"] = _Entry(rng.choice("ABC"), 100, rng.randrange(0, 50), rng.uniform(0, 40),
                                                  now + rng.uniform(-15, 2), rng.choice([0.0, rng.uniform(0.1, 12)]))
        if trial % 4 == 0 and n > 1:  # identical ledgers: ties go to the lowest index
            r.ledger[n - 1] = dict(r.ledger[0])
        eng = kv_engines(*(rng.choice([150, 300, 10**6]) for _ in range(n)))
        req = RouteRequest("t/A", "t", "A", rng.choice("ABC"), 100, rng.randrange(0, 50), now)
        scan = None
        for e in eng:
            peak = r.projected_peak(e.index, r._entry(req, e.index, now), now)
            if (peak <= e.kv_budget or not r.ledger[e.index]) and (scan is None or peak < scan[0]):
                scan = (peak, e.index)
        assert r.place(req, eng, now) == (None if scan is None else scan[1])


def test_kairos_orders_its_queue_by_remaining_workflow_time():
    r = kairos(1)
    d = r.duration("A", 10, 0)
    assert d == pytest.approx(ROUND_COST.prefill_time([(10, 100)]) + 20 * ROUND_COST.decode_time(8, 8 * (100 + 10 + 10)))
    first = RouteRequest("t1/A", "t1", "A", "A", 100, 10, 0.0, task=chain("t1"))  # three stages left
    last = RouteRequest("t2/C", "t2", "C", "C", 100, 10, 1.0, task=chain("t2"))  # one stage left
    assert r.priority(first) == pytest.approx(3 * d) and r.priority(last) == pytest.approx(d)
    assert r.route(first, kv_engines(10**6)) is None and r.route(last, kv_engines(10**6)) is None
    assert r.dispatch(kv_engines(10**6), 1.0) == [("t2/C", 0), ("t1/A", 0)]


def test_kairos_sends_to_the_smallest_projected_peak_and_blocks_when_the_head_fits_nowhere():
    r = kairos(2)
    eng = kv_engines(1100, 1100)
    r.route(req("t1/A", l=100, x=10), eng)
    assert r.dispatch(eng, 0.0) == [("t1/A", 0)]  # equal peaks: lowest index
    r.route(req("t2/A", l=100, x=10), eng)
    assert r.dispatch(eng, 0.0) == [("t2/A", 1)]  # engine 0 now projects more
    # the head (a last stage, with a big input: 100 + 900 + 20) fits beside neither running request;
    # the first stage behind it would fit, but waits (head-of-line blocking)
    r.route(RouteRequest("t3/C", "t3", "C", "C", 100, 900, 0.0, task=chain("t3")), eng)
    r.route(RouteRequest("t4/A", "t4", "A", "A", 100, 1, 0.5, task=chain("t4")), eng)
    assert r.dispatch(eng, 0.5) == []
    r.on_finish("t1/A", 0, 1.0)  # engine 0 empties: the head fits there, the other beside t2
    assert r.dispatch(eng, 1.0) == [("t3/C", 0), ("t4/A", 1)]


def test_kairos_an_idle_engine_takes_the_head_whatever_its_projection():
    r = kairos(2)
    r.route(req("t1/A", l=100, x=5000), kv_engines(1000, 1000))  # projected far above the budget
    assert r.dispatch(kv_engines(1000, 1000), 0.0) == [("t1/A", 0)]
    r.route(req("t2/A", l=100, x=5000), kv_engines(1000, 1000))
    assert r.dispatch(kv_engines(1000, 1000), 0.0) == [("t2/A", 1)]
    r.route(req("t3/A", l=100, x=5000), kv_engines(1000, 1000))
    assert r.dispatch(kv_engines(1000, 1000), 0.0) == []  # both busy: it waits


def test_kairos_needs_the_cluster_profile():
    with pytest.raises(RouterError, match="needs the agents' profile"):
        make_router("kairos").reset(2, 0, None)


# ----------------------------------------------------------------------------- topas (ours)


def topas_router(n: int, **params):
    info = ClusterInfo(prefix_tokens={"A": 1000, "B": 1000}, output_priors={"A": 50.0, "B": 50.0},
                       costs=[ROUND_COST] * n)
    r = make_router("topas", params)
    r.reset(n, 0, info)
    return r


def test_topas_router_score_is_the_documented_sum():
    r = topas_router(1)
    c = ROUND_COST
    e = EngineState(index=0, in_flight=5, waiting=2, running=3, kv_budget=10**5, kv_used=4000, resident=frozenset())
    q = req("t/A", l=1000, x=200)
    step = c.decode_time(4, 4000 + 1200)
    own = c.prefill_time([(200, 1000)]) + 50 * step
    want = (2 / 4) * own + c.prefill_time([(1000, 0)]) + own + 2.0 * 3 * 50 * (step - c.decode_time(3, 4000))
    assert r.score(q, e, 1) == pytest.approx(want - 3 * 50 * (step - c.decode_time(3, 4000)))  # beta = 1
    r2 = topas_router(1, beta=2.0)
    assert r2.score(q, e, 1) == pytest.approx(want)
    resident = EngineState(index=0, in_flight=5, waiting=2, running=3, kv_budget=10**5, kv_used=4000,
                           resident=frozenset({"A"}))
    assert r.score(q, e, 1) - r.score(q, resident, 1) == pytest.approx(c.prefill_time([(1000, 0)]))
    slow = 3 * 50 * (step - c.decode_time(3, 4000))
    assert r.score(q, e, 3) == pytest.approx(3 * (r.score(q, e, 1) - slow) + slow)  # w_r weighs the own time only


def test_topas_router_follows_the_prefix_unless_the_wait_there_costs_more_than_a_recompute():
    r = topas_router(2)
    holder = EngineState(index=0, in_flight=1, waiting=0, running=1, kv_budget=10**5, kv_used=1300,
                         resident=frozenset({"A"}))
    empty = EngineState(index=1, in_flight=0, waiting=0, running=0, kv_budget=10**5, kv_used=0)
    # a 3000-token prefix: its recompute (1.21 s) costs more than decoding beside one request
    assert r.route(req("t/A", l=3000, x=200), [holder, empty]) == 0
    # a 1000-token prefix: its recompute (0.21 s) costs less than the slower batch there (0.115 s
    # more of its own decode, 0.11 s more for the running request)
    assert r.route(req("t/A", l=1000, x=200), [holder, empty]) == 1
    assert topas_router(2, beta=0.0).route(req("t/A", l=1000, x=200), [holder, empty]) == 0  # batch ignored
    busy = EngineState(index=0, in_flight=30, waiting=20, running=10, kv_budget=10**5, kv_used=20000,
                       resident=frozenset({"A"}))
    assert r.route(req("t/A", l=3000, x=200), [busy, empty]) == 1  # the queue there costs more
    assert r.route(req("t/B", agent="B", l=1000, x=200), [holder, empty]) == 1  # nobody holds B: the idle one
    twin = EngineState(index=1, in_flight=0, waiting=0, running=0, kv_budget=10**5, kv_used=0)
    assert r.route(req("t/B", agent="B"), [twin, empty]) == 0  # a tie: the lowest index


def test_topas_router_weight_is_the_remaining_path_in_stages():
    assert make_router("topas").weight(RouteRequest("t/A", "t", "A", "A", 1, 1, 0.0, task=chain("t"))) == 3
    assert make_router("topas").weight(RouteRequest("t/C", "t", "C", "C", 1, 1, 0.0, task=chain("t"))) == 1
    assert make_router("topas").weight(req("t/A")) == 1


# ----------------------------------------------------------------------------- flowguard (from the abstract)


def profiled(name: str, n: int, **params):
    """A router of ``name`` on ``n`` ROUND_COST engines; agents A, B, C, D: prefix 100, prior 20."""
    info = ClusterInfo(prefix_tokens={a: 100 for a in "ABCD"}, output_priors={a: 20.0 for a in "ABCD"},
                       costs=[ROUND_COST] * n)
    r = make_router(name, params)
    r.reset(n, 0, info)
    return r


def on(rid: str, tv: TaskView, t: float = 0.0, x: int = 10) -> RouteRequest:
    tid, sid = rid.split("/")
    return RouteRequest(rid, tid, sid, tv.stages[sid].agent, 100, x, t, task=tv)


def room(*states: tuple[int, int, int, int, frozenset], budget: int = 1000) -> list[EngineState]:
    """Engines from (in_flight, waiting, running, kv_used, resident)."""
    return [EngineState(index=i, in_flight=f, waiting=w, running=r, kv_budget=budget, kv_used=kv, resident=res)
            for i, (f, w, r, kv, res) in enumerate(states)]


IDLE = (0, 0, 0, 0, frozenset())


def test_flowguard_deadline_is_a_multiple_of_the_critical_path_and_late_requests_go_last():
    r = profiled("flowguard", 1, deadline_factor=2.0)
    d = expected_duration(r.info, "A", 10, 0, 8)  # every stage: x = 10, prior 20
    first, last = on("t1/A", chain("t1"), t=0.0), on("t2/C", chain("t2"), t=1.0)
    r.route(first, room(IDLE))
    r.route(last, room(IDLE))
    assert r.deadline(first) == pytest.approx(0.0 + 2.0 * 3 * d)  # arrival 0 + 2 x (3 stages)
    assert r.slack("t1/A", 0.0) == pytest.approx(6 * d - 3 * d)  # d_i - t - R_v
    assert r.slack("t2/C", 0.0) == pytest.approx(6 * d - d)
    assert r.order(0.0) == ["t1/A", "t2/C"]  # least slack first
    assert r.order(4 * d) == ["t2/C", "t1/A"]  # t1/A cannot make it any more: deprioritised
    assert r.dispatch(room(IDLE), 4 * d) == [("t2/C", 0), ("t1/A", 0)]  # both fit (max_queue 2)


def test_flowguard_weighs_kv_pressure_and_queue_depth():
    q = on("t/A", chain("t"))  # needs x + prior = 30 tokens, + the 100 prefix where A is not resident
    busy_kv = (1, 0, 1, 500, frozenset())
    queued = (1, 1, 0, 0, frozenset({"A"}))
    r = profiled("flowguard", 2)
    assert r.score(q, room(busy_kv, queued)[0]) == pytest.approx((500 + 130) / 1000)
    assert r.score(q, room(busy_kv, queued)[1]) == pytest.approx(30 / 1000 + 0.1 * 1)
    r.route(q, room(busy_kv, queued))
    assert r.dispatch(room(busy_kv, queued), 0.0) == [("t/A", 1)]
    r = profiled("flowguard", 2, queue_weight=1.0)  # the queue now weighs more than the KV
    r.route(q, room(busy_kv, queued))
    assert r.dispatch(room(busy_kv, queued), 0.0) == [("t/A", 0)]
    r = profiled("flowguard", 2, max_queue=1)  # engine 1's queue is full: engine 0 takes it
    r.route(q, room(busy_kv, queued))
    assert r.dispatch(room(busy_kv, queued), 0.0) == [("t/A", 0)]


def test_flowguard_blocks_the_head_when_no_engine_has_kv_and_an_idle_engine_always_takes_it():
    r = profiled("flowguard", 1)
    full = (1, 0, 1, 900, frozenset())
    r.route(on("t1/A", chain("t1"), x=500), room(full))  # the most urgent: 900 + 500 + 20 + 100 > 1000
    r.route(on("t2/C", chain("t2"), x=1), room(full))  # would fit (900 + 121), but waits behind it
    assert r.dispatch(room(full), 0.0) == []
    assert r.dispatch(room((0, 0, 0, 900, frozenset())), 0.0) == [("t1/A", 0)]  # idle: takes the head, then full
    r = profiled("flowguard", 2, max_queue=1)
    r.route(on("t1/A", chain("t1")), room(IDLE, IDLE))
    r.route(on("t2/A", chain("t2")), room(IDLE, IDLE))
    r.route(on("t3/A", chain("t3")), room(IDLE, IDLE))
    # what it sent in this dispatch counts: one per engine, the third waits
    assert r.dispatch(room(IDLE, IDLE), 0.0) == [("t1/A", 0), ("t2/A", 1)]


# ----------------------------------------------------------------------------- wasma (from the abstract)


def diamond(tid: str, done=(), outputs=None) -> TaskView:
    stages = {"A": StageView("A", "A", 10, (), ("B", "C")), "B": StageView("B", "B", 10, ("A",), ("D",)),
              "C": StageView("C", "C", 10, ("A",), ("D",)), "D": StageView("D", "D", 10, ("B", "C"), ())}
    return TaskView(tid, 0.0, "dag", stages, ("A", "B", "C", "D"), frozenset(done), outputs or {})


def test_wasma_sends_older_workflows_first_and_inside_one_the_request_with_most_dependents():
    r = profiled("wasma", 1, max_queue=10, batch_size=1)
    for q in (on("t1/D", diamond("t1"), t=0.0), on("t2/B", diamond("t2"), t=1.0), on("t3/A", diamond("t3"), t=2.0)):
        assert r.route(q, room(IDLE)) is None
    assert r.dispatch(room(IDLE), 2.0) == [("t3/A", 0), ("t2/B", 0), ("t1/D", 0)]  # same arrival: 3, 1, 0 dependents
    old, new = diamond("old"), diamond("new")
    new = TaskView("new", 5.0, new.workflow, new.stages, new.topo_order, new.done, {})
    r.route(on("new/A", new, t=5.0), room(IDLE))
    r.route(on("old/D", old, t=6.0), room(IDLE))
    assert r.dispatch(room(IDLE), 6.0) == [("old/D", 0), ("new/A", 0)]  # the older workflow first


def test_wasma_batches_a_joins_parents_before_the_agents_other_requests():
    r = profiled("wasma", 2, batch_size=2, max_queue=1)
    t = diamond("t", done=("A",))
    r.route(on("t/B", t, t=1.0), room(IDLE, IDLE))
    r.route(on("u/B", diamond("u", done=("A",)), t=1.0), room(IDLE, IDLE))
    r.route(on("t/C", t, t=2.0), room(IDLE, IDLE))
    order = sorted(r.pending, key=r.keys.__getitem__)
    assert order == ["t/B", "u/B", "t/C"] and r.batch(r.pending["t/B"], order) == ["t/B", "t/C"]
    # t/B and its co-parent t/C (D waits for both) go together; u/B, the agent's, is the next batch
    assert r.dispatch(room(IDLE, IDLE), 2.0) == [("t/B", 0), ("t/C", 0), ("u/B", 1)]


def test_wasma_releases_one_agents_requests_together_and_a_batch_counts_once_in_the_queue():
    r = profiled("wasma", 2, batch_size=2, max_queue=1)
    for i, sid in enumerate(["A", "B", "A", "A"]):
        r.route(on(f"t{i}/{sid}", diamond(f"t{i}"), t=float(i)), room(IDLE, IDLE))
    # order: t0/A, t2/A, t3/A (3 dependents each, by ready time), then t1/B (1)
    sends = r.dispatch(room(IDLE, IDLE), 3.0)
    assert sends[:2] == [("t0/A", 0), ("t2/A", 0)]  # the first batch: two A requests to one engine
    assert sends[2] == ("t3/A", 1)  # engine 0 has no room now: the next batch (t3/A alone) goes to 1
    assert len(sends) == 3  # then no engine has room: t1/B waits


def test_wasma_score_is_reuse_plus_transfer_plus_load():
    r = profiled("wasma", 2)
    c = ROUND_COST
    r.ran_on["t/A"] = 1  # the parent ran on engine 1 and wrote 500 tokens
    q = on("t/B", diamond("t", done=("A",), outputs={"A": 500}))
    d = expected_duration(r.info, "B", 10, 0, 8)
    e0 = EngineState(index=0, in_flight=3, kv_budget=1000, resident=frozenset({"B"}))
    e1 = EngineState(index=1, in_flight=1, kv_budget=1000)
    assert r.score(q, e0) == pytest.approx(0.0 + c.swap_time(500) + 3 / 8 * d)
    assert r.score(q, e1) == pytest.approx(c.prefill_time([(100, 0)]) + 0.0 + 1 / 8 * d)
    assert r.score(q, e0, sent=2) == pytest.approx(r.score(q, e0) + 2 / 8 * d)
    r.route(q, [e0, e1])
    best = min((0, 1), key=lambda i: (r.score(q, [e0, e1][i]), i))
    assert r.dispatch([e0, e1], 0.0) == [("t/B", best)]


# ----------------------------------------------------------------------------- prefixplace (from the summary)


from topas.cluster.routers.prefixplace import PlacementProblem  # noqa: E402
from topas.cluster.routers.profile import expected_duration  # noqa: E402


def problem(demand, budget=(10_000, 10_000), work=2.0, recompute=0.5, prefix=100) -> PlacementProblem:
    n = len(budget)
    return PlacementProblem(demand=demand, work={a: [work] * n for a in demand},
                            recompute={a: [recompute] * n for a in demand}, prefix={a: prefix for a in demand},
                            budget=list(budget), ref_batch=8, u_max=0.95)


def test_prefixplace_cost_is_the_documented_sum():
    p = problem({"A": 1.0, "B": 0.5})
    m0, m1 = 1.0 * 2 + 0.25 * (2 + 0.5), 0.25 * (2 + 0.5)  # A placed on 0; B unplaced: spread, pays R
    assert p.cost({"A": frozenset({0})}) == pytest.approx(m0 / (1 - m0 / 8) + m1 / (1 - m1 / 8))
    both = {"A": frozenset({0, 1}), "B": frozenset({1})}
    m0, m1 = 0.5 * 2, 0.5 * 2 + 0.5 * 2
    assert p.cost(both) == pytest.approx(m0 / (1 - m0 / 8) + m1 / (1 - m1 / 8))
    hot = problem({"A": 100.0})  # u = 25, far past saturation: the factor's tangent at u = 0.95
    assert hot.cost({"A": frozenset({0})}) == pytest.approx(200 * (1 / 0.05 + (25 - 0.95) / 0.05 ** 2))
    assert hot.cost({"A": frozenset({0, 1})}) < hot.cost({"A": frozenset({0})})  # splitting still pays


def test_prefixplace_greedy_covers_every_agent_then_adds_copies_that_lower_the_cost():
    # one agent, room for every copy: a copy on every engine (splitting its load lowers the cost)
    assert problem({"A": 1.0}, budget=(100, 100, 100)).greedy() == {"A": frozenset({0, 1, 2})}
    # two agents: A (most demanded) on engine 0 (a tie: the lowest index), B where it costs least
    # (engine 1); a second copy of A on 1 would cost exactly as much (M = (1, 2) vs (2, 1)): none
    assert problem({"A": 1.0, "B": 0.5}).greedy() == {"A": frozenset({0}), "B": frozenset({1})}
    # one prefix per engine: the most demanded agent first, each where it costs least
    tight = problem({"A": 0.5, "B": 1.0}, budget=(100, 100))
    assert tight.greedy() == {"B": frozenset({0}), "A": frozenset({1})}
    # no demand, no copy; an agent whose prefix fits nowhere stays unplaced
    assert problem({"A": 0.0}).greedy() == {}
    assert problem({"A": 1.0}, budget=(50, 50)).greedy() == {}


def test_prefixplace_refinement_moves_drops_or_swaps_while_the_cost_falls():
    p = problem({"A": 1.0, "B": 1.0}, budget=(200, 200), recompute=10.0)  # dropping never pays
    crowded = {"A": frozenset({0}), "B": frozenset({0})}
    assert p.refine(crowded, passes=1) == {"A": frozenset({1}), "B": frozenset({0})}  # A's copy moves first
    assert p.cost(p.refine(crowded, 1)) < p.cost(crowded)
    assert p.refine(crowded, passes=0) == crowded
    # free recompute: spreading an agent over every engine beats any copy; drops come first
    free = problem({"A": 1.0, "B": 1.0}, budget=(200, 200), recompute=0.0)
    assert free.refine(crowded, passes=1) == {}
    swap = problem({"A": 1.0, "B": 1.0}, budget=(100, 100), recompute=10.0)
    swap = PlacementProblem(demand=swap.demand, work={"A": [2.0, 8.0], "B": [8.0, 2.0]}, recompute=swap.recompute,
                            prefix=swap.prefix, budget=swap.budget, ref_batch=8, u_max=0.95)
    # each agent sits on the engine where it runs slowly; full budgets: only a swap helps
    assert swap.refine({"A": frozenset({1}), "B": frozenset({0})}, passes=1) == \
        {"A": frozenset({0}), "B": frozenset({1})}


def test_prefixplace_plans_per_epoch_adopts_only_when_the_saving_beats_the_switch_and_follows_the_prefix():
    info = ClusterInfo(prefix_tokens={"A": 100, "B": 100}, output_priors={"A": 20.0, "B": 20.0},
                       costs=[ROUND_COST] * 3)
    eng = kv_engines(10_000, 10_000, 10_000)
    r = make_router("prefixplace", {"epoch_s": 10.0})
    r.reset(3, 0, info)
    for i in range(20):  # the first epoch: nothing placed, least load
        assert r.route(req(f"t{i}/A", t=i / 2), eng) == 0
    assert r.placement == {} and r.history == []
    r.route(req("u/B", agent="B", t=10.0), eng)  # closes the epoch: A at 2 requests/s, B none
    assert r.demand == {"A": 2.0, "B": 0.0}
    (when, adopted, c_old, c_new, switch, placement), = r.history
    assert when == 10.0 and r.epoch_end == 20.0
    assert adopted and r.placement == placement == {"A": frozenset({0, 1, 2})}
    assert switch == pytest.approx(3 * ROUND_COST.prefill_time([(100, 0)]))
    assert (c_old - c_new) * 10.0 > switch
    loads = [EngineState(index=i, in_flight=n, kv_budget=10_000) for i, n in enumerate((4, 1, 2))]
    assert r.route(req("v/A", t=11.0), loads) == 1  # the least-loaded holder
    # a switch this expensive is never worth it: nothing is adopted
    r2 = make_router("prefixplace", {"epoch_s": 10.0, "switch_weight": 1e9})
    r2.reset(3, 0, info)
    for i in range(20):
        r2.route(req(f"t{i}/A", t=i / 2), eng)
    r2.route(req("u/B", agent="B", t=35.0), eng)  # closes three epochs at once: two of them empty
    assert r2.demand["A"] == pytest.approx(2.0 * 0.5 ** 2)  # measured 2/s, then two empty epochs
    assert len(r2.history) == 1 and r2.history[0][1] is False and r2.placement == {}
    assert r2.epoch_end == 40.0


def test_prefixplace_budget_is_a_share_of_each_engines_kv():
    info = ClusterInfo(prefix_tokens={"A": 600}, output_priors={"A": 20.0}, costs=[ROUND_COST] * 2)
    r = make_router("prefixplace", {"prefix_fraction": 0.5})
    r.reset(2, 0, info)
    r.demand = {"A": 1.0}
    r.input_sum, r.input_n = {"A": 50}, {"A": 1}
    prob = r.problem(kv_engines(1000, 2000))
    assert prob.budget == [500.0, 1000.0]
    assert prob.greedy() == {"A": frozenset({1})}  # 600 tokens fit only the larger engine's half
    assert prob.work["A"][0] == pytest.approx(expected_duration(info, "A", 50, 0, 8))
    assert prob.recompute["A"] == [ROUND_COST.prefill_time([(600, 0)])] * 2


@pytest.mark.parametrize("name", ["flowguard", "wasma", "prefixplace"])
def test_routers_from_abstracts_or_summaries_need_the_cluster_profile_and_say_their_source(name):
    with pytest.raises(RouterError, match="needs the agents' profile"):
        make_router(name).reset(2, 0, None)
    import sys

    doc = sys.modules[router_class(name).__module__].__doc__.splitlines()[0]
    assert ("(from the abstract)" if name != "prefixplace" else "(from the issue's summary of the paper)") in doc
