"""The synthetic-workload results table of the reproduction (``make reproduce`` writes it).

Every synthetic workload under every registered policy: per workload and policy the mean and p99
task JCT, each the mean over seeds with the spread across seeds (min-max); for ``topas`` (and its
ablations, and ``topas-plus``) the change against the best *baseline* per metric (fcfs, lpm, spf,
parrot-fcfs, autellix-las, chosen by the mean over seeds), and beside TOPAS the paper's reported
reduction (``data/paper/reported.csv``, labelled "paper (reported)": measured by the paper's
authors, never used to choose anything here). :func:`emit` writes ``<table>.csv`` (numbers
unrounded, with the run settings, so ``--figures-only`` re-renders from it alone) and
``<table>.md``, each atomically (a temporary file, then a rename).
"""

from __future__ import annotations

import csv
import math
import os
import tempfile
from pathlib import Path

from topas.paths import REPO_ROOT as REPO
from topas.sets import PAPER_BASELINES, SYNTHETIC

AFTERNOON_TABLE = "results_gpu_afternoon"
METRICS = (("mean", "jct_mean"), ("p99", "jct_p99"))  # (table name, summary key)
TABLE = "results_synthetic"
PAPER_LABEL = "paper (reported)"

COLUMNS = [
    "workload", "policy", "kind", "engine", "profile", "load", "tasks", "seeds",
    "jct_mean", "jct_mean_min", "jct_mean_max", "jct_p99", "jct_p99_min", "jct_p99_max",
    "throughput_rps", "avg_decode_batch", "decision_wall_mean_ms",
    "best_baseline_mean", "mean_vs_best_pct", "best_baseline_p99", "p99_vs_best_pct",
    "paper_mean_vs_best_pct", "paper_p99_vs_best_pct",
]
#: Columns a table may lack (older tables): ``server`` names the SGLang server of measured rows.
OPTIONAL_COLUMNS = ["server"]


#: policies of our own design (not the paper's, not a baseline, not an ablation): issue 13's topas-plus
OURS = ("topas-plus",)


def kind_of(policy: str) -> str:
    if policy in PAPER_BASELINES:
        return "baseline"
    if policy == "topas":
        return "topas"
    if policy in OURS:
        return "ours"
    if policy.startswith("topas-"):
        return "ablation"
    return "other"


# ----------------------------------------------------------------------------- files


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        from topas.paths import usual_mode

        usual_mode(tmp)  # mkstemp made it 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def csv_text(rows: list[dict], columns: list[str]) -> str:
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in columns})
    return buf.getvalue()


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def paper_reported(path: Path | None = None) -> dict[tuple[str, str], float]:
    """``(workload, "mean"|"p99") -> reported % change of TOPAS vs the best baseline``."""
    path = path or REPO / "data" / "paper" / "reported.csv"
    out: dict[tuple[str, str], float] = {}
    for r in read_csv(path):
        if r["comparison"] == "vs_best_baseline" and r["metric"] in ("mean_jct", "p99_jct"):
            out[(r["workload"], r["metric"].split("_")[0])] = float(r["value_pct"])
    return out


# ----------------------------------------------------------------------------- the table


def aggregate(runs: list[dict], settings: dict) -> list[dict]:
    """One row per (workload, policy) from the per-run rows: mean and min-max over seeds."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        groups.setdefault((r["workload"], r["policy"]), []).append(r)
    rows = []
    for (w, p), rs in groups.items():
        row = {"workload": w, "policy": p, "kind": kind_of(p), **settings}
        if row.get("tasks") is None:  # a grid with its own task count per workload
            row["tasks"] = max(int(r["n_tasks"]) for r in rs)
        for key in ("jct_mean", "jct_p99", "throughput_rps", "avg_decode_batch", "decision_wall_mean_ms"):
            vals = [float(r[key]) for r in rs]
            row[key] = sum(vals) / len(vals)
            if key in ("jct_mean", "jct_p99"):
                row[f"{key}_min"], row[f"{key}_max"] = min(vals), max(vals)
        rows.append(row)
    return rows


def add_comparisons(rows: list[dict], paper: dict[tuple[str, str], float]) -> list[dict]:
    """Fill the best-baseline columns (per workload and metric) and the paper's numbers."""
    for row in rows:
        for name, key in METRICS:
            row[key] = float(row[key])
            row[f"best_baseline_{name}"] = None
            row[f"{name}_vs_best_pct"] = None
        row["paper_mean_vs_best_pct"] = row["paper_p99_vs_best_pct"] = None
    by_workload: dict[str, list[dict]] = {}
    for row in rows:
        by_workload.setdefault(row["workload"], []).append(row)
    for w, rs in by_workload.items():
        base = [r for r in rs if r["kind"] == "baseline"]
        for name, key in METRICS:
            if not base:
                continue
            best = min(base, key=lambda r: (r[key], r["policy"]))
            for r in rs:
                if r["kind"] in ("topas", "ours", "ablation", "other"):
                    r[f"best_baseline_{name}"] = best["policy"]
                    r[f"{name}_vs_best_pct"] = 100.0 * (r[key] - best[key]) / best[key] if best[key] else None
                if r["kind"] == "topas":
                    r[f"paper_{name}_vs_best_pct"] = paper.get((w, name))
    return rows


def sort_rows(rows: list[dict], policies: list[str]) -> list[dict]:
    worder = {w: i for i, w in enumerate(SYNTHETIC)}
    korder = {"baseline": 0, "topas": 1, "ours": 2, "ablation": 3, "other": 4}
    porder = {p: i for i, p in enumerate(policies)}
    return sorted(rows, key=lambda r: (worder.get(r["workload"], len(worder)), r["workload"],
                                       korder[r["kind"]], porder.get(r["policy"], len(porder)), r["policy"]))


def _num(v) -> float | None:
    if v is None or v == "":
        return None
    f = float(v)
    return None if math.isnan(f) else f


def _pct(v) -> str:
    f = _num(v)
    return "" if f is None else f"{f:+.1f}%"


def render_markdown(rows: list[dict]) -> str:
    """The Markdown table (with a caption stating the settings and how to read it)."""
    if not rows:
        return "(no results)\n"
    s = rows[0]
    seeds = int(float(s["seeds"]))
    tasks = {r["workload"]: int(float(r["tasks"])) for r in rows}
    first = (f"first {next(iter(tasks.values()))} tasks of each trace" if len(set(tasks.values())) == 1 else
             "first " + ", ".join(f"{n} tasks of {w}" for w, n in tasks.items()))
    where = (f"Workloads measured on SGLang ({s['server']}), replayed at the traces' arrival times"
             if s.get("server") else
             f"Synthetic workloads on the simulator (engine `{s['engine']}`, profile `{s['profile']}`)")
    lines = [
        f"{where}, "
        f"{first}, Poisson arrivals at {float(s['load']):g}x "
        f"each trace's nominal rate, {seeds} arrival seed{'s' if seeds != 1 else ''}. JCT in seconds: "
        "mean over seeds, (min-max) across seeds. \"vs best baseline\" = (policy - best baseline) / "
        "best baseline, the best baseline chosen separately per metric among "
        f"{', '.join(PAPER_BASELINES)}; ablations are never a baseline. "
        f"\"{PAPER_LABEL}\" is the paper's own number (SGLang on an A100, its operating point), "
        "from data/paper/reported.csv, shown for comparison only.",
        "",
        "| workload | policy | mean JCT (s) | p99 JCT (s) | mean vs best baseline | "
        f"p99 vs best baseline | {PAPER_LABEL}: mean | {PAPER_LABEL}: p99 |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        policy = f"**{r['policy']}**" if r["kind"] == "topas" else r["policy"]
        if r["kind"] == "ablation":
            policy += " (ablation)"
        elif r["kind"] == "ours":
            policy += " (ours, not the paper's)"
        elif r["kind"] == "other":
            policy += " (not a baseline)"

        def jct(key: str) -> str:
            return (f"{float(r[key]):.1f} ({float(r[key + '_min']):.1f}-{float(r[key + '_max']):.1f})"
                    if seeds > 1 else f"{float(r[key]):.1f}")

        def vs(name: str) -> str:
            p = _pct(r.get(f"{name}_vs_best_pct"))
            return f"{p} vs {r[f'best_baseline_{name}']}" if p else ""

        lines.append(
            f"| {r['workload']} | {policy} | {jct('jct_mean')} | {jct('jct_p99')} | {vs('mean')} | "
            f"{vs('p99')} | {_pct(r.get('paper_mean_vs_best_pct'))} | {_pct(r.get('paper_p99_vs_best_pct'))} |"
        )
    return "\n".join(lines) + "\n"


def render_text(rows: list[dict]) -> str:
    """A plain-text table for the terminal."""
    header = ("workload", "policy", "mean JCT", "(min-max)", "p99 JCT", "(min-max)",
              "mean vs best", "p99 vs best", "paper mean", "paper p99")
    out = []
    for r in rows:
        tag = {"ablation": " (abl.)", "ours": " (ours)", "other": " (other)"}.get(r["kind"], "")

        def vs(name: str) -> str:
            p = _pct(r.get(f"{name}_vs_best_pct"))
            return f"{p} ({r[f'best_baseline_{name}']})" if p else ""

        def spread(key: str) -> str:  # nothing to show for one seed
            if int(float(r["seeds"])) < 2:
                return "-"
            return f"{float(r[key + '_min']):.1f}-{float(r[key + '_max']):.1f}"

        out.append((r["workload"], r["policy"] + tag,
                    f"{float(r['jct_mean']):.1f}", spread("jct_mean"),
                    f"{float(r['jct_p99']):.1f}", spread("jct_p99"),
                    vs("mean"), vs("p99"),
                    _pct(r.get("paper_mean_vs_best_pct")), _pct(r.get("paper_p99_vs_best_pct"))))
    widths = [max(len(x[k]) for x in [header, *out]) for k in range(len(header))]

    def fmt(x) -> str:
        return "  ".join(c.ljust(w) if k < 2 else c.rjust(w) for k, (c, w) in enumerate(zip(x, widths)))

    lines = [fmt(header), fmt(tuple("-" * w for w in widths))]
    prev = None
    for x in out:
        if prev is not None and x[0] != prev:
            lines.append("")
        prev = x[0]
        lines.append(fmt(x))
    lines.append("JCT in seconds, mean over seeds (min-max across seeds). 'vs best' = (policy - best "
                 "baseline) / best baseline, per metric; negative = faster than every baseline.")
    lines.append(f"'paper mean' / 'paper p99' = {PAPER_LABEL}: the paper's own reduction vs its best "
                 "baseline (data/paper/reported.csv), not measured here.")
    return "\n".join(lines)


def emit(rows: list[dict], out_dir: Path, table: str = TABLE) -> None:
    csv_path, md_path = out_dir / f"{table}.csv", out_dir / f"{table}.md"
    write_atomic(csv_path, csv_text(rows, COLUMNS + OPTIONAL_COLUMNS))
    write_atomic(md_path, render_markdown(rows))
    print(render_text(rows))
    print(f"\nwrote {csv_path} and {md_path}")
