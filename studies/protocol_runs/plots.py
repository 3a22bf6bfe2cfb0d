"""The protocol's final runs (notebook 16): capacity with its interval, and the paired latency
verdicts where every compared policy is within capacity."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from topas.plots.captions import add_caption, log_note
from topas.plots.load import LOAD_LABEL, METRIC_LABELS, _policy_legend, _tidy_y_axis, _zero_based, needs_log_scale
from topas.plots.style import (LOG_SPAN, policy_color, policy_label, policy_marker, policy_order, policy_style,
                               workload_label, workload_order)

__all__ = ["VERDICT_COLORS", "plot_capacity", "plot_latency_verdicts", "plot_load_curves", "protocol_caption"]

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


def plot_capacity(capacity: pd.DataFrame, runs: pd.DataFrame, panel_width: float | None = None):
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
    if panel_width is None:  # room for each policy's bar and its rotated "<load" label
        panel_width = max(1.3, 0.22 * len(policies))
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


def plot_load_curves(curves: pd.DataFrame, runs: pd.DataFrame, metrics=("jct_mean", "jct_p99"),
                     workloads=None, panel_size: tuple[float, float] = (3.4, 2.7)):
    """One row of panels per metric, one column per workload (canonical order): per policy, a line
    through the seeds' mean at the loads within its capacity, the 95% t interval as a band, and at
    its first load past capacity a hollow marker on the panel's top edge (overload: its numbers are
    in the overload table, never a latency; plotting them would squash the curves). ``curves``:
    :func:`studies.protocol_runs.curves.load_curves`; ``runs``: the protocol's runs (for the
    caption). A row whose means span :data:`~topas.plots.style.LOG_SPAN` or more gets a log axis
    (the label says so). Returns the figure."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.transforms import blended_transform_factory

    workloads = workload_order(curves["workload"] if workloads is None else workloads)
    policies = policy_order(curves["policy"])
    inside_all = curves[curves["claim"] == "latency"]
    nr, nc = len(metrics), len(workloads)
    fig, axes = plt.subplots(nr, nc, figsize=(panel_size[0] * nc, panel_size[1] * nr + 1.3),
                             squeeze=False, sharex="col", layout="constrained")
    any_log = False
    for i, m in enumerate(metrics):
        log = needs_log_scale(inside_all[m], LOG_SPAN)
        any_log |= log
        for j, w in enumerate(workloads):
            ax = axes[i][j]
            sub = curves[curves["workload"] == w]
            top, marks = 0.0, []
            for p in policies:
                g = sub[sub["policy"] == p].sort_values("load")
                st = policy_style(p)
                inside = g[g["claim"] == "latency"]
                if not inside.empty:
                    low = inside[f"{m}_low"].fillna(inside[m])
                    high = inside[f"{m}_high"].fillna(inside[m])
                    ax.fill_between(inside["load"], low.clip(lower=0), high, color=st["color"], alpha=0.15, lw=0)
                    ax.plot(inside["load"], inside[m], lw=1.6, ms=4.5, **st)
                    top = max(top, float(high.max()))
                marks += [(float(x), p) for x in g.loc[g["claim"] == "overload", "load"]]
            if not log:
                _zero_based(ax, top * 1.12 if top else None)
            _tidy_y_axis(ax, log)
            edge = blended_transform_factory(ax.transData, ax.transAxes)
            stacked: dict[float, int] = {}
            for x, p in marks:  # policies past capacity at the same load stack downwards
                k = stacked[x] = stacked.get(x, -1) + 1
                st = policy_style(p)
                ax.plot([x], [0.96 - 0.07 * k], transform=edge, linestyle="none", marker=st["marker"], ms=5.5,
                        markerfacecolor="white", markeredgecolor=st["color"], markeredgewidth=1.3, clip_on=False)
            if i == 0:
                ax.set_title(workload_label(w))
            ax.set_xlabel(LOAD_LABEL if i == nr - 1 else "")
            ax.set_ylabel(METRIC_LABELS.get(m, m) + (", log scale" if log else "") if j == 0 else "")
            loads = sorted(sub["load"].unique())
            ax.set_xticks(loads[::2] if len(loads) > 6 else loads)
            ax.set_xlim(loads[0] - 0.06, loads[-1] + 0.06)
    extra = [(Patch(facecolor="0.5", alpha=0.3, lw=0), "band: 95% t interval of the seeds' mean"),
             (Line2D([], [], linestyle="none", marker="o", markerfacecolor="white", markeredgecolor="0.3"),
              "hollow, top edge: first load past capacity")]
    _policy_legend(fig, policies, max_cols=3 if nc == 1 else 7, extra=extra)
    add_caption(fig, "Line: the seeds' mean at the loads within the policy's capacity (every seed stable there "
                     "and at every lower grid load); per-policy intervals, not paired comparisons (those are in "
                     "the verdict table); a policy's first load past capacity is marked on the top edge and "
                     "reported in the overload table", protocol_caption(runs), log_note() if any_log else "")
    return fig
