"""TOPAS's decision set-up in fewer passes: what ``_DecisionCtx``'s readable set-up computes
(each task's residuals, ``g_i(t)`` and ``g_i(t) * Delta_task`` shares, the waiting requests'
demands ``d_r(t)``, the running requests' kept demands and credits ``lambda_r`` (``J_revoke``),
the pending stages for ``n_a(t)`` (``V_reuse``)), the same values in the same containers and
orders, with one pass over the running requests where the readable set-up makes eight, the
pending stages' index by parent kept while the tasks' pending lists are the same objects, the
gains straight from ``longest_path_pair`` (``delta_task``'s two longest paths), and what only the
reference's code reads left out (the functions at the end of this module: ``_DecisionCtx``
computes each when first read).

The readable set-up (``topas_decision``: ``_DecisionCtx.__init__`` with ``_lookahead_setup``,
``_waiting_setup``, ``_running_setup``) is the reference: it runs with the reference search
(``TOPAS_SEARCH=reference``) and for the configurations this one does not cover (``covers``);
``tests/test_topas_compiled.py`` checks, at every decision of the pinned runs, that the two leave
the same attributes (values, Python types, dict orders). Every float is computed by the same
operations in the same order, so the scores do not change.

Where the compiled search runs with the parameters this set-up covers, the compiled set-up
(``topas_setup_compiled``) lays the search's arrays out instead, checked equal to those this
set-up gives; this one then computes the decision's attributes only when the reference's code
reads them (the liveness fallback, ``TopasRequestOnly``).
"""

from __future__ import annotations

import itertools
from typing import Any

from topas.policies.topas_task import _TaskCtx, pending_lists, stage_residuals, task_shapes
from topas.policies.topas_terms import aging, longest_path_pair


def covers(p: Any) -> bool:
    """Whether this set-up computes what the readable one does for parameters ``p`` (the
    "expected" estimator, J_redo "decode", absolute admission gains split by residual)."""
    return (p.estimator == "expected" and p.redo == "decode" and p.admit_norm == "absolute"
            and p.sibling_share == "residual")


def setup(ctx: Any, policy: Any, view: Any, est: Any, parts: dict[str, dict[tuple[int, int], tuple[float, float]]],
          prefill_time: Any, tasks: Any) -> None:
    """Set ``ctx``'s per-decision attributes, as ``_DecisionCtx``'s readable set-up does
    (``parts``: ``Topas.residual_parts``; ``tasks``: the tasks' views)."""
    p = ctx.p
    tpot = ctx.tpot
    prefixes = view.prefixes
    engine = p.demand == "engine"
    # ---- the running requests, one pass: by task, by agent, kept demand, credit lambda_r
    running_by_task: dict[str, set[str]] = {}
    gen_by_task: dict[str, dict[str, int]] = {}  # per task, its ready stages' y_r (running first)
    running_by_agent: dict[str, list[Any]] = {}
    run_demand: dict[str, int] = {}
    per_task: dict[str, int] = {}
    credit: dict[str, float] = {}
    credits = policy.credits
    revalue = p.revalue_credit and p.aging
    aging_now: dict[float, float] = {}  # g_i(t) at this decision's t, by task arrival
    aging_memo = policy._aging_memo  # g_i at admission, kept for the run
    vtasks, t_now, rho, h_age, form = view.tasks, view.time, p.rho, p.H_age, p.aging_form
    remaining, reserve = est.est.expected_remaining, p.output_reserve
    for r in view.running:
        rid, tid, agent = r.rid, r.task_id, r.agent
        at = running_by_task.get(tid)
        if at is None:
            running_by_task[tid] = {r.stage_id}
            gen_by_task[tid] = {r.stage_id: r.generated}
            per_task[tid] = 1
        else:
            at.add(r.stage_id)
            gen_by_task[tid][r.stage_id] = r.generated
            per_task[tid] += 1
        rs = running_by_agent.get(agent)
        if rs is None:
            running_by_agent[agent] = [r]
        else:
            rs.append(r)
        if engine:  # its KV and the engine's reservation for it (``hold_tokens``)
            run_demand[rid] = r.kv_tokens + r.reserve
        else:
            run_demand[rid] = r.kv_tokens + int(reserve * remaining(agent, prefixes[agent].expected_output_tokens,
                                                                     r.generated))
        lam = credits.get(rid, 0.0)  # ``_DecisionCtx._credit``
        if revalue and r.admitted_time is not None:
            arrival = vtasks[tid].arrival
            now = aging_now.get(arrival)
            if now is None:
                now = aging_now[arrival] = aging(t_now, arrival, rho, h_age, form)
            then = aging_memo.get((r.admitted_time, arrival))
            if then is None:
                then = aging_memo[(r.admitted_time, arrival)] = aging(r.admitted_time, arrival, rho, h_age, form)
            lam = lam * now / then
        credit[rid] = lam
    waiting = view.waiting
    for r in waiting:
        at = gen_by_task.get(r.task_id)
        if at is None:
            gen_by_task[r.task_id] = {r.stage_id: r.generated}
        else:
            at[r.stage_id] = r.generated
    # ---- the tasks with waiting requests: residuals (delta_task's), g_i(t)
    ctx.tasks = tcs = {}
    shapes, policy._shape_memo = task_shapes(policy._shape_memo, tasks, sorted({r.task_id for r in waiting}))
    use_aging, share = p.aging, p.sibling_share
    empty: tuple[str, ...] = ()
    for tid, shape in shapes.items():
        tv = tasks[tid]
        running = running_by_task.get(tid, empty)
        res = stage_residuals(shape, running, gen_by_task[tid], parts, prefixes, prefill_time, est, tpot)
        g = aging(t_now, tv.arrival, rho, h_age, form) if use_aging else 1.0
        tcs[tid] = _TaskCtx(tv, res, frozenset(running), g, share, "absolute", shape, True)
    # ---- the pending stages (n_a(t)), indexed by parent, and n_a(t) for Q' = the running set
    # The pending stages' list and its index by parent are functions of the per-task lists
    # (``pending_lists``, memoised per task), kept while those are the same objects; the counts of
    # running parents are the decision's own.
    lists, policy._pending_memo = pending_lists(policy._pending_memo, tasks, gen_by_task)
    kept = getattr(policy, "_pending_index", None)
    if kept is not None and len(kept[0]) == len(lists) and all(a is b for a, b in zip(kept[0], lists)):
        _, pending, need, by_parent, n_max = kept
    else:
        pending = []
        for pend in lists:
            pending.extend(pend)
        need = []
        by_parent: dict[str, list[int]] = {}
        n_count: dict[str, int] = {}
        for i, (agent, ps) in enumerate(pending):
            for q in ps:
                at = by_parent.get(q)
                if at is None:
                    by_parent[q] = [i]
                else:
                    at.append(i)
            need.append(len(ps))
            if ps:
                n_count[agent] = n_count.get(agent, 0) + 1
        n_max = sorted(n_count.items())
        policy._pending_index = (lists, pending, need, by_parent, n_max)
    ctx.pending = pending
    ctx._running_per_task = per_task
    nrun = [0] * len(pending)  # per pending stage, its running parents
    for rid in run_demand:
        at = by_parent.get(rid)
        if at is not None:
            for i in at:
                nrun[i] += 1
    in_base = [n > 0 and k == n for n, k in zip(need, nrun)]
    ctx._la_need, ctx._la_running, ctx._la_in_base, ctx._la_by_parent = need, nrun, in_base, by_parent
    reload = ctx.reload = policy._state.reload
    ctx._reuse_max = [(a, n * reload[a]) for a, n in n_max]
    # ---- the waiting requests: d_r(t), each task's frontier, the gains, the candidates
    demand: dict[str, int] = {}
    for r in waiting:
        if engine:  # ``admit_tokens``: the engine's admission check
            demand[r.rid] = r.input_tokens + r.generated + 1 + r.reserve
        else:
            demand[r.rid] = r.input_tokens + r.generated + int(reserve * parts[r.agent][(r.input_tokens, r.generated)][1])
        tcs[r.task_id].waiting.append(r)
    ctx.demand = demand
    # the gains g_i(t) * Delta_task (``_TaskCtx.frontier_gains``: split over the frontier by
    # residual, ``admit_norm`` "absolute", whose scale is 1.0) and the ranking (``_waiting_ranked``)
    ctx.gain = gain = {}
    arrival: dict[str, float] = {}
    for tid, tc in tcs.items():
        w = tc.waiting
        arrival[tid] = tc.view.arrival
        if len(w) == 1:
            r = w[0]
            before, after = longest_path_pair(tc.order, tc.children, tc.residual, tc.committed, (r.stage_id,))
            gain[r.rid] = tc.g * (before - after) * 1.0
            continue
        w.sort(key=lambda r, pos=tc.position: pos[r.stage_id])
        frontier = tuple(r.stage_id for r in w)
        before, after = longest_path_pair(tc.order, tc.children, tc.residual, tc.committed, frontier)
        total = tc.g * (before - after)
        res = tc.residual
        size = [res[s] for s in frontier]
        norm = sum(size)
        for r, z in zip(w, size):
            gain[r.rid] = (total * z / norm if norm > 0 else total / len(frontier)) * 1.0
    ctx._candidates(view, sorted((-gain[r.rid], arrival[r.task_id], r.rid, r) for r in waiting))
    # ---- the running requests (``_running_setup``; its sums over them: the functions below)
    ctx.running_by_agent = running_by_agent
    ctx.running_demand = 0
    ctx.run_demand = run_demand
    ctx._busy = frozenset(running_by_agent)
    ctx._busy_order = tuple(running_by_agent)
    ctx._aging_now = aging_now
    ctx.credit = credit
    ctx._moves_setup(view)


# What the readable set-up derives from the attributes above and the compiled search derives from
# its arrays itself (``topas_kernel_score.unpack``): left out here, each is computed, as the
# readable set-up computes it, when the reference's code first reads it (the reference search
# before the kernels are loaded, the liveness fallback, ``TopasRequestOnly``): ``_DecisionCtx``
# holds each as a ``functools.cached_property`` (named as the readable set-up names the attribute).


def run_demand_by_agent(ctx: Any) -> dict[str, int]:
    """Each busy agent's running requests' kept demand."""
    return {a: sum(ctx.run_demand[r.rid] for r in rs) for a, rs in ctx.running_by_agent.items()}


def run_demand_total(ctx: Any) -> int:
    return sum(ctx.run_demand_by_agent.values())


def n_running(ctx: Any) -> dict[str, int]:
    return {a: len(rs) for a, rs in ctx.running_by_agent.items()}


def la_base(ctx: Any) -> dict[str, int]:
    """``lookahead_counts(pending, running)``: n_a(t) for Q' = the running set."""
    base: dict[str, int] = {}
    for (agent, _), b in zip(ctx.pending, ctx._la_in_base):
        if b:
            base[agent] = base.get(agent, 0) + 1
    return base


def by_density(ctx: Any) -> list[tuple[float, int, str, str]]:
    """The candidates with a positive gain by gain per token (``_bound``'s fractional knapsack)."""
    return sorted(((c[3], c[4], c[1], c[2]) for c in ctx._packable if c[3] > 0),
                  key=lambda c: -c[0] / c[1] if c[1] > 0 else -float("inf"))


def running_rids(ctx: Any) -> set[str]:
    return {r.rid for rs in ctx.running_by_agent.values() for r in rs}


def running_tasks(ctx: Any) -> set[str]:
    return set(ctx._running_per_task)


def busy_tasks(ctx: Any) -> dict[str, set[str]]:
    return {a: {r.task_id for r in rs} for a, rs in ctx.running_by_agent.items()}


def min_need_after(ctx: Any) -> list[int]:
    """The smallest demand from each candidate on: GREEDYPACK stops once none of them fits."""
    return list(itertools.accumulate(reversed([c[4] for c in ctx._packable]), min))[::-1]

