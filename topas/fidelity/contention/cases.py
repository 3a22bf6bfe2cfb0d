"""The contention cases and modes (:data:`CASES`, :data:`MODES`): scripted bursts and Poisson
traces on a KV pool that holds about two prefixes, and each case's trace."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topas.paths import REPO_ROOT
from topas.workload.model import Agent, Segment, Stage, Task, Trace
from topas.workload.synthetic import generate
from topas.workload.trace_io import write_trace
from topas.workload.validate import validate_trace


OUT_DIR = REPO_ROOT / "data" / "results" / "fidelity" / "contention"


@dataclass(frozen=True)
class Case:
    """A contention case: ``agents`` agents with ``prefix_tokens``-token prefixes on a pool of
    ``pool_tokens`` (about two prefixes plus a few requests).

    ``kind="burst"``: ``per_agent`` single-stage requests per agent, interleaved by agent
    (a1 b1 c1 a2 b2 ...), arriving ``gap_s`` apart from t=0; ``kind="poisson"``: ``n_tasks`` tasks
    of the synthetic ``shape`` (one stage per agent) with Poisson arrivals of ``rate`` tasks/s
    from ``seed``; ``kind="context"``: ``n_tasks`` tasks (``gap_s`` apart) of the chain ``chain``
    of stages, one per letter (``"a"``: agent a; ``"a+"``: agent a holding the task's
    ``context_tokens``-token context after its prefix), as a ``topas.trace/2`` trace whose segments
    are the agent prefix, the context (``+`` stages) and the call's ``input_tokens``.

    ``needs``: what the simulator must model before it is compared with the case (a case recorded
    for a behaviour the engine does not have yet); such cases are left out of the default
    comparison (:func:`comparable_cases`). None of today's cases needs anything."""

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
    chain: tuple[str, ...] = ()
    context_tokens: int = 0
    needs: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("burst", "poisson", "context"):
            raise ValueError(f"case {self.name!r}: kind must be 'burst', 'poisson' or 'context', got {self.kind!r}")
        holds = any(st.endswith("+") for st in self.chain)
        if self.kind == "context" and (self.n_tasks < 1 or not self.chain or (holds and self.context_tokens < 1)):
            raise ValueError(f"case {self.name!r}: a context case needs n_tasks >= 1, a chain and, with a '+' stage, "
                             f"context_tokens >= 1")
        if self.kind == "burst" and self.per_agent < 1:
            raise ValueError(f"case {self.name!r}: a burst needs per_agent >= 1")
        if self.kind == "poisson" and (self.n_tasks < 1 or not self.rate > 0):
            raise ValueError(f"case {self.name!r}: a Poisson case needs n_tasks >= 1 and rate > 0")


@dataclass(frozen=True)
class Mode:
    """How the server schedules: the topas plugin running the run's policy (``plugin=True``), or
    stock SGLang with ``--schedule-policy schedule_policy`` (simulated with topas's policy of the
    same name). ``eviction``: the radix cache's ``--radix-eviction-policy`` (None: SGLang's
    default, lru, no flag), with ``eviction_config`` (``--radix-eviction-policy-config``, sorted
    key/value pairs); the simulation runs with the same (``EngineConfig.eviction``).
    ``priority``: the rule of :mod:`topas.sglang.priority` that gives every request its
    top-level ``priority`` (sent by the replay; the simulated policy's ``request_priority``).
    ``params``: parameters of the mode's policies (sorted key/value pairs; the plugin gets them
    with each request's metadata, the simulation makes the policy with them), e.g. TOPAS's
    ``in_batch_guard``; a mode's runs are stored apart (``<case>/<mode>/``), so two modes may run
    one policy with different parameters."""

    name: str
    plugin: bool
    schedule_policy: str | None = None
    policies: tuple[str, ...] = ("fcfs", "lpm", "topas")
    eviction: str | None = None
    eviction_config: tuple[tuple[str, Any], ...] = ()
    priority: str | None = None
    params: tuple[tuple[str, Any], ...] = ()


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
    # a partial match: a's first call leaves prefix + 768-token context in the tree; b's call then
    # needs more than the free pool, so SGLang evicts the LRU leaves (the first call's own tail,
    # then the context) while a's prefix stays; a's second call matches the prefix only
    Case("ctx-evict", "context", agents=2, prefix_tokens=1024, input_tokens=64, output_tokens=16,
         pool_tokens=POOL, chain=("a+", "b", "a+"), context_tokens=768, n_tasks=6, gap_s=3.0),
    # tasks a -> b -> a, the two a calls sharing the task's 256-token context, on a pool of about
    # two prefixes: one task alone fits (2,464 tokens), overlapping tasks' contexts compete
    Case("ctx-pool2", "context", agents=2, prefix_tokens=1024, input_tokens=64, output_tokens=16,
         pool_tokens=POOL, chain=("a+", "b", "a+"), context_tokens=256, n_tasks=10, gap_s=0.25),
    # the eviction cases (EVICTION_MODES): one call at a time, so the tree holds only finished
    # requests when c's call needs room (shortfall ~700 tokens). a is called twice early (its prefix
    # node's hit_count 2), then b once: lru evicts a's prefix (the oldest), lfu b's (hit_count 1), and
    # with the `reuse` priorities a's prefix (its first call foresees a's second: priority 2, b's 1)
    # stays; the last call (a again) hits under lfu and priority only
    Case("evict-freq", "context", agents=3, prefix_tokens=1024, input_tokens=64, output_tokens=16,
         pool_tokens=POOL, chain=("a", "a", "b", "c", "a"), n_tasks=2, gap_s=2.0),
    # the same with b called last: lru keeps b (the newer), lfu evicts it, and b's `reuse` priority
    # (its call foresees b's second) outranks a's second call's, so priority keeps b too
    Case("evict-reuse", "context", agents=3, prefix_tokens=1024, input_tokens=64, output_tokens=16,
         pool_tokens=POOL, chain=("a", "a", "b", "c", "b"), n_tasks=2, gap_s=2.0),
    # where KVFlow's steps-to-execution (how soon an agent is due) and the `reuse` count (how often)
    # disagree: b a c b c a a. When c's first call needs room, b's prefix is the older (lru and lfu,
    # both hit_count 0, evict it) and has fewer later calls (1 against a's 2: `reuse` evicts it too),
    # but b is due sooner (2 steps after its call, a 3 after its: `steps` priorities 3 and 2), so
    # `steps` evicts a's prefix and b's second call hits. 10 s apart, so the tasks do not overlap:
    # a task's 7 calls took up to 5.6 s on the loaded 2-core machine (4 s apart, they overlapped)
    Case("evict-steps", "context", agents=3, prefix_tokens=1024, input_tokens=64, output_tokens=16,
         pool_tokens=POOL, chain=("b", "a", "c", "b", "c", "a", "a"), n_tasks=2, gap_s=10.0),
    # one agent, cold, six requests at once (GUARD_MODES): its 512-token prefix is in no tree, so
    # every request admitted with the first one computes its own copy of it (each copy 560 tokens
    # with prompt and output: four fit the pool); the in-batch guard admits one, the rest once
    # the prefix is in the tree
    Case("cold-burst", "burst", agents=1, prefix_tokens=512, input_tokens=32, output_tokens=16,
         pool_tokens=POOL, per_agent=6, gap_s=0.0),
)}

#: The cases the eviction modes are recorded on (the three eviction cases; a burst and shared
#: contexts, where concurrent calls and partial matches meet the strategies, under some modes).
EVICTION_CASES = ("evict-freq", "evict-reuse", "evict-steps", "burst-3x3", "ctx-pool2")


def comparable_cases() -> list[Case]:
    """The cases today's engine is compared with: those that need nothing it lacks (``needs`` None)."""
    return [c for c in CASES.values() if c.needs is None]

MODES: dict[str, Mode] = {m.name: m for m in (
    Mode("plugin", plugin=True),
    Mode("sglang-fcfs", plugin=False, schedule_policy="fcfs", policies=("fcfs",)),
    Mode("sglang-lpm", plugin=False, schedule_policy="lpm", policies=("lpm",)),
)}

#: Stock SGLang (fcfs) with each ``--radix-eviction-policy`` (SGLang 0.5.23,
#: ``mem_cache/evict_policy.py``), for :data:`EVICTION_CASES`: lru named explicitly (the default),
#: lfu, slru (protected after 2 hits, its default), priority with no priority sent (every request
#: 0: only the prompt/output split's +1 orders the leaves), with the ``reuse`` rule, with the
#: ``steps`` rule (KVFlow's steps-to-execution), and tlru.
EVICTION_MODES: dict[str, Mode] = {m.name: m for m in (
    Mode("evict-lru", plugin=False, schedule_policy="fcfs", policies=("fcfs",), eviction="lru"),
    Mode("evict-lfu", plugin=False, schedule_policy="fcfs", policies=("fcfs",), eviction="lfu"),
    Mode("evict-slru", plugin=False, schedule_policy="fcfs", policies=("fcfs",), eviction="slru"),
    Mode("evict-priority-none", plugin=False, schedule_policy="fcfs", policies=("fcfs",), eviction="priority"),
    Mode("evict-priority", plugin=False, schedule_policy="fcfs", policies=("fcfs",), eviction="priority",
         priority="reuse"),
    Mode("evict-priority-steps", plugin=False, schedule_policy="fcfs", policies=("fcfs",), eviction="priority",
         priority="steps"),
    # T-LRU needs threshold > next_prompt_estimate (else SGLang refuses to start): a branch keeps
    # history + 64 - 1100 tokens, so a request's own prompt tail and output (past its 1,024-token
    # agent prefix) go first, then LRU
    Mode("evict-tlru", plugin=False, schedule_policy="fcfs", policies=("fcfs",), eviction="tlru",
         eviction_config=(("next_prompt_estimate", 64), ("threshold", 1100))),
)}


#: TOPAS on the plugin with and without its in-batch guard (``in_batch_guard``: of an agent whose
#: prefix is not in the radix tree, a decision admits at most one request, and none while a
#: running request computes it), for :data:`GUARD_CASES`; the case's stock SGLang modes
#: (:data:`MODES`) go with them.
GUARD_MODES: dict[str, Mode] = {m.name: m for m in (
    Mode("plugin-guard-off", plugin=True, policies=("topas",), params=(("in_batch_guard", False),)),
    Mode("plugin-guard-on", plugin=True, policies=("topas",), params=(("in_batch_guard", True),)),
)}

#: The cases the guard modes are recorded on.
GUARD_CASES = ("cold-burst",)


def all_modes() -> dict[str, Mode]:
    """Every mode by name: :data:`MODES`, :data:`EVICTION_MODES`, :data:`GUARD_MODES`."""
    return {**MODES, **EVICTION_MODES, **GUARD_MODES}


def find_mode(name: str) -> Mode:
    """The mode ``name`` of :data:`MODES`, :data:`EVICTION_MODES` or :data:`GUARD_MODES`
    (KeyError naming them all)."""
    modes = all_modes()
    if name in modes:
        return modes[name]
    raise KeyError(f"unknown mode {name!r}; modes: {', '.join(modes)}")


# ----------------------------------------------------------------------------- traces
def case_trace(case: Case) -> "Trace":
    """The case's trace (deterministic)."""
    if case.kind == "poisson":
        t = generate(case.shape, case.n_tasks, case.rate, case.seed, case.prefix_tokens, case.input_tokens,
                     case.output_tokens)
        if len(t.agents) != case.agents:
            raise ValueError(f"case {case.name!r}: shape {case.shape} has {len(t.agents)} agents, not {case.agents}")
        trace = Trace(name=case.name, agents=t.agents, tasks=t.tasks,
                      meta={**dict(t.meta), "description": f"contention case {case.name} (topas.fidelity.contention)"})
    elif case.kind == "context":
        trace = _context_trace(case)
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


def _context_trace(case: Case) -> "Trace":
    names = {chr(ord("a") + k): f"{case.name}.{chr(ord('a') + k)}" for k in range(case.agents)}
    agents = {n: Agent(n, case.prefix_tokens, float(case.output_tokens)) for n in names.values()}
    prefix = {n: Segment(f"prefix:{n}", case.prefix_tokens, "prefix") for n in names.values()}
    tasks = []
    for i in range(case.n_tasks):
        tid = f"t{i:03d}"
        holders = [k for k, st in enumerate(case.chain) if st.endswith("+")]
        ctx = Segment(f"ctx:{tid}", case.context_tokens, "context", tid, f"s{holders[0]}") if holders else None
        stages = []
        for k, st in enumerate(case.chain):
            agent, sid = names[st[0]], f"s{k}"
            mid = (ctx,) if st.endswith("+") else ()
            segs = (prefix[agent], *mid, Segment(f"u:{tid}/{sid}", case.input_tokens, "unique", tid, sid))
            stages.append(Stage(sid, agent, case.input_tokens + (case.context_tokens if mid else 0), case.output_tokens,
                                (f"s{k - 1}",) if k else (), segments=segs))
        tasks.append(Task(tid, round(i * case.gap_s, 6), tuple(stages), workflow="context"))
    return Trace(name=case.name, agents=agents, tasks=tuple(tasks),
                 meta={"description": f"contention case {case.name}: {case.n_tasks} tasks of {'-'.join(case.chain)} "
                                      f"sharing a {case.context_tokens}-token context (topas.fidelity.contention)",
                       "generator": "topas.fidelity.contention.case_trace"})


def write_case_trace(case: Case, out_dir: str | Path = OUT_DIR / "traces") -> Path:
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    return write_trace(case_trace(case), Path(out_dir) / f"{case.name}.json.gz")
