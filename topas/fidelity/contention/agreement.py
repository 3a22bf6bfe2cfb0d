"""The simulator against the server, request by request: prefix hits, admission waves, completion
order, the server's own noise between repeats, and the arrivals a simulation is timed by."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from topas.workload.model import Task, Trace


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
    """How a request table's two sides agree: cached tokens (the fraction of requests with equal
    ``cached_tokens``), hit/miss (fraction, and the two miss sets),
    admission waves (fraction of requests in the same wave), completion order (pairs)."""
    reported = tab["cached_sim"].notna().all() and tab["cached_server"].notna().all()
    cached_agree = float((tab["cached_sim"] == tab["cached_server"]).mean()) if reported else math.nan
    miss_sim = sorted(tab.loc[~tab["hit_sim"], "rid"])
    miss_server = sorted(tab.loc[~tab["hit_server"], "rid"])
    return {
        "n_requests": int(len(tab)),
        # the tokens served from the cache, request by request (NaN unless both sides report them)
        "cached_agree": cached_agree,
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
