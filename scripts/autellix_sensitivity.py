#!/usr/bin/env python
"""Sensitivity of Autellix-LAS to its unpublished parameters: mean and p99 task JCT per setting.

Autellix (arXiv 2502.13965) does not publish K (number of queues), the queue ranges/quanta or the
anti-starvation threshold beta; ``topas/policies/autellix.py`` documents the values we chose.
This script runs ``autellix-las`` in the simulator on a synthetic workload with the defaults and
with one parameter changed at a time, plus FCFS as a reference, and prints a Markdown table per
(workload, rate): mean and p99 JCT and their change against the defaults.

    python scripts/autellix_sensitivity.py                        # DAG-4, 200 tasks, 0.15 and 0.25 tasks/s
    python scripts/autellix_sensitivity.py --workload chain-3 --rates 0.3 --n-tasks 100
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    import topas  # noqa: F401
except ImportError:  # running from a checkout without `make install`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from topas.engine.cost import DEFAULT_PROFILE, load_profile
from topas.engine.simulator import simulate
from topas.policies import make_policy
from topas.workload.synthetic import SYNTHETIC

#: (label, policy, params): the defaults first, then one parameter changed at a time.
SETTINGS: list[tuple[str, str, dict]] = [
    ("defaults (K=4, q=4 s, g=4, beta=4)", "autellix-las", {}),
    ("beta_starve=1", "autellix-las", {"beta_starve": 1.0}),
    ("beta_starve=2", "autellix-las", {"beta_starve": 2.0}),
    ("beta_starve=8", "autellix-las", {"beta_starve": 8.0}),
    ("no anti-starvation (beta=inf)", "autellix-las", {"beta_starve": float("inf")}),
    ("first_queue_s=1", "autellix-las", {"first_queue_s": 1.0}),
    ("first_queue_s=16", "autellix-las", {"first_queue_s": 16.0}),
    ("queue_growth=2", "autellix-las", {"queue_growth": 2.0}),
    ("queue_growth=8", "autellix-las", {"queue_growth": 8.0}),
    ("num_queues=2", "autellix-las", {"num_queues": 2}),
    ("num_queues=8", "autellix-las", {"num_queues": 8}),
    ("num_queues=1 (= FCFS by ready time)", "autellix-las", {"num_queues": 1}),
    ("reference: fcfs", "fcfs", {}),
]


def run(workload: str, rate: float, n_tasks: int, seed: int, profile: str) -> list[dict]:
    trace = SYNTHETIC[workload](n_tasks=n_tasks, rate=rate, seed=seed)
    cost = load_profile(profile)
    rows = []
    for label, policy, params in SETTINGS:
        s = simulate(trace, make_policy(policy, params), cost).summary
        rows.append({"setting": label, "mean": s["jct_mean"], "p99": s["jct_p99"],
                     "completed": s["n_tasks"]})
    return rows


def table(rows: list[dict]) -> str:
    base = rows[0]
    lines = ["| setting | mean JCT (s) | vs defaults | p99 JCT (s) | vs defaults |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        dm = 100.0 * (r["mean"] / base["mean"] - 1.0)
        dp = 100.0 * (r["p99"] / base["p99"] - 1.0)
        lines.append(f"| {r['setting']} | {r['mean']:.1f} | {dm:+.1f}% | {r['p99']:.1f} | {dp:+.1f}% |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[tuple[str, float], list[dict]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=sorted(SYNTHETIC), default="dag-4")
    ap.add_argument("--rates", type=float, nargs="+", default=[0.15, 0.25], help="tasks/s")
    ap.add_argument("--n-tasks", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default=DEFAULT_PROFILE)
    args = ap.parse_args(argv)
    out = {}
    for rate in args.rates:
        rows = run(args.workload, rate, args.n_tasks, args.seed, args.profile)
        out[(args.workload, rate)] = rows
        print(f"\n### {args.workload}, {args.n_tasks} tasks, {rate} tasks/s, seed {args.seed}, "
              f"profile {args.profile}\n")
        print(table(rows))
    return out


if __name__ == "__main__":
    main()
