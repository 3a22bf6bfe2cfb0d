"""JCT and throughput against load, and the ablations (notebooks 02-04)."""

from __future__ import annotations

import math
import os
from typing import Iterable, Sequence

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib import ticker
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from topas.paths import REPO_ROOT
from topas.plots.captions import SEED_RANGE, add_caption, log_note, run_caption
from topas.plots.style import (LOG_SPAN, policy_color, policy_label, policy_order, policy_style, workload_label,
    workload_order)
from topas.sets import ABLATIONS, PAPER_BASELINES


# --- notebooks 02-04: JCT and throughput against load, ablations ----------------------------


#: Axis labels (with units) of the summary columns the result figures plot.
METRIC_LABELS: dict[str, str] = {
    "jct_mean": "mean JCT (s)",
    "jct_p99": "p99 JCT (s)",
    "throughput_rps": "request throughput (requests/s)",
}

#: The x axis of every figure against load.
LOAD_LABEL = "load (x nominal arrival rate)"

#: Column label of the paper's own numbers in a table (never measured here).
PAPER_LABEL = "paper (reported)"


def needs_log_scale(values: Iterable[float], ratio: float = 10.0) -> bool:
    """Whether positive ``values`` span at least ``ratio`` (max/min): then a linear axis would
    squash the small ones (e.g. FCFS dwarfing everything else) and a log axis reads better."""
    v = [float(x) for x in values if x is not None and not math.isnan(float(x)) and float(x) > 0]
    return len(v) >= 2 and max(v) / min(v) >= ratio


def _policy_legend(fig: matplotlib.figure.Figure, policies: Sequence[str], kind: str = "line",
                   max_cols: int = 6, extra: Sequence[tuple] = ()) -> None:
    """One legend for the whole figure, below the panels, in policy order (each policy's colour
    and marker); ``extra``: more ``(handle, label)`` pairs (a band, a reference mark) after them."""
    if kind == "line":
        handles = [Line2D([], [], lw=1.8, ms=5, **policy_style(p)) for p in policies]
    else:
        handles = [Patch(facecolor=policy_color(p), edgecolor="#333333") for p in policies]
    labels = [policy_label(p) for p in policies]
    handles += [h for h, _ in extra]
    labels += [l for _, l in extra]
    ncol = min(len(labels), max_cols)
    fig.legend(handles, labels, loc="outside lower center", ncol=ncol, title="policy")


def _zero_based(ax: matplotlib.axes.Axes, top: float | None = None, axis: str = "y") -> None:
    """Start a linear axis at zero (a truncated axis makes seed noise look like an effect) and
    end it a little above ``top`` (default: the current upper limit), so no point is clipped."""
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    hi = max(hi, top * 1.05) if top is not None and math.isfinite(top) else hi
    if lo < 0 < hi or lo >= 0:
        (ax.set_ylim if axis == "y" else ax.set_xlim)(0.0, hi)


def _tidy_y_axis(ax: matplotlib.axes.Axes, log: bool) -> None:
    """Fix the y ticks to the labelled ones inside the view (a locator also makes labels just
    outside the limits, which overlap the next panel's when measured); on a log axis label
    1-2-5 steps as plain numbers, with no minor labels."""
    if log:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.10g}"))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    lo, hi = ax.get_ylim()
    ticks = [t for t in ax.get_yticks() if lo <= t <= hi]
    if log and len(ticks) < 2:  # less than a 2x span: fall back to plain linear-style ticks
        ax.yaxis.set_major_locator(ticker.MaxNLocator(4))
        ticks = [t for t in ax.get_yticks() if lo <= t <= hi]
    ax.set_yticks(ticks)
    ax.set_ylim(lo, hi)


def plot_metric_vs_load(
    summaries: pd.DataFrame,
    metrics: Sequence[str] = ("jct_mean", "jct_p99"),
    workloads: Sequence[str] | None = None,
    log_y: bool | str = "auto",
    panel_size: tuple[float, float] = (3.4, 2.7),
):
    """One row of panels per metric, one column per workload (in the canonical order): each
    policy's metric against load (a line through the mean over seeds in the policy's colour and
    marker, the band from the min to the max seed); the legend names the policies and the band,
    the caption the tasks per run and the seeds.

    ``summaries``: :func:`topas.experiments.run_sweep` rows (``workload``, ``policy``, ``load``,
    ``seed``, ``n_tasks`` and the metric columns). ``log_y``: ``True``/``False``, or ``"auto"``:
    a log axis for a row whose per-policy means span :data:`~topas.plots.style.LOG_SPAN` (100x)
    or more (see :func:`needs_log_scale`); the y label and the caption say so. A linear axis
    starts at zero. Returns the figure.
    """
    df = summaries
    workloads = workload_order(df["workload"] if workloads is None else workloads)
    policies = policy_order(df["policy"])
    nr, nc = len(metrics), len(workloads)
    fig, axes = plt.subplots(nr, nc, figsize=(panel_size[0] * nc, panel_size[1] * nr + 1.1),
                             squeeze=False, sharex=True, layout="constrained")
    any_log = False
    for i, m in enumerate(metrics):
        means = df.groupby(["workload", "load", "policy"])[m].mean()
        log = needs_log_scale(means, LOG_SPAN) if log_y == "auto" else bool(log_y)
        any_log |= log
        for j, w in enumerate(workloads):
            ax = axes[i][j]
            sub = df[df["workload"] == w]
            top = 0.0
            for p in policies:
                g = sub[sub["policy"] == p].groupby("load")[m].agg(["mean", "min", "max"]).sort_index()
                if g.empty:
                    continue
                st = policy_style(p)
                ax.fill_between(g.index, g["min"], g["max"], color=st["color"], alpha=0.12, lw=0)
                ax.plot(g.index, g["mean"], lw=1.6, ms=4.5, **st)
                top = max(top, float(g["max"].max()))
            if not log:
                _zero_based(ax, top)
            _tidy_y_axis(ax, log)
            if i == 0:
                ax.set_title(workload_label(w))
            ax.set_xlabel(LOAD_LABEL if i == nr - 1 else "")
            label = METRIC_LABELS.get(m, m) + (", log scale" if log else "")
            ax.set_ylabel(label if j == 0 else "")
            ax.set_xticks(sorted(sub["load"].unique()))
    multi = "seed" in df.columns and df["seed"].nunique() > 1
    band = [(Patch(facecolor="0.5", alpha=0.3, lw=0), f"band: {SEED_RANGE}")] if multi else []
    _policy_legend(fig, policies, max_cols=3 if nc == 1 else 7, extra=band)
    add_caption(fig, "Line: mean over seeds" if multi else "", run_caption(df, interval=None),
                log_note() if any_log else "")
    return fig


def jct_table(summaries: pd.DataFrame, baselines: Sequence[str] | None = None) -> pd.DataFrame:
    """Per workload, load and policy: mean and p99 JCT (mean over seeds, with the min and max
    seed), request throughput, and, for every policy that is not a baseline, its change against
    the best baseline of that workload and load, chosen separately per metric (by mean over seeds):
    ``(policy - best) / best`` in %, negative = faster than every baseline."""
    if baselines is None:
        baselines = PAPER_BASELINES
    df = summaries
    g = df.groupby(["workload", "load", "policy"], sort=False)
    t = g.agg(
        seeds=("seed", "nunique"),
        jct_mean=("jct_mean", "mean"), jct_mean_min=("jct_mean", "min"), jct_mean_max=("jct_mean", "max"),
        jct_p99=("jct_p99", "mean"), jct_p99_min=("jct_p99", "min"), jct_p99_max=("jct_p99", "max"),
        throughput_rps=("throughput_rps", "mean"),
    ).reset_index()
    order = {p: k for k, p in enumerate(policy_order(t["policy"]))}
    wl = {w: k for k, w in enumerate(dict.fromkeys(df["workload"]))}
    t = t.sort_values(["workload", "load", "policy"], key=lambda s: s.map(wl) if s.name == "workload"
                      else (s.map(order) if s.name == "policy" else s)).reset_index(drop=True)
    for m, short in (("jct_mean", "mean"), ("jct_p99", "p99")):
        vs, best_name = [], []
        for _, r in t.iterrows():
            base = t[(t.workload == r.workload) & (t.load == r.load) & t.policy.isin(baselines)]
            if r.policy in baselines or base.empty:
                vs.append(float("nan")); best_name.append("")
                continue
            b = base.loc[base[m].idxmin()]
            vs.append(100.0 * (r[m] - b[m]) / b[m]); best_name.append(b.policy)
        t[f"{short} JCT vs best baseline (%)"] = vs
        t[f"best baseline ({short})"] = best_name
    return t.rename(columns={
        "jct_mean": "mean JCT (s)", "jct_mean_min": "mean JCT min (s)", "jct_mean_max": "mean JCT max (s)",
        "jct_p99": "p99 JCT (s)", "jct_p99_min": "p99 JCT min (s)", "jct_p99_max": "p99 JCT max (s)",
        "throughput_rps": "throughput (requests/s)",
    })


def plot_ablation_bars(
    summaries: pd.DataFrame,
    workload: str | None = None,
    metrics: Sequence[str] = ("jct_mean", "jct_p99"),
    log_x: bool | str = False,
    panel_size: tuple[float, float] = (4.2, 3.4),
):
    """One panel per metric: a horizontal bar per policy (TOPAS and its ablations on top, then
    the baselines, hatched, for reference, below a dashed line) at the mean over seeds, the
    whisker from the min to the max seed, the mean written next to it. ``log_x``: ``True``,
    ``False`` (the default: bar lengths stay proportional, the written values carry the small
    differences) or ``"auto"`` as ``log_y`` in :func:`plot_metric_vs_load`. Returns the figure."""
    df = summaries if workload is None else summaries[summaries["workload"] == workload]
    present = policy_order(df["policy"])
    policies = [p for p in ABLATIONS if p in present] + [p for p in present if p not in ABLATIONS]
    n_abl = sum(p in ABLATIONS for p in policies)
    fig, axes = plt.subplots(1, len(metrics), figsize=(panel_size[0] * len(metrics), panel_size[1]),
                             squeeze=False, sharey=True, layout="constrained")
    y = list(range(len(policies)))
    for j, (ax, m) in enumerate(zip(axes[0], metrics)):
        g = df.groupby("policy")[m].agg(["mean", "min", "max"]).reindex(policies)
        bars = ax.barh(y, g["mean"], color=[policy_color(p) for p in policies], edgecolor="#333333",
                       linewidth=0.6)
        for bar, p in zip(bars, policies):
            if p not in ABLATIONS:
                bar.set_hatch("///")
        ax.errorbar(g["mean"], y, xerr=[g["mean"] - g["min"], g["max"] - g["mean"]], fmt="none",
                    ecolor="#222222", elinewidth=1, capsize=3)
        if 0 < n_abl < len(policies):
            ax.axhline(n_abl - 0.5, color="#555555", ls="--", lw=0.8)
        log = needs_log_scale(g["mean"]) if log_x == "auto" else bool(log_x)
        if log:
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.10g}"))
            ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        for k, p in enumerate(policies):  # the value, right of the whisker
            ax.text(g["max"].iloc[k], k, f"  {g['mean'].iloc[k]:,.0f}", va="center", ha="left",
                    fontsize=matplotlib.rcParams["font.size"] - 2)
        if not log:
            ax.set_xlim(0, float(g["max"].max()) * 1.18)
        else:
            lo, hi = ax.get_xlim()
            ax.set_xlim(lo, hi * 1.6)
        if not log:
            ax.xaxis.set_major_locator(ticker.MaxNLocator(5))
        lo, hi = ax.get_xlim()  # only the ticks inside the view (see _tidy_y_axis)
        ax.set_xticks([t for t in ax.get_xticks() if lo <= t <= hi])
        ax.set_xlim(lo, hi)
        ax.set_ylim(len(policies) - 0.5, -0.5)  # first policy on top
        ax.set_xlabel(METRIC_LABELS.get(m, m) + (", log scale" if log else ""))
        ax.grid(axis="y", visible=False)
    axes[0][0].set_yticks(y, [policy_label(p) for p in policies])  # shared: the other panels follow
    if workload is not None:
        at = ", ".join(f"{l:g}" for l in sorted(df["load"].unique()))
        fig.suptitle(f"{workload_label(workload)}, load {at}x nominal: TOPAS and its ablations "
                     f"(above the dashed line), baselines hatched")
    handles = [Patch(facecolor="white", edgecolor="#333333"),
               Line2D([], [], color="#222222", lw=1, marker="|", ms=8, markeredgewidth=1),
               Patch(facecolor="white", edgecolor="#333333", hatch="///")]
    labels = ["bar: mean over seeds (value written)", f"whisker: {SEED_RANGE}", "hatched: baseline (reference)"]
    if n_abl == 0 or n_abl == len(policies):
        handles, labels = handles[:2], labels[:2]
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels))
    add_caption(fig, run_caption(df, interval=None), log_note() if log else "")
    return fig


def ablation_table(
    summaries: pd.DataFrame,
    reported: pd.DataFrame | str | os.PathLike | None = None,
) -> pd.DataFrame:
    """Per workload and policy (TOPAS, its ablations, then the baselines): mean and p99 JCT (mean
    over seeds, min-max), the policy's change against full TOPAS ``(policy - topas) / topas``
    and, in the paper's direction, TOPAS's change against the policy ``(topas - policy) / policy``
    (both in %); next to the latter the paper's own ablation numbers from ``reported`` (default
    ``data/paper/reported.csv``), labelled ``paper (reported)``. The paper gives TOPAS vs
    TOPAS-base and a range over its single-component variants (read here as ``topas-no-reuse``
    = aging only and ``topas-no-aging`` = reuse only), on MetaGPT-TL at 0.0175 task/s: another
    workload and operating point than ours."""
    if reported is None:
        reported = REPO_ROOT / "data" / "paper" / "reported.csv"
    rep = reported if isinstance(reported, pd.DataFrame) else pd.read_csv(reported)
    rep = rep[rep["comparison"].astype(str).str.startswith("vs_topas_base")
              | rep["comparison"].astype(str).str.startswith("vs_single_component")]

    def paper(metric: str, policy: str) -> str:
        r = rep[rep["metric"] == {"jct_mean": "mean_jct", "jct_p99": "p99_jct"}.get(metric, metric)]
        if policy == "topas-base":
            v = r[r["comparison"] == "vs_topas_base"]["value_pct"]
            return f"{v.iloc[0]:+.1f}" if len(v) else ""
        if policy in ("topas-no-reuse", "topas-no-aging"):
            v = r[r["comparison"].str.startswith("vs_single_component")]["value_pct"]
            if len(v):
                lo, hi = sorted(v)[0], sorted(v)[-1]
                return f"{lo:+.1f} to {hi:+.1f} (range over single-component variants)"
        return ""

    where = "MetaGPT-TL, 0.0175 task/s"
    rows = []
    for w in dict.fromkeys(summaries["workload"]):
        d = summaries[summaries["workload"] == w]
        present = policy_order(d["policy"])
        policies = [p for p in ABLATIONS if p in present] + [p for p in present if p not in ABLATIONS]
        g = d.groupby("policy")[["jct_mean", "jct_p99"]].agg(["mean", "min", "max"])
        top = g.loc["topas"] if "topas" in g.index else None
        for p in policies:
            r = g.loc[p]
            row = {"workload": w, "load": float(d["load"].iloc[0]), "policy": p,
                   "kind": "TOPAS" if p == "topas" else ("ablation" if p in ABLATIONS else "baseline (reference)"),
                   "seeds": int(d[d.policy == p]["seed"].nunique())}
            for m, short in (("jct_mean", "mean"), ("jct_p99", "p99")):
                row[f"{short} JCT (s)"] = r[(m, "mean")]
                row[f"{short} JCT min-max (s)"] = f"{r[(m, 'min')]:,.1f}-{r[(m, 'max')]:,.1f}"
            for m, short in (("jct_mean", "mean"), ("jct_p99", "p99")):
                t = top[(m, "mean")] if top is not None else float("nan")
                v = r[(m, "mean")]
                row[f"{short} vs TOPAS (%)"] = 100.0 * (v - t) / t if p != "topas" else float("nan")
                row[f"TOPAS vs it, {short} (%)"] = 100.0 * (t - v) / v if p != "topas" else float("nan")
                row[f"{PAPER_LABEL}: TOPAS vs it, {short} (%), {where}"] = paper(m, p)
            rows.append(row)
    return pd.DataFrame(rows)


def trace_status(workloads: Sequence[str], available: Iterable[str], note: str = "") -> pd.DataFrame:
    """One row per workload: whether its trace is in ``data/traces/`` and, when it is not, ``note``."""
    avail = set(available)
    return pd.DataFrame([
        {"workload": w, "trace found": w in avail, "status": "ok" if w in avail else f"skipped: {note}".rstrip(": ")}
        for w in workloads
    ])
