"""Contention fidelity: agents' prefixes compete for a KV pool that holds about two of them; the
simulator against the real server, request by request.

The JCT suites (:mod:`topas.fidelity.run`) pass on pools where prefixes are rarely evicted; what
the paper is about (which prefixes stay cached when they do not all fit) shows only per request.
Here every measured run is replayed with the server's per-request record (``cached_tokens`` from
``meta_info``; the prefill batch it entered, ``forward_entry_time``; when it finished) and compared
with the simulation of the same trace (calibrated to that run's speed, as in
:func:`topas.fidelity.run.run_fidelity`, which runs the points and writes the JCT comparison):

* **hit/miss**: a request *hits* when the server reports at least its agent's prefix cached
  (SGLang's ``cached_tokens``: prompt tokens found in the radix cache when its prefill was
  scheduled, summed over its admissions); in the simulator, its ``cached_tokens`` column when the
  engine has one, else its ``prefix_hit`` (prefix resident before the decision that admitted it,
  the older definition);
* **admission waves**: requests admitted in the same prefill batch form a wave (the server: one
  ``forward_entry_time``; the simulator: one ``first_admit``); waves are numbered 0, 1, ... in
  time order and compared per request (meaningful for scripted bursts, where arrival noise does
  not move them);
* **completion order**: the fraction of request pairs that finish in the same order in both
  (pairs that the simulator finishes in the same step do not count).

The simulation is timed by the arrivals the server saw (:data:`ARRIVALS`): by default when its
tokenizer manager received each task's first request; ``scheduler`` / ``scheduler-mid`` when that
request entered the scheduler's waiting queue (``server_queued``, recorded by the replay since
issue 12's follow-up) or the middle of its way there. The server's own noise is the same
agreement between its repeats. Cases (:data:`CASES`): scripted
bursts (each agent's requests at t=0, a few ms apart so their order is fixed) and Poisson traces;
modes (:data:`MODES`): the topas plugin running FCFS, LPM and TOPAS, and stock SGLang (no plugin)
with ``--schedule-policy fcfs`` or ``lpm``, simulated with topas's FCFS and LPM.

Run by ``scripts/fidelity_contention.py`` (``make fidelity-contention``); results under
``data/results/fidelity/contention/``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from topas.paths import REPO_ROOT

if TYPE_CHECKING:  # pragma: no cover
    from topas.workload.model import Trace

__all__ = ["Case", "Mode", "CASES", "MODES", "case_trace", "request_hits", "admission_waves",
           "request_table", "agreement", "run_noise", "compare_runs", "summarize"]

OUT_DIR = REPO_ROOT / "data" / "results" / "fidelity" / "contention"


@dataclass(frozen=True)
class Case:
    """A contention case: ``agents`` agents with ``prefix_tokens``-token prefixes on a pool of
    ``pool_tokens`` (about two prefixes plus a few requests).

    ``kind="burst"``: ``per_agent`` single-stage requests per agent, interleaved by agent
    (a1 b1 c1 a2 b2 ...), arriving ``gap_s`` apart from t=0; ``kind="poisson"``: ``n_tasks`` tasks
    of the synthetic ``shape`` (one stage per agent) with Poisson arrivals of ``rate`` tasks/s
    from ``seed``."""

    name: str
    kind: str
    agents: int
    prefix_tokens: int
    input_tokens: int
    output_tokens: int
    pool_tokens: int
    per_agent: int = 0
    gap_s: float = 0.002
    shape: str = "chain-3"
    n_tasks: int = 0
    rate: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("burst", "poisson"):
            raise ValueError(f"case {self.name!r}: kind must be 'burst' or 'poisson', got {self.kind!r}")
        if self.kind == "burst" and self.per_agent < 1:
            raise ValueError(f"case {self.name!r}: a burst needs per_agent >= 1")
        if self.kind == "poisson" and (self.n_tasks < 1 or not self.rate > 0):
            raise ValueError(f"case {self.name!r}: a Poisson case needs n_tasks >= 1 and rate > 0")


@dataclass(frozen=True)
class Mode:
    """How the server schedules: the topas plugin running the run's policy (``plugin=True``), or
    stock SGLang with ``--schedule-policy schedule_policy`` (simulated with topas's policy of the
    same name)."""

    name: str
    plugin: bool
    schedule_policy: str | None = None
    policies: tuple[str, ...] = ("fcfs", "lpm", "topas")


#: The pool of every case: two 1,024-token prefixes plus about four requests' KV and reservations.
POOL = 2 * 1024 + 640

CASES: dict[str, Case] = {c.name: c for c in (
    # three agents, three requests each, at t=0 (2 ms apart): the first prefill runs alone, the
    # rest queue behind it and compete for a pool that holds two prefixes
    Case("burst-3x3", "burst", agents=3, prefix_tokens=1024, input_tokens=64, output_tokens=16,
         pool_tokens=POOL, per_agent=3),
    # four agents, two requests each
    Case("burst-4x2", "burst", agents=4, prefix_tokens=1024, input_tokens=64, output_tokens=16,
         pool_tokens=POOL, per_agent=2),
    # the burst of make test-sglang (tests_sglang/test_server.py), on that server's 4,096-token pool
    Case("burst-ci", "burst", agents=3, prefix_tokens=1536, input_tokens=64, output_tokens=16,
         pool_tokens=4096, per_agent=3),
    # Chain-3 tasks (agents A -> B -> C) arriving as a Poisson process
    Case("poisson-chain3", "poisson", agents=3, prefix_tokens=1024, input_tokens=64, output_tokens=16,
         pool_tokens=POOL, shape="chain-3", n_tasks=16, rate=2.0, seed=0),
    # the same at half the load: fewer tasks overlap, so fewer evictions race with finishes
    Case("poisson-chain3-slow", "poisson", agents=3, prefix_tokens=1024, input_tokens=64, output_tokens=16,
         pool_tokens=POOL, shape="chain-3", n_tasks=16, rate=1.0, seed=0),
)}

MODES: dict[str, Mode] = {m.name: m for m in (
    Mode("plugin", plugin=True),
    Mode("sglang-fcfs", plugin=False, schedule_policy="fcfs", policies=("fcfs",)),
    Mode("sglang-lpm", plugin=False, schedule_policy="lpm", policies=("lpm",)),
)}


# ----------------------------------------------------------------------------- traces
def case_trace(case: Case) -> "Trace":
    """The case's trace (deterministic)."""
    from topas.workload.model import Agent, Stage, Task, Trace
    from topas.workload.synthetic import generate
    from topas.workload.validate import validate_trace

    if case.kind == "poisson":
        t = generate(case.shape, case.n_tasks, case.rate, case.seed, case.prefix_tokens, case.input_tokens,
                     case.output_tokens)
        if len(t.agents) != case.agents:
            raise ValueError(f"case {case.name!r}: shape {case.shape} has {len(t.agents)} agents, not {case.agents}")
        trace = Trace(name=case.name, agents=t.agents, tasks=t.tasks,
                      meta={**dict(t.meta), "description": f"contention case {case.name} (topas.fidelity.contention)"})
    else:
        names = [f"{case.name}.{chr(ord('a') + k)}" for k in range(case.agents)]
        agents = {n: Agent(n, case.prefix_tokens, float(case.output_tokens)) for n in names}
        tasks = []
        for i in range(case.per_agent):
            for k, n in enumerate(names):
                j = i * case.agents + k
                tasks.append(Task(id=f"t{j:03d}", arrival=round(j * case.gap_s, 6), workflow="burst",
                                  stages=(Stage("s", n, case.input_tokens, case.output_tokens),)))
        trace = Trace(name=case.name, agents=agents, tasks=tuple(tasks),
                      meta={"description": f"contention burst {case.name}: {case.per_agent} requests of each of "
                                           f"{case.agents} agents, {case.gap_s * 1e3:g} ms apart (topas.fidelity.contention)",
                            "generator": "topas.fidelity.contention.case_trace"})
    validate_trace(trace, kv_budget=case.pool_tokens)
    return trace


def write_case_trace(case: Case, out_dir: str | Path = OUT_DIR / "traces") -> Path:
    from topas.workload.trace_io import write_trace

    Path(out_dir).mkdir(parents=True, exist_ok=True)
    return write_trace(case_trace(case), Path(out_dir) / f"{case.name}.json.gz")


# ----------------------------------------------------------------------------- per request
def request_hits(requests: pd.DataFrame, prefix_tokens: Mapping[str, int]) -> pd.Series:
    """Per request (indexed by ``rid``): did it find its agent's whole prefix cached? From
    ``cached_tokens`` where the table has it (server; the simulator once it reports it), else
    ``prefix_hit``."""
    need = requests["agent"].map(lambda a: prefix_tokens[a]).astype(float)
    cached = pd.to_numeric(requests["cached_tokens"], errors="coerce") if "cached_tokens" in requests else None
    if cached is not None and cached.notna().all():
        hit = cached.to_numpy(dtype=float) >= need.to_numpy()
    elif "prefix_hit" in requests:
        hit = requests["prefix_hit"].fillna(False).astype(bool).to_numpy()
    else:
        raise ValueError("requests table has neither cached_tokens nor prefix_hit")
    return pd.Series(hit, index=requests["rid"].to_numpy(), name="hit")


def admission_waves(requests: pd.DataFrame, column: str | None = None, tol: float = 1e-6) -> pd.Series:
    """Per request: the number of its admission wave (0 = the first prefill batch of the run).
    ``column``: the admission time (default ``server_admitted`` when filled, else ``first_admit``);
    times within ``tol`` of each other are one wave."""
    if column is None:
        column = "server_admitted" if "server_admitted" in requests and requests["server_admitted"].notna().all() \
            else "first_admit"
    t = pd.to_numeric(requests[column], errors="coerce").to_numpy(dtype=float)
    order = np.argsort(t, kind="stable")
    waves = np.full(len(t), -1, dtype=int)
    wave, last = -1, -math.inf
    for i in order:
        if not math.isfinite(t[i]):
            continue
        if t[i] - last > tol:
            wave += 1
            last = t[i]
        waves[i] = wave
    return pd.Series(waves, index=requests["rid"].to_numpy(), name="wave")


def _finish(requests: pd.DataFrame) -> pd.Series:
    col = "server_finished" if "server_finished" in requests and requests["server_finished"].notna().all() else "finish"
    return pd.Series(pd.to_numeric(requests[col], errors="coerce").to_numpy(dtype=float),
                     index=requests["rid"].to_numpy(), name="finish")


def request_table(sim: pd.DataFrame, measured: pd.DataFrame, prefix_tokens: Mapping[str, int]) -> pd.DataFrame:
    """One row per request: hit, wave and finish time in the simulation and on the server."""
    s, m = sim.set_index("rid", drop=False), measured.set_index("rid", drop=False)
    rids = [r for r in m.index if r in s.index]
    if len(rids) != len(m) or len(rids) != len(s):
        raise ValueError(f"the simulated and measured runs have different requests ({len(s)} vs {len(m)}, {len(rids)} shared)")
    s, m = s.loc[rids].reset_index(drop=True), m.loc[rids].reset_index(drop=True)
    out = pd.DataFrame({"rid": rids, "agent": m["agent"].to_numpy()})
    for tag, t in (("sim", s), ("server", m)):
        out[f"hit_{tag}"] = request_hits(t, prefix_tokens).to_numpy()
        out[f"cached_{tag}"] = (pd.to_numeric(t["cached_tokens"], errors="coerce").to_numpy(dtype=float)
                                if "cached_tokens" in t else np.nan)
        out[f"wave_{tag}"] = admission_waves(t).to_numpy()
        out[f"finish_{tag}"] = _finish(t).to_numpy()
    return out


def order_agreement(a: Sequence[float], b: Sequence[float], tol: float = 1e-9) -> float:
    """The fraction of pairs ordered alike by ``a`` and ``b`` among the pairs ``a`` orders
    (|a_i - a_j| > tol); NaN when there are none."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    i, j = np.triu_indices(len(a), 1)
    da, db = a[i] - a[j], b[i] - b[j]
    keep = np.abs(da) > tol
    if not keep.any():
        return float("nan")
    return float(np.mean(np.sign(da[keep]) == np.sign(db[keep])))


def agreement(tab: pd.DataFrame) -> dict[str, Any]:
    """How a request table's two sides agree: hit/miss (fraction, and the two miss sets),
    admission waves (fraction of requests in the same wave), completion order (pairs)."""
    miss_sim = sorted(tab.loc[~tab["hit_sim"], "rid"])
    miss_server = sorted(tab.loc[~tab["hit_server"], "rid"])
    return {
        "n_requests": int(len(tab)),
        "hit_agree": float((tab["hit_sim"] == tab["hit_server"]).mean()),
        "misses_sim": len(miss_sim), "misses_server": len(miss_server),
        "same_misses": miss_sim == miss_server,
        "miss_only_sim": " ".join(r for r in miss_sim if r not in miss_server),
        "miss_only_server": " ".join(r for r in miss_server if r not in miss_sim),
        "waves_sim": int(tab["wave_sim"].max() + 1), "waves_server": int(tab["wave_server"].max() + 1),
        "wave_agree": float((tab["wave_sim"] == tab["wave_server"]).mean()),
        "order_agree": order_agreement(tab["finish_sim"], tab["finish_server"]),
    }


def run_noise(measured: Sequence[pd.DataFrame], prefix_tokens: Mapping[str, int]) -> dict[str, float]:
    """The server against itself: the mean over pairs of repeats of :func:`agreement` (one repeat
    as the 'simulation' of the other); NaN with fewer than two repeats."""
    keys = ("hit_agree", "wave_agree", "order_agree")
    if len(measured) < 2:
        return {f"noise_{k}": float("nan") for k in keys}
    vals: dict[str, list[float]] = {k: [] for k in keys}
    for i in range(len(measured)):
        for j in range(i + 1, len(measured)):
            ag = agreement(request_table(measured[i], measured[j], prefix_tokens))
            for k in keys:
                vals[k].append(ag[k])
    return {f"noise_{k}": float(np.nanmean(v)) if v else float("nan") for k, v in vals.items()}


def observed_trace(trace: "Trace", measured: pd.DataFrame, lead_s: float = 0.0,
                   column: str = "server_received") -> tuple["Trace", int]:
    """``trace`` with each task arriving when the server saw its first request, tasks re-sorted by
    it, and how many tasks fell back to an earlier point of the path or kept the trace's time.

    ``column`` says which point: ``server_received`` (the tokenizer manager received the request;
    ``lead_s`` is then the part of the request path the simulator adds before a root reaches the
    scheduler, half of ``EngineConfig.request_latency_s``, and is subtracted so that the simulated
    root reaches the scheduler when the server's tokenizer got it) or ``server_queued`` (the
    request entered the scheduler's waiting queue, :func:`topas.sglang.replay.scheduler_arrival`;
    ``lead_s`` is subtracted the same way, so the simulated root enters the waiting queue exactly
    then). A task is timed by the earliest of its roots; one whose roots lack ``column`` uses
    ``server_received`` instead, and one with neither keeps its trace arrival (both counted).

    Only roots are pinned: a later stage of a multi-stage task still becomes ready when the
    simulation finishes its parents (the engine has no per-request release time), so for
    Poisson Chain-3 cases the scheduler arrivals time the task roots only.

    On a loaded machine the replay client sends a burst's requests tens of ms late and unevenly,
    and which requests wait together at a decision is what a policy decides on: with the arrivals
    the server saw, the simulator is judged on the scheduling, not on the client's timing."""
    from topas.workload.model import Task, Trace

    def col(name: str) -> dict[str, float]:
        if name not in measured:
            return {}
        return dict(zip(measured["rid"], pd.to_numeric(measured[name], errors="coerce")))

    main, fallback = col(column), col("server_received")
    tasks, fell_back = [], 0
    for t in trace.tasks:
        roots = [f"{t.id}/{s.id}" for s in t.stages if not s.parents]
        times = [x for x in (main.get(r, math.nan) for r in roots) if math.isfinite(x)]
        if not times and column != "server_received":
            times = [x for x in (fallback.get(r, math.nan) for r in roots) if math.isfinite(x)]
            fell_back += 1
        elif not times:
            fell_back += 1
        arrival = max(min(times) - lead_s, 0.0) if times else t.arrival
        tasks.append(Task(id=t.id, arrival=float(arrival), stages=t.stages, workflow=t.workflow))
    tasks.sort(key=lambda t: t.arrival)
    return Trace(name=trace.name, agents=trace.agents, tasks=tuple(tasks), meta=dict(trace.meta)), fell_back


def ingest_window_mid(measured: pd.DataFrame, tol: float = 1e-6) -> pd.Series:
    """Per request: the middle of the interval in which it reached the scheduler's socket.

    SGLang's event loop takes new requests only at the start of an iteration
    (``recv_requests``), so ``server_queued`` is the start of the first iteration *after* the
    request arrived: it arrived after the previous iteration started. The known iteration starts
    of a run are its requests' ``server_queued`` and ``server_admitted`` (a prefill batch is
    scheduled right after the requests are taken in); decode-only iterations leave no
    timestamp. The interval is (the later of the request's ``server_received`` and the last known
    iteration start before its ``server_queued``, ``server_queued``]; NaN without
    ``server_queued``. Unlike ``server_queued`` itself (an iteration boundary, where a simulation
    whose batch ends a little earlier or later takes the request one iteration apart), the
    middle lies inside the server's iteration, which the simulation's speed calibration keeps
    roughly in place."""
    def col(name: str) -> np.ndarray:
        return (pd.to_numeric(measured[name], errors="coerce").to_numpy(dtype=float) if name in measured
                else np.full(len(measured), np.nan))

    queued, received = col("server_queued"), col("server_received")
    starts = np.concatenate([queued, col("server_admitted")])
    starts = np.sort(starts[np.isfinite(starts)])
    out = np.full(len(measured), np.nan)
    for i, q in enumerate(queued):
        if not math.isfinite(q):
            continue
        before = starts[starts < q - tol]
        lo = before[-1] if len(before) else -math.inf
        if math.isfinite(received[i]):
            lo = max(lo, received[i])
        out[i] = 0.5 * (lo + q) if math.isfinite(lo) else q
    return pd.Series(out, index=measured.index, name="server_ingest_mid")


#: How the simulated side of a per-request comparison is timed: ``observed`` = each task arrives
#: when the server's tokenizer manager received its first request (``server_received``),
#: ``scheduler`` = when that request entered the scheduler's waiting queue (``server_queued``,
#: :func:`topas.sglang.replay.scheduler_arrival`; runs measured without it fall back to
#: ``observed`` per task), ``scheduler-mid`` = the middle of the interval in which it reached the
#: scheduler (:func:`ingest_window_mid`; same fallback), ``trace`` = at the trace's (Poisson or
#: scripted) times, as the replay client meant to send them. See :func:`observed_trace`.
ARRIVALS = ("observed", "scheduler", "scheduler-mid", "trace")
ARRIVAL_COLUMN = {"observed": "server_received", "scheduler": "server_queued",
                  "scheduler-mid": "server_ingest_mid"}


# ----------------------------------------------------------------------------- stored runs
def _raw(d: Path, tag: str, rep: int) -> pd.DataFrame | None:
    f = d / "raw" / "sglang" / f"{tag}_r{rep}" / "requests.parquet"
    return pd.read_parquet(f) if f.exists() else None


def compare_runs(run_dir: str | Path, case: Case, mode: str, engine_model: str = "sglang",
                 traces_dir: str | Path | None = None, arrivals: str = "observed") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per request and per run, for one case's runs on one server mode (``run_dir``: what
    :func:`topas.fidelity.run.run_fidelity` wrote): each measured repeat against the simulation
    calibrated to that repeat's speed (its ``speed_factor`` in ``runs.csv``), with
    ``engine_model``, timed by ``arrivals`` (:data:`ARRIVALS`). Returns (requests, runs): the
    request tables of every repeat, and one row per (policy, repeat) with :func:`agreement` and
    the server's noise (:func:`run_noise`)."""
    import tempfile

    from topas.fidelity.compare import read_comparison
    from topas.fidelity.run import Point, prefix_tokens, scale_cost, simulate_point, stored_sim_engine
    from topas.workload.trace_io import write_trace

    if arrivals not in ARRIVALS:
        raise ValueError(f"unknown arrivals {arrivals!r}; valid: {', '.join(ARRIVALS)}")
    tmp = Path(tempfile.mkdtemp(prefix="topas-contention-"))

    d = Path(run_dir)
    comp = read_comparison(d)
    meta = comp.meta
    cost, config = stored_sim_engine(meta)
    trace_file = Path(traces_dir or OUT_DIR / "traces") / f"{case.name}.json.gz"
    runs = comp.runs
    req_rows, run_rows = [], []
    for pol, g in runs[runs["engine"] == "sglang"].groupby("policy", sort=True):
        cal = runs[(runs["engine"] == "sim-calibrated") & (runs["policy"] == pol)].set_index("repeat")
        first = g.iloc[0]
        tag = f"{first['workload']}_{pol}_{float(first['load']):g}_s{int(first['seed'])}"
        p = Point(str(trace_file), pol, rate=_rate(case), seed=int(first["seed"]), load=float(first["load"]))
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
                          seed=p.seed, load=p.load)
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
    import shutil

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
    import time

    from topas.fidelity import compare as fc
    from topas.fidelity.cpu_server import cpu_server
    from topas.fidelity.run import Point, replay_measure, run_fidelity, server_kv_settings

    out = Path(out_dir)
    traces = {c.name: write_case_trace(c, out / "traces") for c in cases}
    slog = Path(server_log_dir or "/tmp")
    for pool in sorted({c.pool_tokens for c in cases}):
        pcases = [c for c in cases if c.pool_tokens == pool]
        for mode in modes:
            dlog = slog / f"topas_contention_{mode.name}_{int(time.time())}.jsonl" if mode.plugin else None
            with cpu_server(log_path=slog / f"topas_contention_{mode.name}.server.log", decision_log=dlog,
                            max_total_tokens=pool, plugin=mode.plugin, schedule_policy=mode.schedule_policy,
                            profile=profile if plugin_profile and mode.plugin else None) as url:
                settings = server_kv_settings(url)
                if int(settings["kv_budget_tokens"]) != pool:
                    raise RuntimeError(f"the server's pool is {settings['kv_budget_tokens']} tokens, asked for {pool}")
                for c in pcases:
                    pts = [Point(str(traces[c.name]), pol, rate=_rate(c), seed=c.seed, load=c.rate if c.kind == "poisson" else 0.0)
                           for pol in mode.policies]
                    if log:
                        log(f"== {c.name} on {mode.name} (pool {pool}): {', '.join(mode.policies)} x {repeats}")
                    run_fidelity(pts, replay_measure(url, decision_log=dlog, handshake=mode.plugin), profile, out / c.name / mode.name,
                                 repeats=repeats, settings=settings, bars=fc.BENCHMARK_BARS,
                                 meta={"case": c.name, "mode": mode.name, "schedule_policy": mode.schedule_policy,
                                       "plugin": mode.plugin, "server": "CPU test server (topas.fidelity.contention)"},
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
    from topas.fidelity.compare import compare, rank_agreement, read_comparison

    out = Path(out_dir)
    tag = tag or engine_model
    reqs, runs, jcts, ranks = [], [], [], []
    for c in cases:
        for mode in modes:
            d = out / c.name / mode.name
            if not (d / "runs.csv").exists():
                continue
            r, g = compare_runs(d, c, mode.name, engine_model, out / "traces", arrivals)
            reqs.append(r)
            runs.append(g)
            comp = read_comparison(d)
            rs = _resimulated_runs(comp.runs, d, c, engine_model, out / "traces")
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


def _resimulated_runs(runs: pd.DataFrame, d: Path, case: Case, engine_model: str, traces_dir: Path) -> pd.DataFrame:
    """The runs table with its ``sim-calibrated`` rows recomputed with ``engine_model`` (the
    measured rows as stored), so the JCT comparison follows the engine model being judged."""
    from topas.fidelity.compare import read_comparison, run_metrics
    from topas.fidelity.run import Point, prefix_tokens, scale_cost, simulate_point, stored_sim_engine

    meta = read_comparison(d).meta
    cost, config = stored_sim_engine(meta)
    trace_file = traces_dir / f"{case.name}.json.gz"
    keep = runs[runs["engine"] != "sim-calibrated"]
    new = []
    for r in runs[runs["engine"] == "sim-calibrated"].to_dict("records"):
        p = Point(str(trace_file), r["policy"], rate=_rate(case), seed=int(r["seed"]), load=float(r["load"]))
        f = float(r["speed_factor"])
        sim, trace = simulate_point(p, scale_cost(cost, f), config, engine_model)
        new.append({**r, **run_metrics(sim, prefix_tokens(trace))})
    return pd.concat([keep, pd.DataFrame(new)], ignore_index=True)


def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)
