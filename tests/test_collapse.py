"""The collapse trace's building blocks on hand-made tables (studies.protocol_runs.collapse)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from studies.protocol_runs import collapse as C


def test_interval_occupancy_is_the_overlap_over_the_window():
    # [0, 10) and [5, 15) in windows [0, 10) and [10, 20): 15 s / 10 s and 5 s / 10 s
    occ = C.interval_occupancy([0, 5], [10, 15], [0, 10, 20])
    assert occ.tolist() == pytest.approx([1.5, 0.5])
    # an open interval (NaN end) runs to the last edge; an empty set is zero
    assert C.interval_occupancy([12], [np.nan], [0, 10, 20]).tolist() == pytest.approx([0.0, 0.8])
    assert C.interval_occupancy([], [], [0, 10, 20]).tolist() == [0.0, 0.0]


def test_step_mean_holds_each_value_until_the_next_record():
    # 0 before t=2, 4 on [2, 6), 1 from 6 on; windows [0, 5) and [5, 10)
    m = C.step_mean([2, 6], [4, 1], [0, 5, 10])
    assert m.tolist() == pytest.approx([(3 * 4) / 5, (1 * 4 + 4 * 1) / 5])


def test_counts_in_uses_right_closed_windows():
    assert C.counts_in([0, 5, 5.5, 10, 12], [0, 5, 10, 20]).tolist() == [2, 2, 1]


def test_residency_follows_loads_and_evictions():
    ev = pd.DataFrame({"time": [0.0, 3.0, 4.0, 1.0, 7.0], "agent": ["a", "a", "a", "b", "b"],
                       "event": ["load_prefill", "evict_free", "load_cached", "load_prefill", "lru_drop"]})
    res = C.residency_intervals(ev, ["a", "b"], end=10.0)
    assert res.values.tolist() == [["a", 0.0, 3.0], ["a", 4.0, 10.0], ["b", 1.0, 10.0]]  # lru_drop is not an eviction


def _run():
    """Two agents; a's prefix resident all along, b's only from t=6. Request r1 (agent a) waits
    0-4 while a is resident (hot); r2 (agent b) waits 2-8, cold until 6 and hot 6-8."""
    tasks = pd.DataFrame({"task_id": ["t1", "t2"], "arrival": [0.0, 2.0], "finish": [9.0, 10.0], "jct": [9.0, 8.0]})
    requests = pd.DataFrame({"rid": ["t1/A", "t2/A"], "task_id": ["t1", "t2"], "agent": ["w.a", "w.b"],
                             "ready": [0.0, 2.0], "first_admit": [4.0, 8.0], "finish": [9.0, 10.0]})
    prefix_events = pd.DataFrame({"time": [0.0, 6.0, 9.5], "agent": ["w.a", "w.b", "w.a"],
                                  "event": ["load_prefill", "load_prefill", "evict_free"], "tokens": [10, 10, 10],
                                  "bytes": [0.0, 0.0, 0.0]})
    timeline = pd.DataFrame({"time": [1.0, 5.0], "prefix_tokens": [10, 20], "request_tokens": [30, 20],
                             "decode_batch": [1, 3], "prefill_queue": [0, 0], "waiting": [1, 1],
                             "evictable_tokens": [0, 0]})
    decisions = pd.DataFrame({"time": [0.0, 4.0, 8.0], "n_proposed": [1, 2, 1], "n_admitted": [0, 1, 1]})
    return SimpleNamespace(tasks=tasks, requests=requests, prefix_events=prefix_events, timeline=timeline,
                           decisions=decisions)


def test_window_series_on_a_hand_made_run():
    ws = C.window_series(_run(), budget=100, edges=[0, 5, 10])
    first, second = ws.iloc[0], ws.iloc[1]
    assert (first["arrivals"], second["arrivals"]) == (2, 0)
    assert (first["finished"], second["finished"]) == (0, 2)
    assert first["in_system"] == pytest.approx((5 + 3) / 5)
    # waiting: r1 on [0, 4), r2 on [2, 8)
    assert first["waiting:a"] == pytest.approx(4 / 5) and first["waiting:b"] == pytest.approx(3 / 5)
    assert second["waiting:b"] == pytest.approx(3 / 5)
    # hot: r1's 4 s (a resident) in window 1; r2's 6-8 in window 2, of its 3 s waiting there
    assert first["hot_wait_share"] == pytest.approx(4 / 7)
    assert second["hot_wait_share"] == pytest.approx(2 / 3)
    assert first["resident"] == pytest.approx(1.0) and second["resident"] == pytest.approx((4.5 + 4) / 5)
    assert (first["loads"], second["loads"], first["evictions"], second["evictions"]) == (1, 1, 0, 1)
    # the timeline: nothing before t=1, (10+30)/100 on [1, 5), (20+20)/100 from 5
    assert first["kv_use"] == pytest.approx(4 * 0.4 / 5) and second["kv_use"] == pytest.approx(0.4)
    assert first["decode_batch"] == pytest.approx(4 / 5) and second["decode_batch"] == pytest.approx(3.0)
    assert first["queue_time"] == pytest.approx(4.0) and second["queue_time"] == pytest.approx(6.0)
    assert (first["oldest_wait"], first["oldest_agent"]) == (3.0, "b")  # r1 admitted at 4; r2 waiting since 2
    # decisions at 0 and 4 admit fewer than proposed, the one at 8 all it proposed
    assert first["stopped_share"] == pytest.approx(1.0) and second["stopped_share"] == pytest.approx(0.0)


def test_run_profile_finds_the_spell_without_evictions():
    p = C.run_profile(_run(), budget=100)
    assert (p["spell_start"], p["spell_s"]) == (0.0, 9.5)  # the one eviction is at 9.5, the run ends at 10
    assert p["all_resident_start"] == 6.0 and p["all_resident_s"] == pytest.approx(3.5)
    assert p["spell_all_resident"] == pytest.approx(3.5 / 9.5)
    assert not C.is_lock(p)
    assert C.is_lock({**p, "spell_s": 2000.0, "spell_all_resident": 0.95})
    waits = C.longest_waits(_run(), n=2)
    assert waits["rid"].tolist() == ["t2/A", "t1/A"]
    assert waits["resident_share"].tolist() == pytest.approx([2 / 6, 1.0])


def _evidence(rows):
    cols = ["key", "workload", "policy", "load", "seed", "n_tasks", "jct_mean", "jct_p_value", "in_system_p_value"]
    return pd.DataFrame([dict(zip(cols, r)) for r in rows])


def test_find_collapses_needs_a_stable_higher_load():
    g, ok = 1e-6, 0.5  # p-values: growing, not growing (5 seeds: level 0.005)
    rows = []
    for s in range(5):
        # seed 2 grows at 1.0 and is stable at 1.25; seed 4 grows at 1.25 only (the top: no collapse)
        rows.append((f"a{s}", "w", "topas-plus", 1.0, s, 100, 50.0 + s, g if s == 2 else ok, ok))
        rows.append((f"b{s}", "w", "topas-plus", 1.25, s, 100, 60.0, g if s == 4 else ok, ok))
        # an LPM collapse is not ours
        rows.append((f"c{s}", "w", "lpm", 1.0, s, 100, 50.0, g if s == 2 else ok, ok))
        rows.append((f"d{s}", "w", "lpm", 1.25, s, 100, 50.0, ok, ok))
    found = C.find_collapses(_evidence(rows))
    assert found[["policy", "load", "seed"]].values.tolist() == [["topas-plus", 1.0, 2]]
    r = found.iloc[0]
    assert r["seed_stable_above"] == "1.25" and r["all_stable_above"] == ""  # seed 4 grows at 1.25
    assert (r["others_jct_low"], r["others_jct_high"]) == (50.0, 54.0)
