"""One TOPAS decision: the per-decision quantities, the score of one ``(R', Q')`` and the search.

``_DecisionCtx`` computes once per decision everything that does not depend on the candidate
prefix set ``R'``: each task's residual times, ``g_i(t)`` (aging) and ``L_i(H, t)``; each waiting
request's ``d_r(t)`` and gain ``g_i(t) * Delta_task``; each running request's kept demand and
credit ``lambda_r`` (``J_revoke``'s charge); the prefix moves' times; and ``n_a(t)`` for
``Q' =`` the running set, with the pending stages indexed by parent so that a candidate ``Q'``
only re-counts the stages it touches. Scoring one ``R'`` (:meth:`_DecisionCtx.evaluate`) is then
GREEDYPACK plus the five terms of ``topas_terms``; the search (:meth:`_DecisionCtx.search`)
scores prefix sets, each once (memoised).

Every float sum runs in the same order as the plain formula's (sorted agents, the running
order), so the scores, hence the decisions, do not depend on how they are computed here
(``tests/test_topas_pinned.py`` pins them).
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import numpy as np

from topas.engine.view import EngineView, RequestView, TaskView
from topas.policies.estimates import OperatingPoint
from topas.policies.topas_task import _MemoEstimator, _TaskCtx, pending_stages, task_shapes
from topas.policies.topas_terms import (
    aging,
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


#: a prefix set's per-agent sums (``_DecisionCtx._screen_setup``): prefix tokens, tokens + kept
#: running demand, running requests kept, loads, the screen's weight and gain, the memo key
_Sums = tuple[int, int, int, int, float, float, int]


@dataclass
class _Plan:
    resident: frozenset[str]
    admit: list[tuple[str, float]]  # (rid, lambda_r) in admission order
    preempt: list[str]
    score: float
    terms: dict[str, float]


class _DecisionCtx:
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

        def residual(agent: str, x: int, generated: int) -> Any:
            """The "sampled" estimator's draws of a stage's residual time."""
            pv = prefixes[agent]
            draws = est.sample_remaining(agent, pv.expected_output_tokens, generated, rng, p.samples)
            return prefill_time(x + generated, pv.tokens) + draws * tpot

        tasks = policy.history.tasks(view)  # online DAGs: completed from the workflow's history
        running_by_task: dict[str, set[str]] = {}
        for r in view.running:
            running_by_task.setdefault(r.task_id, set()).add(r.stage_id)
        gen_by_task: dict[str, dict[str, int]] = {}  # the ready stages' generated tokens
        for r in itertools.chain(view.running, view.waiting):
            gen_by_task.setdefault(r.task_id, {})[r.stage_id] = r.generated
        # Only tasks with waiting requests are scored (L_i and Delta_task).
        self.tasks: dict[str, _TaskCtx] = {}
        shapes, policy._shape_memo = task_shapes(policy._shape_memo, tasks, sorted({r.task_id for r in view.waiting}))
        parts = policy.residual_parts(view) if rng is None else None
        for tid, shape in shapes.items():
            tv = tasks[tid]
            ready = gen_by_task[tid]
            res: dict[str, Any] = {}
            if parts is not None:
                # A running stage is in H, which takes no time: its residual is never read.
                running = running_by_task.get(tid, ())
                for s, agent, x in shape[2]:
                    if s in running:
                        continue
                    y = ready.get(s, 0)
                    d = parts[agent]
                    pr = d.get((x, y))
                    if pr is None:
                        pv = prefixes[agent]
                        pr = d[(x, y)] = (prefill_time(x + y, pv.tokens),
                                          est.expected_remaining(agent, pv.expected_output_tokens, y))
                    res[s] = pr[0] + pr[1] * tpot
            else:
                for s, agent, x in shape[2]:
                    res[s] = residual(agent, x, ready.get(s, 0))
            g = aging(view.time, tv.arrival, p.rho, p.H_age, p.aging_form) if p.aging else 1.0
            self.tasks[tid] = _TaskCtx(tv, res, frozenset(running_by_task.get(tid, ())), g,
                                       p.sibling_share, p.admit_norm, shape, rng is None)
        self._lookahead_setup(tasks, gen_by_task, view)
        self._waiting_setup(view, est, parts)
        self._running_setup(view, est, op)
        self._moves_setup(view)

    # ------------------------------------------------------------------ per-decision set-up
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
        self.reload = self._reload_prices(view)
        self._reuse_max = [(a, n * self.reload[a]) for a, n in sorted(n_max.items())]

    def _reload_prices(self, view: EngineView) -> dict[str, float]:
        """V_reuse's price of one later use of each agent's resident prefix (``reuse_cost``): the
        swap ``mu * l_a / B_swap`` (the paper's), or what the engine pays to bring the prefix
        back once evicted: a prefill of ``l_a`` without a host tier, a swap with one."""
        move_times = self.policy.move_times_of(view.cost)
        recompute = self.p.reuse_cost == "engine" and not view.host_tier
        return {a: move_times(pv.tokens)[1 if recompute else 0] for a, pv in view.prefixes.items()}

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
        #: the candidates with a positive gain by gain per token (``_bound``'s fractional knapsack)
        self._by_density = sorted(((c[3], c[4], c[1], c[2]) for c in self._packable if c[3] > 0),
                                  key=lambda c: -c[0] / c[1] if c[1] > 0 else -float("inf"))
        #: the smallest demand from each candidate on: GREEDYPACK stops once none of them fits
        self._min_need_after = list(itertools.accumulate(reversed([c[4] for c in self._packable]), min))[::-1]

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
        """Prefix moves' times, and the search's pool."""
        p = self.p
        self.move_in: dict[str, float] = {}
        self.move_out: dict[str, float] = {}
        move_times = self.policy.move_times_of(view.cost)
        for a, pv in view.prefixes.items():
            swap, prefill = move_times(pv.tokens)
            self.move_in[a] = swap if pv.on_host else prefill
            self.move_out[a] = 0.0 if pv.on_host else swap
            if p.move_cost == "engine":
                # without a host tier an eviction unpins (free) and a still cached prefix is
                # pinned again for free; with one, an eviction writes the host copy (a swap)
                if pv.cached:
                    self.move_in[a] = 0.0
                if not view.host_tier:
                    self.move_out[a] = 0.0
        self.r_t = view.resident
        self.prefix_len = {a: pv.tokens for a, pv in view.prefixes.items()}
        active = {r.agent for r in view.waiting} | set(self.running_by_agent)
        #: agents every R' keeps: those with running requests, unless preemption is allowed
        self.must = frozenset(() if p.preempt else self.running_by_agent)
        #: the agents the search may add or drop
        self.pool = tuple(sorted((active | self.r_t) - self.must))
        #: each agent's bit: a prefix set's key in the memo is the sum of its members' bits
        self._bit = {a: 1 << i for i, a in enumerate(view.prefixes)}
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

    def _screen_setup(self) -> None:
        """What :meth:`_scan` needs to reject most R' from per-agent sums, before
        ``_evaluate`` builds any list: each agent's share of R''s prefix tokens, of the room
        left for admissions, of the running requests R' preempts, whether it is a load, and of
        the screen's bound of the score.

        The screen: ``Score(R') <= const + sum_{a in R'} w_a - max(0, sum_{a in R'} A_a -
        FK(free)) + margin``, where ``A_a`` is the sum of agent a's positive candidate gains and
        ``FK(free)`` the fractional knapsack of every positive candidate in ``free`` tokens
        (J_admit is at most both), ``w_a = A_a + beta * n_max_a * reload_a`` (V_reuse's most),
        ``- move_in_a`` for an agent outside R_t, ``+ move_out_a`` for one in R_t (``const``
        charges every move out of R_t, each agent R' keeps refunds its own), and ``+ P_a`` for a
        busy agent, whose preemption would cost ``P_a`` = its requests' J_redo (``decode``) and
        J_revoke (``const`` charges every busy agent's, each one R' keeps refunds it). J_move's
        ``|T_in|`` factor (>= 1) and ``reprefill``'s J_redo (>= 0) only lower the score, so they
        are left out. ``margin`` (1e-9 of the terms' magnitudes) covers the float rounding of
        these sums, in any order, and of the score's own, so the screen never rejects an R' that
        could score the floor: it changes which R' are scored in full, never the decision."""
        p = self.p
        gains: dict[str, float] = {}
        for gain, _need, agent, _task in self._by_density:
            gains[agent] = gains.get(agent, 0.0) + gain
        reuse = dict(self._reuse_max) if p.reuse else {}
        const = 0.0
        #: per agent: (prefix tokens, prefix tokens + kept running demand, running requests,
        #: 1 if a load, w_a, A_a, its bit); a set's sums are the sums of its members'
        self._agent_sums: dict[str, _Sums] = {}
        for a, tokens in self.prefix_len.items():
            w = gains.get(a, 0.0) + p.beta * reuse.get(a, 0.0)
            if a in self.r_t:
                const -= self.move_out[a]
                w += self.move_out[a]
            else:
                w -= self.move_in[a]
            rs = self.running_by_agent.get(a)
            if rs:
                pen = sum(self.credit[r.rid] for r in rs)
                if p.redo == "decode":
                    pen += self.tpot * sum(r.generated for r in rs)
                const -= pen
                w += pen
            self._agent_sums[a] = (tokens, tokens + self.run_demand_by_agent.get(a, 0), self._n_running.get(a, 0),
                                   int(a not in self.r_t), w, gains.get(a, 0.0), self._bit[a])
        #: free = B_t - (sum of the members' tokens + kept demand); preempted requests =
        #: _n_busy - (sum of the members' running requests)
        self._n_busy = sum(self._n_running.values())
        self._max_preempt = p.K if p.preempt else 0
        self._screen_needs = list(itertools.accumulate(c[1] for c in self._by_density))
        self._screen_gains = list(itertools.accumulate(c[0] for c in self._by_density))
        self._screen_const = const
        self._screen_margin = 1e-9 * (abs(const) + sum(abs(v[4]) for v in self._agent_sums.values())
                                      + sum(gains.values())) + 1e-12

    def _sums(self, resident: frozenset[str]) -> _Sums:
        """The per-agent sums (``_screen_setup``) of R', each the sum of its members' (the last,
        its memo key); :meth:`_scan` adds and subtracts the same terms per move."""
        t = room = n = loads = key = 0
        w = a = 0.0
        for x in resident:
            v = self._agent_sums[x]
            t, room, n, loads, w, a, key = t + v[0], room + v[1], n + v[2], loads + v[3], w + v[4], a + v[5], key + v[6]
        return t, room, n, loads, w, a, key

    def _screen(self, free: int, s_w: float, s_a: float) -> float:
        """The screen's upper bound of Score(R', Q') (``_screen_setup``), looser than ``_bound``'s."""
        fk = 0.0
        if free > 0:
            needs = self._screen_needs
            i = bisect.bisect_right(needs, free)
            fk = self._screen_gains[i - 1] if i else 0.0
            if i < len(needs):
                gain, need = self._by_density[i][0], self._by_density[i][1]
                fk += gain * (free - (needs[i - 1] if i else 0)) / need
        return self._screen_const + s_w - max(0.0, s_a - fk) + self._screen_margin

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
        total = 0.0
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
            total += gain
        return admitted, total

    # ------------------------------------------------------------------ search over R'
    def search(self) -> tuple[_Plan, int]:
        """The best post-decision state and the number of prefix sets evaluated."""
        self._best: _Plan | None = None
        self._screen_setup()
        self._scan(self._sums(self.r_t), self.r_t, [((), ())])
        if len(self.pool) <= self.p.M or self.p.search == "exhaustive":
            for k in range(len(self.pool) + 1):
                for combo in itertools.combinations(self.pool, k):
                    resident = self.must | frozenset(combo)
                    self._scan(self._sums(resident), resident, [((), ())])
        else:
            self._local_search()
        best = self._best
        if best is None or (not best.admit and not self.view.running):
            best = self._liveness() or best
        assert best is not None, "the current prefix set is always feasible"
        return best, len(self._memo)

    def _scan(self, base: _Sums, cur: frozenset[str],
              moves: Iterable[tuple[tuple[str, ...], tuple[str, ...]]]) -> bool:
        """Score each R' = ``cur`` + added - removed of ``moves`` in order (``cur``'s sums are
        ``base``); True if one beat the incumbent. Most R' are rejected from their sums alone
        (over the budget, too many preemptions, a load without room, or the screen), as
        ``_evaluate`` would reject them; the set itself is built only to be scored."""
        t0, u0, n0, l0, w0, a0, k0 = base
        sums, memo, budget = self._agent_sums, self._memo, self.view.kv_budget
        max_busy = self._n_busy - self._max_preempt  # fewer kept running requests: too many preemptions
        improved = False
        for added, removed in moves:
            t, u, n, loads, w, a, key = t0, u0, n0, l0, w0, a0, k0
            for x in added:
                v = sums[x]
                t, u, n, loads, w, a, key = t + v[0], u + v[1], n + v[2], loads + v[3], w + v[4], a + v[5], key + v[6]
            for x in removed:
                v = sums[x]
                t, u, n, loads, w, a, key = t - v[0], u - v[1], n - v[2], loads - v[3], w - v[4], a - v[5], key - v[6]
            if t > budget:
                continue
            plan = memo.get(key, memo)
            best = self._best
            if plan is memo:  # not scored yet; None also when it cannot beat the incumbent
                free = budget - u
                if n < max_busy or (free < 0 and loads) or (best is not None and self._screen(free, w, a) < best.score):
                    plan = None
                else:
                    resident = cur.union(added).difference(removed)
                    plan = self._evaluate(resident, False, t, best.score if best is not None else None)
                memo[key] = plan
            if plan is None or (best is not None and not self._better(plan, best)):
                continue
            self._best = plan
            improved = True
        return improved

    def _local_search(self) -> None:
        """From R_t: single additions; pair additions when stuck; then deletions and swaps; with
        ``search="local+"`` then drop-two-add-one moves."""
        for _ in range(4 * len(self.pool) + 4):
            cur = self._best.resident if self._best is not None else self.r_t
            outside = [a for a in self.pool if a not in cur]
            inside = sorted(cur - self.must)
            base = self._sums(cur)
            for moves in self._neighbourhoods(inside, outside):
                # evaluate the whole neighbourhood (no short-circuit), keep the best
                if self._scan(base, cur, moves):
                    break
            else:
                return

    def _neighbourhoods(self, inside: list[str], outside: list[str]) -> Iterator[Iterator[tuple[tuple[str, ...], tuple[str, ...]]]]:
        """The local search's neighbourhoods of the incumbent, in the order they are tried, each
        built only when the ones before it did not improve; each move as the agents it adds (from
        ``outside``) and drops (from ``inside``)."""
        yield (((a,), ()) for a in outside)
        yield (((a, b), ()) for a, b in itertools.combinations(outside, 2))
        yield itertools.chain((((), (a,)) for a in inside), (((b,), (a,)) for a in inside for b in outside))
        if self.p.search == "local+":
            yield (((c,), (a, b)) for a, b in itertools.combinations(inside, 2) for c in outside)

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
            keep = [a for a in sorted(self.r_t, key=lambda a: (-self.view.prefixes[a].last_used, a)) if a != r.agent]
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
        if r.agent in self._caps:  # the in-batch guard: that request computes the prefix alone
            admit = admit[:1]
        return _Plan(frozenset({r.agent}), admit, [], plan.score if plan else 0.0, plan.terms if plan else {})
