"""Compare simulated and measured runs of the same traces (pure logic; no server, no simulator).

A *run* is one :class:`~topas.engine.metrics.SimResult` of one engine (``"sim"`` or
``"sglang"``) on one point ``(workload, load, policy, seed)``; measured points are repeated
(``repeat`` = 0, 1, ...) because wall-clock timings are noisy, simulated ones are deterministic
and run once. :func:`run_metrics` reduces a run to the compared numbers, :func:`compare` puts the
two engines side by side with relative errors and the bars, :func:`rank_agreement` checks that
both engines order the policies alike, :func:`task_pairs` pairs every task's simulated and
measured JCT (the notebook's y = x figure).

Conventions:

* relative error = (sim - measured) / measured, measured = the mean over seeds of the mean over
  repeats; the spread is the min and max over the measured runs (each seed's repeats, then the
  mean over seeds for each repeat index) and their coefficient of variation;
* cached tokens of a simulated run: its requests' ``cached_tokens`` column when present, otherwise
  the agent's prefix length for every request admitted with its prefix resident (the simulator's
  ``prefix_hit``), which is what SGLang's radix cache reports when requests of an agent share
  exactly the agent's prefix tokens;
* rank agreement: for every pair of policies whose *simulated* mean JCTs differ by more than
  ``rank_margin`` (10%), both engines must order the pair alike; closer pairs are ties.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

if TYPE_CHECKING:  # pragma: no cover
    from topas.engine.metrics import SimResult

__all__ = [
    "METRICS",
    "BENCHMARK_BARS",
    "CI_BARS",
    "POINT_KEYS",
    "run_metrics",
    "sim_cached_tokens",
    "compare",
    "rank_agreement",
    "task_pairs",
    "Comparison",
    "build_comparison",
    "write_comparison",
    "read_comparison",
    "verdict_lines",
]

#: The compared metrics: name -> description (all times in seconds).
METRICS: dict[str, str] = {
    "jct_mean": "mean task JCT",
    "jct_p99": "p99 task JCT",
    "queue_mean": "mean per-request queueing (ready -> first admission)",
    "queue_p99": "p99 per-request queueing",
    "e2e_mean": "mean per-request end-to-end latency (ready -> finish)",
    "e2e_p99": "p99 per-request end-to-end latency",
    "cached_tokens": "prefix-cache hits: cached prompt tokens over all requests",
    "retractions": "requests retracted by the engine on decode memory exhaustion",
    "preemptions": "running requests preempted by the policy",
}

#: The issue's benchmark bars (|relative error| at most): reported, not a timed test.
BENCHMARK_BARS: dict[str, float] = {"jct_mean": 0.15, "jct_p99": 0.25, "cached_tokens": 0.10}
#: The CI bars: loose enough that CPU noise does not fail the build.
CI_BARS: dict[str, float] = {"jct_mean": 0.30, "cached_tokens": 0.10}
#: Simulated mean JCTs closer than this (relative) count as a tie in the rank check.
RANK_MARGIN = 0.10

#: The columns that name a point (a run is a point plus engine and repeat).
POINT_KEYS = ("workload", "load", "policy", "seed")
#: Engines of a runs table: the simulator with the profile as measured (``sim``), the simulator
#: with the profile rescaled to the server's speed measured just around each run
#: (``sim-calibrated``, one per measured repeat; see :mod:`topas.fidelity.run`), the server.
ENGINES = ("sim", "sim-calibrated", "sglang")


# ----------------------------------------------------------------------------- one run
def sim_cached_tokens(requests: pd.DataFrame, prefix_tokens: Mapping[str, int] | None) -> float:
    """Cached prompt tokens of a run's request table (see the module docstring)."""
    if "cached_tokens" in requests.columns:
        return float(pd.to_numeric(requests["cached_tokens"], errors="coerce").fillna(0).sum())
    if prefix_tokens is None or "prefix_hit" not in requests.columns or not len(requests):
        return float("nan")
    hit = requests["prefix_hit"].fillna(False).astype(bool)
    lengths = requests["agent"].map(lambda a: prefix_tokens.get(a, 0)).astype(float)
    return float((lengths * hit).sum())


def _p(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def run_metrics(result: "SimResult", prefix_tokens: Mapping[str, int] | None = None) -> dict[str, float]:
    """The compared numbers of one run (keys: :data:`METRICS` plus ``n_tasks``, ``n_requests``,
    ``makespan``). Works on the simulator's and on the replay client's results alike: per-request
    queueing is the ``queue_time`` column when present (else ``first_admit - ready``), end-to-end
    latency is ``finish - ready``."""
    tasks, req = result.tasks, result.requests
    jct = pd.to_numeric(tasks["jct"], errors="coerce").dropna().to_numpy(dtype=float) if len(tasks) else np.array([])
    if len(req) and "queue_time" in req.columns:
        queue = pd.to_numeric(req["queue_time"], errors="coerce")
    elif len(req) and {"first_admit", "ready"} <= set(req.columns):
        queue = pd.to_numeric(req["first_admit"], errors="coerce") - pd.to_numeric(req["ready"], errors="coerce")
    else:
        queue = pd.Series([], dtype=float)
    if len(req) and {"finish", "ready"} <= set(req.columns):
        e2e = pd.to_numeric(req["finish"], errors="coerce") - pd.to_numeric(req["ready"], errors="coerce")
    else:
        e2e = pd.Series([], dtype=float)
    queue = queue.dropna().to_numpy(dtype=float)
    e2e = e2e.dropna().to_numpy(dtype=float)
    def total(col: str) -> float:
        if len(req) and col in req.columns:
            return float(pd.to_numeric(req[col], errors="coerce").fillna(0).sum())
        return float(result.summary.get(col, float("nan")))

    retr, preempt = total("retractions"), total("preemptions")
    if result.summary.get("engine") == "sglang" and math.isfinite(preempt):
        # SGLang counts a request the plugin preempted as retracted (it is re-queued with
        # is_retracted=True): its num_retractions = engine retractions + policy preemptions
        retr = max(retr - preempt, 0.0)
    makespan = float(tasks["finish"].max() - tasks["arrival"].min()) if len(tasks) else float("nan")
    return {
        "jct_mean": float(jct.mean()) if len(jct) else float("nan"),
        "jct_p99": _p(jct, 99),
        "queue_mean": float(queue.mean()) if len(queue) else float("nan"),
        "queue_p99": _p(queue, 99),
        "e2e_mean": float(e2e.mean()) if len(e2e) else float("nan"),
        "e2e_p99": _p(e2e, 99),
        "cached_tokens": sim_cached_tokens(req, prefix_tokens),
        "retractions": retr,
        "preemptions": preempt,
        "n_tasks": float(len(tasks)),
        "n_requests": float(len(req)),
        "makespan": makespan,
    }


# ----------------------------------------------------------------------------- comparison
def rel_error(sim: float, measured: float) -> float:
    """(sim - measured) / measured; 0 when both are 0, NaN when measured is 0 or either is NaN."""
    if not (math.isfinite(sim) and math.isfinite(measured)):
        return float("nan")
    if measured == 0:
        return 0.0 if sim == 0 else float("nan")
    return (sim - measured) / measured


def _check_runs(runs: pd.DataFrame) -> None:
    missing = [c for c in (*POINT_KEYS, "engine", "repeat") if c not in runs.columns]
    if missing:
        raise ValueError(f"runs table lacks column(s) {missing}; it needs {[*POINT_KEYS, 'engine', 'repeat']}")
    bad = sorted(set(runs["engine"]) - set(ENGINES))
    if bad:
        raise ValueError(f"runs table has unknown engine(s) {bad}; expected {ENGINES}")


def compare(runs: pd.DataFrame, bars: Mapping[str, float] | None = None,
            metrics: Sequence[str] | None = None, sim_engine: str = "sim") -> pd.DataFrame:
    """One row per ``(workload, load, policy, metric)``: the simulated value, the measured mean,
    min, max and coefficient of variation over repeats, the relative error, the bar (NaN where
    the metric has none) and whether it is met (``ok``: True, False, or None without a bar).

    ``runs`` has one row per run: the :data:`POINT_KEYS`, ``engine`` (``sim`` | ``sglang``),
    ``repeat`` and the metric columns of :func:`run_metrics`. Points without both engines are
    left out. ``sim_engine`` picks the simulated side (``sim`` or ``sim-calibrated``; the
    latter's repeats are averaged like the measured ones).
    """
    _check_runs(runs)
    bars = dict(BENCHMARK_BARS if bars is None else bars)
    metrics = [m for m in (metrics or METRICS) if m in runs.columns]
    rows = []
    group = ["workload", "load", "policy"]
    for key, g in runs.groupby(group, sort=True, dropna=False):
        sim, meas = g[g["engine"] == sim_engine], g[g["engine"] == "sglang"]
        if not len(sim) or not len(meas):
            continue
        for m in metrics:
            s_val = float(sim.groupby("seed")[m].mean().mean())
            per_seed = meas.groupby("seed")[m].mean()
            m_val = float(per_seed.mean())
            # spread over repeats: the mean over seeds of each repeat index
            per_rep = meas.groupby("repeat")[m].mean().to_numpy(dtype=float)
            per_rep = per_rep[np.isfinite(per_rep)]
            cv = float(per_rep.std(ddof=1) / abs(per_rep.mean())) if len(per_rep) > 1 and per_rep.mean() else float("nan")
            err = rel_error(s_val, m_val)
            bar = bars.get(m, float("nan"))
            ok = None if not math.isfinite(bar) else (bool(abs(err) <= bar) if math.isfinite(err) else False)
            rows.append({
                **dict(zip(group, key)), "metric": m, "sim": s_val, "measured": m_val,
                "measured_min": float(per_rep.min()) if len(per_rep) else float("nan"),
                "measured_max": float(per_rep.max()) if len(per_rep) else float("nan"),
                "measured_cv": cv, "n_measured": int(len(meas)), "rel_err": err, "bar": bar, "ok": ok,
            })
    cols = [*group, "metric", "sim", "measured", "measured_min", "measured_max", "measured_cv",
            "n_measured", "rel_err", "bar", "ok"]
    return pd.DataFrame(rows, columns=cols)


def rank_agreement(runs: pd.DataFrame, metric: str = "jct_mean", margin: float = RANK_MARGIN,
                   sim_engine: str = "sim") -> pd.DataFrame:
    """Per ``(workload, load)``: the policies ordered by ``metric`` (ascending, best first) in
    each engine, how many pairs differ by more than ``margin`` in the simulator, how many of those
    both engines order alike, and ``agree`` (all of them)."""
    _check_runs(runs)
    rows = []
    for (wl, load), g in runs.groupby(["workload", "load"], sort=True):
        sim = g[g["engine"] == sim_engine].groupby(["policy", "seed"])[metric].mean().groupby("policy").mean()
        meas = g[g["engine"] == "sglang"].groupby(["policy", "seed"])[metric].mean().groupby("policy").mean()
        pols = sorted(set(sim.index) & set(meas.index))
        if not pols:
            continue
        checked = agreed = 0
        disagree = []
        for i, a in enumerate(pols):
            for b in pols[i + 1:]:
                sa, sb = float(sim[a]), float(sim[b])
                if abs(sa - sb) <= margin * min(sa, sb):
                    continue
                checked += 1
                if (sa < sb) == (float(meas[a]) < float(meas[b])):
                    agreed += 1
                else:
                    disagree.append(f"{a}/{b}")
        rows.append({
            "workload": wl, "load": load,
            "sim_order": " < ".join(sorted(pols, key=lambda p: (float(sim[p]), p))),
            "measured_order": " < ".join(sorted(pols, key=lambda p: (float(meas[p]), p))),
            "pairs_checked": checked, "pairs_agree": agreed, "disagree": ", ".join(disagree),
            "agree": agreed == checked,
        })
    return pd.DataFrame(rows, columns=["workload", "load", "sim_order", "measured_order", "pairs_checked",
                                       "pairs_agree", "disagree", "agree"])


def task_pairs(sim_tasks: "pd.DataFrame | Sequence[pd.DataFrame]", measured_tasks: Iterable[pd.DataFrame]) -> pd.DataFrame:
    """Every task's simulated JCT (the mean over simulated runs when several are given) beside
    its measured JCT (mean, min and max over repeats), matched by ``task_id``; tasks missing
    from either side are left out."""
    sims = [sim_tasks] if isinstance(sim_tasks, pd.DataFrame) else list(sim_tasks)
    meas = [t[["task_id", "jct"]].assign(repeat=i) for i, t in enumerate(measured_tasks)]
    if not meas or not sims or not sum(len(t) for t in sims):
        return pd.DataFrame(columns=["task_id", "sim_jct", "measured_jct", "measured_min", "measured_max"])
    m = pd.concat(meas).groupby("task_id")["jct"].agg(["mean", "min", "max"])
    m.columns = ["measured_jct", "measured_min", "measured_max"]
    s = pd.concat([t[["task_id", "jct"]] for t in sims]).groupby("task_id")["jct"].mean().rename("sim_jct").to_frame()
    return s.join(m, how="inner").reset_index()


# ----------------------------------------------------------------------------- files
@dataclass
class Comparison:
    """A comparison on disk: every run's metrics, the comparison and rank tables, the per-task
    pairs and the metadata (server, profile, bars, commands)."""

    runs: pd.DataFrame
    table: pd.DataFrame
    ranks: pd.DataFrame
    tasks: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    #: with a calibrated simulation, ``table`` compares it and this the profile as measured
    table_static: pd.DataFrame | None = None

    @property
    def passed(self) -> bool:
        """Every barred metric within its bar and every rank check agreeing."""
        ok = self.table["ok"].dropna()
        return bool(ok.astype(bool).all()) and bool(self.ranks["agree"].astype(bool).all())


def build_comparison(runs: pd.DataFrame, tasks: pd.DataFrame | None = None,
                     bars: Mapping[str, float] | None = None, meta: Mapping[str, Any] | None = None,
                     rank_margin: float = RANK_MARGIN) -> Comparison:
    bars = dict(BENCHMARK_BARS if bars is None else bars)
    primary = "sim-calibrated" if (runs["engine"] == "sim-calibrated").any() else "sim"
    meta = {**(meta or {}), "bars": bars, "rank_margin": rank_margin, "sim_engine": primary}
    tasks = tasks if tasks is not None else pd.DataFrame(
        columns=[*POINT_KEYS, "task_id", "sim_jct", "measured_jct", "measured_min", "measured_max"])
    static = compare(runs, bars, sim_engine="sim") if primary != "sim" else None
    return Comparison(runs, compare(runs, bars, sim_engine=primary),
                      rank_agreement(runs, margin=rank_margin, sim_engine=primary), tasks, meta, static)


def write_comparison(c: Comparison, out_dir: str | Path) -> list[Path]:
    """Write ``runs.csv``, ``comparison.csv``, ``ranks.csv``, ``tasks.csv`` and ``meta.json``
    (plus ``comparison.md``, a readable summary) into ``out_dir``."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    tables = [("runs", c.runs), ("comparison", c.table), ("ranks", c.ranks), ("tasks", c.tasks)]
    if c.table_static is not None:
        tables.append(("comparison_static", c.table_static))
    for name, df in tables:
        p = d / f"{name}.csv"
        df.to_csv(p, index=False, float_format="%.6g")
        paths.append(p)
    p = d / "meta.json"
    p.write_text(json.dumps(c.meta, indent=2, sort_keys=True, default=str) + "\n")
    paths.append(p)
    p = d / "comparison.md"
    p.write_text("\n".join(verdict_lines(c)) + "\n")
    paths.append(p)
    return paths


def read_comparison(out_dir: str | Path) -> Comparison:
    """Read what :func:`write_comparison` wrote; ``FileNotFoundError`` names the missing file."""
    d = Path(out_dir)
    need = [d / f"{n}.csv" for n in ("runs", "comparison", "ranks", "tasks")] + [d / "meta.json"]
    for p in need:
        if not p.is_file():
            raise FileNotFoundError(f"{p}: no comparison here (run `topas fidelity ... --out {d}` first)")
    runs, table, ranks, tasks = (pd.read_csv(p) for p in need[:4])
    fix = lambda t: t.assign(ok=t["ok"].map(lambda v: None if pd.isna(v) else str(v) == "True"))  # noqa: E731
    static = pd.read_csv(d / "comparison_static.csv") if (d / "comparison_static.csv").is_file() else None
    return Comparison(runs, fix(table), ranks, tasks, json.loads(need[4].read_text()),
                      fix(static) if static is not None else None)


def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:+.1f}%"


def verdict_lines(c: Comparison) -> list[str]:
    """A Markdown summary: the barred metrics per point, then the rank checks."""
    lines = [f"Simulated side: `{c.meta.get('sim_engine', 'sim')}`.", "","| workload | load | policy | metric | sim | measured (min-max) | cv | rel. error | bar | ok |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|---|"]
    for r in c.table.itertuples(index=False):
        bar = "" if not math.isfinite(r.bar) else f"{100 * r.bar:.0f}%"
        ok = "" if r.ok is None else ("yes" if r.ok else "**no**")
        cv = "" if not math.isfinite(r.measured_cv) else f"{100 * r.measured_cv:.1f}%"
        lines.append(f"| {r.workload} | {r.load:g} | {r.policy} | {r.metric} | {r.sim:.4g} | "
                     f"{r.measured:.4g} ({r.measured_min:.4g}-{r.measured_max:.4g}) | {cv} | "
                     f"{_pct(r.rel_err)} | {bar} | {ok} |")
    lines += ["", "| workload | load | simulator order | measured order | pairs agreeing | agree |",
              "|---|---:|---|---|---:|---|"]
    for r in c.ranks.itertuples(index=False):
        lines.append(f"| {r.workload} | {r.load:g} | {r.sim_order} | {r.measured_order} | "
                     f"{r.pairs_agree}/{r.pairs_checked} | {'yes' if r.agree else '**no**: ' + str(r.disagree)} |")
    if c.table_static is not None:
        s = c.table_static[c.table_static["metric"].isin(list(c.meta.get("bars", {})))]
        lines += ["", "With the profile as measured (no speed calibration):", "",
                  "| workload | load | policy | metric | sim | measured | rel. error |", "|---|---:|---|---|---:|---:|---:|"]
        lines += [f"| {r.workload} | {r.load:g} | {r.policy} | {r.metric} | {r.sim:.4g} | {r.measured:.4g} | {_pct(r.rel_err)} |"
                  for r in s.itertuples(index=False)]
    return lines
