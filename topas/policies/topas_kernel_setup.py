"""TOPAS's decision set-up compiled (numba): from the requests and tasks read off the view, the
arrays the compiled search reads (``topas_kernel_score.unpack``'s layout), as
``CompiledSearch._kernel_arrays`` lays them out from the fused set-up's dicts.

The same computation as ``topas_setup_fused.setup`` with ``_DecisionCtx._candidates`` and
``_kernel_arrays``, in the same order of operations: g_i(t) of each scored task and each running
request's credit lambda_r revalued at its task's age (``topas_terms.aging``, ``_DecisionCtx._credit``),
each scored task's residual times (``prefill + remaining * T_decode``), its two longest paths
(``topas_terms.longest_path_pair``), the gains ``g_i(t) * Delta_task`` split over the frontier by
residual (``_TaskCtx.frontier_gains`` with ``sibling_share="residual"``, ``admit_norm="absolute"``),
the ranking (best gain, then the older task, then the request id), each agent's best
``candidates_per_agent``, the pending stages' counts of running parents (``n_a(t)``) and V_reuse's
most per agent, the in-batch guard's caps, the running requests by busy agent and the tasks
numbered as ``_kernel_arrays`` numbers them. So the arrays are equal, element for element, to those
the fused set-up gives (``tests/test_topas_compiled.py`` compares them at every decision of the
pinned runs).

What only Python can read (the views, the output estimator, the cost model, the tasks' shapes,
the pending stages' lists) is laid out by ``topas_setup_compiled`` in two arrays, ``ii`` and
``ff``: the scalars the constants below name, then the tables in the order
:func:`setup_kernel` reads them.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
from numba import njit

from topas.policies.topas_kernel_score import py_sum_add, py_sum_end

# ii's scalars: counts, then the decision's integer parameters.
(I_N_RUN, I_N_WAIT, I_N_TASKS, I_N_STAGES, I_N_KIDS, I_N_PEND, I_N_PARENTS, I_N_AGENTS, I_N_TIDS,
 I_N_IN_H, I_N_OWN, I_BUDGET, I_K, I_PREEMPT, I_M, I_EXHAUSTIVE, I_LOCAL_PLUS, I_REUSE, I_COMPENSATED,
 I_CAND_CAP, I_GUARD, I_RT, I_AGING, I_REVALUE, I_LOG_AGING) = range(25)
N_HEAD = 25
# ff's scalars: T_decode, beta, the decision's time t, rho, H_age.
F_TPOT, F_BETA, F_NOW, F_RHO, F_H_AGE = range(5)
N_FHEAD = 5
# Per running request, in the view's order: its agent, y_r, its task (the decision's task number),
# its kept demand; floats: lambda_r as recorded at its admission, its task's arrival and its
# admission time (NaN: none, or no revaluing). Per waiting request, in the view's order: its agent,
# its task, its scored task, its stage's position in that task's order, d_r(t), its request id's
# rank among the waiting requests' ids, its request id's task.
RUN_COLS = 4
W_AGENT, W_TASK, W_SCORED, W_POS, W_NEED, W_RANK, W_RID_TASK = range(7)
WAIT_COLS = 7
# Per scored task: its first stage (rows of the stage tables), its number of unfinished stages;
# float: its arrival. Per stage, in each task's topological order: its children among the
# unfinished stages, its agent; float: its prefill time with nothing generated. The stages that
# run (in H) and those with tokens generated (their own prefill time and expected remaining output;
# the others': their agent's with nothing generated), by row. Per pending stage: its agent (-1: not
# in the view), its unfinished parents; each parent a request (running row i: i; waiting row j:
# n_run + j; -1: neither). Per agent (in name order): the in-batch guard's cap (-1: none), then
# ``topas_state``'s kernel rows; float: its expected output with nothing generated.


@njit
def aging(t, tau, rho, h_age, log_form):
    """``topas_terms.aging``: g_i(t), ``form="log"`` or ``"linear"``."""
    x = t - tau
    if 0.0 > x:  # max(t - tau, 0.0)
        x = 0.0
    x = x / h_age
    if log_form:
        return 1.0 + rho * math.log1p(x)
    return 1.0 + rho * x


@njit
def ranked_before(gain, task_arrival, wait, i, j):
    """Whether waiting row ``i`` comes before ``j`` in ``sorted((-gain, arrival, rid, r) ...)``:
    as Python compares tuples, the first items that are not equal (``==``) decide (by ``<``)."""
    a, b = -gain[i], -gain[j]
    if a != b:
        return a < b
    a, b = task_arrival[wait[i, W_SCORED]], task_arrival[wait[j, W_SCORED]]
    if a != b:
        return a < b
    return wait[i, W_RANK] < wait[j, W_RANK]  # the request ids' order: unique


@njit
def ranking(gain, task_arrival, wait):
    """The waiting rows best gain first (then the older task, then the request id): a merge sort."""
    n = len(gain)
    order = np.arange(n)
    spare = np.empty(n, np.int64)
    width = 1
    while width < n:
        for lo in range(0, n, 2 * width):
            mid, hi = min(lo + width, n), min(lo + 2 * width, n)
            i, j, k = lo, mid, lo
            while i < mid and j < hi:
                if ranked_before(gain, task_arrival, wait, order[j], order[i]):
                    spare[k] = order[j]
                    j += 1
                else:
                    spare[k] = order[i]
                    i += 1
                k += 1
            while i < mid:
                spare[k] = order[i]
                i += 1
                k += 1
            while j < hi:
                spare[k] = order[j]
                j += 1
                k += 1
        order, spare = spare, order
        width *= 2
    return order


@njit
def setup_kernel(ii, ff):
    """The compiled search's two arrays, the candidates (waiting rows, best first) and each
    waiting request's gain."""
    n_run, n_wait, n_tasks, n_stages = ii[I_N_RUN], ii[I_N_WAIT], ii[I_N_TASKS], ii[I_N_STAGES]
    n_kids, n_pend, n_parents, n_agents, n_tids = ii[I_N_KIDS], ii[I_N_PEND], ii[I_N_PARENTS], ii[I_N_AGENTS], ii[I_N_TIDS]
    compensated = ii[I_COMPENSATED] != 0
    o = N_HEAD
    run = ii[o:o + RUN_COLS * n_run].reshape(n_run, RUN_COLS)
    o += RUN_COLS * n_run
    wait = ii[o:o + WAIT_COLS * n_wait].reshape(n_wait, WAIT_COLS)
    o += WAIT_COLS * n_wait
    task_first = ii[o:o + n_tasks]
    o += n_tasks
    task_n = ii[o:o + n_tasks]
    o += n_tasks
    kid_n = ii[o:o + n_stages]
    o += n_stages
    stage_agent = ii[o:o + n_stages]
    o += n_stages
    n_in_h = ii[I_N_IN_H]
    in_h_rows = ii[o:o + n_in_h]
    o += n_in_h
    n_own = ii[I_N_OWN]
    own_rows = ii[o:o + n_own]
    o += n_own
    kids = ii[o:o + n_kids]
    o += n_kids
    pend_agent = ii[o:o + n_pend]
    o += n_pend
    pend_need = ii[o:o + n_pend]
    o += n_pend
    parents = ii[o:o + n_parents]
    o += n_parents
    agent_cap = ii[o:o + n_agents]
    o += n_agents
    state_ints = ii[o:o + 2 * n_agents]
    o += 2 * n_agents
    pref_order = ii[o:o + n_agents]
    tpot, beta = ff[F_TPOT], ff[F_BETA]
    now, rho, h_age, log_form = ff[F_NOW], ff[F_RHO], ff[F_H_AGE], ii[I_LOG_AGING] != 0
    f = N_FHEAD
    recorded = ff[f:f + n_run]
    f += n_run
    run_arrival = ff[f:f + n_run]
    f += n_run
    admitted_at = ff[f:f + n_run]
    f += n_run
    task_arrival = ff[f:f + n_tasks]
    f += n_tasks
    prefill = ff[f:f + n_stages].copy()
    f += n_stages
    rem0 = ff[f:f + n_agents]
    f += n_agents
    own_pre = ff[f:f + n_own]
    f += n_own
    own_rem = ff[f:f + n_own]
    f += n_own
    state_floats = ff[f:f + 4 * n_agents]
    # a stage's expected remaining output: its agent's with nothing generated, or its own
    remaining = np.empty(n_stages)
    for s in range(n_stages):
        remaining[s] = rem0[stage_agent[s]]
    for e in range(n_own):
        prefill[own_rows[e]] = own_pre[e]
        remaining[own_rows[e]] = own_rem[e]
    in_h = np.zeros(n_stages, np.bool_)
    for e in range(n_in_h):
        in_h[in_h_rows[e]] = True

    # ---- g_i(t) of each scored task; each running request's lambda_r, revalued at its task's age
    # (``_DecisionCtx._credit``)
    task_g = np.ones(n_tasks)
    if ii[I_AGING]:
        for k in range(n_tasks):
            task_g[k] = aging(now, task_arrival[k], rho, h_age, log_form)
    credit = recorded.copy()
    if ii[I_REVALUE]:
        for i in range(n_run):
            if not np.isnan(admitted_at[i]):
                credit[i] = (recorded[i] * aging(now, run_arrival[i], rho, h_age, log_form)
                             / aging(admitted_at[i], run_arrival[i], rho, h_age, log_form))

    # ---- each scored task: residuals, L_i(H) and L_i(H + frontier), the gains
    admitted = np.zeros(n_stages, np.bool_)
    for j in range(n_wait):
        admitted[task_first[wait[j, W_SCORED]] + wait[j, W_POS]] = True
    kid_start = np.empty(n_stages + 1, np.int64)
    kid_start[0] = 0
    for s in range(n_stages):
        kid_start[s + 1] = kid_start[s] + kid_n[s]
    before, after = np.zeros(n_stages), np.zeros(n_stages)
    gain = np.zeros(n_wait)
    frontier = np.empty(n_wait, np.int64)
    for k in range(n_tasks):
        s0, n = task_first[k], task_n[k]
        best_b = best_a = 0.0
        for v in range(n - 1, -1, -1):  # ``longest_path_pair``
            s = s0 + v
            tail_b = tail_a = 0.0
            for e in range(kid_start[s], kid_start[s + 1]):
                c = s0 + kids[e]
                t = before[c]
                if t > tail_b:
                    tail_b = t
                t = after[c]
                if t > tail_a:
                    tail_a = t
            if in_h[s]:
                val_b = 0.0 + tail_b
                val_a = 0.0 + tail_a
            else:
                z = prefill[s] + remaining[s] * tpot
                val_b = z + tail_b
                val_a = (0.0 if admitted[s] else z) + tail_a
            before[s] = val_b
            after[s] = val_a
            if val_b > best_b:
                best_b = val_b
            if val_a > best_a:
                best_a = val_a
        nf = 0  # the task's waiting requests, in topological order
        for j in range(n_wait):
            if wait[j, W_SCORED] == k:
                p = nf
                while p > 0 and wait[frontier[p - 1], W_POS] > wait[j, W_POS]:
                    frontier[p] = frontier[p - 1]
                    p -= 1
                frontier[p] = j
                nf += 1
        if nf == 1:
            gain[frontier[0]] = task_g[k] * (best_b - best_a) * 1.0
            continue
        total = task_g[k] * (best_b - best_a)
        acc = comp = 0.0
        for q in range(nf):
            s = s0 + wait[frontier[q], W_POS]
            acc, comp = py_sum_add(acc, comp, prefill[s] + remaining[s] * tpot, compensated)
        norm = py_sum_end(acc, comp, compensated)
        for q in range(nf):
            s = s0 + wait[frontier[q], W_POS]
            z = prefill[s] + remaining[s] * tpot
            gain[frontier[q]] = (total * z / norm if norm > 0 else total / nf) * 1.0

    # ---- the ranking and each agent's best candidates_per_agent
    ranked = ranking(gain, task_arrival, wait)
    taken = np.zeros(n_agents, np.int64)
    cands = np.empty(n_wait, np.int64)
    n_cands = 0
    for j in ranked:
        a = wait[j, W_AGENT]
        if taken[a] < ii[I_CAND_CAP]:
            taken[a] += 1
            cands[n_cands] = j
            n_cands += 1
    cands = cands[:n_cands]

    # ---- the pending stages: running parents, n_a(t)'s most per agent, the index by parent
    n_req = n_run + n_wait
    nrun = np.zeros(n_pend, np.int64)
    n_max = np.zeros(n_agents, np.int64)
    by_parent_n = np.zeros(n_req + 1, np.int64)
    o = 0
    for i in range(n_pend):
        for e in range(o, o + pend_need[i]):
            q = parents[e]
            if 0 <= q < n_run:
                nrun[i] += 1
            if q >= 0:
                by_parent_n[q + 1] += 1
        o += pend_need[i]
        if pend_need[i] > 0 and pend_agent[i] >= 0:
            n_max[pend_agent[i]] += 1
    for q in range(n_req):
        by_parent_n[q + 1] += by_parent_n[q]
    by_parent = np.empty(by_parent_n[n_req], np.int64)
    fill = by_parent_n[:n_req].copy()
    o = 0
    for i in range(n_pend):
        for e in range(o, o + pend_need[i]):
            q = parents[e]
            if q >= 0:
                by_parent[fill[q]] = i
                fill[q] += 1
        o += pend_need[i]

    # ---- the running requests by busy agent (in the running order), the tasks numbered as
    # ``_kernel_arrays`` numbers them, the parent links of each request row
    busy = np.empty(n_agents, np.int64)
    n_busy = 0
    is_busy = np.zeros(n_agents, np.bool_)
    for i in range(n_run):
        a = run[i, 0]
        if not is_busy[a]:
            is_busy[a] = True
            busy[n_busy] = a
            n_busy += 1
    task_num = np.full(n_tids, -1, np.int64)
    n_knum = 0
    rows = np.empty(n_run, np.int64)
    busy_start = np.empty(n_busy + 1, np.int64)
    busy_start[0] = 0
    r = 0
    for g in range(n_busy):
        for i in range(n_run):
            if run[i, 0] == busy[g]:
                rows[r] = i
                r += 1
                t = run[i, 2]
                if task_num[t] < 0:
                    task_num[t] = n_knum
                    n_knum += 1
        busy_start[g + 1] = r
    task_running_by_tid = np.zeros(n_tids, np.int64)
    for i in range(n_run):
        task_running_by_tid[run[i, 2]] += 1
    cand_task = np.empty(n_cands, np.int64)
    cand_rid_task = np.empty(n_cands, np.int64)
    for c in range(n_cands):
        j = cands[c]
        t = wait[j, W_TASK]
        if task_num[t] < 0:
            task_num[t] = n_knum
            n_knum += 1
        cand_task[c] = task_num[t]
        u = wait[j, W_RID_TASK]
        if task_num[u] < 0:
            task_num[u] = n_knum
            n_knum += 1
        cand_rid_task[c] = task_num[u]
    task_running = np.zeros(n_knum, np.int64)
    for t in range(n_tids):
        if task_running_by_tid[t] > 0:
            task_running[task_num[t]] = task_running_by_tid[t]
    n_flat = 0
    for r in range(n_run):
        q = rows[r]
        n_flat += by_parent_n[q + 1] - by_parent_n[q]
    for c in range(n_cands):
        q = n_run + cands[c]
        n_flat += by_parent_n[q + 1] - by_parent_n[q]

    # ---- the pool: every agent of a request or resident, less those every R' keeps
    rt = ii[I_RT]
    must = 0
    if not ii[I_PREEMPT]:
        for g in range(n_busy):
            must |= 1 << busy[g]
    active = rt
    for i in range(n_run):
        active |= 1 << run[i, 0]
    for j in range(n_wait):
        active |= 1 << wait[j, W_AGENT]
    active &= ~must
    n_pool = 0
    for a in range(n_agents):
        if (active >> a) & 1:
            n_pool += 1

    # ---- the arrays, as ``_kernel_arrays`` lays them out
    n_ints = (18 + 2 * n_agents + 4 * n_run + n_busy + n_busy + 1 + 4 * n_cands + 4 * n_pend + n_run + n_cands + 1
              + n_flat + n_knum + n_pool + n_agents)
    out = np.empty(n_ints, np.int64)
    out[0], out[1], out[2], out[3] = n_agents, n_run, n_busy, n_cands
    out[4], out[5], out[6], out[7] = n_pend, n_flat, n_knum, n_pool
    out[8], out[9] = ii[I_BUDGET], ii[I_K]
    out[10] = ii[I_K] if ii[I_PREEMPT] else 0
    out[11] = 1 if (n_pool <= ii[I_M] or ii[I_EXHAUSTIVE]) else 0
    out[12], out[13], out[14], out[15] = ii[I_LOCAL_PLUS], 0, ii[I_REUSE], ii[I_COMPENSATED]
    out[16], out[17] = rt, must
    o = 18
    out[o:o + 2 * n_agents] = state_ints
    if ii[I_GUARD]:
        for c in range(n_cands):
            a = wait[cands[c], W_AGENT]
            if agent_cap[a] >= 0:
                out[o + 2 * a + 1] = agent_cap[a]
    o += 2 * n_agents
    for r in range(n_run):
        i = rows[r]
        out[o], out[o + 1], out[o + 2], out[o + 3] = run[i, 0], run[i, 1], task_num[run[i, 2]], run[i, 3]
        o += 4
    out[o:o + n_busy] = busy[:n_busy]
    o += n_busy
    out[o:o + n_busy + 1] = busy_start
    o += n_busy + 1
    for c in range(n_cands):
        j = cands[c]
        out[o], out[o + 1], out[o + 2], out[o + 3] = wait[j, W_AGENT], cand_task[c], cand_rid_task[c], wait[j, W_NEED]
        o += 4
    for i in range(n_pend):
        out[o], out[o + 1], out[o + 2] = pend_agent[i], pend_need[i], nrun[i]
        out[o + 3] = 1 if (pend_need[i] > 0 and nrun[i] == pend_need[i]) else 0
        o += 4
    ptr = o
    o += n_run + n_cands + 1
    out[ptr] = 0
    for r in range(n_run + n_cands):
        q = rows[r] if r < n_run else n_run + cands[r - n_run]
        for e in range(by_parent_n[q], by_parent_n[q + 1]):
            out[o] = by_parent[e]
            o += 1
        out[ptr + r + 1] = out[ptr + r] + by_parent_n[q + 1] - by_parent_n[q]
    out[o:o + n_knum] = task_running
    o += n_knum
    for a in range(n_agents):
        if (active >> a) & 1:
            out[o] = a
            o += 1
    out[o:o + n_agents] = pref_order

    floats = np.empty(2 + 4 * n_agents + 3 * n_run + 2 * n_cands)
    floats[0], floats[1] = beta, tpot
    floats[2:2 + 4 * n_agents] = state_floats
    for a in range(n_agents):
        if n_max[a] > 0:
            floats[2 + 4 * a + 3] = n_max[a] * state_floats[4 * a + 2]
    f = 2 + 4 * n_agents
    for r in range(n_run):
        floats[f], floats[f + 1], floats[f + 2] = credit[rows[r]], 0.0, 0.0
        f += 3
    for c in range(n_cands):
        floats[f], floats[f + 1] = gain[cands[c]], 0.0
        f += 2
    return out, floats, cands, gain


def _cached(digest: str):
    """:func:`setup_kernel` behind the one function numba caches (as
    ``topas_kernel_search._cached``: the sources' ``digest`` in its closure, so a change to this
    file or to the sums it calls compiles afresh)."""

    @njit(cache=True)
    def cached_setup_kernel(ii, ff):
        if len(digest) == 0:  # never: ``digest`` is read so that it is part of the closure
            return setup_kernel(ii, ff)
        return setup_kernel(ii, ff)

    return cached_setup_kernel


def _sources_digest() -> str:
    h = hashlib.sha256()
    here = Path(__file__)
    for path in (here, here.with_name("topas_kernel_score.py")):
        try:
            h.update(path.read_bytes())
        except OSError:
            h.update(path.name.encode())
    return h.hexdigest()


#: The compiled set-up (:func:`setup_kernel`), cached by numba across processes.
cached_setup_kernel = _cached(_sources_digest())
