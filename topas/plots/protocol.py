"""The protocol's final runs (notebook 16): capacity with its interval, and the paired latency
verdicts where every compared policy is within capacity."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from topas.plots.captions import add_caption
from topas.plots.style import policy_color, policy_label, policy_marker, policy_order, workload_label

__all__ = ["VERDICT_COLORS", "plot_capacity", "plot_latency_verdicts", "protocol_caption"]

#: win / tie / loss (Okabe-Ito: bluish green, grey, vermillion)
VERDICT_COLORS = {"win": "#009E73", "tie": "#7F7F7F", "loss": "#D55E00"}


def protocol_caption(runs: pd.DataFrame) -> str:
    """Tasks, seeds and load grid of the protocol's runs."""
    tasks = ", ".join(f"{int(n):,}" for n in sorted(runs["n_tasks"].unique()))
    seeds = sorted(int(s) for s in runs["seed"].unique())
    loads = sorted(float(x) for x in runs["load"].unique())
    step = min(np.diff(loads)) if len(loads) > 1 else math.nan
    return (f"{tasks} tasks per run; evaluation seeds {seeds[0]}-{seeds[-1]} ({len(seeds)} per point, common random "
            f"numbers); load grid {loads[0]:g}-{loads[-1]:g}x nominal in steps of {step:g}")


def _workloads(df: pd.DataFrame) -> list[str]:
    from topas.plots.style import workload_order

    return workload_order(df["workload"])


def plot_capacity(capacity: pd.DataFrame, runs: pd.DataFrame, panel_width: float = 1.3):
    """One row: per workload (in-sample first, then held-out), per policy a marker at the capacity
    (stable at it and every lower grid load on every seed), a thick bar to the first rejected grid
    load (the bracket) and a thin whisker over the seeds' own capacities; a policy rejected at the
    grid's lowest load has no marker, its bar and "<load" instead. Returns the figure."""
    from matplotlib.lines import Line2D

    in_sample = set(capacity.loc[capacity["sample"] == "in-sample", "workload"])
    ordered = _workloads(capacity)
    workloads = [w for w in ordered if w in in_sample] + [w for w in ordered if w not in in_sample]
    policies = policy_order(capacity["policy"])
    top = float(runs["load"].max())
    fig, ax = plt.subplots(figsize=(max(6.0, panel_width * len(workloads) + 1.5), 3.6), layout="constrained")
    width = 0.8 / max(len(policies), 1)
    for k, p in enumerate(policies):
        s = capacity[capacity["policy"] == p].set_index("workload").reindex(workloads)
        xs = np.arange(len(workloads)) - 0.4 + width * (k + 0.5)
        cap = s["capacity"].astype(float).fillna(0.0).to_numpy()
        upper = np.minimum(s["upper"].astype(float).to_numpy(), top + 0.125)
        ax.vlines(xs, cap, upper, color=policy_color(p), lw=4, alpha=0.35)
        ax.vlines(xs, s["seed_low"].astype(float).fillna(0.0), s["seed_high"].astype(float).fillna(0.0),
                  color=policy_color(p), lw=1)
        below = s["capacity"].isna().to_numpy()
        ax.plot(np.where(below, np.nan, xs), cap, linestyle="none", marker=policy_marker(p), color=policy_color(p),
                ms=6, label=policy_label(p))
        for x, u in zip(xs[below], s["upper"].astype(float).to_numpy()[below]):
            ax.text(x, u + 0.04, f"<{u:g}", fontsize=7, ha="center", va="bottom", color=policy_color(p), rotation=90)
    n_in = len(in_sample)
    if 0 < n_in < len(workloads):
        ax.axvline(n_in - 0.5, color="0.3", lw=0.8, ls=":")
        ax.text(n_in - 0.45, top + 0.1, "held out \u2192", fontsize=8, va="bottom", ha="left")
        ax.text(n_in - 0.55, top + 0.1, "\u2190 selected on", fontsize=8, va="bottom", ha="right")
    ax.axhline(1.0, color="0.6", lw=0.6, ls="--")
    ax.set_xticks(np.arange(len(workloads)), [workload_label(w).replace("Random DAG ", "Random DAG\n")
                                              for w in workloads], fontsize=8)
    ax.set_ylabel("capacity (x nominal load)")
    ax.set_ylim(0, top + 0.35)
    handles, labels = ax.get_legend_handles_labels()
    handles += [Line2D([], [], color="0.4", lw=4, alpha=0.35), Line2D([], [], color="0.4", lw=1),
                Line2D([], [], color="0.6", lw=0.6, ls="--")]
    labels += ["bracket: to the first rejected load", "seeds' own capacities (censored at the stopping load)", "nominal load"]
    fig.legend(handles, labels, loc="outside right upper", fontsize=8, frameon=False)
    add_caption(fig, f"Capacity: the largest grid load at which every seed's run passes the steady-state test "
                     f"there and at every lower grid load (Bonferroni over seeds and two indicators, 5% family-wise); "
                     f"a capacity at the grid's top ({top:g}x) is not bracketed", protocol_caption(runs))
    return fig


def plot_latency_verdicts(latency: pd.DataFrame, runs: pd.DataFrame, near_capacity_only: bool = True):
    """Per workload, per candidate: the paired relative difference in mean JCT against the best
    baseline within capacity, with its 95% t interval, coloured by the verdict (win / tie / loss:
    the interval of the per-seed differences excludes zero or not), at the highest load where
    every compared policy is within capacity. Returns the figure."""
    from matplotlib.patches import Patch

    df = latency[latency["near_capacity"]] if near_capacity_only else latency
    workloads = _workloads(df)
    cands = policy_order(df["candidate"])
    fig, axes = plt.subplots(1, len(cands), figsize=(3.6 * len(cands) + 1.2, 0.42 * len(workloads) + 1.6),
                             squeeze=False, sharey=True, layout="constrained")
    for j, c in enumerate(cands):
        ax = axes[0][j]
        s = df[df["candidate"] == c].set_index("workload").reindex(workloads)
        ys = np.arange(len(workloads))[::-1]
        for y, (w, r) in zip(ys, s.iterrows()):
            if pd.isna(r["jct_rel_pct"]):
                ax.text(0, y, "not compared", fontsize=7, va="center", ha="center", color="0.4")
                continue
            col = VERDICT_COLORS.get(r["jct_verdict"], "0.4")
            ax.errorbar(r["jct_rel_pct"], y, xerr=[[r["jct_rel_pct"] - r["jct_rel_low_pct"]],
                                                     [r["jct_rel_high_pct"] - r["jct_rel_pct"]]],
                        fmt=policy_marker(c), color=col, ms=6, capsize=3)
            ax.text(1.02, y, f"{r['load']:g}x vs {policy_label(r['baseline'])}", transform=ax.get_yaxis_transform(),
                    fontsize=7, va="center", ha="left")
        ax.axvline(0, color="0.3", lw=0.8)
        ax.set_yticks(ys, [workload_label(w) for w in workloads])
        ax.set_title(policy_label(c), fontsize=10)
        ax.set_xlabel("mean JCT vs best baseline (%)")
    handles = [Patch(color=v, label=k) for k, v in VERDICT_COLORS.items()]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    add_caption(fig, "Latency where it may be compared: at the highest grid load within the capacity of the "
                     "candidate and of at least one baseline, the candidate against the baseline with the lowest "
                     "seeds' mean JCT there (a choice that favours the baseline); paired mean of per-seed relative "
                     "differences with its 95% t interval; the verdict is on the interval of the per-seed "
                     "differences in seconds (win or loss only where it excludes zero)", protocol_caption(runs))
    return fig
