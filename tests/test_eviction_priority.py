"""The replay's per-request eviction priority (topas.sglang.priority, the client's top-level
``priority``) and the eviction options of the CPU server's launcher; no SGLang needed
(tests_sglang/test_eviction.py runs a case on the real server)."""

from __future__ import annotations

import asyncio
import json

import pytest

from conftest import LocalHTTPServer, QuietHandler
from topas.fidelity.contention.cases import CASES, EVICTION_MODES, case_trace, find_mode
from topas.sglang import priority as pr
from topas.sglang.client import priority_body, replay_requests


def _ctx(trace, task_id: str, stage_id: str, done: dict[str, set[str]]):
    task = next(t for t in trace.tasks if t.id == task_id)
    stage = next(s for s in task.stages if s.id == stage_id)
    return pr.PriorityContext(trace=trace, task=task, stage=stage, now=1.0,
                              done={k: frozenset(v) for k, v in done.items()})


def test_the_registry_names_its_rules_and_refuses_unknown_ones():
    assert pr.make_rule(None) is None and pr.make_rule("none") is None
    assert {"none", "policy", "reuse", "steps"} <= set(pr.rule_names())
    with pytest.raises(ValueError, match=r"unknown eviction-priority rule 'nope'; valid: .*policy.*reuse"):
        pr.make_rule("nope")


def test_a_provided_rule_names_its_missing_module(monkeypatch):
    monkeypatch.setitem(pr.PROVIDERS, "later", "topas._no_such_module_here")
    with pytest.raises(ValueError, match=r"'later' comes with topas._no_such_module_here, which this install lacks"):
        pr.make_rule("later")


def test_the_policy_rule_is_the_policys_hook_and_needs_one():
    class NoHook:
        name = "plain"

    with pytest.raises(ValueError, match=r"policy 'plain' has no request_priority"):
        pr.make_rule("policy", NoHook())
    seen = []

    class Hooked:
        name = "hooked"

        def request_priority(self, request, view):
            seen.append((request, view))
            return 7 if request.agent.endswith(".a") else None

    trace = case_trace(CASES["evict-freq"])
    rule = pr.make_rule("policy", Hooked())
    assert pr.client_priority(rule, _ctx(trace, "t000", "s0", {"t000": set()})) == 7
    assert pr.client_priority(rule, _ctx(trace, "t000", "s2", {"t000": {"s0", "s1"}})) is None
    req, view = seen[0]
    assert (req.task_id, req.stage_id, req.generated, req.kv_tokens) == ("t000", "s0", 0, 0)
    assert set(view.tasks) == {"t000"} and view.tasks["t000"].done == frozenset()
    assert view.running == () and view.waiting == ()  # no server state on the client


def test_reuse_counts_the_agents_future_stages_in_view():
    trace = case_trace(CASES["evict-freq"])  # chain a a b c a, two tasks
    rule = pr.make_rule("reuse")
    got = [pr.client_priority(rule, _ctx(trace, "t000", f"s{k}", {"t000": {f"s{j}" for j in range(k)}}))
           for k in range(5)]
    assert got == [2, 1, 0, 0, 0]
    # the other task in flight counts too: its a stages not yet run
    both = {"t000": set(), "t001": {"s0"}}
    assert pr.client_priority(rule, _ctx(trace, "t000", "s0", both)) == 2 + 2


def test_steps_is_kvflows_steps_to_execution():
    trace = case_trace(CASES["evict-freq"])  # chain a a b c a
    rule = pr.make_rule("steps")
    got = [pr.client_priority(rule, _ctx(trace, "t000", f"s{k}", {"t000": {f"s{j}" for j in range(k)}}))
           for k in range(5)]
    # a's next call right after s0 (0 steps: 5); after s1, two steps on (s2 ready, s3 one step,
    # s4 two: 5 - 2); b, c and the last a are not used again (0)
    assert got == [5, 3, 0, 0, 0]


def test_steps_and_reuse_disagree_on_the_evict_steps_case():
    """b a c b c a a: when c's first call (s2) needs room, a's prefix has more later calls (reuse 2
    against b's 1) but b is due sooner (b's next call two steps after its own, a's three: steps
    priorities 3 and 2), so the two rules keep different prefixes."""
    trace = case_trace(CASES["evict-steps"])
    got = {}
    for name in ("reuse", "steps"):
        rule = pr.make_rule(name)
        got[name] = [pr.client_priority(rule, _ctx(trace, "t000", f"s{k}", {"t000": {f"s{j}" for j in range(k)}}))
                     for k in range(7)]
    assert got["reuse"] == [1, 2, 1, 0, 0, 1, 0]
    assert got["steps"] == [3, 2, 4, 0, 0, 5, 0]
    assert find_mode("evict-priority-steps").priority == "steps"
    assert find_mode("evict-priority-steps").eviction == "priority"


def test_priorities_are_signed_64_bit_ints():
    assert pr.check_priority(None, "x") is None
    assert pr.check_priority(-3, "x") == -3
    np = pytest.importorskip("numpy")
    assert pr.check_priority(np.int64(5), "x") == 5
    for bad in (True, 1.5, "2"):
        with pytest.raises(ValueError, match="must be an int or None"):
            pr.check_priority(bad, "request t/s")
    with pytest.raises(ValueError, match="not a signed 64-bit"):
        pr.check_priority(1 << 63, "x")


def test_the_body_gets_a_top_level_priority_only_when_given():
    body = {"rid": "r", "sampling_params": {}}
    assert priority_body(body, None) is None and "priority" not in body
    assert priority_body(body, 3) == 3 and body["priority"] == 3 and "priority" not in body["sampling_params"]


def test_apply_rule_gives_the_simulated_policy_the_same_hook():
    from topas.policies.base import make_policy

    pol = make_policy("fcfs", {})
    assert pr.apply_rule(pol, "none") is pol
    out = pr.apply_rule(pol, "reuse")
    assert out is not pol and isinstance(out, type(pol)) and out.name == pol.name
    assert type(out).request_priority is not type(pol).request_priority  # what the engine checks
    trace = case_trace(CASES["evict-freq"])
    ctx = _ctx(trace, "t000", "s0", {"t000": set()})
    assert out.request_priority(pr.request_view(ctx), pr.client_view(ctx)) == 2
    assert pol.request_priority(pr.request_view(ctx), pr.client_view(ctx)) == 0  # the original is untouched


class _Generate(LocalHTTPServer):
    """A fake ``/generate`` recording each body; answers like SGLang (meta_info)."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        owner = self

        class Handler(QuietHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                if self.path == "/generate":
                    owner.bodies.append(body)
                    n = body["sampling_params"]["max_new_tokens"]
                    out = json.dumps({"meta_info": {"completion_tokens": n, "cached_tokens": 0,
                                                    "prompt_tokens": len(body["input_ids"])}}).encode()
                else:
                    out = b"ok"
                self.send_response(200)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        super().__init__(Handler)


@pytest.mark.parametrize("rule_name", ["none", "reuse"])
def test_the_client_sends_the_rules_priority_per_request(rule_name):
    pytest.importorskip("aiohttp")
    from dataclasses import replace

    trace = case_trace(CASES["evict-freq"])
    trace = replace(trace, tasks=trace.tasks[:1])  # one chain: a a b c a
    fake = _Generate()
    try:
        done, finish, _ = asyncio.run(replay_requests(
            trace, fake.url, None, {}, "run1", 30.0, 30.0, 0, True, None,
            priority_rule=pr.make_rule(rule_name)))
    finally:
        fake.close()
    by_stage = {b["rid"].split("/")[-1]: b for b in fake.bodies}
    assert len(by_stage) == 5 and set(finish) == {"t000"}
    if rule_name == "none":
        assert all("priority" not in b for b in fake.bodies)
        assert all(d.priority is None for d in done)
    else:
        assert [by_stage[f"s{k}"]["priority"] for k in range(5)] == [2, 1, 0, 0, 0]
        assert sorted((d.stage_id, d.priority) for d in done) == [("s0", 2), ("s1", 1), ("s2", 0), ("s3", 0), ("s4", 0)]


def test_eviction_flags_and_modes():
    from topas.fidelity.cpu_server import cpu_server_args
    from topas.sglang.launcher import eviction_args

    assert eviction_args(None) == []
    assert eviction_args("lfu") == ["--radix-eviction-policy", "lfu"]
    assert eviction_args("slru", {"protected_threshold": 3}) == [
        "--radix-eviction-policy", "slru", "--radix-eviction-policy-config", '{"protected_threshold": 3}']
    with pytest.raises(ValueError, match="unknown radix eviction policy 'arc'.*lru, lfu"):
        eviction_args("arc")
    with pytest.raises(ValueError, match="needs an eviction policy"):
        eviction_args(None, {"x": 1})
    args = cpu_server_args(1234, 2688, "fcfs", "priority")
    assert args[-2:] == ["--radix-eviction-policy", "priority"] and "--schedule-policy" in args
    assert "--radix-eviction-policy" not in cpu_server_args(1234)
    assert find_mode("evict-priority").priority == "reuse" and find_mode("sglang-fcfs").eviction is None
    assert {m.eviction for m in EVICTION_MODES.values()} >= {"lru", "lfu", "priority"}
    with pytest.raises(KeyError, match="unknown mode 'x'; modes: plugin"):
        find_mode("x")


def test_the_simulator_refuses_an_eviction_it_does_not_model_or_takes_it():
    import dataclasses

    from topas.engine.config import EngineConfig
    from topas.fidelity.server_eviction import eviction_config_kw

    assert eviction_config_kw(None) == {} and eviction_config_kw("lru") == {}
    if "eviction" in {f.name for f in dataclasses.fields(EngineConfig)}:
        assert eviction_config_kw("lfu") == {"eviction": "lfu"}
        kw = eviction_config_kw("slru", {"protected_threshold": 3})
        assert kw == {"eviction": "slru:protected_threshold=3"}
        assert EngineConfig(**kw).eviction.startswith("slru")
    else:
        with pytest.raises(ValueError, match="cannot model"):
            eviction_config_kw("lfu")
