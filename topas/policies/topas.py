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
import itertools
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

import numpy as np

from topas.engine.view import Decision, EngineView, RequestView, TaskView
from topas.policies.base import OMIT_DEFAULT, Policy, PolicyError, make_params, register
from topas.policies.estimates import OperatingPoint, make_estimator
from topas.policies.history import WorkflowHistory
from topas.policies.topas_terms import (
    aging,
    expected_longest_path,
    j_move,
    j_redo,
    j_redo_reprefill,
    j_revoke,
    lookahead_counts,
    v_reuse,
)


@dataclass(frozen=True)
class TopasParams:
    # Defaults: one set for every workload, chosen by scripts/sweep_topas_defaults.py (stage 2,
    # README "Choosing TOPAS's defaults"): preempt, output_reserve, rho, beta and revalue_credit
    # were swept; H_age, M, K, samples and candidates_per_agent were not.
    #: weight of the prefix-reuse value V_reuse
    beta: float = 1.0
    #: aging strength rho in g_i(t) = 1 + rho * log(1 + (t - tau_i) / H_age)
    rho: float = 0.5
    #: aging horizon H_age, seconds
    H_age: float = 60.0
    #: enumerate every prefix subset when the pool has at most M agents
    M: int = 6
    #: cap on admissions and on preemptions per decision
    K: int = 64
    #: E[LP] estimator: "expected" (longest path over expected residuals) or "sampled"
    estimator: Literal["expected", "sampled"] = "expected"
    #: draws per stage for the sampled estimator
    samples: int = 16
    #: fraction of a request's expected remaining output reserved in d_r(t)
    output_reserve: float = 0.5
    #: waiting requests considered per agent (the best by initial gain), for speed
    candidates_per_agent: int = 32
    #: prior pseudo-observations of each agent's expected output length
    prior_weight: int = 1
    #: include V_reuse (ablation switch)
    reuse: bool = True
    #: include aging (ablation switch)
    aging: bool = True
    #: seed of the sampled estimator's draws
    seed: int = 0
    #: allow dropping a prefix whose agent has running requests (preempting them)
    preempt: bool = True
    #: revalue a running request's credit at its task's current age when revoking it
    #: (the paper charges lambda_r as recorded at admission: set False for that)
    revalue_credit: bool = True
    #: output lengths: "online" (learned from finished requests, the prior as prior_weight
    #: observations) or "prior" (the prior only); see ``topas.policies.estimates``
    output_estimator: Literal["online", "prior"] = field(default="online", metadata=OMIT_DEFAULT)

    # ---- readings: choices the paper leaves open (docs/method.md "Readings"); each default is
    # the reading of the figures so far, and ``topas.experiments.readings`` lists the axes.
    #: search over R' when the pool has more than M agents: "local" (add one, add two, drop
    #: one, swap), "local+" (also drop two and add one, so a large prefix can displace two small
    #: ones) or "exhaustive" (every subset of the pool whatever M: 2^|pool| prefix sets per
    #: decision, those over the budget skipped before GREEDYPACK; 2,048 on MetaGPT-TL)
    search: Literal["local", "local+", "exhaustive"] = field(default="local", metadata=OMIT_DEFAULT)
    #: the form of g_i(t): "log" (1 + rho * log(1 + (t - tau_i) / H_age)) or "linear"
    #: (1 + rho * (t - tau_i) / H_age)
    aging_form: Literal["log", "linear"] = field(default="log", metadata=OMIT_DEFAULT)
    #: J_admit's unit: "absolute" (g_i * Delta_task, seconds of critical path), "fraction"
    #: (g_i * Delta_task / L_i(H, t): the fraction of the task's remaining path committed,
    #: unitless beside the other terms' seconds) or "remaining" (that fraction times the mean
    #: L_i(H, t) of the decision's tasks: ranked by fraction, back in seconds)
    admit_norm: Literal["absolute", "remaining", "fraction"] = field(default="absolute", metadata=OMIT_DEFAULT)
    #: how parallel siblings split g_i * Delta_task(F | H): "residual" (in proportion to their
    #: expected residual times), "equal", or "last" (sequential conditioning read literally:
    #: all to the last sibling in topological order, 0 to the others)
    sibling_share: Literal["residual", "equal", "last"] = field(default="residual", metadata=OMIT_DEFAULT)
    #: J_redo: "decode" (T_decode * y_r, the paper's) or "reprefill" (the engine rebuilds the y_r
    #: tokens with one prefill of x_r + y_r on the cached prefix, plus the re-wait: the earliest
    #: expected finish in Q', when the preempted request can be readmitted at the soonest)
    redo: Literal["decode", "reprefill"] = field(default="decode", metadata=OMIT_DEFAULT)
    #: J_move's prices: "swap" (an eviction without a host copy costs the swap mu * l_a / B_swap
    #: even when the engine has no host tier) or "engine" (as the engine does it: without a host
    #: tier an eviction only unpins (free) and a load is a prefill unless the prefix is still
    #: cached (free); with one, as "swap")
    move_cost: Literal["swap", "engine"] = field(default="swap", metadata=OMIT_DEFAULT)

    def __post_init__(self) -> None:
        checks = {
            "beta": self.beta >= 0, "rho": self.rho >= 0, "H_age": self.H_age > 0, "M": self.M >= 0,
            "K": self.K >= 1, "samples": self.samples >= 1, "output_reserve": self.output_reserve >= 0,
            "candidates_per_agent": self.candidates_per_agent >= 1, "prior_weight": self.prior_weight >= 0,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise PolicyError(f"topas parameter {bad[0]}={getattr(self, bad[0])!r} is out of range")
        for name, typ in typing.get_type_hints(type(self)).items():
            choices = typing.get_args(typ) if typing.get_origin(typ) is Literal else ()
            if choices and getattr(self, name) not in choices:
                raise PolicyError(f"topas parameter {name}={getattr(self, name)!r} is not one of {choices}")


class _TaskCtx:
    """One task during one decision: its unfinished stages, residual times and L_i(H) cache."""

    __slots__ = ("view", "order", "children", "residual", "committed", "g", "_cache", "waiting", "share", "norm")

    def __init__(self, tv: TaskView, residual: dict[str, Any], committed: frozenset[str], g: float,
                 share: str = "residual", norm: str = "absolute") -> None:
        self.view = tv
        self.order = tuple(s for s in tv.topo_order if s not in tv.done)
        self.children = {s: tv.stages[s].children for s in self.order}
        self.residual = residual
        self.committed = committed
        self.g = g
        self._cache: dict[frozenset[str], float] = {}
        self.waiting: list[RequestView] = []
        self.share = share  # TopasParams.sibling_share
        self.norm = norm  # TopasParams.admit_norm

    def L(self, h: frozenset[str]) -> float:
        """L_i(H, t)."""
        v = self._cache.get(h)
        if v is None:
            v = self._cache[h] = expected_longest_path(self.order, self.children, self.residual, h)
        return v

    def gain(self, h: frozenset[str], stages: tuple[str, ...]) -> float:
        """g_i(t) * Delta_task(stages | H, t)."""
        return self.g * (self.L(h) - self.L(h | frozenset(stages)))

    def frontier_gains(self) -> dict[str, float]:
        """Each waiting stage's share of g_i(t) * Delta_task(F | H, t), F = the waiting stages
        (in topological order), split by ``share`` and, unless ``norm == "absolute"``, divided by
        L_i(H, t) (the caller rescales "remaining")."""
        frontier = tuple(r.stage_id for r in self.waiting)
        if not frontier:
            return {}
        total = self.gain(self.committed, frontier)
        if self.norm != "absolute":
            remaining = self.L(self.committed)
            total = total / remaining if remaining > 0 else 0.0
        if len(frontier) == 1:
            return {frontier[0]: total}
        if self.share == "equal":
            return {s: total / len(frontier) for s in frontier}
        if self.share == "last":
            return {s: total if s == frontier[-1] else 0.0 for s in frontier}
        size = {s: float(np.mean(self.residual[s])) if isinstance(self.residual[s], np.ndarray)
                else self.residual[s] for s in frontier}
        norm = sum(size.values())
        return {s: total * size[s] / norm if norm > 0 else total / len(frontier) for s in frontier}


@dataclass
class _Plan:
    resident: frozenset[str]
    admit: list[tuple[str, float]]  # (rid, lambda_r) in admission order
    preempt: list[str]
    score: float
    terms: dict[str, float]


@register
class Topas(Policy):
    name = "topas"
    Params = TopasParams
    manages_prefixes = True
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

    def on_finish(self, request: RequestView, time: float, output_tokens: int) -> None:
        self.estimator.observe(request.agent, output_tokens)
        self.credits.pop(request.rid, None)

    def on_preempt(self, request: RequestView, time: float, by_engine: bool) -> None:
        self.credits.pop(request.rid, None)

    # ------------------------------------------------------------------ decision
    def decide(self, view: EngineView) -> Decision:
        self._decisions += 1
        if not view.waiting:
            return Decision()
        ctx = _DecisionCtx(self, view)
        waiting = tuple(r.rid for r in view.waiting)
        stalled = not view.running and self._idle_waiting == waiting
        self._idle_waiting = waiting if not view.running else None
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


class _DecisionCtx:
    """Everything one decision needs, computed once and shared by all candidate prefix sets."""

    def __init__(self, policy: Topas, view: EngineView) -> None:
        self.p = p = policy.params
        self.policy = policy
        self.view = view
        self.cost = view.cost
        est = policy.estimator
        op = OperatingPoint.of(view)
        self.tpot = op.tpot
        rng = np.random.default_rng([p.seed, policy._decisions]) if p.estimator == "sampled" else None

        memo: dict[tuple[str, int, int], float] = {}

        def residual(stage_id: str, tv: TaskView, generated: int) -> Any:
            st = tv.stages[stage_id]
            key = (st.agent, st.input_tokens, generated)
            if rng is None and key in memo:
                return memo[key]
            pv = view.prefixes[st.agent]
            prefill = view.cost.prefill_time([(st.input_tokens + generated, pv.tokens)])
            if rng is None:
                val = memo[key] = prefill + est.expected_remaining(st.agent, pv.expected_output_tokens, generated) * op.tpot
                return val
            draws = est.sample_remaining(st.agent, pv.expected_output_tokens, generated, rng, p.samples)
            return prefill + draws * op.tpot

        tasks = policy.history.tasks(view)  # online DAGs: completed from the workflow's history
        gen: dict[str, int] = {r.rid: r.generated for r in view.running}
        gen.update({r.rid: r.generated for r in view.waiting})
        running_by_task: dict[str, set[str]] = {}
        for r in view.running:
            running_by_task.setdefault(r.task_id, set()).add(r.stage_id)
        # Only tasks with waiting requests are scored (L_i and Delta_task).
        self.tasks: dict[str, _TaskCtx] = {}
        for tid in sorted({r.task_id for r in view.waiting}):
            tv = tasks[tid]
            res = {s: residual(s, tv, gen.get(f"{tid}/{s}", 0)) for s in tv.topo_order if s not in tv.done}
            g = aging(view.time, tv.arrival, p.rho, p.H_age, p.aging_form) if p.aging else 1.0
            self.tasks[tid] = _TaskCtx(tv, res, frozenset(running_by_task.get(tid, ())), g,
                                       p.sibling_share, p.admit_norm)
        # n_a(t) lookahead: pending stages whose unfinished parents are all ready (waiting or
        # running) are the only ones that can count for some Q'.
        self.pending: list[tuple[str, tuple[str, ...]]] = []  # (agent, unfinished parent rids)
        for tid, tv in tasks.items():
            for s in tv.topo_order:
                rid = f"{tid}/{s}"
                if s in tv.done or rid in gen:
                    continue
                parents = tuple(f"{tid}/{q}" for q in tv.stages[s].parents if q not in tv.done)
                if all(q in gen for q in parents):
                    self.pending.append((tv.stages[s].agent, parents))
        # n_a(t) is needed for every candidate Q'; precompute it for Q' = the running set and
        # index the pending stages by parent, so each Q' only rechecks the stages it touches.
        running_rids = self._running_rids = {r.rid for r in view.running}
        self.running_tasks = {r.task_id for r in view.running}
        self._la_base = lookahead_counts(self.pending, running_rids)
        self._la_in_base = [bool(ps) and all(q in running_rids for q in ps) for _, ps in self.pending]
        self._la_by_parent: dict[str, list[int]] = {}
        for i, (_, ps) in enumerate(self.pending):
            for q in ps:
                self._la_by_parent.setdefault(q, []).append(i)

        # waiting requests: demand d_r(t) and gain g_i(t) * Delta_task share (fixed per decision)
        self.demand: dict[str, int] = {}
        for r in view.waiting:
            pv = view.prefixes[r.agent]
            rem = est.expected_remaining(r.agent, pv.expected_output_tokens, r.generated)
            # The engine also allocates one slot for the prefill's output token and reserves for
            # outputs by their true length; we cannot match that exactly, and the idle fallback
            # guarantees progress when our estimate is short.
            self.demand[r.rid] = r.input_tokens + r.generated + int(p.output_reserve * rem)
        for r in sorted(view.waiting, key=lambda r: (r.task_id, self.tasks[r.task_id].order.index(r.stage_id))):
            self.tasks[r.task_id].waiting.append(r)
        self.gain: dict[str, float] = {}
        scale = 1.0
        if p.admit_norm == "remaining":  # fractions, in seconds of the decision's mean remaining path
            paths = [tc.L(tc.committed) for tc in self.tasks.values()]
            scale = float(np.mean(paths)) if paths else 1.0
        for tid, tc in self.tasks.items():
            for stage, g in tc.frontier_gains().items():
                self.gain[f"{tid}/{stage}"] = g * scale
        by_agent: dict[str, list[RequestView]] = {}
        for r in view.waiting:
            by_agent.setdefault(r.agent, []).append(r)
        rank = lambda r: (-self.gain[r.rid], self.tasks[r.task_id].view.arrival, r.rid)  # noqa: E731
        cands = []
        for agent in sorted(by_agent):
            cands.extend(sorted(by_agent[agent], key=rank)[: p.candidates_per_agent])
        #: the candidates, best gain first (ties: older task, then request id)
        self.cands: list[RequestView] = sorted(cands, key=rank)
        self._packable = [(r.rid, r.agent, r.task_id, self.gain[r.rid], self.demand[r.rid]) for r in self.cands]

        # running requests: kept demand, by agent
        self.running_by_agent: dict[str, list[RequestView]] = {}
        self.running_demand = 0
        self.run_demand: dict[str, int] = {}
        for r in view.running:
            self.running_by_agent.setdefault(r.agent, []).append(r)
            pv = view.prefixes[r.agent]
            rem = est.expected_remaining(r.agent, pv.expected_output_tokens, r.generated)
            self.run_demand[r.rid] = r.kv_tokens + int(p.output_reserve * rem)
        if p.redo == "reprefill":
            #: expected time to finish of each request that may be in Q' (for the re-wait)
            self.finish_in = {r.rid: est.expected_remaining(r.agent, view.prefixes[r.agent].expected_output_tokens,
                                                            r.generated) * op.tpot for r in view.running}
            for r in self.cands:
                z = self.tasks[r.task_id].residual[r.stage_id]
                self.finish_in[r.rid] = float(np.mean(z)) if isinstance(z, np.ndarray) else z

        # prefix moves
        self.move_in: dict[str, float] = {}
        self.move_out: dict[str, float] = {}
        self.reload: dict[str, float] = {}
        for a, pv in view.prefixes.items():
            swap = view.cost.swap_time(pv.tokens)
            self.reload[a] = swap
            self.move_in[a] = swap if pv.on_host else view.cost.prefill_time([(pv.tokens, 0)])
            self.move_out[a] = 0.0 if pv.on_host else swap
            if p.move_cost == "engine":
                # without a host tier an eviction unpins (free) and a still cached prefix is
                # pinned again for free; with one, an eviction writes the host copy (a swap)
                if pv.cached:
                    self.move_in[a] = 0.0
                if not view.host_tier:
                    self.move_out[a] = 0.0
        self.r_t = view.resident
        self._busy = frozenset(self.running_by_agent)
        self.prefix_len = {a: pv.tokens for a, pv in view.prefixes.items()}
        self.run_demand_by_agent = {
            a: sum(self.run_demand[r.rid] for r in rs) for a, rs in self.running_by_agent.items()
        }
        active = {r.agent for r in view.waiting} | set(self.running_by_agent)
        #: agents every R' keeps: those with running requests, unless preemption is allowed
        self.must = frozenset(() if p.preempt else self.running_by_agent)
        #: the agents the search may add or drop
        self.pool = tuple(sorted((active | self.r_t) - self.must))
        self._memo: dict[frozenset[str], _Plan | None] = {}

    # ------------------------------------------------------------------ evaluation of one R'
    def evaluate(self, resident: frozenset[str], force: bool = False) -> _Plan | None:
        """The best (R', Q') for this R' (GREEDYPACK), or None if R' is infeasible."""
        key = resident if not force else resident | {"\0force"}
        if key in self._memo:
            return self._memo[key]
        plan = self._evaluate(resident, force)
        self._memo[key] = plan
        return plan

    def _evaluate(self, resident: frozenset[str], force: bool) -> _Plan | None:
        p, view = self.p, self.view
        preempt = [] if self._busy <= resident else [
            r for a, rs in self.running_by_agent.items() if a not in resident for r in rs
        ]
        if len(preempt) > (p.K if p.preempt else 0):
            return None
        preempt_ids = {r.rid for r in preempt}
        free = view.kv_budget - sum(self.prefix_len[a] for a in resident)
        free -= sum(d for a, d in self.run_demand_by_agent.items() if a in resident)
        if free < 0 and resident - self.r_t:
            return None  # no room to load a prefix; a state with no loads stays feasible
        admit, gains = self._greedy_pack(resident, free, preempt_ids, force)
        # sorted: float sums must not depend on set iteration order (string hashing is per process)
        moved_in = [self.move_in[a] for a in sorted(resident - self.r_t)]
        moved_out = [self.move_out[a] for a in sorted(self.r_t - resident)]
        affected = 0  # |T_in| matters only when something moves at a cost
        if moved_in or any(moved_out):
            kept = {r.task_id for r in view.running if r.rid not in preempt_ids} if preempt else self.running_tasks
            affected = len(kept.union(rid.split("/", 1)[0] for rid, _ in admit))
        terms = {
            "J_admit": gains,
            "J_move": j_move(moved_in, moved_out, affected),
            "J_redo": self._redo(preempt, preempt_ids, admit),
            "J_revoke": j_revoke(self._credit(r) for r in preempt),
            "V_reuse": v_reuse(p.beta, self._lookahead(preempt_ids, admit), self.reload, sorted(resident))
            if p.reuse else 0.0,
        }
        score = terms["J_admit"] - terms["J_move"] - terms["J_redo"] - terms["J_revoke"] + terms["V_reuse"]
        return _Plan(resident, admit, sorted(r.rid for r in preempt), score, terms)

    def _redo(self, preempt: list[RequestView], preempt_ids: set[str], admit: list[tuple[str, float]]) -> float:
        """J_redo of the preempted requests (``TopasParams.redo``)."""
        if not preempt:
            return 0.0
        if self.p.redo == "decode":
            return j_redo((r.generated for r in preempt), self.tpot)
        # reprefill: one prefill of x_r + y_r on the cached prefix, after waiting to be readmitted
        # at the earliest expected finish in Q' (none: no wait)
        q = [self.finish_in[r.rid] for r in self.view.running if r.rid not in preempt_ids]
        q.extend(self.finish_in[rid] for rid, _ in admit)
        rewait = min(q, default=0.0)
        prefills = [self.cost.prefill_time([(r.input_tokens + r.generated, self.prefix_len[r.agent])]) for r in preempt]
        return j_redo_reprefill(prefills, [rewait] * len(preempt))

    def _credit(self, r: RequestView) -> float:
        """lambda_r, or with ``revalue_credit`` lambda_r * g_i(t) / g_i(t_admit)."""
        lam = self.policy.credits.get(r.rid, 0.0)
        if not self.p.revalue_credit or not self.p.aging or r.admitted_time is None:
            return lam
        tv = self.view.tasks[r.task_id]
        then = aging(r.admitted_time, tv.arrival, self.p.rho, self.p.H_age, self.p.aging_form)
        return lam * aging(self.view.time, tv.arrival, self.p.rho, self.p.H_age, self.p.aging_form) / then

    def _lookahead(self, preempted: set[str], admit: list[tuple[str, float]]) -> dict[str, int]:
        """``lookahead_counts(self.pending, Q')``, recomputing only the stages Q' changes."""
        by_parent = self._la_by_parent
        touched = {i for rid in preempted for i in by_parent.get(rid, ())}
        touched.update(i for rid, _ in admit for i in by_parent.get(rid, ()))
        if not touched:
            return self._la_base
        q_rids = (self._running_rids - preempted).union(rid for rid, _ in admit)
        counts = dict(self._la_base)
        for i in touched:
            if self._la_in_base[i]:
                counts[self.pending[i][0]] -= 1
        for a, n in lookahead_counts((self.pending[i] for i in sorted(touched)), q_rids).items():
            counts[a] = counts.get(a, 0) + n
        return counts

    def _greedy_pack(
        self, resident: frozenset[str], free: int, preempted: set[str], force: bool
    ) -> tuple[list[tuple[str, float]], float]:
        """GREEDYPACK: admit by largest g_i(t) * Delta_task while the budget allows."""
        admitted: list[tuple[str, float]] = []
        total = 0.0
        preempted_tasks = {rid.split("/", 1)[0] for rid in preempted}
        K = self.p.K
        for rid, agent, task_id, gain, need in self._packable:
            if len(admitted) >= K:
                break
            if gain <= 0 and not (force and not admitted):
                break
            if agent not in resident or task_id in preempted_tasks:
                continue  # a plan never swaps a running stage for a waiting one of the same task
            if need > free:
                continue
            free -= need
            admitted.append((rid, gain))  # lambda_r = the credit recorded at admission
            total += gain
        return admitted, total

    # ------------------------------------------------------------------ search over R'
    def _fits(self, resident: frozenset[str]) -> bool:
        return sum(self.view.prefixes[a].tokens for a in resident) <= self.view.kv_budget

    def search(self) -> tuple[_Plan, int]:
        """The best post-decision state and the number of prefix sets evaluated."""
        self._best: _Plan | None = None
        self._consider(self.r_t)
        if len(self.pool) <= self.p.M or self.p.search == "exhaustive":
            for k in range(len(self.pool) + 1):
                for combo in itertools.combinations(self.pool, k):
                    self._consider(self.must | frozenset(combo))
        else:
            self._local_search()
        best = self._best
        if best is None or (not best.admit and not self.view.running):
            best = self._liveness() or best
        assert best is not None, "the current prefix set is always feasible"
        return best, len(self._memo)

    def _consider(self, resident: frozenset[str]) -> bool:
        """Score R'; True if it beats the incumbent."""
        if sum(self.prefix_len[a] for a in resident) > self.view.kv_budget:
            return False
        plan = self.evaluate(resident)
        if plan is None or (self._best is not None and not self._better(plan, self._best)):
            return False
        self._best = plan
        return True

    def _local_search(self) -> None:
        """From R_t: single additions; pair additions when stuck; then deletions and swaps; with
        ``search="local+"`` then drop-two-add-one moves."""
        for _ in range(4 * len(self.pool) + 4):
            cur = self._best.resident if self._best is not None else self.r_t
            outside = [a for a in self.pool if a not in cur]
            inside = sorted(cur - self.must)
            neighbourhoods = [
                [cur | {a} for a in outside],
                [cur | {a, b} for a, b in itertools.combinations(outside, 2)],
                [cur - {a} for a in inside] + [(cur - {a}) | {b} for a in inside for b in outside],
            ]
            if self.p.search == "local+":
                neighbourhoods.append(
                    [(cur - {a, b}) | {c} for a, b in itertools.combinations(inside, 2) for c in outside])
            for moves in neighbourhoods:
                # evaluate the whole neighbourhood (no short-circuit), keep the best
                if sum([self._consider(frozenset(m)) for m in moves]):
                    break
            else:
                return

    def _better(self, a: _Plan, b: _Plan) -> bool:
        """Higher score; on a tie the smaller change: fewer preemptions, then fewer prefix moves."""
        if a.score != b.score:
            return a.score > b.score
        ka = (len(a.preempt), len(a.resident ^ self.r_t), sorted(a.resident))
        kb = (len(b.preempt), len(b.resident ^ self.r_t), sorted(b.resident))
        return ka < kb

    def _liveness(self) -> _Plan | None:
        """Idle engine, nothing admitted: admit the best single request with its prefix."""
        for r in self.cands:
            keep = [a for a in sorted(self.r_t, key=lambda a: -self.view.prefixes[a].last_used) if a != r.agent]
            resident = frozenset({r.agent})
            for a in keep:  # keep as many resident prefixes as fit beside it
                trial = resident | {a}
                if sum(self.prefix_len[x] for x in trial) + self.demand[r.rid] <= self.view.kv_budget:
                    resident = trial
            plan = self.evaluate(resident, force=True)
            if plan is not None and plan.admit:
                return plan
        return self.idle_fallback()

    def idle_fallback(self) -> _Plan:
        """The best request's prefix alone, that request first (a validated trace guarantees
        that any request fits beside its own prefix), then its agent's others by gain."""
        r = self.cands[0] if self.cands else min(self.view.waiting, key=lambda w: (w.ready_time, w.rid))
        plan = self.evaluate(frozenset({r.agent}), force=True)
        admit = [(r.rid, self.gain.get(r.rid, 0.0))] + [a for a in plan.admit if a[0] != r.rid] if plan else []
        if not admit:
            admit = [(r.rid, 0.0)]
        return _Plan(frozenset({r.agent}), admit, [], plan.score if plan else 0.0, plan.terms if plan else {})


def _ablation(name: str, doc: str, **fixed: Any) -> type[Topas]:
    cls = type(f"Topas_{name.replace('-', '_')}", (Topas,), {"name": name, "FIXED": fixed, "__doc__": doc})
    return register(cls)


_ablation("topas-no-reuse", "TOPAS without the prefix-reuse value V_reuse.", reuse=False)
_ablation("topas-no-aging", "TOPAS without aging (g_i(t) = 1).", aging=False)
_ablation("topas-base", "TOPAS without V_reuse and without aging.", reuse=False, aging=False)


@register
class TopasRequestOnly(Topas):
    """TOPAS's admission utility without the prefix search.

    Waiting requests are ordered by GREEDYPACK over every agent (as if all prefixes could be
    resident), i.e. by age-weighted sequentially conditioned progress; prefixes are left to the
    engine's SGLang behaviour (load on demand, LRU eviction). Comparing it with ``topas`` shows
    what choosing the prefix set jointly adds.
    """

    name = "topas-request-only"
    manages_prefixes = False

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
        return Decision(admit=tuple(first) + tuple(r.rid for r in rest))
