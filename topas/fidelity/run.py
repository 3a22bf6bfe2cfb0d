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
import json
import math
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import pandas as pd

from topas.fidelity.compare import (BENCHMARK_BARS, Comparison, build_comparison, run_metrics, task_pairs,
                                    write_comparison)

if TYPE_CHECKING:  # pragma: no cover
    from topas.engine.config import EngineConfig
    from topas.engine.cost import CostModel
    from topas.engine.metrics import SimResult
    from topas.workload.model import Trace

__all__ = ["Point", "sim_engine", "point_trace", "simulate_point", "run_fidelity"]


@dataclass(frozen=True)
class Point:
    """One compared point: a trace (name or file), a policy with parameters, an arrival rate
    (tasks/s), the arrival seed and the number of tasks (the trace's head)."""

    workload: str
    policy: str
    rate: float
    seed: int = 0
    n_tasks: int | None = None
    params: tuple[tuple[str, Any], ...] = ()
    #: the label of the load in the tables (the rate, or the multiple of the nominal rate)
    load: float | None = None

    @property
    def load_label(self) -> float:
        return self.load if self.load is not None else self.rate


def sim_engine(profile: "str | Path | CostModel", kv_budget: int | None = None,
               settings: Mapping[str, Any] | None = None) -> tuple["CostModel", "EngineConfig"]:
    """The simulator's cost model and config for a server: the profile with the server's KV budget
    (``kv_budget``, else the profile's), its chunked-prefill size and ``max_running_requests``,
    and no host tier unless the server has one (``settings["host_tier"]``)."""
    from topas.engine.config import EngineConfig
    from topas.engine.cost import CostModel, load_profile

    cost = profile if isinstance(profile, CostModel) else load_profile(profile)
    settings = dict(settings or cost.meta.get("server_settings") or {})
    budget = kv_budget or settings.get("kv_budget_tokens") or cost.kv_budget_tokens
    cost = cost.with_budget(int(budget)) if int(budget) != cost.kv_budget_tokens else cost
    kw: dict[str, Any] = {"host_tier": bool(settings.get("host_tier", False))}
    mrr = settings.get("max_running_requests")
    if isinstance(mrr, int) and mrr > 0:
        kw["max_running_requests"] = mrr
    return cost, EngineConfig(**kw)


def point_trace(p: Point, kv_budget: int | None = None) -> "Trace":
    """The trace a point runs: the head of ``p.n_tasks`` tasks, re-timed to ``p.rate`` with ``p.seed``."""
    from topas.experiments.spec import _read_trace, resolve_trace_path
    from topas.workload.arrivals import retime
    from topas.workload.validate import validate_trace

    path = resolve_trace_path(p.workload)
    trace = _read_trace(path)
    if p.n_tasks is not None:
        trace = trace.head(p.n_tasks)
    if kv_budget is not None:
        validate_trace(trace, source=str(path), kv_budget=kv_budget)
    return retime(trace, p.rate, p.seed)


def prefix_tokens(trace: "Trace") -> dict[str, int]:
    return {name: int(a.prefix_tokens) for name, a in trace.agents.items()}


def simulate_point(p: Point, cost: "CostModel", config: "EngineConfig") -> tuple["SimResult", "Trace"]:
    from topas.engine.simulator import simulate
    from topas.policies.base import make_policy

    trace = point_trace(p, cost.kv_budget_tokens)
    return simulate(trace, make_policy(p.policy, dict(p.params)), cost, config), trace


def _row(p: Point, engine: str, repeat: int, metrics: Mapping[str, float], wall: float) -> dict[str, Any]:
    return {"workload": Path(p.workload).name.split(".")[0], "load": p.load_label, "rate": p.rate,
            "policy": p.policy, "seed": p.seed, "engine": engine, "repeat": repeat,
            "n_tasks_requested": p.n_tasks, **metrics, "wall_s": wall}


def run_fidelity(points: Sequence[Point], measure: Callable[[Point, int], "SimResult"], profile: "str | Path | CostModel",
                 out_dir: str | Path | None = None, repeats: int = 3, kv_budget: int | None = None,
                 settings: Mapping[str, Any] | None = None, bars: Mapping[str, float] | None = None,
                 meta: Mapping[str, Any] | None = None, raw: bool = True,
                 log: Callable[[str], None] | None = print) -> Comparison:
    """For each point: simulate once, measure ``repeats`` times (``measure(point, repeat)``), and
    compare. Writes the comparison into ``out_dir`` (and each run's tables under ``raw/`` when
    ``raw``) after every point, so an interrupted run leaves what it finished."""
    cost, config = sim_engine(profile, kv_budget, settings)
    rows: list[dict[str, Any]] = []
    pairs: list[pd.DataFrame] = []
    bars = dict(BENCHMARK_BARS if bars is None else bars)
    meta = {**(meta or {}), "profile": cost.name, "profile_hash": cost.profile_hash,
            "kv_budget_tokens": cost.kv_budget_tokens, "engine_config": dataclasses.asdict(config),
            "repeats": repeats, "host": platform.node(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    comp = None
    for i, p in enumerate(points):
        t0 = time.perf_counter()
        sim, trace = simulate_point(p, cost, config)
        pt = prefix_tokens(trace)
        rows.append(_row(p, "sim", 0, run_metrics(sim, pt), time.perf_counter() - t0))
        measured = []
        for rep in range(repeats):
            t0 = time.perf_counter()
            res = measure(p, rep)
            wall = time.perf_counter() - t0
            measured.append(res)
            m = run_metrics(res, pt)
            rows.append(_row(p, "sglang", rep, m, wall))
            if log:
                s = rows[-1 - rep - 1] if rep == 0 else None
                log(f"[{i + 1}/{len(points)}] {p.workload} {p.policy} rate={p.rate:g} seed={p.seed} rep={rep}: "
                    f"measured mean JCT {m['jct_mean']:.3f} s, p99 {m['jct_p99']:.3f} s, cached {m['cached_tokens']:.0f}"
                    + (f" | sim {s['jct_mean']:.3f} s, p99 {s['jct_p99']:.3f} s, cached {s['cached_tokens']:.0f}" if s else "")
                    + f" ({wall:.0f} s)")
            if raw and out_dir is not None:
                tag = f"{rows[-1]['workload']}_{p.policy}_{p.load_label:g}_s{p.seed}"
                res.to_parquet(Path(out_dir) / "raw" / "sglang" / f"{tag}_r{rep}")
                if rep == 0:
                    sim.to_parquet(Path(out_dir) / "raw" / "sim" / tag)
        tp = task_pairs(sim.tasks, [r.tasks for r in measured])
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
