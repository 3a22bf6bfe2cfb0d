"""Decision overhead, KV occupancy, stage queueing, sensitivity heatmaps, paper vs ours and the
engine models (notebooks 05-08, 11); the tables behind them are in :mod:`studies.analysis`."""

from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from topas.plots.captions import add_caption
from topas.plots.load import needs_log_scale
from topas.plots.output import measured_caption
from topas.plots.style import policy_color, policy_label, policy_order, policy_palette, workload_label


# --- notebooks 05-08 ------------------------------------------------------------------------
# notebooks 05-08: decision overhead, mechanism (KV occupancy, queueing), sensitivity heatmaps,
# paper vs ours. The tables behind them are in studies.analysis.


def _hide_stale_ticklabels(fig) -> None:
    """Draw ``fig`` once and hide tick labels outside their axis's view limits (matplotlib keeps
    such labels as visible but undrawn Text objects, which :func:`text_overlaps` would count)."""
    fig.canvas.draw()
    for ax in fig.axes:
        for axis, lim in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            lo, hi = min(lim), max(lim)
            tol = 1e-9 * max(abs(lo), abs(hi), 1.0)
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                loc = tick.get_loc()
                if loc is None or not (lo - tol <= loc <= hi + tol):
                    tick.label1.set_visible(False)
                    tick.label2.set_visible(False)


def _log_ms_axis(ax) -> None:
    """Plain numbers on a log axis (``0.1``, ``1``, ``10``) and no minor tick labels."""
    ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def plot_decision_time(decisions: pd.DataFrame, title: str | None = None):
    """Three panels from a TOPAS run's decisions table: histogram of per-decision wall time (ms,
    log-spaced bins) with mean/p50/p99 marked, its ECDF, and candidate prefix sets per decision."""
    ms = decisions["wall_s"].to_numpy(dtype=float) * 1e3
    fig, axes = plt.subplots(1, 3, figsize=(12.5, 3.6))
    marks = [("mean", ms.mean(), "-"), ("p50", np.percentile(ms, 50), "--"), ("p99", np.percentile(ms, 99), ":")]
    lo, hi = max(ms.min(), 1e-3), ms.max()
    bins = np.logspace(np.log10(lo), np.log10(hi * 1.01), 40)
    ax = axes[0]
    ax.hist(ms, bins=bins, color=policy_color("topas"), alpha=0.8)
    ax.set_xscale("log")
    for name, v, ls in marks:
        ax.axvline(v, color="black", ls=ls, lw=1.2, label=f"{name} {v:.2f} ms")
    _log_ms_axis(ax)
    ax.set_xlabel("wall time per decision (ms, log scale: spans orders of magnitude)")
    ax.set_ylabel("decisions")
    ax.legend(loc="best")  # the long right tail usually leaves the upper right free
    ax = axes[1]
    xs = np.sort(ms)
    ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), color=policy_color("topas"))
    for name, v, ls in marks:
        ax.axvline(v, color="black", ls=ls, lw=1.2)
    ax.set_xscale("log")
    _log_ms_axis(ax)
    ax.set_xlabel("wall time per decision (ms, log scale)")
    ax.set_ylabel("fraction of decisions ≤ x")
    ax = axes[2]
    cand = decisions["info_candidates"].dropna().to_numpy(dtype=float)
    ax.hist(cand, bins=min(40, max(5, len(np.unique(cand)))), color=policy_color("topas"), alpha=0.8)
    ax.axvline(cand.mean(), color="black", lw=1.2, label=f"mean {cand.mean():.0f}")
    ax.set_xlabel("candidate prefix sets per decision")
    ax.set_ylabel("decisions")
    ax.legend(loc="upper right")
    if title:
        fig.suptitle(title)
    _hide_stale_ticklabels(fig)
    return fig


def plot_kv_occupancy(timelines: Mapping[tuple[str, str], pd.DataFrame], kv_budget_tokens: int,
                      panel_size: tuple[float, float] = (3.2, 2.4)):
    """A grid (rows: workloads, columns: policies) of stacked areas of KV tokens over time held by
    resident prefixes and by requests, as % of the KV budget; ``timelines`` maps
    ``(workload, policy)`` to a run's timeline table."""
    from topas.plots.style import workload_order

    workloads = workload_order(w for w, _ in timelines)
    policies = policy_order(p for _, p in timelines)
    fig, axes = plt.subplots(len(workloads), len(policies), squeeze=False, sharey=True, sharex="row",
                             figsize=(panel_size[0] * len(policies), panel_size[1] * len(workloads)))
    for i, w in enumerate(workloads):
        for j, p in enumerate(policies):
            ax = axes[i][j]
            tl = timelines.get((w, p))
            if tl is None or tl.empty:
                ax.set_axis_off()
                continue
            t = tl["time"].to_numpy(dtype=float) / 60.0
            pre = 100.0 * tl["prefix_tokens"].to_numpy(dtype=float) / kv_budget_tokens
            req = 100.0 * tl["request_tokens"].to_numpy(dtype=float) / kv_budget_tokens
            ax.stackplot(t, pre, req, step="post", colors=["#BDBDBD", policy_color(p)], alpha=0.85,
                         labels=["prefixes", "requests"], lw=0)
            ax.axhline(100, color="black", lw=0.8, ls="--")
            ax.set_ylim(0, 110)
            ax.set_xlim(0, max(ax.get_xlim()[1], t.max() if len(t) else 1))
            share = np.nan
            if len(t) > 1:
                dt = np.diff(t)
                share = (pre[:-1] * dt).sum() / dt.sum()
            ax.set_title(f"{workload_label(w)} · {policy_label(p)}\nprefixes {share:.0f}% of KV (time avg)")
            if i == len(workloads) - 1:
                ax.set_xlabel("time (min)")
            if j == 0:
                ax.set_ylabel("KV tokens (% of budget)")
    from matplotlib.lines import Line2D

    handles, labels = axes[0][0].get_legend_handles_labels()
    handles.append(Line2D([], [], color="black", lw=0.8, ls="--"))
    fig.legend(handles, ["prefix tokens", "request tokens (colour: policy)", "KV budget (100%)"],
               loc="outside lower center", ncol=3)
    _hide_stale_ticklabels(fig)
    return fig


def plot_stage_queueing(queueing: pd.DataFrame, panel_size: tuple[float, float] = (5.5, 3.2)):
    """Mean queueing time (s) per stage and policy, one panel per workload (canonical order),
    stages in depth order and labelled ``stage (depth)``; ``queueing`` from
    :func:`studies.analysis.stage_queueing`. Zero-based bars when a panel's waits span
    less than 100x; beyond that a bar's length on a log axis means nothing, so the panel shows
    dots (the policy's colour and marker) on a log axis instead, and says so."""
    from matplotlib.lines import Line2D

    from topas.plots.captions import add_caption, log_note
    from topas.plots.style import LOG_SPAN, policy_style, workload_order

    workloads = workload_order(queueing["workload"])
    fig, axes = plt.subplots(len(workloads), 1, squeeze=False,
                             figsize=(panel_size[0] * 1.6, panel_size[1] * len(workloads)), layout="constrained")
    order = policy_order(queueing["policy"])
    width = 0.8 / max(len(order), 1)
    any_log = False
    for ax, w in zip(axes[:, 0], workloads):
        d = queueing[queueing.workload == w].sort_values(["depth", "stage"])
        stages = list(dict.fromkeys(d["stage"]))
        positive = d.loc[d["queue_s"] > 0, "queue_s"]
        log = needs_log_scale(positive, LOG_SPAN)
        any_log |= log
        for k, p in enumerate(order):
            v = d[d["policy"] == p].set_index("stage")["queue_s"].reindex(stages)
            x = np.arange(len(stages)) - 0.4 + width * (k + 0.5)
            st = policy_style(p)
            if log:
                ax.plot(x, v.where(v > 0), lw=0, ms=6, **st)
            else:
                ax.bar(x, v.fillna(0.0), width=width, color=st["color"], edgecolor="#333333", linewidth=0.5)
        depth = dict(zip(d["stage"], d["depth"]))
        ax.set_xticks(range(len(stages)), [f"{s}\n(depth {depth[s]})" for s in stages])
        ax.set_xlim(-0.5, len(stages) - 0.5)
        ax.set_xlabel(f"{workload_label(w)}: stage (depth in the DAG; 0 = root)")
        if log:
            ax.set_yscale("log")
            lo, hi = float(positive.min()), float(positive.max())
            ax.set_ylim(lo / 2.0, hi * 2.0)
            ax.set_ylabel("mean queueing time (s), log scale")
            ax.grid(axis="x", visible=False)
        else:
            ax.set_ylim(0.0, max(float(d["queue_s"].max()), 1e-9) * 1.08)
            ax.set_ylabel("mean queueing time (s)")
    handles = [Line2D([], [], lw=0, ms=6, **policy_style(p)) for p in order]
    fig.legend(handles, [policy_label(p) for p in order], loc="outside upper center", ncol=len(order))
    add_caption(fig, "One run per policy (the mean over its requests of each stage)",
                (log_note() + "; there dots, not bars") if any_log else "")
    _hide_stale_ticklabels(fig)
    return fig


def plot_sensitivity(table: pd.DataFrame, x: str, y: str, values: Sequence[str] = ("mean JCT (s)", "p99 JCT (s)"),
                     labels: Mapping[str, str] | None = None, title: str | None = None):
    """One annotated heatmap per column in ``values`` over parameters ``x`` (columns) and ``y``
    (rows) of a :func:`studies.analysis.sensitivity_table`; the best cell is boxed."""
    import seaborn as sns

    labels = dict(labels or {})
    fig, axes = plt.subplots(1, len(values), figsize=(4.6 * len(values), 3.8), squeeze=False)
    for ax, v in zip(axes[0], values):
        grid = table.pivot(index=y, columns=x, values=v).sort_index(ascending=False)
        sns.heatmap(grid, annot=True, fmt=".1f", cmap="viridis_r", ax=ax, cbar_kws={"label": v},
                    annot_kws={"fontsize": 8})
        r, c = divmod(int(np.nanargmin(grid.to_numpy())), grid.shape[1])
        ax.add_patch(matplotlib.patches.Rectangle((c, r), 1, 1, fill=False, edgecolor="red", lw=2))
        ax.set_xlabel(labels.get(x, x))
        ax.set_ylabel(labels.get(y, y))
        ax.set_title(f"TOPAS {v.split(' (')[0]} (best boxed)")
    if title:
        fig.suptitle(title)
    _hide_stale_ticklabels(fig)
    return fig


def plot_paper_vs_ours(table: pd.DataFrame):
    """Dot plot of the % changes vs the best baseline (or TOPAS-base), one line per
    workload/metric: the paper's reported number (hollow) beside ours (filled), a zero line,
    and rows without our number marked ``(ours: n/a)``; ``table`` from
    :func:`studies.paper_compare.paper_vs_ours` (the absolute overhead rows are skipped; its
    ``ours_low`` / ``ours_high``, where given, are drawn as our interval)."""
    d = table[table["comparison"] != "absolute"].reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(7.5, 0.32 * len(d) + 1.4))
    ys = np.arange(len(d))[::-1]
    ax.axvline(0, color="black", lw=1)
    ax.scatter(d["paper_value"], ys, facecolors="none", edgecolors="black", s=40, label="paper (reported)", zorder=3)
    ours = "ours (measured on SGLang)" if measured_caption() else "ours (simulator)"
    ax.scatter(d["ours_value"], ys, color=policy_color("topas"), s=40, label=ours, zorder=4)
    if {"ours_low", "ours_high"} <= set(d.columns):  # the protocol's 95% intervals
        lo, hi = d["ours_low"].astype(float), d["ours_high"].astype(float)
        ok = lo.notna() & hi.notna()
        if ok.any():
            v = d["ours_value"].astype(float)
            ax.errorbar(v[ok], ys[ok.to_numpy()], xerr=[(v - lo)[ok], (hi - v)[ok]], fmt="none",
                        ecolor=policy_color("topas"), capsize=2.5, lw=1, zorder=3, label="ours: 95% interval")
    names = {"mean_jct": "mean JCT", "p99_jct": "p99 JCT", "request_throughput": "throughput"}
    comps = {"vs_best_baseline": "vs best baseline", "vs_topas_base": "vs TOPAS-base",
             "vs_single_component_min": "vs 1-component (min)", "vs_single_component_max": "vs 1-component (max)"}
    ax.set_yticks(ys, [f"{workload_label(w)} · {names.get(m, m)} · {comps.get(c, c)}"
                       + (" (ours: n/a)" if np.isnan(ov) else "")
                       for w, m, c, ov in zip(d["workload"], d["metric"], d["comparison"], d["ours_value"])])
    ax.set_xlabel("TOPAS change (%)\n< 0: lower JCT (better); throughput: > 0 is better")
    fig.legend(loc="outside upper center", ncol=3)
    if "n_seeds" in d.columns and (d["n_seeds"] > 0).any():
        seeds = sorted({int(n) for n in d["n_seeds"] if n > 0})
        add_caption(fig, f"Ours: the protocol's paired comparison over {'/'.join(map(str, seeds))} evaluation seeds "
                         "(common random numbers) at the highest grid load within both policies' capacities, mean of "
                         "the per-seed relative differences with its 95% interval (t for the mean, BCa bootstrap "
                         "for p99); throughput: capacity against the best baseline's")
    _hide_stale_ticklabels(fig)
    return fig


def plot_engine_model(table: pd.DataFrame, policy: str = "topas"):
    """Notebook 11: ``policy``'s mean and p99 JCT change against the best baseline, per workload,
    on each engine model of ``table`` (from :func:`studies.analysis.engine_model_table`):
    the figures' simulator (stock SGLang, filled) and the other readings (hollow)."""
    from topas.plots.style import workload_order

    workloads = workload_order(table["workload"])
    models = list(dict.fromkeys(table["engine model"]))
    fig, axes = plt.subplots(1, 2, figsize=(8.0, 0.45 * len(workloads) + 1.6), sharey=True)
    ys = np.arange(len(workloads))[::-1]
    hollow = ["black", "grey", "tab:brown", "tab:olive"]
    labels = {"stock": "stock SGLang (the figures)", "legacy": "legacy engine model",
              "host_tier=True": "+ host KV tier for every policy"}
    styles = {m: ({"color": policy_color(policy)} if m == "stock" else
                  {"facecolors": "none", "edgecolors": hollow[(i - 1) % len(hollow)]}) | {"label": labels.get(m, m)}
              for i, m in enumerate(models)}
    for ax, (col, title) in zip(axes, ((f"{policy} vs best: mean JCT %", "mean JCT"),
                                       (f"{policy} vs best: p99 JCT %", "p99 JCT"))):
        ax.axvline(0, color="black", lw=1)
        for model, style in styles.items():
            d = table[table["engine model"] == model].set_index("workload")
            ax.scatter([d[col].get(w, np.nan) for w in workloads], ys, s=40, zorder=3, **style)
        ax.set_xlabel(f"{policy_label(policy)} vs best baseline, {title} (%)")
    axes[0].set_yticks(ys, [workload_label(w) for w in workloads])
    handles, labels_ = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels_, loc="outside upper center", ncol=min(3, len(models)))
    _hide_stale_ticklabels(fig)
    return fig


def plot_mechanism_case(table: pd.DataFrame):
    """The mechanism case (notebook 06, ``studies.plan_study.mechanism_table``): mean JCT
    and the average decode batch against load, one line per policy; a run past capacity
    (``overload``) is drawn hollow, since its JCT grows with the run's length."""
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.4))
    for p in policy_order(table["policy"].unique()):
        g = table[table["policy"] == p].sort_values("load")
        for ax, col in zip(axes, ("jct_mean", "avg_decode_batch")):
            ax.plot(g["load"], g[col], color=policy_color(p), lw=1.2, label=policy_label(p))
            ok, over = g[~g["overload"]], g[g["overload"]]
            ax.scatter(ok["load"], ok[col], color=policy_color(p), s=22, zorder=3)
            ax.scatter(over["load"], over[col], facecolors="none", edgecolors=policy_color(p), s=22, zorder=3)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("mean JCT (s, log)")
    axes[1].set_ylabel("avg decode batch")
    for ax in axes:
        ax.set_xlabel("load (x nominal)")
    axes[0].set_title("Chain-2: JCT (hollow: overload)")
    axes[1].set_title("requests per decode step")
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig
