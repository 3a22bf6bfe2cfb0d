"""What the reproduction's costliest kinds of run cost to simulate, one at a time in this process.

`make bench` (``policy_cost.py``) compares every policy on the same 400 tasks at the nominal load.
The reproduction's CPU goes elsewhere as well: runs at the protocol's length (1,000 tasks, 600 on
MetaGPT), at loads where a policy's queue grows (hundreds of requests waiting at every decision),
and under the eviction study's strategies (the offline bound Belady, KVFlow). This prints, for a
fixed set of such runs, the CPU seconds of one simulation each (the best of ``--repeat``), beside
LPM with LRU on the same trace, so that a change's effect on them can be read in one run:

    python benchmarks/cell_cost.py
    python benchmarks/cell_cost.py --repeat 3 --only spf
    python benchmarks/cell_cost.py --scale 0.05   # every cell at a twentieth of its tasks

Each cell: policy, workload (the first n tasks of ``data/traces/<workload>.json.gz`` re-timed to
Poisson arrivals at ``load`` x its nominal rate, seed 0, as ``policy_cost.py`` does), eviction
strategy. Nothing here is a target; the numbers are for comparing code on one machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark scripts

from policy_cost import trace_at_load  # noqa: E402

from topas.engine.config import EngineConfig  # noqa: E402
from topas.engine.cost import DEFAULT_PROFILE, load_profile  # noqa: E402
from topas.engine.simulator import simulate  # noqa: E402
from topas.policies import make_policy, topas_search_compiled  # noqa: E402

#: (policy, workload, tasks, load, eviction): the costliest kinds in the shipped results' CPU
CELLS = (
    ("topas", "dag-10-wide", 1000, 1.0, "lru"),
    ("topas", "metagpt-tl", 600, 1.2, "lru"),
    ("topas-plus", "dag-10-wide", 1000, 1.0, "lru"),
    ("topas-plus", "metagpt-tl", 600, 1.2, "lru"),
    ("spf", "dag-10-wide", 1000, 1.0, "lru"),  # a growing queue: ~200 requests waiting
    ("spf", "metagpt-tl", 600, 1.2, "lru"),
    ("autellix-las", "dag-10-wide", 1000, 1.0, "lru"),  # ~700 waiting
    ("fcfs", "dag-10-wide", 1000, 1.0, "lru"),  # ~700 waiting
    ("lpm", "dag-10-wide", 1000, 1.0, "lru"),
    ("lpm", "dag-10-wide", 1000, 1.0, "belady"),
    ("lpm", "dag-10-wide", 1000, 1.0, "kvflow"),
    ("topas", "dag-10-wide", 400, 1.0, "priority"),
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=1, help="runs per cell; the least CPU is printed")
    ap.add_argument("--only", default="", help="comma-separated policies: only their cells")
    ap.add_argument("--scale", type=float, default=1.0, help="each cell's tasks times this (a quick look: 0.05)")
    args = ap.parse_args(argv)
    only = {p for p in args.only.split(",") if p}
    cost = load_profile(DEFAULT_PROFILE)
    topas_search_compiled.load()  # numba's load, not a run's
    print(f"{'policy':14s} {'workload':12s} {'tasks':>5s} {'load':>5s} {'eviction':9s} {'CPU s':>7s} {'LPM+LRU s':>9s}")
    lpm_lru: dict[tuple[str, int, float], float] = {}
    for policy, workload, n, load, eviction in CELLS:
        if only and policy not in only:
            continue
        n = max(1, round(n * args.scale))
        trace = trace_at_load(workload, n, load, 0)

        def cpu(name: str, ev: str) -> float:
            best = float("inf")
            for _ in range(args.repeat):
                t0 = time.process_time()
                simulate(trace, make_policy(name), cost, EngineConfig(eviction=ev))
                best = min(best, time.process_time() - t0)
            return best

        key = (workload, n, load)
        if key not in lpm_lru:
            lpm_lru[key] = cpu("lpm", "lru")
        print(f"{policy:14s} {workload:12s} {n:5d} {load:5.2f} {eviction:9s} {cpu(policy, eviction):7.2f} "
              f"{lpm_lru[key]:9.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
