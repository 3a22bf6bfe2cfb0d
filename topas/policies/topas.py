"""TOPAS: joint prefix residency and admission (docs/method.md), and its ablations.

At each scheduling point TOPAS picks a post-decision state (R', Q') -- the agent prefixes to
keep resident and the requests to run -- maximising

    Score(R', Q') = J_admit - J_move - J_redo - J_revoke + V_reuse

subject to ``sum_{a in R'} l_a + sum_{r in Q'} d_r(t) <= B_t`` (``topas_terms`` has each term).

* ``d_r(t)``: a request's own KV demand = suffix input + generated tokens + ``output_reserve``
  times its expected remaining output (the estimator in ``estimates``; never the true length).
* GREEDYPACK(R'): fill the budget left by R' and the kept running requests with waiting
  requests of agents in R', largest age-weighted conditional progress ``g_i(t) * Delta_task``
  first, until nothing more fits, the gain is <= 0, or K admissions.
  *Sequential conditioning and parallel siblings.* Within one decision the only admissible
  stages of a task are its ready frontier F (waiting stages; the running ones are in H). For a
  single ready stage (every chain stage, and any stage alone in its frontier) the gain is
  exactly ``Delta_task(r | H)``. For parallel siblings, conditioning one after another gives
  all of ``Delta_task(F | H)`` to whichever sibling comes last and nothing to the others (with
  two equally long branches, admitting one shortens the longest path by 0), so GREEDYPACK
  could never start them. We therefore attribute the frontier's sequentially conditioned sum
  ``Delta_task(F | H)`` to its members in proportion to their expected residual times: the
  shares sum to the paper's total when the whole frontier is admitted, and each sibling gets
  its part when only some fit. This is our addition; the paper does not say how it handles it.
  A request's gain is then fixed for the decision, so GREEDYPACK is one walk down a list
  sorted by gain, filtered by R'.
* Search over R': the pool is the agents with waiting or running requests plus the resident
  ones (less the agents with running requests when ``preempt`` is off: R' must keep them).
  If it has <= M agents every subset is scored; otherwise a local search starts from
  R_t: best single addition, pair additions when stuck, then deletions and swaps, until no
  move improves (O(|pool|^2) evaluations per round). Dropping an agent that has running
  requests preempts them (at most K preemptions), charged J_redo and J_revoke.
* J_revoke charges the credit lambda_r recorded at admission, as the paper says. Under aging
  this lets waiting tasks (whose g_i keeps growing) outbid a running request whose credit is
  frozen, so TOPAS can preempt the same long request again and again (tests pin it).
  ``revalue_credit=True`` charges ``lambda_r * g_i(t) / g_i(t_admit)`` instead: the credit
  ages with its task. Our addition; the defaults sweep picked it (``revalue_credit=False`` is
  the paper's literal credit).
* Liveness (our addition): if the engine is idle and the best state admits nothing (a first
  prefix load can cost more than one short request gains), the single best request is admitted
  with its prefix anyway, so TOPAS can never stall the engine.

Readings (docs/method.md "Readings"; ``topas.experiments.readings``): the choices the paper
leaves open are parameters whose defaults are the reading above: ``search`` (local, local+ with
drop-two-add-one moves, exhaustive), ``aging_form`` (log, linear), ``admit_norm`` (absolute,
remaining), ``sibling_share`` (residual, equal, last), ``redo`` (decode, reprefill) and
``move_cost`` (swap, engine).

Ablations (docs/method.md "Ablations"): ``topas-no-reuse`` (V_reuse off), ``topas-no-aging``
(g_i = 1), ``topas-base`` (neither), ``topas-request-only`` (no prefix search: requests are
ordered by the same age-weighted progress and prefixes are left to the engine's SGLang
behaviour, which shows what the joint search adds).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from topas.engine.view import Decision, EngineView, RequestView, within_caps
from topas.policies.base import Policy, PolicyError, register
from topas.policies.estimates import make_estimator
from topas.policies.history import WorkflowHistory
from topas.policies.topas_decision import _DecisionCtx, _Plan  # noqa: F401 (tests use them)
from topas.policies.topas_params import TopasParams
from topas.policies.topas_state import DecisionState
from topas.policies.topas_task import _TaskCtx  # noqa: F401

__all__ = ["Topas", "TopasParams", "TopasRequestOnly"]


@register
class Topas(Policy):
    name = "topas"
    Params = TopasParams
    manages_prefixes = True
    plans_admissions = True
    #: parameters an ablation fixes (cannot be overridden)
    FIXED: Mapping[str, Any] = {}

    def __init__(self, **params: Any) -> None:
        clash = sorted(set(params) & set(self.FIXED))
        if clash:
            raise PolicyError(f"policy {self.name!r} fixes parameter {clash[0]!r}; use policy 'topas' to set it")
        super().__init__(**params)
        self.params = dataclasses.replace(self.params, **self.FIXED)

    def reset(self) -> None:
        self.estimator = make_estimator(self.params.output_estimator, self.params.prior_weight)
        self.history = WorkflowHistory()  # online DAGs: per-workflow templates
        self.credits: dict[str, float] = {}  # lambda_r of running requests
        self._idle_waiting: tuple[str, ...] | None = None  # waiting set at our last idle decision
        self._decisions = 0
        self._prefill_cost: Any = None  # the cost model prefill_time_of memoises for
        #: per task: its view and its pending stages by ready set (``_DecisionCtx._lookahead_setup``)
        self._pending_memo: dict[str, Any] = {}
        #: the pending stages' list and index by parent, with the per-task lists they hold for (``topas_setup_fused``)
        self._pending_index: Any = None
        self._est_memo: Any = None  # expected_remaining, memoised until the next observation
        #: per task: its view and its unfinished stages' shape (``topas_task.task_shapes``)
        self._shape_memo: dict[str, Any] = {}
        #: per task: its view and its stages laid out for the compiled set-up (``topas_setup_compiled``)
        self._kshape_memo: dict[str, Any] = {}
        #: the pending stages laid out for the compiled set-up, with the per-task lists they hold for
        self._kpending: Any = None
        self._rem0: Any = None  # each agent's expected remaining output at y = 0, with the estimator memo it holds for
        self._parts_key: Any = None  # the cost model ``residual_parts`` holds for
        self._parts: dict[str, Any] = {}
        self._move_cost: Any = None  # the cost model ``move_times_of`` memoises for
        #: g_i at a request's admission, by (admission time, task arrival): J_revoke's revalued credit
        self._aging_memo: dict[tuple[float, float], float] = {}
        #: the decision set-up's state kept across decisions (``topas_state``)
        self._state = DecisionState()

    def prefill_time_of(self, cost: Any) -> Callable[[int, int], float]:
        """``cost.prefill_time([(n_new, n_cached)])``, memoised for the run (a pure function of
        the cost model; a stage's residual time needs it at every decision)."""
        if self._prefill_cost is not cost:
            self._prefill_cost, self._prefill_memo = cost, {}
        memo = self._prefill_memo

        def prefill_time(n_new: int, n_cached: int) -> float:
            v = memo.get((n_new, n_cached))
            if v is None:
                v = memo[(n_new, n_cached)] = cost.prefill_time([(n_new, n_cached)])
            return v

        return prefill_time

    def move_times_of(self, cost: Any) -> Callable[[int], tuple[float, float]]:
        """``(cost.swap_time(l), cost.prefill_time([(l, 0)]))`` of a prefix of ``l`` tokens,
        memoised for the run (prefix moves' times, needed at every decision)."""
        if self._move_cost is not cost:
            self._move_cost, self._move_memo = cost, {}
        memo = self._move_memo

        def move_times(tokens: int) -> tuple[float, float]:
            v = memo.get(tokens)
            if v is None:
                v = memo[tokens] = (cost.swap_time(tokens), cost.prefill_time([(tokens, 0)]))
            return v

        return move_times

    def residual_parts(self, view: EngineView) -> dict[str, dict[tuple[int, int], tuple[float, float]]]:
        """Per agent: a stage's ``(prefill time, expected remaining output)`` by ``(input tokens,
        generated)``, kept across decisions. A stage's expected residual time is ``prefill +
        remaining * tpot`` at the decision's operating point; the prefill is a function of the
        cost model and the agent's prefix, the remaining output of the agent's observations, so
        an agent's entries are dropped when it observes (``OutputEstimator.agent_version``)."""
        if self._parts_key != (view.cost, view.kv_budget):  # a new cost model: start afresh
            self._parts_key, self._parts = (view.cost, view.kv_budget), {}
        versions = getattr(self.estimator, "agent_version", None)
        out: dict[str, dict[tuple[int, int], tuple[float, float]]] = {}
        for a in view.prefixes:
            v = versions.get(a, 0) if versions is not None else None
            hit = self._parts.get(a)
            if hit is None or v is None or hit[0] != v:
                hit = self._parts[a] = (v, {})
            out[a] = hit[1]
        return out

    def on_finish(self, request: RequestView, time: float, output_tokens: int) -> None:
        self.estimator.observe(request.agent, output_tokens)
        self.credits.pop(request.rid, None)

    def request_priority(self, request: RequestView, view: EngineView) -> int:
        """1 for a request of an agent TOPAS keeps pinned when the request arrives (``R_t``:
        the prefixes it expects to reuse), else 0: under the ``priority`` eviction the radix
        cache keeps the finished KV of pinned agents over that of the others. Our reading (the
        paper has no request priority); an ablation without prefix management returns 0."""
        return int(self.manages_prefixes and request.agent in view.resident)

    def on_preempt(self, request: RequestView, time: float, by_engine: bool) -> None:
        self.credits.pop(request.rid, None)

    # ------------------------------------------------------------------ decision
    def decide(self, view: EngineView) -> Decision:
        self._decisions += 1
        if not view.waiting:
            return Decision()
        ctx = _DecisionCtx(self, view)
        stalled = False
        if view.running:
            self._idle_waiting = None
        else:
            waiting = tuple(r.rid for r in view.waiting)
            stalled = self._idle_waiting == waiting
            self._idle_waiting = waiting
        if stalled:
            # The engine is still idle with the same requests waiting as at our last decision:
            # our admissions did not pass its check (it reserves for outputs we can only
            # estimate). Fall back to the one state that always fits: the best request's prefix
            # alone.
            plan, evaluated = ctx.idle_fallback(), len(ctx._memo)
        else:
            plan, evaluated = ctx.search()
        for rid, lam in plan.admit:
            self.credits[rid] = lam
        r_t = view.resident
        return Decision(
            admit=tuple(rid for rid, _ in plan.admit),
            preempt=tuple(plan.preempt),
            evict=tuple(sorted(r_t - plan.resident)),
            load=tuple(sorted(plan.resident - r_t)),
            info={"candidates": float(evaluated), "score": plan.score, **plan.terms},
        )


def _ablation(name: str, doc: str, **fixed: Any) -> type[Topas]:
    cls = type(f"Topas_{name.replace('-', '_')}", (Topas,), {"name": name, "FIXED": fixed, "__doc__": doc})
    return register(cls)


_ablation("topas-no-reuse", "TOPAS without the prefix-reuse value V_reuse.", reuse=False)
_ablation("topas-no-aging", "TOPAS without aging (g_i(t) = 1).", aging=False)
_ablation("topas-base", "TOPAS without V_reuse and without aging.", reuse=False, aging=False)


@register
class TopasRequestOnly(Topas):
    """TOPAS's admission utility without the prefix search (an order, not a plan).

    Waiting requests are ordered by GREEDYPACK over every agent (as if all prefixes could be
    resident), i.e. by age-weighted sequentially conditioned progress; prefixes are left to the
    engine's SGLang behaviour (load on demand, LRU eviction). Comparing it with ``topas`` shows
    what choosing the prefix set jointly adds.
    """

    name = "topas-request-only"
    manages_prefixes = False
    plans_admissions = False

    def decide(self, view: EngineView) -> Decision:
        self._decisions += 1
        if not view.waiting:
            return Decision()
        ctx = _DecisionCtx(self, view)
        everyone = frozenset(view.prefixes)
        admit, _ = ctx._greedy_pack(everyone, 1 << 62, set(), force=True)
        first = [rid for rid, _ in admit]
        taken = set(first)
        rest = sorted((r for r in view.waiting if r.rid not in taken), key=lambda r: (r.ready_time, r.rid))
        for rid, lam in admit:
            self.credits[rid] = lam
        by_id = {r.rid: r for r in view.waiting}
        order = [by_id[rid] for rid in first] + rest
        if self.params.in_batch_guard:  # past an agent's admit cap: held back until its prefix is cached
            order, _ = within_caps(order, view.admit_cap)
        return Decision(admit=tuple(r.rid for r in order))
