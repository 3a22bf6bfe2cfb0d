"""One TOPAS decision: the per-decision quantities, the score of one ``(R', Q')`` and the search.

``_DecisionCtx`` computes once per decision everything that does not depend on the candidate
prefix set ``R'``: each task's residual times, ``g_i(t)`` (aging) and ``L_i(H, t)``; each waiting
request's ``d_r(t)`` and gain ``g_i(t) * Delta_task``; each running request's kept demand and
credit ``lambda_r`` (``J_revoke``'s charge); the prefix moves' times; and ``n_a(t)`` for
``Q' =`` the running set, with the pending stages indexed by parent so that a candidate ``Q'``
only re-counts the stages it touches. Scoring one ``R'`` (:meth:`_DecisionCtx.evaluate`) is then
GREEDYPACK plus the five terms of ``topas_terms``; the search (``topas_search``, the context's base
class) scores prefix sets, each once (memoised).

Where the compiled search runs, the set-up is compiled too (``topas_setup_compiled``): it lays the
search's arrays out and runs it, and what it leaves out is computed by the fused set-up
(``topas_setup_fused``) when first read (``topas_setup_compiled.LeftOut``).

Every float sum runs in the same order as the plain formula's (sorted agents, the running
order), so the scores, hence the decisions, do not depend on how they are computed here
(``tests/test_topas_pinned.py`` pins them).
"""

from __future__ import annotations

import functools
import itertools
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from topas.engine.view import EngineView, RequestView
from topas.policies.estimates import OperatingPoint
from topas.policies import topas_search_compiled, topas_setup_compiled, topas_setup_fused, topas_state
from topas.policies.topas_search import _Plan
from topas.policies.topas_search_compiled import CompiledSearch
from topas.policies.topas_task import _MemoEstimator, _TaskCtx, pending_stages, stage_residuals, task_shapes
from topas.policies.topas_terms import (
    aging,
    j_admit,
    j_move,
    j_redo,
    j_redo_reprefill,
    j_revoke,
    lookahead_counts,
    v_reuse,
)

if TYPE_CHECKING:
    # the policy (topas.policies.topas.Topas) is passed in, not imported: it imports this module
    Topas = Any

_NONE: frozenset[str] = frozenset()
#: Set up with ``topas_setup_fused`` where it covers the parameters (False: the readable set-up,
#: ``_readable_setup``, which ``TOPAS_SEARCH=reference`` runs with the reference search).
FUSED = os.environ.get("TOPAS_SEARCH", "compiled") != "reference"
#: With the compiled search, lay out its arrays with ``topas_setup_compiled`` (False: from the
#: fused set-up, ``CompiledSearch._kernel_arrays``).
COMPILED = True


class _DecisionCtx(CompiledSearch, topas_setup_compiled.LeftOut):
    """Everything one decision needs, computed once and shared by all candidate prefix sets."""

    def __init__(self, policy: Topas, view: EngineView) -> None:
        self.p = p = policy.params
        self.policy = policy
        self.view = view
        self.cost = view.cost
        est = policy._est_memo = _MemoEstimator.current(getattr(policy, "_est_memo", None), policy.estimator)
        op = OperatingPoint.of(view)
        self.tpot = op.tpot
        rng = np.random.default_rng([p.seed, policy._decisions]) if p.estimator == "sampled" else None

        prefill_time = policy.prefill_time_of(view.cost)
        prefixes, tpot = view.prefixes, op.tpot
        # the per-agent entries of the state kept across decisions, brought up to this view
        policy._state.agents(view, policy.move_times_of(view.cost), p.move_cost == "engine", p.reuse_cost == "engine")

        def residual(agent: str, x: int, generated: int) -> Any:
            """The "sampled" estimator's draws of a stage's residual time."""
            pv = prefixes[agent]
            draws = est.sample_remaining(agent, pv.expected_output_tokens, generated, rng, p.samples)
            return prefill_time(x + generated, pv.tokens) + draws * tpot

        tasks = policy.history.tasks(view)  # online DAGs: completed from the workflow's history
        parts = policy.residual_parts(view) if rng is None else None
        if FUSED and parts is not None and topas_setup_fused.covers(p):  # the same attributes, in fewer passes
            fused = functools.partial(topas_setup_fused.setup, self, policy, view, est, parts, prefill_time, tasks)
            if (COMPILED and policy.plans_admissions and topas_search_compiled.ENABLED
                    and topas_search_compiled._kernel is not None
                    and topas_setup_compiled.setup(self, policy, view, est, parts, prefill_time, tasks)):
                self._lazy = fused  # laid out and searched; the rest when first read (``LeftOut``)
            else:
                fused()
            if topas_state.CHECK:
                topas_state.check_decision(policy, view)
            return
        self._readable_setup(view, est, op, rng, parts, prefill_time, tasks, residual)

    # What the fused set-up leaves out (the functions at the end of ``topas_setup_fused``), computed
    # on first read; the readable set-up assigns each itself.
    run_demand_by_agent = functools.cached_property(topas_setup_fused.run_demand_by_agent)
    _run_demand_total = functools.cached_property(topas_setup_fused.run_demand_total)
    _n_running = functools.cached_property(topas_setup_fused.n_running)
    _la_base = functools.cached_property(topas_setup_fused.la_base)
    _by_density = functools.cached_property(topas_setup_fused.by_density)
    _running_rids = functools.cached_property(topas_setup_fused.running_rids)
    running_tasks = functools.cached_property(topas_setup_fused.running_tasks)
    _busy_tasks = functools.cached_property(topas_setup_fused.busy_tasks)
    _min_need_after = functools.cached_property(topas_setup_fused.min_need_after)

    # ------------------------------------------------------------------ per-decision set-up
    def _readable_setup(self, view: EngineView, est: Any, op: OperatingPoint, rng: Any, parts: Any,
                        prefill_time: Any, tasks: Any, residual: Any) -> None:
        """The set-up, pass by pass (the reference of ``topas_setup_fused``)."""
        p, policy, prefixes, tpot = self.p, self.policy, view.prefixes, self.tpot
        running_by_task: dict[str, set[str]] = {}
        for r in view.running:
            running_by_task.setdefault(r.task_id, set()).add(r.stage_id)
        gen_by_task: dict[str, dict[str, int]] = {}  # the ready stages' generated tokens
        for r in itertools.chain(view.running, view.waiting):
            gen_by_task.setdefault(r.task_id, {})[r.stage_id] = r.generated
        # Only tasks with waiting requests are scored (L_i and Delta_task).
        self.tasks: dict[str, _TaskCtx] = {}
        shapes, policy._shape_memo = task_shapes(policy._shape_memo, tasks, sorted({r.task_id for r in view.waiting}))
        for tid, shape in shapes.items():
            tv = tasks[tid]
            ready = gen_by_task[tid]
            res: dict[str, Any]
            if parts is not None:
                res = stage_residuals(shape, running_by_task.get(tid, ()), ready, parts, prefixes, prefill_time, est,
                                      tpot)
            else:
                res = {}
                for s, agent, x in shape[2]:
                    res[s] = residual(agent, x, ready.get(s, 0))
            g = aging(view.time, tv.arrival, p.rho, p.H_age, p.aging_form) if p.aging else 1.0
            self.tasks[tid] = _TaskCtx(tv, res, frozenset(running_by_task.get(tid, ())), g,
                                       p.sibling_share, p.admit_norm, shape, rng is None)
        self._lookahead_setup(tasks, gen_by_task, view)
        self._waiting_setup(view, est, parts)
        self._running_setup(view, est, op)
        self._moves_setup(view)
        if topas_state.CHECK:
            topas_state.check_decision(policy, view)

    def _lookahead_setup(self, tasks: Any, ready: dict[str, dict[str, int]], view: EngineView) -> None:
        """n_a(t) for Q' = the running set, and the pending stages indexed by parent (``ready``:
        per task, its ready stages, the running ones first)."""
        # Pending stages with unfinished parents, all of them ready (waiting or running), are the
        # only ones that can count for some Q': children of the ready stages (in any order:
        # only counts are taken from this list).
        # (agent, unfinished parent rids), kept per task across decisions (``pending_stages``)
        self.pending, self.policy._pending_memo = pending_stages(self.policy._pending_memo, tasks, ready)
        # n_a(t) is needed for every candidate Q'; precompute it for Q' = the running set, and
        # for each pending stage how many of its parents run, indexed by parent, so that each
        # Q' only re-counts the stages whose parents it preempts or admits.
        running_rids = self._running_rids = {r.rid for r in view.running}
        self.running_tasks = {r.task_id for r in view.running}
        self._running_per_task: dict[str, int] = {}
        for r in view.running:
            self._running_per_task[r.task_id] = self._running_per_task.get(r.task_id, 0) + 1
        self._la_base = lookahead_counts(self.pending, running_rids)
        #: per pending stage: its unfinished parents, how many of them run, and whether it counts
        #: in ``_la_base`` (all of them run); per agent, the most n_a(t) can be for any Q' (every
        #: pending stage with a parent counts: ``_bound``'s V_reuse); the pending stages by parent
        need: list[int] = []
        running: list[int] = []
        in_base: list[bool] = []
        n_max: dict[str, int] = {}
        by_parent: dict[str, list[int]] = {}
        for i, (agent, ps) in enumerate(self.pending):
            k = 0
            for q in ps:
                if q in running_rids:
                    k += 1
                at = by_parent.get(q)
                if at is None:
                    by_parent[q] = [i]
                else:
                    at.append(i)
            n = len(ps)
            need.append(n)
            running.append(k)
            in_base.append(n > 0 and k == n)
            if n:
                n_max[agent] = n_max.get(agent, 0) + 1
        self._la_need, self._la_running, self._la_in_base, self._la_by_parent = need, running, in_base, by_parent
        #: V_reuse's price of one later use of each agent's resident prefix (``reuse_cost``; kept
        #: across decisions in ``topas_state``, with the prefix moves' times)
        self.reload = self.policy._state.reload
        self._reuse_max = [(a, n * self.reload[a]) for a, n in sorted(n_max.items())]

    def _waiting_setup(self, view: EngineView, est: Any, parts: dict[str, dict[tuple[int, int], tuple[float, float]]] | None) -> None:
        """Waiting requests: demand d_r(t) and gain g_i(t) * Delta_task share (fixed per decision);
        ``parts``: the residual parts (``Topas.residual_parts``) the tasks' residuals filled, which
        hold every waiting stage's expected remaining output."""
        p = self.p
        self.demand: dict[str, int] = {}
        for r in view.waiting:
            if p.demand == "engine":  # the engine's admission check (its own reservation rule)
                self.demand[r.rid] = r.admit_tokens
                continue
            # an estimate: the engine may refuse it (the idle fallback keeps progress)
            if parts is not None:
                rem = parts[r.agent][(r.input_tokens, r.generated)][1]
            else:
                rem = est.expected_remaining(r.agent, view.prefixes[r.agent].expected_output_tokens, r.generated)
            self.demand[r.rid] = r.input_tokens + r.generated + int(p.output_reserve * rem)
        for r in view.waiting:
            self.tasks[r.task_id].waiting.append(r)
        self._waiting_ranked(view)

    def _waiting_ranked(self, view: EngineView) -> None:
        """Each task's frontier in order, the gains g_i(t) * Delta_task, the candidates ranked."""
        p = self.p
        for tc in self.tasks.values():  # each task's waiting stages in topological order
            if len(tc.waiting) > 1:
                tc.waiting.sort(key=lambda r, pos=tc.position: pos[r.stage_id])
        self.gain: dict[str, float] = {}
        scale = 1.0
        if p.admit_norm == "remaining":  # fractions, in seconds of the decision's mean remaining path
            paths = [tc.L(tc.committed) for tc in self.tasks.values()]
            scale = float(np.mean(paths)) if paths else 1.0
        for tc in self.tasks.values():
            for r, g in tc.frontier_gains():
                self.gain[r.rid] = g * scale
        # rank: best gain first (ties: older task, then request id, which is unique); each
        # agent's best candidates_per_agent, in that order
        ranked = sorted((-self.gain[r.rid], self.tasks[r.task_id].view.arrival, r.rid, r) for r in view.waiting)
        self._candidates(view, ranked)
        #: the candidates with a positive gain by gain per token (``_bound``'s fractional knapsack)
        self._by_density = sorted(((c[3], c[4], c[1], c[2]) for c in self._packable if c[3] > 0),
                                  key=lambda c: -c[0] / c[1] if c[1] > 0 else -float("inf"))
        #: the smallest demand from each candidate on: GREEDYPACK stops once none of them fits
        self._min_need_after = list(itertools.accumulate(reversed([c[4] for c in self._packable]), min))[::-1]

    def _candidates(self, view: EngineView, ranked: list[tuple[float, float, str, RequestView]]) -> None:
        """The candidates (each agent's best ``candidates_per_agent`` of ``ranked``) and what
        GREEDYPACK and ``_bound`` read of them."""
        p = self.p
        taken: dict[str, int] = {}
        cap = p.candidates_per_agent
        #: the candidates, best gain first (ties: older task, then request id)
        self.cands: list[RequestView] = []
        for *_, r in ranked:
            n = taken.get(r.agent, 0)
            if n < cap:
                taken[r.agent] = n + 1
                self.cands.append(r)
        self._packable = [(r.rid, r.agent, r.task_id, self.gain[r.rid], self.demand[r.rid]) for r in self.cands]
        #: the in-batch guard: per agent whose prefix is not in the tree, how many of its requests
        #: one decision may admit (``EngineView.admit_cap``: 1, or 0 while a request computes it)
        self._caps: dict[str, int] = {}
        if p.in_batch_guard:
            for a in {r.agent for r in self.cands}:
                cap = view.admit_cap(a)
                if cap is not None:
                    self._caps[a] = cap

    def _running_setup(self, view: EngineView, est: Any, op: OperatingPoint) -> None:
        """Running requests: kept demand, by agent, and each one's credit lambda_r."""
        p = self.p
        self.running_by_agent: dict[str, list[RequestView]] = {}
        self.running_demand = 0
        self.run_demand: dict[str, int] = {}
        # A running request's generated count moves at every decode step, so a memo would miss:
        # the estimator itself is asked (the same function ``est`` memoises).
        remaining, prefixes, reserve = est.est.expected_remaining, view.prefixes, p.output_reserve
        engine = p.demand == "engine"
        for r in view.running:
            self.running_by_agent.setdefault(r.agent, []).append(r)
            if engine:  # its KV and the engine's reservation for it
                self.run_demand[r.rid] = r.hold_tokens
            else:
                rem = remaining(r.agent, prefixes[r.agent].expected_output_tokens, r.generated)
                self.run_demand[r.rid] = r.kv_tokens + int(reserve * rem)
        if p.redo == "reprefill":
            #: expected time to finish of each request that may be in Q' (for the re-wait)
            self.finish_in = {r.rid: est.expected_remaining(r.agent, view.prefixes[r.agent].expected_output_tokens,
                                                            r.generated) * op.tpot for r in view.running}
            for r in self.cands:
                z = self.tasks[r.task_id].residual[r.stage_id]
                self.finish_in[r.rid] = float(np.mean(z)) if isinstance(z, np.ndarray) else z
        self._busy = frozenset(self.running_by_agent)
        #: the agents with running requests, in the running order (the order preemptions are listed)
        self._busy_order = tuple(self.running_by_agent)
        self.run_demand_by_agent = {
            a: sum(self.run_demand[r.rid] for r in rs) for a, rs in self.running_by_agent.items()
        }
        self._run_demand_total = sum(self.run_demand_by_agent.values())
        self._n_running = {a: len(rs) for a, rs in self.running_by_agent.items()}
        self._aging_now: dict[float, float] = {}  # g_i(t) at this decision's t, by task arrival
        #: J_revoke's charge of each running request, fixed for the decision
        self.credit = {r.rid: self._credit(r) for r in view.running}
        #: the tasks of each busy agent's running requests (a plan never readmits their stages)
        self._busy_tasks = {a: {r.task_id for r in rs} for a, rs in self.running_by_agent.items()}

    def _moves_setup(self, view: EngineView) -> None:
        """Prefix moves' times (J_move's ``move_in``/``move_out``, kept across decisions in
        ``topas_state``, where ``agent_row`` computes them), and the search's pool."""
        p = self.p
        state = self.policy._state
        self.move_in, self.move_out = state.move_in, state.move_out
        self.r_t = view.resident
        self.prefix_len = state.prefix_len
        active = {r.agent for r in view.waiting} | set(self.running_by_agent)
        #: agents every R' keeps: those with running requests, unless preemption is allowed
        self.must = frozenset(() if p.preempt else self.running_by_agent)
        #: the agents the search may add or drop
        self.pool = tuple(sorted((active | self.r_t) - self.must))
        #: each agent's bit: a prefix set's key in the memo is the sum of its members' bits
        self._bit = state.bit
        self._force_bit = 1 << len(self._bit)  # ``evaluate(force=True)``'s plans are kept apart
        #: the plan of each prefix set scored (None: infeasible, or it cannot beat the incumbent)
        self._memo: dict[int, _Plan | None] = {}

    # ------------------------------------------------------------------ evaluation of one R'
    def evaluate(self, resident: frozenset[str], force: bool = False) -> _Plan | None:
        """The best (R', Q') for this R' (GREEDYPACK), or None if R' is infeasible."""
        key = sum(map(self._bit.__getitem__, resident)) | (self._force_bit if force else 0)
        if key in self._memo:
            return self._memo[key]
        plan = self._evaluate(resident, force, sum(self.prefix_len[a] for a in resident))
        self._memo[key] = plan
        return plan

    def _evaluate(self, resident: frozenset[str], force: bool, prefix_tokens: int,
                  floor: float | None = None) -> _Plan | None:
        """The plan of R' (``evaluate``); with ``floor``, None also when no (R', Q') can score
        ``floor`` or more (``_bound``), which the search then need not score."""
        p = self.p
        dropped = [a for a in self._busy_order if a not in resident]  # busy agents R' drops
        free = self.view.kv_budget - prefix_tokens
        if dropped:  # integer counts first: most R' are rejected before any list is built
            if sum(map(self._n_running.__getitem__, dropped)) > (p.K if p.preempt else 0):
                return None
            free -= self._run_demand_total - sum(map(self.run_demand_by_agent.__getitem__, dropped))
        else:
            free -= self._run_demand_total
        if free < 0 and not resident <= self.r_t:
            return None  # no room to load a prefix; a state with no loads stays feasible
        loads = sorted(resident - self.r_t)
        preempt = [r for a in dropped for r in self.running_by_agent[a]]
        preempt_ids = {r.rid for r in preempt} if preempt else _NONE
        preempted_tasks = set().union(*(self._busy_tasks[a] for a in dropped)) if dropped else _NONE
        # sorted: float sums must not depend on set iteration order (string hashing is per process)
        moved_in = [self.move_in[a] for a in loads]
        moved_out = [self.move_out[a] for a in sorted(self.r_t - resident)]
        if floor is not None and self._bound(resident, free, preempted_tasks, preempt, moved_in, moved_out) < floor:
            return None
        admit, gains = self._pack(resident, free, preempted_tasks, force)
        affected = 0  # |T_in| matters only when something moves at a cost
        if moved_in or any(moved_out):
            affected = self._tasks_in(preempt, admit)
        terms = {
            "J_admit": gains,
            "J_move": j_move(moved_in, moved_out, affected),
            "J_redo": self._redo(preempt, preempt_ids, admit),
            "J_revoke": j_revoke(self.credit[r.rid] for r in preempt) if preempt else 0.0,
            "V_reuse": self._v_reuse(resident, preempt_ids, admit) if p.reuse else 0.0,
        }
        score = terms["J_admit"] - terms["J_move"] - terms["J_redo"] - terms["J_revoke"] + terms["V_reuse"]
        return _Plan(resident, admit, sorted(r.rid for r in preempt), score, terms)

    def _tasks_in(self, preempt: list[RequestView], admit: list[tuple[str, float]]) -> int:
        """|T_in|: the tasks with a request in Q' (running and kept, or admitted)."""
        kept = len(self.running_tasks)
        if preempt:  # less the tasks whose every running request is preempted
            gone: dict[str, int] = {}
            for r in preempt:
                gone[r.task_id] = gone.get(r.task_id, 0) + 1
            kept -= sum(n == self._running_per_task[t] for t, n in gone.items())
        # an admitted stage's task is never one R' preempts (GREEDYPACK skips those)
        return kept + len({rid.split("/", 1)[0] for rid, _ in admit} - self.running_tasks)

    def _bound(self, resident: frozenset[str], free: int, preempted_tasks: set[str] | frozenset[str],
               preempt: list[RequestView], moved_in: list[float], moved_out: list[float]) -> float:
        """An upper bound of Score(R', Q') for every Q' GREEDYPACK can pick, computed in the
        score's own order of operations (IEEE rounding is monotone, so each term's bound bounds
        the score): J_admit by the fractional knapsack of the admissible positive gains (>= the
        greedy pack's), J_move by its moves charged once, J_redo (``decode``) and J_revoke exactly
        (``reprefill``'s J_redo by 0), V_reuse by every pending stage of R''s agents counted in
        n_a(t). The two relaxed sums are inflated by 1e-9 relative, far above their rounding."""
        p = self.p
        room, admit = free, 0.0
        for gain, need, agent, task_id in self._by_density:
            if agent not in resident or task_id in preempted_tasks:
                continue
            if need <= room:
                room -= need
                admit += gain
            else:
                if room > 0:
                    admit += gain * room / need
                break
        bound = (admit * (1 + 1e-9) + 1e-12) - j_move(moved_in, moved_out, 1)
        if preempt:
            if p.redo == "decode":
                bound -= j_redo((r.generated for r in preempt), self.tpot)
            bound -= j_revoke(self.credit[r.rid] for r in preempt)
        if p.reuse:
            bound += p.beta * sum(w for a, w in self._reuse_max if a in resident) * (1 + 1e-9) + 1e-12
        return bound

    def _v_reuse(self, resident: frozenset[str], preempt_ids: set[str] | frozenset[str],
                 admit: list[tuple[str, float]]) -> float:
        """V_reuse of (R', Q'): ``v_reuse`` over the agents of R' in sorted order; those with
        ``n_a(t) = 0`` are left out of the sum (each would add 0.0, which changes no float sum)."""
        counts = self._lookahead(preempt_ids, admit)
        return v_reuse(self.p.beta, counts, self.reload, [a for a in sorted(counts) if a in resident and counts[a]])

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
        arrival = self.view.tasks[r.task_id].arrival
        p = self.p
        now = self._aging_now.get(arrival)
        if now is None:
            now = self._aging_now[arrival] = aging(self.view.time, arrival, p.rho, p.H_age, p.aging_form)
        memo = self.policy._aging_memo  # g_i at admission, kept for the run
        then = memo.get((r.admitted_time, arrival))
        if then is None:
            then = memo[(r.admitted_time, arrival)] = aging(r.admitted_time, arrival, p.rho, p.H_age, p.aging_form)
        return lam * now / then

    def _lookahead(self, preempted: set[str], admit: list[tuple[str, float]]) -> dict[str, int]:
        """``lookahead_counts(self.pending, Q')``, by delta from Q' = the running set: only the
        pending stages with a parent that Q' preempts or admits can change."""
        by_parent = self._la_by_parent
        moved: dict[int, int] = {}  # pending stage -> change in its parents in Q'
        for rid in preempted:
            for i in by_parent.get(rid, ()):
                moved[i] = moved.get(i, 0) - 1
        for rid, _ in admit:
            for i in by_parent.get(rid, ()):
                moved[i] = moved.get(i, 0) + 1
        if not moved:
            return self._la_base
        counts = dict(self._la_base)
        need, running, in_base = self._la_need, self._la_running, self._la_in_base
        for i, d in moved.items():
            now = running[i] + d == need[i]
            if now != in_base[i]:
                a = self.pending[i][0]
                counts[a] = counts.get(a, 0) + (1 if now else -1)
        return counts

    def _greedy_pack(
        self, resident: frozenset[str], free: int, preempted: set[str], force: bool
    ) -> tuple[list[tuple[str, float]], float]:
        """GREEDYPACK: admit by largest g_i(t) * Delta_task while the budget allows (``preempted``:
        the request ids R' preempts; their tasks' waiting stages are not admitted)."""
        return self._pack(resident, free, {rid.split("/", 1)[0] for rid in preempted}, force)

    def _pack(
        self, resident: frozenset[str], free: int, preempted_tasks: set[str] | frozenset[str], force: bool
    ) -> tuple[list[tuple[str, float]], float]:
        """GREEDYPACK given the preempted requests' tasks."""
        admitted: list[tuple[str, float]] = []
        K = self.p.K
        min_after = self._min_need_after
        caps = self._caps
        used: dict[str, int] = {}
        for i, (rid, agent, task_id, gain, need) in enumerate(self._packable):
            if len(admitted) >= K:
                break
            if gain <= 0 and not (force and not admitted):
                break
            if free < min_after[i]:
                break  # nothing from here on fits
            if agent not in resident or task_id in preempted_tasks:
                continue  # a plan never swaps a running stage for a waiting one of the same task
            if need > free:
                continue
            if caps:
                cap = caps.get(agent)
                if cap is not None:
                    n = used.get(agent, 0)
                    if n >= cap:
                        continue  # the in-batch guard: it would compute its own copy of the prefix
                    used[agent] = n + 1
            free -= need
            admitted.append((rid, gain))  # lambda_r = the credit recorded at admission
        return admitted, j_admit(gain for _, gain in admitted)
