"""Trace the collapses of our policies that are not monotone in load (docs/protocol.md, "A
collapse that is not monotone in load").

1. ``collapses.csv``: every run of ``topas`` or ``topas-plus`` in the cached evidence
   (``data/results/protocol/evidence.csv``) that grows at a load while the same (workload, policy)
   is stable at a higher grid load, on its seed or on every seed
   (``studies.protocol_runs.collapse.find_collapses``), re-simulated with its stable neighbour (the same
   seed at the lowest higher load where it does not grow), one line each of the lock measures
   (``run_profile``: the longest spell without a prefix eviction, what is resident, batched and
   waiting inside it and outside).
2. ``collapse_trace.csv``: the TOPAS+ DAG-4 seed-2 1.125x run and two stable neighbours (seed 2 at
   1.25x, seed 0 at 1.125x) in windows of ``--window`` seconds (``window_series``), and
   ``figures/collapse_trace.png``/``.pdf``.
3. ``collapse_counterfactuals.csv``: that run again with one thing changed (a documented TOPAS+
   parameter, or the KV pool).
4. ``collapse_lock_frequency.csv``: how often the lock forms and how often a run grows, DAG-4,
   TOPAS+ and the counterfactuals, per load, on tuning seeds (diagnostics that could guide a fix
   are never run on evaluation seeds).

    python scripts/trace_collapse.py                  # everything (~5 min on 2 cores)
    python scripts/trace_collapse.py --no-frequency   # steps 1-3 only (~1 min)
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from topas.experiments import Experiment, run_experiment
from studies.protocol_runs import collapse as C
from topas.experiments.dispatch import map_experiments
from topas.experiments.protocol.seeds import TUNING_SEEDS, first
from topas.experiments.protocol.steady import ALPHA, INDICATORS
from studies.protocol_runs.study import FULL, TEST_VERSION
from topas.paths import REPO_ROOT

CASE = dict(workload="dag-4", policy="topas-plus", load=1.125, seed=2, n_tasks=1000)
NEIGHBOURS = (("collapse", 1.125, 2), ("same seed, 1.25x", 1.25, 2), ("seed 0, 1.125x", 1.125, 0))
#: (label, TOPAS+ params, tokens added to the profile's KV pool) of the counterfactuals
VARIANTS = (("default", {}, 0), ("starve_s=300", {"starve_s": 300}, 0), ("kv_budget+3072", {}, 3072))
FREQ_LOADS = (1.0, 1.125, 1.25, 1.375, 1.5)
#: the final runs' per-run level: alpha over the seeds x indicators (as ``steady_state`` divides it)
RUN_LEVEL = ALPHA / (FULL.n_seeds * len(INDICATORS))
PROFILE_COLS = ["jct_mean", "lock", "spell_start", "spell_s", "spell_all_resident", "all_resident_start",
                "all_resident_s", "resident_in", "resident_out", "decode_batch_in", "decode_batch_out", "kv_use_in",
                "prefix_share_in", "prefix_share_out", "hot_wait_share_in", "hot_wait_share_out", "finish_rate_in",
                "arrival_rate_in", "wait_agent_in", "wait_agent_share_in", "in_system_first_half",
                "in_system_second_half"]


def _round(df: pd.DataFrame) -> pd.DataFrame:
    """Seconds and JCTs to 1 decimal, p-values as they are, everything else to 3 decimals (what
    the docs quote)."""
    out = df.copy()
    for c in out.columns:
        if out[c].dtype.kind == "f" and not c.endswith("p_value"):  # p-values: 3 significant digits (_p)
            sec = (c.endswith(("_s", "_start", "jct_low", "jct_high")) or "jct_mean" in c
                   or c in ("t0", "t1", "queue_time", "oldest_wait"))
            out[c] = out[c].round(1 if sec else 3)
    return out


def _p(x: float) -> float:
    return float(f"{x:.3g}")


def collapses(evidence: pd.DataFrame, jobs: int) -> pd.DataFrame:
    found = C.find_collapses(evidence)
    exps, nbs = [], []
    for r in found.itertuples(index=False):
        above = r.seed_stable_above or r.all_stable_above  # the same seed's first stable load, else every seed's
        nb = float(above.split(";")[0])
        exps.append(Experiment(r.workload, r.policy, {}, load=r.load, seed=r.seed, n_tasks=r.n_tasks))
        nbs.append(Experiment(r.workload, r.policy, {}, load=nb, seed=r.seed, n_tasks=r.n_tasks))
    prof = map_experiments(C.profile_experiment, exps + nbs, jobs=jobs, desc="collapses and neighbours")
    own, theirs = prof[:len(exps)], prof[len(exps):]
    rows = []
    for r, p, q, nb in zip(found.to_dict("records"), own, theirs, nbs):
        if not math.isclose(p["jct_mean"], r["jct_mean"], rel_tol=1e-9):
            raise SystemExit(f"{r['key']}: re-simulated mean JCT {p['jct_mean']} differs from the evidence's "
                             f"{r['jct_mean']}: the code changed since the final runs")
        row = {k: r[k] for k in ("workload", "policy", "n_tasks", "load", "seed", "jct_mean", "others_jct_low",
                                 "others_jct_high", "level")}
        row["jct_p_value"], row["in_system_p_value"] = _p(r["jct_p_value"]), _p(r["in_system_p_value"])
        row["seed_stable_above"], row["all_stable_above"] = r["seed_stable_above"], r["all_stable_above"]
        row.update({k: p[k] for k in PROFILE_COLS if k != "jct_mean"})
        row["neighbour_load"] = nb.load
        row.update({f"neighbour_{k}": q[k] for k in ("jct_mean", "lock", "spell_s", "spell_all_resident",
                                                      "decode_batch_in", "decode_batch_out")})
        row["mechanism"] = ("lock: every prefix resident, no eviction, small batches" if p["lock"]
                            else "no lock")
        rows.append(row)
    return _round(pd.DataFrame(rows))


def trace(window: float) -> tuple[pd.DataFrame, dict[str, tuple[float, float]]]:
    frames, spells = [], {}
    for label, load, seed in NEIGHBOURS:
        exp = Experiment(CASE["workload"], CASE["policy"], {}, load=load, seed=seed, n_tasks=CASE["n_tasks"])
        res = run_experiment(exp)
        ws = C.window_series(res, C.budget_of(exp), width=window)
        ws.insert(0, "run", label)
        ws.insert(1, "load", load)
        ws.insert(2, "seed", seed)
        frames.append(ws)
        p = C.run_profile(res, C.budget_of(exp))
        spells[label] = (p["spell_start"], p["spell_start"] + p["spell_s"]) if C.is_lock(p) else None
        print(f"  traced {label}: mean JCT {p['jct_mean']:.1f} s", file=sys.stderr)
    return _round(pd.concat(frames, ignore_index=True)), spells


def _variant_exp(params: dict, extra_kv: int, load: float, seed: int) -> Experiment:
    exp = Experiment(CASE["workload"], CASE["policy"], params, load=load, seed=seed, n_tasks=CASE["n_tasks"])
    return exp if not extra_kv else Experiment(CASE["workload"], CASE["policy"], params, load=load, seed=seed,
                                               n_tasks=CASE["n_tasks"], kv_budget=C.budget_of(exp) + extra_kv)


def counterfactuals(jobs: int) -> pd.DataFrame:
    exps = [_variant_exp(p, kv, CASE["load"], CASE["seed"]) for _, p, kv in VARIANTS]
    prof = map_experiments(C.profile_experiment, exps, jobs=jobs, desc="counterfactuals")
    rows = [{"variant": label, "load": CASE["load"], "seed": CASE["seed"], **{k: p[k] for k in PROFILE_COLS},
             "grows": bool(min(p["jct_p_value"], p["in_system_p_value"]) < RUN_LEVEL)}
            for (label, _, _), p in zip(VARIANTS, prof)]
    return _round(pd.DataFrame(rows))


def lock_frequency(n_seeds: int, jobs: int) -> pd.DataFrame:
    seeds = first(TUNING_SEEDS, n_seeds, "tuning seeds")
    specs = [(label, load, s, _variant_exp(p, kv, load, s)) for label, p, kv in VARIANTS for load in FREQ_LOADS
             for s in seeds]
    prof = map_experiments(C.profile_experiment, [e for *_, e in specs], jobs=jobs, desc="lock frequency")
    df = pd.DataFrame([{"variant": v, "load": load, "seed": s, **p} for (v, load, s, _), p in zip(specs, prof)])
    df["grows"] = np.minimum(df["jct_p_value"], df["in_system_p_value"]) < RUN_LEVEL
    out = df.groupby(["variant", "load"], sort=False).agg(
        runs=("seed", "size"), locked=("lock", "sum"), grows=("grows", "sum"),
        grows_with_lock=("grows", lambda g: int((g & df.loc[g.index, "lock"]).sum())),
        jct_mean_median=("jct_mean", "median"), jct_mean_max=("jct_mean", "max"),
        longest_spell_median=("spell_s", "median")).reset_index()
    out.insert(2, "seeds", f"{seeds[0]}-{seeds[-1]}")
    return _round(out)


def figure(tr: pd.DataFrame, spells: dict, out_dir: Path | None) -> list[Path]:
    import matplotlib.pyplot as plt

    from topas import plots

    plots.use_style()
    panels = (("in_system", "tasks in system"), ("resident", "prefixes resident\n(of 4)"),
              ("decode_batch", "decode batch"), ("hot_wait_share", "waiting with its\nprefix resident"))
    colors = {"collapse": "black", "same seed, 1.25x": plots.AGENT_COLORS[0], "seed 0, 1.125x": plots.AGENT_COLORS[1]}
    fig, axes = plt.subplots(len(panels), 1, figsize=(7.5, 7.2), sharex=True)
    for ax, (col, ylabel) in zip(axes, panels):
        for label, g in list(tr.groupby("run", sort=False))[::-1]:  # the collapse drawn last, on top
            mid = (g["t0"] + g["t1"]) / 2
            ax.plot(mid, g[col], color=colors[label], lw=1.4 if label == "collapse" else 0.9,
                    alpha=1.0 if label == "collapse" else 0.8, label=f"{label}")
        span = spells.get("collapse")
        if span:
            ax.axvspan(span[0], span[1], color="0.85", zorder=0, lw=0)
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
    axes[-1].set_ylim(0, 1.05)
    axes[1].set_ylim(0, 4.3)
    axes[-1].set_xlabel("time (s)")
    handles, labels = axes[0].get_legend_handles_labels()
    axes[0].legend(handles[::-1], labels[::-1], loc="upper left", fontsize=8, frameon=True)
    span = spells.get("collapse")
    if span:
        axes[0].text(span[0] + 60, axes[0].get_ylim()[1] * 0.97, "lock: no prefix evicted", va="top", fontsize=8,
                     color="0.3")
    w = float((tr["t1"] - tr["t0"]).iloc[0])
    axes[0].set_title("TOPAS+ on DAG-4, 1,000 tasks: the seed-2 run at 1.125x against stable neighbours", fontsize=10)
    plots.add_caption(fig, f"Windows of {w:g} s; shaded: the collapsing run's spell with no prefix evicted. "
                           "data/results/protocol/collapse_trace.csv")
    fig.tight_layout()
    return plots.save_figure(fig, "collapse_trace", out_dir)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--evidence", type=Path, default=REPO_ROOT / "data/results/protocol/evidence.csv")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "data/results/protocol")
    ap.add_argument("--figures", type=Path, default=REPO_ROOT / "figures", help="figure folder (default: figures/)")
    ap.add_argument("--window", type=float, default=60.0, help="window length of the trace (s)")
    ap.add_argument("--seeds", type=int, default=20, help="tuning seeds of the lock-frequency study")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--no-frequency", action="store_true", help="skip the lock-frequency study")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    ev = pd.read_csv(args.evidence)
    ev = ev[ev["test"] == TEST_VERSION]  # rows of another test version are stale
    table = collapses(ev, args.jobs)
    table.to_csv(args.out / "collapses.csv", index=False)
    print(table[["workload", "policy", "load", "seed", "jct_mean", "lock", "spell_s", "mechanism"]].to_string())
    tr, spells = trace(args.window)
    tr.to_csv(args.out / "collapse_trace.csv", index=False)
    for p in figure(tr, spells, args.figures):
        print(f"wrote {p}")
    cf = counterfactuals(args.jobs)
    cf.to_csv(args.out / "collapse_counterfactuals.csv", index=False)
    print(cf.to_string())
    if not args.no_frequency:
        fq = lock_frequency(args.seeds, args.jobs)
        fq.to_csv(args.out / "collapse_lock_frequency.csv", index=False)
        print(fq.to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
