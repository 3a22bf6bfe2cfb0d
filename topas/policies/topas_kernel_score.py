"""Score(R', Q') of one prefix set, compiled (numba): GREEDYPACK and the five terms over arrays.

The same computation as the reference, :meth:`topas.policies.topas_decision._DecisionCtx._evaluate`
(its ``_bound``, ``_pack``, ``_lookahead``, ``_tasks_in``, ``_redo``) and the pure terms of
:mod:`topas.policies.topas_terms` (``j_admit``, ``j_move``, ``j_redo``, ``j_redo_reprefill``,
``j_revoke``, ``v_reuse``), one function per step, named as there. Every float is computed by the
same operations in the same order as the reference, so the score of a set, hence the decision, is
bit for bit the reference's (``tests/test_topas_compiled.py``): a sum the reference takes with
Python's ``sum()`` is taken by :func:`py_sum_add` / :func:`py_sum_end`, which do what CPython's
``sum()`` does over floats (one addition after another before Python 3.12, Neumaier's compensated
sum from 3.12: the ``compensated`` scalar), and no ``fastmath``.

A prefix set ``R'`` is a bitmask over the decision's agents in sorted name order (bit ``i``:
agent ``i``), so the reference's ``sorted(...)`` over agents is the order of the bits. The
decision's quantities are the arrays of :class:`Arrays` (:func:`unpack`), their columns named
below.

The functions that take arrays are inlined where they are called (numba's ``inline="always"``),
and those called for every prefix set take the few arrays they read, not :class:`Arrays`: each
array a call binds is a reference taken and dropped (an atomic count, not always optimised away),
which at these sizes (ten agents, a dozen requests) would cost more than the work itself. Those
that take numbers only are left to LLVM to inline (numba's own inlining of them doubled the
compile time).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

# Per agent (rows in sorted name order), integers: l_a, the in-batch guard's cap (-1: none), how
# many requests run, their kept demand, n_a(t) for Q' = the running set.
A_TOKENS, A_CAP, A_N_RUN, A_RUN_DEMAND, A_LA_BASE = range(5)
# Per agent, floats: the move in, the move out, V_reuse's reload price, V_reuse's most (0.0 if
# ``_reuse_max`` does not list the agent: adding 0.0 to these sums of non-negative terms changes
# none of them, compensated or not).
A_MOVE_IN, A_MOVE_OUT, A_RELOAD, A_REUSE_MAX = range(4)
# Per running request, in the order preemptions are listed (by busy agent, then running order):
# integers: its agent, y_r (generated tokens), its task, its kept demand; floats: lambda_r
# (J_revoke's credit), the reprefill's prefill time and its expected time to finish (``redo =
# "reprefill"`` only).
R_AGENT, R_GENERATED, R_TASK, R_DEMAND = range(4)
R_CREDIT, R_PREFILL, R_FINISH = range(3)
# Per candidate, in GREEDYPACK's order: integers: its agent, its task, its request id's task
# prefix (``_tasks_in``), d_r(t), the smallest demand from it on; floats: its gain, its expected
# time to finish (reprefill only).
C_AGENT, C_TASK, C_RID_TASK, C_NEED, C_MIN_AFTER = range(5)
C_GAIN, C_FINISH = range(2)
# Per pending stage (``_lookahead_setup``): its agent (-1: not a prefix of the view), its
# unfinished parents, how many of them run, whether it counts in n_a(t) for the running set.
P_AGENT, P_NEED, P_RUNNING, P_IN_BASE = range(4)
# Scalars, integers: B_t, K, the most preemptions (K, or 0 without ``preempt``), every subset
# (1) or the local search (0), local+ (1), reprefill J_redo (1), V_reuse on (1), Python's sum
# compensated (1), R_t and the agents every R' keeps (bitmasks); then, set by ``unpack``: the
# running requests' demand and the tasks with a running request.
(S_BUDGET, S_K, S_MAX_PREEMPT, S_EXHAUSTIVE, S_LOCAL_PLUS, S_REPREFILL, S_REUSE, S_COMPENSATED,
 S_RT, S_MUST, S_RUN_TOTAL, S_RUN_TASKS) = range(12)
N_SCALARS = 10  # the scalars laid out by the caller
# Scalars, floats: beta, T_decode.
F_BETA, F_TPOT = range(2)
# What :func:`evaluate` writes: the five terms and the score.
O_ADMIT, O_MOVE, O_REDO, O_REVOKE, O_REUSE, O_SCORE = range(6)

#: The decision's arrays. ``busy_agent[g]``: the g-th agent with running requests (the running
#: order), its requests the rows ``busy_start[g]:busy_start[g + 1]`` of ``ri``/``rf``;
#: ``task_running[t]``: task t's running requests; ``parent_ptr``/``parent_idx``: the pending
#: stages of each running request (rows 0..) and each candidate (rows len(ri)..), CSR;
#: ``density``: the candidates with a positive gain by gain per token (``_by_density``).
Arrays = namedtuple("Arrays", "ai af ri rf busy_agent busy_start ci cf pi parent_ptr parent_idx task_running "
                              "pool pref_order si sf density")
#: :func:`evaluate`'s work rows: the preempted running requests, the preempted tasks (flags), the
#: in-batch guard's count per agent, per-task marks, n_a(t) per agent, each pending stage's change.
Scratch = namedtuple("Scratch", "rows pre_task used seen counts moved")


@njit
def py_sum_add(f, c, x, compensated):
    """One step of Python's ``sum()`` over floats: ``(total, compensation)`` after adding ``x``."""
    if not compensated:
        return f + x, c
    t = f + x
    if abs(f) >= abs(x):
        c += (f - t) + x
    else:
        c += (x - t) + f
    return t, c


@njit
def py_sum_end(f, c, compensated):
    """Python's ``sum()`` over floats once every item is added."""
    if compensated and c != 0.0 and np.isfinite(c):
        return f + c
    return f


@njit(inline="always")
def preempted_rows(busy_agent, busy_start, mask, rows):
    """The running requests R' preempts (those of the busy agents it drops, in the order
    preemptions are listed) into ``rows``; their number."""
    n = 0
    for g in range(len(busy_agent)):
        if not (mask >> busy_agent[g]) & 1:
            for j in range(busy_start[g], busy_start[g + 1]):
                rows[n] = j
                n += 1
    return n


@njit(inline="always")
def column_sum(table, rows, n, col, compensated):
    """Python's ``sum()`` of ``table[rows[k], col]`` over the first ``n`` of ``rows``, in that order."""
    f = c = 0.0
    for k in range(n):
        f, c = py_sum_add(f, c, table[rows[k], col], compensated)
    return py_sum_end(f, c, compensated)


@njit(inline="always")
def credits_of(rf, rows, n, compensated):
    """``sum(lambda_r)`` over the first ``n`` of ``rows`` (J_revoke's sum)."""
    return column_sum(rf, rows, n, R_CREDIT, compensated)


@njit(inline="always")
def generated_of(ri, rows, n):
    """``sum(y_r)`` over the first ``n`` of ``rows`` (J_redo's, integers)."""
    total = 0
    for k in range(n):
        total += ri[rows[k], R_GENERATED]
    return total


@njit(inline="always")
def bound(density, ci, cf, af, ri, rf, si, sf, mask, free, pre_task, rows, n_pre, move_sum, compensated):
    """``_bound``: an upper bound of Score(R', Q') for every Q' GREEDYPACK can pick, in the
    reference's order of operations."""
    room, admit = free, 0.0
    for k in range(len(density)):
        i = density[k]
        if not (mask >> ci[i, C_AGENT]) & 1 or pre_task[ci[i, C_TASK]]:
            continue
        need, gain = ci[i, C_NEED], cf[i, C_GAIN]
        if need <= room:
            room -= need
            admit += gain
        else:
            if room > 0:
                admit += gain * room / need
            break
    b = (admit * (1.0 + 1e-9) + 1e-12) - move_sum
    if n_pre:
        if not si[S_REPREFILL]:
            b -= sf[F_TPOT] * generated_of(ri, rows, n_pre)
        b -= credits_of(rf, rows, n_pre, compensated)
    if si[S_REUSE]:
        f = c = 0.0
        for a in range(af.shape[0]):
            if (mask >> a) & 1:
                f, c = py_sum_add(f, c, af[a, A_REUSE_MAX], compensated)
        b += sf[F_BETA] * py_sum_end(f, c, compensated) * (1.0 + 1e-9) + 1e-12
    return b


@njit(inline="always")
def greedypack(ai, ci, cf, K, mask, free, pre_task, admitted, used):
    """GREEDYPACK(R') (``_pack``, ``force=False``): admit by largest gain while the budget, K and
    the in-batch guard allow; the admitted candidates into ``admitted``, their number."""
    used[:] = 0
    n = 0
    for i in range(ci.shape[0]):
        if n >= K:
            break
        if cf[i, C_GAIN] <= 0:
            break
        if free < ci[i, C_MIN_AFTER]:
            break  # nothing from here on fits
        a = ci[i, C_AGENT]
        if not (mask >> a) & 1 or pre_task[ci[i, C_TASK]]:
            continue
        need = ci[i, C_NEED]
        if need > free:
            continue
        cap = ai[a, A_CAP]
        if cap >= 0:
            if used[a] >= cap:
                continue  # the in-batch guard
            used[a] += 1
        free -= need
        admitted[n] = i
        n += 1
    return n


@njit(inline="always")
def j_admit(cf, admitted, n_adm, compensated):
    """J_admit: the sum of the admitted requests' gains, in admission order."""
    return column_sum(cf, admitted, n_adm, C_GAIN, compensated)


@njit(inline="always")
def tasks_in(ri, ci, task_running, run_tasks, rows, n_pre, admitted, n_adm, seen):
    """|T_in| (``_tasks_in``): the tasks with a request in Q' (running and kept, or admitted)."""
    kept = run_tasks
    seen[:] = 0
    for k in range(n_pre):  # less the tasks whose every running request is preempted
        seen[ri[rows[k], R_TASK]] += 1
    for k in range(n_pre):
        t = ri[rows[k], R_TASK]
        if seen[t] == task_running[t]:
            kept -= 1
            seen[t] = -1  # counted once
    seen[:] = 0
    for k in range(n_adm):
        t = ci[admitted[k], C_RID_TASK]
        if task_running[t] == 0 and seen[t] == 0:
            seen[t] = 1
            kept += 1
    return kept


@njit(inline="always")
def j_redo(busy_agent, busy_start, ri, rf, cf, si, sf, mask, rows, n_pre, admitted, n_adm, compensated):
    """J_redo of the preempted requests: ``T_decode * sum(y_r)`` (``decode``), or one prefill
    each after the re-wait, the earliest expected finish in Q' (``reprefill``)."""
    if not n_pre:
        return 0.0
    if not si[S_REPREFILL]:
        return sf[F_TPOT] * generated_of(ri, rows, n_pre)
    rewait, found = 0.0, False
    for g in range(len(busy_agent)):
        if (mask >> busy_agent[g]) & 1:  # kept
            for j in range(busy_start[g], busy_start[g + 1]):
                x = rf[j, R_FINISH]
                if not found or x < rewait:
                    rewait, found = x, True
    for k in range(n_adm):
        x = cf[admitted[k], C_FINISH]
        if not found or x < rewait:
            rewait, found = x, True
    f = c = 0.0
    for k in range(n_pre):
        f, c = py_sum_add(f, c, rf[rows[k], R_PREFILL], compensated)
    prefills = py_sum_end(f, c, compensated)
    f = c = 0.0
    for k in range(n_pre):
        f, c = py_sum_add(f, c, rewait, compensated)
    return prefills + py_sum_end(f, c, compensated)


@njit(inline="always")
def v_reuse(ai, af, pi, parent_ptr, parent_idx, beta, first_cand, mask, rows, n_pre, admitted, n_adm, counts, moved,
            compensated):
    """V_reuse = beta * sum over a in R' of n_a(t) * reload_a, n_a(t) for Q' counted by delta from
    the running set (``_lookahead``); the agents in sorted order, those with n_a(t) = 0 left
    out. Returns ``(V_reuse, whether any agent counted)``."""
    counts[:] = ai[:, A_LA_BASE]
    moved[:] = 0
    for k in range(n_pre):
        j = rows[k]
        for e in range(parent_ptr[j], parent_ptr[j + 1]):
            moved[parent_idx[e]] -= 1
    for k in range(n_adm):
        j = first_cand + admitted[k]
        for e in range(parent_ptr[j], parent_ptr[j + 1]):
            moved[parent_idx[e]] += 1
    for e in range(pi.shape[0]):
        if moved[e] == 0:
            continue  # unchanged (a stage whose parents moved both ways is unchanged as well)
        now = pi[e, P_RUNNING] + moved[e] == pi[e, P_NEED]
        if now != (pi[e, P_IN_BASE] != 0) and pi[e, P_AGENT] >= 0:
            counts[pi[e, P_AGENT]] += 1 if now else -1
    f = c = 0.0
    any_counted = False
    for a in range(ai.shape[0]):
        if (mask >> a) & 1 and counts[a] != 0:
            f, c = py_sum_add(f, c, counts[a] * af[a, A_RELOAD], compensated)
            any_counted = True
    return beta * py_sum_end(f, c, compensated), any_counted


@njit(inline="always")
def evaluate(d, w, mask, tokens, floor, has_floor, admitted, out):
    """Score R' (``_evaluate``: the plan of prefix set ``mask``, ``tokens`` its l_a summed; ``w``
    the work rows, :class:`Scratch`).

    Returns ``(status, n_preempted, n_admitted, whether V_reuse counted an agent)``: status 0 if
    R' is infeasible or, with ``has_floor``, cannot score ``floor`` (``_bound``); else 1, the
    admitted candidates in ``admitted`` and the terms and score in ``out``."""
    ai, af, ri, rf, ci, cf, si, sf = d.ai, d.af, d.ri, d.rf, d.ci, d.cf, d.si, d.sf
    busy_agent, busy_start, rows, pre_task = d.busy_agent, d.busy_start, w.rows, w.pre_task
    compensated = si[S_COMPENSATED] != 0
    n_pre = preempted_rows(busy_agent, busy_start, mask, rows)
    free = si[S_BUDGET] - tokens
    if n_pre:  # integer counts first
        if n_pre > si[S_MAX_PREEMPT]:
            return 0, 0, 0, False
        dropped_demand = 0
        for k in range(n_pre):
            dropped_demand += ri[rows[k], R_DEMAND]
        free -= si[S_RUN_TOTAL] - dropped_demand
    else:
        free -= si[S_RUN_TOTAL]
    rt = si[S_RT]
    if free < 0 and mask & ~rt:
        return 0, 0, 0, False  # no room to load a prefix
    pre_task[:] = 0
    for k in range(n_pre):
        pre_task[ri[rows[k], R_TASK]] = 1
    # J_move's two sums, each in sorted agent order: the loads' move in, the evictions' move out
    fi = c_in = fo = c_out = 0.0
    moves_cost = False  # |T_in| matters only when something moves at a cost
    for a in range(ai.shape[0]):
        bit = (mask >> a) & 1
        if bit and not (rt >> a) & 1:
            fi, c_in = py_sum_add(fi, c_in, af[a, A_MOVE_IN], compensated)
            moves_cost = True
        elif not bit and (rt >> a) & 1:
            fo, c_out = py_sum_add(fo, c_out, af[a, A_MOVE_OUT], compensated)
            if af[a, A_MOVE_OUT] != 0.0:
                moves_cost = True
    move_sum = py_sum_end(fi, c_in, compensated) + py_sum_end(fo, c_out, compensated)
    if has_floor and bound(d.density, ci, cf, af, ri, rf, si, sf, mask, free, pre_task, rows, n_pre, move_sum,
                           compensated) < floor:
        return 0, 0, 0, False
    n_adm = greedypack(ai, ci, cf, si[S_K], mask, free, pre_task, admitted, w.used)
    affected = tasks_in(ri, ci, d.task_running, si[S_RUN_TASKS], rows, n_pre, admitted, n_adm, w.seen) \
        if moves_cost else 0
    out[O_ADMIT] = j_admit(cf, admitted, n_adm, compensated)
    out[O_MOVE] = move_sum * max(affected, 1)  # J_move
    out[O_REDO] = j_redo(busy_agent, busy_start, ri, rf, cf, si, sf, mask, rows, n_pre, admitted, n_adm, compensated)
    out[O_REVOKE] = credits_of(rf, rows, n_pre, compensated) if n_pre else 0.0  # J_revoke
    reuse_any = False
    out[O_REUSE] = 0.0
    if si[S_REUSE]:
        out[O_REUSE], reuse_any = v_reuse(ai, af, d.pi, d.parent_ptr, d.parent_idx, sf[F_BETA], ri.shape[0], mask,
                                          rows, n_pre, admitted, n_adm, w.counts, w.moved, compensated)
    out[O_SCORE] = out[O_ADMIT] - out[O_MOVE] - out[O_REDO] - out[O_REVOKE] + out[O_REUSE]
    return 1, n_pre, n_adm, reuse_any


@njit
def scratch_for(d):
    """:func:`evaluate`'s work rows (:class:`Scratch`) for the decision ``d``."""
    n_tasks = len(d.task_running)
    return Scratch(np.zeros(d.ri.shape[0], np.int64), np.zeros(n_tasks, np.int64), np.zeros(d.ai.shape[0], np.int64),
                   np.zeros(n_tasks, np.int64), np.zeros(d.ai.shape[0], np.int64), np.zeros(d.pi.shape[0], np.int64))


@njit
def by_density(ci, cf):
    """The candidates with a positive gain, by gain per token (``_by_density``: a stable sort on
    ``-gain / need``, ``-inf`` for no demand)."""
    keep = np.empty(ci.shape[0], np.int64)
    n = 0
    for i in range(ci.shape[0]):
        if cf[i, C_GAIN] > 0:
            keep[n] = i
            n += 1
    keep = keep[:n]
    key = np.empty(n, np.float64)
    for k in range(n):
        need = ci[keep[k], C_NEED]
        key[k] = -cf[keep[k], C_GAIN] / need if need > 0 else -np.inf
    return keep[np.argsort(key, kind="mergesort")]


@njit
def unpack(ints, floats):
    """The decision's :class:`Arrays` from the two arrays ``CompiledSearch._kernel_arrays`` lays
    out: the counts (agents, running requests, busy agents, candidates, pending stages, parent
    links, tasks, pool), the integer scalars, then each table row by row; the float
    scalars, then the float tables. What the reference derives from others (each agent's running
    requests and their demand, n_a(t) for the running set, the tasks with a running request, the
    smallest demand from each candidate on) is derived here."""
    n, m, b, c, p, e, nt, n_pool = ints[:8]
    o = 8
    si = np.zeros(12, np.int64)
    si[:N_SCALARS] = ints[o:o + N_SCALARS]
    o += N_SCALARS
    ai = np.zeros((n, 5), np.int64)
    ai[:, :2] = ints[o:o + 2 * n].reshape(n, 2)  # l_a, the guard's cap
    o += 2 * n
    ri = ints[o:o + 4 * m].reshape(m, 4)
    o += 4 * m
    busy_agent = ints[o:o + b]
    o += b
    busy_start = ints[o:o + b + 1]
    o += b + 1
    ci = np.zeros((c, 5), np.int64)
    ci[:, :4] = ints[o:o + 4 * c].reshape(c, 4)  # agent, task, the rid's task, d_r(t)
    o += 4 * c
    pi = ints[o:o + 4 * p].reshape(p, 4)
    o += 4 * p
    parent_ptr = ints[o:o + m + c + 1]
    o += m + c + 1
    parent_idx = ints[o:o + e]
    o += e
    task_running = ints[o:o + nt]
    o += nt
    pool = ints[o:o + n_pool]
    o += n_pool
    pref_order = ints[o:o + n]
    sf = floats[:2]
    af = floats[2:2 + 4 * n].reshape(n, 4)
    rf = floats[2 + 4 * n:2 + 4 * n + 3 * m].reshape(m, 3)
    cf = floats[2 + 4 * n + 3 * m:2 + 4 * n + 3 * m + 2 * c].reshape(c, 2)
    for j in range(m):  # ``_n_running``, ``run_demand_by_agent``, ``_run_demand_total``
        ai[ri[j, R_AGENT], A_N_RUN] += 1
        ai[ri[j, R_AGENT], A_RUN_DEMAND] += ri[j, R_DEMAND]
        si[S_RUN_TOTAL] += ri[j, R_DEMAND]
    for k in range(p):  # ``_la_base``: the pending stages whose parents all run
        if pi[k, P_IN_BASE] and pi[k, P_AGENT] >= 0:
            ai[pi[k, P_AGENT], A_LA_BASE] += 1
    for t in range(nt):  # ``running_tasks``
        if task_running[t]:
            si[S_RUN_TASKS] += 1
    for i in range(c - 1, -1, -1):  # ``_min_need_after``
        need = ci[i, C_NEED]
        ci[i, C_MIN_AFTER] = need if i == c - 1 or need < ci[i + 1, C_MIN_AFTER] else ci[i + 1, C_MIN_AFTER]
    return Arrays(ai, af, ri, rf, busy_agent, busy_start, ci, cf, pi, parent_ptr, parent_idx, task_running, pool,
                  pref_order, si, sf, by_density(ci, cf))
