"""Headroom: how far below the best baseline's mean JCT could any scheduler go?

Reference points per workload and load, each labelled with its kind:

* ``bound`` -- a lower bound on the mean JCT of *every* scheduler on the simulator's model (the
  cost model of :mod:`topas.engine.cost`, the engine of :mod:`topas.engine.simulator`), for the
  same tasks and arrival times:

  - **unloaded critical path** (:func:`critical_path_bounds`): each task alone on an empty engine
    with its agents' prefixes already cached: along the longest path of its DAG, each stage's
    suffix prefilled in chunks on its cached prefix, then one decode step per further output
    token at batch size 1 (:func:`topas.experiments.solo.stage_solo_time`), plus the request
    path's latency per stage. Why it bounds each task's JCT under any load and any policy, and
    the conditions on the cost model that the argument needs, are in :func:`bound_conditions`;
  - **work-conserving queue bound** (:func:`queue_bound`): the engine runs one iteration at a
    time, and each iteration takes at least the sum of a per-request share of it (decode:
    ``c_batch + c_kv * context + c0 / b_max`` per request, ``b_max`` the largest batch the KV
    budget admits; prefill: ``c_new`` per new token). So a task needs at least its *work*
    ``w_i`` (the sum of those shares over its tokens) of engine time after it arrives, and the
    ``i``-th completion cannot come before ``a_(j) + (the i-j+1 smallest w among the tasks
    arriving at or after a_(j))`` for any ``j <= i``, nor before the ``i``-th smallest
    ``a + critical path``. Summing the larger of the two over ``i`` bounds the sum of completion
    times, hence the mean JCT. It is at least the critical-path bound, and exceeds it only when
    the work, not the DAG, limits the tasks (overload, or loads near the work-conserving
    capacity, which is far above any policy's because a batch's ``c0`` is shared);

* ``relaxation`` -- one policy (the best baseline) run on an easier engine; it shows what that
  policy gains, not what any scheduler could reach (a cleverer scheduler on the real engine may
  beat it, and it may beat a bound-free guess):

  - **free prefixes**: the KV budget raised by the sum of all agents' prefixes
    (``Experiment(kv_budget=...)``), so prefixes no longer compete with requests for memory;
  - **large KV budget**: ``kv_factor`` (default 4) times the profile's budget;

* ``measured`` -- the best baseline and TOPAS themselves, for reference.

:func:`headroom_table` runs what is missing through :func:`topas.experiments.run_sweep` and
returns one row per (workload, load, reference).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from topas.experiments.spec import Experiment, Prepared, prepare
from topas.sets import PAPER_BASELINES

__all__ = [
    "bound_conditions",
    "critical_path_bounds",
    "task_work_bounds",
    "queue_bound",
    "free_prefix_budget",
    "headroom_experiments",
    "headroom_table",
]



def bound_conditions(p: Prepared) -> list[str]:
    """The conditions under which :func:`critical_path_bounds` and :func:`queue_bound` are
    lower bounds for the run ``p``; returns the ones that fail (empty: both are bounds).

    The argument, for one request ``v`` (agent ``a``, prefix ``l_a``, suffix ``x``, output ``y``)
    served under any load by any policy on the simulator:

    1. *Decode.* Every output token after the first is produced by a decode step in which ``v``
       takes part, and such a step costs ``c0 + c_batch * b + c_kv * T`` with ``b >= 1`` and
       ``T`` at least ``v``'s own context, which at its ``k``-th token is ``l_a + x + k - 1``
       whatever else runs: at least the solo step. (Queueing, moves of prefixes and other
       requests' chunks only add time.)
    2. *Prefill.* ``v``'s suffix is prefilled in chunks of at most ``C`` tokens, each in an
       iteration that costs at least its own chunk's terms. Alone it runs in the fewest chunks.
       Splitting a chunk ``n = n1 + n2`` costs ``c0 + n1 n2 (c_new_cached - 2 c_new_sq)`` more,
       so (i) ``c_new_cached >= 2 c_new_sq`` makes the solo chunking the cheapest. When ``v``
       must compute its own copy of the prefix (not yet cached, or being computed by another
       request: SGLang matches none of it), the chunk that crosses from prefix to suffix costs
       at least the suffix part alone on a cached prefix provided (ii) ``c_cached_sq = 0`` and
       ``c_new >= C (c_new_cached - 2 c_new_sq)``; the prefix's own chunks only add.
    3. *Retraction / preemption.* A stopped request is prefilled again (suffix + generated
       tokens) and that prefill yields its next token instead of a decode step: (iii) for every
       stage, a prefill of ``x + 1`` tokens on the cached prefix costs at least one solo decode
       step at that context, and ``c_new >= c_kv`` (so it stays so for every ``x + g``).
    4. *Request path.* A child reaches the scheduler ``request_latency_s`` after its parents
       end, a root half of it after arrival, and the task ends half of it after its last stage:
       exactly ``request_latency_s`` per stage on every path, which the bound adds.

    So each stage's service (admission to finish) is at least its solo time; a child starts only
    after its parents finish; hence every task's JCT is at least the longest path (the
    critical-path bound holds per task, so for the mean, p50, p99 ...). For the queue bound the
    same steps give the per-request shares (with (iv): a re-prefill's ``c_new (x + 1)`` is at
    least one decode share); the shares of one iteration sum to at most its time.
    """
    cost, cfg, trace = p.cost, p.config, p.trace
    from topas.experiments.solo import chunk_size, decode_solo_time, prefill_solo_time

    C = chunk_size(cost, cfg)
    fails: list[str] = []
    if cost.prefill_c_new_cached < 2 * cost.prefill_c_new_sq:
        fails.append("(i) c_new_cached < 2 c_new_sq: splitting a prefill chunk can make it cheaper")
    if cost.prefill_c_cached_sq > 0 or cost.prefill_c_new < C * (cost.prefill_c_new_cached - 2 * cost.prefill_c_new_sq):
        fails.append("(ii) computing a prefix copy can be cheaper than matching it "
                     "(c_cached_sq > 0 or c_new < C (c_new_cached - 2 c_new_sq))")
    if cost.prefill_c_new < cost.decode_c_kv:
        fails.append("(iii) c_new < c_kv")
    b_max = max_batch(p)
    bad_solo, bad_work = [], []
    for task in trace.tasks:
        for s in task.stages:
            la, x = trace.agents[s.agent].prefix_tokens, s.input_tokens
            if s.output_tokens < 2:
                continue  # no decode step to replace
            if prefill_solo_time(cost, x + 1, la, C) < decode_solo_time(cost, la + x + 1, 1):
                bad_solo.append(f"{task.id}/{s.id}")
            if cost.prefill_c_new * (x + 1) < _decode_share(cost, la + x + 1, b_max):
                bad_work.append(f"{task.id}/{s.id}")
    if bad_solo:
        fails.append(f"(iii) a re-prefill of x+1 tokens is cheaper than a solo decode step for "
                     f"{len(bad_solo)} requests (e.g. {bad_solo[0]})")
    if bad_work:
        fails.append(f"(iv) a re-prefill's share is below a decode share for {len(bad_work)} "
                     f"requests (e.g. {bad_work[0]}): the queue bound is not a bound")
    return fails


def max_batch(p: Prepared) -> int:
    """``b_max``: the largest decode batch the engine can hold: at most
    ``max_running_requests``, and every decoding request holds at least ``x_v + 1`` tokens of
    its own beside at least one resident prefix in a pool of ``B`` tokens."""
    trace, B = p.trace, p.cost.kv_budget_tokens if p.config.kv_budget is None else p.config.kv_budget
    min_own = min(s.input_tokens + 1 for t in trace.tasks for s in t.stages)
    min_prefix = min(a.prefix_tokens for a in trace.agents.values())
    return max(1, min(p.config.max_running_requests, (B - min_prefix) // min_own))


def _decode_share(cost, context: int, b_max: int) -> float:
    return cost.decode_c0 / b_max + cost.decode_c_batch + cost.decode_c_kv * context


def critical_path_bounds(p: Prepared) -> pd.Series:
    """Each task's unloaded critical path (seconds, indexed by task id): its JCT alone on an
    empty engine with its prefixes cached (:func:`topas.experiments.solo.task_critical_path`);
    a lower bound on its JCT under any load and policy when :func:`bound_conditions` is empty."""
    from topas.experiments.solo import task_critical_path

    return pd.Series({t.id: task_critical_path(p.trace, t, p.cost, p.config) for t in p.trace.tasks},
                     name="critical_path", dtype=float)


def task_work_bounds(p: Prepared) -> pd.Series:
    """Each task's work ``w_i`` (seconds of engine time no schedule can avoid; see the module
    docstring): ``c_new * x`` per stage plus, per output token after the first,
    ``c0 / b_max + c_batch + c_kv * context``."""
    cost, trace = p.cost, p.trace
    b_max = max_batch(p)
    a = cost.decode_c0 / b_max + cost.decode_c_batch
    out = {}
    for t in trace.tasks:
        w = 0.0
        for s in t.stages:
            la, x, k = trace.agents[s.agent].prefix_tokens, s.input_tokens, s.output_tokens - 1
            w += cost.prefill_c_new * x
            if k > 0:  # contexts la+x+1 .. la+x+k
                w += k * a + cost.decode_c_kv * (k * (la + x) + k * (k + 1) / 2)
        out[t.id] = w
    return pd.Series(out, name="work", dtype=float)


def queue_bound(p: Prepared) -> float:
    """The work-conserving lower bound on the mean JCT of the run ``p`` (module docstring): the
    mean over tasks of ``max(L_i, R_(i))`` minus the mean arrival, where ``L_i`` bounds the
    ``i``-th completion by the work that must follow each arrival and ``R_(i)`` is the ``i``-th
    smallest ``arrival + critical path``."""
    arrivals = pd.Series({t.id: t.arrival for t in p.trace.tasks}, dtype=float)
    work = task_work_bounds(p)
    cp = critical_path_bounds(p)
    order = np.argsort(arrivals.to_numpy(), kind="stable")
    a = arrivals.to_numpy()[order]
    w = work.reindex(arrivals.index).to_numpy()[order]
    n = len(a)
    L = np.full(n, -np.inf)
    for j in range(n):
        cs = np.cumsum(np.sort(w[j:]))  # cs[k-1]: the k smallest works arriving at or after a_(j)
        L[j:] = np.maximum(L[j:], a[j] + cs)
    R = np.sort((arrivals + cp.reindex(arrivals.index)).to_numpy())
    return float((np.maximum(L, R).sum() - a.sum()) / n)


def free_prefix_budget(p: Prepared) -> int:
    """The KV budget of the free-prefixes relaxation: the run's budget plus every agent's prefix."""
    return int(p.cost.kv_budget_tokens + sum(a.prefix_tokens for a in p.trace.agents.values()))


def headroom_experiments(workload: str, load: float, policy: str, n_tasks: int, seed: int,
                         kv_factor: float = 4.0, **kw: Any) -> dict[str, Experiment]:
    """The runs behind one (workload, load, policy): ``measured`` (stock), ``free prefixes``,
    ``large KV``."""
    base = Experiment(workload, policy, load=load, seed=seed, n_tasks=n_tasks, **kw)
    p = prepare(base)
    return {
        "measured": base,
        "free prefixes": Experiment(workload, policy, load=load, seed=seed, n_tasks=n_tasks,
                                    kv_budget=free_prefix_budget(p), **kw),
        "large KV": Experiment(workload, policy, load=load, seed=seed, n_tasks=n_tasks,
                               kv_budget=int(round(kv_factor * p.cost.kv_budget_tokens)), **kw),
    }


def headroom_table(workloads: Sequence[str], loads: Sequence[float] | Mapping[str, Sequence[float]],
                   n_tasks: int = 300, seeds: Sequence[int] = (0,), baselines: Sequence[str] = PAPER_BASELINES,
                   policy: str | None = "topas", kv_factor: float = 4.0, store: Any = None,
                   progress: bool = True) -> pd.DataFrame:
    """Reference points per workload and load (multiple of nominal; ``loads`` may map each
    workload to its own loads, e.g. from :func:`topas.experiments.capacity.operating_points`):
    one row per (workload, load, reference) with ``kind`` (``bound``, ``relaxation`` or
    ``measured``), ``policy`` (the policy a relaxation relaxes), ``mean JCT`` (s, mean over
    ``seeds``), ``vs best baseline %`` and ``bounds valid`` (False when a condition of
    :func:`bound_conditions` fails: the "bound" rows are then estimates, not bounds).

    Runs every baseline at each point (to find the best by mean JCT), ``policy`` (``None``: not
    shown) and the best baseline's two relaxations; missing runs go through
    :func:`topas.experiments.run_sweep` into ``store``."""
    from topas.experiments.store import ResultStore, run_sweep

    st = store if isinstance(store, ResultStore) else ResultStore(store)
    per = loads if isinstance(loads, Mapping) else {w: loads for w in workloads}
    rows = []
    for w in workloads:
        for load in per[w]:
            shown = list(baselines) + ([policy] if policy and policy not in baselines else [])
            exps = {(q, s): Experiment(w, q, load=load, seed=s, n_tasks=n_tasks) for q in shown for s in seeds}
            df = run_sweep(list(exps.values()), st, progress=progress, desc=f"headroom {w}@{load:g}", tables=False)
            df["policy_"] = [q for q, _ in exps]
            means = df.groupby("policy_", sort=False)["jct_mean"].mean()
            best = means[means.index.isin(baselines)].idxmin()
            best_mean = float(means[best])
            relax = [headroom_experiments(w, load, best, n_tasks, s, kv_factor) for s in seeds]
            rel = run_sweep([r[k] for r in relax for k in ("free prefixes", "large KV")], st, tables=False,
                            progress=progress, desc=f"relaxations {w}@{load:g}")
            free = float(rel["jct_mean"].iloc[0::2].mean())
            large = float(rel["jct_mean"].iloc[1::2].mean())
            cps, qbs, valid = [], [], True
            for s in seeds:
                p = prepare(exps[(best, s)])
                valid = valid and not bound_conditions(p)
                cps.append(float(critical_path_bounds(p).mean()))
                qbs.append(queue_bound(p))
            entries = [(f"best baseline ({best})", "measured", best, best_mean)]
            if policy:
                entries.append((policy, "measured", policy, float(means[policy])))
            entries += [
                ("unloaded critical path", "bound", "any", float(np.mean(cps))),
                ("work-conserving queue bound", "bound", "any", float(np.mean(qbs))),
                ("free prefixes", "relaxation", best, free),
                (f"{kv_factor:g}x KV budget", "relaxation", best, large),
            ]
            for ref, kind, pol, m in entries:
                rows.append({"workload": w, "load": load, "reference": ref, "kind": kind, "policy": pol,
                             "mean JCT": m, "vs best baseline %": 100.0 * (m / best_mean - 1.0),
                             "bounds valid": valid, "n_tasks": n_tasks, "seeds": len(seeds)})
    return pd.DataFrame(rows)
