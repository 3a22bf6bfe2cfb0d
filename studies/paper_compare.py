"""The paper's numbers beside ours, ours under the protocol (notebook 08; docs/protocol.md).

Every row of ``data/paper/reported.csv`` gets our number measured the protocol's way, never at a
load past a compared policy's capacity:

* ``vs_best_baseline``, mean and p99 JCT: the protocol's paired comparison of TOPAS with the best
  baseline at the highest grid load within both capacities (:func:`studies.protocol_runs.study.latency_rows`,
  its ``near_capacity`` row): the mean of the per-seed relative differences with its 95% interval
  (t for the mean JCT, BCa bootstrap for p99) and win / tie / loss (decided, as in the verdict
  table, on the interval of the per-seed differences in seconds; for p99 that interval and the
  relative one are two bootstraps and can disagree at the edge);
* ``vs_best_baseline``, request throughput: at a load every compared policy sustains, each
  completes what arrives, so throughput can only differ past capacity; ours is the **capacity**
  (the largest stable grid load) of TOPAS against the best baseline's, with the grid verdict
  (``higher`` / ``same bracket`` / ``lower``);
* ``vs_topas_base`` and ``vs_single_component_min`` / ``_max`` (the paper's ablation, MetaGPT-TL):
  TOPAS against TOPAS-base (no V_reuse, no aging) and against its two single-component variants
  (``topas-no-reuse``: aging only; ``topas-no-aging``: V_reuse only), each paired at the highest
  grid load within both capacities, on the protocol's seeds and run length
  (:func:`ablation_runs`); ``_min`` / ``_max`` are the smaller and larger of the two changes;
* ``absolute`` (decision overhead): our per-decision wall time (notebook 05's run), next to the
  paper's, with the note that wall time is machine-dependent.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from studies.protocol_runs import study as ps
from studies.analysis import MISSING_TRACE, PAPER_LABEL, paper_overhead, paper_reported

__all__ = ["ABLATION_VARIANTS", "COLUMNS", "ablation_latency", "ablation_runs", "paper_vs_ours"]

#: The paper's ablation: TOPAS-base and the two single-component variants.
ABLATION_VARIANTS = ("topas-base", "topas-no-reuse", "topas-no-aging")
#: The workload the paper reports its ablation on.
ABLATION_WORKLOAD = "metagpt-tl"
COLUMNS = ("workload", "metric", "comparison", PAPER_LABEL, "ours", "paper_value", "ours_value", "ours_low",
           "ours_high", "verdict", "load", "against", "n_seeds", "note")


def ablation_runs(runs: pd.DataFrame, workload: str = ABLATION_WORKLOAD, variants: Iterable[str] = ABLATION_VARIANTS,
                  quick: bool = False, store: Any = None, evidence_path: Any = None, jobs: int | None = None,
                  progress: bool = False) -> pd.DataFrame:
    """The protocol's grid for TOPAS's ablation variants on ``workload``, with TOPAS's own runs
    (from ``runs``, the protocol's grid there): the same seeds, run length and stopping rule,
    loads up to TOPAS's first rejected load (no comparison with TOPAS can be made above it).
    ``quick``: :data:`studies.protocol_runs.study.QUICK_PER_NOTEBOOK`'s grid."""
    topas = runs[(runs["workload"] == workload) & (runs["policy"] == "topas")]
    if topas.empty:
        raise ValueError(f"ablation_runs: no TOPAS runs on {workload} in the protocol's runs")
    cap = ps.capacity_rows(topas, baselines=()).iloc[0]
    q = ps.QUICK_PER_NOTEBOOK
    base = (ps.ProtocolSize((workload,), tuple(variants), q["loads"], q["n_seeds"],
                            {workload: int(topas["n_tasks"].iloc[0])}) if quick else ps.restricted(ps.FULL, (workload,)))
    if quick:
        evidence_path = ps.quick_evidence_path(store, evidence_path)
    top = float(cap["upper"]) if math.isfinite(float(cap["upper"])) else max(base.loads)
    size = ps.ProtocolSize((workload,), tuple(variants), tuple(l for l in base.loads if l <= top + 1e-9),
                           base.n_seeds, base.n_tasks)
    own = ps.capacity_grid_runs(size, store, evidence_path, jobs, progress)
    return pd.concat([topas, own], ignore_index=True)


def ablation_latency(ablation: pd.DataFrame, variants: Iterable[str] = ABLATION_VARIANTS) -> pd.DataFrame:
    """Per variant, TOPAS paired with it at the highest grid load within both capacities (the
    ``near_capacity`` row of :func:`studies.protocol_runs.study.latency_rows` with that
    variant as the only baseline). A variant with no such load is left out."""
    rows = []
    for v in variants:
        lat = ps.latency_rows(ablation[ablation["policy"].isin(("topas", v))], candidates=("topas",), baselines=(v,))
        rows.append(lat[lat["near_capacity"]])
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=list(ps.LATENCY_COLUMNS))


def _interval(v: float, lo: float, hi: float) -> str:
    return f"{v:+.1f}% [{lo:+.1f}, {hi:+.1f}]"


def _latency_row(r: Mapping[str, Any], metric: str) -> dict[str, Any]:
    key = "jct" if metric == "mean_jct" else "p99"
    v, lo, hi = (float(r[f"{key}_rel_pct"]), float(r[f"{key}_rel_low_pct"]), float(r[f"{key}_rel_high_pct"]))
    verdict = str(r[f"{key}_verdict"])
    return {"ours": f"{_interval(v, lo, hi)} vs {r['baseline']} at {float(r['load']):g}x ({verdict})",
            "ours_value": v, "ours_low": lo, "ours_high": hi, "verdict": verdict, "load": float(r["load"]),
            "against": str(r["baseline"]), "n_seeds": int(r["n_seeds"])}


def paper_vs_ours(latency: pd.DataFrame, capacity: pd.DataFrame, ablation: pd.DataFrame | None = None,
                  overhead: Mapping[str, float] | None = None, overhead_setting: str = "",
                  reported: pd.DataFrame | None = None, workloads: Iterable[str] | None = None) -> pd.DataFrame:
    """One row per line of ``reported.csv`` (module docstring): the paper's number, labelled
    ``paper (reported)``, beside ours with its interval and verdict. ``latency`` and ``capacity``:
    the protocol's tables; ``ablation``: :func:`ablation_latency`; ``overhead``:
    :func:`studies.analysis.decision_overhead` of notebook 05's run; ``workloads``: those
    the runs cover (default: every workload of ``capacity``). A workload with no trace reads
    ``n/a (trace missing)``, one not run ``n/a (not run)``; a claim with nothing to compare, ``n/a``
    and why."""
    from topas.experiments.spec import available_traces

    rep = paper_reported() if reported is None else reported
    traces = set(available_traces())
    ran = set(capacity["workload"] if workloads is None else workloads)
    rows: list[dict[str, Any]] = []
    near = latency[latency["near_capacity"] & (latency["candidate"] == "topas")].set_index("workload")
    abl_by_workload: dict[str, dict[str, Any]] = {}  # workload -> ablation variant -> its paired row
    for _, a in (ablation.iterrows() if ablation is not None else ()):
        abl_by_workload.setdefault(str(a["workload"]), {})[str(a["baseline"])] = a

    def add(r: Any, paper: float, note: str, **ours: Any) -> None:
        row = {"workload": r.workload, "metric": r.metric, "comparison": r.comparison,
               PAPER_LABEL: f"{paper:+.1f}%", "paper_value": paper, "ours": "", "ours_value": math.nan,
               "ours_low": math.nan, "ours_high": math.nan, "verdict": "", "load": math.nan, "against": "",
               "n_seeds": 0, "note": note}
        row.update(ours)
        rows.append(row)

    for r in rep.itertuples(index=False):
        paper = float(r.value_pct)
        abl = abl_by_workload.get(r.workload, {})
        if r.comparison == "absolute":
            continue  # the overhead rows come last, next to our measurement
        if r.workload not in ran:
            add(r, paper, r.source, ours=MISSING_TRACE if r.workload not in traces else "n/a (not run)")
        elif r.comparison == "vs_best_baseline" and r.metric in ("mean_jct", "p99_jct"):
            if r.workload in near.index:
                add(r, paper, "ours: paired over seeds at the highest load within both capacities",
                    **_latency_row(near.loc[r.workload], r.metric))
            else:
                add(r, paper, "no load within both capacities", ours="n/a (not comparable)")
        elif r.comparison == "vs_best_baseline" and r.metric == "request_throughput":
            c = capacity[(capacity["workload"] == r.workload) & (capacity["policy"] == "topas")]
            if c.empty or pd.isna(c.iloc[0]["baseline_capacity"]):
                add(r, paper, "no capacity", ours="n/a (not run)")
                continue
            c = c.iloc[0]
            v = 100.0 * (float(c["capacity"]) / float(c["baseline_capacity"]) - 1.0)
            add(r, paper, "ours: capacity (largest stable grid load) against the best baseline's; at a stable "
                          "load every policy's throughput is the arrival rate",
                ours=f"capacity {float(c['capacity']):g}x vs {c['best_baseline']} {float(c['baseline_capacity']):g}x "
                     f"({v:+.1f}%, {c['capacity_verdict']})",
                ours_value=v, verdict=str(c["capacity_verdict"]), load=float(c["capacity"]),
                against=str(c["best_baseline"]), n_seeds=int(c["n_seeds"]))
        elif r.comparison == "vs_topas_base" and abl and "topas-base" in abl:
            add(r, paper, f"{r.source}; ours: TOPAS vs TOPAS-base, paired", **_against(abl["topas-base"], r.metric))
        elif r.comparison.startswith("vs_single_component") and abl:
            singles = [abl[v] for v in ("topas-no-reuse", "topas-no-aging") if v in abl]
            if len(singles) < 2:
                add(r, paper, r.source, ours="n/a (not run)")
                continue
            vals = [_against(s, r.metric) for s in singles]
            lowest = r.comparison.endswith("_min")  # the range's ends as numbers: -51.0 is its min
            pick = (min if lowest else max)(vals, key=lambda d: d["ours_value"])
            add(r, paper, f"{r.source}; ours: TOPAS vs {pick['against']}, the {'lower' if lowest else 'higher'} "
                          "of its changes against the two single-component variants", **pick)
        else:
            add(r, paper, r.source, ours="n/a (not run)")
    if overhead is not None:
        po = paper_overhead(rep)
        for metric, key, unit in (("decision_overhead_mean_ms", "mean_ms", " ms"),
                                  ("decision_overhead_wall_time_share", "share_pct", "%")):
            v = float(overhead[key])
            rows.append({"workload": f"metagpt-sop (paper) / {overhead_setting} (ours)", "metric": metric,
                         "comparison": "absolute", PAPER_LABEL: f"{po[key]:g}{unit}", "ours": f"{v:.3g}{unit}",
                         "paper_value": po[key], "ours_value": v, "ours_low": math.nan, "ours_high": math.nan,
                         "verdict": "", "load": math.nan, "against": "", "n_seeds": 0,
                         "note": "paper: SGLang, MetaGPT-SOP at 0.15 task/s; ours: simulator, "
                                 f"{overhead_setting}; wall time is machine-dependent"})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _against(r: Mapping[str, Any], metric: str) -> dict[str, Any]:
    out = _latency_row(r, metric)
    return out if np.isfinite(out["ours_value"]) else {**out, "ours": "n/a"}
