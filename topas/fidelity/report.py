"""Notebook 10's figure and table: simulated vs measured, from a comparison on disk."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator
import numpy as np
import pandas as pd

from topas import plots
from topas.fidelity.compare import Comparison, noise_summary, request_path

__all__ = ["plot_sim_vs_measured", "fidelity_table", "path_table", "noise_table", "summary_line", "contention_table",
           "contention_arrivals_table"]

_TABLE_METRICS = (("jct_mean", "mean JCT (s)"), ("jct_p99", "p99 JCT (s)"), ("queue_mean", "mean queueing (s)"),
                  ("e2e_mean", "mean request latency (s)"), ("cached_tokens", "cached tokens"),
                  ("retractions", "retractions"))


def plot_sim_vs_measured(c: Comparison, panel_size: tuple[float, float] = (4.0, 3.8)):
    """One panel per (workload, load): every task's simulated JCT (y) against its measured JCT
    (x, the mean over repeats, with the min-max over repeats as a horizontal bar), a colour per
    policy, and the y = x line; the panel title gives the mean JCTs' relative errors."""
    t = c.tasks
    keys = sorted({(w, l) for w, l in zip(t["workload"], t["load"])}) if len(t) else []
    if not keys:
        raise ValueError("the comparison has no per-task pairs")
    ncol = min(len(keys), 2)
    nrow = math.ceil(len(keys) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(panel_size[0] * ncol, panel_size[1] * nrow + 0.6), squeeze=False)
    pols = plots.policy_order(sorted(set(t["policy"])))
    errs = c.table[c.table["metric"] == "jct_mean"].set_index(["workload", "load", "policy"])["rel_err"]
    for ax, (wl, load) in zip(axes.flat, keys):
        g = t[(t["workload"] == wl) & (t["load"] == load)]
        lo = float(np.nanmin([g["sim_jct"].min(), g["measured_min"].min()]))
        hi = float(np.nanmax([g["sim_jct"].max(), g["measured_max"].max()]))
        pad = 0.05 * (hi - lo if hi > lo else 1.0)
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="0.4", lw=1, ls="--", zorder=1)
        for p in pols:
            gp = g[g["policy"] == p]
            if not len(gp):
                continue
            ax.errorbar(gp["measured_jct"], gp["sim_jct"],
                        xerr=[gp["measured_jct"] - gp["measured_min"], gp["measured_max"] - gp["measured_jct"]],
                        fmt=plots.policy_marker(p), ms=3.5, lw=0.7, alpha=0.8, color=plots.policy_color(p), zorder=2)
        ax.set_xlim(lo - pad, hi + pad)
        ax.set_ylim(lo - pad, hi + pad)
        ax.xaxis.set_major_locator(MaxNLocator(4, prune="lower"))  # no label in the corner beside the y one
        ax.yaxis.set_major_locator(MaxNLocator(4))
        e = "\n".join(f"{plots.policy_label(p)} {100 * errs.get((wl, load, p), float('nan')):+.0f}%"
                      for p in pols if (wl, load, p) in errs.index)
        ax.set_title(f"{plots.workload_label(wl)}, {load:g} tasks/s", fontsize=9)
        ax.text(0.97, 0.03, "mean JCT error\n" + e, transform=ax.transAxes, ha="right", va="bottom", fontsize=7,
                bbox={"boxstyle": "round", "fc": "white", "ec": "0.8", "alpha": 0.9})
        ax.set_xlabel("measured JCT (s)")
        ax.set_ylabel("simulated JCT (s)")
    for ax in list(axes.flat)[len(keys):]:
        ax.set_visible(False)
    handles = [plt.Line2D([], [], marker=plots.policy_marker(p), ls="", color=plots.policy_color(p),
                          label=plots.policy_label(p)) for p in pols]
    handles.append(plt.Line2D([], [], ls="-", lw=0.7, color="0.4", label="bar: min to max over measured repeats"))
    handles.append(plt.Line2D([], [], ls="--", color="0.4", label="y = x"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 3), frameon=False, fontsize=8)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def fidelity_table(c: Comparison, metrics: Sequence[tuple[str, str]] = _TABLE_METRICS) -> pd.DataFrame:
    """One row per (workload, load, policy): per metric the simulated value, the measured mean
    (min-max over repeats) and the relative error, with the bar verdict where there is a bar."""
    tab = c.table
    rows = []
    for (wl, load, pol), g in tab.groupby(["workload", "load", "policy"], sort=True):
        g = g.set_index("metric")
        row = {"workload": wl, "load": load, "policy": pol}
        for m, label in metrics:
            if m not in g.index:
                continue
            r = g.loc[m]
            row[f"{label}: sim"] = r["sim"]
            row[f"{label}: measured (min-max)"] = (f"{r['measured']:.3g} ({r['measured_min']:.3g}-{r['measured_max']:.3g})"
                                                   if math.isfinite(r["measured"]) else "n/a")
            err = r["rel_err"]
            verdict = "" if pd.isna(r["ok"]) else (" ok" if bool(r["ok"]) else " FAIL")
            row[f"{label}: error"] = ("n/a" if not math.isfinite(err) else f"{100 * err:+.1f}%") + verdict
        rows.append(row)
    out = pd.DataFrame(rows)
    ranks = c.ranks.set_index(["workload", "load"])
    out["rank agrees"] = [("yes" if bool(ranks.loc[(w, l), "agree"]) else "NO") if (w, l) in ranks.index else ""
                          for w, l in zip(out["workload"], out["load"])]
    return out


def summary_line(c: Comparison) -> str:
    """One sentence: how many barred checks and rank checks pass."""
    ok = c.table["ok"].dropna().astype(bool)
    return (f"{int(ok.sum())}/{len(ok)} barred metrics within their bars "
            f"({', '.join(f'{k} {100 * v:.0f}%' for k, v in c.meta.get('bars', {}).items())}); "
            f"rank order agrees at {int(c.ranks['agree'].astype(bool).sum())}/{len(c.ranks)} points")


def path_table(c: Comparison, comparison_dir) -> pd.DataFrame:
    """Where a request's time goes, per (workload, load, policy): the measured parts of
    :data:`topas.fidelity.compare.PATH_PARTS` (ms, mean over requests and repeats, from the
    measured runs' request tables under ``comparison_dir/raw/sglang``), beside the simulated
    queueing (ready -> first admission) and service (first admission -> finish), and the
    measured queueing and service the same way (``queue`` = path in + scheduler queue)."""
    raw = Path(comparison_dir) / "raw" / "sglang"
    rows = []
    for (wl, load, pol), g in c.table.groupby(["workload", "load", "policy"], sort=True):
        parts = [request_path(pd.read_parquet(d / "requests.parquet"))
                 for d in sorted(raw.glob(f"{wl}_{pol}_{load:g}_s*_r*")) if (d / "requests.parquet").is_file()]
        m = pd.DataFrame(parts).mean() if parts else pd.Series(dtype=float)
        g = g.set_index("metric")
        row = {"workload": wl, "load": load, "policy": pol}
        for k in ("path_in", "scheduler_queue", "server_time", "path_out"):
            row[f"measured {k} (ms)"] = 1e3 * float(m.get(k, float("nan")))
        for side, col in (("measured", "measured"), ("sim", "sim")):
            q = float(g.loc["queue_mean", col]) if "queue_mean" in g.index else float("nan")
            e = float(g.loc["e2e_mean", col]) if "e2e_mean" in g.index else float("nan")
            row[f"{side} queueing (ms)"] = 1e3 * q
            row[f"{side} service (ms)"] = 1e3 * (e - q)
        rows.append(row)
    return pd.DataFrame(rows)


def noise_table(c: Comparison) -> pd.DataFrame:
    """Per barred metric: met, missed within the measured noise, missed beyond it, and the
    server against itself (:func:`topas.fidelity.compare.noise_summary`), in percent."""
    ns = noise_summary(c.table)
    out = ns[["metric", "points", "met", "missed_within_noise", "missed_beyond_noise"]].copy()
    out.insert(1, "bar", [f"{100 * b:.0f}%" for b in ns["bar"]])
    out["median |error|"] = [f"{100 * v:.1f}%" for v in ns["median_abs_err"]]
    out["median 90% CI of the measured mean"] = [f"±{100 * v:.0f}%" for v in ns["median_ci90"]]
    out["one measured run vs the others (median)"] = [f"{100 * v:.1f}%" for v in ns["median_self_err"]]
    out["points where it exceeds the bar"] = ns["self_err_over_bar"]
    return out


def contention_table(out_dir: "str | Path", engine_models: Sequence[str] | None = None) -> pd.DataFrame:
    """The contention suite's summary (``summary_<engine model>.csv`` under ``out_dir``, written by
    :func:`topas.fidelity.contention.evaluate`), one row per (case, mode, policy) and engine model:
    requests whose hit/miss agrees with the server, the misses on each side, whether every repeat
    missed exactly where the simulation did (the bursts' bar), admission waves and completion order
    that agree, the server's own agreement between repeats, and the mean/p99 JCT errors."""
    d = Path(out_dir)
    files = sorted(d.glob("summary_*.csv"))
    if engine_models is not None:
        files = [d / f"summary_{m}.csv" for m in engine_models if (d / f"summary_{m}.csv").exists()]
    if not files:
        raise FileNotFoundError(f"no contention summary under {d} (run `make fidelity-contention`)")
    cols = {"hit_agree": "hit/miss agree", "misses_sim": "misses sim", "misses_server": "misses server",
            "same_misses_all": "same misses (all repeats)", "wave_agree": "waves agree",
            "order_agree": "order agrees", "noise_hit_agree": "server vs itself: hit/miss",
            "jct_mean_err": "mean JCT err", "jct_p99_err": "p99 JCT err", "jct_mean_ci90": "mean JCT ci90",
            "ok": "ok"}
    parts = []
    for f in files:
        s = pd.read_csv(f)
        s.insert(0, "engine model", f.stem[len("summary_"):])
        parts.append(s[["engine model", "case", "mode", "policy", "repeats", *[c for c in cols if c in s]]])
    return pd.concat(parts, ignore_index=True).rename(columns=cols)


def _contention_summary(out_dir: "str | Path", tag: str) -> "Path":
    """``summary_<tag>.csv`` under ``out_dir``; missing: an error saying how to write it."""
    f = Path(out_dir) / f"summary_{tag}.csv"
    if not f.exists():
        raise FileNotFoundError(f"no {f} (scripts/fidelity_contention.py --compare-only --tag {tag} --out {f.parent})")
    return f


def contention_arrivals_table(out_dir: "str | Path", tags: Sequence[str]) -> pd.DataFrame:
    """The same measured runs compared with the simulation timed in different ways (``tags``: the
    ``summary_<tag>.csv`` files under ``out_dir``, e.g. one per ``--arrivals``), one row per
    (case, mode, policy): per timing, whether every repeat missed exactly where the simulation did
    and the mean hit/miss agreement; then the server's own hit/miss agreement between repeats."""
    keys = ["case", "mode", "policy"]
    out = None
    for tag in tags:
        s = pd.read_csv(_contention_summary(out_dir, tag))
        part = s[keys + ["same_misses_all", "hit_agree"]].rename(
            columns={"same_misses_all": f"{tag}: exact", "hit_agree": f"{tag}: hit/miss agree"})
        if out is None:
            out = part.merge(s[keys + ["repeats", "noise_hit_agree"]], on=keys)
        else:
            out = out.merge(part, on=keys, how="outer")
    if out is None:
        raise ValueError("no tags given")
    cols = [c for c in out.columns if c not in ("repeats", "noise_hit_agree")] + ["repeats", "noise_hit_agree"]
    return out[cols].rename(columns={"noise_hit_agree": "server vs itself: hit/miss"})


def contention_current_table(root: "str | Path", dirs: Sequence[str], tag: str = "sim-observed") -> pd.DataFrame:
    """The contention suite as it stands: one row per (case, mode, policy), from the first of
    ``dirs`` (folders under ``root``, newest measurements first) whose ``summary_<tag>.csv`` has
    it, so that a case measured again (e.g. after the plugin's policy changed) is read from its
    new runs only. The ``runs`` column names the folder; the other columns are
    :func:`contention_table`'s."""
    keys = ["case", "mode", "policy"]
    parts = []
    seen: set[tuple] = set()
    for name in dirs:
        f = _contention_summary(Path(root) / name, tag)
        t = contention_table(f.parent, [tag]).drop(columns="engine model")
        new = [tuple(r) not in seen for r in t[keys].itertuples(index=False)]
        t = t[new]
        seen.update(tuple(r) for r in t[keys].itertuples(index=False))
        t.insert(0, "runs", name)
        parts.append(t)
    return pd.concat(parts, ignore_index=True).sort_values(keys, kind="stable").reset_index(drop=True)
