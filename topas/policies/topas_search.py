"""TOPAS's search over the prefix set R' (docs/method.md "The search"): the screen that rejects
most candidate sets from per-agent sums, the exhaustive and local searches, the tie rule and the
liveness fallback.

:class:`PrefixSearch` is the search half of one decision's context
(:class:`topas.policies.topas_decision._DecisionCtx`, which derives from it): it reads the
per-decision quantities the context's set-up computed (``p``, ``view``, ``r_t``, ``must``,
``pool``, ``prefix_len``, ``move_in``/``move_out``, ``running_by_agent``, ``credit``, ``tpot``,
``_by_density``, ``_reuse_max``, ``_bit``, ``_memo``, ``cands``, ``gain``, ``demand``, ``_caps``)
and scores a prefix set with the context's ``_evaluate`` / ``evaluate``.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from typing import Iterable, Iterator, NamedTuple


@dataclass
class _Plan:
    """A post-decision state (R', Q') and its score, term by term."""

    resident: frozenset[str]
    admit: list[tuple[str, float]]  # (rid, lambda_r) in admission order
    preempt: list[str]
    score: float
    terms: dict[str, float]


class PrefixSetSums(NamedTuple):
    """A prefix set's sums over its members (each agent's own in ``_agent_sums``): what
    :meth:`PrefixSearch._scan` rejects most R' with, before any list is built."""

    tokens: int  #: sum of l_a
    room: int  #: l_a plus the kept running requests' demand
    running: int  #: running requests kept
    loads: int  #: members outside R_t
    weight: float  #: the screen's w_a
    gain: float  #: the screen's A_a (positive candidate gains)
    key: int  #: the memo key (the members' bits)


class PrefixSearch:
    """The search over R' of one decision (see the module docstring)."""

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
        self._agent_sums: dict[str, PrefixSetSums] = {}
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
            self._agent_sums[a] = PrefixSetSums(tokens, tokens + self.run_demand_by_agent.get(a, 0), self._n_running.get(a, 0),
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

    def _sums(self, resident: frozenset[str]) -> PrefixSetSums:
        """The per-agent sums (``_screen_setup``) of R', each the sum of its members' (the last,
        its memo key); :meth:`_scan` adds and subtracts the same terms per move."""
        t = room = n = loads = key = 0
        w = a = 0.0
        for x in resident:
            v = self._agent_sums[x]
            t, room, n, loads, w, a, key = t + v[0], room + v[1], n + v[2], loads + v[3], w + v[4], a + v[5], key + v[6]
        return PrefixSetSums(t, room, n, loads, w, a, key)

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

    def _scan(self, base: PrefixSetSums, cur: frozenset[str],
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
