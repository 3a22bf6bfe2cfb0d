"""When does the paper's claim hold (notebook 12): JCT against the best baseline's capacity,
the headroom, and the space of readings."""

from __future__ import annotations

import math
import zlib

import matplotlib.pyplot as plt
import pandas as pd

from topas.plots.captions import add_caption, log_note, run_caption
from topas.plots.load import _policy_legend, _tidy_y_axis, _zero_based, needs_log_scale
from topas.plots.style import (LOG_SPAN, policy_color, policy_label, policy_order, policy_style, workload_label,
    workload_order)


# notebook 12: when does the paper's claim hold? ------------------------------------------------

FRACTION_LABEL = "load (x the best baseline's capacity)"


def plot_capacity_jct(table: pd.DataFrame, capacities: pd.DataFrame,
                      panel_size: tuple[float, float] = (3.2, 2.6)):
    """Mean and p99 JCT against the load as a fraction of the best baseline's capacity, per
    workload (canonical order) and policy (its colour and marker) (``table``:
    :func:`studies.claims.tables.operating_table`); each policy's own capacity
    (``capacities``: :func:`topas.experiments.capacity.capacity_table`, its ``fraction of best
    baseline``) is marked by a triangle on the x axis in its colour (the x axis reaches the
    largest, so none is cut off). The grey band is beyond the best baseline's capacity. A panel's
    y axis is logarithmic only where its values span 100x or more (the label says so)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    workloads = workload_order(table["workload"])
    policies = policy_order(table["policy"])
    metrics = (("mean JCT", "mean JCT (s)"), ("p99 JCT", "p99 JCT (s)"))
    fig, axes = plt.subplots(2, len(workloads), figsize=(panel_size[0] * len(workloads), panel_size[1] * 2 + 1.2),
                             squeeze=False, layout="constrained")
    any_log = False
    for j, w in enumerate(workloads):
        sub = table[table["workload"] == w]
        caps = {}
        for p in policies:
            cap = capacities[(capacities["workload"] == w) & (capacities["policy"] == p)]
            if len(cap) and math.isfinite(float(cap["fraction of best baseline"].iloc[0])):
                caps[p] = float(cap["fraction of best baseline"].iloc[0])
        right = max([float(sub["fraction"].max()) + 0.1, 1.3] + [c + 0.05 for c in caps.values()])
        left = min([float(sub["fraction"].min())] + list(caps.values())) - 0.05
        for i, (col, label) in enumerate(metrics):
            ax = axes[i][j]
            log = needs_log_scale(sub[col], LOG_SPAN)
            any_log |= log
            ax.axvspan(1.0, right, color="0.92", zorder=0)
            for p in policies:
                d = sub[sub["policy"] == p].sort_values("fraction")
                ax.plot(d["fraction"], d[col], ms=3.5, lw=1.6, **policy_style(p))
            ax.set_xlim(left, right)
            if not log:
                _zero_based(ax, float(sub[col].max()))
            _tidy_y_axis(ax, log)
            if i == 1:
                for p, x in caps.items():
                    ax.plot([x], [0.0], marker="^", ms=7, color=policy_color(p), clip_on=False,
                            transform=ax.get_xaxis_transform(), zorder=4, markeredgecolor="white", markeredgewidth=0.5)
            if i == 0:
                ax.set_title(workload_label(w))
            ax.set_xlabel(FRACTION_LABEL if i == 1 else "")
            if j == 0 or log:
                ax.set_ylabel(label + (", log scale" if log else ""))
    extra = [(Patch(facecolor="0.92", edgecolor="0.8"), "beyond the best baseline's capacity"),
             (Line2D([], [], color="#555555", marker="^", lw=0, ms=7), "on the x axis: the policy's own capacity (its colour)")]
    _policy_legend(fig, policies, extra=extra, max_cols=5)
    add_caption(fig, run_caption(table, interval=None), log_note() if any_log else "")
    return fig


def plot_headroom(table: pd.DataFrame, panel_size: tuple[float, float] = (3.2, 2.8)):
    """Per workload: the mean JCT of the best baseline, TOPAS and TOPAS+ (filled) at each operating
    point, the bounds every scheduler obeys (lines) and the best baseline's relaxations (hollow);
    ``table``: :func:`studies.claims.headroom.headroom_table` rows with a ``fraction`` column.
    Workloads in the canonical order; a panel's y axis is linear from zero unless its values span
    100x or more."""
    workloads = workload_order(table["workload"])
    fig, axes = plt.subplots(1, len(workloads), figsize=(panel_size[0] * len(workloads), panel_size[1] + 0.9),
                             squeeze=False, layout="constrained")
    styles: dict[str, dict] = {}
    any_log = False
    for j, w in enumerate(workloads):
        ax = axes[0][j]
        sub = table[table["workload"] == w]
        for ref, d in sub.groupby("reference", sort=False):
            d = d.sort_values("fraction")
            kind = d["kind"].iloc[0]
            name = "best baseline" if ref.startswith("best baseline") else ref
            if kind == "bound":
                st = {"color": "0.3", "ls": "--" if "critical" in ref else ":", "lw": 1.4, "marker": None}
            elif kind == "relaxation":
                st = {"color": "0.45", "ls": "none", "marker": "o", "mfc": "none", "ms": 6}
            else:
                # the best baseline changes from point to point: a colour no policy has
                st = ({"color": "#8C6BB1", "ls": "-", "marker": "d", "ms": 5, "lw": 1.6} if name == "best baseline"
                      else {"ls": "-", "ms": 5, "lw": 1.6, **policy_style(ref)})
            if kind == "relaxation" and "KV" in ref:
                st["marker"] = "s"
            styles.setdefault(name if kind != "measured" else policy_label(name) if name != "best baseline" else name, st)
            ax.plot(d["fraction"], d["mean JCT"], **st)
        log = needs_log_scale(sub["mean JCT"], LOG_SPAN)
        any_log |= log
        if not log:
            _zero_based(ax, float(sub["mean JCT"].max()))
        _tidy_y_axis(ax, log)
        ax.set_title(workload_label(w))
        ax.set_xlabel(FRACTION_LABEL)
        ax.set_ylabel("mean JCT (s)" + (", log scale" if log else "") if j == 0 or log else "")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], **{k: v for k, v in st.items()}) for st in styles.values()]
    fig.legend(handles, list(styles), loc="outside lower center", ncol=min(4, len(styles)))
    add_caption(fig, "Filled: measured; hollow: the best baseline with a resource relaxed; "
                "lines without markers: bounds every scheduler obeys (the dotted queue bound hides under the "
                "dashed critical path where the two are equal)", run_caption(table, interval=None),
                log_note() if any_log else "")
    return fig


def plot_reading_space(table: pd.DataFrame, metric: str = "mean", panel_size: tuple[float, float] = (3.0, 2.8)):
    """Per workload: TOPAS's change against the best baseline under every reading (grey dots),
    at each operating point; the default reading (the figures') in TOPAS's colour and marker; a
    linear axis through zero, its limits from the data (no point cut off). ``table``:
    :func:`studies.claims.tables.reading_space_table`."""
    from matplotlib import ticker
    from matplotlib.lines import Line2D

    workloads = workload_order(table["workload"])
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
                   marker=policy_style("topas")["marker"], label="the figures' reading")
        ax.set_xticks(range(len(fracs)), [f"{f:g}x" for f in fracs])
        ax.set_xlabel(FRACTION_LABEL)
        ax.set_title(workload_label(w))
        vals = sub[col].dropna()
        lo, hi = min(0.0, float(vals.min())), max(0.0, float(vals.max()))
        pad = 0.06 * (hi - lo or 1.0)
        ax.set_ylim(lo - pad, hi + pad)
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:+,.0f}" if v else "0"))
        ax.set_ylabel(f"TOPAS vs best baseline, {metric} JCT (%)" if j == 0 else "")
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles.append(Line2D([], [], color="black", lw=1))
    labels.append("0: a tie with the best baseline (> 0: TOPAS slower)")
    fig.legend(handles, labels, loc="outside lower center", ncol=3)
    add_caption(fig, "Each grey dot: one other reading of the protocol (jittered sideways)")
    return fig
