"""What the policy may know (notebook 14): JCT against prior noise, bias, DAG visibility and
arrival burstiness, and how fast the online estimates converge."""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd

from topas.plots.captions import add_caption, run_caption
from topas.plots.load import _policy_legend, _tidy_y_axis, _zero_based
from topas.plots.style import policy_order, policy_style, workload_label, workload_order


ROBUST_XLABELS = {"prior noise": "prior noise sigma", "prior bias": "prior bias (x, log scale)",
                  "DAG visibility": "DAG visibility", "arrivals": "arrival CV (1 = Poisson)"}


def plot_robustness(table: pd.DataFrame, axis: str, estimator: str = "online",
                    panel_size: tuple[float, float] = (3.0, 2.5)):
    """Notebook 14: each policy's mean (top row) and p99 (bottom row) JCT along one knowledge
    ``axis`` of :func:`studies.analysis.robustness_table`, one column per workload.

    Policies whose point comes from their reference run (they do not read what the axis
    degrades) are drawn dashed. ``estimator``: the SPF/TOPAS output estimator shown; with
    ``"prior"`` the other policies are left out. Workloads in the canonical order; y axes from
    zero (the changes along an axis are often a fraction of a percent: a truncated axis would
    draw them as large). Returns the figure."""
    from matplotlib.lines import Line2D

    df = table[(table["axis"] == axis) & (table["estimator"] == estimator)]
    workloads = workload_order(df["workload"])
    policies = policy_order(df["policy"])
    nc = max(len(workloads), 1)
    fig, axes = plt.subplots(2, nc, figsize=(panel_size[0] * nc, panel_size[1] * 2 + 0.9),
                             squeeze=False, layout="constrained")
    categorical = axis == "DAG visibility"
    for i, (metric, label) in enumerate((("jct_mean", "mean JCT (s)"), ("jct_p99", "p99 JCT (s)"))):
        for j, w in enumerate(workloads):
            ax = axes[i][j]
            sub = df[df["workload"] == w]
            for p in policies:
                s = sub[sub["policy"] == p]
                if s.empty:
                    continue
                if categorical:
                    s = s.assign(_x=s["setting"].map({"full": 0, "online": 1})).sort_values("_x")
                    x = s["_x"]
                else:
                    s = s.sort_values("setting", key=lambda c: c.astype(float))
                    x = s["setting"].astype(float)
                dashed = (s["source"] == "reference").all() and len(s) > 1
                ax.plot(x, s[metric], ms=4, lw=1.6, ls="--" if dashed else "-", **policy_style(p))
            if categorical:
                ax.set_xticks([0, 1], ["full", "online"])
                ax.set_xlim(-0.3, 1.3)
            elif axis == "prior bias":
                ax.set_xscale("log", base=2)
                vals = sorted(float(v) for v in sub["setting"].unique())
                ax.set_xticks(vals, [f"{v:g}" for v in vals])
                ax.minorticks_off()
            else:
                vals = sorted(float(v) for v in sub["setting"].unique())
                ax.set_xticks(vals, [f"{v:g}" for v in vals])
            _zero_based(ax, float(sub[metric].max()) if len(sub) else None)
            _tidy_y_axis(ax, False)
            if i == 0:
                ax.set_title(workload_label(w))
            ax.set_xlabel(ROBUST_XLABELS[axis] if i == 1 else "")
            ax.set_ylabel(label if j == 0 else "")
    dashed = (Line2D([], [], color="#333333", ls="--", lw=1.6), "dashed: reference run (policy does not read this)")
    _policy_legend(fig, policies, extra=[dashed], max_cols=7)
    add_caption(fig, run_caption(df, interval=None))
    return fig


def plot_estimator_convergence(table: pd.DataFrame, panel_size: tuple[float, float] = (3.6, 2.7)):
    """Notebook 14: median relative error of the online output estimator against the number of
    finished calls per agent, one panel per trace, one line per prior noise."""
    workloads = workload_order(table["workload"])
    fig, axes = plt.subplots(1, len(workloads), figsize=(panel_size[0] * len(workloads), panel_size[1] + 0.4),
                             squeeze=False, layout="constrained")
    for j, w in enumerate(workloads):
        ax = axes[0][j]
        sub = table[table["workload"] == w]
        levels = sorted(sub["prior noise"].unique())
        for k, (s, g) in enumerate(sub.groupby("prior noise")):
            g = g.sort_values("n")
            # a sequential colour-blind-safe ramp (light to dark: more noise), a marker each
            shade = matplotlib.colormaps["cividis"](0.15 + 0.7 * k / max(len(levels) - 1, 1))
            ax.plot(g["n"] + 1, g["median rel. error"], marker="osD^v"[k % 5], ms=4, color=shade,
                    label=f"sigma {s:g}")
        ax.set_ylim(0.0, max(ax.get_ylim()[1], float(sub["median rel. error"].max()) * 1.05))
        ax.set_xscale("log")
        ax.set_xticks([1, 2, 6, 11, 51, 201], ["0", "1", "5", "10", "50", "200"])
        ax.minorticks_off()
        ax.set_title(workload_label(w))
        ax.set_xlabel("finished calls of the agent (log spacing)")
        ax.set_ylabel("median |error| / true mean" if j == 0 else "")
        ax.legend(title="prior noise", fontsize="small")
    return fig
