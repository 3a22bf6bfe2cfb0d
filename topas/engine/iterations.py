"""The running batch of one engine and the iterations that advance it (docs/design.md, "Engine
parts").

:class:`Batch` owns the requests that run (admitted and prefilling, or decoding), their
lifecycle on the GPU (started, stopped, finished), SGLang's ``new_token_ratio`` (the share of a
running request's remaining output reserved for it), the overlap scheduler's work left for the
next iteration, and the counters of what ran (decode steps and batch sizes, the time spent in
iterations, duplicate prefix copies). One (chunked) prefill iteration, or a run of decode steps
advanced in closed form until the next event, per call.

What is not the batch's it asks its owners: the pool's totals (:class:`~topas.engine.memory.KVMemory`),
the segment tree (:class:`~topas.engine.segments.SegmentMemory`), what to evict
(:class:`~topas.engine.evict_pass.Eviction`), and the scheduler that owns the waiting queue and the
tasks (:class:`Scheduler`, the simulator): a request stopped goes back to it, a finished stage is
reported to it.
"""

from __future__ import annotations

from typing import Iterator, Protocol

from topas.engine.clock import Clock
from topas.engine.config import EngineConfig
from topas.engine.cost import CostModel
from topas.engine.entities import DECODE, DONE, PREFILL, WAITING, Prefix, Request
from topas.engine.evict_pass import Eviction
from topas.engine.memory import KVMemory
from topas.engine.reservation import output_reserve
from topas.engine.segments import SegmentMemory
from topas.engine.view import RequestView


class Scheduler(Protocol):
    """What the batch calls back on the scheduler (:class:`topas.engine.simulator.Simulator`)."""

    def requeue(self, r: Request, view: RequestView, by_engine: bool) -> None: ...
    def stage_finished(self, r: Request, view: RequestView) -> None: ...
    def prefix_entered_tree(self, agent: str) -> None: ...


class Batch:
    """The running batch: request lifecycle and prefill / decode iterations of one engine.

    Read-only outside this class: :attr:`prefill_queue`, :attr:`decoding`, :attr:`new_token_ratio`
    and the counters."""

    def __init__(self, config: EngineConfig, cost: CostModel, chunk: int, clock: Clock, memory: KVMemory,
                 segments: SegmentMemory | None, eviction: Eviction, scheduler: Scheduler, manages: bool) -> None:
        self.config = config
        self.cost = cost
        self.chunk = chunk  # tokens a prefill iteration computes at most
        self.clock = clock
        self.memory = memory
        self.segments = segments
        self.eviction = eviction
        self.scheduler = scheduler
        self.manages = manages
        #: admitted, prefilling (in admission order)
        self.prefill_queue: list[Request] = []
        self.decoding: dict[str, Request] = {}
        self._ratio_init = config.init_new_token_ratio
        self._ratio_min = config.init_new_token_ratio * config.min_new_token_ratio_factor
        self._ratio_decay = (self._ratio_init - self._ratio_min) / config.new_token_ratio_decay_steps
        self.new_token_ratio = self._ratio_init
        # overlap scheduler: prefixes computed by the last prefill, cached once the next batch is
        # scheduled, the requests whose duplicate copy of a prefix is freed then, and the requests
        # whose prompt enters the segment tree then
        self._cached_after_next: list[str] = []
        self._free_after_next: list[Request] = []
        self._insert_after_next: list[Request] = []
        self.decode_steps = 0
        self.decode_batch_area = 0  # sum over decode steps of the batch size
        self.busy_time = 0.0  # time spent in iterations
        #: requests started with their own copy of a prefix another request computes, and the
        #: copies' tokens
        self.dup_copies = 0
        self.dup_tokens = 0

    # ------------------------------------------------------------------ reservations
    def running(self) -> Iterator[Request]:
        """The running requests: prefilling, then decoding."""
        yield from self.prefill_queue
        yield from self.decoding.values()

    def n_running(self) -> int:
        return len(self.prefill_queue) + len(self.decoding)

    def reserve(self, r: Request) -> int:
        """SGLang's reservation for r's future output, ``min(max_new - generated, clip)`` scaled:
        in full for a request being admitted (``full_output_reserve``; with the slot of its first
        output token, allocated at admission, this is ``add_one_req``'s strict
        ``extend_input_len + max_new_tokens < rem_total_tokens``), in full for a running
        ``ignore_eos`` request, else by ``new_token_ratio``."""
        cfg = self.config
        full = cfg.full_output_reserve if r.state == WAITING else cfg.ignore_eos
        return output_reserve(r.max_new, r.generated, cfg.clip_max_new_tokens, full, self.new_token_ratio)

    def held(self) -> Iterator[tuple[Request, int]]:
        """Each running request, in :meth:`running`'s order, with its :meth:`reserve` (every
        decision reads them, for the admission walk's sum or the running requests' views)."""
        cfg = self.config
        clip, ratio, waiting_full, running_full = (cfg.clip_max_new_tokens, self.new_token_ratio,
                                                   cfg.full_output_reserve, cfg.ignore_eos)
        for queue in (self.prefill_queue, self.decoding.values()):
            for r in queue:
                yield r, output_reserve(r.max_new, r.generated, clip, waiting_full if r.state == WAITING else running_full,
                                        ratio)

    def reserved(self) -> int:
        """The running requests' reservations."""
        return sum(reserve for _, reserve in self.held())

    # ------------------------------------------------------------------ request lifecycle
    def start(self, r: Request, p: Prefix, copy: int) -> None:
        """Admit ``r`` (taken off the waiting queue) on its resident prefix ``p``, computing
        ``copy`` prefix tokens of its own (``Admission._prefix_copy``)."""
        now = self.clock.now
        memory = self.memory
        if not copy and p.prefill_left == 0:
            r.cached_tokens += p.tokens  # its prefix matched in the cache
        if r.first_admit_time is None:
            r.first_admit_time = now
        memory.admit(r, p)
        r.recomputed_tokens += r.generated
        r.admitted_time = now
        r.own_prefix = copy
        if copy:
            self.dup_copies += 1
            self.dup_tokens += copy
        matched = 0
        if self.segments is not None and not copy and p.prefill_left == 0:
            nodes, matched, _ = self.segments.match(r)  # (as the admission walk matched it)
            self.segments.lock(r, nodes, matched)
        r.prefill_total = r.prefill_left = copy + r.x - matched + r.generated
        # KV for the tokens to prefill and for the output token the prefill produces (allocated now,
        # so that admission decisions taken before this request's prefill ends see it)
        r.kv = r.prefill_total + 1
        memory.allocate(r.kv)
        memory.acquire(p)
        r.enter(PREFILL, now)
        self.prefill_queue.append(r)

    def stop(self, r: Request, by_engine: bool) -> None:
        """Preempt (policy) or retract (engine) a running request: free its KV, back to waiting."""
        now = self.clock.now
        view = r.view(now)
        if r.state == PREFILL:
            self.prefill_queue.remove(r)
        else:
            del self.decoding[r.rid]
        self.memory.free(r.kv)
        r.kv = 0
        r.prefill_left = 0
        r.own_prefix = 0
        if self.segments is not None:
            if r.seg_pending:  # its prompt, not inserted yet, is freed with its own KV
                r.seg_pending = False
                self._insert_after_next.remove(r)
            self.segments.release(r)
        self.memory.release(self.memory.prefixes[r.agent])
        if by_engine:
            r.retractions += 1
        else:
            r.preemptions += 1
        r.admitted_time = None
        r.enter(WAITING, now)
        self.scheduler.requeue(r, view, by_engine)

    def finish(self, r: Request) -> None:
        """``r`` generated its last token: its KV stays cached (the radix cache) or is freed."""
        memory, segments = self.memory, self.segments
        self._drop_own_prefix(r)  # (still held when it finishes in the batch after its prefill)
        below = None
        if segments is not None:
            if r.seg_pending:
                self._insert_after_next.remove(r)
                self._insert(r)
            below = r.seg_nodes[-1] if r.seg_nodes else None
        self.eviction.count_finish(r)
        if segments is not None:
            segments.release(r)
        now = self.clock.now
        view = r.view(now)
        kv = r.kv
        del self.decoding[r.rid]
        r.enter(DONE, now)
        r.finish_time = now
        memory.free(r.kv)
        r.kv = 0
        p = memory.prefixes[r.agent]
        memory.release(p)
        if segments is not None and kv > 0 and p.resident:
            segments.leave_output(r, below, kv)
        elif self.config.radix_cache and kv > 0 and p.resident:
            memory.cache_finished(r, kv)  # SGLang's cache_finished_req: a leaf under the prefix
        self.scheduler.stage_finished(r, view)

    def _insert(self, r: Request) -> None:
        """r's prompt enters the segment tree (``cache_unfinished_req``), its nodes counted."""
        r.seg_pending = False
        self.segments.insert(r)  # type: ignore[union-attr]
        self.eviction.count_insert(r)

    def _drop_own_prefix(self, r: Request) -> None:
        """The radix tree keeps one copy of a prefix: free the copy ``r`` computed itself."""
        self.memory.free(r.own_prefix)
        r.kv -= r.own_prefix
        r.own_prefix = 0

    # ------------------------------------------------------------------ iterations
    def advance(self, dt: float) -> None:
        """An iteration ran for ``dt`` seconds."""
        self.clock.advance(dt)
        self.busy_time += dt

    def process_last_batch(self) -> None:
        """The previous batch's results reach the radix tree (overlap scheduler: now that the
        next batch has been scheduled): the prefixes its prefill computed become matchable."""
        memory = self.memory
        for a in self._cached_after_next:
            if memory.prefixes[a].prefill_left == 0:  # (not evicted and loaded again meanwhile)
                memory.done_computing(a)
                self.scheduler.prefix_entered_tree(a)
        self._cached_after_next = []
        for r in self._free_after_next:
            self._drop_own_prefix(r)  # (0 if it finished or was stopped meanwhile)
        self._free_after_next = []
        if self._insert_after_next:
            for r in self._insert_after_next:
                self._insert(r)
            self._insert_after_next = []

    def prefill_iteration(self) -> None:
        """One (chunked) prefill iteration: the prefixes being loaded first, then the admitted
        requests in order, up to :attr:`chunk` tokens; then the allocation's evictions."""
        self.process_last_batch()
        memory, overlap = self.memory, self.config.overlap_schedule
        budget = self.chunk
        chunks: list[tuple[int, int]] = []
        for p in memory.prefixes.values():  # loads: prefill the prefix itself
            if p.prefill_left > 0 and budget > 0:
                take = min(p.prefill_left, budget)
                chunks.append((take, p.tokens - p.prefill_left))
                p.prefill_left -= take
                budget -= take
        progressed: list[Request] = []
        for r in self.prefill_queue:
            if budget <= 0:
                break
            p = memory.prefixes[r.agent]
            if not r.own_prefix and p.prefill_left > 0:
                continue  # its prefix is still being computed
            take = min(r.prefill_left, budget)
            done = r.prefill_total - r.prefill_left
            chunks.append((take, done + (0 if r.own_prefix else p.tokens + r.seg_matched)))
            r.prefill_left -= take
            budget -= take
            progressed.append(r)
        self.advance(memory.take_move_time() + self.cost.prefill_time(chunks))
        computed = memory.finished_computing()
        if overlap:
            self._cached_after_next = computed  # the next batch is scheduled before they are cached
        else:
            for a in computed:
                memory.done_computing(a)  # cached now: later requests match it
                self.scheduler.prefix_entered_tree(a)
        for r in progressed:
            if r.prefill_left == 0:
                self.prefill_queue.remove(r)
                if r.own_prefix and overlap:
                    # its duplicate is freed when the batch's results are processed, like the
                    # prefix's insertion into the tree (cache_unfinished_req): one batch later
                    self._free_after_next.append(r)
                else:
                    self._drop_own_prefix(r)
                if self.segments is not None:
                    if overlap:
                        r.seg_pending = True  # inserted when the batch's results are processed
                        self._insert_after_next.append(r)
                    else:
                        self._insert(r)
                else:
                    self.eviction.count_insert(r)  # (its prompt enters the radix tree)
                r.generated += 1  # the prefill produces the first (next) output token (KV held since start)
                r.enter(DECODE, self.clock.now)
                self.decoding[r.rid] = r
                if r.generated >= r.y:
                    self.finish(r)
        self.eviction.settle()

    def can_decode(self) -> bool:
        """One more decode step fits: a token for each decoding request."""
        return self.memory.free_tokens() >= len(self.decoding)

    def decode_until_event(self, cap: int | None, t_next: float | None) -> int:
        """Decode steps for the whole batch until the first finish, the pool's end, ``cap`` steps
        (the scheduler's next re-check) or the next event at ``t_next`` (None: none), whichever
        comes first (:meth:`can_decode` must hold); then the allocation's evictions. Returns the
        steps run."""
        memory, cost = self.memory, self.cost
        b = len(self.decoding)
        free = memory.free_tokens()
        n = min(r.y - r.generated for r in self.decoding.values())
        n = min(n, free // b)
        if cap is not None:
            n = min(n, cap)
        prefixes = memory.prefixes
        kv0 = sum(prefixes[r.agent].tokens + r.kv + r.seg_ctx for r in self.decoding.values())
        if t_next is not None:
            gap = t_next - self.clock.now - memory.move_time
            n = min(n, cost.steps_until(b, kv0, gap)) if gap > 0 else 1
        self.advance(memory.take_move_time() + cost.decode_steps_time(b, kv0, n))
        self.decode_steps += n
        self.decode_batch_area += b * n
        self.new_token_ratio = max(self._ratio_min, self.new_token_ratio - self._ratio_decay * n)
        done = []
        for r in self.decoding.values():
            r.generated += n
            r.kv += n
            if r.generated >= r.y:
                done.append(r)
        memory.allocate(b * n)
        for r in done:
            self.finish(r)
        self.eviction.settle()
        return n

    def out_of_memory(self) -> None:
        """Decode cannot take one more step: evict unreferenced prefixes, then retract requests."""
        b = len(self.decoding)
        if not self.manages:
            self.eviction.make_room(b)
        free = self.memory.free_tokens()
        if free >= b:
            return
        # SGLang retract_decode: keep the requests with most generated tokens (then shortest input).
        order = sorted(self.decoding.values(), key=lambda r: (r.generated, -r.x, r.rid), reverse=True)
        steps = self.config.retract_decode_steps
        while len(order) > 1 and free < len(order) * steps:
            victim = order.pop()
            free += victim.kv
            self.stop(victim, by_engine=True)
        self.new_token_ratio = self._ratio_init
        if free < len(order):
            # A lone request that cannot grow: only unreferenced (pinned) prefixes are in the way.
            self.eviction.make_room(len(order))
