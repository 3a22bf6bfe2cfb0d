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

The engine is composed of parts, each owning its state and used through its methods
(docs/design.md, "Engine parts"): the :class:`~topas.engine.clock.Clock`, the
:class:`~topas.engine.request_path.RequestPath` (arrivals and requests on their way), the
:class:`~topas.engine.memory.KVMemory` (the pool and the agent prefixes), the
:class:`~topas.engine.segments.SegmentMemory` (the segment tree, with a ``topas.trace/2``
trace), the :class:`~topas.engine.evict_pass.Eviction` (what goes), the
:class:`~topas.engine.prefetch.Prefetch` (the host link), the
:class:`~topas.engine.iterations.Batch` (the running batch and its iterations) and the
:class:`~topas.engine.admission.Admission` (a decision applied, the admission walk). The
:class:`Simulator` wires them and is the scheduler: it owns the waiting queue, the tasks and the
decision points, and records the run.

Deterministic: no randomness, no iteration over hash-ordered sets.
"""

from __future__ import annotations

import time as _time
from typing import Mapping

from tqdm.auto import tqdm

from topas.engine.admission import Admission
from topas.engine.clock import Clock
from topas.engine.config import EngineConfig
from topas.engine.cost import CostModel
from topas.engine.entities import (PENDING, WAITING, Prefix, Request, TaskState, add_reply_latency, roots,
    start_task)
from topas.engine.evict_pass import Eviction
from topas.engine.eviction import OfflineFuture, RequestStates, eviction_strategy
from topas.engine.iterations import Batch
from topas.engine.knowledge import Knowledge
from topas.engine.memory import KVMemory
from topas.engine.metrics import RunRecords, SimResult, build_result
from topas.engine.policy_api import PolicyAPI
from topas.engine.prefetch import Prefetch
from topas.engine.request_path import RequestPath
from topas.engine.segments import SegmentMemory
from topas.engine.view import Decision, EngineView, RequestView, TaskView
from topas.engine.view_cache import PrefixViews, RunningViews, UnreadTasks, ViewedDict, seal
from topas.workload.model import Trace
from topas.workload.validate import validate_trace


class SimulationStuck(RuntimeError):
    """The engine is idle with requests waiting and the policy admits none of them."""


class Simulator:
    """One engine: its parts wired, and the scheduler that owns the waiting queue, the tasks and
    the decision points (the module docstring)."""

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
        *,
        routed: bool = False,
    ) -> None:
        """``routed``: the engine of a cluster, whose router sends it each request
        (:meth:`make_ready`, ``RequestPath.send``): it knows the trace's agents and segments, none
        of its tasks (the first is checked against its budget; the cluster checks them all)."""
        self.config = cfg = config or EngineConfig()
        #: what the policy's view shows of output priors and DAGs (never what the engine runs)
        self._knowledge = knowledge or Knowledge()
        if cfg.kv_budget is not None:
            cost = cost.with_budget(cfg.kv_budget)
        if cfg.swap_bandwidth_scale != 1.0:
            cost = cost.with_swap_bandwidth_scale(cfg.swap_bandwidth_scale)
        self.cost = cost
        budget = cost.kv_budget_tokens
        validate_trace(trace.head(1) if routed else trace, kv_budget=budget)
        self.trace = trace.head(0) if routed else trace
        self.policy = policy
        self.manages = policy.manages_prefixes
        policy.reset()
        strategy = eviction_strategy(cfg.eviction)

        # the parts (docs/design.md, "Engine parts")
        self.clock = clock = Clock()
        self.path = RequestPath(() if routed else trace.tasks, cfg.request_latency_s)
        self.memory = memory = KVMemory({name: Prefix(agent=a) for name, a in trace.agents.items()}, budget, cfg,
                                        cost, clock, self.manages)
        #: the segment tree below the agent prefixes (topas.trace/2 traces under the radix cache only)
        self.segments = (SegmentMemory(memory, clock, heap=strategy.heap_fast_path, history=strategy.needs_history)
                         if cfg.radix_cache and cfg.segment_cache and trace.has_segments else None)
        self.eviction = Eviction(strategy, memory, self.segments, cfg, clock, policy, self.passing_view,
                                 self.offline_future)
        # background host -> GPU prefix loads: the kvflow strategy's, with a host tier
        prefetcher = (strategy.prefetch_agents  # type: ignore[attr-defined]
                      if cfg.host_tier and cfg.radix_cache and not self.manages and getattr(strategy, "prefetches", False)
                      else None)
        self.prefetch = Prefetch(memory, self.eviction, clock, cost, prefetcher)
        memory.connect(self.segments, self.prefetch)
        self.batch = Batch(cfg, cost, cfg.max_prefill_tokens or cost.max_prefill_tokens, clock, memory,
                           self.segments, self.eviction, self, self.manages)

        # the scheduler's own state
        self.tasks: dict[str, TaskState] = {}
        #: arrived, not finished (each task's view kept until a stage of it finishes or, online,
        #: becomes ready: ``ViewedDict.touch``)
        self.active_tasks: ViewedDict = ViewedDict()
        self.finished_tasks = 0
        self.requests: dict[str, Request] = {}
        #: insertion-ordered (a waiting request's view does not change while it waits)
        self.waiting: ViewedDict = ViewedDict()
        #: the agent prefixes' views, each kept until its prefix's state changes
        self._prefix_views = PrefixViews(memory, self.knowledge.prior)
        self._dirty = False  # something changed since the policy was last asked
        self._idle_retry = False
        self._steps_since_check = 0
        # the admission gate (SGLang's running_batch.batch_is_full)
        self._batch_full = False
        self._gate_until_prefill = False  # set while the decode batch was empty: lifts after the prefill
        #: a policy's decisions applied (the admission walk)
        self.admission = Admission(cfg, policy, self.waiting, self.requests, memory, self.batch, self.segments,
                                   self.prefetch, self.eviction)
        # records
        self.timeline: list[tuple] = []
        self.decisions: list[tuple] = []

    @property
    def knowledge(self) -> Knowledge:
        """What the policy is shown of the priors and the DAGs, fixed at construction (the views'
        caches are built from it): pass it to :class:`Simulator` or :func:`simulate`."""
        return self._knowledge

    @property
    def now(self) -> float:
        """The engine's clock (:attr:`clock`)."""
        return self.clock.now

    # ------------------------------------------------------------------ main loop
    def run(self, progress: bool = False) -> SimResult:
        wall0 = _time.perf_counter()
        bar = tqdm(total=self.path.n_tasks, desc=f"simulate {self.policy.name}", unit="task", disable=not progress)
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
        add_reply_latency(self.tasks.values(), self.path.half_latency)
        return build_result(self.records(), wall_seconds=_time.perf_counter() - wall0)

    def records(self) -> RunRecords:
        """What the run recorded, from the scheduler and its parts (``build_result``'s input)."""
        b = self.batch
        return RunRecords(
            tasks=self.tasks, requests=self.requests, prefixes=self.memory.prefixes,
            prefix_events=self.memory.prefix_events, timeline=self.timeline, decisions=self.decisions,
            policy=self.policy, decode_batch_area=b.decode_batch_area, decode_steps=b.decode_steps,
            busy_time=b.busy_time, budget=self.memory.budget, dup_copies=b.dup_copies, dup_tokens=b.dup_tokens,
            preempt_unused=self.admission.preempt_unused)

    def step(self) -> bool:
        """One iteration of the engine: admit what arrived, let the policy decide, then run one
        prefill iteration, or decode until the next event, or (idle) ask the policy once more,
        or wait for :meth:`idle_until`. False when there is nothing left to do: idle, the
        policy asked again, and nothing more reaches the engine."""
        self._admit_arrivals()
        if self.prefetch.loads_done():
            self._dirty = True
        if self._dirty and self.waiting:
            self._decide()
        if self.batch.prefill_queue or self.memory.prefix_prefill_pending():
            self._prefill_iteration()
        elif self.batch.decoding:
            self._decode_until_event()
        elif self.waiting and not self._idle_retry:
            # Idle with requests waiting and nothing admitted: ask the policy once more (it can
            # see that nothing changed and fall back) before waiting for the next arrival.
            self.batch.process_last_batch()  # an idle iteration processes the last batch
            self._idle_retry = True
            self._dirty = True
        elif (t_next := self.idle_until()) is not None:
            self.batch.process_last_batch()
            self.clock.wait_until(t_next)
            self._idle_retry = False
        else:
            return False
        return True

    def _prefill_iteration(self) -> None:
        self.batch.prefill_iteration()
        self._idle_retry = False
        if self._gate_until_prefill:  # the prefill batch became the running batch: try again
            self._gate_until_prefill = False
            self._batch_full = False
            self._dirty = True
        self._record_timeline()

    def _decode_until_event(self) -> None:
        batch = self.batch
        batch.process_last_batch()
        if not batch.can_decode():
            batch.out_of_memory()
            return
        recheck = self.waiting and not self._gated()  # a shut gate opens only at a finish (an event)
        cap = None
        if recheck:
            cap = max(1, self.config.recheck_steps - self._steps_since_check)
            if self._dirty:  # a prefix just entered the tree (prefix_entered_tree): decide after this step
                cap = 1
        n = batch.decode_until_event(cap, self.next_event())
        self._idle_retry = False
        if recheck:
            self._steps_since_check += n
            if self._steps_since_check >= self.config.recheck_steps:
                self._dirty = True
        self._record_timeline()

    def _record_timeline(self) -> None:
        if self.config.record_timeline:
            m, b = self.memory, self.batch
            self.timeline.append((self.clock.now, m.prefix_tokens, m.request_tokens, len(b.decoding),
                                  len(b.prefill_queue), len(self.waiting), m.evictable_tokens))

    def idle_until(self) -> float | None:
        """How far an idle engine moves its clock: to :meth:`next_event` (None: nothing more
        comes). A cluster's engine waits for its own deliveries only, never past them to the
        cluster's horizon (:class:`topas.cluster.engine.ClusterEngine`)."""
        return self.next_event()

    def next_event(self) -> float | None:
        """When something next reaches the engine from outside: a task arrival, a request at the
        end of its request path or a host copy completing (None: never)."""
        t = self.path.next_arrival()
        t_path = self.path.next_delivery()
        if t_path is not None and (t is None or t_path < t):
            t = t_path
        if (t_load := self.prefetch.next_load()) is not None and (t is None or t_load < t):
            t = t_load
        return t

    def decision_pending(self) -> bool:
        """Requests wait and the policy has a decision to take (it was not just asked again with
        nothing changed)."""
        return bool(self.waiting) and (not self._idle_retry or self._dirty)

    def offline_future(self) -> OfflineFuture:
        """The run's true future, for an offline bound's eviction only (``EvictionStrategy.bound``)."""
        return OfflineFuture(self.trace, self.clock.now, RequestStates(self.requests))

    # ------------------------------------------------------------------ arrivals and readiness
    def _admit_arrivals(self) -> None:
        now = self.clock.now
        for task in self.path.arrived(now):
            ts = start_task(task)
            self.tasks[task.id] = ts
            self.active_tasks[task.id] = ts
            self.requests.update((r.rid, r) for r in ts.requests.values())
            for r in roots(ts):
                self.make_ready(r, task.arrival)
        for t, r in self.path.delivered(now):
            self._enqueue(r, t)

    def make_ready(self, r: Request, t: float) -> None:
        """``r``'s parents finished (a root: its task arrived) at ``t``; it reaches the scheduler a
        request path later (``RequestPath.delay``)."""
        if self.path.delay(r) <= 0:
            self._enqueue(r, t)
        else:
            self.path.send(r, t)

    def _enqueue(self, r: Request, t: float) -> None:
        r.ready_time = t
        r.state_since = t
        r.state = WAITING
        if self.knowledge.online:
            self.active_tasks.touch(r.task.task.id)  # its task now shows the stage
        self.waiting[r.rid] = r
        self._dirty = True
        self.eviction.set_request_priority(r)

    # ------------------------------------------------------------------ the batch's callbacks
    def requeue(self, r: Request, view: RequestView, by_engine: bool) -> None:
        """The batch stopped ``r`` (``view``: as it ran): it waits again."""
        self.waiting[r.rid] = r
        self._dirty = True
        self._batch_full = False  # a request left the running batch
        self.policy.on_preempt(view, self.clock.now, by_engine)

    def stage_finished(self, r: Request, view: RequestView) -> None:
        """``r`` finished (``view``: as it ran): its task progresses, its children become ready."""
        now = self.clock.now
        self._batch_full = False
        ts = r.task
        ts.done.add(r.stage.id)
        ts.invalidate()
        self.active_tasks.touch(ts.task.id)
        self._dirty = True
        for child in ts.task.children[r.stage.id]:
            c = ts.requests[child]
            if c.state == PENDING and all(q in ts.done for q in c.stage.parents):
                self.make_ready(c, now)
        if len(ts.done) == len(ts.task.stages):
            ts.finish_time = now
            del self.active_tasks[ts.task.id]
            self.finished_tasks += 1
        self.policy.on_finish(view, now, r.y)

    def prefix_entered_tree(self, agent: str) -> None:
        """``agent``'s prefix has just entered the radix tree: with ``recheck_on_insert``, ask the
        policy again if a request of that agent waits (SGLang schedules at every iteration, so a
        request held back while the prefix was computed is admitted at the next one)."""
        if self.config.recheck_on_insert and any(r.agent == agent for r in self.waiting.values()):
            self._dirty = True

    # ------------------------------------------------------------------ decisions
    def view(self, lazy_running: bool = False, with_tasks: bool = True) -> EngineView:
        """What the policy sees now (``topas.engine.view``); ``lazy_running``: the running
        requests' views built at their first read (:class:`RunningViews`; the decision's view,
        sealed once the policy has decided); ``with_tasks``: False for a policy that does not read
        the tasks (``PolicyAPI.reads_tasks``), whose view then shows :class:`UnreadTasks`."""
        now = self.clock.now
        know, memory, batch = self.knowledge, self.memory, self.batch
        prefixes = self._prefix_views.views()
        reserve = batch.reserve

        def running_views() -> tuple[RequestView, ...]:
            return tuple(r.view(now, held) for r, held in batch.held())

        running = RunningViews(running_views) if lazy_running else running_views()
        if not self.config.full_output_reserve:
            self.waiting.touch_all()  # a waiting request's reservation follows new_token_ratio
        waiting = tuple(self.waiting.viewed(lambda r: r.view(now, reserve(r))).values())
        if not with_tasks:
            task_views: Mapping[str, TaskView] = UnreadTasks(self.policy.name)
        else:
            if not self.cache_task_views:
                self.active_tasks.touch_all()
            task_views = dict(self.active_tasks.viewed(lambda ts: ts.view(know.online)))
        return EngineView(
            time=now,
            kv_budget=memory.budget,
            prefix_tokens=memory.prefix_tokens,
            request_tokens=memory.request_tokens,
            prefixes=prefixes,
            running=running,
            waiting=waiting,
            tasks=task_views,
            cost=self.cost,
            decode_batch=len(batch.decoding),
            host_tier=self.config.host_tier,
            segment_match=self.segments.matches(self.waiting) if self.segments is not None else {},
            prefill_prefix_sharing=self.config.prefill_prefix_sharing,
        )

    def passing_view(self) -> EngineView:
        """The view for a call that reads it and returns (an eviction pass, KVFlow's plan): the
        running requests' views built at their first read; the caller seals it after the call
        (``topas.engine.view_cache.seal``)."""
        return self.view(lazy_running=True)

    def _decide(self) -> None:
        self._dirty = False
        self._steps_since_check = 0
        prefetch = self.prefetch
        if prefetch.enabled:  # KVFlow's DispatchLoadTasks (after the walk), whatever the gate
            plan_view = self.passing_view()
            prefetch.plan(plan_view)
            seal(plan_view)
        if self._gated():
            prefetch.dispatch()
            return  # SGLang skips get_new_batch_prefill while batch_is_full
        self._batch_full = False
        decode_empty = not self.batch.decoding
        view = self.view(lazy_running=True, with_tasks=self.policy.reads_tasks)
        n_running = self.batch.n_running()
        t0 = _time.perf_counter()
        decision = self.policy.decide(view)
        wall = _time.perf_counter() - t0
        running_views = view.running
        lazy = isinstance(running_views, RunningViews)
        if lazy:
            running_views.seal()
        # The admission walk's running reservations: where the policy read the running views, each
        # holds its request's, unchanged unless the decision preempts (then the walk sums them).
        reserved = None
        if not decision.preempt and (not lazy or running_views.built):
            reserved = sum(r.reserve for r in running_views)
        admitted = self.admission.apply(decision, reserved=reserved)
        prefetch.dispatch()
        running = self.batch.n_running()
        if admitted < len(decision.admit) and 0 < running < self.config.max_running_requests:
            # add_one_req answered NO_TOKEN while something can run. Set on an empty running batch,
            # the flag goes with it once the prefill batch replaces it (get_next_batch_to_run).
            self._batch_full = True
            self._gate_until_prefill = decode_empty
        self.decisions.append(
            (self.clock.now, wall, len(view.waiting), n_running, len(decision.admit), admitted,
             len(decision.preempt), len(decision.evict), len(decision.load), dict(decision.info))
        )

    def _gated(self) -> bool:
        """Admission is shut (``batch_is_full``) while something runs."""
        return self.config.admission_gate and self._batch_full and bool(self.batch.prefill_queue or self.batch.decoding)

    def apply(self, d: Decision) -> int:
        """Apply a Decision (validating it); returns the number of requests admitted
        (:meth:`Admission.apply`)."""
        return self.admission.apply(d)


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
