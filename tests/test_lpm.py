"""LPM as SGLang 0.5.x's ``schedule_policy.py`` orders its waiting queue (topas/policies/lpm.py):
match against the radix tree, in-batch deprioritization, a stable in-place sort, and the FCFS
fallback above 128 waiting requests. Hand-built views; the admission order is worked out in the
comments."""

from __future__ import annotations


from topas.engine.cost import load_profile
from topas.engine.simulator import simulate
from topas.engine.view import EngineView, PrefixView, RequestView
from topas.policies import make_policy
from topas.workload.model import Agent, Stage, Task, Trace

COST = load_profile()


def req(rid: str, agent: str, ready: float) -> RequestView:
    return RequestView(rid=rid, task_id=rid, stage_id="s", agent=agent, input_tokens=100, generated=0,
                       ready_time=ready, kv_tokens=0, service_time=0.0, preemptions=0)


def view(waiting, in_tree=(), computing=(), tokens=None) -> EngineView:
    """Agents a..d with 1,000-token prefixes (``tokens`` overrides); ``in_tree`` agents are cached
    in the radix tree; ``computing`` ones are resident but a prefill is still computing them."""
    tokens = {a: 1000 for a in "abcd"} | (tokens or {})
    prefixes = {a: PrefixView(a, n, 50.0, a in in_tree or a in computing, False, 0, -1.0, False, a in in_tree)
                for a, n in tokens.items()}
    return EngineView(time=1.0, kv_budget=100_000, prefix_tokens=0, request_tokens=0, prefixes=prefixes,
                      running=(), waiting=tuple(waiting), tasks={}, cost=COST)


def order(policy, v) -> list[str]:
    return list(policy.decide(v).admit)


def test_requests_matching_a_cached_prefix_go_first_longest_first_ties_by_arrival():
    lpm = make_policy("lpm")
    v = view([req("a1", "a", 0.0), req("b1", "b", 0.1), req("c1", "c", 0.2), req("b2", "b", 0.3)],
             in_tree={"b", "c"}, tokens={"c": 2000})
    # c (2,000 cached) > b (1,000: b1 then b2, by arrival) > a (nothing cached)
    assert order(lpm, v) == ["c1", "b1", "b2", "a1"]


def test_a_prefix_still_being_computed_is_not_matched():
    # a's KV is on the GPU but its prefill has not reached the radix tree: SGLang matches 0 tokens,
    # so a2 does not jump the queue (and b1, the first request of its agent, keeps its place)
    lpm = make_policy("lpm")
    v = view([req("b1", "b", 0.0), req("a2", "a", 0.1)], computing={"a"})
    assert order(lpm, v) == ["b1", "a2"]


def test_of_several_requests_waiting_on_one_uncached_prefix_only_the_first_goes_ahead():
    lpm = make_policy("lpm")
    v = view([req("a1", "a", 0.0), req("a2", "a", 0.1), req("b1", "b", 0.2), req("a3", "a", 0.3),
              req("b2", "b", 0.4), req("c1", "c", 0.5)])
    # a1, b1, c1 each compute their prefix; a2, a3, b2 are deprioritized, behind all, in queue order
    assert order(lpm, v) == ["a1", "b1", "c1", "a2", "a3", "b2"]


def test_short_prefixes_and_cached_prefixes_are_never_deprioritized():
    lpm = make_policy("lpm")
    v = view([req("s1", "a", 0.0), req("s2", "a", 0.1), req("b1", "b", 0.2), req("b2", "b", 0.3),
              req("c1", "c", 0.4)], in_tree={"b"}, tokens={"a": 31})
    # b is cached (1,000 > 32: not checked); a's 31 tokens are below the 32-token threshold
    assert order(lpm, v) == ["b1", "b2", "s1", "s2", "c1"]
    off = make_policy("lpm", in_batch_deprioritize_tokens=10**9)
    v = view([req("a1", "a", 0.0), req("a2", "a", 0.1), req("b1", "b", 0.2)])
    assert order(off, v) == ["a1", "a2", "b1"]


def test_the_queue_keeps_its_sorted_order_between_decisions_and_new_requests_join_at_the_end():
    lpm = make_policy("lpm")
    assert order(lpm, view([req("a1", "a", 0.0), req("a2", "a", 0.1), req("b1", "b", 0.2)])) == \
        ["a1", "b1", "a2"]
    # a1 was admitted; c1 arrives. Nothing is cached yet, so all tie: the queue's order is kept
    # (b1 before a2, as last sorted) and c1 joins at the end; a2 is no longer deprioritized
    v = view([req("a2", "a", 0.1), req("b1", "b", 0.2), req("c1", "c", 0.3)])
    assert order(lpm, v) == ["b1", "a2", "c1"]
    # a fresh LPM (no history) would order them by arrival
    assert order(make_policy("lpm"), v) == ["a2", "b1", "c1"]


def test_a_retracted_request_rejoins_at_the_end_of_the_queue():
    lpm = make_policy("lpm")
    v = view([req("a1", "a", 0.0), req("b1", "b", 0.1)])
    assert order(lpm, v) == ["a1", "b1"]
    lpm.on_preempt(req("a1", "a", 0.0), 0.15, by_engine=True)  # after b1 (0.1), before c1 (0.2)
    assert order(lpm, view([req("a1", "a", 0.0), req("b1", "b", 0.1), req("c1", "c", 0.2)])) == \
        ["b1", "a1", "c1"]


def test_above_128_waiting_requests_the_queue_is_served_as_it_is():
    lpm = make_policy("lpm")
    waiting = [req(f"r{i:03d}", "ab"[i % 2], i * 0.01) for i in range(129)]
    # with b cached, a sorting LPM would put every b request first; over 128 it does not sort
    assert order(lpm, view(waiting, in_tree={"b"})) == [r.rid for r in waiting]
    assert order(make_policy("lpm"), view(waiting[:128], in_tree={"b"}))[0] == "r001"


def _burst(agents: str, per_agent: int) -> Trace:
    """All requests at t=0, agent by agent round-robin (a, b, a, b, ...), one stage each."""
    ags = {a: Agent(a, 1000, 20.0) for a in agents}
    tasks = tuple(Task(f"t{i:02d}", 0.0, (Stage("s", agents[i % len(agents)], 64, 8),))
                  for i in range(len(agents) * per_agent))
    return Trace("burst", ags, tasks)


def test_in_the_simulator_one_request_per_uncached_prefix_leads_and_the_rest_hit_it():
    # an idle engine with room for everything: the first batch takes all six requests; a1 and b1
    # lead; a2, a3 (and b2, b3) are sorted behind them and compute their own copy in that batch
    # (SGLang shares nothing within a batch). Sorting changes the order, not who misses here.
    res = simulate(_burst("ab", 3), make_policy("lpm"), COST)
    req_ = res.requests.set_index("rid")
    assert (req_["cached_tokens"] == 0).all()
    # with a pool holding about two prefixes, only the leaders fit first; the followers then
    # find their agent's prefix cached
    res = simulate(_burst("ab", 3), make_policy("lpm"), COST.with_budget(2 * 1000 + 2 * 200))
    req_ = res.requests.set_index("rid")
    first = req_["first_admit"].min()
    leaders = req_[req_["first_admit"] == first].index.tolist()
    assert sorted(leaders) == ["t00/s", "t01/s"]
    assert (req_.drop(leaders)["cached_tokens"] == 1000).all()


def test_lpm_sees_the_tree_through_the_view_only():
    # the simulator says a prefix is in the tree only once its prefill's results are processed
    seen: list[EngineView] = []
    lpm = make_policy("lpm")
    decide = lpm.decide

    def spy(v):
        seen.append(v)
        return decide(v)

    lpm.decide = spy
    simulate(_burst("ab", 3), lpm, COST.with_budget(2 * 1000 + 2 * 200))
    for v in seen:
        for p in v.prefixes.values():
            assert not p.in_tree or p.resident
    assert any(p.resident and not p.in_tree for v in seen for p in v.prefixes.values())
    assert any(p.in_tree for v in seen for p in v.prefixes.values())
