"""Several engines behind a router (notebook 13): router colours and order, JCT, balance and scaling."""

from __future__ import annotations

from typing import Iterable, Sequence

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from topas.plots.load import _tidy_y_axis, needs_log_scale
from topas.plots.style import AGENT_COLORS, POLICY_COLORS, _fallback_color, policy_color, workload_label


# --- several engines (notebook 13) -----------------------------------------------------------

#: Router colours, in the registry's order (:func:`topas.cluster.available_routers`), cycled (no
#: yellow: too faint for a line); our ``topas`` router takes the TOPAS policy's colour.
ROUTER_COLORS: tuple[str, ...] = tuple(c for c in AGENT_COLORS if c not in ("#F0E442", POLICY_COLORS["topas"]))
#: Marker of each policy inside the engines in the cluster figures.
INNER_MARKERS = {"fcfs": "s", "lpm": "D", "topas": "o"}


def router_color(name: str) -> str:
    """A router's colour: its place in the registry (an unknown name: a stable fallback)."""
    from topas.cluster import available_routers

    if name == "topas":
        return policy_color("topas")
    names = [r for r in available_routers() if r != "topas"]
    if name in names:
        return ROUTER_COLORS[names.index(name) % len(ROUTER_COLORS)]
    return _fallback_color(name)


def router_order(names: Iterable[str]) -> list[str]:
    """The distinct router ``names`` in the registry's order; unknown names after them, alphabetically."""
    from topas.cluster import available_routers

    present = set(names)
    known = [r for r in available_routers() if r in present]
    return known + sorted(present - set(known))


def _router_legend(fig: matplotlib.figure.Figure, routers: Sequence[str], policies: Sequence[str] = ()) -> None:
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=router_color(r), lw=1.8) for r in routers]
    labels = list(routers)
    handles += [Line2D([], [], color="#333333", lw=0, marker=INNER_MARKERS.get(p, "o"), ms=5) for p in policies]
    labels += [f"{p} inside" for p in policies]
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 6), title="router (colour)"
               + (", policy inside the engines (marker)" if policies else ""))


def plot_cluster_jct(table: pd.DataFrame, workload: str, metric: str = "mean JCT",
                     panel_size: tuple[float, float] = (3.1, 2.5)):
    """``metric`` against the load per engine on ``workload``: one row of panels per policy inside
    the engines, one column per number of engines, one line per router (``table``:
    :func:`topas.experiments.cluster_study.cluster_table`). Hollow markers: unstable runs."""
    t = table[table["workload"] == workload]
    policies = [p for p in INNER_MARKERS if p in set(t["policy"])] + sorted(set(t["policy"]) - set(INNER_MARKERS))
    engines = sorted(set(t["engines"]))
    routers = router_order(t["router"])
    log = needs_log_scale(t[metric])
    fig, axes = plt.subplots(len(policies), len(engines), squeeze=False, sharex=True, sharey=True,
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
                    ax.plot(e["load / engine"], e[metric], lw=0, marker=INNER_MARKERS.get(p, "o"), ms=4,
                            color=c, markerfacecolor=face)
            if i == 0:
                ax.set_title(f"{n} engines")
            if j == 0:
                ax.set_ylabel(f"{p} inside\n{metric} (s)" + (", log" if log else ""))
            if i == len(policies) - 1:
                ax.set_xlabel("load per engine (x nominal)")
            ax.set_xticks(sorted(set(t["load / engine"])))
    for row in axes:
        for ax in row:
            _tidy_y_axis(ax, log)
    fig.suptitle(f"{workload_label(workload)}: {metric} by router (hollow: unstable run)")
    _router_legend(fig, routers)
    return fig


def plot_cluster_balance(table: pd.DataFrame, load: float, panel_size: tuple[float, float] = (3.1, 2.7)):
    """Balance against locality at one load per engine: one panel per workload and number of
    engines (a row per workload), each (router, policy inside) as a point: x = the coefficient of
    variation of requests per engine, y = the mean number of engines holding an agent's prefix."""
    t = table[np.isclose(table["load / engine"], load)]
    workloads = list(dict.fromkeys(t["workload"]))
    engines = {w: sorted(set(t.loc[t["workload"] == w, "engines"])) for w in workloads}
    ncols = max(len(ns) for ns in engines.values())
    routers = router_order(t["router"])
    policies = [p for p in INNER_MARKERS if p in set(t["policy"])]
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
                        marker=INNER_MARKERS.get(r["policy"], "o"), ms=5, color=router_color(r["router"]), alpha=0.85)
            ax.set_ylim(0.0, n + 0.3)
            ax.set_title(f"{workload_label(w)}, {n} engines")
            ax.set_xlabel("requests per engine, CV")
            ax.set_ylabel("engines holding a prefix (mean)" if j == 0 else "")
    fig.suptitle(f"Balance and prefix copies at {load:g} x nominal per engine")
    _router_legend(fig, routers, policies)
    return fig


def plot_cluster_scaling(table: pd.DataFrame, panel_size: tuple[float, float] = (4.2, 3.0)):
    """Simulation wall time and requests simulated per second against the number of engines (the
    tasks growing with it), one line per (router, policy inside) (``table``:
    :func:`topas.experiments.cluster_study.scaling_table`)."""
    from matplotlib import ticker

    fig, axes = plt.subplots(1, 2, figsize=(panel_size[0] * 2, panel_size[1] + 0.8), layout="constrained")
    for (r, p), d in table.groupby(["router", "policy"], sort=True):
        d = d.sort_values("engines")
        for ax, col in zip(axes, ("sim wall (s)", "requests / s simulated")):
            ax.plot(d["engines"], d[col], marker=INNER_MARKERS.get(p, "o"), ms=4, lw=1.5, color=router_color(r),
                    label=f"{r} + {p}")
    for ax, col in zip(axes, ("simulation wall time (s)", "requests simulated per second")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(set(table["engines"])))
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("engines (tasks grow with them)")
        ax.set_ylabel(col)
        _tidy_y_axis(ax, needs_log_scale(table["sim wall (s)" if ax is axes[0] else "requests / s simulated"]))
    axes[0].legend(title="router + policy inside")
    return fig
