"""Collapses that are not monotone in load: which runs, and what happens in them, window by window.

A *collapse* is a run of one of our policies (``topas``, ``topas-plus``) that the protocol's
steady-state test rejects (it grows) at a load ``L`` while the same (workload, policy, run
length) is stable at some higher grid load ``L' > L``, on the same seed or on every seed
(:func:`find_collapses`, from the cached per-run evidence ``data/results/protocol/evidence.csv``
and :func:`studies.protocol_runs.study.seed_verdicts`, the protocol's own per-run verdict).

The rest traces one run from its tables (:class:`topas.engine.metrics.SimResult`: tasks,
requests, prefix events, the KV timeline, decisions) in time windows:

* :func:`interval_occupancy`, :func:`step_mean`: time averages over windows of intervals (tasks
  in the system, requests waiting or running) and of a piecewise-constant record (the timeline);
* :func:`residency_intervals`: when each agent's prefix was resident (a load opens an interval,
  an eviction or unpinning closes it);
* :func:`window_series`: per window, tasks in system, requests waiting and running per agent, the
  share of waiting time whose agent's prefix was resident ("hot" waiting: held back by memory or
  order, not by its prefix), resident prefixes, loads and evictions, decode batch, KV pool use;
* :func:`eviction_spells`, :func:`run_profile`: the longest spell without a prefix eviction and the
  same measures inside it and outside it, one line per run (a lock shows as a long spell with every
  prefix resident, small batches and a growing hot queue);
* :func:`longest_waits`: the requests that waited longest, and whether their prefix was resident
  while they waited.

Everything is a pure function of the tables; ``scripts/trace_collapse.py`` runs the simulations,
writes the CSVs under ``data/results/protocol/`` and ``figures/collapse_trace.*``; the findings are
in docs/protocol.md ("A collapse that is not monotone in load").
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from topas.experiments.protocol.steady import ALPHA, INDICATORS

#: Our policies, whose collapses are traced.
OURS = ("topas", "topas-plus")
#: Prefix events that make a prefix resident (pinned, for a policy that manages prefixes).
RESIDENT_ON = ("load_prefill", "load_swap", "load_cached")
#: Prefix events that end its residency (``lru_drop``: an unpinned prefix leaving the cache, not
#: resident from the policy's view already).
RESIDENT_OFF = ("evict_free", "evict_swap", "evict_unpin")


# --------------------------------------------------------------------------------------------
# Which runs collapse

def find_collapses(evidence: pd.DataFrame, policies: Sequence[str] = OURS, alpha: float = ALPHA,
                   indicators: Sequence[str] = INDICATORS) -> pd.DataFrame:
    """The runs of ``policies`` that grow at a load while the same (workload, policy, run length)
    is stable at a higher load of the evidence's grid, on the same seed or on every seed.

    ``evidence``: per-run rows as in ``data/results/protocol/evidence.csv`` (one test version; the
    default engine's rows only are read).
    Verdicts are :func:`~studies.protocol_runs.study.seed_verdicts`' (Bonferroni over the
    seeds at each load). One row per collapsing run, sorted by workload, policy, load and seed:
    its spec and evidence, ``seed_stable_above`` (the higher loads at which this seed's run does
    not grow, ``;``-separated), ``all_stable_above`` (the higher loads at which no seed grows),
    ``others_jct_low`` / ``others_jct_high`` (the other seeds' mean JCT at that load)."""
    from studies.protocol_runs.study import default_engine_rows, seed_verdicts

    cols = ["workload", "policy", "n_tasks", "load", "seed", "key", "jct_mean", "others_jct_low", "others_jct_high",
            "level"] + [f"{i}_p_value" for i in indicators] + ["seed_stable_above", "all_stable_above"]
    evidence = default_engine_rows(evidence)  # the protocol's grid (the cache holds other studies' runs too)
    ev = seed_verdicts(evidence[evidence["policy"].isin(policies)], alpha, indicators)
    rows = []
    for (w, p, n), g in ev.groupby(["workload", "policy", "n_tasks"], sort=True):
        stable_loads = sorted(g.loc[g["stable_at_load"], "load"].unique())
        for r in g[g["growing"]].itertuples(index=False):
            same = g[(g["seed"] == r.seed) & (g["load"] > r.load) & ~g["growing"]]["load"]
            every = [x for x in stable_loads if x > r.load]
            if not len(same) and not every:
                continue
            others = g[(g["load"] == r.load) & (g["seed"] != r.seed)]["jct_mean"]
            row = {"workload": w, "policy": p, "n_tasks": int(n), "load": float(r.load), "seed": int(r.seed),
                   "key": r.key, "jct_mean": float(r.jct_mean),
                   "others_jct_low": float(others.min()) if len(others) else np.nan,
                   "others_jct_high": float(others.max()) if len(others) else np.nan, "level": float(r.level),
                   "seed_stable_above": ";".join(f"{x:g}" for x in sorted(same.unique())),
                   "all_stable_above": ";".join(f"{x:g}" for x in every)}
            row.update({f"{i}_p_value": float(getattr(r, f"{i}_p_value")) for i in indicators})
            rows.append(row)
    out = pd.DataFrame(rows, columns=cols)
    return out.sort_values(["workload", "policy", "load", "seed"], kind="stable").reset_index(drop=True)


# --------------------------------------------------------------------------------------------
# Time averages over windows

def window_edges(end: float, width: float, start: float = 0.0) -> np.ndarray:
    """Edges of windows of ``width`` seconds from ``start`` covering ``end`` (the last window may
    be shorter)."""
    if width <= 0:
        raise ValueError(f"window width must be positive, got {width!r}")
    if end <= start:
        return np.array([start, start + width])
    n = int(np.ceil((end - start) / width - 1e-12))
    edges = start + width * np.arange(n + 1, dtype=float)
    edges[-1] = max(edges[-1], end)
    return edges


def _overlap(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """``[i, j]``: how long the interval ``[starts[i], ends[i])`` lies inside window ``j``."""
    lo, hi = edges[:-1], edges[1:]
    return np.clip(np.minimum(ends[:, None], hi[None, :]) - np.maximum(starts[:, None], lo[None, :]), 0.0, None)


def interval_occupancy(starts: Sequence[float] | np.ndarray, ends: Sequence[float] | np.ndarray,
                       edges: Sequence[float] | np.ndarray) -> np.ndarray:
    """The time-averaged number of the intervals ``[starts[i], ends[i])`` open in each window
    ``[edges[j], edges[j+1])``: the summed overlap divided by the window's length. An interval
    with a missing (NaN) end is open until the last edge."""
    s = np.asarray(starts, dtype=float)
    e = np.asarray(ends, dtype=float)
    edges = np.asarray(edges, dtype=float)
    if len(edges) < 2:
        return np.zeros(0)
    e = np.where(np.isnan(e), edges[-1], e)
    if not len(s):
        return np.zeros(len(edges) - 1)
    return _overlap(s, e, edges).sum(axis=0) / np.diff(edges)


def step_mean(times: Sequence[float] | np.ndarray, values: Sequence[float] | np.ndarray,
              edges: Sequence[float] | np.ndarray, initial: float = 0.0) -> np.ndarray:
    """The time-weighted mean in each window of a piecewise-constant record: ``values[i]`` holds
    from ``times[i]`` until ``times[i+1]`` (the last until the last edge); ``initial`` before the
    first record (the simulator's timeline: each row is the state after an iteration)."""
    t = np.asarray(times, dtype=float)
    v = np.asarray(values, dtype=float)
    edges = np.asarray(edges, dtype=float)
    starts = np.r_[edges[0] if not len(t) else min(edges[0], t[0]), t]
    ends = np.r_[t, edges[-1]] if len(t) else np.array([edges[-1]])
    ends = np.maximum(ends, starts)
    vals = np.r_[initial, v]
    return (_overlap(starts, ends, edges) * vals[:, None]).sum(axis=0) / np.diff(edges)


def counts_in(times: Sequence[float] | np.ndarray, edges: Sequence[float] | np.ndarray) -> np.ndarray:
    """How many ``times`` fall in each window ``(edges[j], edges[j+1]]`` (the first window also
    holds its left edge); times outside the edges are not counted."""
    t = np.sort(np.asarray(times, dtype=float))
    edges = np.asarray(edges, dtype=float)
    c = np.diff(np.searchsorted(t, edges, side="right"))
    if len(c):
        c[0] += int((t == edges[0]).sum())
    return c.astype(int)


# --------------------------------------------------------------------------------------------
# Prefix residency

def residency_intervals(prefix_events: pd.DataFrame, agents: Iterable[str], end: float) -> pd.DataFrame:
    """When each agent's prefix was resident: one row (agent, start, end) per interval from a
    load (:data:`RESIDENT_ON`) to the next eviction or unpinning (:data:`RESIDENT_OFF`), the last
    one open until ``end``. Events of other kinds are ignored."""
    rows = []
    ev = prefix_events.sort_values("time", kind="stable") if len(prefix_events) else prefix_events
    for a in agents:
        since = None
        for t, kind in zip(ev.loc[ev["agent"] == a, "time"], ev.loc[ev["agent"] == a, "event"]) if len(ev) else ():
            if kind in RESIDENT_ON and since is None:
                since = float(t)
            elif kind in RESIDENT_OFF and since is not None:
                rows.append((a, since, float(t)))
                since = None
        if since is not None:
            rows.append((a, since, float(max(end, since))))
    return pd.DataFrame(rows, columns=["agent", "start", "end"])


def clip_to(starts: np.ndarray, ends: np.ndarray, on_starts: np.ndarray, on_ends: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pieces of the intervals ``[starts, ends)`` that lie inside the union of the disjoint
    intervals ``[on_starts, on_ends)``: (piece starts, piece ends, index of the interval each
    piece came from)."""
    s = np.asarray(starts, dtype=float)[:, None]
    e = np.asarray(ends, dtype=float)[:, None]
    a = np.maximum(s, np.asarray(on_starts, dtype=float)[None, :])
    b = np.minimum(e, np.asarray(on_ends, dtype=float)[None, :])
    i, j = np.nonzero(b > a)
    return a[i, j], b[i, j], i


# --------------------------------------------------------------------------------------------
# The time series

def _short(agent: str) -> str:
    return agent.rsplit(".", 1)[-1]


def window_series(result: Any, budget: int, edges: Sequence[float] | np.ndarray | None = None,
                  width: float = 60.0, agents: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per window of a run's measures (``result``: a :class:`~topas.engine.metrics.SimResult`
    or anything with its ``tasks``, ``requests``, ``prefix_events``, ``timeline`` and ``decisions``
    tables; ``budget``: the KV pool in tokens; windows: ``edges``, else of ``width`` seconds over
    the run). Time averages over the window unless named otherwise:

    ``arrivals``, ``finished`` (tasks, counts); ``in_system`` (tasks arrived and not finished);
    ``waiting`` and ``waiting:<agent>`` (requests ready and not yet admitted: ``[ready,
    first_admit)``); ``running`` and ``running:<agent>`` (admitted, not finished);
    ``hot_wait_share`` (the share of the waiting request-time during which the request's agent
    prefix was resident, NaN when nothing waits); ``resident`` (resident prefixes) and
    ``resident:<agent>`` (the share of the window it was); ``loads``, ``evictions`` (counts);
    ``decode_batch``; ``kv_use`` ((prefix + request KV) / budget); ``prefix_share`` (prefix KV /
    budget); ``queue_time`` (mean queueing time of the requests first admitted in the window);
    ``oldest_wait`` and ``oldest_agent`` (the longest-waiting request at the window's end);
    ``stopped_share`` (the share of the window's admission decisions that admitted fewer
    requests than the policy proposed: the walk stopped at a request that did not fit)."""
    tasks, req, pev, tl = result.tasks, result.requests, result.prefix_events, result.timeline
    end = float(max(tasks["finish"].max(), req["finish"].max()))
    edges = window_edges(end, width) if edges is None else np.asarray(edges, dtype=float)
    agents = list(agents) if agents is not None else sorted(req["agent"].unique())
    lo, hi = edges[:-1], edges[1:]
    out: dict[str, Any] = {"t0": lo, "t1": hi}
    out["arrivals"] = counts_in(np.sort(tasks["arrival"].to_numpy(dtype=float)), edges)
    out["finished"] = counts_in(np.sort(tasks["finish"].to_numpy(dtype=float)), edges)
    out["in_system"] = interval_occupancy(tasks["arrival"], tasks["finish"], edges)
    ready = req["ready"].to_numpy(dtype=float)
    admit = req["first_admit"].to_numpy(dtype=float)
    fin = req["finish"].to_numpy(dtype=float)
    agent_of = req["agent"].to_numpy()
    out["waiting"] = interval_occupancy(ready, admit, edges)
    out["running"] = interval_occupancy(admit, fin, edges)
    res = residency_intervals(pev, agents, end)
    hot = np.zeros(len(lo))
    mask = {a: agent_of == a for a in agents}
    for a in agents:  # the columns grouped by measure: every agent's waiting, then running, then resident
        out[f"waiting:{_short(a)}"] = interval_occupancy(ready[mask[a]], admit[mask[a]], edges)
    for a in agents:
        out[f"running:{_short(a)}"] = interval_occupancy(admit[mask[a]], fin[mask[a]], edges)
    for a in agents:
        r = res[res["agent"] == a]
        out[f"resident:{_short(a)}"] = interval_occupancy(r["start"], r["end"], edges)
        ps, pe, _ = clip_to(ready[mask[a]], admit[mask[a]], r["start"].to_numpy(), r["end"].to_numpy())
        hot += interval_occupancy(ps, pe, edges)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["hot_wait_share"] = np.where(out["waiting"] > 0, hot / out["waiting"], np.nan)
    out["resident"] = interval_occupancy(res["start"], res["end"], edges)
    kinds = pev["event"].astype(str) if len(pev) else pd.Series([], dtype=str)
    ptimes = pev["time"].to_numpy(dtype=float) if len(pev) else np.zeros(0)
    out["loads"] = counts_in(np.sort(ptimes[kinds.isin(RESIDENT_ON).to_numpy()]), edges)
    out["evictions"] = counts_in(np.sort(ptimes[kinds.isin(RESIDENT_OFF).to_numpy()]), edges)
    t = tl["time"].to_numpy(dtype=float)
    out["decode_batch"] = step_mean(t, tl["decode_batch"], edges)
    out["kv_use"] = step_mean(t, (tl["prefix_tokens"] + tl["request_tokens"]) / budget, edges)
    out["prefix_share"] = step_mean(t, tl["prefix_tokens"] / budget, edges)
    # queueing time of the requests admitted in each window
    idx = np.searchsorted(edges, admit, side="right") - 1
    idx = np.where(admit == edges[-1], len(lo) - 1, idx)
    qt = np.full(len(lo), np.nan)
    ok = (idx >= 0) & (idx < len(lo)) & ~np.isnan(admit)
    if ok.any():
        s = pd.Series(admit[ok] - ready[ok]).groupby(idx[ok]).mean()
        qt[s.index.to_numpy()] = s.to_numpy()
    out["queue_time"] = qt
    oldest, oldest_agent = np.zeros(len(lo)), np.full(len(lo), "", dtype=object)
    for j, t1 in enumerate(hi):
        w = (ready <= t1) & ~(admit <= t1)
        if w.any():
            k = np.argmin(np.where(w, ready, np.inf))
            oldest[j], oldest_agent[j] = t1 - ready[k], _short(str(agent_of[k]))
    out["oldest_wait"] = oldest
    out["oldest_agent"] = oldest_agent
    dec = result.decisions
    if len(dec):
        di = np.clip(np.searchsorted(edges, dec["time"].to_numpy(dtype=float), side="right") - 1, 0, len(lo) - 1)
        stopped = (dec["n_admitted"] < dec["n_proposed"]).to_numpy(dtype=float)
        n = np.bincount(di, minlength=len(lo))
        with np.errstate(invalid="ignore", divide="ignore"):
            out["stopped_share"] = np.where(n > 0, np.bincount(di, stopped, minlength=len(lo)) / n, np.nan)
    else:
        out["stopped_share"] = np.full(len(lo), np.nan)
    return pd.DataFrame(out)


def eviction_spells(prefix_events: pd.DataFrame, end: float, start: float = 0.0) -> pd.DataFrame:
    """The spells between consecutive prefix evictions (:data:`RESIDENT_OFF`), from ``start`` to
    ``end``: rows (start, end, duration), longest first (ties: earliest first)."""
    ev = prefix_events[prefix_events["event"].isin(RESIDENT_OFF)] if len(prefix_events) else prefix_events
    t = np.unique(np.asarray(ev["time"], dtype=float)) if len(ev) else np.zeros(0)
    t = t[(t > start) & (t < end)]
    b = np.r_[start, t, end]
    df = pd.DataFrame({"start": b[:-1], "end": b[1:]})
    df["duration"] = df["end"] - df["start"]
    return df.sort_values(["duration", "start"], ascending=[False, True], kind="stable").reset_index(drop=True)


#: The measures :func:`run_profile` reports inside the lock spell and outside it.
PROFILE_MEASURES = ("resident", "decode_batch", "kv_use", "prefix_share", "hot_wait_share", "waiting",
                    "in_system")


def run_profile(result: Any, budget: int, agents: Sequence[str] | None = None) -> dict[str, Any]:
    """One line per run: mean JCT; the longest spell without a prefix eviction (``spell_start``,
    ``spell_s``, ``spell_to_end``: whether it lasts until the run's last request finishes); the
    share of that spell during which every agent's prefix was resident (``spell_all_resident``);
    the :data:`PROFILE_MEASURES` inside the spell (``*_in``) and over the rest of the run
    (``*_out``); inside the spell and before the last arrival, the tasks finished per second
    (``finish_rate_in``) against those arriving (``arrival_rate_in``); the agent with the most
    waiting time in the spell (``wait_agent_in``) and its share of it (``wait_agent_share_in``);
    the longest spell with every agent's prefix resident (``all_resident_start``,
    ``all_resident_s``); the tasks in the system, time-averaged over the first and the second half
    of the arrivals (``in_system_first_half``, ``in_system_second_half``)."""
    tasks, req = result.tasks, result.requests
    end = float(max(tasks["finish"].max(), req["finish"].max()))
    agents = list(agents) if agents is not None else sorted(req["agent"].unique())
    spell = eviction_spells(result.prefix_events, end).iloc[0]
    s0, s1 = float(spell["start"]), float(spell["end"])
    inside = window_series(result, budget, edges=[s0, s1], agents=agents).iloc[0]
    whole = window_series(result, budget, edges=[0.0, end], agents=agents).iloc[0]
    out_len = end - (s1 - s0)
    row: dict[str, Any] = {"jct_mean": float(tasks["jct"].mean()), "spell_start": s0, "spell_s": s1 - s0,
                           "spell_to_end": bool(s1 >= end)}
    res = residency_intervals(result.prefix_events, agents, end)
    # all resident: the intersection of the agents' residency over the spell
    on_s, on_e = np.array([s0]), np.array([s1])
    for a in agents:
        r = res[res["agent"] == a]
        ps, pe, _ = clip_to(on_s, on_e, r["start"].to_numpy(), r["end"].to_numpy())
        on_s, on_e = ps, pe
    row["spell_all_resident"] = float((on_e - on_s).sum() / (s1 - s0)) if s1 > s0 else np.nan
    for m in PROFILE_MEASURES:
        vin, vall = float(inside[m]), float(whole[m])
        row[f"{m}_in"] = vin
        if m == "hot_wait_share":  # a share of waiting time: weight by waiting
            w_in, w_all = float(inside["waiting"]) * (s1 - s0), float(whole["waiting"]) * end
            denom = w_all - w_in
            row[f"{m}_out"] = (vall * w_all - vin * w_in) / denom if denom > 1e-9 else np.nan
        else:
            row[f"{m}_out"] = (vall * end - vin * (s1 - s0)) / out_len if out_len > 1e-9 else np.nan
    # rates while tasks still arrive (a spell lasting past the last arrival also drains the queue)
    last = float(tasks["arrival"].max())
    r1 = min(s1, last)
    if r1 > s0:
        arrived = window_series(result, budget, edges=[s0, r1], agents=agents).iloc[0]
        row["finish_rate_in"] = float(arrived["finished"]) / (r1 - s0)
        row["arrival_rate_in"] = float(arrived["arrivals"]) / (r1 - s0)
    else:
        row["finish_rate_in"] = row["arrival_rate_in"] = np.nan
    # the longest spell with every agent's prefix resident (where a lock starts)
    a_s, a_e = np.array([0.0]), np.array([end])
    for a in agents:
        r = res[res["agent"] == a]
        a_s, a_e, _ = clip_to(a_s, a_e, r["start"].to_numpy(), r["end"].to_numpy())
    k = int(np.argmax(a_e - a_s)) if len(a_s) else -1
    row["all_resident_start"] = float(a_s[k]) if k >= 0 else np.nan
    row["all_resident_s"] = float(a_e[k] - a_s[k]) if k >= 0 else 0.0
    # growth of the queue: tasks in the system over the first and the second half of the arrivals
    first = float(tasks["arrival"].min())
    halves = window_series(result, budget, edges=[first, (first + last) / 2, last], agents=agents)
    row["in_system_first_half"] = float(halves["in_system"].iloc[0])
    row["in_system_second_half"] = float(halves["in_system"].iloc[1])
    waits = {a: float(inside[f"waiting:{_short(a)}"]) for a in agents}
    total = sum(waits.values())
    top = max(waits, key=lambda a: (waits[a], a)) if waits else ""
    row["wait_agent_in"] = _short(top) if total > 0 else ""
    row["wait_agent_share_in"] = waits[top] / total if total > 0 else np.nan
    return row


#: A lock (:func:`is_lock`): a spell this long (s) without a prefix eviction ...
LOCK_MIN_S = 1000.0
#: ... with every agent's prefix resident this share of it.
LOCK_MIN_ALL_RESIDENT = 0.9


def is_lock(profile: Mapping[str, Any], min_s: float = LOCK_MIN_S,
            min_all_resident: float = LOCK_MIN_ALL_RESIDENT) -> bool:
    """Whether a :func:`run_profile` row shows the lock: a spell of at least ``min_s`` seconds
    without a prefix eviction during which every agent's prefix was resident at least
    ``min_all_resident`` of the time."""
    return bool(profile["spell_s"] >= min_s and profile["spell_all_resident"] >= min_all_resident)


def longest_waits(result: Any, n: int = 10, agents: Sequence[str] | None = None) -> pd.DataFrame:
    """The ``n`` requests that waited longest before their first admission: rid, agent, ready,
    first_admit, queue_time and ``resident_share`` (the share of its wait during which its agent's
    prefix was resident: 1 means it was held back by memory or order, not by its prefix)."""
    req = result.requests
    end = float(max(result.tasks["finish"].max(), req["finish"].max()))
    agents = list(agents) if agents is not None else sorted(req["agent"].unique())
    res = residency_intervals(result.prefix_events, agents, end)
    top = req.assign(queue_time=req["first_admit"] - req["ready"]).nlargest(n, "queue_time", keep="first")
    shares = []
    for r in top.itertuples(index=False):
        iv = res[res["agent"] == r.agent]
        ps, pe, _ = clip_to(np.array([r.ready]), np.array([r.first_admit]), iv["start"].to_numpy(),
                            iv["end"].to_numpy())
        shares.append(float((pe - ps).sum() / r.queue_time) if r.queue_time > 0 else np.nan)
    return pd.DataFrame({"rid": top["rid"].to_numpy(), "agent": top["agent"].to_numpy(),
                         "ready": top["ready"].to_numpy(), "first_admit": top["first_admit"].to_numpy(),
                         "queue_time": top["queue_time"].to_numpy(), "resident_share": shares})


def summarise_spells(rows: Iterable[Mapping[str, Any]], digits: int = 3) -> pd.DataFrame:
    """:func:`run_profile` rows as a table rounded to ``digits`` significant decimals for floats
    (seconds to 1 decimal), ready to write."""
    df = pd.DataFrame(list(rows))
    for c in df.columns:
        if df[c].dtype.kind == "f":
            df[c] = df[c].round(1 if c in ("jct_mean", "spell_start", "spell_s") else digits)
    return df


# --------------------------------------------------------------------------------------------
# Runs (simulations: the script's and the counterfactuals')

def budget_of(exp: Any) -> int:
    """The KV pool (tokens) an :class:`~topas.experiments.Experiment` runs with."""
    return int(exp.kv_budget or exp.load_cost().kv_budget_tokens)


def profile_experiment(exp: Any) -> dict[str, Any]:
    """Simulate ``exp`` and return its :func:`run_profile` with the protocol's per-run evidence
    (``jct_p_value``, ``in_system_p_value``: :func:`studies.protocol_runs.study.run_evidence`)
    and :func:`is_lock` as ``lock``. Module-level, so that
    :func:`topas.experiments.dispatch.map_experiments` can run it in worker processes."""
    from studies.protocol_runs.study import run_evidence
    from topas.experiments.spec import run_experiment

    res = run_experiment(exp)
    row = run_profile(res, budget_of(exp))
    ev = run_evidence(res.tasks, res.summary)
    row.update({f"{i}_p_value": float(ev[f"{i}_p_value"]) for i in INDICATORS})
    row["lock"] = is_lock(row)
    return row
