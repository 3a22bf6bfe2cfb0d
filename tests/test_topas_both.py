"""TOPAS-both (topas.policies.topas_both) and the engine's `policy` eviction strategy
(topas.engine.eviction_policy): the next-use values come from what the view shows only, the
strategy evicts the agent needed latest first, the engine refuses a policy without values, and
the policy is deterministic and orders admission as TOPAS+ does."""

from __future__ import annotations

import importlib.util
import math
from types import SimpleNamespace

import pytest

from conftest import task_view
from topas.engine.eviction import LEAF, PREFIX, SEGMENT, Evictable, eviction_strategy
from topas.engine.view import StageView, TaskView
from topas.experiments import Experiment, run_row
from topas.experiments.protocol.seeds import TUNING_SEEDS
from topas.paths import REPO_ROOT
from topas.policies import make_policy
from topas.policies.base import PolicyError
from topas.policies.topas_both import next_start_times


def task(tid: str, stages: list[tuple[str, str, tuple[str, ...]]], done: tuple[str, ...] = ()) -> TaskView:
    """A task from (stage, agent, parents) in topological order; only these stages are shown."""
    return task_view(tid, stages, done, complete=False)


CHAIN = [("s0", "X", ()), ("s1", "Y", ("s0",)), ("s2", "Z", ("s1",))]


def fake_view(*tasks: TaskView, agents=("X", "Y", "Z", "W")):
    """What the "steps" reading reads of an EngineView: its tasks and prefixes (nothing waiting)."""
    return SimpleNamespace(tasks={t.id: t for t in tasks}, prefixes={a: None for a in agents}, waiting=())


# ---------------------------------------------------------------- the values: the view only
def test_steps_values_count_only_the_stages_the_view_shows():
    pol = make_policy("topas-both", next_use="steps", horizon=4)
    pol.reset()
    full = pol.eviction_values(fake_view(task("t", CHAIN, done=("s0",))))
    assert full == {"X": 5.0, "Y": 0.0, "Z": 1.0, "W": 5.0}  # X done, no shown stage waits: H + 1
    # online visibility: s2 is not reached yet, so Z's next use is unknown (H + 1), not 1 step
    online = pol.eviction_values(fake_view(task("t", CHAIN[:2], done=("s0",))))
    assert online == {"X": 5.0, "Y": 0.0, "Z": 5.0, "W": 5.0}


def test_steps_values_are_capped_at_the_horizon_plus_one():
    long = [(f"s{i}", f"A{i}", (f"s{i-1}",) if i else ()) for i in range(6)]
    pol = make_policy("topas-both", next_use="steps", horizon=2)
    vals = pol.eviction_values(fake_view(task("t", long), agents=tuple(f"A{i}" for i in range(6))))
    assert list(vals.values()) == [0.0, 1.0, 2.0, 3.0, 3.0, 3.0]


def test_time_values_are_the_expected_start_of_the_next_shown_stage():
    # a -> b, a -> c, (b, c) -> d: d starts after the later of b and c
    t = task("t", [("a", "A", ()), ("b", "B", ("a",)), ("c", "C", ("a",)), ("d", "D", ("b", "c"))])
    dur = {"a": 2.0, "b": 5.0, "c": 1.0, "d": 3.0}
    got = next_start_times(SimpleNamespace(tasks={"t": t}), lambda tid, sid: dur[sid])
    assert got == {"A": 0.0, "B": 2.0, "C": 2.0, "D": 7.0}
    # d not reached yet (online): D has no known next use; concurrent tasks take the minimum
    t2 = task("u", [("a", "D", ())])
    got = next_start_times(SimpleNamespace(tasks={"t": task("t", [("a", "A", ()), ("b", "B", ("a",))]), "u": t2}),
                           lambda tid, sid: 4.0)
    assert got == {"A": 0.0, "B": 4.0, "D": 0.0}


def test_a_shown_stage_whose_parent_is_hidden_is_an_error_naming_it():
    bad = TaskView("t", 0.0, "w", {"b": StageView("b", "B", 10, ("a",), ())}, ("b",), frozenset(), {})
    with pytest.raises(ValueError, match="'a'"):
        next_start_times(SimpleNamespace(tasks={"t": bad}), lambda tid, sid: 1.0)


def test_a_horizon_below_one_is_refused():
    with pytest.raises(PolicyError, match="horizon"):
        make_policy("topas-both", horizon=0)


# ---------------------------------------------------------------- the strategy's order
def entry(agent: str, last: float, kind=SEGMENT, serial=1) -> Evictable:
    tie = (1, agent) if kind == PREFIX else (0, serial)
    return Evictable(kind, agent, 10, last, 1, 0, serial, tie, f"{agent}{serial}")


def test_the_policy_strategy_evicts_the_agent_needed_latest_first_then_lru():
    s = eviction_strategy("policy")
    s.take_values({"X": 0.0, "Y": 2.0, "Z": math.inf})
    es = [entry("X", 1.0, serial=1), entry("Y", 5.0, serial=2), entry("Y", 3.0, LEAF, serial=3),
          entry("Z", 9.0, PREFIX), entry("W", 7.0, serial=4)]  # W: no value, never needed
    order = [e.key for e in sorted(es, key=lambda e: (s.priority(e), e.tie))]
    assert order == ["W4", "Z1", "Y3", "Y2", "X1"]  # W and Z both never: LRU between them
    with pytest.raises(ValueError, match="'X'"):
        s.take_values({"X": float("nan")})


def test_the_engine_refuses_a_policy_without_eviction_values():
    with pytest.raises(ValueError, match="'lpm' has none"):
        run_row(Experiment("chain-3", "lpm", load=1.0, n_tasks=10, engine_options={"eviction": "policy"}))


# ---------------------------------------------------------------- the policy in the engine
def _row(policy: str, eviction: str, **params):
    return run_row(Experiment("dag-10-wide", policy, params, load=1.2, seed=100, n_tasks=40,
                              engine_options={"eviction": eviction}))


def test_topas_both_is_deterministic_and_its_eviction_changes_the_run():
    a, b = _row("topas-both", "policy"), _row("topas-both", "policy")
    keys = ("jct_mean", "jct_p99", "prefix_evictions", "cached_tokens")
    assert [a[k] for k in keys] == [b[k] for k in keys]
    # under the engine's LRU it is TOPAS+ (the admission order is TOPAS+'s, untouched)
    assert _row("topas-both", "lru")["jct_mean"] == _row("topas-plus", "lru")["jct_mean"]


def test_the_hook_is_asked_before_eviction_passes_with_the_engines_view(monkeypatch):
    from topas.policies.topas_both import TopasBoth

    seen: list[float] = []
    orig = TopasBoth.eviction_values

    def spy(self, view):
        seen.append(view.time)
        return orig(self, view)

    monkeypatch.setattr(TopasBoth, "eviction_values", spy)
    _row("topas-both", "policy")
    assert seen and seen == sorted(seen)


def test_the_selection_reads_tuning_seeds_only():
    spec = importlib.util.spec_from_file_location("select_topas_both", REPO_ROOT / "scripts" / "select_topas_both.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.SEEDS is TUNING_SEEDS
    pairs = mod.experiments(8, 3)
    assert {e.seed for _, e in pairs} == {100, 101, 102}
    assert {e.workload for _, e in pairs} == {"chain-3", "dag-4", "dag-10-wide"}


def test_in_the_engine_under_online_visibility_only_reached_stages_give_a_next_use(monkeypatch):
    """With ``dag_visibility="online"`` an agent gets a value below the cap only if a stage the
    engine's view shows (reached, unfinished) is its, and the view never shows a whole task early."""
    from topas.policies.topas_both import TopasBoth

    checked = []
    orig = TopasBoth.eviction_values

    def spy(self, view):
        vals = orig(self, view)
        shown = {tv.stages[s].agent for tv in view.tasks.values() for s in tv.stages if s not in tv.done}
        assert {a for a, v in vals.items() if v < self.params.horizon + 1} <= shown
        checked.append(any(not tv.complete for tv in view.tasks.values()))
        return vals

    monkeypatch.setattr(TopasBoth, "eviction_values", spy)
    run_row(Experiment("dag-10-wide", "topas-both", load=1.2, seed=100, n_tasks=40, dag_visibility="online",
                       engine_options={"eviction": "policy"}))
    assert checked and any(checked)  # some pass saw a partial task
