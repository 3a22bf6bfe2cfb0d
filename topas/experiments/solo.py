"""Unloaded service times from the cost model: what one request, or one task, takes alone.

The simulator (:mod:`topas.engine.simulator`) serves a request ``v`` of agent ``a`` whose prefix
(``l_a`` tokens) is already cached as follows: its suffix (``x_v`` tokens) is prefilled in chunks
of at most ``C`` tokens (``EngineConfig.max_prefill_tokens``, else the profile's), chunk ``k``
attending to the ``l_a + k*C`` tokens before it; that prefill produces the first output token;
then one decode step per remaining output token (``y_v - 1`` steps), each at batch size 1 over a
context that starts at ``l_a + x_v + 1`` tokens and grows by one per step. Alone on an empty
engine, that is :func:`stage_solo_time`: the *unloaded* service time of the request.

Two derived quantities:

* :func:`task_critical_path` -- the longest path of a task's DAG under those times (plus
  ``request_latency_s`` per stage: the simulator delays a root by half of it, every other stage
  by all of it, and the task's end by half of it): the task's JCT alone, prefixes cached
  (:mod:`studies.claims.headroom` argues when it is a lower bound under load);
* :func:`task_work` -- the sum of the task's stage times: the server time the task needs alone,
  used by :mod:`topas.experiments.capacity` as a work unit that does not depend on which tasks a
  policy happens to finish first.
"""

from __future__ import annotations

from typing import Mapping

from topas.engine.config import EngineConfig
from topas.engine.cost import CostModel
from topas.workload.critical_path import longest_path_from
from topas.workload.model import Stage, Task, Trace

__all__ = ["chunk_size", "prefill_solo_time", "decode_solo_time", "stage_solo_time",
           "stage_solo_times", "task_critical_path", "task_work"]


def chunk_size(cost: CostModel, config: EngineConfig | None = None) -> int:
    """``C``: tokens prefilled per iteration (the config's ``max_prefill_tokens``, else the profile's)."""
    return (config.max_prefill_tokens if config is not None else None) or cost.max_prefill_tokens


def prefill_solo_time(cost: CostModel, n_new: int, n_cached: int, chunk: int) -> float:
    """Seconds to prefill ``n_new`` tokens on top of ``n_cached`` cached ones, alone, in chunks of
    ``chunk`` tokens (each chunk one iteration, attending to everything before it)."""
    t = 0.0
    for start in range(0, n_new, chunk):
        t += cost.prefill_time([(min(chunk, n_new - start), n_cached + start)])
    return t


def decode_solo_time(cost: CostModel, context0: int, steps: int) -> float:
    """Seconds for ``steps`` decode steps at batch size 1, the context starting at ``context0``."""
    return cost.decode_steps_time(1, context0, steps) if steps > 0 else 0.0


def stage_solo_time(cost: CostModel, stage: Stage, prefix_tokens: int, chunk: int) -> float:
    """The unloaded service time of one request (see the module docstring): its suffix prefill on
    the cached prefix ``l_a = prefix_tokens``, then ``y_v - 1`` decode steps at batch size 1."""
    x, y = stage.input_tokens, stage.output_tokens
    return (prefill_solo_time(cost, x, prefix_tokens, chunk)
            + decode_solo_time(cost, prefix_tokens + x + 1, y - 1))


def stage_solo_times(trace: Trace, task: Task, cost: CostModel, config: EngineConfig | None = None
                     ) -> dict[str, float]:
    """:func:`stage_solo_time` of every stage of ``task`` (by stage id)."""
    c = chunk_size(cost, config)
    return {s.id: stage_solo_time(cost, s, trace.agents[s.agent].prefix_tokens, c) for s in task.stages}


def task_critical_path(trace: Trace, task: Task, cost: CostModel, config: EngineConfig | None = None,
                       times: Mapping[str, float] | None = None) -> float:
    """The longest path through ``task``'s DAG of :func:`stage_solo_time` plus
    ``config.request_latency_s`` per stage: the task's JCT alone on an empty engine with its
    prefixes cached."""
    z = dict(times) if times is not None else stage_solo_times(trace, task, cost, config)
    lat = config.request_latency_s if config is not None else 0.0
    lp = longest_path_from(task.topo_order, task.children, lambda v: z[v] + lat)
    return max(lp.values(), default=0.0)


def task_work(trace: Trace, task: Task, cost: CostModel, config: EngineConfig | None = None) -> float:
    """The sum of ``task``'s :func:`stage_solo_time`: the server time it needs alone."""
    return sum(stage_solo_times(trace, task, cost, config).values())
