"""An event-driven single-GPU serving simulator, faithful to stock SGLang 0.5.x (docs/design.md).

Time advances by engine iterations, as in SGLang's scheduler loop: if requests are admitted and
not yet prefilled, one (chunked) prefill iteration runs; otherwise one decode step runs for the
whole running batch. Between events (an arrival, a request reaching the scheduler, a completion,
memory exhaustion, a periodic re-check while requests wait) the decode batch is fixed and each
request's context grows by one token per step, so runs of decode steps are advanced in closed form
(``CostModel.decode_steps_time``): cost grows with the number of events, not tokens.

Memory (tokens): the KV pool B holds the resident agent prefixes (each paid once, shared by all
running requests of that agent), every running request's own KV (suffix input + generated tokens,
plus, during its prefill, its own copy of a prefix it could not match) and, with the radix cache,
cached KV that is evictable (finished requests' KV, prefixes nobody uses). A request runs only
while its agent's prefix is resident.

Admission follows SGLang's ``PrefillAdder``: the policy's admission list is walked in order and
stops at the first request that does not fit beside what is promised: every running request's
reserved future output and the admitted requests' whole remaining output. With the radix cache,
evictable KV counts as available and is evicted (LRU leaves) only when memory is allocated, after
the walk has locked each admitted request's prefix. On decode memory exhaustion requests are
retracted (fewest generated tokens first), their KV freed and their generated tokens recomputed on
readmission. Policies that do not manage prefixes get SGLang's radix-cache behaviour (a prefix is
computed by the request that needs it and evicted by the LRU); policies that do (TOPAS) pin their
prefix set and ``load``/``evict`` it: without a host tier a load is a prefill of the prefix (free
if it is still cached) and an evict unpins it (it stays cached until the LRU takes it).

Each behaviour that differs between readings of SGLang is an :class:`EngineConfig` switch whose
default is stock SGLang's; the switches' docstrings cite the SGLang code they model.

Deterministic: no randomness, no iteration over hash-ordered sets.
"""

from __future__ import annotations

import heapq
import time as _time
from typing import Callable, Iterable

from tqdm.auto import tqdm

from topas.engine.config import EngineConfig
from topas.engine.cost import CostModel
from topas.engine.evict_pass import StrategyEviction
from topas.engine.entities import (DECODE, PREFILL, WAITING, Prefix, Request, TaskState, add_reply_latency, roots,
    start_task)
from topas.engine.iterations import Iterations
from topas.engine.knowledge import Knowledge
from topas.engine.memory import KVMemory
from topas.engine.metrics import SimResult, build_result
from topas.engine.policy_api import PolicyAPI
from topas.engine.prefetch import Prefetch
from topas.engine.segments import SegmentMemory
from topas.engine.view import (Decision, EngineView, InfeasibleDecision, PrefixView, admission_tokens, admit_cap,
    within_caps)
from topas.engine.view_cache import ViewedDict
from topas.workload.model import Trace
from topas.workload.validate import validate_trace


class SimulationStuck(RuntimeError):
    """The engine is idle with requests waiting and the policy admits none of them."""


class Simulator(KVMemory, Iterations, SegmentMemory, StrategyEviction, Prefetch):
    #: ``view`` keeps each task's view until the engine touches the task (``ViewedDict``); an engine
    #: whose tasks' views also change elsewhere (a cluster's, where other engines finish their
    #: stages) sets this False
    cache_task_views = True

    def __init__(
        self,
        trace: Trace,
        policy: PolicyAPI,
        cost: CostModel,
        config: EngineConfig | None = None,
        knowledge: Knowledge | None = None,
    ) -> None:
        self.config = cfg = config or EngineConfig()
        #: what the policy's view shows of output priors and DAGs (never what the engine runs)
        self.knowledge = knowledge or Knowledge()
        if cfg.kv_budget is not None:
            cost = cost.with_budget(cfg.kv_budget)
        if cfg.swap_bandwidth_scale != 1.0:
            cost = cost.with_swap_bandwidth_scale(cfg.swap_bandwidth_scale)
        self.cost = cost
        self.budget = cost.kv_budget_tokens
        self.chunk = cfg.max_prefill_tokens or cost.max_prefill_tokens
        validate_trace(trace, kv_budget=self.budget)
        self.trace = trace
        self.policy = policy
        self.manages = policy.manages_prefixes
        policy.reset()
        self._init_eviction()

        self.now = 0.0
        self.prefixes: dict[str, Prefix] = {name: Prefix(agent=a) for name, a in trace.agents.items()}
        self.prefix_tokens = 0  # resident prefixes
        self.request_tokens = 0  # running requests' own KV
        #: radix cache: cached KV that occupies the pool but is evictable and free to the
        #: policy's view (finished requests' leaves, prefixes a managing policy unpinned)
        self.evictable_tokens = 0
        self.tasks: dict[str, TaskState] = {}
        #: arrived, not finished (each task's view kept until a stage of it finishes or, online,
        #: becomes ready: ``ViewedDict.touch``)
        self.active_tasks: ViewedDict = ViewedDict()
        self.finished_tasks = 0
        self.requests: dict[str, Request] = {}
        #: insertion-ordered (a waiting request's view does not change while it waits)
        self.waiting: ViewedDict = ViewedDict()
        self.prefill_queue: list[Request] = []
        self.decoding: dict[str, Request] = {}
        self._arrivals = list(trace.tasks)
        self._next_arrival = 0
        self._pending_move_time = 0.0
        self._dirty = False
        self._idle_retry = False
        self._ratio_init = cfg.init_new_token_ratio
        self._ratio_min = cfg.init_new_token_ratio * cfg.min_new_token_ratio_factor
        self._ratio_decay = (self._ratio_init - self._ratio_min) / cfg.new_token_ratio_decay_steps
        self.new_token_ratio = self._ratio_init
        self._steps_since_check = 0
        self._seq = 0
        # the request path: requests reach the scheduler later (heap of (time, seq, request))
        self._half_latency = 0.5 * cfg.request_latency_s
        self._delayed: list[tuple[float, int, Request]] = []
        # the admission gate (SGLang's running_batch.batch_is_full)
        self._batch_full = False
        self._gate_until_prefill = False  # set while the decode batch was empty: lifts after the prefill
        # the radix cache
        self._leaves: list[tuple[float, int, str, int, int, str]] = []  # (finish, seq, agent, kv, gen, rid)
        self._cached_by_agent: dict[str, int] = {a: 0 for a in self.prefixes}
        self._generation: dict[str, int] = {a: 0 for a in self.prefixes}  # bumped when a prefix goes
        self._ghost: dict[str, bool] = {}  # prefixes a managing policy unpinned, still cached
        self._merged: dict[str, str | None] = {}  # agent -> rid whose radix node holds the prefix
        self._computing: set[str] = set()  # agents whose prefix a running request is computing
        # overlap scheduler: prefixes computed by the last prefill, cached once the next batch is
        # scheduled, and the requests whose duplicate copy of a prefix is freed then
        self._cached_after_next: list[str] = []
        self._free_after_next: list[Request] = []
        self._settling = False
        # the segment radix tree below the agent prefixes (topas.trace/2 traces only)
        self._tree = (self._new_tree() if cfg.radix_cache and cfg.segment_cache and trace.has_segments
                      else None)
        self._tails: dict[str, tuple] = {}
        self._insert_after_next: list[Request] = []
        # background host -> GPU prefix loads (topas.engine.prefetch): the (agent, steps) to
        # prefetch at a decision point, read from the view (None: no prefetch, the default engine);
        # agent -> when its copy completes; the link's queue and its copy in progress
        self._prefetcher: Callable[[EngineView], tuple[tuple[str, int], ...]] | None = None
        if (cfg.host_tier and cfg.radix_cache and not self.manages
                and getattr(self._eviction, "prefetches", False)):  # the kvflow strategy
            self._prefetcher = self._eviction.prefetch_agents  # type: ignore[attr-defined]
        self._loading: dict[str, float | None] = {}  # None: queued, not yet on the link
        self._link_queue: list[tuple[int, int, str]] = []  # (priority, seq, agent)
        self._link_current: str | None = None
        self._protected: tuple[tuple[str, int], ...] = ()  # (agent, steps) due within L steps, nearest first
        # records
        self.prefix_events: list[tuple] = []
        self.timeline: list[tuple] = []
        self.decisions: list[tuple] = []
        self.decode_steps = 0
        self.decode_batch_area = 0  # sum over decode steps of the batch size
        #: requests started with their own copy of a prefix another request computes, and the
        #: copies' tokens; preempted requests whose room the decision's admissions left unused
        self.dup_copies = 0
        self.dup_tokens = 0
        self.preempt_unused = 0
        self.busy_time = 0.0

    # ------------------------------------------------------------------ main loop
    def run(self, progress: bool = False) -> SimResult:
        n_tasks = len(self._arrivals)
        wall0 = _time.perf_counter()
        bar = tqdm(total=n_tasks, desc=f"simulate {self.policy.name}", unit="task", disable=not progress)
        finished = 0
        while self.step():
            if self.finished_tasks != finished:
                bar.update(self.finished_tasks - finished)
                finished = self.finished_tasks
        if self.waiting:
            raise SimulationStuck(
                f"policy {self.policy.name!r} admitted none of the {len(self.waiting)} waiting "
                f"requests (e.g. {next(iter(self.waiting))}) while the engine is idle at t={self.now:.6f}s"
            )
        bar.close()
        add_reply_latency(self.tasks.values(), self._half_latency)
        return build_result(self, wall_seconds=_time.perf_counter() - wall0)

    def step(self) -> bool:
        """One iteration of the engine: admit what arrived, let the policy decide, then run one
        prefill iteration, or decode until the next event, or (idle) ask the policy once more,
        or wait for :meth:`_idle_until`. False when there is nothing left to do: idle, the
        policy asked again, and nothing more reaches the engine."""
        self._admit_arrivals()
        self._loads_done()
        if self._dirty and self.waiting:
            self._decide()
        if self.prefill_queue or self._pending_prefix_prefill():
            self._prefill_iteration()
        elif self.decoding:
            self._decode_until_event()
        elif self.waiting and not self._idle_retry:
            # Idle with requests waiting and nothing admitted: ask the policy once more (it can
            # see that nothing changed and fall back) before waiting for the next arrival.
            self._process_last_batch()  # an idle iteration processes the last batch
            self._idle_retry = True
            self._dirty = True
        elif (t_next := self._idle_until()) is not None:
            self._process_last_batch()
            self.now = max(self.now, t_next)
            self._idle_retry = False
        else:
            return False
        return True

    def _idle_until(self) -> float | None:
        """How far an idle engine moves its clock: to :meth:`_next_event` (None: nothing more
        comes). A cluster's engine waits for its own deliveries only, never past them to the
        cluster's horizon (:class:`topas.cluster.engine.ClusterEngine`)."""
        return self._next_event()

    def _next_event(self) -> float | None:
        """When something next reaches the engine from outside: a task arrival or a request at the
        end of its request path (None: never)."""
        t = self._arrivals[self._next_arrival].arrival if self._next_arrival < len(self._arrivals) else None
        if self._delayed and (t is None or self._delayed[0][0] < t):
            t = self._delayed[0][0]
        if self._loading and (t_load := self._next_load()) is not None and (t is None or t_load < t):
            t = t_load
        return t

    # ------------------------------------------------------------------ arrivals and readiness
    def _admit_arrivals(self) -> None:
        while self._next_arrival < len(self._arrivals) and self._arrivals[self._next_arrival].arrival <= self.now:
            task = self._arrivals[self._next_arrival]
            self._next_arrival += 1
            ts = start_task(task)
            self.tasks[task.id] = ts
            self.active_tasks[task.id] = ts
            self.requests.update((r.rid, r) for r in ts.requests.values())
            for r in roots(ts):
                self._make_ready(r, task.arrival)
        while self._delayed and self._delayed[0][0] <= self.now:
            t, _, r = heapq.heappop(self._delayed)
            self._enqueue(r, t)

    def _make_ready(self, r: Request, t: float) -> None:
        """``r``'s parents finished (a root: its task arrived) at ``t``; it reaches the scheduler a
        request path later (half of it for a root: the way in only)."""
        delay = self._half_latency if not r.stage.parents else 2 * self._half_latency
        if delay <= 0:
            self._enqueue(r, t)
        else:
            self._seq += 1
            heapq.heappush(self._delayed, (t + delay, self._seq, r))

    def _enqueue(self, r: Request, t: float) -> None:
        r.ready_time = t
        r.state_since = t
        r.state = WAITING
        if self.knowledge.online:
            self.active_tasks.touch(r.task.task.id)  # its task now shows the stage
        self.waiting[r.rid] = r
        self._dirty = True
        self._set_request_priority(r)

    # ------------------------------------------------------------------ decisions
    def view(self) -> EngineView:
        now = self.now
        know = self.knowledge
        prefixes = {
            a: PrefixView(a, p.tokens, know.prior(a, p.agent.expected_output_tokens), p.resident, p.on_host,
                          p.refcount, p.last_used, self._ghost.get(a, False),
                          p.resident and p.prefill_left == 0 and a not in self._computing
                          and a not in self._loading,
                          a in self._computing)
            for a, p in self.prefixes.items()
        }
        reserve = self._reserve
        running = tuple(r.view(now, reserve(r)) for r in self._running())
        if not self.config.full_output_reserve:
            self.waiting.touch_all()  # a waiting request's reservation follows new_token_ratio
        waiting = tuple(self.waiting.viewed(lambda r: r.view(now, reserve(r))).values())
        if not self.cache_task_views:
            self.active_tasks.touch_all()
        tasks = dict(self.active_tasks.viewed(lambda ts: ts.view(know.online)))
        return EngineView(
            time=now,
            kv_budget=self.budget,
            prefix_tokens=self.prefix_tokens,
            request_tokens=self.request_tokens,
            prefixes=prefixes,
            running=running,
            waiting=waiting,
            tasks=tasks,
            cost=self.cost,
            decode_batch=len(self.decoding),
            host_tier=self.config.host_tier,
            segment_match=self._seg_matches(),
            prefill_prefix_sharing=self.config.prefill_prefix_sharing,
        )

    def _running(self) -> Iterable[Request]:
        yield from self.prefill_queue
        yield from self.decoding.values()

    def _decide(self) -> None:
        self._dirty = False
        self._steps_since_check = 0
        if self._prefetcher is not None:  # KVFlow's DispatchLoadTasks (after the walk), whatever the gate
            self._protected = self._prefetcher(self.view())
        if self._gated():
            if self._protected:
                self._prefetch(self._protected)
            return  # SGLang skips get_new_batch_prefill while batch_is_full
        self._batch_full = False
        decode_empty = not self.decoding
        view = self.view()
        t0 = _time.perf_counter()
        decision = self.policy.decide(view)
        wall = _time.perf_counter() - t0
        admitted = self.apply(decision)
        if self._protected:
            self._prefetch(self._protected)
        running = len(self.prefill_queue) + len(self.decoding)
        if admitted < len(decision.admit) and 0 < running < self.config.max_running_requests:
            # add_one_req answered NO_TOKEN while something can run. Set on an empty running batch,
            # the flag goes with it once the prefill batch replaces it (get_next_batch_to_run).
            self._batch_full = True
            self._gate_until_prefill = decode_empty
        self.decisions.append(
            (self.now, wall, len(view.waiting), len(view.running), len(decision.admit), admitted,
             len(decision.preempt), len(decision.evict), len(decision.load), dict(decision.info))
        )

    def _gated(self) -> bool:
        """Admission is shut (``batch_is_full``) while something runs."""
        return self.config.admission_gate and self._batch_full and bool(self.prefill_queue or self.decoding)

    def apply(self, d: Decision) -> int:
        """Apply a Decision (validating it); returns the number of requests admitted."""
        pname = self.policy.name
        if not self.manages and (d.evict or d.load or (d.preempt and not self.policy.may_preempt)):
            moves = "; ".join(f"{k} {tuple(v)!r}" for k, v in
                              (("evict", d.evict), ("load", d.load), ("preempt", d.preempt)) if v)
            raise InfeasibleDecision(
                f"policy {pname!r} does not manage prefixes (manages_prefixes = False) but returned {moves}; "
                "such a policy may only return an admit order (and preemptions if it declares may_preempt)"
            )
        if len(set(d.admit)) != len(d.admit):
            dup = sorted({r for r in d.admit if d.admit.count(r) > 1})
            raise InfeasibleDecision(f"policy {pname!r} admits {dup[0]} twice")
        for rid in d.admit:
            if rid not in self.waiting:
                raise InfeasibleDecision(f"policy {pname!r} admits {rid}, which is not waiting")
        # 1. preemptions
        for rid in d.preempt:
            r = self.requests.get(rid)
            if r is None or r.state not in (PREFILL, DECODE):
                raise InfeasibleDecision(f"policy {pname!r} preempts {rid}, which is not running")
            if rid in d.admit:
                raise InfeasibleDecision(f"policy {pname!r} both preempts and admits {rid}")
        preempted = [(self.requests[rid], self.requests[rid].kv, self._reserve(self.requests[rid]))
                     for rid in d.preempt]
        for r, _, _ in preempted:
            self._stop(r, by_engine=False)
        # 2. evictions
        for a in d.evict:
            p = self._prefix(a, pname)
            if not p.resident:
                raise InfeasibleDecision(f"policy {pname!r} evicts prefix {a!r}, which is not resident")
            if p.refcount:
                raise InfeasibleDecision(
                    f"policy {pname!r} evicts prefix {a!r}, used by {p.refcount} running request(s)"
                )
            self._evict(p)
        # 3. loads
        for a in d.load:
            p = self._prefix(a, pname)
            if p.resident:
                raise InfeasibleDecision(f"policy {pname!r} loads prefix {a!r}, which is already resident")
            if self.prefix_tokens + self.request_tokens + p.tokens > self.budget:
                raise InfeasibleDecision(
                    f"policy {pname!r} loads prefix {a!r} ({p.tokens} tokens) but only "
                    f"{self.budget - self.prefix_tokens - self.request_tokens} of {self.budget} KV tokens are free"
                )
            self._load(p)
        # 4. admissions, SGLang PrefillAdder style; then the allocation's evictions
        admit = self._guarded(d.admit) if self.config.in_batch_guard else d.admit
        admitted = self._admit(admit)
        if preempted:
            self._count_unused_preemptions(preempted, set(d.evict))
        self._settle()
        return admitted

    def _guarded(self, admit: tuple[str, ...]) -> tuple[str, ...]:
        """``admit`` under the in-batch guard (``EngineConfig.in_batch_guard``): the requests of an
        agent past its :func:`~topas.engine.view.admit_cap` (one for a prefix not in the tree, none
        while a request computes it) are held back for a later decision."""
        keep, held = within_caps([self.waiting[rid] for rid in admit], self._admit_cap)
        return tuple(r.rid for r in keep) if held else admit

    def _admit_cap(self, agent: str) -> int | None:
        """The engine's own :func:`~topas.engine.view.admit_cap` of ``agent`` (what the view shows)."""
        p = self.prefixes[agent]
        in_tree = p.resident and p.prefill_left == 0 and agent not in self._computing and agent not in self._loading
        restorable = not p.resident and (p.on_host or self._ghost.get(agent, False))
        return admit_cap(in_tree, agent in self._computing, restorable, self.config.prefill_prefix_sharing)

    def _count_unused_preemptions(self, preempted: list[tuple[Request, int, int]], evicted: set[str]) -> None:
        """Count the preempted requests whose room the admission walk left unused: in the order
        preempted, each that would still fit, with its KV, its reservation and (if the decision
        evicted it) its prefix, in what the walk left free (``PrefillAdder``'s remaining tokens)."""
        left = self.budget - self.request_tokens - self._locked_prefix_tokens() - self._reserved()
        counted: set[str] = set()
        for r, kv, reserve in preempted:
            need = kv + reserve
            if r.agent in evicted and r.agent not in counted:
                need += self.prefixes[r.agent].tokens
            if need <= left:
                left -= need
                counted.add(r.agent)
                self.preempt_unused += 1

    def _admit(self, admit: tuple[str, ...]) -> int:
        """Admit the (validated, waiting) requests of ``admit`` in order while they fit; stop at
        the first that does not (``PrefillAdder.add_one_req``). Returns the number admitted."""
        pname = self.policy.name
        admitted = 0
        reserved = self._reserved()
        for rid in admit:
            r = self.waiting[rid]
            if len(self.prefill_queue) + len(self.decoding) >= self.config.max_running_requests:
                break
            if self._prefetcher is not None and self._skip_loading(r.agent):
                continue  # its prefix is loading from host: skipped, not blocking the walk
            p = self.prefixes[r.agent]
            own_reserve = self._reserve(r)
            if self.config.full_output_reserve and not admitted and not self.prefill_queue and not self.decoding:
                # Our one departure from add_one_req's strict inequality: an idle engine admits a
                # request that exactly fills the pool (the trace validator accepts l_a + x + y = B;
                # SGLang would refuse it forever).
                own_reserve = max(own_reserve - 1, 0)
            if not p.resident:
                if self.manages:
                    raise InfeasibleDecision(
                        f"policy {pname!r} admits {rid} but its prefix {r.agent!r} is not resident or loaded"
                    )
                # it computes the prefix itself: prefix + its prompt (+ the slot of its first token)
                if not self._fits(p.tokens + admission_tokens(r.x, r.generated, own_reserve) + reserved, exclude=p):
                    break
                self._load(p)
                copy = 0
                matched = 0
            else:
                copy = self._prefix_copy(r, p)
                # locking a cached prefix takes it out of the evictable KV (add_one_req checks again
                # after _lock_node)
                lock = p.tokens if self.config.radix_cache and not self._locked(p) else 0
                matched = 0
                if self._tree is not None and not copy and p.prefill_left == 0:
                    _, matched, seg_lock = self._seg_match(r)
                    lock += seg_lock
                if not self._fits(lock + copy - matched + admission_tokens(r.x, r.generated, own_reserve) + reserved,
                                  exclude=p):
                    break
            self._start(r, p, copy)
            reserved += own_reserve
            admitted += 1
        return admitted

    def _prefix_copy(self, r: Request, p: Prefix) -> int:
        """Prefix tokens ``r`` must compute in its own prefill: the whole prefix while another
        request is computing it (SGLang matched none of it), unless ``prefill_prefix_sharing``."""
        if self.config.prefill_prefix_sharing or r.agent not in self._computing:
            return 0
        return p.tokens

    def _fits(self, tokens: int, exclude: Prefix) -> bool:
        """Whether ``tokens`` more fit in the pool. With the radix cache: beside everything locked
        (running requests' KV, prefixes in use, pinned or being computed), evictable KV counting as
        available, as ``PrefillAdder`` counts it. Without: in the free pool, after evicting
        unreferenced prefixes (LRU) at once for a policy that does not manage them."""
        if self.config.radix_cache:
            return self.budget - self.request_tokens - self._locked_prefix_tokens() >= tokens
        if self.budget - self.prefix_tokens - self.request_tokens >= tokens:
            return True
        return not self.manages and self._make_room(tokens, exclude=exclude)

    def _locked_prefix_tokens(self) -> int:
        if self.manages:
            return self.prefix_tokens  # pinned
        return sum(p.tokens for p in self.prefixes.values() if self._locked(p))

    def _locked(self, p: Prefix) -> bool:
        """A resident prefix that cannot be evicted: pinned by a managing policy, used by a running
        request, or being computed."""
        a = p.agent.name
        return p.resident and (self.manages or bool(p.refcount or p.prefill_left) or a in self._computing
                               or a in self._loading)

    def _prefix(self, agent: str, pname: str) -> Prefix:
        p = self.prefixes.get(agent)
        if p is None:
            raise InfeasibleDecision(f"policy {pname!r} names unknown agent prefix {agent!r}")
        return p


def simulate(
    trace: Trace,
    policy: PolicyAPI,
    cost: CostModel,
    config: EngineConfig | None = None,
    progress: bool = False,
    knowledge: Knowledge | None = None,
) -> SimResult:
    """Run ``trace`` under ``policy`` on the engine described by ``cost`` and ``config``;
    ``knowledge`` degrades what the policy sees (``topas.engine.knowledge``; default: today's)."""
    return Simulator(trace, policy, cost, config, knowledge).run(progress=progress)
