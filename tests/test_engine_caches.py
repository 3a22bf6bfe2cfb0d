"""The engine's kept state at scheduling points equals a rebuild from scratch, at every decision of
small runs: the prefixes' views (``PrefixViews``), the waiting requests' tree matches
(``SegmentMemory.matches``), the admission walk's locked prefix tokens and the LRU evictable prefix
a settle pass keeps (``Eviction._next_lru_prefix``)."""

from __future__ import annotations

import pytest

from topas.engine.simulator import Simulator
from topas.engine.view import PrefixView
from topas.experiments import Experiment
from topas.experiments.spec import prepare

RUNS = [
    Experiment("metagpt-tl", "fcfs", {}, load=1.2, seed=0, n_tasks=12),  # segments, LRU settle
    Experiment("metagpt-sop", "lpm", {}, load=1.3, seed=0, n_tasks=10, engine_options={"host_tier": True}),
    Experiment("dag-4", "topas", {}, load=1.3, seed=0, n_tasks=30),  # a managing policy
    Experiment("dag-4", "fcfs", {}, load=1.3, seed=0, n_tasks=30,
               engine_options={"eviction": "kvflow", "host_tier": True}),  # host loads skipped in the walk
]


def rebuilt_prefixes(sim: Simulator) -> dict[str, PrefixView]:
    m = sim.memory
    return {a: PrefixView(a, p.tokens, sim.knowledge.prior(a, p.agent.expected_output_tokens), p.resident,
                          p.on_host, p.refcount, p.last_used, m.cached_unpinned(a), m.in_tree(a), a in m.computing)
            for a, p in m.prefixes.items()}


def rebuilt_matches(sim: Simulator) -> dict[str, int]:
    seg = sim.segments
    return {rid: sum(n.tokens for n in seg.tree.match(r.agent, seg._tail(r))) for rid, r in sim.waiting.items()}


@pytest.mark.parametrize("exp", RUNS, ids=lambda e: f"{e.workload}/{e.policy}")
def test_kept_state_equals_a_rebuild_at_every_decision(exp: Experiment) -> None:
    p = prepare(exp)
    sim = Simulator(p.trace, p.policy, p.cost, p.config, p.knowledge)
    checked = {"view": 0, "fits": 0, "settle": 0}
    view, fits, next_lru = sim.view, sim.admission._fits, sim.eviction._next_lru_prefix

    def checked_view():
        v = view()
        assert v.prefixes == rebuilt_prefixes(sim)
        if sim.segments is not None:
            assert v.segment_match == rebuilt_matches(sim)
        checked["view"] += 1
        return v

    def checked_fits(tokens, exclude, locked):
        if sim.config.radix_cache:
            assert locked == sim.memory.locked_prefix_tokens()
        checked["fits"] += 1
        return fits(tokens, exclude, locked)

    def checked_next(best, touched):
        out = next_lru(best, touched)
        assert out is sim.memory.lru_evictable_prefix()
        checked["settle"] += 1
        return out

    sim.view = checked_view
    sim.admission._fits = checked_fits
    sim.eviction._next_lru_prefix = checked_next
    sim.run()
    assert checked["view"] and checked["fits"]
    assert checked["settle"] or exp.engine_options  # (LRU settles evict in the stock engine runs)
