"""What each policy costs to simulate, and TOPAS's decision latency, in one run on one machine.

Part 1, CPU seconds per 1,000 tasks: every policy (the ablations with ``--ablations``) on the same
DAG-4 and DAG-10-Wide traces (``data/traces/``, their first ``--tasks`` tasks re-timed to Poisson
arrivals at ``--load`` x the trace's nominal rate), one simulation at a time in this process, the
best of ``--repeat`` runs (CPU time of this process, so other work on the machine matters less
than for wall time); each beside FCFS's on the same trace. The target for TOPAS is at most 2x
FCFS on both workloads.

Then, where TOPAS's time goes on each workload: one run split into the decisions' set-up, the
search and the rest (the engine with its views, TOPAS's bookkeeping and the timers).

Then the engine's floor: TOPAS's decisions recorded, then replayed at no cost by a policy that is
TOPAS in every other respect (``replayed_cpu``): the CPU of the engine alone on TOPAS's scheduling
points, and what the 2x target leaves for each of TOPAS's decisions (all its own work: the set-up,
the search and its bookkeeping) beside what one costs now; and the same replay reading every
request into arrays for one compiled call (``read_into_arrays``), the least any compiled decision
reading the view does, and what the target leaves past that; and the replay reading no view
at all but running TOPAS's two kernels on the arrays each decision gave them in the recorded run
(``kernels``): what a decision costs whose arrays the engine's events keep up to date (the design
that would not read the view), before any cost of keeping them.

Part 2, decision latency: ``benchmarks/decision_latency.py``'s DAG-10-Wide run (its first
``--latency-tasks`` tasks at 1.5x nominal) under TOPAS and TOPAS+: wall time per decision, mean
and p99, beside the paper's 1.9 ms mean inside SGLang (docs/method.md "What the paper reports").
The target for TOPAS is a mean under 0.3 ms on an idle 2-core machine.

    python benchmarks/policy_cost.py                 # what `make bench` prints
    python benchmarks/policy_cost.py --tasks 200 --repeat 1 --policy fcfs,topas
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark scripts

from decision_latency import dag10wide  # noqa: E402

from topas.engine.cost import DEFAULT_PROFILE, load_profile  # noqa: E402
from topas.engine.simulator import simulate  # noqa: E402
from topas.paths import traces_dir  # noqa: E402
from topas.policies import available_policies, make_policy, policy_class, topas_search_compiled  # noqa: E402
from topas.workload.arrivals import retime  # noqa: E402
from topas.workload.trace_io import read_trace  # noqa: E402

WORKLOADS = ("dag-4", "dag-10-wide")
PAPER_MEAN_MS = 1.9
TOPAS_RATIO_TARGET = 2.0
TOPAS_MEAN_TARGET_MS = 0.3
ABLATIONS = ("topas-no-reuse", "topas-no-aging", "topas-base", "topas-request-only")


def trace_at_load(workload: str, n: int, load: float, seed: int):
    tr = read_trace(traces_dir() / f"{workload}.json.gz").head(n)
    return retime(tr, rate=load * float(tr.meta["rate"]), seed=seed)


def cpu_seconds(trace, policy: str, cost, repeat: int) -> float:
    """The least CPU time (this process) of ``repeat`` simulations of ``trace`` under ``policy``."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        simulate(trace, make_policy(policy), cost)
        best = min(best, time.process_time() - t0)
    return best


def latency(trace, policy: str, cost) -> tuple[float, float, int]:
    """Mean and p99 wall ms per decision, and the number of decisions."""
    w = simulate(trace, make_policy(policy), cost).decisions["wall_s"].to_numpy(dtype=float) * 1e3
    return float(w.mean()), float(np.percentile(w, 99)), len(w)


def topas_split(trace, cost) -> dict[str, float]:
    """One TOPAS run of ``trace``, its time by part (wall seconds in this process, whose timer is
    cheaper to read than its CPU clock; ``run``: the whole run; ``setup``: the
    decisions' set-up, ``_DecisionCtx.__init__``, less the compiled search kernel where the
    compiled set-up runs it; ``search``: ``_DecisionCtx.search`` and that kernel; ``rest``:
    the engine, its views, the policy's bookkeeping and the timers) and what an average decision
    sees (``waiting``, ``running``, ``tasks``: with a waiting request, ``pending``: stages whose
    parents are all ready, ``agents``, ``sets``: distinct prefix sets scored, ``full``: of them
    scored in full, not rejected from their sums); ``decisions``: how many, ``empty``: the share
    of them that admitted, preempted, evicted and loaded nothing. The timers wrap the
    set-up, the search, the search kernel and ``_evaluate`` (counted) for this run only; the counts
    are read without computing what the compiled set-up leaves out."""
    from topas.policies import topas_decision

    ctx = topas_decision._DecisionCtx
    kernel = topas_search_compiled.load()
    own = {k: ctx.__dict__[k] for k in ("__init__", "search", "_evaluate") if k in ctx.__dict__}  # to restore
    init, search, evaluate = ctx.__init__, ctx.search, ctx._evaluate
    spent = {"setup": 0.0, "search": 0.0, "kernel": 0.0}
    seen = {k: 0 for k in ("waiting", "running", "tasks", "pending", "agents", "sets", "full", "decisions")}

    def timed_kernel(*args):
        t0 = time.perf_counter()
        out = kernel(*args)
        spent["kernel"] += time.perf_counter() - t0
        return out

    def timed_init(self, policy, view):
        t0 = time.perf_counter()
        before = spent["kernel"]
        init(self, policy, view)
        spent["setup"] += time.perf_counter() - t0 - (spent["kernel"] - before)

    def timed_search(self):
        t0 = time.perf_counter()
        before = spent["kernel"]
        out = search(self)
        spent["search"] += time.perf_counter() - t0 - (spent["kernel"] - before)
        compiled = vars(self).get("_compiled")  # (its arrays: int 4 is the pending stages' count)
        for k, v in (("waiting", len(self.view.waiting)), ("running", len(self.view.running)),
                     ("tasks", len({r.task_id for r in self.view.waiting})),
                     ("pending", int(compiled[2][4]) if compiled is not None else len(self.pending)),
                     ("agents", len(self.view.prefixes)), ("sets", out[1]), ("decisions", 1),
                     ("full", getattr(self, "_n_full", 0))):  # the compiled search's, beside the reference's _evaluate
            seen[k] += v
        return out

    def counted_evaluate(self, *a, **kw):
        seen["full"] += 1
        return evaluate(self, *a, **kw)

    ctx.__init__, ctx.search, ctx._evaluate = timed_init, timed_search, counted_evaluate
    topas_search_compiled._kernel = timed_kernel
    try:
        t0 = time.perf_counter()
        decisions = simulate(trace, make_policy("topas"), cost).decisions
        run = time.perf_counter() - t0
    finally:  # as they were: an inherited method is deleted, not set on the class
        topas_search_compiled._kernel = kernel
        for k in ("__init__", "search", "_evaluate"):
            if k in own:
                setattr(ctx, k, own[k])
            else:
                delattr(ctx, k)
    n = max(seen["decisions"], 1)
    spent["search"] += spent.pop("kernel")
    moved = decisions[["n_admitted", "n_preempt", "n_evict", "n_load"]].sum(axis=1)
    out = {"run": run, **spent, "rest": run - spent["setup"] - spent["search"], "decisions": float(seen["decisions"]),
           "empty": float((moved == 0).mean()) if len(decisions) else 0.0}
    out.update({k: seen[k] / n for k in seen if k != "decisions"})
    return out


def read_into_arrays(view, kernel) -> None:
    """What any compiled decision must do at the least: every running and waiting request's fields
    (agent, task, y_r, tokens, reservation, a time) read off its view into two arrays, and one
    compiled call over them (``kernel``)."""
    agents: dict[str, int] = {}
    tasks: dict[str, int] = {}
    ints: list[int] = []
    floats: list[float] = []
    for r in view.running:
        ints += (agents.setdefault(r.agent, len(agents)), tasks.setdefault(r.task_id, len(tasks)), r.generated,
                 r.kv_tokens, r.reserve)
        floats.append(r.admitted_time)
    for r in view.waiting:
        ints += (agents.setdefault(r.agent, len(agents)), tasks.setdefault(r.task_id, len(tasks)), r.generated,
                 r.input_tokens, r.reserve)
        floats.append(r.ready_time)
    kernel(np.fromiter(ints, np.int64, len(ints)), np.fromiter(floats, np.float64, len(floats)))


def _summing_kernel():
    from numba import njit  # numba: TOPAS's kernels have imported it already

    @njit(cache=True)
    def total(ints, floats):
        return ints.sum() + floats.sum()

    total(np.zeros(1, np.int64), np.zeros(1))
    return total


def replayed_cpu(trace, cost, repeat: int, read: bool = False, kernels: bool = False) -> tuple[float, float, int]:
    """The engine's own cost of TOPAS's run: TOPAS's decisions recorded in one run, then replayed
    at no cost by a policy that is TOPAS in every other respect (its hooks, its task views, and it
    reads every running request's view as TOPAS's set-up does; with ``read``, it also reads every
    request into arrays and makes one compiled call, ``read_into_arrays``). With ``kernels``, the
    replay reads no request's view and runs TOPAS's two kernels (``topas_kernel_setup``, then the
    search) on the arrays each decision gave them in the recorded run, and builds the recorded
    Decision afresh: what a decision whose arrays were kept up to date by the engine's events
    would still cost, before any cost of keeping them. The least CPU seconds of ``repeat``
    replays, the recorded run's CPU seconds and its number of decisions. A replay that does not end
    as the recorded run did (its mean JCT) raises: the floor would not be TOPAS's."""
    from topas.engine.view import Decision
    from topas.policies import topas_setup_compiled
    from topas.policies.topas_kernel_setup import cached_setup_kernel

    base = policy_class("topas")
    decisions: list = []
    inputs: list[list[tuple[np.ndarray, np.ndarray]]] = []  # per decision, each set-up kernel call's arrays

    def capturing_setup(ii, ff):
        inputs[-1].append((ii.copy(), ff.copy()))
        return cached_setup_kernel(ii, ff)

    class Recorded(base):  # type: ignore[misc, valid-type]
        def decide(self, view):
            inputs.append([])
            d = super().decide(view)
            decisions.append(d)
            return d

    kernel = _summing_kernel() if read else None
    search = topas_search_compiled.load()

    class Replayed(base):  # type: ignore[misc, valid-type]
        def reset(self) -> None:
            super().reset()
            self._replayed = iter(zip(decisions, inputs))

        def decide(self, view):
            d, calls = next(self._replayed)
            if kernels:
                for ii, ff in calls:
                    ints, floats, cands, _ = cached_setup_kernel(ii, ff)
                    search(ints, floats, np.empty(len(cands) + 1, np.int64), np.empty(6))
                return Decision(admit=d.admit, preempt=d.preempt, evict=d.evict, load=d.load, info=dict(d.info))
            if kernel is not None:
                read_into_arrays(view, kernel)
            for _ in view.running:  # build every running request's view, as TOPAS's set-up does
                pass
            return d

    before = topas_setup_compiled._kernel
    if kernels:  # (the other replays need only the decisions)
        topas_setup_compiled._kernel = capturing_setup
    try:
        t0 = time.process_time()
        recorded = simulate(trace, Recorded(), cost).summary["jct_mean"]
        run = time.process_time() - t0
    finally:
        topas_setup_compiled._kernel = before
    if kernels and not any(inputs):
        raise RuntimeError("the recorded run never ran the compiled set-up: nothing to replay its kernels on")
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        replayed = simulate(trace, Replayed(), cost).summary["jct_mean"]
        best = min(best, time.process_time() - t0)
        if replayed != recorded:
            raise RuntimeError(f"TOPAS's decisions replayed end with mean JCT {replayed}, recorded {recorded}")
    return best, run, len(decisions)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=400, help="tasks per workload for the CPU table (default 400)")
    ap.add_argument("--load", type=float, default=1.0, help="arrival rate, x the trace's nominal (default 1.0)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per policy and workload, the best kept (default 2)")
    ap.add_argument("--seed", type=int, default=0, help="arrival seed (default 0)")
    ap.add_argument("--policy", default=None, help="policies, comma-separated (default: every non-ablation policy)")
    ap.add_argument("--ablations", action="store_true", help="also the TOPAS ablations")
    ap.add_argument("--latency-tasks", type=int, default=200, help="DAG-10-Wide tasks for the latency part (default 200)")
    ap.add_argument("--profile", default=DEFAULT_PROFILE, help="engine profile name or path")
    args = ap.parse_args(argv)
    if args.tasks < 1 or args.repeat < 1 or args.latency_tasks < 1 or not args.load > 0:
        ap.error("--tasks, --repeat and --latency-tasks must be >= 1 and --load > 0")
    if args.policy:
        policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    else:
        policies = [p for p in available_policies() if args.ablations or p not in ABLATIONS]
    if "fcfs" not in policies:
        policies.insert(0, "fcfs")  # the reference
    cost = load_profile(args.profile)
    topas_search_compiled.load()  # TOPAS's compiled search from the first decision (a per-process cost, not per run)
    print(f"machine    {platform.python_implementation()} {platform.python_version()}, "
          f"{os.cpu_count()} CPUs visible, load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}; "
          f"engine {cost.name}")
    print(f"CPU seconds per 1,000 tasks: first {args.tasks} tasks at {args.load:g}x nominal, seed {args.seed}, "
          f"best of {args.repeat}, one simulation at a time in this process\n", flush=True)

    per_k: dict[tuple[str, str], float] = {}
    for w in WORKLOADS:
        tr = trace_at_load(w, args.tasks, args.load, args.seed)
        for p in policies:  # warm-up: imports, caches
            simulate(tr.head(min(10, len(tr.tasks))), make_policy(p), cost)
        for p in policies:
            per_k[w, p] = cpu_seconds(tr, p, cost, args.repeat) * 1000 / len(tr.tasks)
    head = f"{'policy':20s}" + "".join(f"{w + ' s/1k':>18s}{'x FCFS':>8s}" for w in WORKLOADS)
    print(head)
    for p in policies:
        print(f"{p:20s}" + "".join(f"{per_k[w, p]:18.2f}{per_k[w, p] / per_k[w, 'fcfs']:8.2f}" for w in WORKLOADS))
    if "topas" in policies:
        worst = max(per_k[w, "topas"] / per_k[w, "fcfs"] for w in WORKLOADS)
        print(f"\ntarget     TOPAS <= {TOPAS_RATIO_TARGET:g}x FCFS's CPU on both: "
              f"{'MET' if worst <= TOPAS_RATIO_TARGET else 'MISSED'} (worst {worst:.2f}x)")

        print("\nwhere TOPAS's time goes (one run each, wall s in this process; empty: its decisions that admit, preempt, "
              "evict and load nothing; per decision: us, and what it sees on average)")
        print(f"{'workload':14s}{'run':>7s}{'rest':>8s}{'set-up':>8s}{'search':>8s}{'decisions':>10s}{'empty':>7s}"
              f"{'FCFS run':>9s}{'FCFS dec':>9s}{'us/dec':>8s}  waiting running tasks pending agents sets (full)")
        for w in WORKLOADS:
            tr = trace_at_load(w, args.tasks, args.load, args.seed)
            sp = topas_split(tr, cost)
            fcfs = per_k[w, "fcfs"] * len(tr.tasks) / 1000
            fcfs_decisions = len(simulate(tr, make_policy("fcfs"), cost).decisions)  # its scheduling points
            n = sp["decisions"]
            print(f"{w:14s}{sp['run']:7.2f}{sp['rest']:8.2f}{sp['setup']:8.2f}{sp['search']:8.2f}{n:10.0f}"
                  f"{sp['empty']:7.0%}{fcfs:9.2f}{fcfs_decisions:9d}{(sp['setup'] + sp['search']) / n * 1e6:8.0f}  {sp['waiting']:7.1f}"
                  f"{sp['running']:8.1f}{sp['tasks']:6.1f}{sp['pending']:8.1f}{sp['agents']:7.1f}{sp['sets']:5.1f}"
                  f" ({sp['full']:.1f})")

        print("\nthe engine's floor: TOPAS's decisions replayed at no cost (CPU s, best of "
              f"{args.repeat}); what the {TOPAS_RATIO_TARGET:g}x target leaves TOPAS per decision for all its own work;"
              "\nthen the same replay reading every request into arrays for one compiled call (read_into_arrays), and "
              "what the target leaves past that;\nthen the replay reading no view but running TOPAS's two kernels on "
              "each decision's recorded arrays (kernels only: a decision whose arrays the engine's events keep), x FCFS, "
              "and what the target leaves for keeping those arrays")
        print(f"{'workload':14s}{'FCFS':>7s}{'TOPAS':>8s}{'replay':>8s}{'x FCFS':>8s}{'TOPAS us/dec':>14s}"
              f"{'target leaves':>15s}{'+ reading':>11s}{'leaves':>8s}{'kernels only':>14s}{'x FCFS':>8s}{'leaves':>8s}")
        for w in WORKLOADS:
            tr = trace_at_load(w, args.tasks, args.load, args.seed)
            fcfs = per_k[w, "fcfs"] * len(tr.tasks) / 1000
            topas = per_k[w, "topas"] * len(tr.tasks) / 1000
            floor, _, n = replayed_cpu(tr, cost, args.repeat)
            read, _, _ = replayed_cpu(tr, cost, args.repeat, read=True)
            only, _, _ = replayed_cpu(tr, cost, args.repeat, kernels=True)
            print(f"{w:14s}{fcfs:7.3f}{topas:8.3f}{floor:8.3f}{floor / fcfs:8.2f}{(topas - floor) / n * 1e6:14.0f}"
                  f"{(TOPAS_RATIO_TARGET * fcfs - floor) / n * 1e6:15.0f}{read:11.3f}"
                  f"{(TOPAS_RATIO_TARGET * fcfs - read) / n * 1e6:8.0f}{only:14.3f}{only / fcfs:8.2f}"
                  f"{(TOPAS_RATIO_TARGET * fcfs - only) / n * 1e6:8.0f}")

    tr = dag10wide(args.latency_tasks, 1.5, args.seed)
    print(f"\ndecision latency (wall ms per decision), DAG-10-Wide, first {len(tr.tasks)} tasks at 1.5x nominal; "
          f"paper: {PAPER_MEAN_MS} ms mean inside SGLang")
    print(f"{'policy':20s}{'decisions':>10s}{'mean ms':>10s}{'p99 ms':>10s}{'paper ms':>10s}")
    for p in ("topas", "topas-plus"):
        mean, p99, n = latency(tr, p, cost)
        print(f"{p:20s}{n:10d}{mean:10.3f}{p99:10.3f}{PAPER_MEAN_MS:10.1f}"
              + (f"   target mean < {TOPAS_MEAN_TARGET_MS} ms (idle 2-core machine): "
                 f"{'MET' if mean < TOPAS_MEAN_TARGET_MS else 'MISSED'}" if p == "topas" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
