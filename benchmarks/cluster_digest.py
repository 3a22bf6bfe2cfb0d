"""Digests of cluster results, to check that a speed-up of ``topas/cluster`` changes no result.

Runs a fixed set of small cluster configurations (2 to 64 engines, every built-in router,
FCFS / LPM / TOPAS / Autellix-LAS inside the engines, three workloads) and prints, for each, the
sha256 of its result tables (requests, tasks, per-engine table, prefix copies, prefix events,
timeline, decisions without their wall time) and of its deterministic summary, written as CSV
(floats as ``repr``: exact).

    python benchmarks/cluster_digest.py > before.txt      # on the code before the change
    python benchmarks/cluster_digest.py > after.txt       # after it
    diff before.txt after.txt                             # empty: byte-identical results

Each simulation runs alone, one after the other (about 30 s in all on a busy 2-core machine).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from typing import NamedTuple

from topas.cluster import make_router, simulate_cluster
from topas.engine.config import EngineConfig
from topas.engine.cost import DEFAULT_PROFILE, load_profile
from topas.paths import traces_dir
from topas.policies import make_policy
from topas.workload.arrivals import retime
from topas.workload.trace_io import read_trace


class Case(NamedTuple):
    workload: str
    engines: int
    router: str
    policy: str
    tasks: int

    @property
    def label(self) -> str:
        return f"{self.workload} x{self.tasks} on {self.engines} engines, {self.router}, {self.policy}"


#: Each engine near the single engine's load: the trace's nominal rate x the number of engines.
CASES = (
    Case("dag-4", 2, "round-robin", "fcfs", 150),
    Case("dag-4", 3, "least-load", "lpm", 150),
    Case("dag-4", 4, "sglang-cache-aware", "topas", 150),
    Case("dag-10-wide", 8, "kairos", "fcfs", 100),
    Case("chain-3", 8, "topas", "topas", 150),
    Case("dag-4", 16, "power-of-two", "autellix-las", 200),
    Case("dag-10-wide", 5, "autellix-locality", "lpm", 100),
    Case("dag-4", 32, "sglang-cache-aware", "fcfs", 300),
    Case("dag-4", 64, "least-load", "topas", 300),
    Case("chain-3", 64, "kairos", "topas", 300),
    Case("dag-4", 8, "prefixplace", "lpm", 150),
    Case("dag-10-wide", 4, "flowguard", "fcfs", 80),
    Case("dag-4", 16, "wasma", "fcfs", 200),
)

TABLES = ("requests", "tasks", "engines", "prefix_copies", "prefix_events", "timeline", "decisions")


def run(case: Case):
    base = read_trace(traces_dir() / f"{case.workload}.json.gz").head(case.tasks)
    trace = retime(base, rate=base.meta["rate"] * case.engines, seed=1)
    policies = [make_policy(case.policy) for _ in range(case.engines)]
    return simulate_cluster(trace, policies, make_router(case.router), load_profile(DEFAULT_PROFILE),
                            EngineConfig(), seed=1)


def digest(res) -> dict[str, str]:
    out = {}
    for name in TABLES:
        table = getattr(res, name).drop(columns="wall_s", errors="ignore")  # decisions' wall time
        out[name] = hashlib.sha256(table.to_csv(index=False).encode()).hexdigest()[:16]
    summary = sorted((k, repr(v)) for k, v in res.deterministic_summary().items())
    out["summary"] = hashlib.sha256(repr(summary).encode()).hexdigest()[:16]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", type=int, nargs="*", help="case numbers to run (default: all)")
    args = ap.parse_args(argv)
    for k, case in enumerate(CASES):
        if args.only and k not in args.only:
            continue
        t0 = time.process_time()
        d = digest(run(case))
        cpu = time.process_time() - t0
        print(f"[{k}] {case.label}")
        for name, h in d.items():
            print(f"    {name:14s} {h}")
        print(f"    (cpu {cpu:.2f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
