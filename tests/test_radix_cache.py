"""The engine's radix tree of token segments (topas.engine.radix_cache), as SGLang's radix cache
keeps it: shared leading segments stored once, the longest cached run matched (partially once a
deeper node is gone), locked nodes never evicted, unlocked leaves evicted least recently used
first (ties: the node created first), a finished request's prompt left in the tree."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from topas.engine.config import EngineConfig
from topas.engine.cost import load_profile
from topas.engine.metrics import cached_share
from topas.engine.radix_cache import SegmentCache, prompt_tail
from topas.engine.simulator import Simulator, simulate
from topas.policies import make_policy
from topas.workload import read_trace, trace_from_dict
from topas.workload.model import Trace
from topas.workload.reuse import perfect_cache_reuse
from conftest import good_trace_v2_dict

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"


def inserted(cache: SegmentCache, segs, now: float, agent: str = "a", owner: str = "r"):
    """Insert ``segs`` below the agent root and release the inserter's lock (a finished prompt)."""
    nodes, _, _ = cache.insert(agent, None, segs, owner, now)
    cache.unlock(nodes, now)
    return nodes


# ---------------------------------------------------------------- the tree alone
def test_prompts_share_their_common_leading_segments_and_split_where_they_diverge():
    c = SegmentCache(["a"])
    first = inserted(c, [("H", 2), ("C", 5), ("U0", 3)], now=1.0)
    nodes, dup, dup_unlocked = c.insert("a", None, [("H", 2), ("C", 5), ("U1", 6)], "r2", 2.0)
    assert nodes[:2] == first[:2]  # H and C held once
    assert (dup, dup_unlocked) == (7, 7)  # the second request's copy of H C is a duplicate
    assert sorted(first[1].children) == ["U0", "U1"]  # the tree branches after C
    assert [n.id for n in c.match("a", [("H", 2), ("C", 5), ("X", 1)])] == ["H", "C"]


def test_a_request_matches_the_part_above_an_evicted_deeper_node():
    c = SegmentCache(["a"])
    inserted(c, [("H", 2), ("C", 5), ("U0", 3)], now=1.0)
    leaf = c.peek_lru()
    assert leaf.id == "U0"
    c.evict(leaf)
    assert [n.id for n in c.match("a", [("H", 2), ("C", 5), ("U0", 3)])] == ["H", "C"]
    c.evict(c.peek_lru())  # C became a leaf
    assert [n.id for n in c.match("a", [("H", 2), ("C", 5)])] == ["H"]


def test_a_locked_node_is_never_offered_for_eviction():
    c = SegmentCache(["a"])
    nodes = inserted(c, [("H", 2), ("C", 5)], now=1.0)
    assert c.lock(nodes, now=2.0) == 7 and c.locked_tokens == 7
    assert c.peek_lru() is None
    assert c.unlock(nodes, now=3.0) == 7 and c.locked_tokens == 0
    assert c.peek_lru().id == "C"


def test_a_node_locked_twice_stays_locked_until_both_release_it():
    c = SegmentCache(["a"])
    nodes = inserted(c, [("H", 2)], now=1.0)
    c.lock(nodes, 2.0)
    c.lock(nodes, 2.0)
    assert c.unlock(nodes, 3.0) == 0 and c.peek_lru() is None
    assert c.unlock(nodes, 4.0) == 2 and c.peek_lru().id == "H"


def test_leaves_go_least_recently_used_first_and_ties_to_the_node_created_first():
    c = SegmentCache(["a", "b"])
    inserted(c, [("X", 1)], now=5.0, agent="b")
    inserted(c, [("H", 2), ("U0", 3)], now=2.0)
    inserted(c, [("H", 2), ("U1", 4)], now=2.0)  # same time as U0, created after it
    order = []
    while (n := c.peek_lru()) is not None:
        order.append(n.id)
        c.evict(n)
    assert order == ["U0", "U1", "H", "X"]


def test_matching_and_locking_refresh_a_node_for_the_lru():
    c = SegmentCache(["a"])
    old = inserted(c, [("U0", 3)], now=1.0)
    inserted(c, [("U1", 3)], now=2.0)
    c.lock(old, 3.0)  # a request uses U0 again at t=3 and finishes
    c.unlock(old, 3.0)
    assert c.peek_lru().id == "U1"


def test_prompt_tail_is_what_follows_the_agent_prefix():
    t = trace_from_dict(good_trace_v2_dict())
    s = t.tasks[0].stages[1]
    assert prompt_tail(s.segments, t.agents["a"].prefix_tokens) == (("H", 2), ("C", 5), ("U1", 6))


# ---------------------------------------------------------------- the engine
def test_a_finished_requests_prompt_stays_in_the_tree_for_the_next_call(cost):
    # t00000/B follows A and holds A's P H C: served from the cache after A finished. t00001/A
    # shares P H with the first task; t00001/B is agent b's first call.
    res = simulate(trace_from_dict(good_trace_v2_dict()), make_policy("fcfs"), cost)
    cached = dict(zip(res.requests["rid"], res.requests["cached_tokens"]))
    assert cached == {"t00000/A": 0, "t00000/B": 11, "t00001/A": 6, "t00001/B": 0}
    assert cached_share(res.requests) == pytest.approx(17 / 49)  # all a perfect cache reuses


def test_a_trace_without_segments_caches_agent_prefixes_only(cost):
    d = good_trace_v2_dict()
    res = simulate(strip_segments(trace_from_dict(d)), make_policy("fcfs"), cost)
    cached = dict(zip(res.requests["rid"], res.requests["cached_tokens"]))
    assert cached == {"t00000/A": 0, "t00000/B": 4, "t00001/A": 4, "t00001/B": 0}


def strip_segments(t: Trace) -> Trace:
    tasks = tuple(dataclasses.replace(task, stages=tuple(dataclasses.replace(s, segments=None) for s in task.stages))
                  for task in t.tasks)
    return Trace(name=t.name, agents=t.agents, tasks=tasks, meta=t.meta)


class CheckedSimulator(Simulator):
    """The simulator with the pool's accounting checked against the tree after every step."""

    def step(self) -> bool:
        going = super().step()
        memory, tree = self.memory, self.segments.tree
        own = sum(r.kv for r in self.batch.running())
        locked = unlocked = 0
        stack = [n for root in tree.roots.values() for n in root.children.values()]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if n.lock_ref:
                locked += n.tokens
            else:
                unlocked += n.tokens
        ghosts = sum(p.tokens for a, p in memory.prefixes.items() if memory.cached_unpinned(a))
        assert locked == tree.locked_tokens
        assert memory.request_tokens == own + locked  # a locked node counted once
        assert memory.evictable_tokens == unlocked + ghosts
        assert sum(memory.cached_tokens(a) for a in memory.prefixes) == unlocked
        for r in self.batch.running():
            assert all(n.alive and n.lock_ref > 0 for n in r.seg_nodes), f"{r.rid} uses an unlocked node"
        assert memory.overflow() <= 0
        return going


@pytest.mark.parametrize("name, n", [("metagpt-sop", 25), ("metagpt-tl", 15)])
@pytest.mark.parametrize("policy", ["lpm", "topas"])
@pytest.mark.parametrize("options", [{}, {"overlap_schedule": False}, {"host_tier": True}])
def test_the_pool_accounts_for_the_tree_at_every_step(name, n, policy, options):
    t = read_trace(TRACES / f"{name}.json.gz").head(n)
    sim = CheckedSimulator(t, make_policy(policy), load_profile(), EngineConfig(**options))
    res = sim.run()
    assert res.summary["n_tasks"] == n and res.tasks["finish"].notna().all()
    assert sim.segments.tree.peek_lru() is not None or sim.memory.evictable_tokens == 0


@pytest.mark.parametrize("policy", ["lpm", "fcfs"])
def test_metagpt_sop_serves_more_from_the_tree_than_from_agent_prefixes_but_no_more_than_a_perfect_cache(policy):
    t = read_trace(TRACES / "metagpt-sop.json.gz").head(60)
    tree = cached_share(simulate(t, make_policy(policy), load_profile()).requests)
    prefixes = cached_share(simulate(strip_segments(t), make_policy(policy), load_profile()).requests)
    perfect = perfect_cache_reuse(t)
    assert prefixes < 0.10 < 0.25 < tree <= perfect.share(perfect.reused)


def test_segment_cache_off_is_the_agent_prefix_engine(cost):
    t = trace_from_dict(good_trace_v2_dict())
    off = simulate(t, make_policy("fcfs"), cost, EngineConfig(segment_cache=False))
    stripped = simulate(strip_segments(t), make_policy("fcfs"), cost)
    assert off.requests["cached_tokens"].tolist() == stripped.requests["cached_tokens"].tolist() == [0, 4, 4, 0]
    assert off.tasks["jct"].tolist() == stripped.tasks["jct"].tolist()


def test_each_engine_of_a_cluster_keeps_its_own_segment_tree():
    from topas.experiments import Experiment, run_experiment
    base = dict(workload="metagpt-sop", policy="lpm", params={}, load=1.0, seed=0, n_tasks=30,
                engines=2, router="least-load")
    tree = cached_share(run_experiment(Experiment(**base)).requests)
    off = cached_share(run_experiment(Experiment(**base, engine_options={"segment_cache": False})).requests)
    assert off < 0.10 < 0.25 < tree
