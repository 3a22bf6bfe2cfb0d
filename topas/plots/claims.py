"""When does the paper's claim hold (notebook 12): JCT against the best baseline's capacity,
the headroom, and the space of readings."""

from __future__ import annotations

import math
import zlib

import matplotlib.pyplot as plt
import pandas as pd

from topas.plots.load import _policy_legend, _tidy_y_axis, needs_log_scale
from topas.plots.style import policy_color, policy_label, policy_order, workload_label


# notebook 12: when does the paper's claim hold? ------------------------------------------------

FRACTION_LABEL = "load (x the best baseline's capacity)"


def plot_capacity_jct(table: pd.DataFrame, capacities: pd.DataFrame,
                      panel_size: tuple[float, float] = (3.2, 2.6)):
    """Mean and p99 JCT against the load as a fraction of the best baseline's capacity, per
    workload and policy (``table``: :func:`topas.experiments.claims.operating_table`); each policy's
    own capacity (``capacities``: :func:`topas.experiments.capacity.capacity_table`, its
    ``fraction of best baseline``) is marked by a triangle on the x axis in its colour. The grey
    band is beyond the best baseline's capacity."""
    workloads = list(dict.fromkeys(table["workload"]))
    policies = policy_order(table["policy"])
    metrics = (("mean JCT", "mean JCT (s)"), ("p99 JCT", "p99 JCT (s)"))
    fig, axes = plt.subplots(2, len(workloads), figsize=(panel_size[0] * len(workloads), panel_size[1] * 2 + 1.0),
                             squeeze=False, layout="constrained")
    for i, (col, label) in enumerate(metrics):
        log = needs_log_scale(table[col])
        for j, w in enumerate(workloads):
            ax = axes[i][j]
            sub = table[table["workload"] == w]
            ax.axvspan(1.0, max(1.3, float(sub["fraction"].max()) + 0.1), color="0.92", zorder=0)
            for p in policies:
                d = sub[sub["policy"] == p].sort_values("fraction")
                ax.plot(d["fraction"], d[col], marker="o", ms=3.5, lw=1.6, color=policy_color(p))
                cap = capacities[(capacities["workload"] == w) & (capacities["policy"] == p)]
                if i == 1 and len(cap) and math.isfinite(float(cap["fraction of best baseline"].iloc[0])):
                    x = float(cap["fraction of best baseline"].iloc[0])
                    if x <= ax.get_xlim()[1]:
                        ax.plot([x], [0.0], marker="^", ms=7, color=policy_color(p), clip_on=False,
                                transform=ax.get_xaxis_transform(), zorder=4)
            _tidy_y_axis(ax, log)
            if i == 0:
                ax.set_title(workload_label(w))
            ax.set_xlabel(FRACTION_LABEL if i == 1 else "")
            ax.set_ylabel(label + (", log scale" if log else "") if j == 0 else "")
    _policy_legend(fig, policies)
    return fig


def plot_headroom(table: pd.DataFrame, panel_size: tuple[float, float] = (3.2, 2.8)):
    """Per workload: the mean JCT of the best baseline, TOPAS and TOPAS+ (filled) at each operating
    point, the bounds every scheduler obeys (lines) and the best baseline's relaxations (hollow);
    ``table``: :func:`topas.experiments.headroom.headroom_table` rows with a ``fraction`` column."""
    workloads = list(dict.fromkeys(table["workload"]))
    fig, axes = plt.subplots(1, len(workloads), figsize=(panel_size[0] * len(workloads), panel_size[1] + 0.9),
                             squeeze=False, layout="constrained")
    styles: dict[str, dict] = {}
    for j, w in enumerate(workloads):
        ax = axes[0][j]
        sub = table[table["workload"] == w]
        for ref, d in sub.groupby("reference", sort=False):
            d = d.sort_values("fraction")
            kind = d["kind"].iloc[0]
            name = "best baseline" if ref.startswith("best baseline") else ref
            if kind == "bound":
                st = {"color": "black", "ls": "--" if "critical" in ref else ":", "lw": 1.4, "marker": None}
            elif kind == "relaxation":
                st = {"color": "0.45", "ls": "none", "marker": "o", "mfc": "none", "ms": 6}
            else:
                pol = "lpm" if name == "best baseline" else ref
                st = {"color": policy_color(pol), "ls": "-", "marker": "o", "ms": 4, "lw": 1.6}
                if name == "best baseline":
                    st["color"] = "#0072B2"
            if kind == "relaxation" and "KV" in ref:
                st["marker"] = "s"
            styles.setdefault(name if kind != "measured" else policy_label(name) if name != "best baseline" else name, st)
            ax.plot(d["fraction"], d["mean JCT"], **st)
        _tidy_y_axis(ax, True)
        ax.set_title(workload_label(w))
        ax.set_xlabel(FRACTION_LABEL)
        ax.set_ylabel("mean JCT (s), log scale" if j == 0 else "")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], **{k: v for k, v in st.items()}) for st in styles.values()]
    fig.legend(handles, list(styles), loc="outside lower center", ncol=min(4, len(styles)))
    return fig


def plot_reading_space(table: pd.DataFrame, metric: str = "mean", panel_size: tuple[float, float] = (3.0, 2.8)):
    """Per workload: TOPAS's change against the best baseline under every reading (grey dots),
    at each operating point; the default reading (the figures') in TOPAS's colour; a symmetric log
    axis where the changes span 30x or more. ``table``: :func:`topas.experiments.claims.reading_space_table`."""
    from matplotlib import ticker

    workloads = list(dict.fromkeys(table["workload"]))
    col = f"{metric} vs best %"
    fig, axes = plt.subplots(1, len(workloads), figsize=(panel_size[0] * len(workloads), panel_size[1] + 0.8),
                             squeeze=False, layout="constrained", sharey=False)
    for j, w in enumerate(workloads):
        ax = axes[0][j]
        sub = table[table["workload"] == w]
        fracs = sorted(sub["fraction"].unique())
        xs = {f: i for i, f in enumerate(fracs)}
        ax.axhline(0, color="black", lw=1)
        other = sub[sub["reading"] != "default"]
        jitter = (other["reading"].map(lambda r: (zlib.crc32(r.encode()) % 21 - 10) / 40.0)).to_numpy()
        ax.scatter(other["fraction"].map(xs) + jitter, other[col], s=12, color="0.55", alpha=0.8,
                   label="another reading")
        d = sub[sub["reading"] == "default"]
        ax.scatter(d["fraction"].map(xs), d[col], s=40, color=policy_color("topas"), zorder=3,
                   label="the figures' reading")
        ax.set_xticks(range(len(fracs)), [f"{f:g}x" for f in fracs])
        ax.set_xlabel(FRACTION_LABEL)
        ax.set_title(workload_label(w))
        if needs_log_scale(sub[col].abs() + 1, 30):
            ax.set_yscale("symlog", linthresh=50)
            ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:+,.0f}" if v else "0"))
        ax.set_ylabel(f"TOPAS vs best baseline, {metric} JCT (%)" if j == 0 else "")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2)
    return fig
