"""TOPAS's search over R' compiled (numba): the reference's search
(:class:`topas.policies.topas_search.PrefixSearch`) over bitmasks, each set scored by
:func:`topas.policies.topas_kernel_score.evaluate`.

The same steps in the same order as the reference: the screen's set-up (``_screen_setup``), the
current prefix set first, then every subset of the pool (in ``itertools.combinations`` order) or
the local search's neighbourhoods (``_neighbourhoods``: add one, add two, drop one then swaps,
with ``local+`` drop two and add one), each set scored once (the memo: here the set of the keys
seen, since a set scored before never beats the incumbent again: ``_better`` is a strict total
order and the incumbent only improves), the tie rule (``_better``). A set's sums (``_sums``) are
taken over its members in sorted order, where the reference adds and subtracts a move's agents
to its incumbent's sums taken in a frozenset's order: the integer sums are the same, and the
screen's float sums ``w`` and ``A`` are covered in any order by the screen's margin
(``_screen_setup``); the screen only decides which sets are scored in full, never the decision.

One loop (:func:`search_kernel`) scores every set, each batch of sets (the current set, every
subset, one neighbourhood) laid out as bitmasks first; the scoring is inlined into it
(``topas_kernel_score``'s docstring says why). numba caches it compiled on disk
(:data:`cached_search_kernel`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from numba import njit

from topas.policies.topas_kernel_score import (
    A_MOVE_IN,
    A_MOVE_OUT,
    A_N_RUN,
    A_REUSE_MAX,
    A_RUN_DEMAND,
    A_TOKENS,
    C_AGENT,
    C_GAIN,
    C_NEED,
    F_BETA,
    F_TPOT,
    O_SCORE,
    R_CREDIT,
    R_GENERATED,
    S_BUDGET,
    S_COMPENSATED,
    S_EXHAUSTIVE,
    S_LOCAL_PLUS,
    S_MAX_PREEMPT,
    S_MUST,
    S_REPREFILL,
    S_REUSE,
    S_RT,
    evaluate,
    py_sum_add,
    py_sum_end,
    scratch_for,
    unpack,
)

# The search's state (``st``, integers): whether there is an incumbent, its set, its preemptions,
# its prefix moves, its admissions, whether its V_reuse counted an agent; the sets seen (the memo's
# size); the sets scored in full; the running requests.
(ST_HAS_BEST, ST_BEST_MASK, ST_BEST_PRE, ST_BEST_MOVES, ST_BEST_ADMITTED, ST_BEST_REUSE, ST_SEEN, ST_FULL,
 ST_N_BUSY) = range(9)
# The screen (``sc``, floats): its constant, its margin, the incumbent's score.
SC_CONST, SC_MARGIN, SC_BEST = range(3)
_EMPTY = -1  # a free slot of the memo's table
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit
def screen_setup(d, per_agent, needs, gains_acc, dense_need, dense_gain, sc):
    """``_screen_setup``: each agent's share of a set's sums (``per_agent``: l_a, l_a + kept
    demand, running requests, 1 if a load, as integers; w_a and A_a in ``sums_f``), the fractional
    knapsack's running sums over ``density`` (with each candidate's demand and gain in that
    order) and the screen's constant and margin (in ``sc``). Returns ``sums_f``."""
    ai, af, si, sf = d.ai, d.af, d.si, d.sf
    n = ai.shape[0]
    compensated = si[S_COMPENSATED] != 0
    gains = np.zeros(n)
    seen = np.zeros(n, np.bool_)
    first = np.empty(n, np.int64)  # the agents in the order the reference's ``gains`` dict has them
    n_first = 0
    for k in range(len(d.density)):
        i = d.density[k]
        a = d.ci[i, C_AGENT]
        if not seen[a]:
            seen[a] = True
            first[n_first] = a
            n_first += 1
        gains[a] = gains[a] + d.cf[i, C_GAIN]
    rt = si[S_RT]
    sums_f = np.zeros((n, 2))
    const = 0.0
    row_of = np.full(n, -1, np.int64)
    for g in range(len(d.busy_agent)):
        row_of[d.busy_agent[g]] = g
    for a in d.pref_order:
        reuse = af[a, A_REUSE_MAX] if si[S_REUSE] else 0.0
        w = gains[a] + sf[F_BETA] * reuse
        if (rt >> a) & 1:
            const -= af[a, A_MOVE_OUT]
            w += af[a, A_MOVE_OUT]
        else:
            w -= af[a, A_MOVE_IN]
        g = row_of[a]
        if g >= 0:
            f = c = 0.0
            generated = 0
            for j in range(d.busy_start[g], d.busy_start[g + 1]):
                f, c = py_sum_add(f, c, d.rf[j, R_CREDIT], compensated)
                generated += d.ri[j, R_GENERATED]
            pen = py_sum_end(f, c, compensated)
            if not si[S_REPREFILL]:
                pen += sf[F_TPOT] * generated
            const -= pen
            w += pen
        per_agent[a, 0] = ai[a, A_TOKENS]
        per_agent[a, 1] = ai[a, A_TOKENS] + ai[a, A_RUN_DEMAND]
        per_agent[a, 2] = ai[a, A_N_RUN]
        per_agent[a, 3] = 0 if (rt >> a) & 1 else 1
        sums_f[a, 0] = w
        sums_f[a, 1] = gains[a]
    need_total, gain_total = 0, 0.0
    for k in range(len(d.density)):
        i = d.density[k]
        need_total += d.ci[i, C_NEED]
        gain_total = gain_total + d.cf[i, C_GAIN] if k else d.cf[i, C_GAIN]
        needs[k] = need_total
        gains_acc[k] = gain_total
        dense_need[k], dense_gain[k] = d.ci[i, C_NEED], d.cf[i, C_GAIN]
    f = c = 0.0
    for a in d.pref_order:
        f, c = py_sum_add(f, c, abs(sums_f[a, 0]), compensated)
    s_w = py_sum_end(f, c, compensated)
    f = c = 0.0
    for k in range(n_first):
        f, c = py_sum_add(f, c, gains[first[k]], compensated)
    s_a = py_sum_end(f, c, compensated)
    sc[SC_CONST] = const
    sc[SC_MARGIN] = 1e-9 * (abs(const) + s_w + s_a) + 1e-12
    return sums_f


@njit(inline="always")
def screen(needs, gains_acc, dense_need, dense_gain, sc, free, s_w, s_a):
    """``_screen``: the screen's upper bound of Score(R', Q') from a set's sums (``dense_*``: the
    candidates' demand and gain in ``density``'s order)."""
    fk = 0.0
    if free > 0:
        lo, hi = 0, len(needs)  # bisect_right(needs, free)
        while lo < hi:
            mid = (lo + hi) // 2
            if free < needs[mid]:
                hi = mid
            else:
                lo = mid + 1
        i = lo
        fk = gains_acc[i - 1] if i else 0.0
        if i < len(needs):
            fk += dense_gain[i] * (free - (needs[i - 1] if i else 0)) / dense_need[i]
    x = s_a - fk
    return sc[SC_CONST] + s_w - (x if x > 0.0 else 0.0) + sc[SC_MARGIN]




@njit
def names_before(m1, m2):
    """``sorted(R1) < sorted(R2)`` for two sets as bitmasks (bit order = name order)."""
    while True:
        if m1 == 0:
            return m2 != 0
        if m2 == 0:
            return False
        a, b = m1 & -m1, m2 & -m2  # the lowest member of each
        if a != b:
            return a < b
        m1 ^= a
        m2 ^= b


@njit
def popcount(m):
    n = 0
    while m:
        m &= m - 1
        n += 1
    return n


@njit
def memo_grown(table):
    """The memo's table, twice as large (``memo_add``)."""
    cap = 2 * len(table)
    bigger = np.full(cap, _EMPTY, np.int64)
    for old in table:
        if old != _EMPTY:
            h = np.int64((np.uint64(old) * _GOLDEN) >> np.uint64(40)) & (cap - 1)
            while bigger[h] != _EMPTY:
                h = (h + 1) & (cap - 1)
            bigger[h] = old
    return bigger


@njit(inline="always")
def memo_add(table, st, key):
    """Add ``key`` to the memo (an open-addressing hash set, kept at most half full by the
    caller: ``memo_grown``); False if it was there."""
    cap = len(table)
    h = np.int64((np.uint64(key) * _GOLDEN) >> np.uint64(40)) & (cap - 1)
    while table[h] != _EMPTY:
        if table[h] == key:
            return False
        h = (h + 1) & (cap - 1)
    table[h] = key
    st[ST_SEEN] += 1
    return True


@njit(inline="always")
def better(st, sc, score, n_pre, moves, mask):
    """``_better`` against the incumbent: a higher score; on a tie fewer preemptions, then fewer
    prefix moves, then the names in order."""
    best = sc[SC_BEST]
    if score != best:
        return score > best
    if n_pre != st[ST_BEST_PRE]:
        return n_pre < st[ST_BEST_PRE]
    if moves != st[ST_BEST_MOVES]:
        return moves < st[ST_BEST_MOVES]
    return names_before(mask, st[ST_BEST_MASK])


@njit(inline="always")
def scan(d, w, masks, n_masks, per_agent, sums_f, st, sc, table, needs, gains_acc, dense_need, dense_gain, admitted,
         out, best_admitted, best_out):
    """``_scan``: score each R' of ``masks[:n_masks]`` in order, each once; most are rejected from
    their sums alone (over the budget, too many preemptions, a load without room, the screen).
    ``(True if one beat the incumbent, the memo's table)``; the incumbent's plan is kept in
    ``st``, ``sc``, ``best_admitted`` and ``best_out``."""
    si = d.si
    budget, rt = si[S_BUDGET], si[S_RT]
    max_busy = st[ST_N_BUSY] - si[S_MAX_PREEMPT]  # fewer kept running requests: too many preemptions
    improved = False
    for k in range(n_masks):
        mask = masks[k]
        t = u = n = loads = 0
        s_w = s_a = 0.0
        for x in range(per_agent.shape[0]):  # ``_sums``
            if (mask >> x) & 1:
                t += per_agent[x, 0]
                u += per_agent[x, 1]
                n += per_agent[x, 2]
                loads += per_agent[x, 3]
                s_w += sums_f[x, 0]
                s_a += sums_f[x, 1]
        if t > budget:
            continue
        if 2 * (st[ST_SEEN] + 1) > len(table):
            table = memo_grown(table)
        if not memo_add(table, st, mask):
            continue  # scored before: it cannot beat the incumbent now
        has_best = st[ST_HAS_BEST] != 0
        free = budget - u
        if n < max_busy or (free < 0 and loads):
            continue
        if has_best and screen(needs, gains_acc, dense_need, dense_gain, sc, free, s_w, s_a) < sc[SC_BEST]:
            continue
        st[ST_FULL] += 1
        status, n_pre, n_adm, reuse_any = evaluate(d, w, mask, t, sc[SC_BEST], has_best, admitted, out)
        if status == 0:
            continue
        moves = popcount(mask ^ rt)
        if has_best and not better(st, sc, out[O_SCORE], n_pre, moves, mask):
            continue
        st[ST_HAS_BEST], st[ST_BEST_MASK], st[ST_BEST_PRE], st[ST_BEST_MOVES] = 1, mask, n_pre, moves
        st[ST_BEST_ADMITTED], st[ST_BEST_REUSE] = n_adm, 1 if reuse_any else 0
        sc[SC_BEST] = out[O_SCORE]
        best_admitted[:n_adm] = admitted[:n_adm]
        best_out[:] = out
        improved = True
    return improved, table


@njit
def subsets(pool, must, masks):
    """Every R' = ``must`` + a subset of the pool into ``masks``, by size, each size in
    ``itertools.combinations`` order; how many."""
    n_pool, n = len(pool), 0
    combo = np.empty(n_pool, np.int64)
    for k in range(n_pool + 1):
        for i in range(k):
            combo[i] = i
        while True:
            mask = must
            for i in range(k):
                mask |= np.int64(1) << pool[combo[i]]
            masks[n] = mask
            n += 1
            i = k - 1
            while i >= 0 and combo[i] == i + n_pool - k:
                i -= 1
            if i < 0:
                break
            combo[i] += 1
            for j in range(i + 1, k):
                combo[j] = combo[j - 1] + 1
    return n


@njit
def neighbourhood(hood, cur, inside, n_in, outside, n_out, masks):
    """``_neighbourhoods``' ``hood``-th neighbourhood of ``cur`` into ``masks`` (grown if short):
    0 add one (of ``outside``), 1 add two, 2 drop one (of ``inside``) then swaps, 3 drop two and
    add one. ``(how many, masks)``."""
    size = max(n_out, n_out * n_out, n_in + n_in * n_out, n_in * n_in * n_out)
    if size > len(masks):
        masks = np.empty(size, np.int64)
    n = 0
    one = np.int64(1)
    if hood == 0:
        for i in range(n_out):
            masks[n] = cur | (one << outside[i])
            n += 1
    elif hood == 1:
        for i in range(n_out):
            for j in range(i + 1, n_out):
                masks[n] = cur | (one << outside[i]) | (one << outside[j])
                n += 1
    elif hood == 2:
        for i in range(n_in):
            masks[n] = cur & ~(one << inside[i])
            n += 1
        for i in range(n_in):
            for j in range(n_out):
                masks[n] = (cur | (one << outside[j])) & ~(one << inside[i])
                n += 1
    else:
        for i in range(n_in):
            for j in range(i + 1, n_in):
                for k in range(n_out):
                    masks[n] = (cur | (one << outside[k])) & ~(one << inside[i]) & ~(one << inside[j])
                    n += 1
    return n, masks


@njit
def search_kernel(ints, floats, admitted, out):
    """``PrefixSearch.search`` up to the liveness fallback, over the decision's arrays
    (:func:`unpack`): the best R', its admitted candidates in ``admitted`` and its terms and score
    in ``out``.

    Returns ``(found, its set, n_preempted, n_admitted, whether V_reuse counted an agent, the
    sets seen (the reference's ``len(_memo)``), the sets scored in full)``."""
    d = unpack(ints, floats)
    ai, si, pool = d.ai, d.si, d.pool
    n_agents, n_pool, n_dense = ai.shape[0], len(pool), len(d.density)
    needs, gains_acc = np.zeros(n_dense, np.int64), np.zeros(n_dense)
    dense_need, dense_gain = np.zeros(n_dense, np.int64), np.zeros(n_dense)
    per_agent = np.zeros((n_agents, 4), np.int64)
    st = np.zeros(9, np.int64)
    sc = np.zeros(3)
    sums_f = screen_setup(d, per_agent, needs, gains_acc, dense_need, dense_gain, sc)
    st[ST_N_BUSY] = ai[:, A_N_RUN].sum()
    w = scratch_for(d)
    table = np.full(64, _EMPTY, np.int64)
    work, best_out = np.empty(len(admitted), np.int64), np.empty(6)
    rt, must = si[S_RT], si[S_MUST]
    exhaustive = si[S_EXHAUSTIVE] != 0
    masks = np.empty(1 << n_pool if exhaustive else 64, np.int64)
    masks[0] = rt  # the current prefix set first
    n_masks = 1
    n_hoods = 4 if si[S_LOCAL_PLUS] else 3
    outside, inside = np.empty(n_pool, np.int64), np.empty(n_agents, np.int64)
    n_out = n_in = 0
    cur = rt
    stage, rounds, hood = 0, 0, -1  # stage 0: R_t; 1: every subset; 2: the local search's rounds
    while True:
        improved, table = scan(d, w, masks, n_masks, per_agent, sums_f, st, sc, table, needs, gains_acc, dense_need,
                               dense_gain, work, out, admitted, best_out)
        # what to score next
        if stage == 0:
            if exhaustive:
                stage, n_masks = 1, subsets(pool, must, masks)
                continue
            stage = 2
        elif stage == 1:
            break
        elif improved:  # the next round, from the new incumbent
            rounds, hood = rounds + 1, -1
        else:  # the round's next neighbourhood
            hood += 1
            if hood == n_hoods:
                break  # no move improves
        if hood == -1:  # a round starts (``_local_search``)
            if rounds == 4 * n_pool + 4:
                break
            cur = st[ST_BEST_MASK] if st[ST_HAS_BEST] else rt
            n_out = n_in = 0
            for x in pool:
                if not (cur >> x) & 1:
                    outside[n_out] = x
                    n_out += 1
            for x in range(n_agents):
                if (cur >> x) & 1 and not (must >> x) & 1:
                    inside[n_in] = x
                    n_in += 1
            hood = 0
        n_masks, masks = neighbourhood(hood, cur, inside, n_in, outside, n_out, masks)
    out[:] = best_out
    return (st[ST_HAS_BEST] != 0, st[ST_BEST_MASK], st[ST_BEST_PRE], st[ST_BEST_ADMITTED], st[ST_BEST_REUSE] != 0,
            st[ST_SEEN], st[ST_FULL])


def _cached(digest: str):
    """:func:`search_kernel` behind the one function numba caches (on disk, beside this file):
    numba keys a cached function by its own file only, so the kernels' sources' ``digest`` is a
    variable of its closure, which numba's key includes: a change to either kernel file compiles
    afresh, nothing stale is loaded (the others are not cached apart: they are compiled into it)."""

    @njit(cache=True)
    def cached_search_kernel(ints, floats, admitted, out):
        if len(digest) == 0:  # never: ``digest`` is read so that it is part of the closure
            return search_kernel(ints, floats, admitted, out)
        return search_kernel(ints, floats, admitted, out)

    return cached_search_kernel


def _sources_digest() -> str:
    h = hashlib.sha256()
    for path in (Path(__file__), Path(__file__).with_name("topas_kernel_score.py")):
        try:
            h.update(path.read_bytes())
        except OSError:  # no source beside the bytecode: numba's own key (this file's) is all there is
            h.update(path.name.encode())
    return h.hexdigest()


#: The compiled search (:func:`search_kernel`), cached by numba across processes.
cached_search_kernel = _cached(_sources_digest())
