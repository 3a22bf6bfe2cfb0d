"""Why the policies differ: the mechanism numbers quoted in the README's results section.

For one workload, load and seed, every named policy is simulated and one row is printed with
mean and p99 JCT, how busy the GPU was (busy time / makespan), the average decode batch, the
share of the KV budget held by prefixes (time-weighted), retractions, preemptions, prefix swaps
(loads from the host tier) and the mean queueing time of each stage of the workflow.

    python scripts/mechanism.py dag-4 --tasks 500 --load 1.2 --seed 0
    python scripts/mechanism.py dag-10-wide --policies parrot-fcfs lpm topas
    python scripts/mechanism.py dag-4 --policies topas --param rho=0

The full tables of any single run (every request, prefix event, KV sample and decision, with
TOPAS's utility terms per decision) come from ``topas simulate ... --out DIR``.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from topas.experiments import Experiment, run_experiment
from studies.analysis import mechanism_row, prefix_share  # noqa: F401  (the library's)
from topas.policies import parse_param_strings
from topas.sets import PAPER_POLICIES

DEFAULT_POLICIES = PAPER_POLICIES + ("topas-base",)


def kv_budget(exp: Experiment) -> int:
    from topas.engine.cost import load_profile

    return exp.kv_budget or load_profile(exp.profile).kv_budget_tokens


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", help="a trace under data/traces/ (chain-3, dag-4, dag-10-wide, ...)")
    ap.add_argument("--policies", nargs="+", default=list(DEFAULT_POLICIES))
    ap.add_argument("--param", action="append", default=[], metavar="K=V",
                    help="a parameter for every TOPAS policy in the list (repeatable)")
    ap.add_argument("--tasks", type=int, default=500)
    ap.add_argument("--load", type=float, default=1.2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    params = parse_param_strings(args.param)
    rows = []
    for policy in args.policies:
        exp = Experiment(args.workload, policy, params if policy.startswith("topas") else {},
                         load=args.load, seed=args.seed, n_tasks=args.tasks)
        res = run_experiment(exp)
        rows.append(mechanism_row(policy, res, kv_budget(exp)))
        print(f"  ran {policy}", file=sys.stderr, flush=True)
    table = pd.DataFrame(rows).set_index("policy")
    print(f"{args.workload}: {args.tasks} tasks, load {args.load}x nominal, seed {args.seed}; "
          "JCT and queue times in seconds")
    with pd.option_context("display.width", 250, "display.max_columns", 40):
        print(table.round(2).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
