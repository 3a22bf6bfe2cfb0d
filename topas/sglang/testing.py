"""Policies that misbehave on purpose, for the plugin's fault tests (``make test-sglang``).

Registered only when imported (the server imports it with ``TOPAS_POLICY_MODULES=topas.sglang.testing``),
so they never appear in ``topas policies``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from topas.engine.view import Decision, EngineView
from topas.paths import data_dir
from topas.policies.base import Policy, register
from topas.policies.fcfs import FCFS
from topas.workload.synthetic import scaled_down
from topas.workload.trace_io import read_trace, trace_from_dict, trace_to_dict, write_trace


@dataclasses.dataclass(frozen=True)
class RaisingParams:
    #: raise on every ``every``-th decision (1: always)
    every: int = 2


@register
class RaisingPolicy(Policy):
    """FCFS that raises RuntimeError on every ``every``-th decision."""

    name = "test-raising"
    Params = RaisingParams

    def reset(self) -> None:
        self.calls = 0
        self.inner = FCFS()

    def decide(self, view: EngineView) -> Decision:
        self.calls += 1
        if self.calls % self.params.every == 0:
            raise RuntimeError(f"deliberate failure at decision {self.calls}")
        return self.inner.decide(view)


@register
class InfeasiblePolicy(Policy):
    """Admits a request that does not exist (every decision is infeasible)."""

    name = "test-infeasible"

    def decide(self, view: EngineView) -> Decision:
        return Decision(admit=tuple(r.rid for r in view.waiting) + ("no-such-task/X",))


@dataclasses.dataclass(frozen=True)
class PreemptParams:
    #: preempt at most this many times in a run
    times: int = 3


@register
class PreemptingPolicy(Policy):
    """FCFS that also preempts the running request with the most generated tokens (at most
    ``times`` times a run), to exercise the plugin's preemption path. It manages prefixes: it
    loads the prefix of every waiting request (the plugin pins them) and evicts none.

    Until it has preempted ``times`` times it makes sure there is something to preempt at a
    decision: with nothing decoding it admits one waiting request and holds the others back
    (with something admitted but not yet decoding, it holds them all), so requests keep waiting
    while that one decodes, and the adapter's periodic re-check (every ``recheck_steps``
    scheduler iterations while requests wait) decides again while it runs. Admitting every
    waiting request at once, a decision saw a decoding request only when a request arrived
    while another was decoding, which hinges on the timing of the client and the server."""

    name = "test-preempting"
    Params = PreemptParams
    manages_prefixes = True

    def reset(self) -> None:
        self.done = 0

    def decide(self, view: EngineView) -> Decision:
        order = sorted(view.waiting, key=lambda r: (r.ready_time, r.rid))
        load, used = [], view.prefix_tokens + view.request_tokens
        for r in order:
            p = view.prefixes[r.agent]
            if not p.resident and r.agent not in load and used + p.tokens <= view.kv_budget:
                load.append(r.agent)
                used += p.tokens
        ok = view.resident | set(load)
        admit = tuple(r.rid for r in order if r.agent in ok)
        if self.done >= self.params.times:
            return Decision(admit=admit, load=tuple(load))
        decoding = [r for r in view.running if r.generated >= 1]
        if decoding and order:
            victim = max(decoding, key=lambda r: (r.generated, r.rid))
            self.done += 1
            return Decision(admit=admit, preempt=(victim.rid,), load=tuple(load))
        # nothing to preempt yet: let one request run and keep the rest waiting until it decodes
        return Decision(admit=() if view.running else admit[:1], load=tuple(load))


@register
class KnowledgeCheckingPolicy(FCFS):
    """FCFS that raises (so the plugin records a fallback) if its view shows more than an
    ``online``-DAG run may: a complete task, a stage that is neither finished nor waiting or
    running, or a child outside the shown stages (issue 16's end-to-end check)."""

    name = "test-online-view"

    def decide(self, view: EngineView) -> Decision:
        live: dict[str, set[str]] = {}
        for r in (*view.waiting, *view.running):
            live.setdefault(r.task_id, set()).add(r.stage_id)
        for tid, tv in view.tasks.items():
            reached = set(tv.done) | live.get(tid, set())
            if tv.complete or set(tv.stages) != reached:
                raise RuntimeError(f"task {tid} shows stages {sorted(tv.stages)}, reached {sorted(reached)}")
            if any(c not in tv.stages for st in tv.stages.values() for c in st.children):
                raise RuntimeError(f"task {tid} shows a child it has not reached")
        return super().decide(view)

def tiny_data_dir(dest, n_tasks: int = 2, source=None, max_stages: int = 8):
    """A ``$TOPAS_DATA`` folder whose traces have the real traces' names (the synthetic three and
    MetaGPT-TL, what :func:`topas.experiments.grid.gpu_afternoon` runs) but token counts a tiny CPU
    server replays in seconds: the synthetic ones are :func:`topas.workload.synthetic.scaled_down`,
    MetaGPT-TL its first ``n_tasks`` tasks, each cut to its first ``max_stages`` stages (in the
    trace's order, parents before children) and every prefix, input and output capped (128, 32, 8
    tokens). Profiles are linked from ``source`` (default: the repository's ``data/``)."""

    dest = Path(dest)
    src = Path(source) if source is not None else data_dir()
    (dest / "traces").mkdir(parents=True, exist_ok=True)
    if not (dest / "profiles").exists():
        os.symlink((src / "profiles").resolve(), dest / "profiles")
    for name in ("chain-3", "dag-4", "dag-10-wide"):
        write_trace(scaled_down(name, n_tasks), dest / "traces" / f"{name}.json.gz")
    d = trace_to_dict(read_trace(src / "traces" / "metagpt-tl.json.gz").head(n_tasks))
    for a in d["agents"]:
        a["prefix_tokens"] = min(a["prefix_tokens"], 128)
        a["expected_output_tokens"] = min(a["expected_output_tokens"], 8.0)
    for t in d["tasks"]:
        t["stages"] = t["stages"][:max_stages]
        kept = {s["id"] for s in t["stages"]}
        for s in t["stages"]:
            s["parents"] = [p for p in s["parents"] if p in kept]
            s["input_tokens"], s["output_tokens"] = min(s["input_tokens"], 32), min(s["output_tokens"], 8)
    # capped counts no longer add up to the prompts' segments: the tiny trace is plain topas.trace/1
    d.pop("segments", None)
    d["schema"] = "topas.trace/1"
    for t in d["tasks"]:
        for s in t["stages"]:
            s.pop("segments", None)
    d["meta"] = {**d["meta"], "tiny": "token counts capped for the CPU test server"}
    write_trace(trace_from_dict(d), dest / "traces" / "metagpt-tl.json.gz")
    return dest
