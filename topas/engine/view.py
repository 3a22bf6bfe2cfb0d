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
from typing import Any, Callable, Mapping, Sequence

from topas.engine.cost import CostModel
from topas.engine.frozen_build import builder


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
    ``reserve`` is the KV the engine reserves now for the request's future output, by the
    engine's own rule (``topas.engine.reservation``; SGLang's ``PrefillAdder``): for a waiting
    request what its admission will reserve, its whole remaining ``max_new_tokens`` (clipped);
    for a running one ``new_token_ratio`` of it. A real scheduler computes it from the request's
    ``max_new_tokens`` and its own ratio; a policy that plans memory reads it (``admit_tokens``,
    ``hold_tokens``) instead of estimating it, so that what it plans is what the engine admits.
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
    reserve: int = 0

    @property
    def admit_tokens(self) -> int:
        """A waiting request's pool tokens beyond its prefix that the engine's admission check
        asks for (:func:`admission_tokens`)."""
        return admission_tokens(self.input_tokens, self.generated, self.reserve)

    @property
    def hold_tokens(self) -> int:
        """A running request's pool tokens now and promised: its KV plus its reservation."""
        return self.kv_tokens + self.reserve


#: ``RequestView(*fields)``, all twelve positional, about 4x cheaper (``frozen_build``): the
#: engine builds one per running request at every scheduling point a policy reads them.
request_view = builder(RequestView)


def admission_tokens(input_tokens: int, generated: int, reserve: int) -> int:
    """The tokens SGLang's ``PrefillAdder.add_one_req`` asks of a request beyond its cached
    prefix: its prompt to prefill (suffix input, plus the generated tokens a preempted request
    recomputes), the slot of the token its prefill produces, and its output ``reserve``. The
    simulator's admission walk uses this function; so does a policy that plans memory."""
    return input_tokens + generated + 1 + reserve


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
    computing: bool = False


#: ``PrefixView(*fields)``, all ten positional (``frozen_build``).
prefix_view = builder(PrefixView)


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
    #: a tuple; at the simulator's decisions a sequence built at its first read, which must be
    #: read (or copied) during the decision (``topas.engine.view_cache.RunningViews``)
    running: Sequence[RequestView]
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
    #: whether requests of one prefill batch share a prefix still being computed (a server
    #: setting; stock SGLang does not: each computes its own copy)
    prefill_prefix_sharing: bool = False

    @property
    def free_tokens(self) -> int:
        return self.kv_budget - self.prefix_tokens - self.request_tokens

    @property
    def resident(self) -> frozenset[str]:
        """R_t: agents whose prefix KV is on the GPU."""
        return frozenset(a for a, p in self.prefixes.items() if p.resident)

    def admit_cap(self, agent: str) -> int | None:
        """How many requests of ``agent`` one admission can start without a duplicate copy of
        its prefix (:func:`admit_cap`)."""
        p = self.prefixes[agent]
        return admit_cap(p.in_tree, p.computing, not p.resident and (p.on_host or p.cached),
                         self.prefill_prefix_sharing)


def admit_cap(in_tree: bool, computing: bool, restorable: bool, sharing: bool) -> int | None:
    """How many requests of one agent an admission can start without a duplicate copy of the
    agent's prefix, as the engine computes prefixes (SGLang inserts a prompt into the radix tree
    only when its prefill ends): any number (None) when the prefix is in the tree, when loading
    it restores a whole copy (``restorable``: from host memory, or a re-pin of a prefix still
    cached) or when the engine shares it inside a batch (``sharing``); none while a request
    computes it (``computing``); else one, which computes it (each other would compute its own).
    The simulator's in-batch guard and the policies' (TOPAS, TOPAS+) read this one rule."""
    if in_tree or restorable or sharing:
        return None
    return 0 if computing else 1


def within_caps(queue: Sequence[Any], cap_of: Callable[[str], int | None]) -> tuple[list[Any], list[Any]]:
    """``queue`` (requests with an ``agent``) split, in order, into the requests that keep their
    place and those held back because their agent's :func:`admit_cap` (``cap_of``) is reached."""
    keep: list[Any] = []
    held: list[Any] = []
    used: dict[str, int] = {}
    caps: dict[str, int | None] = {}
    for r in queue:
        a = r.agent
        if a not in caps:
            caps[a] = cap_of(a)
        cap = caps[a]
        if cap is not None:
            n = used.get(a, 0)
            if n >= cap:
                held.append(r)
                continue
            used[a] = n + 1
        keep.append(r)
    return keep, held


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


def in_batch_deprioritized(queue: Sequence[RequestView], match: Callable[[RequestView], int],
                           prefixes: Mapping[str, PrefixView], check_tokens: int = 32,
                           deprioritize_tokens: int = 32) -> set[str]:
    """SGLang's in-batch prefix check (``SchedulePolicy._compute_prefix_matches``, the
    ``IN_BATCH_PREFIX_CACHING_*`` thresholds): walking ``queue`` in order, a request that matches
    at most ``check_tokens`` cached tokens (``match``) is looked up among the earlier such
    requests; if it shares at least ``deprioritize_tokens`` with one (an earlier request of its
    agent, when the agent's prefix is that long) it is deprioritized, else it joins them. So of
    several requests waiting on one uncached prefix the first goes ahead and computes it, the
    others wait and match it later. Returns the deprioritized request ids."""
    checked: set[str] = set()  # agents with a request in the scratch tree
    out: set[str] = set()
    for r in queue:
        if match(r) > check_tokens:
            continue
        shared = prefixes[r.agent].tokens if r.agent in checked else 0
        if shared >= deprioritize_tokens:
            out.add(r.rid)
        else:
            checked.add(r.agent)
    return out


class InfeasibleDecision(ValueError):
    """Raised by an engine for a Decision it cannot apply; the message names the item and rule."""
