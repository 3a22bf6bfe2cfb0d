"""Reading a real router's choices and comparing them with the router model (topas.fidelity.real_router);
replaying through a router (topas.sglang.server.router_workers, replay's log and count merging).
No SGLang needed."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest

from topas.fidelity.real_router import TIMING_WINDOW_S, agreement, choices_from_logs, per_agent, rule_choices
from topas.cluster.routers import make_router
from topas.sglang import server as srv
from topas.sglang.replay import combine_runs, read_decision_logs


def _admit(run, *rids):
    return {"kind": "admit", "run": run, "admitted": [{"rid": r, "erid": f"{run}:{r}"} for r in rids]}


def test_choices_come_from_each_workers_admissions_of_the_run():
    w0 = [{"kind": "start"}, _admit("r1", "t0/A", "t1/A"), _admit("r0", "t0/B"), {"kind": "decision", "run": "r1"}]
    w1 = [_admit("r1", "t0/B"), _admit("r1", "t0/B")]  # re-admitted after a preemption: same worker
    assert choices_from_logs([w0, w1], "r1") == {"t0/A": 0, "t1/A": 0, "t0/B": 1}
    assert choices_from_logs([w0, w1], "r0") == {"t0/B": 0}
    with pytest.raises(ValueError, match="request t0/A of run r1 was admitted by workers 0 and 1"):
        choices_from_logs([w0, [_admit("r1", "t0/A")]], "r1")


def _requests(rows):
    return pd.DataFrame(rows, columns=["rid", "task_id", "stage_id", "agent", "input_tokens", "ready", "finish"])


def test_misses_within_the_timing_window_are_read_as_the_router_may_have_read_them():
    """DAG-4's B and C become ready as A finishes, the same instant another task's A is sent: the
    router may have routed that A before B (the client stamped B first), and read C's loads before
    it counted B (select, then count). Read strictly, B's and C's misses disagree with the router;
    within the window both are readings the router could have made. A hit is never excused."""
    prefix = {"A": 900, "B": 900, "C": 900}
    reqs = _requests([
        ("t0/A", "t0", "A", "A", 100, 0.0, 0.1000),
        ("t0/B", "t0", "B", "B", 100, 0.1001, 0.5),
        ("t1/A", "t1", "A", "A", 100, 0.1003, 0.6),
        ("t0/C", "t0", "C", "C", 100, 0.1008, 0.7),
        ("t2/B", "t2", "B", "B", 100, 2.0, 2.5),  # a hit: B's prefix is on worker 1
    ])
    real = {"t0/A": 0, "t0/B": 1, "t1/A": 0, "t0/C": 1, "t2/B": 1}
    strict = rule_choices(reqs, prefix, make_router("sglang-cache-aware"), real, 2)
    assert strict["t0/B"] == 0 and agreement(real, strict).same < 5
    resolved: set[str] = set()
    windowed = rule_choices(reqs, prefix, make_router("sglang-cache-aware"), real, 2,
                            window_s=TIMING_WINDOW_S, resolved=resolved)
    assert windowed == real and resolved == {"t0/B", "t0/C"}
    wrong_hit = dict(real, **{"t2/B": 0})  # the router sending a hit elsewhere is a disagreement
    assert rule_choices(reqs, prefix, make_router("sglang-cache-aware"), wrong_hit, 2,
                        window_s=TIMING_WINDOW_S)["t2/B"] == 1


def _stamped(rows):
    return pd.DataFrame(rows, columns=["rid", "task_id", "stage_id", "agent", "input_tokens", "ready", "finish",
                                       "server_received", "server_finished"])


def test_the_servers_stamps_bound_when_the_router_counted_a_request():
    """DAG-4's A requests of four tasks finish in one batch; the client, busy, reads t0/A's answer
    first, sends B and C, and reads the other answers 0.3 s later. The router had dropped those A
    requests from worker 0's load when the server finished them (before B was sent): B's miss
    went to worker 0, which the client's clock (and its 0.1 s window) cannot explain, and the
    server's stamps can. Where the stamps show a request still on the server, it counts."""
    prefix = {"A": 900, "B": 900, "C": 900}
    rows = [("t0/A", "t0", "A", "A", 100, 0.0, 1.00, 0.001, 0.99),
            ("t1/A", "t1", "A", "A", 100, 0.0, 1.30, 0.001, 0.99),
            ("t2/A", "t2", "A", "A", 100, 0.0, 1.31, 0.001, 0.99),
            ("t0/B", "t0", "B", "B", 100, 1.001, 2.0, 1.01, 1.9),
            ("t0/C", "t0", "C", "C", 100, 1.002, 2.0, 1.01, 1.9)]
    real = {"t0/A": 0, "t1/A": 0, "t2/A": 0, "t0/B": 0, "t0/C": 1}
    client_only = _requests([r[:7] for r in rows])
    windowed = rule_choices(client_only, prefix, make_router("sglang-cache-aware"), real, 2, window_s=TIMING_WINDOW_S)
    assert windowed["t0/B"] == 1  # two A requests in flight on worker 0 by the client's clock
    resolved: set[str] = set()
    stamped = rule_choices(_stamped(rows), prefix, make_router("sglang-cache-aware"), real, 2,
                           window_s=TIMING_WINDOW_S, resolved=resolved)
    assert stamped == real and resolved == {"t0/B"}
    # had the server still been decoding them when B reached it, they counted: no reading explains 0
    busy = [r if r[2] != "A" or r[0] == "t0/A" else (*r[:8], 1.25) for r in rows]
    assert rule_choices(_stamped(busy), prefix, make_router("sglang-cache-aware"), real, 2,
                        window_s=TIMING_WINDOW_S)["t0/B"] == 1
    # strictly (no window) the stamps are not read
    assert rule_choices(_stamped(rows), prefix, make_router("sglang-cache-aware"), real, 2)["t0/B"] == 1


def test_the_rule_is_fed_the_real_order_and_loads():
    # A's first request at t=0 (loads 0/0: worker 0); t1/A hits A's prefix (90%): worker 0;
    # B's first at t=2 while t1/A is still on worker 0: a miss goes to the least loaded (1);
    # C's first at t=6, nothing in flight: worker 0 (ties to the first)
    reqs = _requests([
        ("t0/A", "t0", "A", "A", 10, 0.0, 1.0), ("t1/A", "t1", "A", "A", 10, 0.5, 3.0),
        ("t0/B", "t0", "B", "B", 10, 2.0, 4.0), ("t0/C", "t0", "C", "C", 10, 6.0, 7.0),
    ])
    real = {"t0/A": 0, "t1/A": 0, "t0/B": 1, "t0/C": 0}
    prefix = {"A": 90, "B": 90, "C": 90}
    assert rule_choices(reqs, prefix, make_router("sglang-cache-aware"), real, 2) == real
    # the older rule sends C to the smaller tree (worker 1: B's 100 tokens < A's 110)
    old = rule_choices(reqs, prefix, make_router("sglang-cache-aware", on_miss="smallest-tree"), real, 2)
    assert old == {**real, "t0/C": 1}
    # the loads are the real choices': had the router sent t1/A to worker 1, B would go to worker 0
    moved = {**real, "t1/A": 1}
    assert rule_choices(reqs, prefix, make_router("sglang-cache-aware"), moved, 2)["t0/B"] == 0


def test_agreement_counts_requests_routed_alike():
    a = agreement({"x": 0, "y": 1, "z": 1}, {"x": 0, "y": 0, "z": 1})
    assert (a.n, a.same, a.differ) == (3, 2, ("y",)) and a.fraction == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="request q is routed in one assignment only"):
        agreement({"x": 0}, {"x": 0, "q": 1})
    assert per_agent({"t0/A": 0, "t1/A": 1, "t0/B": 1}, {"t0/A": "A", "t1/A": "A", "t0/B": "B"}) == {
        "A": [0, 1], "B": [1]}


class _Resp(io.BytesIO):
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_a_router_is_recognised_by_its_worker_list(monkeypatch):
    answers = {}

    def fake_urlopen(url, timeout=None):
        if url not in answers:
            raise OSError("404")
        return _Resp(json.dumps(answers[url]).encode())

    monkeypatch.setattr(srv.urllib.request, "urlopen", fake_urlopen)
    answers["http://r:1/workers"] = {"workers": [{"url": "http://w:2"}, {"url": "http://w:1/"}], "total": 2}
    assert srv.router_workers("http://r:1") == ["http://w:2", "http://w:1"]
    assert srv.router_workers("http://s:1") is None  # an SGLang server: no /workers
    answers["http://x:1/workers"] = {"something": "else"}
    assert srv.router_workers("http://x:1") is None
    # a router asked for a server identity says what it is
    with pytest.raises(srv.ServerError, match="is an SGLang router \\(2 workers\\), not one server"):
        srv.identity_from_info("http://r:1", {"router_manager": True, "routers_count": 1, "workers_count": 2})


def test_decision_logs_and_counts_of_several_workers_merge(tmp_path):
    p0, p1 = tmp_path / "d0.jsonl", tmp_path / "d1.jsonl"
    p0.write_text(json.dumps({"kind": "decision", "run": "r", "seq": 1}) + "\n")
    p1.write_text(json.dumps({"kind": "decision", "run": "r", "seq": 1}) + "\n"
                  + json.dumps({"kind": "admit", "run": "r", "decision_seq": 1, "admitted": []}) + "\n")
    recs = read_decision_logs([p0, p1], "r")
    assert [(r["server"], r.get("seq"), r.get("decision_seq")) for r in recs] == [
        (0, (0, 1), None), (1, (1, 1), None), (1, None, (1, 1))]
    assert read_decision_logs(p0, "r") == [{"kind": "decision", "run": "r", "seq": 1}]
    assert combine_runs([{"policy": "fcfs", "decisions": 3, "fallbacks": 0}, None,
                         {"policy": "fcfs", "decisions": 2, "fallbacks": 1}]) == {
        "policy": "fcfs", "decisions": 5, "fallbacks": 1, "per_server": [3, 0, 2]}
    assert combine_runs([None, None]) is None
