"""The workload model: agents, stages, tasks (workflow DAGs) and traces.

Symbols follow docs/method.md: an agent ``a`` has a static prefix (system prompt) of ``l_a`` tokens;
a task ``i`` arrives at ``tau_i`` with a DAG ``G_i`` of stages ``v``; stage ``v`` is served by
agent ``a(v)``, has ``x_v`` suffix input tokens and ``y_v`` true output tokens. ``y_v`` lives in
the trace so the engine can simulate it; schedulers never read it (see ``topas.engine.view``).

A ``topas.trace/2`` trace also spells each stage's prompt (``l_a + x_v`` tokens) as a sequence of
:class:`Segment` s, the nodes of the workload's token-prefix tree (data/traces/README.md,
"Segments"); the engine's radix tree caches them (``topas.engine.radix_cache``).

Objects here are immutable. They are not validated on construction: ``read_trace`` /
``trace_from_dict``, the generators, ``retime`` and the simulator check them with
``topas.workload.validate.validate_trace``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping

import networkx as nx


@dataclass(frozen=True, slots=True)
class Agent:
    """An agent: a role with a static system-prompt prefix of ``prefix_tokens`` (l_a) tokens.

    ``expected_output_tokens`` is a trace-level prior for the agent's output length (what an
    operator would know from history, e.g. the mean of past calls); schedulers may use it as the
    prior of their estimator. It is *not* the true output of any particular call.
    """

    name: str
    prefix_tokens: int
    expected_output_tokens: float


#: Segment kinds, in the order they occur along a prompt (data/traces/README.md, "Segments").
SEGMENT_KINDS: tuple[str, ...] = ("prefix", "shared", "context", "unique")


@dataclass(frozen=True, slots=True)
class Segment:
    """One node of the token-prefix tree: ``tokens`` tokens that follow the same segments in every
    prompt that holds it, so two prompts share exactly the tokens of their common leading run of
    segments. ``id`` is the identity (equal ids, equal token prefixes).

    ``kind``: ``prefix`` (inside the agent prefix ``l_a`` of every stage holding it), ``shared``
    (beyond it, held by stages of several tasks: action headers, templates), ``context`` (held by
    several stages of one task: documents, code, history the task's calls produced or read),
    ``unique`` (one stage only). ``task`` and ``origin`` (the first stage of ``task`` that holds
    it) are set for ``context`` and ``unique`` segments only.
    """

    id: str
    tokens: int
    kind: str
    task: str | None = None
    origin: str | None = None


@dataclass(frozen=True, slots=True)
class Stage:
    """One LLM call of a task: agent ``a(v)``, suffix input ``x_v``, true output ``y_v``.

    ``max_new_tokens`` is the request's output cap as the client sends it (SGLang reserves KV for
    it at admission); ``None`` means the output length ``y_v`` (what the replay client sends).
    Engine-internal, like ``output_tokens``: policies see neither.

    ``segments`` (``topas.trace/2``): the prompt's segments in order, adding up to
    ``l_a + input_tokens``; ``None`` for a ``topas.trace/1`` stage (agent prefix + unique input)."""

    id: str
    agent: str
    input_tokens: int
    output_tokens: int
    parents: tuple[str, ...] = ()
    max_new_tokens: int | None = None
    segments: tuple[Segment, ...] | None = None

    @property
    def max_new(self) -> int:
        """The output cap the engine reserves for: ``max_new_tokens``, else ``output_tokens``."""
        return self.output_tokens if self.max_new_tokens is None else self.max_new_tokens


@dataclass(frozen=True)
class Task:
    """A workflow instance (a job): arrival ``tau_i`` and its DAG of stages, in topological order."""

    id: str
    arrival: float
    stages: tuple[Stage, ...]
    workflow: str = ""

    @cached_property
    def stage_map(self) -> dict[str, Stage]:
        return {s.id: s for s in self.stages}

    @cached_property
    def graph(self) -> nx.DiGraph:
        """G_i as a networkx DiGraph, nodes = stage ids with attribute ``agent``."""
        g = nx.DiGraph()
        for s in self.stages:
            g.add_node(s.id, agent=s.agent)
        for s in self.stages:
            for p in s.parents:
                g.add_edge(p, s.id)
        return g

    @cached_property
    def children(self) -> dict[str, tuple[str, ...]]:
        kids: dict[str, list[str]] = {s.id: [] for s in self.stages}
        for s in self.stages:
            for p in s.parents:
                kids[p].append(s.id)
        return {k: tuple(v) for k, v in kids.items()}

    @cached_property
    def topo_order(self) -> tuple[str, ...]:
        """Stage ids in a deterministic topological order (ties broken by declaration order)."""
        index = {s.id: k for k, s in enumerate(self.stages)}
        return tuple(nx.lexicographical_topological_sort(self.graph, key=lambda n: index[n]))


@dataclass(frozen=True)
class Trace:
    """A workload: the agents table and the tasks, sorted by arrival.

    ``meta`` records how the trace was made (generator and its parameters, provenance).
    """

    name: str
    agents: Mapping[str, Agent]
    tasks: tuple[Task, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def num_requests(self) -> int:
        return sum(len(t.stages) for t in self.tasks)

    @property
    def has_segments(self) -> bool:
        """Whether the stages carry segments (a ``topas.trace/2`` trace)."""
        return any(s.segments is not None for t in self.tasks for s in t.stages)

    def with_arrivals(self, arrivals: list[float]) -> "Trace":
        """The same tasks re-timed with new arrival times (one per task, non-decreasing).

        A re-timed task shares its stages with the original, and with them the tables derived
        from its DAG (``stage_map``, ``children``, ``topo_order``: computed once on the original,
        which a sweep re-times for every run); the trace keeps what ``validate_trace`` checked
        of the original (:data:`CHECKED`), bar the arrival times, which it checks each time."""
        if len(arrivals) != len(self.tasks):
            raise ValueError(f"{len(arrivals)} arrival times for {len(self.tasks)} tasks")
        tasks = []
        for t, a in zip(self.tasks, arrivals):
            new = Task(id=t.id, arrival=float(a), stages=t.stages, workflow=t.workflow)
            for name in _DAG_TABLES:  # what cached_property would store, taken from the original
                new.__dict__[name] = getattr(t, name)
            tasks.append(new)
        return _carry_checked(self, Trace(name=self.name, agents=self.agents, tasks=tuple(tasks), meta=self.meta))

    def with_meta(self, meta: Mapping[str, Any]) -> "Trace":
        """The same trace with ``meta`` in place of its own (what ``validate_trace`` checked stays
        checked: no rule reads ``meta``)."""
        return _carry_checked(self, Trace(name=self.name, agents=self.agents, tasks=self.tasks, meta=meta))

    def head(self, n: int) -> "Trace":
        """The first ``n`` tasks (for quick runs and tests)."""
        return _carry_checked(self, Trace(name=self.name, agents=self.agents, tasks=self.tasks[:n], meta=self.meta))


#: The cached DAG tables a re-timed task shares with its original (``Trace.with_arrivals``).
_DAG_TABLES = ("stage_map", "children", "topo_order")

#: The attribute where ``validate_trace`` records the KV budgets (``None``: no budget rule) under
#: which it found a trace's agents and tasks valid, arrival times aside. A trace's first ``n``
#: tasks and its re-timed copy keep the record: every rule but the arrival order holds for a
#: prefix of the tasks, and none involves the arrival times, which ``validate_trace`` re-checks.
#: Traces are immutable by convention: one changed in place after a check is not re-checked.
CHECKED = "_checked_budgets"


def _carry_checked(src: Trace, dst: Trace) -> Trace:
    checked = src.__dict__.get(CHECKED)
    if checked:
        dst.__dict__[CHECKED] = checked
    return dst
