"""The radix cache's eviction order as an engine axis (topas.engine.eviction, EngineConfig.eviction,
``topas simulate --eviction``), after SGLang 0.5.23's ``evict_policy.py``:

* ``lru`` (the default) is today's engine; the generic strategy pass given LRU's key reproduces it;
* one small pool where ``lru``, ``lfu`` and ``priority`` each evict a different cached context,
  read from the requests table (``cached_tokens`` of three probes that arrive together);
* ``slru``'s protected segment, ``tlru``'s TEL-safe entries first;
* request priorities come from ``Policy.request_priority``, once per request;
* dynamic strategies get the view (and, an offline bound, the future) before a pass;
* an unknown name or parameter is an error naming the valid ones; an experiment's key holds it.
"""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from topas.cli import main
from topas.engine import eviction as ev
from topas.engine.config import EngineConfig, engine_config
from topas.engine.cost import load_profile
from topas.engine.eviction import LEAF, PREFIX, SEGMENT, Evictable, eviction_strategy
from topas.engine.simulator import Simulator, simulate
from topas.experiments.spec import Experiment, prepare
from topas.policies.fcfs import FCFS
from topas.workload import trace_from_dict

SIZES = {"P": 4, "X": 10, "Y": 10, "Z": 10, "Pb": 4, "Big": 20}


def _task(tid: str, t: float, agent: str, segs: list[str]) -> dict:
    x = sum(SIZES[s] for s in segs[1:])
    return {"id": tid, "arrival": t, "workflow": "w", "stages": [
        {"id": "A", "agent": agent, "input_tokens": x, "output_tokens": 2, "parents": [], "segments": segs}]}


def pool_trace():
    """Agent a's prefix P (4 tokens) and three cached contexts of 10 tokens: X used twice (t1, t2:
    two hits, the oldest), Y once (t3), Z once (t4, the newest). t5, agent b's 20-token prompt,
    forces one context out; the probes t6, t7, t8 (X, Y, Z) arrive together at t=50, so each one's
    ``cached_tokens`` (4: the prefix only; 13: the prefix and all but the last token of its
    context) says which context survived."""
    tasks = [_task("t1", 0.0, "a", ["P", "X"]), _task("t2", 10.0, "a", ["P", "X"]),
             _task("t3", 20.0, "a", ["P", "Y"]), _task("t4", 30.0, "a", ["P", "Z"]),
             _task("t5", 40.0, "b", ["Pb", "Big"]),
             _task("t6", 50.0, "a", ["P", "X"]), _task("t7", 50.0, "a", ["P", "Y"]),
             _task("t8", 50.0, "a", ["P", "Z"])]
    return trace_from_dict({
        "schema": "topas.trace/2", "name": "evict-pool", "meta": {"description": "eviction order"},
        "agents": [{"name": "a", "prefix_tokens": 4, "expected_output_tokens": 2.0},
                   {"name": "b", "prefix_tokens": 4, "expected_output_tokens": 2.0}],
        "tasks": tasks,
        "segments": [{"id": k, "tokens": v, "kind": "prefix" if k.startswith("P") else "shared"}
                     for k, v in SIZES.items()],
    })


class Z0(FCFS):
    """FCFS whose requests carry priority 5, except t4's (Z's) at 0; records the hook's calls."""

    name = "fcfs-z0"

    def reset(self) -> None:
        super().reset()
        self.calls: list[tuple[str, float]] = []

    def request_priority(self, request, view) -> int:
        self.calls.append((request.rid, view.time))
        return 0 if request.task_id == "t4" else 5


def probes(eviction: str, policy=None) -> tuple[int, int, int]:
    """``cached_tokens`` of the probes of X, Y and Z under ``eviction`` (a 56-token pool)."""
    res = simulate(pool_trace(), policy or Z0(), load_profile(), EngineConfig(kv_budget=56, eviction=eviction))
    c = res.requests.set_index("rid")["cached_tokens"]
    assert (c["t1/A"], c["t2/A"]) == (0, 13)  # the pool before the pressure: t2 matched t1's prompt
    return c["t6/A"], c["t7/A"], c["t8/A"]


# ---------------------------------------------------------------- the orders, request by request
def test_lru_evicts_the_least_recently_used_context():
    assert probes("lru") == (4, 13, 13)  # X, last used at t=10, went


def test_lfu_evicts_the_context_with_fewest_hits():
    """X has two hits (t1's and t2's insertions), Y and Z one: Y, the older of the two, went."""
    assert probes("lfu") == (13, 4, 13)


def test_priority_evicts_the_lowest_priority_context():
    """Z was inserted by a priority-0 request, X and Y by priority-5 ones: Z went."""
    assert probes("priority") == (13, 13, 4)


def test_priority_without_request_priorities_keeps_prompts_over_outputs():
    """A policy without priorities (every request 0): SGLang's finished prompt path is inserted
    again at priority + 1, so all four outputs (priority 0) go before any context (1); here the
    outputs' 8 tokens do not meet the need and X, the least recently used context, goes next."""
    assert probes("priority", FCFS()) == (4, 13, 13)


def test_slru_protects_entries_hit_protected_threshold_times():
    assert probes("slru") == (13, 4, 13)  # X (2 hits) protected: Y, the oldest probationary, went
    assert probes("slru:protected_threshold=3") == (4, 13, 13)  # nothing protected: LRU


def test_request_priority_is_asked_once_per_request_when_it_reaches_the_scheduler():
    pol = Z0()
    simulate(pool_trace(), pol, load_profile(), EngineConfig(kv_budget=56, eviction="priority"))
    assert [rid for rid, _ in pol.calls] == [f"t{i}/A" for i in range(1, 9)]
    assert [t for _, t in pol.calls] == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 50.0, 50.0]


def test_the_default_policy_priority_is_zero_and_never_asks_for_a_view():
    sim = Simulator(pool_trace(), FCFS(), load_profile(), EngineConfig(kv_budget=56))
    assert not sim.eviction.sets_priority
    sim.run()
    assert {r.priority for r in sim.requests.values()} == {0}


def test_topas_gives_the_requests_of_its_pinned_agents_priority_one():
    """TOPAS's reading: a request whose agent is in the pinned set when it arrives carries 1."""
    from topas.policies import make_policy

    p = prepare(Experiment("dag-4", "topas", load=2.0, n_tasks=20))
    sim = Simulator(p.trace, make_policy("topas"), p.cost, dataclasses.replace(p.config, eviction="priority"))
    sim.run()
    prios = sorted({r.priority for r in sim.requests.values()})
    assert prios == [0, 1]
    lru = Simulator(p.trace, make_policy("topas"), p.cost, p.config)
    lru.run()
    assert {r.priority for r in lru.requests.values()} == {0}  # (asked only when priorities are read)


# ---------------------------------------------------------------- strategy keys
def entry(kind=SEGMENT, tokens=10, last=1.0, hits=1, prio=0, depth=14, history=16, serial=1) -> Evictable:
    return Evictable(kind, "a", tokens, last, hits, prio, serial, (0, serial), str(serial), depth, history)


def test_each_strategy_orders_entries_as_sglangs_get_priority():
    old_hit, new_once = entry(last=1.0, hits=3), entry(last=2.0, hits=1)
    assert eviction_strategy("lru").priority(old_hit) < eviction_strategy("lru").priority(new_once)
    assert eviction_strategy("lfu").priority(new_once) < eviction_strategy("lfu").priority(old_hit)
    assert eviction_strategy("slru").priority(new_once) < eviction_strategy("slru").priority(old_hit)
    low, high = entry(last=2.0, prio=-1), entry(last=1.0, prio=3)
    assert eviction_strategy("priority").priority(low) < eviction_strategy("priority").priority(high)


def test_tlru_drains_tokens_past_a_branchs_budget_first():
    """history 100, next prompt 10, threshold 40: the branch needs its first 70 tokens kept; a
    leaf lying wholly past them (starts at 80) is TEL-safe and goes before an older one that
    starts at 60."""
    s = eviction_strategy("tlru:threshold=40,next_prompt_estimate=10")
    safe = entry(tokens=20, depth=100, history=100, last=5.0)
    needed = entry(tokens=20, depth=80, history=100, last=1.0)
    assert s.priority(safe) < s.priority(needed)
    assert eviction_strategy("lru").priority(needed) < eviction_strategy("lru").priority(safe)


def test_tlru_with_a_threshold_past_every_branch_is_lru_in_the_engine():
    """threshold >= history + next_prompt_estimate everywhere: every entry is TEL-safe, so the
    second key, recency, decides alone (the paper's phase 2)."""
    assert probes("tlru:threshold=4096,next_prompt_estimate=0") == probes("lru")


# ---------------------------------------------------------------- lru: today's engine
@pytest.mark.parametrize("workload,policy,n", [("chain-3", "lpm", 30), ("dag-4", "topas", 20),
                                               ("metagpt-sop", "topas-plus", 8)])
def test_the_strategy_pass_with_lrus_key_reproduces_the_lru_heaps(workload, policy, n):
    """The generic pass (one heap per pass by the strategy's key, ties by Evictable.tie) given
    LRU's key evicts exactly what the LRU heaps evict: every result table equal."""

    class ScanLRU(ev.LRU):
        heap_fast_path = False

    p = prepare(Experiment(workload, policy, load=2.0, n_tasks=n))
    heap = Simulator(p.trace, p.policy, p.cost, p.config, p.knowledge).run()
    q = prepare(Experiment(workload, policy, load=2.0, n_tasks=n))
    sim = Simulator(q.trace, q.policy, q.cost, dataclasses.replace(q.config, eviction="lfu"), q.knowledge)
    sim.eviction.strategy = ScanLRU()  # (the tree built for a scanning strategy)
    passes = []
    strategy_pass = sim.eviction.strategy_pass
    sim.eviction.strategy_pass = lambda deficit: (passes.append(deficit), strategy_pass(deficit))
    scan = sim.run()
    for t in ("tasks", "requests", "prefix_events", "timeline"):
        assert getattr(heap, t).equals(getattr(scan, t)), t
    assert len(passes) >= 5  # (the comparison saw evictions)


# ---------------------------------------------------------------- dynamic strategies' hooks
class Recorder(ev.LRU):
    name = "test-recorder"
    heap_fast_path = False
    needs_view = True

    def __init__(self, **kw):
        super().__init__(**kw)
        self.seen: list = []

    def prepare(self, view, future=None):
        self.seen.append((view.time, future))


class Oracle(Recorder):
    name = "test-oracle"
    bound = True


def _run_recording(cls: type, monkeypatch) -> tuple[Simulator, list]:
    """A run under the recording strategy ``cls`` (registered for the test): the simulator and
    what the strategy recorded."""
    monkeypatch.setattr(ev, "_REGISTRY", ev._REGISTRY.copy())
    ev.register_eviction(cls)
    sim = Simulator(pool_trace(), Z0(), load_profile(), EngineConfig(kv_budget=56, eviction=cls.name))
    sim.run()
    return sim, sim.eviction.strategy.seen


@pytest.mark.parametrize("cls", [Recorder, Oracle])
def test_a_dynamic_strategy_gets_the_view_before_each_pass_and_a_bound_the_future(cls, monkeypatch):
    sim, seen = _run_recording(cls, monkeypatch)
    assert seen and all(t >= 40.0 for t, _ in seen)  # the pressure starts with t5
    futures = [f for _, f in seen]
    if cls.bound:
        assert all(f.trace is sim.trace for f in futures) and futures[0].states["t5/A"] in ("prefill", "decode", "done")
    else:
        assert futures == [None] * len(seen)


class FutureOnly(Recorder):
    """An offline bound that reads the future only (as ``belady`` does)."""

    name = "test-future-only"
    needs_view = False
    bound = True

    def prepare(self, view, future=None):
        self.seen.append((view, future))


def test_a_bound_that_reads_no_view_is_given_the_future_alone(monkeypatch):
    sim, seen = _run_recording(FutureOnly, monkeypatch)
    assert seen and all(v is None and f.trace is sim.trace for v, f in seen)


class Keeper(Recorder):
    """Keeps every view it is given, reading nothing of it during the pass."""

    name = "test-keeper"

    def prepare(self, view, future=None):
        self.seen.append(view)


def test_a_passes_view_shows_the_running_requests_only_during_the_pass(monkeypatch):
    # The running requests' views are built at their first read; once the pass is over a first
    # read raises instead of showing the engine as it is later (as a decision's view does).
    from topas.engine.view_cache import ExpiredView

    _, kept = _run_recording(Keeper, monkeypatch)
    assert kept
    for view in kept:
        with pytest.raises(ExpiredView):
            len(view.running)


# ---------------------------------------------------------------- names, errors, keys, CLI
def test_an_unknown_eviction_or_parameter_is_an_error_naming_the_valid_ones():
    with pytest.raises(ValueError, match="unknown eviction 'fifo'; valid: lru, lfu, slru, priority, tlru"):
        EngineConfig(eviction="fifo")
    with pytest.raises(ValueError, match="unknown eviction 'mru'"):
        engine_config({"eviction": "mru"})
    with pytest.raises(ValueError, match="no parameter 'threshold'; its parameters: protected_threshold"):
        EngineConfig(eviction="slru:threshold=2")
    with pytest.raises(ValueError, match="threshold > next_prompt_estimate"):
        EngineConfig(eviction="tlru")  # SGLang refuses T-LRU that would be LRU


def test_the_eviction_is_canonical_and_in_the_experiments_key():
    assert EngineConfig(eviction="SLRU:protected_threshold=2").eviction == "slru"
    base = Experiment("chain-3", "lpm", load=1.0)
    assert base.canonical()["engine_config"]["eviction"] == "lru"
    assert Experiment("chain-3", "lpm", load=1.0, engine_options={"eviction": "lru"}).key() == base.key()
    assert Experiment("chain-3", "lpm", load=1.0, engine_options={"eviction": "lfu"}).key() != base.key()


def test_the_cli_lists_the_evictions_and_simulates_with_one():
    r = CliRunner().invoke(main, ["evictions"])
    assert r.exit_code == 0
    assert [ln.split()[0] for ln in r.output.splitlines() if not ln.startswith(" ")] == list(ev.available_evictions())
    assert "    protected_threshold: int = 2" in r.output
    r = CliRunner().invoke(main, ["simulate", "--trace", "chain-3", "--policy", "lpm", "--tasks", "3",
                                  "--eviction", "lfu"])
    assert r.exit_code == 0, r.output
    assert "eviction=lfu" in r.output
    r = CliRunner().invoke(main, ["simulate", "--trace", "chain-3", "--policy", "lpm", "--tasks", "3",
                                  "--eviction", "fifo"])
    assert r.exit_code == 1 and "unknown eviction 'fifo'" in r.output


def test_check_results_treats_the_default_eviction_as_a_new_engine_field_only():
    """A result stored before the axis existed re-runs with ``eviction="lru"`` added to its engine
    config: ``scripts/check_results.py --new-engine-fields`` compares it (the default is unchanged)."""
    import importlib.util

    from topas.paths import REPO_ROOT

    spec = importlib.util.spec_from_file_location("check_results", REPO_ROOT / "scripts" / "check_results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fresh = Experiment("chain-3", "lpm", load=1.0).canonical()["engine_config"]
    stored = {k: v for k, v in fresh.items() if k != "eviction"}
    assert fresh["eviction"] == "lru" and mod._only_new_fields(stored, fresh)


def test_hit_counts_rise_at_insertion_and_priorities_take_the_max_with_prompts_one_above():
    """After t1, t2 (X) and t3 (Y), no eviction: X was inserted through twice (t2 matched it and
    its insertion walked through it), Y and each output once; the prefix three times. Priorities
    (5 for all three requests): each output leaf 5, each prompt node 6 (SGLang's prompt-boundary
    insertion at priority + 1)."""
    sim = Simulator(pool_trace().head(3), Z0(), load_profile(), EngineConfig(kv_budget=56, eviction="priority"))
    sim.run()
    root = sim.segments.tree.roots["a"]
    x, y = root.children["X"], root.children["Y"]
    assert (x.hit_count, y.hit_count, sim.memory.prefixes["a"].hit_count) == (2, 1, 3)
    outs = [n for n in (*x.children.values(), *y.children.values())]
    assert [n.hit_count for n in outs] == [1, 1, 1] and [n.priority for n in outs] == [5, 5, 5]
    assert (x.priority, y.priority, sim.memory.prefixes["a"].priority) == (6, 6, 6)
