"""What a scheduling policy may see (``EngineView``) and what it may return (``Decision``).

A policy is shown an immutable snapshot of the engine at each decision point. The snapshot is
built from the engine's state but carries *only what a real scheduler could know*: agents'
prefix lengths and output priors, requests' suffix input lengths and tokens generated so far,
the tasks' DAG shapes (or, under ``online`` DAG visibility, only the stages reached so far),
what has finished (with the output lengths observed once a call is
done), and the cost model. It never carries a request's true output length ``y_v`` nor
anything about tasks that have not arrived. ``tests/test_view.py`` checks this. What the view
shows of the output priors and the DAGs is an experiment parameter (``topas.engine.knowledge``).

The same two classes are used by the simulator (``topas.engine.simulator``) and by the SGLang
plugin, so a policy runs unchanged on either engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from topas.engine.cost import CostModel


@dataclass(frozen=True, slots=True)
class StageView:
    """A stage's public shape: agent a(v), suffix input x_v, parents and children. No y_v."""

    id: str
    agent: str
    input_tokens: int
    parents: tuple[str, ...]
    children: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TaskView:
    """A task that has arrived and not finished: tau_i, its DAG and progress.

    ``topo_order`` lists stage ids in topological order; ``done`` the finished stages;
    ``observed_output`` the output length of each finished stage (observed after the fact).
    ``complete`` is False when the run shows DAGs ``online`` (``topas.engine.knowledge``):
    ``stages`` then holds only the stages reached so far (ready, running or finished), and more
    may follow.
    """

    id: str
    arrival: float
    workflow: str
    stages: Mapping[str, StageView]
    topo_order: tuple[str, ...]
    done: frozenset[str]
    observed_output: Mapping[str, int]
    complete: bool = True


@dataclass(frozen=True, slots=True)
class RequestView:
    """A request (one stage of one task) that is ready: waiting or running.

    ``generated`` is y_r(t), the tokens produced so far (kept across a preemption: they must be
    recomputed on readmission). ``kv_tokens`` is the request's own KV now (0 while waiting), with,
    on a trace with segments, its context held in the radix tree beyond the agent prefix (a node
    shared by several running requests counted for each).
    ``service_time`` is the time it has spent in running batches so far, all admissions summed.
    """

    rid: str
    task_id: str
    stage_id: str
    agent: str
    input_tokens: int
    generated: int
    ready_time: float
    kv_tokens: int
    service_time: float
    preemptions: int
    admitted_time: float | None = None  # last admission (running requests only)


@dataclass(frozen=True, slots=True)
class PrefixView:
    """An agent's prefix: l_a tokens, where its KV is, and how many running requests use it.

    ``cached`` (prefix-managing policies only): not resident (not pinned) but still in the
    engine's radix cache, so loading it again costs nothing until the LRU takes it; the engine's
    own cache state, which a real scheduler reads from its radix tree.

    ``in_tree``: the prefix's KV is complete in the radix tree, so a request admitted now matches
    it (SGLang's ``match_prefix``). A resident prefix is not in the tree while a prefill is still
    computing it, nor, under the overlap scheduler, until that prefill's results are processed
    (one iteration later). A real scheduler reads this from its tree.
    """

    agent: str
    tokens: int
    expected_output_tokens: float
    resident: bool
    on_host: bool
    refcount: int
    last_used: float
    cached: bool = False
    in_tree: bool = False


@dataclass(frozen=True, slots=True)
class EngineView:
    """The engine at a decision point t.

    Memory (tokens): ``kv_budget`` = B_t; ``prefix_tokens`` = sum of resident l_a;
    ``request_tokens`` = sum of running requests' own KV; ``free_tokens`` = the rest.
    """

    time: float
    kv_budget: int
    prefix_tokens: int
    request_tokens: int
    prefixes: Mapping[str, PrefixView]
    running: tuple[RequestView, ...]
    waiting: tuple[RequestView, ...]
    tasks: Mapping[str, TaskView]
    cost: CostModel
    decode_batch: int = 0  # requests in the current decode batch
    #: whether the engine has a host KV tier (an evicted prefix is saved to host memory); a
    #: server setting every scheduler knows
    host_tier: bool = False
    #: per waiting request id, the tokens beyond its agent prefix that the engine's radix tree
    #: holds for its prompt now (segment traces only; empty otherwise): what SGLang's
    #: ``match_prefix`` finds past the prefix, read from the tree as a real scheduler reads it
    segment_match: Mapping[str, int] = field(default_factory=dict)

    @property
    def free_tokens(self) -> int:
        return self.kv_budget - self.prefix_tokens - self.request_tokens

    @property
    def resident(self) -> frozenset[str]:
        """R_t: agents whose prefix KV is on the GPU."""
        return frozenset(a for a, p in self.prefixes.items() if p.resident)


@dataclass(frozen=True)
class Decision:
    """A policy's answer: prefix moves, preemptions and an ordered admission list.

    The engine applies, in this order: ``preempt`` (running requests to stop; their KV is freed
    and they return to the waiting queue), ``evict`` (resident prefixes to move to host),
    ``load`` (prefixes to bring to the GPU), then walks ``admit`` in order, admitting each
    request while SGLang's admission check passes and stopping at the first that does not.

    Policies with ``manages_prefixes = False`` return only ``admit`` (and ``preempt`` if they
    declare ``may_preempt``); the engine then loads prefixes on demand and evicts unreferenced
    ones by LRU, as SGLang's radix cache does.
    """

    admit: tuple[str, ...] = ()
    preempt: tuple[str, ...] = ()
    evict: tuple[str, ...] = ()
    load: tuple[str, ...] = ()
    info: Mapping[str, float] = field(default_factory=dict, compare=False)


class InfeasibleDecision(ValueError):
    """Raised by an engine for a Decision it cannot apply; the message names the item and rule."""
