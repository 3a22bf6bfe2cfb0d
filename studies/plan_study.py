"""Plan against execution (notebook 06; docs/method.md "The plan and the engine"; docs/analysis.md).

Three small studies, each on evaluation seeds with common random numbers:

* :func:`plan_table`: per workload and policy variant, what the engine did with each plan: the
  duplicate prefix copies it computed (``prefix_dup_copies``/``_tokens``: requests started with
  their own copy of a prefix another request was computing), the admissions planned and made
  (policies that plan them), the preemptions and those whose room the admissions left unused.
  TOPAS and TOPAS+ run as shipped and with their earlier plan (``EARLIER_PLAN``; TOPAS+ without
  its in-batch guard), so the table shows what each switch removes.
* :func:`term_table`: TOPAS's utility terms per decision (the chosen plan's ``J_admit``,
  ``V_reuse``, ``J_move``, ``J_redo``, ``J_revoke``, means over the decisions that had a request
  waiting), shipped and with the earlier plan (V_reuse priced at swap speed): which term decides.
* :func:`mechanism_table`: the mechanism case, Chain-2 (``topas.workload.synthetic.chain2``: two
  prefixes so long that both beside a useful batch do not fit), JCT and what sets it against load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from topas.experiments.protocol.seeds import EVALUATION_SEEDS, first
from topas.experiments.spec import Experiment
from topas.policies.topas_params import EARLIER_PLAN

__all__ = ["MECHANISM_LOADS", "MECHANISM_POLICIES", "PLAN_QUICK_WORKLOADS", "PLAN_WORKLOADS", "VARIANTS", "Variant",
           "mechanism_experiments", "mechanism_table", "plan_experiments", "plan_table", "term_table"]


@dataclass(frozen=True)
class Variant:
    """A policy as the plan study runs it: a label, the policy and its parameters."""

    label: str
    policy: str
    params: tuple[tuple[str, Any], ...] = ()


VARIANTS: tuple[Variant, ...] = (
    Variant("fcfs", "fcfs"),
    Variant("lpm", "lpm"),
    Variant("k-lpm", "k-lpm"),
    Variant("topas", "topas"),
    Variant("topas (earlier plan)", "topas", tuple(sorted(EARLIER_PLAN.items()))),
    Variant("topas-plus", "topas-plus"),
    Variant("topas-plus (unguarded)", "topas-plus", (("in_batch_guard", False),)),
)
PLAN_WORKLOADS = ("chain-3", "dag-4", "dag-10-wide", "metagpt-sop", "metagpt-tl")
#: Notebook 06's quick plan workloads (what the tests run): one synthetic workload and one MetaGPT
#: trace, not all five (the plan runs were most of the quick notebook's time).
PLAN_QUICK_WORKLOADS = ("dag-4", "metagpt-sop")
TERMS = ("J_admit", "V_reuse", "J_move", "J_redo", "J_revoke")


def _n_tasks(workload: str, quick: bool) -> int:
    if quick:
        return 30
    return 150 if workload.startswith("metagpt") else 400


def plan_experiments(workloads: Sequence[str] = PLAN_WORKLOADS, load: float = 1.0, n_seeds: int = 3,
                     quick: bool = False) -> list[tuple[Variant, Experiment]]:
    """Every (variant, experiment) of the plan study: each workload at ``load`` x nominal on the
    first ``n_seeds`` evaluation seeds, 400 tasks (MetaGPT: 150; ``quick``: 30)."""
    seeds = first(EVALUATION_SEEDS, 1 if quick else n_seeds, "seeds")
    return [(v, Experiment(w, v.policy, dict(v.params), load=load, seed=s, n_tasks=_n_tasks(w, quick)))
            for w in workloads for v in VARIANTS for s in seeds]


def plan_table(runs: Sequence[tuple[Variant, Experiment]], summaries: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """Per workload and variant, the means over seeds of what the engine did with the plans
    (``summaries``: each experiment's summary by key)."""
    rows = []
    for v, e in runs:
        s = summaries[e.key()]
        planned = s.get("planned_admits")
        rows.append({"workload": e.workload, "policy": v.label, "seed": e.seed, "jct_mean": s["jct_mean"],
                     "prefix_dup_copies": s["prefix_dup_copies"], "prefix_dup_tokens": s["prefix_dup_tokens"],
                     "planned_admits": np.nan if planned is None else planned, "admitted": s["admitted"],
                     "preemptions": s["preemptions"], "preempt_unused": s["preempt_unused"],
                     "retractions": s["retractions"]})
    df = pd.DataFrame(rows)
    out = df.groupby(["workload", "policy"], sort=False).mean(numeric_only=True).drop(columns="seed").reset_index()
    out["admitted_of_planned"] = out["admitted"] / out["planned_admits"]
    return out[["workload", "policy", "jct_mean", "prefix_dup_copies", "prefix_dup_tokens", "planned_admits",
                "admitted", "admitted_of_planned", "preemptions", "preempt_unused", "retractions"]]


def term_table(runs: Sequence[tuple[Variant, Experiment]], decisions: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """TOPAS's utility terms per decision (seconds): per workload and TOPAS variant, the mean over
    the decisions with a request waiting of each term of the chosen plan, and the share of those
    decisions where each was non-zero (``decisions``: each experiment's decisions table by key)."""
    rows = []
    for v, e in runs:
        if v.policy != "topas":
            continue
        d = decisions[e.key()]
        d = d[d["n_waiting"] > 0]
        row: dict[str, Any] = {"workload": e.workload, "policy": v.label, "seed": e.seed, "decisions": len(d)}
        for t in TERMS:
            col = d[f"info_{t}"] if f"info_{t}" in d else pd.Series(0.0, index=d.index)
            row[f"{t}_mean"] = float(col.fillna(0.0).mean()) if len(d) else np.nan
            row[f"{t}_nonzero"] = float((col.fillna(0.0) != 0).mean()) if len(d) else np.nan
        rows.append(row)
    df = pd.DataFrame(rows)
    return df.groupby(["workload", "policy"], sort=False).mean(numeric_only=True).drop(columns="seed").reset_index()


MECHANISM_POLICIES = ("fcfs", "lpm", "lpm-guarded", "k-lpm", "topas", "topas-plus")
MECHANISM_LOADS = (0.6, 0.8, 1.0, 1.2, 1.4)


def mechanism_experiments(loads: Sequence[float] = MECHANISM_LOADS, n_seeds: int = 3,
                          quick: bool = False) -> list[Experiment]:
    """The mechanism case's runs: Chain-2 at ``loads`` x nominal, every policy of
    :data:`MECHANISM_POLICIES`, the first ``n_seeds`` evaluation seeds, 400 tasks (quick: 40)."""
    seeds = first(EVALUATION_SEEDS, 1 if quick else n_seeds, "seeds")
    return [Experiment("chain-2", p, {}, load=float(l), seed=s, n_tasks=40 if quick else 400)
            for p in MECHANISM_POLICIES for l in loads for s in seeds]


def mechanism_table(exps: Sequence[Experiment], summaries: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """Per policy and load (means over seeds; ``summaries`` by key): mean and p99 JCT, the
    completion ratio (``overload`` where it is below 0.95: the queue grows and the JCTs grow with
    the run's length), the average decode batch, the mean KV use, the prefix loads by prefill and
    the duplicate prefix copies."""
    rows = []
    for e in exps:
        s = summaries[e.key()]
        rows.append({"policy": e.policy, "load": e.load, "seed": e.seed, "jct_mean": s["jct_mean"],
                     "jct_p99": s["jct_p99"], "completion_ratio": s["completion_ratio"],
                     "avg_decode_batch": s["avg_decode_batch"], "kv_util_mean": s["kv_util_mean"],
                     "prefix_loads_prefill": s["prefix_loads_prefill"], "prefix_dup_copies": s["prefix_dup_copies"]})
    df = pd.DataFrame(rows)
    out = df.groupby(["policy", "load"], sort=False).mean(numeric_only=True).drop(columns="seed").reset_index()
    out["overload"] = out["completion_ratio"] < 0.95
    return out
