"""Several engines behind a router: notebook 13's tables (issue 15).

The notebook runs :func:`studies.cluster.grid.cluster_grid` and
:func:`~studies.cluster.grid.cluster_scaling_grid` and hands their summaries (one row per
experiment, in the grid's order) to the functions here. Conventions:

* ``load / engine``: the experiment's load divided by its number of engines (each engine is
  offered the trace's nominal rate times this);
* ``config``: ``router + policy`` (the router across engines, the policy inside each engine);
* ``stable``: the run's stability indicators as notebook 12 reads them
  (:func:`topas.experiments.capacity.stable_by`);
* ``vs best %`` = (config - best config at that point) / best x 100 (negative never occurs).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from topas.experiments.capacity import stable_by
from studies.claims.tables import pct
from topas.experiments.spec import Experiment

#: The columns of :func:`cluster_table` taken from a run's summary, and their names there.
SUMMARY_COLUMNS = {
    "mean JCT": "jct_mean",
    "p99 JCT": "jct_p99",
    "throughput (req/s)": "throughput_rps",
    "requests/engine CV": "requests_per_engine_cv",
    "prefix copies (mean)": "prefix_copies_mean",
    "prefix copies (max)": "prefix_copies_max",
    "prefix hits": "prefix_hits",
    "prefix loads": "prefix_loads_prefill",
    "KV use": "kv_util_mean",
    "router hold (s)": "router_hold_mean",
    "last/first quarter JCT": "jct_last_first_quarter",
    "completion ratio": "completion_ratio",
    "sim wall (s)": "sim_wall_s",
}


def cluster_table(summaries: pd.DataFrame, experiments: Sequence[Experiment]) -> pd.DataFrame:
    """One row per run of ``experiments`` (``summaries`` in the same order, as
    :func:`topas.experiments.run_sweep` returns them): workload, engines, load per engine,
    router, policy, ``config``, the :data:`SUMMARY_COLUMNS` and ``stable``."""
    if len(summaries) != len(experiments):
        raise ValueError(f"{len(summaries)} summaries for {len(experiments)} experiments")
    rows = []
    for e, s in zip(experiments, summaries.to_dict("records")):
        if e.engines is None or e.router is None:
            raise ValueError(f"{e.label()} is not a cluster experiment (engines and router are unset)")
        row = {"workload": e.workload, "engines": int(e.engines), "load / engine": round(float(e.load) / e.engines, 6),
               "tasks": int(s["n_tasks"]), "router": e.router, "policy": e.policy,
               "config": f"{e.router} + {e.policy}", "seed": e.seed}
        row.update({col: float(s[key]) for col, key in SUMMARY_COLUMNS.items()})
        row["stable"] = bool(stable_by(row["last/first quarter JCT"], row["completion ratio"]))
        rows.append(row)
    return pd.DataFrame(rows)


POINT = ["workload", "engines", "load / engine"]


def best_configs(table: pd.DataFrame, metric: str = "mean JCT") -> pd.DataFrame:
    """Per point (workload, engines, load per engine): the best ``config`` by ``metric`` among
    the stable runs (all runs where none is stable), the runner-up, TOPAS's router with TOPAS
    inside (``topas + topas``), each inner policy's best router, and how far each is from the best."""
    rows = []
    for key, g in table.groupby(POINT, sort=True):
        pool = g[g["stable"]] if g["stable"].any() else g
        ranked = pool.sort_values([metric, "config"])
        best = ranked.iloc[0]
        row = dict(zip(POINT, key))
        row.update({"stable runs": int(g["stable"].sum()), "runs": len(g), "best": best["config"],
                    f"best {metric}": float(best[metric]),
                    "runner-up": ranked.iloc[1]["config"] if len(ranked) > 1 else "",
                    "runner-up vs best %": pct(float(ranked.iloc[1][metric]), float(best[metric]))
                    if len(ranked) > 1 else np.nan})
        ours = g[g["config"] == "topas + topas"]
        row["topas + topas vs best %"] = pct(float(ours[metric].iloc[0]), float(best[metric])) if len(ours) else np.nan
        for p in sorted(set(g["policy"])):
            sub = g[g["policy"] == p].sort_values([metric, "router"])
            row[f"best router, {p} inside"] = sub.iloc[0]["router"]
            row[f"{p} inside vs best %"] = pct(float(sub.iloc[0][metric]), float(best[metric]))
        rows.append(row)
    return pd.DataFrame(rows)


def router_summary(table: pd.DataFrame, metric: str = "mean JCT") -> pd.DataFrame:
    """Per router and inner policy, over every point: how often it is the best config (``wins``),
    its median and worst distance from the point's best (%), the share of its runs that are stable,
    and its mean balance (requests/engine CV) and prefix copies."""
    best = table.groupby(POINT)[metric].transform("min")
    t = table.assign(**{"vs best %": 100.0 * (table[metric] / best - 1.0)})
    rows = []
    for (r, p), g in t.groupby(["router", "policy"], sort=True):
        rows.append({"router": r, "policy": p, "points": len(g), "wins": int((g["vs best %"] <= 1e-9).sum()),
                     "median vs best %": float(g["vs best %"].median()), "worst vs best %": float(g["vs best %"].max()),
                     "stable share": float(g["stable"].mean()),
                     "requests/engine CV": float(g["requests/engine CV"].mean()),
                     "prefix copies (mean)": float(g["prefix copies (mean)"].mean())})
    return pd.DataFrame(rows).sort_values(["median vs best %", "router", "policy"]).reset_index(drop=True)


def scaling_table(summaries: pd.DataFrame, experiments: Sequence[Experiment]) -> pd.DataFrame:
    """The scaling runs: engines, tasks, router, policy, the simulation's wall time (measured when
    the run was stored, on the machine that stored it), requests simulated per second and mean JCT."""
    t = cluster_table(summaries, experiments)
    n_req = summaries["n_requests"].astype(float).to_numpy()
    t["requests"] = n_req.astype(int)
    t["requests / s simulated"] = n_req / t["sim wall (s)"].clip(lower=1e-9)
    return t[["router", "policy", "engines", "tasks", "requests", "sim wall (s)", "requests / s simulated",
              "mean JCT", "stable"]]

