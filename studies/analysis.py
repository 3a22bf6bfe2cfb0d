"""Tables behind notebooks 05-08: decision overhead, mechanism numbers, sensitivity grids and
the paper's reported numbers (their comparison with ours is :mod:`studies.paper_compare`).

Every function takes stored results (:class:`~topas.engine.metrics.SimResult` or the summary
rows of :func:`topas.experiments.run_sweep`) and returns plain numbers or a DataFrame, so the
notebooks only wire them together::

    from studies import analysis, grid
    from topas.experiments import run_sweep
    summaries = run_sweep(grid.jct_vs_load(quick=True))
    table = analysis.engine_model_table(summaries)

``mechanism_row`` and ``prefix_share`` are the numbers of ``scripts/mechanism.py`` (same columns).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from studies import grid

from topas.experiments.spec import Experiment
from topas.sets import PAPER_BASELINES

PAPER_LABEL = "paper (reported)"
MISSING_TRACE = "n/a (trace missing)"
#: The paper's baselines; "vs best baseline" picks the best of these per workload and metric.
HIGHER_IS_BETTER = {"throughput_rps"}


# --- runs -----------------------------------------------------------------------------------


def at_load(experiments: Iterable[Experiment], load: float) -> list[Experiment]:
    """The distinct experiments of a grid with their load set to ``load`` (input order kept), so a
    notebook can take one load of any grid (quick grids lack load 1.2)."""
    out: dict[str, Experiment] = {}
    for e in experiments:
        e2 = dataclasses.replace(e, load=load)
        out.setdefault(e2.key(), e2)
    return list(out.values())


def with_params(experiments: Iterable[Experiment], params: Mapping[str, object] | None) -> list[Experiment]:
    """The experiments of TOPAS policies with ``params`` as defaults under their own parameters
    (a sensitivity grid's axes win); other policies unchanged."""
    if not params:
        return list(experiments)
    return [dataclasses.replace(e, params={**dict(params), **dict(e.params)}) if e.policy.startswith("topas") else e
            for e in experiments]


# --- decision overhead (notebook 05) --------------------------------------------------------


def decision_overhead(decisions: pd.DataFrame, makespan: float) -> dict[str, float]:
    """Per-decision wall time (ms: mean, p50, p99, max), its share of the simulated serving time
    (sum of decision wall time / makespan, as the paper's share of serving time) and the
    candidate prefix sets per decision (mean, max)."""
    ms = decisions["wall_s"].to_numpy(dtype=float) * 1e3
    cand = decisions["info_candidates"].to_numpy(dtype=float) if "info_candidates" in decisions else np.array([])
    cand = cand[~np.isnan(cand)]
    nan = float("nan")
    return {
        "decisions": int(len(ms)),
        "mean_ms": float(ms.mean()) if len(ms) else nan,
        "p50_ms": float(np.percentile(ms, 50)) if len(ms) else nan,
        "p99_ms": float(np.percentile(ms, 99)) if len(ms) else nan,
        "max_ms": float(ms.max()) if len(ms) else nan,
        "share_pct": float(100.0 * ms.sum() / 1e3 / makespan) if makespan > 0 else nan,
        "candidates_mean": float(cand.mean()) if len(cand) else nan,
        "candidates_max": float(cand.max()) if len(cand) else nan,
    }


def paper_overhead(reported: pd.DataFrame | None = None) -> dict[str, float]:
    """The paper's reported decision overhead: mean ms and share of wall time (%)."""
    rep = paper_reported() if reported is None else reported
    def get(metric: str) -> float:
        v = rep.loc[rep.metric == metric, "value_pct"]
        return float(v.iloc[0]) if len(v) else float("nan")
    return {"mean_ms": get("decision_overhead_mean_ms"), "share_pct": get("decision_overhead_wall_time_share")}


def overhead_table(stats: Mapping[str, float], setting: str, reported: pd.DataFrame | None = None) -> pd.DataFrame:
    """Ours (``stats`` from :func:`decision_overhead`, run in ``setting``) beside the paper's
    reported mean and share (SGLang, MetaGPT-SOP at 0.15 task/s; it reports no p50/p99)."""
    paper = paper_overhead(reported)
    nan = float("nan")
    return pd.DataFrame([
        {"source": "this reproduction (simulator)", "setting": setting, "decisions": stats["decisions"],
         "mean (ms)": stats["mean_ms"], "p50 (ms)": stats["p50_ms"], "p99 (ms)": stats["p99_ms"],
         "share of serving time (%)": stats["share_pct"], "candidate sets / decision": stats["candidates_mean"]},
        {"source": PAPER_LABEL, "setting": "SGLang on an A100, MetaGPT-SOP at 0.15 task/s", "decisions": pd.NA,
         "mean (ms)": paper["mean_ms"], "p50 (ms)": nan, "p99 (ms)": nan,
         "share of serving time (%)": paper["share_pct"], "candidate sets / decision": nan},
    ])


# --- mechanism (notebook 06) ----------------------------------------------------------------


def prefix_share(res, budget: int) -> float:
    """Time-weighted share of the KV budget held by resident prefixes."""
    tl = res.timeline
    if len(tl) < 2:
        return float("nan")
    dt = np.diff(tl["time"].to_numpy(dtype=float))
    held = tl["prefix_tokens"].to_numpy(dtype=float)[:-1]
    return float((held * dt).sum() / dt.sum() / budget) if dt.sum() > 0 else float("nan")


def mechanism_row(policy: str, res, budget: int) -> dict:
    """The row of ``scripts/mechanism.py``: JCT, busy/makespan, decode batch, prefix KV share,
    retractions, preemptions, prefix swaps and the mean queueing time of each stage."""
    s = res.summary
    queue = res.requests.groupby("stage_id")["queue_time"].mean()
    return {
        "policy": policy,
        "mean JCT": s["jct_mean"],
        "p99 JCT": s["jct_p99"],
        "busy/makespan": s["busy_time"] / s["makespan"] if s["makespan"] else float("nan"),
        "decode batch": s["avg_decode_batch"],
        "prefix KV share": prefix_share(res, budget),
        "retractions": s["retractions"],
        "preemptions": s["preemptions"],
        "prefix swaps": s["prefix_loads_swap"],
        **{f"queue {stage}": q for stage, q in queue.items()},
    }


def mechanism_table(results: Mapping[tuple[str, str], object], budget: int) -> pd.DataFrame:
    """``{(workload, policy): SimResult}`` -> one :func:`mechanism_row` per run with a leading
    ``workload`` column and the prefix events (loads from host / by prefill, evictions, GB swapped)."""
    rows = []
    for (w, p), res in results.items():
        s = res.summary
        row = {"workload": w, **mechanism_row(p, res, budget)}
        queues = {k: row.pop(k) for k in list(row) if k.startswith("queue ")}
        row.update({"prefix prefills": s["prefix_loads_prefill"], "prefix evictions": s["prefix_evictions"],
                    "GB swapped": s["bytes_swapped"] / 1e9})
        row.update(queues)
        rows.append(row)
    return pd.DataFrame(rows)


def stage_queueing(results: Mapping[tuple[str, str], object]) -> pd.DataFrame:
    """Mean queueing time (s) per workload, policy and stage, with the stage's depth in the DAG
    (0 = root) and how many stages share that depth (``width``: the fan-out)."""
    rows = []
    for (w, p), res in results.items():
        rq = res.requests
        depth = _stage_depths(rq)
        width = pd.Series(depth).value_counts()
        for stage, q in rq.groupby("stage_id")["queue_time"].mean().items():
            rows.append({"workload": w, "policy": p, "stage": stage, "depth": depth.get(stage, 0),
                         "width": int(width.get(depth.get(stage, 0), 1)), "queue_s": float(q)})
    return pd.DataFrame(rows)


def _stage_depths(requests: pd.DataFrame) -> dict[str, int]:
    """Stage depth from the order stages become ready inside a task (0 = ready at arrival):
    the rank of each stage's median ready-offset over tasks, stages with equal offsets tied."""
    first = requests.groupby("task_id")["ready"].transform("min")
    off = (requests["ready"] - first).groupby(requests["stage_id"]).median()
    # stages that become ready at the same time (up to rounding) share a depth
    levels = sorted(set(np.round(off.to_numpy(dtype=float), 6)))
    return {s: levels.index(round(float(v), 6)) for s, v in off.items()}


# --- sensitivity (notebook 07) --------------------------------------------------------------


def sensitivity_table(summaries: pd.DataFrame, axes: Sequence[str]) -> pd.DataFrame:
    """Mean over seeds of mean and p99 JCT (s) per combination of the parameters ``axes``
    (read from the ``params`` column of :func:`run_sweep`'s summaries)."""
    df = summaries.copy()
    # A run whose parameters equal the defaults shares its key (and stored row) with a run that
    # gave no parameters, so missing values are the policy's defaults.
    from dataclasses import asdict

    from topas.policies import policy_class

    resolved = [{**asdict(policy_class(pol).Params()), **_params(p)} for pol, p in zip(df["policy"], df["params"])]
    for a in axes:
        df[a] = [r.get(a) for r in resolved]
    out = (df.groupby(list(axes), as_index=False)
             .agg(mean_jct=("jct_mean", "mean"), p99_jct=("jct_p99", "mean"), seeds=("seed", "nunique")))
    return out.rename(columns={"mean_jct": "mean JCT (s)", "p99_jct": "p99 JCT (s)"})


def _params(p) -> dict:
    """A summary row's ``params``: a JSON string in the store's summaries, or a mapping/pairs."""
    if isinstance(p, str):
        return json.loads(p) if p.strip() else {}
    return dict(p or {})


# --- paper vs ours (notebook 08) ------------------------------------------------------------


def paper_reported(path: str | Path | None = None) -> pd.DataFrame:
    """``data/paper/reported.csv``: the paper's own numbers (never measured here)."""
    from topas.paths import data_dir

    return pd.read_csv(path or data_dir() / "paper" / "reported.csv")


def change_vs(summaries: pd.DataFrame, workload: str, column: str, policy: str = "topas",
              against: Sequence[str] = PAPER_BASELINES) -> tuple[float, str | None]:
    """(% change of ``policy`` vs the best of ``against`` in ``column``, that policy), means over
    seeds; negative = better for JCT. ``(nan, None)`` when a side is missing."""
    df = summaries[summaries.workload == workload]
    means = df.groupby("policy")[column].mean()
    cands = means.reindex([a for a in against if a in means.index]).dropna()
    if policy not in means.index or cands.empty:
        return float("nan"), None
    best = cands.idxmax() if column in HIGHER_IS_BETTER else cands.idxmin()
    return float(100.0 * (means[policy] - cands[best]) / cands[best]), str(best)


def engine_model_table(summaries: pd.DataFrame, policy: str = "topas",
                       against: Sequence[str] = PAPER_BASELINES, reference: str = "stock") -> pd.DataFrame:
    """Does a conclusion depend on the engine model? One row per (workload, engine model) of
    ``summaries`` (runs of :func:`studies.grid.engine_model`; the ``engine_model``
    column, ``reference`` first): the best of ``against`` by mean JCT, ``policy``'s mean and p99
    JCT change against it (%, means over seeds; negative = ``policy`` better), the same change
    against the baseline that was best on the ``reference`` model (so a change of best baseline
    does not hide a change), and ``policy``'s mean JCT.
    """
    rows = []
    models = _engine_models(summaries, reference)
    best_ref: dict[str, str | None] = {}
    for w in dict.fromkeys(summaries.workload):
        for model in models:
            df = summaries[(summaries.workload == w) & (summaries.engine_model == model)]
            if df.empty:
                continue
            mean, best = change_vs(df, w, "jct_mean", policy, against)
            p99, best_p99 = change_vs(df, w, "jct_p99", policy, against)
            if model == reference:
                best_ref[w] = best
            ref = best_ref.get(w)
            fixed = float("nan")
            if ref is not None:
                fixed, _ = change_vs(df, w, "jct_mean", policy, (ref,))
            rows.append({"workload": w, "engine model": model, "best baseline": best,
                         f"{policy} vs best: mean JCT %": mean,
                         f"{policy} vs best: p99 JCT %": p99, "best baseline (p99)": best_p99,
                         f"{reference}'s best": ref, f"{policy} vs {reference}'s best: mean JCT %": fixed,
                         f"{policy} mean JCT (s)": float(df[df.policy == policy].jct_mean.mean())})
    return pd.DataFrame(rows)


def _engine_models(summaries: pd.DataFrame, reference: str) -> list[str]:
    col = summaries["engine_model"] if "engine_model" in summaries else pd.Series(["stock"] * len(summaries))
    return [reference] + [m for m in dict.fromkeys(col) if m != reference]


def engine_model_shift(summaries: pd.DataFrame, reference: str = "stock") -> pd.DataFrame:
    """Per workload and policy: mean and p99 JCT on each engine model (means over seeds) and each
    other model's change from ``reference`` (%)."""
    g = summaries.groupby(["workload", "policy", "engine_model"])[["jct_mean", "jct_p99"]].mean().unstack("engine_model")
    out = pd.DataFrame(index=g.index)
    models = _engine_models(summaries, reference)
    for col, name in (("jct_mean", "mean JCT"), ("jct_p99", "p99 JCT")):
        if reference not in g[col]:
            continue
        for m in models:
            if m in g[col]:
                out[f"{name} (s), {m}"] = g[col][m]
        for m in models[1:]:
            if m in g[col]:
                out[f"{name} change %, {m}"] = 100.0 * (g[col][m] - g[col][reference]) / g[col][reference]
    return out.reset_index()


# --- robustness (notebook 14) -----------------------------------------------------------------

#: Axis name -> (the setting's column, the reference value), for :func:`robustness_table`.
ROBUST_AXES = ("prior noise", "prior bias", "DAG visibility", "arrivals")


def knowledge_condition(row: Mapping[str, object]) -> tuple[str, str, object]:
    """``(axis, estimator, setting)`` of a summary row of :func:`studies.grid.robustness`:
    the axis it varies from the reference (``"reference"`` for exact priors, full DAGs and Poisson
    arrivals), the output estimator (``online`` or ``prior``) and its setting on that axis."""
    est = _params(row.get("params")).get("output_estimator", "online")
    noise, bias = float(row.get("prior_noise", 0.0) or 0.0), float(row.get("prior_bias", 1.0) or 1.0)
    vis, arr = row.get("dag_visibility") or "full", row.get("arrivals") or "poisson"
    if arr != "poisson":
        return "arrivals", est, float(str(arr).split(":")[1])
    if vis != "full":
        return "DAG visibility", est, vis
    if bias != 1.0:
        return "prior bias", est, bias
    if noise != 0.0:
        return "prior noise", est, noise
    return "reference", est, None


#: The reference setting of each axis (where the axis meets the reference runs).
AXIS_REFERENCE = {"prior noise": 0.0, "prior bias": 1.0, "DAG visibility": "full", "arrivals": 1.0}


def robustness_table(summaries: pd.DataFrame, knowledge_policies: Sequence[str] = grid.KNOWLEDGE_POLICIES
                     ) -> pd.DataFrame:
    """Mean and p99 JCT of every policy on every axis of notebook 14, one row per (workload,
    axis, estimator, setting, policy), averaged over seeds, with the change against the same
    policy's reference run (``vs reference %``) and ``source``:

    * ``run``: simulated with that setting;
    * ``reference``: a policy that reads neither priors nor DAGs (not in ``knowledge_policies``)
      under a knowledge setting: its reference run stands for it (the view changes only in what
      it does not read). Each axis also gets its reference point (noise 0, bias 1, full DAGs,
      Poisson = CV 1) from the reference runs, so lines start where the reference is.
    """
    df = summaries.copy()
    cond = [knowledge_condition(r) for r in df.to_dict("records")]
    df["axis"], df["estimator"], df["setting"] = zip(*cond) if cond else ((), (), ())
    keys = ["workload", "policy", "axis", "estimator", "setting"]
    agg = (df.groupby(keys, dropna=False, sort=False)
           .agg(jct_mean=("jct_mean", "mean"), jct_p99=("jct_p99", "mean"), seeds=("seed", "nunique"))
           .reset_index())
    ref = agg[agg["axis"] == "reference"].set_index(["workload", "policy"])
    rows = [dict(r, source="run") for r in agg[agg["axis"] != "reference"].to_dict("records")]
    policies = sorted(set(agg["policy"]))
    for w in sorted(set(agg["workload"])):
        for axis in ROBUST_AXES:
            here = agg[(agg["workload"] == w) & (agg["axis"] == axis)]
            for est in sorted(set(here["estimator"])):
                settings = sorted(set(here[here["estimator"] == est]["setting"]), key=str)
                for p in policies:
                    if (w, p) not in ref.index:
                        continue
                    r = ref.loc[(w, p)]
                    base = dict(workload=w, policy=p, axis=axis, estimator=est, jct_mean=r["jct_mean"],
                                jct_p99=r["jct_p99"], seeds=r["seeds"])
                    blind = p not in knowledge_policies
                    if est == "online" or (blind and axis != "arrivals"):
                        # the reference runs learn online; a blind policy has no estimator
                        rows.append(dict(base, setting=AXIS_REFERENCE[axis], source="reference",
                                         estimator=est))
                    if axis != "arrivals" and blind:
                        rows.extend(dict(base, setting=s, source="reference") for s in settings)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    refm = ref["jct_mean"].to_dict()
    refp = ref["jct_p99"].to_dict()
    out["mean vs reference %"] = [100 * (m / refm[(w, p)] - 1) for w, p, m in zip(out["workload"], out["policy"], out["jct_mean"])]
    out["p99 vs reference %"] = [100 * (m / refp[(w, p)] - 1) for w, p, m in zip(out["workload"], out["policy"], out["jct_p99"])]
    out["setting"] = out["setting"].astype(object)
    order = {a: k for k, a in enumerate(ROBUST_AXES)}
    out["_a"] = out["axis"].map(order)
    out["_s"] = out["setting"].map(lambda v: (0, v) if isinstance(v, (int, float)) else (1, 0.0 if v == "full" else 1.0))
    out = out.sort_values(["workload", "_a", "estimator", "_s", "policy"]).drop(columns=["_a", "_s"])
    return out.reset_index(drop=True)[["workload", "axis", "estimator", "setting", "policy", "source", "seeds",
                                       "jct_mean", "jct_p99", "mean vs reference %", "p99 vs reference %"]]


#: The policies notebook 14's verdict judges against the best baseline (each on its own rows).
ROBUST_CANDIDATES = ("topas", "topas-plus")


def robustness_verdict(table: pd.DataFrame, policies: Sequence[str] = ROBUST_CANDIDATES,
                       baselines: Sequence[str] = PAPER_BASELINES) -> pd.DataFrame:
    """Does a policy's standing survive? Per candidate ``policy`` (TOPAS, TOPAS+), workload, axis,
    estimator and setting: its mean and p99 JCT against the best baseline *at that setting*
    (``vs best: mean %``, ``vs best: p99 %``; negative = the policy lower), the best baseline,
    its ``standing`` on mean JCT (better / tie within :data:`TIE_PCT` % / worse) and whether it
    is the standing of its own reference run (``same as reference``)."""
    rows: dict[str, list[dict[str, Any]]] = {p: [] for p in policies}  # each policy's rows together
    for (w, axis, est, setting), g in table.groupby(["workload", "axis", "estimator", "setting"], sort=False):
        g = g.set_index("policy")
        base = g[g.index.isin(baselines)]
        if base.empty:
            continue
        for policy in (p for p in policies if p in g.index):
            row = {"policy": policy, "workload": w, "axis": axis, "estimator": est, "setting": setting}
            for metric, col in (("mean", "jct_mean"), ("p99", "jct_p99")):
                row[f"best baseline ({metric})"] = base[col].idxmin()
                row[f"vs best: {metric} %"] = 100 * (g.loc[policy, col] / base[col].min() - 1)
            rows[policy].append(row)
    out = pd.DataFrame([r for p in policies for r in rows[p]])
    if out.empty:
        return out
    ref = {(p, w): v for p, w, v in out[(out["axis"] == "prior noise") & (out["setting"] == 0.0)
                                        & (out["estimator"] == "online")][["policy", "workload", "vs best: mean %"]]
           .itertuples(index=False)}
    out["standing"] = [standing(v) for v in out["vs best: mean %"]]
    out["same as reference"] = [standing(v) == standing(ref[(p, w)]) if (p, w) in ref else None
                                for p, w, v in zip(out["policy"], out["workload"], out["vs best: mean %"])]
    return out.reset_index(drop=True)


#: Differences within this many percent count as a tie in :func:`standing`: one arrival seed of
#: 60 tasks cannot tell them apart (on the full grid, TOPAS's own noise-free runs differ from each
#: other by up to ~3% across settings that do not touch it, e.g. DAG-10-Wide bias 0.5 vs 1).
TIE_PCT = 5.0


def standing(pct: float, tie: float = TIE_PCT) -> str:
    """``"better"`` (TOPAS lower by more than ``tie`` %), ``"worse"`` or ``"tie"``."""
    return "better" if pct < -tie else "worse" if pct > tie else "tie"


def stability(store, experiments: Iterable[Experiment]) -> pd.DataFrame:
    """Is the load stable? For each run: mean JCT of the last quarter of tasks (by arrival) over
    that of the first quarter; a queue that keeps growing gives a ratio well above 1."""
    from topas.engine.metrics import stability_ratio

    rows = [{"workload": e.workload, "policy": e.policy, "seed": e.seed,
             "last/first quarter JCT": stability_ratio(store.load_table(e, "tasks"))} for e in experiments]
    return pd.DataFrame(rows)


def estimator_convergence_table(traces: Mapping[str, object], noise: Sequence[float] = (0.0, 1.0),
                                seed: int = 0) -> pd.DataFrame:
    """Median (over agents) relative error of the online output estimator after ``n`` finished
    calls, per trace and prior noise (:func:`topas.policies.estimates.estimator_convergence`)."""
    from topas.policies.estimates import estimator_convergence

    frames = []
    for name, trace in traces.items():
        for s in noise:
            df = estimator_convergence(trace, prior_noise=s, seed=seed)
            g = df.groupby("n")["rel_error"].agg(["median", "count"]).reset_index()
            g.insert(0, "prior noise", s)
            g.insert(0, "workload", name)
            frames.append(g.rename(columns={"median": "median rel. error", "count": "agents"}))
    return pd.concat(frames, ignore_index=True)
