"""MetaGPT workloads: recorded LLM calls of MetaGPT runs -> ``topas.trace/2`` traces (pure Python).

The calls are recorded inside a MetaGPT environment by ``tools/metagpt/recorder.py`` (driven by
``scripts/collect_metagpt_traces.py``), one JSON object per line (format ``topas.metagpt-calls/1``,
tools/metagpt/README.md). This module never imports MetaGPT; it needs a tokenizer only to measure
prefixes (:func:`tiktoken_encoder`, cl100k_base, present in the MetaGPT venvs; tests pass their own).

The mapping (docs/method.md "The workload model"; choices the issue leaves open are marked *choice*):

- one **task** per requirement run (``run_id``), in the order of the file (the collection order);
  arrivals are Poisson at the trace's nominal rate (:data:`NOMINAL_RATES`, seed 0), as for the
  synthetic traces: recorded wall-clock times say how fast *this* machine ran MetaGPT, not how
  tasks arrive;
- one **stage** per recorded call (stage id = ``call_id``), retries included: a bad-JSON retry is
  a real extra call whose parent is the failed attempt. *Choice:* a call that failed at the HTTP
  level (``error`` set, no answer) is dropped and its children inherit its parents;
- **parents** = the recorded ``parents`` (the calls whose outputs this call consumed);
- an **agent** = (role, identity of the normalised system prompt): the role's most used system
  prompt is the agent ``role``, its others ``role:2``, ``role:3``... by number of calls (ties: the
  longer system prompt, then first use). E.g. TL-mode TeamLeader calls with three system prompts: its command turns (``TeamLeader``),
  its intent classification and its language detection; ``meta.prefix[agent].actions`` lists the
  recorded actions of each;
- the agent's **prefix** ``l_a`` = the longest token prefix shared by *all* of the agent's calls
  (over every task), measured on the normalised rendered prompt (:func:`render`), capped so every
  call keeps at least one input token; *choice:* an agent with a single call gets its system
  message's tokens as prefix; ``l_a >= 1`` always;
- a stage's **input** ``x_v`` = its rendered prompt's tokens minus ``l_a``; its **output** ``y_v``
  = the recorded ``completion_tokens`` (cl100k), at least 1;
- **normalisation** before prefix matching (:func:`normalise`): the run's working directory (the
  record's ``workdir``; workspace paths are in TL-mode system prompts), date-times, dates, clock
  times, epoch seconds (Engineer2's instruction names a ``{project_name}_<epoch>`` folder) and
  32-hex ids become fixed placeholders (RoleZero writes the current time into its system prompt;
  without this no two TeamLeader calls would share their prefix). Token counts of ``x_v`` are
  those of the original text;
- the **segments** (``topas.trace/2``) are the nodes of the radix tree (:mod:`topas.workload.radix`)
  of every call's *sharing text*, with an extra boundary at ``l_a``, so that a perfect radix cache
  over the segments reuses exactly what it reuses over those token sequences. The sharing text of
  the masked traces (``time="masked"``) is the normalised prompt; its token count can fall short
  of the original's (a date-time is longer than ``<DATETIME>``), and *choice:* the difference is
  one more ``unique`` segment at the end of the call (the masked values are never shared). The
  unmasked variant (``time="distinct"``, ``metagpt-tl-raw``) shares the original prompt with the
  current time RoleZero writes into it (:data:`CURRENT_TIME`) replaced by one distinct second per
  call (:func:`distinct_time`): what a deployment sees, where every call runs at another second
  (the offline recording answered in ~0.05 s, so its own timestamps repeat); there ``l_a`` and
  ``x_v`` are measured on that text too.

Timestamps (``t_start``, ``t_end``: epoch seconds or ISO-8601 strings) are normalised to seconds
since the run's first call and used to order the calls; a call must not start before a parent has
ended, nor end before it starts. Bad input raises :class:`~topas.workload.validate.TraceError`
naming the file, line and call.

The conversion is here; reading the calls is :mod:`topas.workload.metagpt_calls`, the prompt text
and tokenizer :mod:`topas.workload.metagpt_prompts`, the segments
:mod:`topas.workload.metagpt_segments`.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from topas.workload.arrivals import poisson_arrivals
from topas.workload.dag_order import find_cycle
from topas.workload.metagpt_calls import RECORD_VERSION, REQUIRED, _check_record, _ts, read_calls
from topas.workload.metagpt_prompts import (
    CURRENT_TIME,
    DISTINCT_TIME_BASE,
    Encoder,
    common_prefix_len,
    distinct_time,
    normalise,
    render,
    tiktoken_encoder,
)
from topas.workload.metagpt_segments import prompt_segments
from topas.workload.model import Agent, Stage, Task, Trace
from topas.workload.trace_error import TraceError
from topas.workload.validate import validate_trace

__all__ = [
    "CURRENT_TIME",
    "DISTINCT_TIME_BASE",
    "NOMINAL_RATES",
    "RECORD_VERSION",
    "REQUIRED",
    "TIME_MODES",
    "TIME_SLACK",
    "Encoder",
    "calls_to_trace",
    "common_prefix_len",
    "convert_file",
    "distinct_time",
    "normalise",
    "prompt_segments",
    "read_calls",
    "render",
    "system_identity",
    "tiktoken_encoder",
]

#: Nominal arrival rates (tasks/s) of the committed MetaGPT traces; experiments sweep
#: ``load * rate``. Chosen as for the synthetic traces: the loaded regime where the policies just
#: start to differ in the simulator (default profile), so loads 0.8-1.4 go from "all policies
#: alike" to "FCFS saturates" (data/traces/README.md, "Nominal rates", has the sweep). The paper
#: ran its MetaGPT-TL ablation at 0.0175 tasks/s.
NOMINAL_RATES: dict[str, float] = {"metagpt-sop": 0.05, "metagpt-tl": 0.02, "metagpt-tl-raw": 0.02}

#: How the converter treats volatile values (``calls_to_trace(time=...)``): ``masked`` normalises
#: them away (:func:`normalise`), ``distinct`` keeps the prompt as sent, one second per call.
TIME_MODES = ("masked", "distinct")

#: Slack (s) allowed when checking that a parent ended before its child started (clock rounding).
TIME_SLACK = 1e-3


def system_identity(messages: Sequence[Mapping[str, Any]], workdir: str = "") -> str:
    """The normalised system prompt (all leading system messages), ``""`` if none."""
    parts = []
    for m in messages:
        if m.get("role") != "system":
            break
        parts.append(str(m.get("content", "")))
    return normalise("\n".join(parts), workdir)


# ----------------------------------------------------------------------------- conversion


def calls_to_trace(
    records: Iterable[Mapping[str, Any]],
    name: str,
    encode: Encoder,
    rate: float | None = None,
    seed: int = 0,
    source: str = "<calls>",
    meta: Mapping[str, Any] | None = None,
    time: str = "masked",
) -> Trace:
    """Build the trace ``name`` from call records (see the module docstring for the mapping);
    ``time`` is one of :data:`TIME_MODES`."""
    if time not in TIME_MODES:
        raise ValueError(f"time must be one of {', '.join(TIME_MODES)}, got {time!r}")
    recs = list(records)
    if not recs:
        raise TraceError(source, "no call records")
    if rate is None:
        rate = NOMINAL_RATES.get(name)
    if rate is None or not rate > 0:
        raise ValueError(f"{name}: give a positive nominal rate (tasks/s)")

    # group by run, keep file order of runs; check fields and timestamps
    runs: "OrderedDict[str, list[dict[str, Any]]]" = OrderedDict()
    for rec in recs:
        src = rec.get("_source", source)
        where = _check_record(rec, src)
        r = dict(rec)
        r["_where"] = where
        r["_src"] = src
        r["_t0"] = _ts(rec["t_start"], src, where, "t_start")
        r["_t1"] = _ts(rec["t_end"], src, where, "t_end")
        if r["_t1"] < r["_t0"]:
            raise TraceError(src, f"t_end {rec['t_end']!r} is before t_start {rec['t_start']!r}", where=where)
        runs.setdefault(rec["run_id"], []).append(r)

    # per run: order by start time, drop failed calls (children inherit their parents), check deps
    kept_runs: "OrderedDict[str, list[dict[str, Any]]]" = OrderedDict()
    run_info: dict[str, dict[str, Any]] = {}
    for run_id, calls in runs.items():
        ids: dict[str, dict[str, Any]] = {}
        for c in calls:
            if c["call_id"] in ids:
                raise TraceError(c["_src"], f"duplicate call_id {c['call_id']!r} in run {run_id}", where=c["_where"])
            ids[c["call_id"]] = c
        for c in calls:
            for p in c["parents"]:
                if p not in ids:
                    raise TraceError(c["_src"], f"parent {p!r} is not a call of run {run_id}", where=c["_where"])
                if p == c["call_id"]:
                    raise TraceError(c["_src"], "a call cannot be its own parent", where=c["_where"])
        cyc = find_cycle([(c["call_id"], c["parents"]) for c in calls])
        if cyc:
            raise TraceError(calls[0]["_src"], f"run {run_id}: the calls' parents form a cycle: "
                             + " -> ".join(cyc + [cyc[0]]))
        t_run = min(c["_t0"] for c in calls)
        calls = sorted(calls, key=lambda c: (c["_t0"], c["call_id"]))
        for c in calls:
            c["t_rel"] = (c["_t0"] - t_run, c["_t1"] - t_run)
            for p in c["parents"]:
                if ids[p]["_t1"] > c["_t0"] + TIME_SLACK:
                    raise TraceError(
                        c["_src"],
                        f"parent {p!r} ends at {ids[p]['_t1'] - t_run:.3f} s, after this call starts at "
                        f"{c['_t0'] - t_run:.3f} s (times since the run's first call)",
                        where=c["_where"],
                    )
        failed = {c["call_id"] for c in calls if c.get("error")}
        resolved: dict[str, list[str]] = {}

        def live_parents(cid: str) -> list[str]:
            if cid not in resolved:
                out: list[str] = []
                for p in ids[cid]["parents"]:
                    for q in ([p] if p not in failed else live_parents(p)):
                        if q not in out:
                            out.append(q)
                resolved[cid] = out
            return resolved[cid]

        kept = []
        for c in calls:
            if c["call_id"] in failed:
                continue
            c = dict(c)
            c["parents_live"] = live_parents(c["call_id"])
            kept.append(c)
        if not kept:
            raise TraceError(calls[0]["_src"], f"run {run_id}: every call failed")
        kept_runs[run_id] = kept
        run_info[run_id] = {
            "requirement": calls[0].get("requirement", ""),
            "wall_s": round(max(c["_t1"] for c in calls) - t_run, 3),
            "calls": len(kept),
            "failed_calls": len(failed),
            "retries": sum(1 for c in kept if int(c.get("attempt", 1) or 1) > 1),
        }

    # agents: (role, normalised system prompt); the role's most used prompt is named after the
    # role, the others role:2, role:3, ... by number of calls (ties: the longer system prompt, then
    # first use)
    uses: dict[str, dict[str, list[int]]] = {}  # role -> identity -> [calls, first use]
    actions_of: dict[tuple[str, str], list[str]] = {}
    n_seen = 0
    for calls in kept_runs.values():
        for c in calls:
            ident = system_identity(c["messages"], c.get("workdir") or "")
            u = uses.setdefault(c["role"], {}).setdefault(ident, [0, n_seen])
            u[0] += 1
            n_seen += 1
            acts = actions_of.setdefault((c["role"], ident), [])
            if c["action"] not in acts:
                acts.append(c["action"])
    agent_of: dict[tuple[str, str], str] = {}
    for role, idents in uses.items():
        ranked = sorted(idents, key=lambda i: (-idents[i][0], -len(i), idents[i][1]))
        for k, ident in enumerate(ranked, start=1):
            agent_of[(role, ident)] = role if k == 1 else f"{role}:{k}"

    # tokens: the sharing text (for the prefix and the segments) and the counted text (for the
    # input): normalised and original (masked), or both the prompt with distinct times (distinct)
    norm_tokens: dict[str, list[Sequence[int]]] = {}
    raw_tokens: dict[str, list[Sequence[int]]] = {}
    sys_tokens: dict[str, int] = {}
    k_call = 0
    for calls in kept_runs.values():
        for c in calls:
            ident = system_identity(c["messages"], c.get("workdir") or "")
            a = agent_of[(c["role"], ident)]
            c["agent"] = a
            rt = encode(render(c["messages"]))
            raw_tokens.setdefault(a, []).append(rt)
            if time == "masked":
                c["n_prompt"] = len(rt)
                nt = encode(normalise(render(c["messages"]), c.get("workdir") or ""))
            else:
                nt = encode(distinct_time(render(c["messages"]), k_call))
                c["n_prompt"] = len(nt)
            k_call += 1
            c["n_norm"] = len(nt)
            c["share_tokens"] = nt
            norm_tokens.setdefault(a, []).append(nt)
            if a not in sys_tokens:
                sysmsgs = [m for m in c["messages"][: len(c["messages"])] if m.get("role") == "system"]
                sys_tokens[a] = len(encode(normalise(render(sysmsgs), c.get("workdir") or ""))) if sysmsgs else 0

    actions_by_agent = {agent_of[k]: v for k, v in actions_of.items()}
    agents: dict[str, Agent] = {}
    prefix_info: dict[str, Any] = {}
    outputs: dict[str, list[int]] = {}
    for calls in kept_runs.values():
        for c in calls:
            outputs.setdefault(c["agent"], []).append(max(1, int(c["completion_tokens"])))
    for a, toks in norm_tokens.items():
        shortest = min(len(t) for t in toks)
        lcp = common_prefix_len(toks) if len(toks) > 1 else sys_tokens[a]
        pre = max(1, min(lcp, shortest - 1, min(len(t) for t in toks) - 1))
        ys = outputs[a]
        agents[a] = Agent(name=a, prefix_tokens=pre, expected_output_tokens=round(sum(ys) / len(ys), 3))
        prefix_info[a] = {"calls": len(toks), "common_prefix_tokens": lcp, "system_prompt_tokens": sys_tokens[a],
                          # the same without normalisation: what a prefix cache would share if the
                          # volatile values stayed in the prompt
                          "raw_common_prefix_tokens": common_prefix_len(raw_tokens[a]) if len(toks) > 1 else None,
                          "actions": actions_by_agent[a]}
    agents = dict(sorted(agents.items()))

    arrivals = poisson_arrivals(len(kept_runs), rate, seed)
    task_ids = [f"t{k:05d}" for k in range(len(kept_runs))]
    segments = prompt_segments(
        [[(task_ids[k], c["call_id"], c["share_tokens"], agents[c["agent"]].prefix_tokens,
           c["n_prompt"] - c["n_norm"]) for c in calls] for k, calls in enumerate(kept_runs.values())]
    )
    tasks = []
    for k, (run_id, calls) in enumerate(kept_runs.items()):
        stages = tuple(
            Stage(
                id=c["call_id"],
                agent=c["agent"],
                input_tokens=max(1, c["n_prompt"] - agents[c["agent"]].prefix_tokens),
                output_tokens=max(1, int(c["completion_tokens"])),
                parents=tuple(c["parents_live"]),
                segments=segments[k][j],
            )
            for j, c in enumerate(calls)
        )
        tasks.append(Task(id=task_ids[k], arrival=arrivals[k], stages=stages, workflow=name))

    m: dict[str, Any] = {
        "generator": "topas.workload.metagpt.calls_to_trace",
        "rate": float(rate),
        "seed": int(seed),
        "arrival_process": "poisson",
        "tokenizer": "cl100k_base",
        "runs": [{"task": f"t{k:05d}", "run_id": rid, **run_info[rid]} for k, rid in enumerate(kept_runs)],
        "prefix": prefix_info,
        "segments": {"time": time, "tree": "topas.workload.metagpt.prompt_segments",
                     **({"distinct_time_base": DISTINCT_TIME_BASE.isoformat(sep=" ")} if time == "distinct" else {})},
    }
    if meta:
        m.update(meta)
    trace = Trace(name=name, agents=agents, tasks=tuple(tasks), meta=m)
    validate_trace(trace, source=source)
    return trace


def convert_file(
    path: str | os.PathLike[str],
    name: str,
    rate: float | None = None,
    encoding: str = "cl100k_base",
    encode: Encoder | None = None,
    seed: int = 0,
    meta: Mapping[str, Any] | None = None,
    time: str = "masked",
) -> Trace:
    """:func:`calls_to_trace` of a calls file; ``meta.calls_sha256`` names the exact input."""
    path = Path(path)
    recs = read_calls(path)
    m = {"calls_file": path.name, "calls_sha256": _sha256(path)}
    first = recs[0] if recs else {}
    for k in ("metagpt", "endpoint"):
        if k in first:
            m[k] = first[k]
    m.update(meta or {})
    return calls_to_trace(recs, name, encode or tiktoken_encoder(encoding), rate=rate, seed=seed,
                          source=str(path), meta=m, time=time)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
