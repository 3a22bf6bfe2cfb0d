"""Run a fidelity comparison: replay traces on a real server, simulate the same traces with the
server's measured profile and KV budget, and write the comparison (:mod:`topas.fidelity.compare`).

The simulated side mirrors the server: the profile's numbers (``topas profile-server``), the KV
budget the server reports (``max_total_num_tokens``), its chunked-prefill size and, because the
CPU server has no host KV tier, no host tier (an evicted prefix is recomputed, as SGLang's radix
cache does without HiCache). Both engines run the same trace head, re-timed with the same Poisson
arrivals (``topas.workload.arrivals.retime(trace, rate, seed)``).

The measured side is a callable ``measure(point) -> SimResult`` (by default
:func:`topas.sglang.replay.run_replay` against ``server``), so the orchestration is tested
without a server.
"""

from __future__ import annotations

import dataclasses
import math
import platform
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import pandas as pd

from topas.engine.config import LEGACY_ENGINE, EngineConfig
from topas.engine.cost import CostModel, load_profile
from topas.engine.metrics import SimResult
from topas.engine.simulator import simulate
from topas.experiments.spec import Prepared, _read_trace, resolve_trace_path
from topas.fidelity.compare import (BENCHMARK_BARS, Comparison, build_comparison, read_comparison, run_metrics,
                                    task_pairs, write_comparison)
from topas.fidelity.profile_server import ServerClient, server_settings
from topas.fidelity.server_eviction import eviction_config_kw
# speed_probe is re-exported: topas/cli/fidelity.py and scripts/fidelity_cpu.py take it from here
from topas.fidelity.server_probes import scheduler_seconds, speed_probe  # noqa: F401
from topas.fidelity.workloads import TRACES_DIR
from topas.paths import REPO_ROOT, profiles_dir
from topas.policies.base import PolicyError, make_policy
from topas.sglang.priority import apply_rule
from topas.sglang.replay import run_replay
from topas.workload.arrivals import retime
from topas.workload.validate import validate_trace

if TYPE_CHECKING:  # pragma: no cover
    from topas.workload.model import Trace

__all__ = ["Point", "sim_engine", "point_trace", "simulate_point", "run_fidelity"]


@dataclass(frozen=True)
class Point:
    """One compared point: a trace (name or file), a policy with parameters, an arrival rate
    (tasks/s; None: the trace's own arrival times, e.g. a scripted burst), the arrival seed and
    the number of tasks (the trace's head)."""

    workload: str
    policy: str
    rate: float | None
    seed: int = 0
    n_tasks: int | None = None
    params: tuple[tuple[str, Any], ...] = ()
    #: the label of the load in the tables (the rate, or the multiple of the nominal rate)
    load: float | None = None
    #: a rule of :mod:`topas.sglang.priority` giving each request its eviction priority: sent by the
    #: replay (top-level ``priority``), and the simulated policy's ``request_priority`` (None: none)
    eviction_priority: str | None = None

    @property
    def load_label(self) -> float:
        if self.load is not None:
            return self.load
        return self.rate if self.rate is not None else 0.0


def _portable_source(source: Any) -> str:
    """A profile file's path as a stored run records it: relative to the checkout when inside it,
    so that the runs compare again from any other clone."""
    text = str(source)
    try:
        return str(Path(text).resolve().relative_to(REPO_ROOT))
    except (ValueError, OSError):
        return text


def recorded_profile(meta: Mapping[str, Any]) -> str:
    """The profile a stored run was simulated with: its recorded file (relative to this checkout,
    or absolute) when that file exists; else the file of the same name in this checkout's
    profiles (runs recorded in another clone or worktree stored its absolute path); else the
    profile's name."""
    source = str(meta.get("profile_source") or "")
    if source:
        path = Path(source) if Path(source).is_absolute() else REPO_ROOT / source
        if path.is_file():
            return str(path)
        here = profiles_dir() / Path(source).name
        if here.is_file():
            return str(here)
    return str(meta["profile"])


def stored_sim_engine(meta: Mapping[str, Any], profile: "str | Path | CostModel | None" = None
                      ) -> tuple["CostModel", "EngineConfig"]:
    """The simulator as a stored comparison was simulated (its ``meta.json``): its profile
    (:func:`recorded_profile`, unless ``profile`` overrides it), its KV budget and host tier."""
    ec = meta.get("engine_config", {})
    out = sim_engine(profile or recorded_profile(meta), meta.get("kv_budget_tokens"),
                     {"host_tier": ec.get("host_tier", False)})
    if ec.get("eviction") not in (None, "lru"):  # as simulated then (EngineConfig.eviction's own spelling)
        out = (out[0], dataclasses.replace(out[1], eviction=ec["eviction"]))
    return out


def sim_engine(profile: "str | Path | CostModel", kv_budget: int | None = None,
               settings: Mapping[str, Any] | None = None) -> tuple["CostModel", "EngineConfig"]:
    """The simulator's cost model and config for a server: the profile with the server's KV budget
    (``kv_budget``, else the profile's), its chunked-prefill size and ``max_running_requests``,
    no host tier unless the server has one (``settings["host_tier"]``), SGLang's overlap scheduler
    unless it is disabled (``settings["disable_overlap_schedule"]``), ``ignore_eos`` requests (the
    replay client sends every request so) and the profile's request path
    (``overhead.request_s``, 0 when absent, as in the GPU profiles)."""
    cost = profile if isinstance(profile, CostModel) else load_profile(profile)
    settings = dict(settings or cost.meta.get("server_settings") or {})
    budget = kv_budget or settings.get("kv_budget_tokens") or cost.kv_budget_tokens
    cost = cost.with_budget(int(budget)) if int(budget) != cost.kv_budget_tokens else cost
    kw: dict[str, Any] = {"host_tier": bool(settings.get("host_tier", False)), "ignore_eos": True,
                          "request_latency_s": float((cost.meta.get("overhead") or {}).get("request_s") or 0.0)}
    mrr = settings.get("max_running_requests")
    if isinstance(mrr, int) and mrr > 0:
        kw["max_running_requests"] = mrr
    if settings.get("disable_overlap_schedule") is True:  # SGLang overlaps by default
        kw["overlap_schedule"] = False
    kw.update(eviction_config_kw(settings.get("radix_eviction_policy"), settings.get("radix_eviction_policy_config")))
    return cost, EngineConfig(**kw)


def point_trace(p: Point, kv_budget: int | None = None) -> "Trace":
    """The trace a point runs: the head of ``p.n_tasks`` tasks, re-timed to ``p.rate`` with ``p.seed``
    (with ``p.rate`` None or NaN: at the trace's own times)."""
    path = resolve_trace_path(p.workload)
    trace = _read_trace(path)
    if p.n_tasks is not None:
        trace = trace.head(p.n_tasks)
    if kv_budget is not None:
        validate_trace(trace, source=str(path), kv_budget=kv_budget)
    if p.rate is None or not math.isfinite(p.rate):
        return trace
    return retime(trace, p.rate, p.seed)


def prefix_tokens(trace: "Trace") -> dict[str, int]:
    return {name: int(a.prefix_tokens) for name, a in trace.agents.items()}


#: The engine model of the simulated side: ``sglang`` = the simulator as configured for the server
#: (stock SGLang's behaviours, the default), ``legacy`` = the same with
#: :data:`topas.engine.config.LEGACY_ENGINE` (the engine model of the figures before issue 12).
ENGINE_MODELS = ("sglang", "legacy")


def simulate_point(p: Point, cost: "CostModel", config: "EngineConfig",
                   engine_model: str = "sglang") -> tuple["SimResult", "Trace"]:
    if engine_model not in ENGINE_MODELS:
        raise ValueError(f"unknown engine model {engine_model!r}; valid: {', '.join(ENGINE_MODELS)}")
    trace = point_trace(p, cost.kv_budget_tokens)
    policy = make_policy(p.policy, dict(p.params))
    if p.eviction_priority is not None:
        policy = apply_rule(policy, p.eviction_priority)
    if engine_model == "legacy":
        config = replace(config, **LEGACY_ENGINE)
    return simulate(trace, policy, cost, config), trace


def scale_cost(cost: "CostModel", factor: float) -> "CostModel":
    """The cost model with every compute time (prefill and decode coefficients) times ``factor``."""
    f = float(factor)
    if not (math.isfinite(f) and f > 0):
        raise ValueError(f"speed factor must be a finite number > 0, got {factor!r}")
    names = ("prefill_c0", "prefill_c_new", "prefill_c_new_cached", "prefill_c_new_sq", "prefill_c_cached_sq",
             "decode_c0", "decode_c_batch", "decode_c_kv")
    return replace(cost, name=f"{cost.name}*{f:.3f}", **{n: getattr(cost, n) * f for n in names})


def busy_calibration(p: Point, cost: "CostModel", config: "EngineConfig", busy_s: float,
                     engine_model: str = "sglang", iterations: int = 4) -> tuple[float, "SimResult"]:
    """The speed factor f for which the simulator, with the profile's times x f, keeps the engine
    busy as long as the server was busy during the run (its scheduler's non-idle time): a fixed
    point (the simulated batching changes with f), a few iterations from f = 1. Returns f and the
    calibrated run. One number per run rescales the whole time model; the JCTs, queueing, batching
    and cache hits stay the simulator's predictions."""
    f = 1.0
    res = None
    for _ in range(iterations):
        res, _ = simulate_point(p, scale_cost(cost, f), config, engine_model)
        sim_busy = float(res.summary.get("busy_time") or 0.0)
        if sim_busy <= 0 or not math.isfinite(busy_s) or busy_s <= 0:
            break
        f_new = f * busy_s / sim_busy
        if abs(f_new - f) < 0.005 * f:
            f = f_new
            res, _ = simulate_point(p, scale_cost(cost, f), config, engine_model)
            break
        f = f_new
    return f, res


def _row(p: Point, engine: str, repeat: int, metrics: Mapping[str, float], wall: float) -> dict[str, Any]:
    return {"workload": Path(p.workload).name.split(".")[0], "load": p.load_label,
            "rate": p.rate if p.rate is not None else float("nan"),
            "policy": p.policy, "seed": p.seed, "engine": engine, "repeat": repeat,
            "n_tasks_requested": p.n_tasks, **metrics, "wall_s": wall}


def run_fidelity(points: Sequence[Point], measure: Callable[[Point, int], "SimResult"], profile: "str | Path | CostModel",
                 out_dir: str | Path | None = None, repeats: int = 3, kv_budget: int | None = None,
                 settings: Mapping[str, Any] | None = None, bars: Mapping[str, float] | None = None,
                 meta: Mapping[str, Any] | None = None, raw: bool = True,
                 log: Callable[[str], None] | None = print, probe: Callable[[], float] | None = None,
                 engine_model: str = "sglang", calibrate: str = "busy") -> Comparison:
    """For each point: simulate once, measure ``repeats`` times (``measure(point, repeat)``), and
    compare. Writes the comparison into ``out_dir`` (and each run's tables under ``raw/`` when
    ``raw``) after every point, so an interrupted run leaves what it finished.

    With ``probe`` (e.g. :func:`speed_probe`), the server's speed relative to the profile is
    measured just before and just after every measured run, and the point is also simulated
    with the profile rescaled by the mean of the two (engine ``sim-calibrated``, one run per
    repeat); the comparison's main table then compares that, and ``comparison_static.csv`` the
    profile as measured. ``calibrate="busy"`` (the default) instead takes the factor from the
    server's own busy time during the run when the measured result has it (``server_busy_s``,
    from ``--enable-metrics``; see :func:`busy_calibration`), the probe only as a fallback;
    ``calibrate="probe"`` always uses the probe."""
    cost, config = sim_engine(profile, kv_budget, settings)
    rows: list[dict[str, Any]] = []
    pairs: list[pd.DataFrame] = []
    bars = dict(BENCHMARK_BARS if bars is None else bars)
    meta = {**(meta or {}), "profile": cost.name, "profile_hash": cost.profile_hash, "engine_model": engine_model,
            "calibrate": calibrate if probe or calibrate == "busy" else None,
            "profile_source": _portable_source(cost.meta.get("source", profile if not hasattr(profile, "name") else "")),
            "kv_budget_tokens": cost.kv_budget_tokens, "engine_config": dataclasses.asdict(config),
            "repeats": repeats, "host": platform.node(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    comp = None
    for i, p in enumerate(points):
        t0 = time.perf_counter()
        sim, trace = simulate_point(p, cost, config, engine_model)
        pt = prefix_tokens(trace)
        rows.append(_row(p, "sim", 0, run_metrics(sim, pt), time.perf_counter() - t0))
        measured, calibrated = [], []
        for rep in range(repeats):
            before = probe() if probe else None
            t0 = time.perf_counter()
            res = measure(p, rep)
            wall = time.perf_counter() - t0
            measured.append(res)
            m = run_metrics(res, pt)
            factor = None
            stages = res.summary.get("server_stage_s") or {}
            busy = res.summary.get("server_busy_s")
            extra = {f"server_{k}_s": v for k, v in stages.items()}
            if busy is not None:
                extra["server_busy_s"] = busy
            after = probe() if probe else None
            if busy is not None and calibrate == "busy":
                factor, csim = busy_calibration(p, cost, config, float(busy), engine_model)
            elif probe:
                factor = 0.5 * (before + after)
                csim, _ = simulate_point(p, scale_cost(cost, factor), config, engine_model)
            if factor is not None:
                calibrated.append(csim)
                rows.append({**_row(p, "sim-calibrated", rep, run_metrics(csim, pt), 0.0),
                             "speed_factor": factor, "probe_before": before, "probe_after": after,
                             "sim_busy_s": csim.summary.get("busy_time"), "server_busy_s": busy})
            rows.append({**_row(p, "sglang", rep, m, wall), **extra,
                         **({"speed_factor": factor, "probe_before": before, "probe_after": after}
                            if factor is not None else {})})
            if log:
                s = next((r for r in rows if r["engine"] == "sim" and r["policy"] == p.policy
                          and r["load"] == p.load_label and r["seed"] == p.seed
                          and r["workload"] == rows[-1]["workload"]), None) if rep == 0 else None
                log(f"[{i + 1}/{len(points)}] {p.workload} {p.policy} rate={p.rate if p.rate is not None else 'trace'} seed={p.seed} rep={rep}: "
                    f"measured mean JCT {m['jct_mean']:.3f} s, p99 {m['jct_p99']:.3f} s, cached {m['cached_tokens']:.0f}"
                    + (f" | sim {s['jct_mean']:.3f} s, p99 {s['jct_p99']:.3f} s, cached {s['cached_tokens']:.0f}" if s else "")
                    + (f" | speed x{factor:.2f}, calibrated sim {rows[-2]['jct_mean']:.3f} s" if factor else "")
                    + f" ({wall:.0f} s)")
            if raw and out_dir is not None:
                tag = f"{rows[-1]['workload']}_{p.policy}_{p.load_label:g}_s{p.seed}"
                res.to_parquet(Path(out_dir) / "raw" / "sglang" / f"{tag}_r{rep}")
                if rep == 0:
                    sim.to_parquet(Path(out_dir) / "raw" / "sim" / tag)
        tp = task_pairs([c.tasks for c in calibrated] or sim.tasks, [r.tasks for r in measured])
        pairs.append(tp.assign(workload=rows[-1]["workload"], load=p.load_label, policy=p.policy, seed=p.seed))
        comp = build_comparison(pd.DataFrame(rows), pd.concat(pairs, ignore_index=True), bars, meta)
        if out_dir is not None:
            write_comparison(comp, out_dir)
    if comp is None:
        raise ValueError("no points to compare")
    comp.meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if out_dir is not None:
        write_comparison(comp, out_dir)
    return comp


# ----------------------------------------------------------------------------- the CLI's helpers
def _floats(text: str | Sequence[float] | None, what: str) -> list[float]:
    if text is None:
        return []
    vals = [float(v) for v in (text.split(",") if isinstance(text, str) else text) if str(v).strip()]
    if not vals or any(not (math.isfinite(v) and v > 0) for v in vals):
        raise ValueError(f"{what} must be numbers > 0, got {text!r}")
    return vals


def fidelity_points(traces: Sequence[str], policies: Sequence[str], rates: str | Sequence[float] | None = None,
                    loads: str | Sequence[float] | None = None, seeds: str | Sequence[int] = "0",
                    n_tasks: int | None = None, params: Mapping[str, Any] | None = None) -> list[Point]:
    """The grid traces x loads (or rates) x policies x seeds. With ``loads``, a load ``x`` runs
    at ``x * meta["rate"]`` of each trace (the nominal rate), labelled ``x``; with ``rates`` the
    label is the rate. ``params`` go to every policy that accepts them (TOPAS's weights)."""
    if (rates is None) == (loads is None):
        raise ValueError("give exactly one of rates and loads")
    seeds_l = [int(s) for s in (seeds.split(",") if isinstance(seeds, str) else seeds) if str(s).strip()]
    if not policies:
        raise ValueError("no policies given")
    pts = []
    for wl in traces:
        nominal = None
        if loads is not None:
            nominal = _read_trace(resolve_trace_path(wl)).meta.get("rate")
            if not isinstance(nominal, (int, float)) or nominal <= 0:
                raise ValueError(f"trace {wl}: --loads needs the trace's nominal meta['rate']; give --rates")
        for x in (_floats(rates, "rates") if rates is not None else _floats(loads, "loads")):
            rate = x if nominal is None else x * float(nominal)
            for pol in policies:
                pp: dict[str, Any] = {}
                for k, v in dict(params or {}).items():
                    try:
                        make_policy(pol, {k: v})
                        pp[k] = v
                    except PolicyError:
                        pass
                make_policy(pol, pp)  # an unknown policy fails here, naming the valid ones
                for s in seeds_l:
                    pts.append(Point(wl, pol, rate=rate, seed=s, n_tasks=n_tasks, params=tuple(sorted(pp.items())),
                                     load=x))
    return pts


def server_kv_settings(server: str) -> dict[str, Any]:
    """The server's KV budget and scheduler settings (``/server_info``), for the simulator."""
    s = server_settings(ServerClient(server, timeout=30).server_info())
    s["host_tier"] = bool(s.get("enable_hierarchical_cache"))
    return s


def replay_measure(server: str, decision_log: str | Path | None = None, timeout_s: float = 3600.0,
                   pause_s: float = 2.5, warmup: bool = True,
                   handshake: bool = True) -> Callable[[Point, int], "SimResult"]:
    """``measure(point, repeat)`` replaying the point's trace on ``server`` with
    :func:`topas.sglang.replay.run_replay` (radix cache flushed first; the policy and its parameters
    travel with the requests, so one server serves every policy). ``pause_s``: an idle gap
    before the run and after it, before each snapshot of the scheduler's stage seconds
    (:func:`scheduler_seconds`): SGLang adds the time it accumulates to those counters at most
    once a second (``_SCHEDULER_TIME_ACCOUNTING_INTERVAL_NS`` in its ``metrics_reporter``; an
    idle scheduler wakes once a second), so a snapshot taken right after the run misses up to
    the run's last second of busy time. With 1 s gaps the measured busy time fell 0-1 s short
    (a run is busy 5-9 s), which biased the speed calibration 0-20% fast; > 2 s of idle before
    each snapshot flushes it all. The gap also keeps one run's tail off the next one's start. ``warmup``: before the
    first measured run, replay its point once and discard it (a fresh CPU server runs its first
    batches of each shape slowly, which queued requests and evicted prefixes in the first run
    only: 20 prefix hits of 36 against 27 on a warm server). ``handshake=False``: a stock SGLang
    server without the plugin (:func:`topas.sglang.replay.run_replay` then checks neither the
    plugin nor its decisions; SGLang's ``--schedule-policy`` schedules)."""
    warm = [not warmup]

    def measure(p: Point, repeat: int) -> "SimResult":
        trace = point_trace(p)
        if not warm[0]:
            warm[0] = True
            run_replay(Prepared(experiment=None, trace=trace, trace_path=Path(p.workload), rate=p.rate,
                                nominal_rate=None, policy=make_policy(p.policy, dict(p.params)), cost=None,
                                config=EngineConfig()), server, timeout_s=timeout_s, handshake=handshake,
                       eviction_priority=p.eviction_priority)
        prepared = Prepared(experiment=None, trace=trace, trace_path=Path(p.workload), rate=p.rate,
                            nominal_rate=None, policy=make_policy(p.policy, dict(p.params)), cost=None,
                            config=EngineConfig())
        if pause_s:
            time.sleep(pause_s)
        before = scheduler_seconds(server)
        res = run_replay(prepared, server, decision_log=decision_log, timeout_s=timeout_s, handshake=handshake,
                         eviction_priority=p.eviction_priority)
        if pause_s:
            time.sleep(pause_s)  # let the scheduler flush the run's last second into the counters
        after = scheduler_seconds(server)
        if before and after:
            stages = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
            res.summary["server_stage_s"] = stages
            res.summary["server_busy_s"] = sum(v for k, v in stages.items() if k != "idle")
        return res

    return measure


def resimulate(out_dir: str | Path, profile: "str | Path | CostModel | None" = None, engine_model: str = "sglang",
               traces_dir: str | Path | None = None, log: Callable[[str], None] | None = None) -> Comparison:
    """Rebuild a comparison from its measured runs (``runs.csv`` and ``raw/sglang/``) with the
    current engine model and profile: the static simulation once per point, the calibrated one
    per measured repeat with the speed factor recorded then. No server needed; used after a
    change of the engine model, so a fix is judged on the very runs that showed the problem."""
    d = Path(out_dir)
    old = read_comparison(d)
    meta = dict(old.meta)
    cost, config = stored_sim_engine(meta, profile)
    tdir = Path(traces_dir or TRACES_DIR)
    meas = old.runs[old.runs["engine"] == "sglang"]
    rows: list[dict[str, Any]] = []
    pairs = []
    for (wl, load, pol, seed), g in meas.groupby(["workload", "load", "policy", "seed"], sort=False):
        first = g.iloc[0]
        path = tdir / f"{wl}.json.gz"
        n = first.get("n_tasks_requested")
        p = Point(str(path) if path.exists() else wl, pol, rate=float(first["rate"]), seed=int(seed),
                  n_tasks=int(n) if n is not None and pd.notna(n) else None, load=float(load))
        sim, trace = simulate_point(p, cost, config, engine_model)
        pt = prefix_tokens(trace)
        rows.append(_row(p, "sim", 0, run_metrics(sim, pt), 0.0))
        rows[-1]["workload"] = wl
        tag = f"{wl}_{pol}_{float(load):g}_s{int(seed)}"
        for rec in g.to_dict("records"):  # the measured runs' metrics, recomputed from raw/ when there
            raw = d / "raw" / "sglang" / f"{tag}_r{int(rec['repeat'])}"
            if (raw / "requests.parquet").exists() and (raw / "tasks.parquet").exists():
                summ = pd.read_parquet(raw / "summary.parquet").iloc[0].to_dict() if (raw / "summary.parquet").exists() else {}
                res = SimResult(pd.read_parquet(raw / "tasks.parquet"), pd.read_parquet(raw / "requests.parquet"),
                                pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), summ)
                rec = {**rec, **run_metrics(res, pt)}
            rows.append(rec)
        calibrated = []
        for r in g.itertuples(index=False):
            f = getattr(r, "speed_factor", float("nan"))
            busy = getattr(r, "server_busy_s", float("nan"))
            if busy is not None and pd.notna(busy):
                f, csim = busy_calibration(p, cost, config, float(busy), engine_model)
            elif isinstance(f, float) and math.isfinite(f):
                csim, _ = simulate_point(p, scale_cost(cost, f), config, engine_model)
            if isinstance(f, float) and math.isfinite(f):
                calibrated.append(csim)
                rows.append({**_row(p, "sim-calibrated", int(r.repeat), run_metrics(csim, pt), 0.0),
                             "workload": wl, "speed_factor": f})
        measured = [pd.read_parquet(d / "raw" / "sglang" / f"{tag}_r{int(k)}" / "tasks.parquet")
                    for k in sorted(g["repeat"]) if (d / "raw" / "sglang" / f"{tag}_r{int(k)}" / "tasks.parquet").exists()]
        if measured:
            tp = task_pairs([c.tasks for c in calibrated] or sim.tasks, measured)
            pairs.append(tp.assign(workload=wl, load=float(load), policy=pol, seed=int(seed)))
        if log:
            log(f"resimulated {tag}")
    meta.update({"engine_model": engine_model, "profile": cost.name, "profile_hash": cost.profile_hash,
                 "resimulated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    comp = build_comparison(pd.DataFrame(rows), pd.concat(pairs, ignore_index=True) if pairs else None,
                            meta.get("bars"), meta, meta.get("rank_margin", 0.10))
    write_comparison(comp, d)
    return comp
