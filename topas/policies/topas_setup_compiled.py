"""TOPAS's decision set-up with its arithmetic compiled: the view read once into two arrays, and
``topas_kernel_setup.setup_kernel`` computing from them the arrays the compiled search reads.

The fused set-up (``topas_setup_fused``) builds dicts keyed by request, task and stage ids, and
``CompiledSearch._kernel_arrays`` then lays them out as arrays; here the view's requests, the
scored tasks' stages and the pending stages are laid out as arrays directly, and the residual
times, longest paths, gains, ranking, candidates, pending counts and the search's layout are
computed by the kernel. The arrays are equal, element for element, to those the fused set-up gives
(``tests/test_topas_compiled.py`` compares them at every decision of the pinned runs), so the
decisions are the same.

It runs where the compiled search does, for the parameters the fused set-up covers
(``topas_setup_fused.covers``), once the kernels are loaded. What the reference's code reads of a
decision (the liveness fallback, ``TopasRequestOnly``, the reference search) is computed by the
fused set-up when it is first read (``_DecisionCtx.__getattr__``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from topas.policies import topas_search_compiled
from topas.policies.topas_task import pending_lists, task_shape


def _exact(values: Any) -> bool:
    """Every value a float or an int (``topas_search_compiled._exact_floats``: what the kernels
    sum as Python's ``sum()`` does)."""
    return all(type(x) is float or type(x) is int for x in values)  # noqa: E721


def _shape(memo: dict[str, Any], tid: str, tv: Any, idx: dict[str, int], prefixes: Any, prefill_time: Any,
           cost_memo: Any) -> tuple:
    """The task's unfinished stages laid out for the kernel, kept per task while its view, the
    agents' indices and the cost model's memo (``cost_memo``) are the same objects: each stage's position in
    the topological order, its children's positions and their counts, its agent's index, and its
    prefill time with nothing generated (``Topas.residual_parts``'s first part at ``y = 0``)."""
    hit = memo.get(tid)
    if hit is None or hit[0] is not tv or hit[1] is not idx or hit[2] is not cost_memo:
        order, children, rows, position = task_shape(tv)
        kid_n: list[int] = []
        kids: list[int] = []
        for s in order:
            mine = [position[c] for c in children[s] if c in position]
            kid_n.append(len(mine))
            kids += mine
        agents = tuple(idx[a] for _, a, _ in rows)
        pre0 = tuple(prefill_time(x, prefixes[a].tokens) for _, a, x in rows)
        hit = memo[tid] = (tv, idx, cost_memo, rows, position, tuple(kid_n), tuple(kids), agents, pre0)
    return hit


def setup(ctx: Any, policy: Any, view: Any, est: Any, parts: dict[str, dict[tuple[int, int], tuple[float, float]]],
          prefill_time: Any, tasks: Any) -> bool:
    """Set what the compiled search reads of ``ctx`` (its arrays and candidates, the running
    requests by agent, R_t); False, with nothing set, where the fused set-up must run instead (an
    agent the view has no prefix for, a value of a type the kernels would sum otherwise)."""
    global _kernel
    p = ctx.p
    tpot = ctx.tpot
    state = policy._state
    idx, names = state.idx, state.names
    compensated = topas_search_compiled.COMPENSATED
    if len(view.prefixes) > topas_search_compiled.MAX_AGENTS or (compensated and type(tpot) is not float):  # noqa: E721
        return False
    engine = p.demand == "engine"
    reserve = p.output_reserve
    prefixes = view.prefixes
    remaining = est.est.expected_remaining
    # ---- the running requests: by agent, their kept demand and credit lambda_r
    credits = policy.credits
    revalue = p.revalue_credit and p.aging
    vtasks = view.tasks
    tid: dict[str, int] = {}
    run: list[int] = []
    credit: list[float] = []  # lambda_r as recorded; revalued by the kernel
    run_arrival: list[float] = []
    admitted_at: list[float] = []
    running_by_agent: dict[str, list[Any]] = {}
    gen_by_task: dict[str, dict[str, int]] = {}
    run_sids: dict[str, list[str]] = {}
    ref_of: dict[str, int] = {}
    try:
        for r in view.running:
            rid, t, agent, sid = r.rid, r.task_id, r.agent, r.stage_id
            at = gen_by_task.get(t)
            if at is None:
                gen_by_task[t] = {sid: r.generated}
                run_sids[t] = [sid]
            else:
                at[sid] = r.generated
                run_sids[t].append(sid)
            rs = running_by_agent.get(agent)
            if rs is None:
                running_by_agent[agent] = [r]
            else:
                rs.append(r)
            if engine:
                demand = r.kv_tokens + r.reserve
            else:
                demand = r.kv_tokens + int(reserve * remaining(agent, prefixes[agent].expected_output_tokens, r.generated))
            ref_of[rid] = len(credit)
            credit.append(credits.get(rid, 0.0))
            if revalue:
                at_time = r.admitted_time
                run_arrival.append(vtasks[t].arrival)
                admitted_at.append(_NAN if at_time is None else at_time)
            run += (idx[agent], r.generated, tid.setdefault(t, len(tid)), demand)
        n_run = len(credit)
        # ---- the waiting requests, by task
        waiting = view.waiting
        by_task: dict[str, list[Any]] = {}
        for j, r in enumerate(waiting):
            t = r.task_id
            at = gen_by_task.get(t)
            if at is None:
                gen_by_task[t] = {r.stage_id: r.generated}
            else:
                at[r.stage_id] = r.generated
            w = by_task.get(t)
            if w is None:
                by_task[t] = [r]
            else:
                w.append(r)
            ref_of[r.rid] = n_run + j
        # ---- the scored tasks (those with waiting requests): their stages, g_i(t), arrival
        memo, cost_memo = policy._kshape_memo, policy._prefill_memo
        kept: dict[str, Any] = {}
        scored: dict[str, tuple[int, int, dict[str, int]]] = {}
        task_first: list[int] = []
        task_n: list[int] = []
        kid_n: list[int] = []
        kids: list[int] = []
        stage_agent: list[int] = []
        pre0: list[float] = []
        in_h: list[int] = []
        own: list[int] = []
        own_pre: list[float] = []
        own_rem: list[float] = []
        task_arrival: list[float] = []
        for t, w in by_task.items():
            tv = tasks[t]
            hit = kept[t] = _shape(memo, t, tv, idx, prefixes, prefill_time, cost_memo)
            first = len(stage_agent)
            position = hit[4]
            scored[t] = (len(task_first), first, position)
            task_first.append(first)
            task_n.append(len(hit[3]))
            kid_n += hit[5]
            kids += hit[6]
            stage_agent += hit[7]
            pre0 += hit[8]
            task_arrival.append(tv.arrival)
            for sid in run_sids.get(t, ()):
                in_h.append(first + position[sid])
        policy._kshape_memo = kept
        # each agent's expected remaining output with nothing generated (``residual_parts``'
        # second part at y = 0), kept per agent until it observes (``agent_version``)
        rem0 = _rem0(policy, est, names, prefixes)
        # ---- the waiting requests' rows: d_r(t), their ids' ranks, their ids' tasks
        rids = [r.rid for r in waiting]
        rank = [0] * len(rids)
        for i, j in enumerate(sorted(range(len(rids)), key=rids.__getitem__)):
            rank[j] = i
        wait: list[int] = []
        for j, r in enumerate(waiting):
            t, agent, x, y = r.task_id, r.agent, r.input_tokens, r.generated
            k, first, position = scored[t]
            pos = position[r.stage_id]
            if y:  # a stage with tokens generated (preempted, retracted): its own parts
                d = parts[agent]
                pr = d.get((x, y))
                if pr is None:
                    pv = prefixes[agent]
                    pr = d[(x, y)] = (prefill_time(x + y, pv.tokens),
                                      est.expected_remaining(agent, pv.expected_output_tokens, y))
                own.append(first + pos)
                own_pre.append(pr[0])
                own_rem.append(pr[1])
            if engine:
                need = x + y + 1 + r.reserve
            else:
                need = x + y + int(reserve * (pr[1] if y else rem0[idx[agent]]))
            rid_task = rids[j].split("/", 1)[0]
            wait += (idx[agent], tid.setdefault(t, len(tid)), k, pos, need, rank[j],
                     tid[t] if rid_task == t else tid.setdefault(rid_task, len(tid)))
        # ---- the pending stages n_a(t) can count, each parent as a request row: kept while the
        # ready requests are the same, in the same rows, and their tasks' views the same objects
        kp = policy._kpending
        if (kp is None or kp[0] is not idx or kp[1] != ref_of or len(kp[2]) != len(gen_by_task)
                or not all(tasks[t] is tv for t, tv in kp[2].items())):
            lists, policy._pending_memo = pending_lists(policy._pending_memo, tasks, gen_by_task)
            pend_agent: list[int] = []
            pend_need: list[int] = []
            parent_rids: list[str] = []
            for pend in lists:
                for agent, ps in pend:
                    a = idx.get(agent, -1)
                    if a < 0 and ps:
                        return False  # (the fused set-up then fails as it did)
                    pend_agent.append(a)
                    pend_need.append(len(ps))
                    parent_rids += ps
            parents = [ref_of.get(q, -1) for q in parent_rids]
            kp = policy._kpending = (idx, ref_of, {t: tasks[t] for t in gen_by_task}, pend_agent, pend_need, parents)
        pend_agent, pend_need, parents = kp[3:]
    except KeyError:  # an agent the view has no prefix for: the fused set-up and the reference cope
        return False
    if compensated and not (_exact(credit) and _exact(pre0) and _exact(rem0) and _exact(own_pre)
                            and _exact(own_rem) and _exact(state.kernel_floats)):
        return False
    if not revalue:
        run_arrival = admitted_at = [_NAN] * len(credit)
    # (the in-batch guard's caps and R_t: kept with the agents' entries, ``topas_state``)
    ii = [n_run, len(waiting), len(task_first), len(stage_agent), len(kids), len(pend_agent), len(parents),
          len(names), len(tid), len(in_h), len(own), view.kv_budget, p.K, p.preempt, p.M, p.search == "exhaustive",
          p.search == "local+", p.reuse, compensated, p.candidates_per_agent, p.in_batch_guard, state.rt_mask,
          p.aging, revalue, _log_aging(p.aging_form)]
    ii += run
    ii += wait
    ii += task_first
    ii += task_n
    ii += kid_n
    ii += stage_agent
    ii += in_h
    ii += own
    ii += kids
    ii += pend_agent
    ii += pend_need
    ii += parents
    ii += state.caps
    ii += state.kernel_ints
    ii += state.pref_order
    ff = [tpot, p.beta, view.time, p.rho, p.H_age]
    ff += credit
    ff += run_arrival
    ff += admitted_at
    ff += task_arrival
    ff += pre0
    ff += rem0
    ff += own_pre
    ff += own_rem
    ff += state.kernel_floats
    if _kernel is None:
        from topas.policies.topas_kernel_setup import cached_setup_kernel as _kernel  # numba: loaded by load()
    # (np.fromiter: a third of np.array's time on a list of Python ints)
    ints, floats, cands, gain = _kernel(np.fromiter(ii, np.int64, len(ii)), np.fromiter(ff, np.float64, len(ff)))
    admitted, out = np.empty(len(cands) + 1, np.int64), np.empty(6)
    found = topas_search_compiled.load()(ints, floats, admitted, out)
    ctx._compiled = (names, waiting, ints, floats, cands, gain, admitted, out, found)
    ctx.running_by_agent = running_by_agent
    ctx._busy_order = tuple(running_by_agent)
    ctx.r_t = state.resident
    ctx._memo = {}
    return True


_kernel: Any = None
_NAN = float("nan")


class LeftOut:
    """``_DecisionCtx``'s attributes the compiled set-up leaves out: the fused set-up
    (``_lazy``) computes them all at the first read of one (the decision's prefix sets scored so
    far are kept)."""

    def __getattr__(self, name: str) -> Any:
        lazy = self.__dict__.get("_lazy")
        if lazy is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        self._lazy = None
        memo = self.__dict__.get("_memo")
        lazy()
        if memo is not None:
            self._memo = memo
        return getattr(self, name)


def _log_aging(form: str) -> bool:
    """g_i(t)'s form as the kernel takes it (``topas_terms.aging`` names the forms)."""
    if form not in ("log", "linear"):
        raise ValueError(f"aging form {form!r} is not one of ('log', 'linear')")
    return form == "log"


def _rem0(policy: Any, est: Any, names: list[str], prefixes: Any) -> list[float]:
    """``E[Y | Y > 0]`` of each agent (in ``names``' order), kept per agent while its
    observations are unchanged (``OutputEstimator.agent_version``; an estimator without one: at
    every decision), as ``Topas.residual_parts`` keeps its entries."""
    versions = getattr(est.est, "agent_version", None)
    kept = policy._rem0
    if kept is None or kept[0] is not names or kept[1] is not est.est or versions is None:
        kept = policy._rem0 = (names, est.est, [None] * len(names), [0.0] * len(names))
    _, _, seen, values = kept
    for i, a in enumerate(names):
        v = versions.get(a, 0) if versions is not None else None
        if v is None or seen[i] != v:
            seen[i] = v
            values[i] = est.expected_remaining(a, prefixes[a].expected_output_tokens, 0)
    return values


