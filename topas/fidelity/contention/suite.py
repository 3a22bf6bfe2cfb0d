"""The suite over stored runs: every measured run compared with its simulation, the summary with
its bars, measuring the cases on a server and evaluating them."""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from topas.fidelity.compare import BENCHMARK_BARS, compare, rank_agreement, read_comparison, run_metrics
from topas.fidelity.contention.agreement import (ARRIVALS, ARRIVAL_COLUMN, agreement, ingest_window_mid,
    observed_trace, request_table, run_noise)
from topas.fidelity.contention.cases import OUT_DIR, Case, Mode, case_trace, find_mode, write_case_trace
from topas.fidelity.cpu_server import cpu_server
from topas.fidelity.run import (Point, prefix_tokens, replay_measure, run_fidelity, scale_cost, server_kv_settings,
                                simulate_point, stored_sim_engine)
from topas.fidelity.server_eviction import eviction_config_kw
from topas.workload.trace_io import write_trace


# ----------------------------------------------------------------------------- stored runs
def _raw(d: Path, tag: str, rep: int) -> pd.DataFrame | None:
    f = d / "raw" / "sglang" / f"{tag}_r{rep}" / "requests.parquet"
    return pd.read_parquet(f) if f.exists() else None


def compare_runs(run_dir: str | Path, case: Case, mode: "str | Mode", engine_model: str = "sglang",
                 traces_dir: str | Path | None = None, arrivals: str = "observed") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per request and per run, for one case's runs on one server mode (``run_dir``: what
    :func:`topas.fidelity.run.run_fidelity` wrote): each measured repeat against the simulation
    calibrated to that repeat's speed (its ``speed_factor`` in ``runs.csv``), with
    ``engine_model``, timed by ``arrivals`` (:data:`ARRIVALS`). Returns (requests, runs): the
    request tables of every repeat, and one row per (policy, repeat) with :func:`agreement` and
    the server's noise (:func:`run_noise`). ``mode``: a :class:`Mode` or its name
    (:func:`topas.fidelity.contention.cases.find_mode`); its ``priority`` rule is the simulated
    policy's ``request_priority``, its eviction policy comes with the stored engine config."""
    mode_obj = find_mode(mode) if isinstance(mode, str) else mode
    mode = mode_obj.name
    if arrivals not in ARRIVALS:
        raise ValueError(f"unknown arrivals {arrivals!r}; valid: {', '.join(ARRIVALS)}")
    tmp = Path(tempfile.mkdtemp(prefix="topas-contention-"))

    d = Path(run_dir)
    comp = read_comparison(d)
    meta = comp.meta
    cost, config = _mode_engine(meta, mode_obj)
    trace_file = Path(traces_dir or OUT_DIR / "traces") / f"{case.name}.json.gz"
    runs = comp.runs
    req_rows, run_rows = [], []
    for pol, g in runs[runs["engine"] == "sglang"].groupby("policy", sort=True):
        cal = runs[(runs["engine"] == "sim-calibrated") & (runs["policy"] == pol)].set_index("repeat")
        first = g.iloc[0]
        tag = f"{first['workload']}_{pol}_{float(first['load']):g}_s{int(first['seed'])}"
        p = Point(str(trace_file), pol, rate=_rate(case), seed=int(first["seed"]), load=float(first["load"]),
                  params=mode_obj.params, eviction_priority=mode_obj.priority)
        measured = {}
        for rep in sorted(int(r) for r in g["repeat"]):
            m = _raw(d, tag, rep)
            if m is not None:
                measured[rep] = m
        pt = None
        for rep, m in measured.items():
            f = float(cal.loc[rep, "speed_factor"]) if rep in cal.index else 1.0
            q, fell_back = p, 0
            if arrivals in ARRIVAL_COLUMN:
                lead = 0.5 * float(getattr(config, "request_latency_s", 0.0) or
                                   (cost.meta.get("overhead") or {}).get("request_s") or 0.0)
                mm = m.assign(server_ingest_mid=ingest_window_mid(m)) if arrivals == "scheduler-mid" else m
                obs, fell_back = observed_trace(case_trace(case), mm, lead, ARRIVAL_COLUMN[arrivals])
                q = Point(str(write_trace(obs, tmp / f"{case.name}_{pol}_{rep}.json.gz")), pol, rate=None,
                          seed=p.seed, load=p.load, params=p.params, eviction_priority=p.eviction_priority)
            sim, trace = simulate_point(q, scale_cost(cost, f) if f != 1.0 else cost, config, engine_model)
            pt = prefix_tokens(trace)
            tab = request_table(sim.requests, m, pt)
            req_rows.append(tab.assign(case=case.name, mode=mode, policy=pol, repeat=rep))
            run_rows.append({"case": case.name, "kind": case.kind, "mode": mode, "policy": pol, "repeat": rep,
                             "engine_model": engine_model, "arrivals": arrivals, "arrival_fallbacks": fell_back,
                             "speed_factor": f, **agreement(tab)})
        if pt is not None:
            noise = run_noise(list(measured.values()), pt)
            for r in run_rows:
                if r["mode"] == mode and r["policy"] == pol:
                    r.update(noise)
    shutil.rmtree(tmp, ignore_errors=True)
    return (pd.concat(req_rows, ignore_index=True) if req_rows else pd.DataFrame(),
            pd.DataFrame(run_rows))


def _rate(case: Case) -> float | None:
    """A Point's rate: None for a burst (the trace's own times), the case's rate otherwise."""
    return case.rate if case.kind == "poisson" else None


#: The issue's bars: scripted bursts miss exactly where the server does; Poisson traces agree on
#: >= 95% of requests' hit/miss and the mean JCT is within 15%.
POISSON_HIT_BAR = 0.95
JCT_BAR = 0.15


def summarize(runs: pd.DataFrame, jct: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (case, mode, policy): the per-request agreement over repeats (mean; for bursts
    also whether every repeat missed exactly where the simulation did), the server's noise, and,
    with ``jct`` (rows of :func:`topas.fidelity.compare.compare` with ``case`` and ``mode``), the
    mean and p99 JCT error; ``ok`` against the bars."""
    rows = []
    for (case, kind, mode, pol), g in runs.groupby(["case", "kind", "mode", "policy"], sort=True):
        row = {"case": case, "kind": kind, "mode": mode, "policy": pol, "repeats": len(g),
               "hit_agree": float(g["hit_agree"].mean()), "hit_agree_min": float(g["hit_agree"].min()),
               "cached_agree": float(g["cached_agree"].mean()) if "cached_agree" in g else math.nan,
               "same_misses_all": bool(g["same_misses"].all()), "same_misses_any": bool(g["same_misses"].any()),
               "misses_sim": float(g["misses_sim"].mean()), "misses_server": float(g["misses_server"].mean()),
               "wave_agree": float(g["wave_agree"].mean()), "order_agree": float(g["order_agree"].mean()),
               "noise_hit_agree": float(g["noise_hit_agree"].iloc[0]),
               "noise_wave_agree": float(g["noise_wave_agree"].iloc[0]),
               "noise_order_agree": float(g["noise_order_agree"].iloc[0])}
        if "arrivals" in g:
            row["arrivals"] = str(g["arrivals"].iloc[0])
        if "arrival_fallbacks" in g:
            row["arrival_fallbacks"] = int(g["arrival_fallbacks"].sum())
        if jct is not None and len(jct):
            j = jct[(jct["case"] == case) & (jct["mode"] == mode) & (jct["policy"] == pol)].set_index("metric")
            for m in ("jct_mean", "jct_p99"):
                if m in j.index:
                    row[f"{m}_sim"] = float(j.loc[m, "sim"])
                    row[f"{m}_server"] = float(j.loc[m, "measured"])
                    row[f"{m}_err"] = float(j.loc[m, "rel_err"])
                    row[f"{m}_ci90"] = float(j.loc[m, "measured_ci90"])
        if kind == "burst":
            row["ok"] = row["same_misses_all"]
        else:
            row["ok"] = bool(row["hit_agree"] >= POISSON_HIT_BAR and abs(row.get("jct_mean_err", math.nan)) <= JCT_BAR)
        rows.append(row)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- measuring
def measure_cases(cases: Sequence[Case], modes: Sequence[Mode], profile: str | Path, out_dir: str | Path = OUT_DIR,
                  repeats: int = 3, engine_model: str = "sglang", log: Callable[[str], None] | None = print,
                  server_log_dir: str | Path | None = None, plugin_profile: bool = True) -> None:
    """Start the CPU server once per (pool, mode), replay every case of that pool under the mode's
    policies ``repeats`` times, and write each (case, mode)'s runs with
    :func:`topas.fidelity.run.run_fidelity` to ``out_dir/<case>/<mode>/``. Stops every server.
    ``plugin_profile``: the plugin's policy prices its decisions with ``profile`` too (the
    simulation's; off: the plugin's default A100 profile, as the runs before 2026-12-01 21:55 UTC,
    which made TOPAS decide on other costs on the server than in the simulation)."""
    out = Path(out_dir)
    traces = {c.name: write_case_trace(c, out / "traces") for c in cases}
    slog = Path(server_log_dir or "/tmp")
    for pool in sorted({c.pool_tokens for c in cases}):
        pcases = [c for c in cases if c.pool_tokens == pool]
        for mode in modes:
            dlog = slog / f"topas_contention_{mode.name}_{int(time.time())}.jsonl" if mode.plugin else None
            with cpu_server(log_path=slog / f"topas_contention_{mode.name}.server.log", decision_log=dlog,
                            max_total_tokens=pool, plugin=mode.plugin, schedule_policy=mode.schedule_policy,
                            profile=profile if plugin_profile and mode.plugin else None,
                            eviction=mode.eviction, eviction_config=dict(mode.eviction_config) or None) as url:
                settings = server_kv_settings(url)
                if int(settings["kv_budget_tokens"]) != pool:
                    raise RuntimeError(f"the server's pool is {settings['kv_budget_tokens']} tokens, asked for {pool}")
                got = str(settings.get("radix_eviction_policy") or "lru")
                if got != (mode.eviction or "lru"):
                    raise RuntimeError(f"the server evicts with {got}, asked for {mode.eviction}")
                try:
                    eviction_config_kw(settings.get("radix_eviction_policy"), settings.get("radix_eviction_policy_config"))
                except ValueError as e:  # record the server now; compare_runs simulates the mode's eviction later
                    if log:
                        log(f"note: {e}: the runs' calibration simulates lru; compare with --compare-only once "
                            f"the simulator models it")
                    settings = {**settings, "radix_eviction_policy": None, "radix_eviction_policy_config": None}
                for c in pcases:
                    pts = [Point(str(traces[c.name]), pol, rate=_rate(c), seed=c.seed, load=c.rate if c.kind == "poisson" else 0.0,
                                 params=mode.params, eviction_priority=mode.priority)
                           for pol in mode.policies]
                    if log:
                        log(f"== {c.name} on {mode.name} (pool {pool}): {', '.join(mode.policies)} x {repeats}")
                    run_fidelity(pts, replay_measure(url, decision_log=dlog, handshake=mode.plugin), profile, out / c.name / mode.name,
                                 repeats=repeats, settings=settings, bars=BENCHMARK_BARS,
                                 meta={"case": c.name, "mode": mode.name, "schedule_policy": mode.schedule_policy,
                                       "plugin": mode.plugin, "server": "CPU test server (topas.fidelity.contention)",
                                       **({"policy_params": dict(mode.params)} if mode.params else {}),
                                       **({"radix_eviction_policy": mode.eviction, "eviction_priority": mode.priority}
                                          if mode.eviction else {})},
                                 engine_model=engine_model, log=log)


def evaluate(cases: Sequence[Case], modes: Sequence[Mode], out_dir: str | Path = OUT_DIR, engine_model: str = "sglang",
             tag: str | None = None, arrivals: str = "observed") -> pd.DataFrame:
    """Compare every stored (case, mode) with ``engine_model`` (no server needed): writes
    ``requests_<tag>.parquet``, ``runs_<tag>.csv``, ``summary_<tag>.csv`` and ``ranks_<tag>.csv``
    (the policies' mean-JCT order in both engines, per case and mode with several policies,
    :func:`topas.fidelity.compare.rank_agreement` with the calibrated simulation; pairs the
    simulation puts less than 10% apart are ties) into ``out_dir`` (``tag`` defaults to the
    engine model) and returns the summary. ``arrivals``: how the per-request comparison times the
    simulation (:data:`ARRIVALS`); the JCT comparison always uses the trace's times (the measured
    JCT counts from them)."""
    out = Path(out_dir)
    tag = tag or engine_model
    reqs, runs, jcts, ranks = [], [], [], []
    for c in cases:
        for mode in modes:
            d = out / c.name / mode.name
            if not (d / "runs.csv").exists():
                continue
            r, g = compare_runs(d, c, mode, engine_model, out / "traces", arrivals)
            reqs.append(r)
            runs.append(g)
            comp = read_comparison(d)
            rs = _resimulated_runs(comp.runs, d, c, engine_model, out / "traces", mode.priority, mode.params)
            jcts.append(compare(rs, sim_engine="sim-calibrated").assign(case=c.name, mode=mode.name))
            if len(mode.policies) > 1:
                ranks.append(rank_agreement(rs, sim_engine="sim-calibrated").assign(case=c.name, mode=mode.name))
    if not runs:
        raise FileNotFoundError(f"no measured contention runs under {out}")
    runs_df = pd.concat(runs, ignore_index=True)
    summary = summarize(runs_df, pd.concat(jcts, ignore_index=True))
    _atomic_write(out / f"requests_{tag}.parquet", lambda p: pd.concat(reqs, ignore_index=True).to_parquet(p, index=False))
    _atomic_write(out / f"runs_{tag}.csv", lambda p: runs_df.to_csv(p, index=False))
    _atomic_write(out / f"summary_{tag}.csv", lambda p: summary.to_csv(p, index=False))
    if ranks:
        _atomic_write(out / f"ranks_{tag}.csv", lambda p: pd.concat(ranks, ignore_index=True).to_csv(p, index=False))
    return summary


def _resimulated_runs(runs: pd.DataFrame, d: Path, case: Case, engine_model: str, traces_dir: Path,
                      eviction_priority: str | None = None, params: tuple = ()) -> pd.DataFrame:
    """The runs table with its ``sim-calibrated`` rows recomputed with ``engine_model`` (the
    measured rows as stored), so the JCT comparison follows the engine model being judged;
    ``params``: the mode's policy parameters."""
    meta = read_comparison(d).meta
    cost, config = _mode_engine(meta, find_mode(str(meta.get("mode") or "sglang-fcfs")))
    trace_file = traces_dir / f"{case.name}.json.gz"
    keep = runs[runs["engine"] != "sim-calibrated"]
    new = []
    for r in runs[runs["engine"] == "sim-calibrated"].to_dict("records"):
        p = Point(str(trace_file), r["policy"], rate=_rate(case), seed=int(r["seed"]), load=float(r["load"]),
                  params=tuple(params), eviction_priority=eviction_priority)
        f = float(r["speed_factor"])
        sim, trace = simulate_point(p, scale_cost(cost, f), config, engine_model)
        new.append({**r, **run_metrics(sim, prefix_tokens(trace))})
    return pd.concat([keep, pd.DataFrame(new)], ignore_index=True)


def _mode_engine(meta: dict, mode: Mode) -> tuple:
    """The stored run's simulator (:func:`topas.fidelity.run.stored_sim_engine`) with the mode's
    eviction policy (the mode is what the server ran, also for runs recorded before the simulator
    modelled it)."""
    cost, config = stored_sim_engine(meta)
    kw = eviction_config_kw(mode.eviction, dict(mode.eviction_config) or None)
    return cost, dataclasses.replace(config, **kw) if kw else config


def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)
