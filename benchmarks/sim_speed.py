"""Simulator speed benchmark: how many simulated tasks and requests per wall-clock second.

The target (the simulator issue): 1,000 DAG-4 tasks under FCFS in under 10 s of wall time on a
2-core machine, with the default engine profile. The simulator is single-threaded; the core
count only matters for what else the machine is doing.

    python benchmarks/sim_speed.py                       # 1,000 DAG-4 tasks, FCFS, default rate
    python benchmarks/sim_speed.py --policy lpm --rate 0.15 --tasks 500
    python benchmarks/sim_speed.py --engines 64 --router least-load --tasks 10000   # the cluster case

With ``--engines N`` (issue 15) the trace runs on a cluster of N engines behind ``--router``
(``topas.cluster``) at N times the rate (each engine near the single engine's load); the cluster
target is 10,000 DAG-4 tasks on 64 engines in under 60 s, scaled linearly in tasks.

The trace is ``data/traces/<workload>.json.gz`` when it exists (``topas.workload.trace_io``),
else a DAG-4 trace built here; its tasks are re-timed to Poisson arrivals of ``--rate`` tasks/s
(``topas.workload.arrivals.retime``). The default rate loads the engine so that a queue builds up
without exploding: the script prints the mean JCT next to the JCT of one task alone (with its
prefixes already resident), so a reader sees the load.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time

import numpy as np

from topas.engine.config import EngineConfig
from topas.engine.cost import DEFAULT_PROFILE, load_profile
from topas.engine.metrics import WALL_CLOCK_KEYS
from topas.engine.simulator import simulate
from topas.paths import traces_dir
from topas.policies import make_policy
from topas.workload.model import Agent, Stage, Task, Trace

TARGET_TASKS = 1000
TARGET_SECONDS = 10.0
CLUSTER_TARGET_TASKS = 10_000
CLUSTER_TARGET_SECONDS = 60.0
#: Default arrival rate: for DAG-4 under FCFS and the default profile, measured with this script on
#: the committed trace (prefix 3,072, input 512, output 256 tokens), 0.14 tasks/s gives a mean JCT
#: about 1.8x the unloaded one (a queue builds up); 0.16 is near saturation (about 5x).
DEFAULT_RATE = 0.14


def dag4_in_code(n: int, prefix: int = 3072, x: int = 512, y: int = 256) -> Trace:
    """A DAG-4 trace (A -> {B, C} -> D, one agent per stage) for when no trace file exists: the
    synthetic generator's if it is there, else built here with the same shape and lengths."""
    try:
        from topas.workload.synthetic import dag4
    except ImportError:
        agents = {f"dag4.{s}": Agent(f"dag4.{s}", prefix, float(y)) for s in "ABCD"}
        shape = (("A", ()), ("B", ("A",)), ("C", ("A",)), ("D", ("B", "C")))
        stages = tuple(Stage(s, f"dag4.{s}", x, y, p) for s, p in shape)
        tasks = tuple(Task(f"t{k:05d}", 0.0, stages, "dag-4") for k in range(n))
        return Trace("dag-4", agents, tasks, meta={"generator": "benchmarks/sim_speed.py"})
    return dag4(n_tasks=n)


def load_trace(workload: str, n: int) -> tuple[Trace, str]:
    path = traces_dir() / f"{workload}.json.gz"
    if path.is_file():
        from topas.workload.trace_io import read_trace

        tr = read_trace(path)
        if len(tr.tasks) >= n:
            return tr.head(n), str(path)
        # a synthetic trace regenerated longer: its first tasks are the file's (same generator, seed)
        from topas.workload.synthetic import SYNTHETIC

        m = tr.meta
        if m.get("generator", "").startswith("topas.workload.synthetic.") and workload in SYNTHETIC:
            longer = SYNTHETIC[workload](**{**m["params"], "n_tasks": n}, rate=m["rate"], seed=m["seed"])
            if longer.tasks[: len(tr.tasks)] != tr.tasks:
                raise SystemExit(f"regenerating {path} with {n} tasks did not reproduce its tasks")
            return longer, f"{path}, regenerated to {n} tasks by {m['generator']}"
        print(f"note: {path} has {len(tr.tasks)} tasks, fewer than --tasks {n}", file=sys.stderr)
        return tr, str(path)
    if workload != "dag-4":
        raise SystemExit(f"no trace file {path}, and only dag-4 can be built in code")
    return dag4_in_code(n), "built in code (no trace file)"


def poisson(trace: Trace, rate: float, seed: int) -> Trace:
    try:
        from topas.workload.arrivals import retime
    except ImportError:  # the arrivals module is not there yet: same process, inline
        gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=max(len(trace.tasks) - 1, 0))
        return trace.with_arrivals([0.0, *np.cumsum(gaps).round(6).tolist()][: len(trace.tasks)])
    return retime(trace, rate=rate, seed=seed)


def alone_jct(trace: Trace, policy: str, cost, config: EngineConfig) -> float:
    """The unloaded JCT: the second of two far-apart tasks (its prefixes are resident by then)."""
    pair = trace.head(2).with_arrivals([0.0, 1e6]) if len(trace.tasks) >= 2 else trace.head(1)
    return float(simulate(pair, make_policy(policy), cost, config).tasks["jct"].iloc[-1])


def run_case(trace: Trace, policy: str, router: str | None, engines: int, cost, config: EngineConfig, seed: int,
             progress: bool) -> dict:
    """One simulation, timed: its result with wall and CPU seconds (this process only)."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    if router is not None:
        from topas.cluster import make_router, simulate_cluster

        res = simulate_cluster(trace, [make_policy(policy) for _ in range(engines)], make_router(router), cost, config,
                               seed=seed, progress=progress)
    else:
        res = simulate(trace, make_policy(policy), cost, config, progress=progress)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    # engine iterations (a prefill iteration or a closed-form decode run): one timeline row each
    return {"policy": policy, "router": router, "result": res, "wall": wall, "cpu": cpu,
            "iterations": len(res.timeline)}


def target(n_tasks: int, cluster: bool) -> tuple[float, str]:
    """The time budget for ``n_tasks`` (the targets scaled linearly in tasks) and its statement."""
    if cluster:
        return (CLUSTER_TARGET_SECONDS * n_tasks / CLUSTER_TARGET_TASKS,
                "60 s per 10,000 DAG-4 tasks on 64 engines on 2 cores")
    return TARGET_SECONDS * n_tasks / TARGET_TASKS, "10 s per 1,000 DAG-4 tasks under FCFS on 2 cores"


def print_detail(run: dict, alone: float) -> None:
    s, wall, cpu = run["result"].summary, run["wall"], run["cpu"]
    n_tasks, n_req = s["n_tasks"], s["n_requests"]
    print(f"wall time  {wall:.3f} s  (simulated makespan {s['makespan']:.1f} s, "
          f"{s['makespan'] / wall:,.0f}x real time)")
    print(f"CPU time   {cpu:.3f} s  (this process; about the wall time of a run alone on an idle core)")
    print(f"speed      {n_tasks / wall:,.1f} simulated tasks/s, {n_req / wall:,.1f} requests/s, "
          f"{run['iterations'] / wall:,.0f} engine iterations/s ({run['iterations']:,} in all), "
          f"{s['n_decisions'] / wall:,.0f} decisions/s, {s['decode_steps'] / wall:,.0f} decode steps/s")
    print(f"load       mean JCT {s['jct_mean']:.2f} s = {s['jct_mean'] / alone:.2f}x the unloaded JCT "
          f"({alone:.2f} s); p99 {s['jct_p99']:.2f} s; mean queue time {s['queue_time_mean']:.2f} s; "
          f"KV utilisation {s['kv_util_mean']:.0%}")
    print()
    print("summary")
    for k, v in s.items():
        if k in WALL_CLOCK_KEYS or k == "routing_wall_s":
            continue
        print(f"  {k:22s} {v:.6g}" if isinstance(v, float) else f"  {k:22s} {v}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=TARGET_TASKS, help="tasks to simulate (default 1000)")
    ap.add_argument("--workload", default="dag-4", help="trace name under data/traces/ (default dag-4)")
    ap.add_argument("--policy", default="fcfs", help="policy name, or several separated by commas (default fcfs)")
    ap.add_argument("--rate", type=float, default=None,
                    help=f"tasks/s (default {DEFAULT_RATE} x the number of engines)")
    ap.add_argument("--engines", type=int, default=1, help="engines of a cluster (default 1: the single engine)")
    ap.add_argument("--router", default="least-load",
                    help="the cluster's router, or several separated by commas, run one after the other "
                         "(default least-load)")
    ap.add_argument("--seed", type=int, default=0, help="arrival seed (default 0)")
    ap.add_argument("--profile", default=DEFAULT_PROFILE, help="engine profile name or path")
    ap.add_argument("--kv-budget", type=int, default=None, help="override the profile's KV budget (tokens)")
    ap.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                    help="a progress bar on stderr (a cluster's appears after 2 s; default on)")
    ap.add_argument("--strict", action="store_true", help="exit 1 if the speed target is missed")
    args = ap.parse_args(argv)
    if args.rate is None:
        args.rate = DEFAULT_RATE * args.engines
    if args.tasks < 1 or args.engines < 1 or not (math.isfinite(args.rate) and args.rate > 0):
        ap.error("--tasks and --engines must be >= 1 and --rate > 0")
    cluster = args.engines > 1
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    routers = [r.strip() for r in args.router.split(",") if r.strip()] if cluster else [None]
    if not policies or not routers:
        ap.error("--policy and --router need at least one name")

    cost = load_profile(args.profile)
    config = EngineConfig(kv_budget=args.kv_budget)
    base, source = load_trace(args.workload, args.tasks)
    trace = poisson(base, args.rate, args.seed)
    n_tasks = len(trace.tasks)
    print(f"workload   {args.workload}: {n_tasks} tasks, {sum(len(t.stages) for t in trace.tasks)} requests ({source})")
    print(f"engine     {cost.name}, KV budget {args.kv_budget or cost.kv_budget_tokens} tokens; "
          f"policy {', '.join(policies)}; Poisson rate {args.rate:g} tasks/s, seed {args.seed}"
          + (f"; {args.engines} engines behind {', '.join(routers)}" if cluster else ""))
    print(f"machine    {platform.python_implementation()} {platform.python_version()}, "
          f"{os.cpu_count()} CPUs visible, {platform.machine()}")
    print(flush=True)

    alone = {p: alone_jct(trace, p, cost, config) for p in policies}
    budget, stated = target(n_tasks, cluster)
    runs = []
    for policy in policies:
        for router in routers:  # one simulation at a time
            runs.append(run_case(trace, policy, router, args.engines, cost, config, args.seed, args.progress))
            if len(policies) * len(routers) > 1:
                r = runs[-1]
                print(f"  done: {router or 'one engine'} / {policy}: wall {r['wall']:.1f} s, CPU {r['cpu']:.1f} s",
                      flush=True)
    if len(runs) == 1:
        print_detail(runs[0], alone[runs[0]["policy"]])
    else:
        print()
        print(f"{'router':20s} {'policy':13s} {'wall s':>8s} {'CPU s':>8s} {'iterations':>11s} {'iter/CPU s':>10s} "
              f"{'tasks/CPU s':>11s} {'mean JCT':>9s} {'x alone':>7s}  target")
        for r in runs:
            s = r["result"].summary
            print(f"{r['router'] or '-':20s} {r['policy']:13s} {r['wall']:8.2f} {r['cpu']:8.2f} {r['iterations']:11,d} "
                  f"{r['iterations'] / r['cpu']:10,.0f} {n_tasks / r['cpu']:11,.1f} {s['jct_mean']:9.2f} "
                  f"{s['jct_mean'] / alone[r['policy']]:7.2f}  {'met' if r['wall'] < budget else 'MISSED'}")
    met = all(r["wall"] < budget for r in runs)
    worst = max(runs, key=lambda r: r["wall"])
    print()
    print(f"target     {n_tasks} {args.workload} tasks in < {budget:.1f} s wall ({stated}): "
          f"{'MET' if met else 'MISSED'} (slowest {worst['wall']:.2f} s wall, {worst['cpu']:.2f} s CPU)")
    return 0 if met or not args.strict else 1


if __name__ == "__main__":
    sys.exit(main())
