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
  ``rank_margin`` (10%), both engines must order the pair alike; closer pairs are ties;
* the server against itself (how precisely the measured side is known): ``measured_ci90`` is the
  half-width of the 90% confidence interval of the measured mean (Student's t over the repeats),
  relative to the mean; ``self_err`` is the median, over repeats, of one measured run's relative
  distance from the mean of the other runs of the same point; ``within_noise`` says whether the
  simulated value lies inside that confidence interval (|rel. error| <= ``measured_ci90``). A
  point that misses its bar but is within noise cannot be told apart from a hit with this many
  repeats; one that misses beyond noise is a modelling error (or drift the repeats did not see).
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
    "ci90_half_width",
    "self_error",
    "noise_summary",
    "rank_agreement",
    "task_pairs",
    "request_path",
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


#: Student's t quantile t_{0.95, dof} (two-sided 90% interval) for 1..30 degrees of freedom.
_T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761,
        1.753, 1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701,
        1.699, 1.697)


def ci90_half_width(values: Sequence[float]) -> float:
    """Half-width of the 90% confidence interval of the mean of ``values``, relative to the mean
    (Student's t; NaN with fewer than two finite values or a zero mean)."""
    v = np.asarray([x for x in values if math.isfinite(x)], dtype=float)
    if len(v) < 2 or v.mean() == 0:
        return float("nan")
    t = _T95[len(v) - 2] if len(v) - 1 <= len(_T95) else 1.645
    return float(t * v.std(ddof=1) / math.sqrt(len(v)) / abs(v.mean()))


def self_error(values: Sequence[float]) -> float:
    """The median over runs of |run / mean(the other runs) - 1|: how far one measured run lies
    from the others (NaN with fewer than two finite values)."""
    v = np.asarray([x for x in values if math.isfinite(x)], dtype=float)
    if len(v) < 2:
        return float("nan")
    errs = [abs(rel_error(v[i], float(np.delete(v, i).mean()))) for i in range(len(v))]
    errs = [e for e in errs if math.isfinite(e)]
    return float(np.median(errs)) if errs else float("nan")


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
    the metric has none) and whether it is met (``ok``: True, False, or None without a bar), and
    how precisely the measured mean is known: ``measured_ci90``, ``self_err`` and ``within_noise``
    (see the module docstring; ``within_noise`` is None without a bar).

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
            ci = ci90_half_width(per_rep)
            noise = None if not math.isfinite(bar) else bool(math.isfinite(err) and math.isfinite(ci) and abs(err) <= ci)
            rows.append({
                **dict(zip(group, key)), "metric": m, "sim": s_val, "measured": m_val,
                "measured_min": float(per_rep.min()) if len(per_rep) else float("nan"),
                "measured_max": float(per_rep.max()) if len(per_rep) else float("nan"),
                "measured_cv": cv, "n_measured": int(len(meas)), "rel_err": err, "bar": bar, "ok": ok,
                "measured_ci90": ci, "self_err": self_error(per_rep), "within_noise": noise,
            })
    cols = [*group, "metric", "sim", "measured", "measured_min", "measured_max", "measured_cv",
            "n_measured", "rel_err", "bar", "ok", "measured_ci90", "self_err", "within_noise"]
    return pd.DataFrame(rows, columns=cols)


def rank_agreement(runs: pd.DataFrame, metric: str = "jct_mean", margin: float = RANK_MARGIN,
                   sim_engine: str = "sim") -> pd.DataFrame:
    """Per ``(workload, load)``: the policies ordered by ``metric`` (ascending, best first) in
    each engine, how many pairs differ by more than ``margin`` in the simulator, how many of those
    both engines order alike, and ``agree`` (all of them). ``disagree_within_noise``: how many of
    the disagreeing pairs the measurement cannot order either (their measured means differ by
    less than the larger 90% confidence half-width of the two, see :func:`ci90_half_width`)."""
    _check_runs(runs)
    rows = []
    for (wl, load), g in runs.groupby(["workload", "load"], sort=True):
        sim = g[g["engine"] == sim_engine].groupby(["policy", "seed"])[metric].mean().groupby("policy").mean()
        meas = g[g["engine"] == "sglang"].groupby(["policy", "seed"])[metric].mean().groupby("policy").mean()
        ci = {p: ci90_half_width(gp.groupby("repeat")[metric].mean().to_numpy(dtype=float))
              for p, gp in g[g["engine"] == "sglang"].groupby("policy")}
        pols = sorted(set(sim.index) & set(meas.index))
        if not pols:
            continue
        checked = agreed = noisy = 0
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
                    ma, mb = float(meas[a]), float(meas[b])
                    half = max(ci.get(a, float("nan")) * ma, ci.get(b, float("nan")) * mb)
                    noisy += int(math.isfinite(half) and abs(ma - mb) < half)
        rows.append({
            "workload": wl, "load": load,
            "sim_order": " < ".join(sorted(pols, key=lambda p: (float(sim[p]), p))),
            "measured_order": " < ".join(sorted(pols, key=lambda p: (float(meas[p]), p))),
            "pairs_checked": checked, "pairs_agree": agreed, "disagree": ", ".join(disagree),
            "agree": agreed == checked, "disagree_within_noise": noisy,
        })
    return pd.DataFrame(rows, columns=["workload", "load", "sim_order", "measured_order", "pairs_checked",
                                       "pairs_agree", "disagree", "agree", "disagree_within_noise"])


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


#: :func:`request_path`'s columns: where a measured request's time goes.
PATH_PARTS = {
    "path_in": "client sends -> server's tokenizer manager receives (HTTP)",
    "scheduler_queue": "received -> first admitted by the scheduler (hand-off and queueing)",
    "server_time": "first admitted -> the tokenizer manager sees it finish (prefill, decode, detokenize)",
    "path_out": "the tokenizer manager sees it finish -> the client has the reply (HTTP)",
}


def request_path(requests: pd.DataFrame) -> dict[str, float]:
    """Mean seconds per request of each part of :data:`PATH_PARTS`, from a replayed run's request
    table (its ``ready``, ``first_admit``, ``finish`` and the server's ``server_received`` /
    ``server_finished``; NaN where a column is missing, e.g. without ``--enable-metrics``)."""
    def col(c: str) -> pd.Series:
        return pd.to_numeric(requests[c], errors="coerce") if c in requests.columns else pd.Series(np.nan, index=requests.index)

    parts = {
        "path_in": col("server_received") - col("ready"),
        "scheduler_queue": col("first_admit") - col("server_received"),
        "server_time": col("server_finished") - col("first_admit"),
        "path_out": col("finish") - col("server_finished"),
    }
    return {k: float(v.mean()) if v.notna().any() else float("nan") for k, v in parts.items()}


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
    def fix(t: pd.DataFrame) -> pd.DataFrame:
        flags = [c for c in ("ok", "within_noise") if c in t.columns]
        return t.assign(**{c: t[c].map(lambda v: None if pd.isna(v) else str(v) == "True") for c in flags})

    static = pd.read_csv(d / "comparison_static.csv") if (d / "comparison_static.csv").is_file() else None
    return Comparison(runs, fix(table), ranks, tasks, json.loads(need[4].read_text()),
                      fix(static) if static is not None else None)


def noise_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per barred metric: the points, how many meet the bar, how many miss it within the measured
    noise (inside the 90% interval of the measured mean) and beyond it, the median 90%
    half-width, and the server against itself: the median ``self_err`` and at how many points it
    exceeds the bar (one measured run is further than the bar from the others)."""
    rows = []
    t = table[table["ok"].notna()]
    for m, g in t.groupby("metric", sort=False):
        ok = g["ok"].astype(bool)
        noise = g["within_noise"].map(lambda v: bool(v) if v is not None and not pd.isna(v) else False) \
            if "within_noise" in g.columns else pd.Series(False, index=g.index)
        bar = float(g["bar"].iloc[0])
        self_err = g["self_err"] if "self_err" in g.columns else pd.Series(dtype=float)
        rows.append({"metric": m, "bar": bar, "points": int(len(g)), "met": int(ok.sum()),
                     "missed_within_noise": int((~ok & noise).sum()), "missed_beyond_noise": int((~ok & ~noise).sum()),
                     "median_ci90": float(g["measured_ci90"].median()) if "measured_ci90" in g.columns else float("nan"),
                     "median_abs_err": float(g["rel_err"].abs().median()),
                     "median_self_err": float(self_err.median()) if len(self_err) else float("nan"),
                     "self_err_over_bar": int((self_err > bar).sum()) if len(self_err) else 0})
    return pd.DataFrame(rows, columns=["metric", "bar", "points", "met", "missed_within_noise", "missed_beyond_noise",
                                       "median_ci90", "median_abs_err", "median_self_err", "self_err_over_bar"])


def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:+.1f}%"


def verdict_lines(c: Comparison) -> list[str]:
    """A Markdown summary: the barred metrics per point, then the rank checks."""
    lines = [f"Simulated side: `{c.meta.get('sim_engine', 'sim')}`.", ""]
    ns = noise_summary(c.table) if "within_noise" in c.table.columns else None
    if ns is not None and len(ns):
        lines += ["| metric | bar | met | missed within noise | missed beyond noise | median abs. error | "
                  "median 90% CI of the measured mean | one measured run vs the others: median, points over the bar |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r.metric} | {100 * r.bar:.0f}% | {r.met}/{r.points} | {r.missed_within_noise} | "
                  f"{r.missed_beyond_noise} | {100 * r.median_abs_err:.1f}% | ±{100 * r.median_ci90:.0f}% | "
                  f"{100 * r.median_self_err:.1f}%, {r.self_err_over_bar}/{r.points} |" for r in ns.itertuples(index=False)]
        lines.append("")
    lines += ["| workload | load | policy | metric | sim | measured (min-max) | cv | 90% CI | rel. error | bar | ok |",
              "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in c.table.itertuples(index=False):
        bar = "" if not math.isfinite(r.bar) else f"{100 * r.bar:.0f}%"
        noise = getattr(r, "within_noise", None)
        ok = "" if r.ok is None else ("yes" if r.ok else ("**no**" + (" (within noise)" if noise else "")))
        cv = "" if not math.isfinite(r.measured_cv) else f"{100 * r.measured_cv:.1f}%"
        ci = getattr(r, "measured_ci90", float("nan"))
        ci = "" if not math.isfinite(ci) else f"±{100 * ci:.0f}%"
        lines.append(f"| {r.workload} | {r.load:g} | {r.policy} | {r.metric} | {r.sim:.4g} | "
                     f"{r.measured:.4g} ({r.measured_min:.4g}-{r.measured_max:.4g}) | {cv} | {ci} | "
                     f"{_pct(r.rel_err)} | {bar} | {ok} |")
    lines += ["", "| workload | load | simulator order | measured order | pairs agreeing | agree |",
              "|---|---:|---|---|---:|---|"]
    for r in c.ranks.itertuples(index=False):
        noisy = getattr(r, "disagree_within_noise", 0)
        noisy = f" ({int(noisy)} within the measured noise)" if isinstance(noisy, (int, float)) and noisy > 0 else ""
        lines.append(f"| {r.workload} | {r.load:g} | {r.sim_order} | {r.measured_order} | "
                     f"{r.pairs_agree}/{r.pairs_checked} | {'yes' if r.agree else '**no**: ' + str(r.disagree) + noisy} |")
    if c.table_static is not None:
        s = c.table_static[c.table_static["metric"].isin(list(c.meta.get("bars", {})))]
        lines += ["", "With the profile as measured (no speed calibration):", "",
                  "| workload | load | policy | metric | sim | measured | rel. error |", "|---|---:|---|---|---:|---:|---:|"]
        lines += [f"| {r.workload} | {r.load:g} | {r.policy} | {r.metric} | {r.sim:.4g} | {r.measured:.4g} | {_pct(r.rel_err)} |"
                  for r in s.itertuples(index=False)]
    return lines
