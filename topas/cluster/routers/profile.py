"""What a profiler tells a router about a request before it runs (shared by several routers).

Only profiled quantities: an agent's prefix length and output prior (``ClusterInfo``, as the
policies see them), the request's own input length, the engine's cost model, the task's public
DAG. Never an output length.
"""

from __future__ import annotations

import math
from typing import Callable

from topas.cluster.state import ClusterInfo, RouteRequest
from topas.engine.view import TaskView


def expected_duration(info: ClusterInfo, agent: str, x: int, engine: int, ref_batch: int) -> float:
    """Expected seconds of a request of ``agent`` with ``x`` input tokens on ``engine``: its
    prefill on the cached prefix, ``prefill_time([(x, l_a)])``, plus ``ceil(prior_a)`` decode steps
    of a batch of ``ref_batch`` requests each holding ``l_a + x + prior_a / 2`` tokens."""
    l, out = info.prefix_tokens[agent], info.output_priors[agent]
    cost = info.costs[engine]
    steps = max(0, math.ceil(out))
    tpot = cost.decode_time(ref_batch, int(ref_batch * (l + x + out / 2)))
    return cost.prefill_time([(x, l)]) + steps * tpot


def path_to_end(task: TaskView, weight: Callable[[str], float]) -> dict[str, float]:
    """For every stage of ``task``: the largest sum of ``weight`` over a path from it to the end of
    the DAG, itself included (the stages the task shows: under online DAGs, those reached so far)."""
    memo: dict[str, float] = {}
    for s in reversed(task.topo_order):
        st = task.stages[s]
        memo[s] = weight(s) + max((memo[c] for c in st.children if c in memo), default=0.0)
    return memo


def remaining_path(info: ClusterInfo, req: RouteRequest, ref_batch: int, engine: int = 0) -> float:
    """Expected seconds on ``engine`` of the longest path from ``req``'s stage to its task's end
    (itself included); its own duration when its task's DAG is not shown."""
    tv = req.task
    if tv is None or req.stage_id not in tv.stages:
        return expected_duration(info, req.agent, req.input_tokens, engine, ref_batch)
    st = tv.stages
    return path_to_end(tv, lambda s: expected_duration(info, st[s].agent, st[s].input_tokens, engine, ref_batch))[
        req.stage_id]


def descendants(task: TaskView | None, stage: str) -> int:
    """How many stages of ``task`` depend on ``stage``, directly or not (0 without a DAG)."""
    if task is None or stage not in task.stages:
        return 0
    seen: set[str] = set()
    todo = list(task.stages[stage].children)
    while todo:
        s = todo.pop()
        if s in seen or s not in task.stages:
            continue
        seen.add(s)
        todo.extend(task.stages[s].children)
    return len(seen)
