"""KVFlow's Agent Step Graph, as pure functions (Pan et al., "KVFlow: Efficient Prefix Caching for
Accelerating LLM-Based Multi-Agent Workflows", arXiv 2507.07400, NeurIPS 2025; docs/method.md, "KVFlow").

KVFlow gives every agent a *steps-to-execution* value, how many workflow steps remain before the
agent is invoked again, and derives from it each radix node's eviction priority and the set of
agents whose prefixes it prefetches from host memory:

* a stage that is ready (waiting or running) is due now: 0 steps;
* a stage not ready yet is one step after its parents: an AND-join (the stage waits for all its
  parents, the only join a ``topas.trace`` DAG has) takes the maximum of its unfinished parents'
  steps + 1, an OR-join (it runs once any parent is done) the minimum;
* an agent's value is the minimum over the unfinished stages it serves, in every running task
  (concurrent workflows: the minimum over them);
* a radix node's value is the minimum over the agents using it of ``min(steps, H + 1)`` (``H``,
  KVFlow's ``evict_pri_level``, 4 by default; an agent no known stage waits for counts ``H + 1``),
  and ``H + 2`` for a node no known agent uses (KVFlow's ``AgentManager.get_node_hold_priority``);
* eviction runs in passes (``HiRadixCache.evict``): first the leaves whose value is at least
  ``H - 1``, then at least ``H - 2``, ... at least 1, and at last every leaf (plain order);
* prefetch loads the host-resident prefixes of the agents due within ``L`` steps (KVFlow's
  ``load_ahead_step``, 2 by default), nearest first (``DispatchLoadTasks``).

Everything here reads only what an :class:`topas.engine.view.EngineView` shows: the tasks that
have arrived, and of each the stages the run's DAG visibility reveals (``topas.engine.knowledge``:
under ``online`` visibility only the ready, running and finished stages, so an agent is known to
be due only once one of its stages is ready). No output length, no future arrival.
"""

from __future__ import annotations

import dataclasses
from typing import Collection, Iterable, Mapping

from topas.engine.view import EngineView, TaskView

#: KVFlow's default eviction horizon ``H`` (``ServerArgs.evict_pri_level`` in its SGLang fork)
DEFAULT_HORIZON = 4
#: KVFlow's default prefetch look-ahead ``L`` (``ServerArgs.load_ahead_step``)
DEFAULT_LOOKAHEAD = 2


def stage_steps(task: TaskView, or_joins: Collection[str] = ()) -> dict[str, int]:
    """Steps-to-execution of each unfinished stage of ``task`` that the view shows.

    A stage is ready (0) when all its parents are done (an OR-join, named in ``or_joins``: when
    any parent is done, or it has none); otherwise an AND-join is one step after the latest of its
    unfinished parents (max), an OR-join one step after the earliest (min). A parent the view does
    not show (it cannot happen: a shown stage's parents are shown) raises ``ValueError``.
    """
    out: dict[str, int] = {}
    done = task.done
    for sid in task.topo_order:
        if sid in done:
            continue
        st = task.stages[sid]
        pending = [p for p in st.parents if p not in done]
        if not pending or (sid in or_joins and len(pending) < len(st.parents)):
            out[sid] = 0
            continue
        for p in pending:
            if p not in out:
                raise ValueError(f"task {task.id!r}: stage {sid!r} has parent {p!r}, which the view does not show "
                                 "before it")
        ahead = [out[p] + 1 for p in pending]
        out[sid] = min(ahead) if sid in or_joins else max(ahead)
    return out


def agent_steps(tasks: Iterable[TaskView], or_joins: Collection[str] = ()) -> dict[str, int]:
    """Each agent's steps-to-execution: the minimum over the unfinished stages it serves in all
    ``tasks`` (concurrent workflows take the minimum). Agents no shown stage waits for are absent.
    Keys are in first-seen order (tasks in the given order, stages in topological order)."""
    out: dict[str, int] = {}
    for task in tasks:
        for sid, s in stage_steps(task, or_joins).items():
            a = task.stages[sid].agent
            if a not in out or s < out[a]:
                out[a] = s
    return out


def view_agent_steps(view: EngineView) -> dict[str, int]:
    """:func:`agent_steps` over the tasks an engine view shows (AND-joins: ``topas.trace`` DAGs)."""
    return agent_steps(view.tasks[t] for t in sorted(view.tasks))


class AgentStepCache:
    """:func:`view_agent_steps` with each task's stage steps kept while the engine shows the same
    :class:`TaskView` object (the simulator rebuilds a task's view only when the task changes), so
    a pass over many views costs only the tasks that moved. Same results as the function."""

    def __init__(self) -> None:
        self._tasks: dict[str, tuple[TaskView, dict[str, int]]] = {}

    def agent_steps(self, view: EngineView) -> dict[str, int]:
        out: dict[str, int] = {}
        kept: dict[str, tuple[TaskView, dict[str, int]]] = {}
        for tid in sorted(view.tasks):
            task = view.tasks[tid]
            hit = self._tasks.get(tid)
            if hit is None or hit[0] is not task:
                hit = (task, stage_steps(task))
            kept[tid] = hit
            stages = task.stages
            for sid, s in hit[1].items():
                a = stages[sid].agent
                if a not in out or s < out[a]:
                    out[a] = s
        self._tasks = kept
        return out


def node_value(agents: Iterable[str | None], steps: Mapping[str, int], horizon: int = DEFAULT_HORIZON) -> int:
    """A radix node's KVFlow value: the minimum over the ``agents`` using it of
    ``min(steps, horizon + 1)`` (an agent absent from ``steps``: ``horizon + 1``), and
    ``horizon + 2`` when no known agent uses it (``agents`` empty or only ``None``)."""
    _check_horizon(horizon)
    best = horizon + 2
    for a in agents:
        if a is None:
            continue
        best = min(best, min(steps.get(a, horizon + 1), horizon + 1))
    return best


def eviction_pass(value: int, horizon: int = DEFAULT_HORIZON) -> int:
    """The pass (0 first) in which KVFlow's eviction takes a leaf of node value ``value``: pass
    ``k`` (``k = 0 .. horizon - 2``) takes the leaves of value ``>= horizon - 1 - k``, the last
    pass (``horizon - 1``) every leaf left, i.e. those of value 0 (``HiRadixCache.evict``:
    ``steps`` from ``hold_step - 1`` down to 1, then ``ignore_holding``)."""
    _check_horizon(horizon)
    if value < 0:
        raise ValueError(f"KVFlow node value must be >= 0, got {value}")
    return horizon - 1 - min(value, horizon - 1)


def prefetch_order(steps: Mapping[str, int], lookahead: int = DEFAULT_LOOKAHEAD) -> tuple[str, ...]:
    """The agents whose host-resident prefixes KVFlow prefetches: those due within ``lookahead``
    steps, nearest first, ties by name (``DispatchLoadTasks`` walks steps 0 .. L)."""
    if lookahead < 0:
        raise ValueError(f"KVFlow prefetch look-ahead L must be >= 0, got {lookahead}")
    return tuple(a for _, a in sorted((s, a) for a, s in steps.items() if s <= lookahead))


def sglang_priority(value: int, horizon: int = DEFAULT_HORIZON) -> int:
    """The integer for stock SGLang's ``--radix-eviction-policy priority`` (its
    ``PriorityStrategy`` evicts lower values first): ``horizon + 2 - value``, so a node due now
    gets ``horizon + 2`` and one no known agent uses gets 0."""
    _check_horizon(horizon)
    return horizon + 2 - min(value, horizon + 2)


def kvflow_request_priority(view: EngineView, task_id: str, stage_id: str, horizon: int = DEFAULT_HORIZON) -> int:
    """A request's KVFlow priority as an integer, for SGLang's request ``priority`` field under
    ``--radix-eviction-policy priority`` (higher kept longer): :func:`sglang_priority` of the node
    value its agent will have once it is done, i.e. of the agent's steps-to-execution in ``view``
    with stage ``stage_id`` of task ``task_id`` counted as finished (the KV the request leaves
    cached matters for the agent's next call, not for this one). A task or stage the view does not
    show raises ``KeyError`` naming it."""
    if task_id not in view.tasks:
        raise KeyError(f"task {task_id!r} is not in the view")
    tasks = []
    for tid in sorted(view.tasks):
        t = view.tasks[tid]
        if tid == task_id:
            if stage_id not in t.stages:
                raise KeyError(f"stage {stage_id!r} of task {task_id!r} is not in the view")
            t = dataclasses.replace(t, done=t.done | {stage_id})
        tasks.append(t)
    agent = view.tasks[task_id].stages[stage_id].agent
    return sglang_priority(node_value((agent,), agent_steps(tasks), horizon), horizon)


def _check_horizon(horizon: int) -> None:
    if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
        raise ValueError(f"KVFlow eviction horizon H must be an integer >= 1, got {horizon!r}")
