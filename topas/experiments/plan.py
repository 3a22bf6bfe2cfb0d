"""How long a sweep of replays takes, before it starts.

A replay on a real SGLang server submits each task at its arrival time, so it lasts at least until
its last arrival (:func:`last_arrival`, after re-timing), whatever the hardware; then it drains the
tasks still running, and the client spends a little time around it (health check, handshake,
``/flush_cache``, the plugin's decision count after the run, storing the result). The plan
(:func:`estimate_replays`) takes each replay's expected wall time as

    last arrival + drain + :data:`REPLAY_OVERHEAD_S`,

the drain being the simulator's prediction (its twin: the same experiment on ``engine="sim"``,
with the server's KV pool and a profile of the server's kind: :func:`twin`), read from the results
store (and its packs) or simulated when the store lacks it (at most ``simulate_max`` twins; past
that the missing drains count as 0 and the plan says so). All the replays still to run go into
one pool (:func:`topas.sglang.pool.schedule`, the very rule :func:`topas.sglang.pool.map_on_servers`
follows: longest first, each to the first free server), so the planned wall time on N servers is
when the pool's last replay ends. :func:`replay_order` gives the pool the same durations.
``scripts/reproduce.py`` prints the plan (:func:`plan_lines`); past a threshold it asks for ``--yes``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from topas.experiments.local import run_many
from topas.experiments.replay_time import _PLANNED, _arrivals, arrival_span, last_arrival, replay_order  # noqa: F401
from topas.experiments.result_store import ResultStore
from topas.experiments.spec import Experiment, prepare
from topas.experiments.store_layout import default_packs, default_store_root
from topas.sglang.pool import schedule

__all__ = ["arrival_span", "last_arrival", "REPLAY_OVERHEAD_S", "ReplayEstimate", "twin", "estimate_replays",
           "replay_order", "Stage", "wall_on_servers", "plan_lines", "format_hours", "CPU_PROFILE"]

#: Seconds a replay costs besides its arrivals and drain (the health check, the plugin handshake,
#: ``/flush_cache``, reading the plugin's decision count after the run, writing the result).
#: Measured on two CPU stand-in servers that sleep when idle (``--sleep-on-idle``; docs/gpu.md),
#: the afternoon grid with one task per replay: each replay's wall time exceeds its makespan by
#: 1.01-1.02 s (20 of 20 replays), and the pool of 20 took 88.1 s on 2 servers for 153 s of
#: makespans, 1.15 s per replay in all. (Beside stand-ins that spun a core each, it was 1-4 s.)
REPLAY_OVERHEAD_S = 1.2
#: The profile the plan's twins use for a CPU server (the stand-in's measured profile).
CPU_PROFILE = Path(__file__).resolve().parents[2] / "data" / "profiles" / "cpu_tiny-llama.json"
@dataclass(frozen=True)
class ReplayEstimate:
    """One replay's expected wall time (seconds): its arrivals, its drain, the overhead."""

    label: str
    arrivals: float
    drain: float | None  # None: not predicted (counted as 0)
    overhead: float = REPLAY_OVERHEAD_S

    @property
    def wall(self) -> float:
        return self.arrivals + (self.drain or 0.0) + self.overhead


def twin(exp: Experiment, device: str | None = None, kv_pool: int | None = None) -> Experiment:
    """The simulated twin of a replay, whose drain the plan takes: ``engine="sim"``, the server's KV
    pool (``kv_pool``) and, for a CPU server (``device`` ``"cpu ..."``), the CPU stand-in's measured
    profile (:data:`CPU_PROFILE`) instead of the experiment's GPU profile."""
    kw: dict[str, Any] = {"engine": "sim"}
    if device is not None and device.strip().lower().startswith("cpu"):  # e.g. "cpu (x86_64)"
        kw["profile"] = str(CPU_PROFILE)
        if kv_pool:
            kw["kv_budget"] = int(kv_pool)
    return replace(exp, **kw)


def _drain(row: Mapping[str, Any], exp: Experiment) -> float:
    """The twin's drain: its last finish after the last arrival (``makespan`` runs from the first arrival)."""
    a = _arrivals(exp)
    first = min(a, default=0.0)
    return max(0.0, first + float(row["makespan"]) - last_arrival(exp))


def twin_store() -> Any:
    """Where the plan keeps the twins it simulates: ``plan-twins`` beside the working store (never
    in it, where they would count as the reproduction's runs), reading the shipped packs too."""
    return ResultStore(default_store_root().parent / "plan-twins", packs=default_packs())


def estimate_replays(exps: Sequence[Experiment], device: str | None = None, kv_pool: int | None = None,
                     simulate_max: int = 60, overhead: float = REPLAY_OVERHEAD_S, store: Any = None,
                     jobs: int | None = None) -> list[ReplayEstimate]:
    """Each replay's :class:`ReplayEstimate` (module docstring). The twins' results are read from
    ``store`` (default: the plan's own store and the shipped packs, whatever ``$TOPAS_USE_PACKS``
    says) and the missing ones simulated and stored when there are at most ``simulate_max``
    (default store: :func:`twin_store`)."""
    store = store if store is not None else twin_store()
    twins = [twin(e, device, kv_pool) for e in exps]
    missing = [t for t in twins if not store.has(t)]
    rows: dict[str, Mapping[str, Any]] = {}
    if len(missing) <= simulate_max:
        for t, r in zip(twins, run_many(twins, jobs=jobs, progress=False, store=store)):
            rows[t.key()] = r
    else:  # too many to simulate before a plan: only the stored ones
        have = [t for t in twins if store.has(t)]
        for t, r in zip(have, store.rows([t.key() for t in have])):
            rows[t.key()] = r
    out = []
    for e, t in zip(exps, twins):
        r = rows.get(t.key())
        drain = _drain(r, e) if r is not None and math.isfinite(float(r.get("makespan", math.nan))) else None
        est = ReplayEstimate(e.label(), last_arrival(e), drain, overhead)
        e._cache["planned_wall"] = est.wall
        out.append(est)
        try:
            _PLANNED[e.key()] = est.wall  # a replay's key names its server: known once connected
        except Exception:  # noqa: BLE001 - no server yet (a plan computed offline): the cache above
            pass
    return out


def wall_on_servers(durations: Sequence[float], servers: int) -> float:
    """The wall time of independent replays of these durations on ``servers`` servers, one replay
    at a time each, longest first (:func:`topas.sglang.pool.schedule`)."""
    return schedule(list(durations), servers).wall


@dataclass
class Stage:
    """One part of a reproduction: its name, its experiments still to run (the replays) and how
    many of its experiments the results store already holds (skipped)."""

    name: str
    experiments: list[Experiment]
    stored: int = 0
    estimates: list[ReplayEstimate] = field(default_factory=list)

    def spans(self) -> list[float]:
        return [arrival_span(e) for e in self.experiments]


def format_hours(seconds: float) -> str:
    """``2 h 57 min``, ``41 min``, ``12 s``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    m = round(seconds / 60)
    return f"{m // 60} h {m % 60:02d} min" if m >= 60 else f"{m} min"


def plan_lines(stages: Sequence[Stage], servers: int) -> tuple[list[str], float]:
    """The plan's lines (one per stage, then the pool on ``servers`` servers) and its wall time
    (seconds). Every stage's replays go into one pool, in which no server waits while a replay
    does; a stage without ``estimates`` counts its replays' last arrival and the overhead only."""
    lines, walls = [], []
    unpredicted = 0
    for st in stages:
        ests = st.estimates or [ReplayEstimate(e.label(), last_arrival(e), None) for e in st.experiments]
        walls += [x.wall for x in ests]
        unpredicted += sum(x.drain is None for x in ests)
        arr = sum(x.arrivals for x in ests)
        drain = sum(x.drain or 0.0 for x in ests)
        kept = f" ({st.stored} already stored, skipped)" if st.stored else ""
        lines.append(f"  {st.name}: {len(ests)} replays{kept}, {format_hours(arr)} of arrivals, "
                     f"{format_hours(drain)} of drain, {format_hours(sum(x.overhead for x in ests))} of overhead")
    sched = schedule(walls, servers)
    on = f"on {servers} servers" if servers > 1 else "on one server"
    used = f" ({sched.used} of {servers} servers get a replay)" if servers > 1 and sched.used < servers else ""
    lines.append(f"  total: about {format_hours(sched.wall)} of wall time {on}, all replays in one pool, "
                 f"longest first{used}")
    overhead = next((x.overhead for st in stages for x in st.estimates), REPLAY_OVERHEAD_S)
    note = (f"  (each replay: its last arrival + its drain as the simulator predicts it + {overhead:g} s of "
            f"overhead; servers' start-up not included")
    lines.append(note + (f"; {unpredicted} replays' drain not predicted, counted as 0)" if unpredicted else ")"))
    return lines, sched.wall

