"""The eviction study (notebook 15): the Belady gap of each eviction order, per admission policy."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from topas.plots.style import policy_label, policy_order, workload_label

#: Eviction orders, their labels and colours (Okabe-Ito, colour-blind safe; the bound is black).
EVICTION_ORDER: tuple[str, ...] = ("lru", "lfu", "priority", "kvflow", "belady")
EVICTION_LABELS: dict[str, str] = {"lru": "LRU (SGLang)", "lfu": "LFU", "priority": "policy priority",
                                   "kvflow": "KVFlow", "belady": "Belady (offline bound)"}
EVICTION_COLORS: dict[str, str] = {"lru": "#56B4E9", "lfu": "#E69F00", "priority": "#009E73", "kvflow": "#CC79A7",
                                   "belady": "#000000"}

#: short admission labels for the ticks (TOPAS+ is ours, as the caption and policy_label say)
_SHORT = {"topas-plus": "TOPAS+"}

__all__ = ["EVICTION_COLORS", "EVICTION_LABELS", "EVICTION_ORDER", "eviction_caption", "plot_belady_gap"]


def eviction_caption(runs: pd.DataFrame, host_tier: str = "none") -> str:
    """The caption of :func:`plot_belady_gap`: tasks, seeds, load and the interval."""
    df = runs[runs["host_tier"] == host_tier]
    tasks = ", ".join(str(int(t)) for t in sorted(df["tasks"].unique()))
    seeds = ", ".join(str(int(s)) for s in sorted(df["seeds"].unique()))
    return (f"Belady gap: each eviction order against the offline bound (Belady, which reads the true future) under "
            f"the same admission policy, host tier {host_tier!r}; {tasks} tasks per run, {seeds} evaluation seeds "
            f"(common random numbers), load {float(df['load'].iloc[0]):g}x nominal. Top: uncached prompt tokens "
            "(prefilled, not found cached), seeds' means. Bottom: mean JCT, paired mean of per-seed ratios with "
            "its 95% t interval; a missing bar: a compared cell is not stable (not compared).")


def plot_belady_gap(gap: pd.DataFrame, host_tier: str = "none", panel_size: tuple[float, float] = (3.3, 2.4),
                    max_cols: int = 5):
    """Notebook 15: one column per workload (at most ``max_cols``, then a further band of
    workloads below); in each band the top row is the uncached-token gap to Belady (percent), the
    bottom row the mean-JCT gap (percent, with its paired 95% interval); groups of bars per
    admission policy, one bar per eviction order. Returns the figure."""
    from matplotlib.patches import Patch

    df = gap[gap["host_tier"] == host_tier]
    workloads = list(dict.fromkeys(df["workload"]))
    admissions = policy_order(df["admission"])
    evictions = [e for e in EVICTION_ORDER if e in set(df["eviction"])]
    evictions += sorted(set(df["eviction"]) - set(evictions))
    nc = max(min(len(workloads), max_cols), 1)
    bands = max(-(-len(workloads) // nc), 1)
    fig, axes = plt.subplots(2 * bands, nc, figsize=(panel_size[0] * nc, (panel_size[1] * 2 + 0.6) * bands + 0.4),
                             squeeze=False, layout="constrained")
    for k in range(len(workloads), bands * nc):  # the last band's empty panels
        for i in range(2):
            axes[2 * (k // nc) + i][k % nc].set_visible(False)
    width = 0.8 / max(len(evictions), 1)
    x0 = np.arange(len(admissions))
    for n, w in enumerate(workloads):
        band, j = divmod(n, nc)
        sub = df[df["workload"] == w]
        for i, (col, label) in enumerate((("uncached_gap_pct", "uncached tokens\nvs Belady (%)"),
                                           ("jct_gap_pct", "mean JCT\nvs Belady (%)"))):
            ax = axes[2 * band + i][j]
            for k, e in enumerate(evictions):
                s = sub[sub["eviction"] == e].set_index("admission").reindex(admissions)
                xs = x0 - 0.4 + width * (k + 0.5)
                vals = s[col].astype(float).to_numpy()
                yerr = None
                if col == "jct_gap_pct":
                    lo = (vals - s["jct_gap_low_pct"].astype(float).to_numpy())
                    hi = (s["jct_gap_high_pct"].astype(float).to_numpy() - vals)
                    yerr = np.vstack([lo, hi])
                ax.bar(xs, vals, width, color=EVICTION_COLORS.get(e, "#999999"), edgecolor="#333333", lw=0.4,
                       yerr=yerr, error_kw={"elinewidth": 0.8, "capsize": 1.5, "ecolor": "#333333"})
            ax.axhline(0.0, color="#333333", lw=0.8)
            if sub[col].isna().all():
                ax.text(0.5, 0.5, "not compared:\nno stable pair", transform=ax.transAxes, ha="center", va="center",
                        fontsize=8, color="0.35")
            ax.set_xticks(x0, [_SHORT.get(a, policy_label(a)) for a in admissions], rotation=45, ha="right",
                          fontsize=7)
            if i == 0:
                ax.set_title(workload_label(w))
            if j == 0:
                ax.set_ylabel(label)
    handles = [Patch(facecolor=EVICTION_COLORS.get(e, "#999999"), edgecolor="#333333") for e in evictions]
    handles.append(plt.Line2D([], [], color="#333333", lw=0.8, marker="|", ms=6))
    fig.legend(handles, [EVICTION_LABELS.get(e, e) for e in evictions] + ["paired 95% interval"],
               loc="outside lower center", ncol=min(len(handles), 2 * nc), title="eviction order")
    return fig
