"""Parrot-FCFS: application-level FIFO with prefix-sharing affinity.

Reproduces the scheduling of Parrot (Lin et al., "Parrot: Efficient Serving of LLM-based
Applications with Semantic Variable", OSDI 2024) on one engine, as the paper's "Parrot-FCFS"
baseline and docs/method.md "Baselines" describe it. As we read Parrot, it sees an application's
requests as a DAG (through Semantic Variables), schedules at the level of applications rather
than of individual requests, and co-schedules requests that share a prompt prefix so that the
prefix's KV is computed once and shared; the paper's baseline is its FIFO variant. Its other
mechanisms (multi-engine dispatch, latency- vs throughput-objective deduction, per-engine batch
sizing) have no counterpart on our single engine and are not modelled.

The order, precisely:

1. *Application-level FIFO.* Each waiting request gets the key ``(task arrival, task id,
   position of its stage in the task's topological order, request id)``: earlier tasks first,
   and within a task, DAG order (``TaskView.topo_order``, a deterministic topological order).
2. *Prefix grouping* (``group_prefixes=True``, the default). Requests are grouped by agent (in
   our model two requests share a prefix exactly when they share an agent). Groups are ordered by
   the FIFO key of their first (earliest) request, and requests keep FIFO order inside a group.
   Equivalently: walk the FIFO order; when a request of agent ``a`` is reached, all other waiting
   requests of agent ``a`` are placed right after it. With ``group_prefixes=False`` the order is
   plain application-level FIFO.

Interpretations we had to make (Parrot's paper describes the mechanisms, not this exact rule):

- grouping pulls *every* waiting request of the head agent forward, including those of much later
  tasks; Parrot batches shared-prefix requests together for the same reason (one prefix, one big
  batch), at the cost of strict FIFO between applications;
- there is no preemption and no prefix management: the engine walks the order, stops at the
  first request that does not fit, loads prefixes on demand and evicts unreferenced ones by LRU
  (SGLang's radix cache). Parrot's prefix affinity is therefore expressed only through the order.
"""

from __future__ import annotations

from dataclasses import dataclass

from topas.engine.view import Decision, EngineView, RequestView
from topas.policies.base import Policy, register


@dataclass(frozen=True)
class ParrotParams:
    #: Group same-agent (same-prefix) requests behind the earliest one (Parrot's prefix affinity).
    group_prefixes: bool = True


@register
class ParrotFCFS(Policy):
    name = "parrot-fcfs"
    Params = ParrotParams

    def decide(self, view: EngineView) -> Decision:
        tasks = view.tasks

        def fifo(r: RequestView):
            t = tasks[r.task_id]
            return (t.arrival, t.id, t.topo_order.index(r.stage_id), r.rid)

        order = sorted(view.waiting, key=fifo)
        if self.params.group_prefixes:
            groups: dict[str, list[RequestView]] = {}  # insertion order = earliest request's order
            for r in order:
                groups.setdefault(r.agent, []).append(r)
            order = [r for group in groups.values() for r in group]
        return Decision(admit=tuple(r.rid for r in order))
