"""Several engines behind a router (notebook 13): router colours and order, JCT, balance and scaling."""

from __future__ import annotations

from typing import Sequence

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from topas.plots.captions import add_caption, log_note, run_caption
from topas.plots.load import _tidy_y_axis, _zero_based, needs_log_scale
from topas.plots.style import LOG_SPAN, router_color, router_marker, router_order, workload_label, workload_order


# --- several engines (notebook 13) -----------------------------------------------------------

#: Fill of the markers of each policy inside the engines in the balance figure (the marker's
#: colour and shape are the router's).
INNER_FILLS = {"fcfs": "none", "lpm": "left", "topas": "full"}
#: The inner policies in the order the figures list them.
INNER_ORDER = ("fcfs", "lpm", "topas")


def _router_handles(routers: Sequence[str]) -> list[tuple]:
    from matplotlib.lines import Line2D

    return [(Line2D([], [], color=router_color(r), marker=router_marker(r), lw=1.6, ms=5), r) for r in routers]


def _router_legend(fig: matplotlib.figure.Figure, routers: Sequence[str], extra: Sequence[tuple] = (),
                   title: str = "router (colour and marker)") -> None:
    pairs = _router_handles(routers) + list(extra)
    fig.legend([h for h, _ in pairs], [l for _, l in pairs], loc="outside lower center",
               ncol=min(len(pairs), 6), title=title)


def plot_cluster_jct(table: pd.DataFrame, workload: str, metric: str = "mean JCT",
                     panel_size: tuple[float, float] = (3.1, 2.5)):
    """``metric`` against the load per engine on ``workload``: one row of panels per policy inside
    the engines (each row its own y scale), one column per number of engines, one line per router (``table``:
    :func:`studies.cluster.tables.cluster_table`), in the router's colour and marker.
    Hollow markers: unstable runs. A linear y axis from zero unless the values span 100x."""
    from matplotlib.lines import Line2D

    t = table[table["workload"] == workload]
    policies = [p for p in INNER_ORDER if p in set(t["policy"])] + sorted(set(t["policy"]) - set(INNER_ORDER))
    engines = sorted(set(t["engines"]))
    routers = router_order(t["router"])
    log = needs_log_scale(t[metric], LOG_SPAN)
    fig, axes = plt.subplots(len(policies), len(engines), squeeze=False, sharex=True, sharey="row",
                             figsize=(panel_size[0] * max(len(engines), 2.2), panel_size[1] * len(policies) + 1.2),
                             layout="constrained")
    for i, p in enumerate(policies):
        for j, n in enumerate(engines):
            ax = axes[i][j]
            sub = t[(t["policy"] == p) & (t["engines"] == n)]
            for r in routers:
                d = sub[sub["router"] == r].sort_values("load / engine")
                if d.empty:
                    continue
                c = router_color(r)
                ax.plot(d["load / engine"], d[metric], color=c, lw=1.4)
                for stable, face in ((True, c), (False, "white")):
                    e = d[d["stable"] == stable]
                    ax.plot(e["load / engine"], e[metric], lw=0, marker=router_marker(r), ms=4.5,
                            color=c, markerfacecolor=face)
            if i == 0:
                ax.set_title(f"{n} engines")
            if j == 0:
                ax.set_ylabel(f"{p} inside\n{metric} (s)" + (", log" if log else ""))
            if i == len(policies) - 1:
                ax.set_xlabel("load per engine (x nominal)")
            ax.set_xticks(sorted(set(t["load / engine"])))
    for p, row in zip(policies, axes):  # one y scale per row (policy inside), from zero
        top = float(t.loc[t["policy"] == p, metric].max())
        for ax in row:
            if not log:
                _zero_based(ax, top)
            _tidy_y_axis(ax, log)
    fig.suptitle(f"{workload_label(workload)}: {metric} by router")
    hollow = (Line2D([], [], color="#333333", marker="o", lw=0, ms=5, markerfacecolor="white"),
              "hollow: unstable run")
    _router_legend(fig, routers, [hollow])
    add_caption(fig, run_caption(t, interval=None), log_note() if log else "")
    return fig


def plot_cluster_balance(table: pd.DataFrame, load: float, panel_size: tuple[float, float] = (3.1, 2.7)):
    """Balance against locality at one load per engine: one panel per workload and number of
    engines (a row per workload), each (router, policy inside) as a point: x = the coefficient of
    variation of requests per engine, y = the mean number of engines holding an agent's prefix;
    the marker's colour and shape are the router's, its fill the policy inside the engines."""
    from matplotlib.lines import Line2D

    t = table[np.isclose(table["load / engine"], load)]
    workloads = workload_order(t["workload"])
    engines = {w: sorted(set(t.loc[t["workload"] == w, "engines"])) for w in workloads}
    ncols = max(len(ns) for ns in engines.values())
    routers = router_order(t["router"])
    policies = [p for p in INNER_ORDER if p in set(t["policy"])]
    fig, axes = plt.subplots(len(workloads), ncols, squeeze=False,
                             figsize=(panel_size[0] * ncols, panel_size[1] * len(workloads) + 1.3),
                             layout="constrained")
    for i, w in enumerate(workloads):
        for j in range(ncols):
            ax = axes[i][j]
            if j >= len(engines[w]):
                ax.set_visible(False)
                continue
            n = engines[w][j]
            sub = t[(t["workload"] == w) & (t["engines"] == n)]
            for r in sub.to_dict("records"):
                ax.plot([r["requests/engine CV"]], [r["prefix copies (mean)"]], lw=0,
                        marker=router_marker(r["router"]), ms=6, color=router_color(r["router"]),
                        fillstyle=INNER_FILLS.get(r["policy"], "full"), markerfacecoloralt="white", alpha=0.9)
            ax.set_ylim(0.0, n + 0.3)
            right = max(float(sub["requests/engine CV"].max()) * 1.08, 0.01)
            ax.set_xlim(-0.04 * right, right)  # a perfectly balanced router (CV 0) is not cut in half
            ax.set_title(f"{workload_label(w)}, {n} engines")
            ax.set_xlabel("requests per engine, CV")
            ax.set_ylabel("engines holding a prefix (mean)" if j == 0 else "")
    fig.suptitle(f"Balance and prefix copies at {load:g} x nominal per engine")
    fills = [(Line2D([], [], color="#333333", marker="o", lw=0, ms=6, fillstyle=INNER_FILLS.get(p, "full"),
                     markerfacecoloralt="white"), f"{p} inside") for p in policies]
    _router_legend(fig, routers, fills, title="router (colour and marker), policy inside the engines (fill)")
    add_caption(fig, run_caption(t, interval=None))
    return fig


def plot_cluster_scaling(table: pd.DataFrame, panel_size: tuple[float, float] = (4.2, 3.0)):
    """Simulation wall time and requests simulated per second against the number of engines (the
    tasks growing with it), one line per (router, policy inside) (``table``:
    :func:`studies.cluster.tables.scaling_table`)."""
    from matplotlib import ticker

    fig, axes = plt.subplots(1, 2, figsize=(panel_size[0] * 2, panel_size[1] + 0.8), layout="constrained")
    for (r, p), d in table.groupby(["router", "policy"], sort=True):
        d = d.sort_values("engines")
        for ax, col in zip(axes, ("sim wall (s)", "requests / s simulated")):
            ax.plot(d["engines"], d[col], marker=router_marker(r), ms=4.5, lw=1.5, color=router_color(r),
                    label=f"{r} router + {p} inside")
    any_log = False
    for ax, col, label in zip(axes, ("sim wall (s)", "requests / s simulated"),
                              ("simulation wall time (s)", "requests simulated per second")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(set(table["engines"])))
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("engines (doubling; tasks grow with them)")
        log = needs_log_scale(table[col], LOG_SPAN)
        any_log |= log
        if not log:
            _zero_based(ax, float(table[col].max()))
        ax.set_ylabel(label + (", log scale" if log else ""))
        _tidy_y_axis(ax, log)
    axes[0].legend(title="router + policy inside")
    add_caption(fig, "One run per point", log_note() if any_log else "")
    return fig
