"""TOPAS+ (``topas-plus``): our TOPAS variant for engines without a host KV tier. Not the paper's.

On stock SGLang (radix cache, no host tier) an evicted prefix is recomputed, and what keeps the
cache hot is the *order* in which the waiting queue is admitted, not explicit prefix moves:
SGLang's LPM ("cached prefix first") drains the agents whose prefixes are resident before it lets
another agent's prefix in, like an exhaustive polling server that pays a switch-over only when a
queue runs dry. TOPAS (our reading of the paper) instead pins a chosen prefix set R', admits only
agents in R' and reserves output by an estimate, so it idles capacity and preempts; its useful
part is the critical-path view of a task. TOPAS+ keeps that part and drops the rest:

* it returns an admission **order** only (``manages_prefixes = False``): the engine admits in that
  order while memory allows and manages the radix cache itself (work-conserving, no pinning, no
  preemption, no output reservation of ours);
* **residency first** (tier 1): requests whose agent prefix is resident come before the others,
  as in LPM (without LPM's FCFS fallback above 128 waiting requests), so a prefix is recomputed
  only when its agents' queues have run dry. Unlike SGLang's LPM (``topas.policies.lpm``) the
  tier counts a prefix a prefill is still computing as resident;
* **the in-batch guard** (``in_batch_guard``, on; ``topas.engine.view.admit_cap``, the rule
  TOPAS's plans follow): of an agent whose prefix is not in the radix tree, the order holds one
  request (it computes the prefix) and the others wait for a later decision, none while a
  request computes it, so the engine never computes one copy of the prefix per request (TOPAS+
  was first selected without it; docs/topas_plus.md);
* **critical-path priority** inside a tier: a task's priority is ``g_i(t) * Delta_i / L_i``, the
  share of its remaining expected critical path ``L_i(H, t)`` that admitting its whole ready
  frontier commits (``Delta_i = Delta_task(F | H, t)``, TOPAS's J_admit term, but normalised by
  the remaining path so that it is dimensionless and does not favour long tasks), times linear
  aging ``g_i(t) = 1 + (t - tau_i) / H_age``. Every ready stage of a task gets the task's
  priority (siblings are never split into 1/k shares);
* two options the selection turned down (kept as parameters, off by default): **whole groups**
  for prefixes not resident (``group``: each cold agent's requests admitted together, agents
  ranked by their best or summed priority; it lost 3-14% on DAG-10-Wide, where it lets a cold
  agent's low-priority requests jump ahead of other agents' urgent ones) and a **starvation
  bound** (``starve_s``: a request waiting longer than that goes ahead of both tiers, oldest
  first; at 300 s it changed no result on the synthetic workloads: linear aging already bounds the
  tail).

Service times come from ``topas.policies.estimates`` as in TOPAS (outputs learned from finished
calls, never a request's true length). Deterministic: ties break by ready time and request id.
How the design and its parameters were chosen (synthetic workloads only, never MetaGPT):
``scripts/select_topas_plus.py``, ``data/results/selection/topas_plus_selection.csv`` and
``docs/topas_plus.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from topas.engine.view import Decision, EngineView, RequestView, within_caps
from topas.policies.base import Policy, PolicyError, register
from topas.policies.estimates import OperatingPoint, StageParts, make_estimator
from topas.policies.history import WorkflowHistory
from topas.policies.topas_terms import longest_path_pair


@dataclass(frozen=True)
class TopasPlusParams:
    #: requests of resident prefixes first (LPM's cache protection)
    residency_first: bool = True
    #: priority inside a tier: "path" (g_i * Delta_i / L_i), "fcfs" (ready time)
    rank: Literal["path", "fcfs"] = "path"
    #: linear aging horizon H_age (s): g_i(t) = 1 + (t - tau_i) / H_age; 0 turns aging off
    #: (selected among 0, 20, 60, 200 s: 60 by scripts/select_topas_plus.py, then 200 with the
    #: in-batch guard on by scripts/select_plan_execution.py)
    H_age: float = 200.0
    #: non-resident requests as whole agent groups: "off" (request by request), "max" (groups
    #: ranked by their best request), "sum" (by their summed priority)
    group: Literal["off", "max", "sum"] = "off"
    #: a request waiting longer than this (s) goes first; 0 turns the bound off
    starve_s: float = 0.0
    #: prior pseudo-observations of each agent's expected output length
    prior_weight: int = 1
    #: output lengths: "online" (learned from finished calls) or "prior" (see estimates)
    output_estimator: Literal["online", "prior"] = "online"
    #: the in-batch guard (``topas.engine.view.admit_cap``): of an agent whose prefix is not in
    #: the radix tree, one request in the order (none while a request computes the prefix); the
    #: others wait until it is cached instead of each computing a copy. Off: the order as first
    #: selected
    in_batch_guard: bool = True

    def __post_init__(self) -> None:
        checks = {"H_age": self.H_age >= 0, "starve_s": self.starve_s >= 0, "prior_weight": self.prior_weight >= 0}
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise PolicyError(f"topas-plus parameter {bad[0]}={getattr(self, bad[0])!r} is out of range")


def path_priority(delta: float, remaining: float, age: float, h_age: float) -> float:
    """``g_i(t) * Delta_i / L_i``: the aged share of the remaining critical path committed."""
    share = delta / remaining if remaining > 0 else 1.0
    g = 1.0 + age / h_age if h_age > 0 else 1.0
    return g * share


@register
class TopasPlus(Policy):
    name = "topas-plus"
    Params = TopasPlusParams

    def reset(self) -> None:
        self.estimator = make_estimator(self.params.output_estimator, self.params.prior_weight)
        self.history = WorkflowHistory()
        self._parts = StageParts()

    def on_finish(self, request: RequestView, time: float, output_tokens: int) -> None:
        self.estimator.observe(request.agent, output_tokens)

    def priorities(self, view: EngineView) -> dict[str, float]:
        """Each waiting task's priority ``g_i(t) * Delta_task(F | H, t) / L_i(H, t)``."""
        p = self.params
        est = self.estimator
        tpot = OperatingPoint.of(view).tpot
        tasks = self.history.tasks(view)
        memo: dict[tuple[str, int, int], float] = {}
        parts = self._parts

        def residual(agent: str, x: int, g: int) -> float:
            """``stage_residual_time``, its two parts kept across decisions (``StageParts``)."""
            key = (agent, x, g)
            v = memo.get(key)
            if v is None:
                pv = view.prefixes[agent]
                v = memo[key] = parts.prefill(view, x + g, pv.tokens) + parts.remaining(
                    est, agent, pv.expected_output_tokens, g) * tpot
            return v

        gen = {r.rid: r.generated for r in view.running}
        running: dict[str, set[str]] = {}
        for r in view.running:
            running.setdefault(r.task_id, set()).add(r.stage_id)
        frontier: dict[str, list[str]] = {}
        for r in view.waiting:
            gen[r.rid] = r.generated
            frontier.setdefault(r.task_id, []).append(r.stage_id)
        out: dict[str, float] = {}
        for tid, ready in frontier.items():
            tv = tasks[tid]
            order = tuple(s for s in tv.topo_order if s not in tv.done)
            children = {s: tv.stages[s].children for s in order}
            res = {s: residual(tv.stages[s].agent, tv.stages[s].input_tokens, gen.get(f"{tid}/{s}", 0)) for s in order}
            # L_i(H, t) and L_i(H + F, t) in one pass, as ``expected_longest_path`` computes each
            before, after = longest_path_pair(order, children, res, running.get(tid, ()), ready)
            out[tid] = path_priority(before - after, before, view.time - tv.arrival, p.H_age)
        return out

    def decide(self, view: EngineView) -> Decision:
        if not view.waiting:
            return Decision()
        p = self.params
        prio = self.priorities(view) if p.rank == "path" else {}
        now = view.time

        def starving(r: RequestView) -> bool:
            return p.starve_s > 0 and now - r.ready_time > p.starve_s

        def tier(r: RequestView) -> int:
            if starving(r):
                return 0
            if p.residency_first and not view.prefixes[r.agent].resident:
                return 2
            return 1

        def within(r: RequestView) -> tuple:
            return (-prio.get(r.task_id, 0.0), r.ready_time, r.rid)

        head = sorted((r for r in view.waiting if tier(r) == 0), key=lambda r: (r.ready_time, r.rid))
        hot = sorted((r for r in view.waiting if tier(r) == 1), key=within)
        cold = sorted((r for r in view.waiting if tier(r) == 2), key=within)
        if p.group != "off" and cold:
            groups: dict[str, list[RequestView]] = {}
            for r in cold:
                groups.setdefault(r.agent, []).append(r)
            if p.group == "sum":
                weight = {a: sum(prio.get(r.task_id, 1.0) for r in rs) for a, rs in groups.items()}
                ranked = sorted(groups, key=lambda a: (-weight[a], within(groups[a][0])))
            else:  # groups keep the order of their best request (dicts keep insertion order)
                ranked = list(groups)
            cold = [r for a in ranked for r in groups[a]]
        order = head + hot + cold
        if p.in_batch_guard:  # past an agent's admit cap: held back until its prefix is cached
            order, _ = within_caps(order, view.admit_cap)
        return Decision(admit=tuple(r.rid for r in order))
