"""TOPAS-both (``topas-both``): TOPAS+'s admission order plus an eviction order from the same
workflow knowledge. Ours, not the paper's (docs/topas_plus.md, "TOPAS-both").

TOPAS+ (``topas.policies.topas_plus``) decides only the admission order and leaves the radix
cache to SGLang's LRU. Both the critical-path view of a task (TOPAS+) and KVFlow's
steps-to-execution (arXiv 2507.07400) are readings of one quantity, *when will this agent's KV
be used next*; this policy computes that per agent from the tasks its view shows and hands it to
the engine's ``policy`` eviction strategy (``topas.engine.eviction_policy``, through
:meth:`Policy.eviction_values`), so that the cached KV of the agents needed latest goes first.
The admission order is TOPAS+'s, unchanged (same parameters, same estimator); run it with
``EngineConfig.eviction = "policy"`` (``topas simulate --eviction policy``), otherwise the engine
evicts by its own strategy and the policy is TOPAS+.

Two readings of "next use" (parameter ``next_use``), over the stages the view shows only (under
``online`` DAG visibility a stage not yet reached does not count: no history completion here, no
output length, no future arrival):

* ``"steps"`` (KVFlow's reading): the agent's steps-to-execution (a ready or running stage 0, a
  stage after its unfinished parents one more than the latest of them;
  ``topas.engine.kvflow_steps.agent_steps``), capped at ``horizon + 1``, the value of an agent
  no shown stage waits for (KVFlow's ``min(steps, H + 1)``);
* ``"time"`` (the critical-path reading): the expected time (s) until the agent's earliest
  unfinished shown stage can start: 0 for a ready or running stage, else the latest expected
  finish of its unfinished parents, each stage's expected duration being TOPAS+'s residual
  (prefill time from the cost model plus the estimator's expected remaining output times the
  operating point's TPOT; ``topas.policies.estimates``); an agent no shown stage waits for
  counts ``math.inf``;
* ``"order"`` (the admission order's reading): ``"steps"``, and among the agents with a waiting
  request (due now) the one whose first waiting request TOPAS+'s admission order puts earlier is
  needed sooner: ``steps + position / n_waiting`` (an agent due now with running requests only
  keeps 0).

Which reading (and horizon) is the default was chosen by ``scripts/select_topas_both.py`` on tuning
seeds and the synthetic workloads only, by a rule fixed before the runs (docs/topas_plus.md).
Deterministic: tasks are visited in sorted id order, stages in topological order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from topas.engine.view import EngineView
from topas.policies.base import PolicyError, register
from topas.policies.estimates import OperatingPoint
from topas.engine.kvflow_steps import agent_steps
from topas.policies.topas_plus import TopasPlus, TopasPlusParams


@dataclass(frozen=True)
class TopasBothParams(TopasPlusParams):
    #: the reading of an agent's next use: "steps" (KVFlow's steps-to-execution) or "time"
    #: (expected seconds until its next stage can start) or "order" ("steps", agents due now
    #: ranked by where TOPAS+'s admission order puts their first waiting request)
    next_use: Literal["steps", "time", "order"] = "steps"
    #: ``"steps"`` only: values are capped at ``horizon + 1`` (KVFlow's ``H``, ``evict_pri_level``)
    horizon: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.horizon < 1:
            raise PolicyError(f"topas-both parameter horizon={self.horizon!r} is out of range (>= 1)")


def next_start_times(view: EngineView, duration) -> dict[str, float]:
    """Each agent's expected time (s from now) until its earliest unfinished stage the view shows
    can start: a stage whose parents are all done (ready, waiting or running) 0, another the
    latest ``start + duration`` of its unfinished parents. ``duration(task_id, stage_id)`` is the
    stage's expected remaining duration. Agents no shown stage waits for are absent; keys in
    first-seen order (tasks by sorted id, stages in topological order)."""
    out: dict[str, float] = {}
    for tid in sorted(view.tasks):
        tv = view.tasks[tid]
        finish: dict[str, float] = {}
        for sid in tv.topo_order:
            if sid in tv.done:
                continue
            st = tv.stages[sid]
            start = 0.0
            for p in st.parents:
                if p in tv.done:
                    continue
                if p not in finish:
                    raise ValueError(f"task {tid!r}: stage {sid!r} has parent {p!r}, which the view does not show "
                                     "before it")
                start = max(start, finish[p])
            finish[sid] = start + duration(tid, sid)
            if start < out.get(st.agent, math.inf):
                out[st.agent] = start
    return out


@register
class TopasBoth(TopasPlus):
    name = "topas-both"
    Params = TopasBothParams

    def eviction_values(self, view: EngineView) -> dict[str, float]:
        """Every agent of ``view.prefixes`` -> its next-use value (see the module docstring)."""
        p = self.params
        if p.next_use in ("steps", "order"):
            steps = agent_steps(view.tasks[t] for t in sorted(view.tasks))
            cap = p.horizon + 1
            out = {a: float(min(steps.get(a, cap), cap)) for a in view.prefixes}
            if p.next_use == "order" and view.waiting:
                agent_of = {r.rid: r.agent for r in view.waiting}
                admit = self.decide(view).admit
                first: dict[str, int] = {}
                for i, rid in enumerate(admit):
                    first.setdefault(agent_of[rid], i)
                for a, i in first.items():
                    out[a] += i / len(admit)
            return out
        times = next_start_times(view, self._durations(view))
        return {a: times.get(a, math.inf) for a in view.prefixes}

    def _durations(self, view: EngineView):
        """``(task_id, stage_id) -> expected remaining duration`` (TOPAS+'s residual)."""
        est = self.estimator
        tpot = OperatingPoint.of(view).tpot
        gen = {r.rid: r.generated for r in view.running + view.waiting}
        memo: dict[tuple[str, int, int], float] = {}

        def duration(tid: str, sid: str) -> float:
            st = view.tasks[tid].stages[sid]
            g = gen.get(f"{tid}/{sid}", 0)
            key = (st.agent, st.input_tokens, g)
            v = memo.get(key)
            if v is None:
                pv = view.prefixes[st.agent]
                v = memo[key] = view.cost.prefill_time([(st.input_tokens + g, pv.tokens)]) + est.expected_remaining(
                    st.agent, pv.expected_output_tokens, g) * tpot
            return v

        return duration
