"""Re-select TOPAS's defaults, TOPAS+'s aging horizon and k-LPM's k once every plan is what the
engine executes (docs/method.md "The plan and the engine"), on tuning seeds only.

The rule, written down before any of these runs (and not changed after):

* **Declared, not selected**: TOPAS's ``in_batch_guard=True``, ``demand="engine"`` and
  ``reuse_cost="engine"``, and TOPAS+'s ``in_batch_guard=True``: they make the plan what the
  engine does, which is the point, not a knob. Every other parameter keeps its value unless
  listed here.
* **Where**: Chain-3, DAG-4 and DAG-10-Wide (the in-sample synthetic workloads; MetaGPT and the
  held-out random DAGs are never run here), loads 1.0 and 1.3 x nominal, the first two tuning
  seeds (100, 101; :data:`topas.experiments.protocol.seeds.TUNING_SEEDS`), the first 400 tasks of
  each trace, the default engine (stock SGLang). A point is (workload, load, seed).
* **Against what**: at each point and for each of mean and p99 JCT, the best of the five stock
  baselines (fcfs, lpm, spf, parrot-fcfs, autellix-las) at that point.
* **TOPAS** (grid: ``preempt`` in {on, off}, ``beta`` in {0, 1, 4}, ``rho`` in {0.5, 1},
  ``move_cost`` in {swap, engine}; ``output_reserve`` no longer enters the engine-rule demand):
  the smallest geometric mean, over points and both metrics, of the ratio to the best baseline
  (the rule of ``scripts/sweep_topas_defaults.py``).
* **TOPAS+** (``H_age`` in {0, 20, 60, 200} s, its one selected parameter): the smallest *worst*
  ratio over points and both metrics, ties within 0.5% by the geometric mean (the rule of
  ``scripts/select_topas_plus.py``).
* **k-LPM** (``k`` in {2, 4, 8, 16}): the smallest geometric mean, as TOPAS.
* Ties within 0.5% of the best score go to the candidate closest to the current defaults (fewest
  parameters changed), then to the first in grid order.

Writes ``data/results/selection/plan_execution_runs.csv`` (one row per run; atomic) and
``data/results/selection/plan_execution_ranking.csv`` (each candidate's scores and rank) and prints
the three choices. The chosen values are then set as the parameters' defaults by hand (the
module docstrings and docs/method.md cite this script).

    python scripts/select_plan_execution.py                 # the selection (about 10 min on 2 cores)
    python scripts/select_plan_execution.py --tasks 60 --loads 1.0 --seeds 1   # a smoke test
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from topas.engine.cost import load_profile
from topas.engine.simulator import simulate
from topas.experiments.dispatch import default_jobs
from topas.experiments.protocol.seeds import TUNING_SEEDS, first
from topas.paths import data_dir, traces_dir
from topas.policies import make_policy
from topas.sets import IN_SAMPLE, PAPER_BASELINES
from topas.workload.arrivals import retime
from topas.workload.trace_io import read_trace

WORKLOADS = IN_SAMPLE
BASELINES = PAPER_BASELINES
#: per policy: its grid (parameter -> values), its rule ("geomean" or "worst") and its current defaults
CANDIDATES: dict[str, tuple[dict[str, tuple], str]] = {
    "topas": ({"preempt": (True, False), "beta": (0.0, 1.0, 4.0), "rho": (0.5, 1.0),
               "move_cost": ("swap", "engine")}, "geomean"),
    "topas-plus": ({"H_age": (0.0, 20.0, 60.0, 200.0)}, "worst"),
    "k-lpm": ({"k": (2, 4, 8, 16)}, "geomean"),
}
TIE = 0.005


def _run(job: tuple[str, float, int, int, str, tuple]) -> dict:
    workload, load, seed, n_tasks, policy, params = job
    trace = read_trace(traces_dir() / f"{workload}.json.gz").head(n_tasks)
    trace = retime(trace, trace.meta["rate"] * load, seed)
    s = simulate(trace, make_policy(policy, **dict(params)), load_profile()).summary
    return {"workload": workload, "load": load, "seed": seed, "policy": policy,
            "params": ",".join(f"{k}={v}" for k, v in params), "jct_mean": s["jct_mean"], "jct_p99": s["jct_p99"],
            "preemptions": s["preemptions"], "prefix_dup_copies": s["prefix_dup_copies"],
            "completion_ratio": s["completion_ratio"]}


def rank(runs: pd.DataFrame) -> pd.DataFrame:
    """Each candidate's scores against the best baseline per point and metric, and its rank."""
    point = ["workload", "load", "seed"]
    best = runs[runs.policy.isin(BASELINES)].groupby(point)[["jct_mean", "jct_p99"]].min()
    cand = runs[~runs.policy.isin(BASELINES)].merge(best.add_suffix("_best"), left_on=point, right_index=True)
    cand["r_mean"] = cand.jct_mean / cand.jct_mean_best
    cand["r_p99"] = cand.jct_p99 / cand.jct_p99_best
    cand["log_r"] = (cand.r_mean.map(math.log) + cand.r_p99.map(math.log)) / 2
    out = cand.groupby(["policy", "params"], sort=False).agg(
        geomean=("log_r", lambda v: math.exp(v.mean())), worst=("r_mean", "max"), worst_p99=("r_p99", "max"))
    out["worst"] = out[["worst", "worst_p99"]].max(axis=1)
    out = out.drop(columns="worst_p99").reset_index()
    ranks = []
    for policy, g in out.groupby("policy", sort=False):
        _grid, rule = CANDIDATES[policy]
        key = "worst" if rule == "worst" else "geomean"
        top = g[key].min()
        g = g.assign(score=g[key], tied=g[key] <= top * (1 + TIE), changed=g["params"].map(
            lambda p, pol=policy: _changed(pol, p)))
        if rule == "worst":  # ties on the worst ratio go to the geometric mean first
            g = g.sort_values(["tied", "geomean"], ascending=[False, True], kind="stable")
            g["tied"] = g["tied"] & (g["geomean"] <= g[g["tied"]]["geomean"].min() * (1 + TIE))
        g = g.sort_values(["tied", "changed", "score"], ascending=[False, True, True], kind="stable")
        ranks.append(g.assign(rank=range(1, len(g) + 1)))
    return pd.concat(ranks, ignore_index=True)


def _changed(policy: str, params: str) -> int:
    """How many of ``params`` ("k=v,...") differ from the policy's current defaults."""
    defaults = make_policy(policy).params
    return sum(str(getattr(defaults, k)) != v for k, v in (kv.split("=", 1) for kv in params.split(",") if kv))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=400)
    ap.add_argument("--loads", type=float, nargs="+", default=[1.0, 1.3])
    ap.add_argument("--seeds", type=int, default=2, help="the first N tuning seeds (100, 101, ...)")
    ap.add_argument("--jobs", type=int, default=None, help="worker processes (default: $TOPAS_JOBS, else all cores)")
    ap.add_argument("--out", type=Path, default=data_dir() / "results" / "selection", help="folder of the CSVs")
    args = ap.parse_args(argv)
    points = [(w, l, s) for w in WORKLOADS for l in args.loads for s in first(TUNING_SEEDS, args.seeds, "--seeds")]
    jobs = [(w, l, s, args.tasks, b, ()) for (w, l, s) in points for b in BASELINES]
    for policy, (grid, _rule) in CANDIDATES.items():
        combos = [tuple(zip(grid, values)) for values in itertools.product(*grid.values())]
        jobs += [(w, l, s, args.tasks, policy, c) for (w, l, s) in points for c in combos]
    # longest first (TOPAS on DAG-10-Wide), so the pool does not end on one long run
    jobs.sort(key=lambda j: (j[4] != "topas", j[0] != "dag-10-wide"))
    with ProcessPoolExecutor(args.jobs or default_jobs()) as pool:
        rows = list(tqdm(pool.map(_run, jobs), total=len(jobs), desc="selection", unit="run"))
    runs = pd.DataFrame(rows).sort_values(["policy", "params", "workload", "load", "seed"], kind="stable")
    ranking = rank(runs)
    args.out.mkdir(parents=True, exist_ok=True)
    for df, name in ((runs, "plan_execution_runs.csv"), (ranking, "plan_execution_ranking.csv")):
        tmp = args.out / (name + ".tmp")
        df.to_csv(tmp, index=False)
        tmp.replace(args.out / name)
    with pd.option_context("display.width", 200, "display.max_rows", 100):
        print(ranking.round(4).to_string(index=False))
    for policy in CANDIDATES:
        print(f"chosen {policy}: {ranking[(ranking.policy == policy) & (ranking['rank'] == 1)]['params'].iloc[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
