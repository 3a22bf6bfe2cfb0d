"""The simulator's request lifecycle and engine iterations: a request started, stopped
(retracted) or finished; one (chunked) prefill iteration; decode steps advanced in closed form
until the next event; decode memory exhaustion; the clock and the KV timeline.

:class:`Iterations` is a part of :class:`topas.engine.simulator.Simulator` (a mixin over its
state), kept apart so each file has one job; it is not used on its own.
"""

from __future__ import annotations

import heapq

from topas.engine.entities import DECODE, DONE, PENDING, PREFILL, WAITING, Prefix, Request
from topas.engine.memory import _PENDING


class Iterations:
    """Request lifecycle and prefill / decode iterations of one engine."""

    # ------------------------------------------------------------------ request lifecycle
    def _start(self, r: Request, p: Prefix, copy: int) -> None:
        del self.waiting[r.rid]
        computes = p.prefill_left > 0 and r.agent not in self._computing
        if not copy and p.prefill_left == 0:
            r.cached_tokens += p.tokens  # its prefix matched in the cache
        if r.first_admit_time is None:
            r.first_admit_time = self.now
        if self.config.radix_cache:
            m = self._merged.get(r.agent)
            if m == _PENDING:
                self._merged[r.agent] = r.rid
            elif m is not None and m != r.rid:
                self._merged[r.agent] = None  # another request matched the prefix: the node splits
        if computes:
            self._computing.add(r.agent)
        r.recomputed_tokens += r.generated
        r.admitted_time = self.now
        r.own_prefix = copy
        if copy:
            self.dup_copies += 1
            self.dup_tokens += copy
        matched = 0
        if self._tree is not None and not copy and p.prefill_left == 0:
            nodes, matched, _ = self._seg_match(r)  # (as _admit matched it)
            self._seg_lock(r, nodes, matched)
        r.prefill_total = r.prefill_left = copy + r.x - matched + r.generated
        # KV for the tokens to prefill and for the output token the prefill produces (allocated now,
        # so that admission decisions taken before this request's prefill ends see it)
        r.kv = r.prefill_total + 1
        self.request_tokens += r.kv
        p.refcount += 1
        p.last_used = self.now
        r.enter(PREFILL, self.now)
        self.prefill_queue.append(r)

    def _stop(self, r: Request, by_engine: bool) -> None:
        """Preempt (policy) or retract (engine) a running request: free its KV, back to waiting."""
        view = r.view(self.now)
        if r.state == PREFILL:
            self.prefill_queue.remove(r)
        else:
            del self.decoding[r.rid]
        self.request_tokens -= r.kv
        r.kv = 0
        r.prefill_left = 0
        r.own_prefix = 0
        if self._tree is not None:
            self._seg_release(r)
        p = self.prefixes[r.agent]
        p.refcount -= 1
        p.last_used = self.now
        if by_engine:
            r.retractions += 1
        else:
            r.preemptions += 1
        r.admitted_time = None
        r.enter(WAITING, self.now)
        self.waiting[r.rid] = r
        self._dirty = True
        self._batch_full = False  # a request left the running batch
        self.policy.on_preempt(view, self.now, by_engine)

    def _finish(self, r: Request) -> None:
        self._drop_own_prefix(r)  # (still held when it finishes in the batch after its prefill)
        below = None
        if self._tree is not None:
            if r.seg_pending:
                self._insert_after_next.remove(r)
                self._seg_insert(r)
            below = r.seg_nodes[-1] if r.seg_nodes else None
        self._count_finish(r)
        if self._tree is not None:
            self._seg_release(r)
        view = r.view(self.now)
        kv = r.kv
        del self.decoding[r.rid]
        r.enter(DONE, self.now)
        r.finish_time = self.now
        self.request_tokens -= r.kv
        r.kv = 0
        p = self.prefixes[r.agent]
        p.refcount -= 1
        p.last_used = self.now
        self._batch_full = False
        if self._tree is not None and kv > 0 and p.resident:
            self._seg_leave_output(r, below, kv)
        elif self.config.radix_cache and kv > 0 and p.resident:
            # SGLang's cache_finished_req: its KV stays cached, a leaf under the prefix
            self._seq += 1
            heapq.heappush(self._leaves, (self.now, self._seq, r.agent, kv, self._generation[r.agent], r.rid,
                                          r.priority))
            p.history = max(p.history, p.tokens + kv)
            self._cached_by_agent[r.agent] += kv
            self.evictable_tokens += kv
        ts = r.task
        ts.done.add(r.stage.id)
        ts.invalidate()
        self.active_tasks.touch(ts.task.id)
        self._dirty = True
        for child in ts.task.children[r.stage.id]:
            c = ts.requests[child]
            if c.state == PENDING and all(q in ts.done for q in c.stage.parents):
                self._make_ready(c, self.now)
        if len(ts.done) == len(ts.task.stages):
            ts.finish_time = self.now
            del self.active_tasks[ts.task.id]
            self.finished_tasks += 1
        self.policy.on_finish(view, self.now, r.y)

    # ------------------------------------------------------------------ iterations
    def _pending_prefix_prefill(self) -> bool:
        return any(p.prefill_left > 0 for p in self.prefixes.values())

    def _process_last_batch(self) -> None:
        """The previous batch's results reach the radix tree (overlap scheduler: now that the
        next batch has been scheduled): the prefixes its prefill computed become matchable."""
        for a in self._cached_after_next:
            if self.prefixes[a].prefill_left == 0:  # (not evicted and loaded again meanwhile)
                self._computing.discard(a)
                self._entered_tree(a)
        self._cached_after_next = []
        for r in self._free_after_next:
            self._drop_own_prefix(r)  # (0 if it finished or was stopped meanwhile)
        self._free_after_next = []
        if self._insert_after_next:
            for r in self._insert_after_next:
                self._seg_insert(r)
            self._insert_after_next = []

    def _entered_tree(self, agent: str) -> None:
        """``agent``'s prefix has just entered the radix tree: with ``recheck_on_insert``, ask the
        policy again if a request of that agent waits (SGLang schedules at every iteration, so a
        request held back while the prefix was computed is admitted at the next one)."""
        if self.config.recheck_on_insert and any(r.agent == agent for r in self.waiting.values()):
            self._dirty = True

    def _drop_own_prefix(self, r: Request) -> None:
        """The radix tree keeps one copy of a prefix: free the copy ``r`` computed itself."""
        self.request_tokens -= r.own_prefix
        r.kv -= r.own_prefix
        r.own_prefix = 0

    def _prefill_iteration(self) -> None:
        self._process_last_batch()
        budget = self.chunk
        chunks: list[tuple[int, int]] = []
        for p in self.prefixes.values():  # loads: prefill the prefix itself
            if p.prefill_left > 0 and budget > 0:
                take = min(p.prefill_left, budget)
                chunks.append((take, p.tokens - p.prefill_left))
                p.prefill_left -= take
                budget -= take
        progressed: list[Request] = []
        for r in self.prefill_queue:
            if budget <= 0:
                break
            p = self.prefixes[r.agent]
            if not r.own_prefix and p.prefill_left > 0:
                continue  # its prefix is still being computed
            take = min(r.prefill_left, budget)
            done = r.prefill_total - r.prefill_left
            chunks.append((take, done + (0 if r.own_prefix else p.tokens + r.seg_matched)))
            r.prefill_left -= take
            budget -= take
            progressed.append(r)
        dt = self._pending_move_time + self.cost.prefill_time(chunks)
        self._pending_move_time = 0.0
        self._advance(dt)
        computed = [a for a in self._computing if self.prefixes[a].prefill_left == 0]
        if self.config.overlap_schedule:
            self._cached_after_next = computed  # the next batch is scheduled before they are cached
        else:
            for a in computed:
                self._computing.discard(a)  # cached now: later requests match it
                self._entered_tree(a)
        for r in progressed:
            if r.prefill_left == 0:
                self.prefill_queue.remove(r)
                if r.own_prefix and self.config.overlap_schedule:
                    # its duplicate is freed when the batch's results are processed, like the
                    # prefix's insertion into the tree (cache_unfinished_req): one batch later
                    self._free_after_next.append(r)
                else:
                    self._drop_own_prefix(r)
                if self._tree is not None:
                    if self.config.overlap_schedule:
                        r.seg_pending = True  # inserted when the batch's results are processed
                        self._insert_after_next.append(r)
                    else:
                        self._seg_insert(r)
                else:
                    self._count_insert(r)  # (its prompt enters the radix tree)
                r.generated += 1  # the prefill produces the first (next) output token (KV held since _start)
                r.enter(DECODE, self.now)
                self.decoding[r.rid] = r
                if r.generated >= r.y:
                    self._finish(r)
        if self._gate_until_prefill:  # the prefill batch became the running batch: try again
            self._gate_until_prefill = False
            self._batch_full = False
            self._dirty = True
        self._settle()
        self._record_timeline()

    def _decode_until_event(self) -> None:
        self._process_last_batch()
        b = len(self.decoding)
        free = self.budget - self.prefix_tokens - self.request_tokens
        if free < b:
            self._out_of_memory(b)
            return
        n = min(r.y - r.generated for r in self.decoding.values())
        n = min(n, free // b)
        recheck = self.waiting and not self._gated()  # a shut gate opens only at a finish (an event)
        if recheck:
            n = min(n, max(1, self.config.recheck_steps - self._steps_since_check))
            if self._dirty:  # a prefix just entered the tree (_entered_tree): decide after this step
                n = 1
        kv0 = sum(self.prefixes[r.agent].tokens + r.kv + r.seg_ctx for r in self.decoding.values())
        t_next = self._next_event()
        if t_next is not None:
            gap = t_next - self.now - self._pending_move_time
            n = min(n, self.cost.steps_until(b, kv0, gap)) if gap > 0 else 1
        dt = self._pending_move_time + self.cost.decode_steps_time(b, kv0, n)
        self._pending_move_time = 0.0
        self._advance(dt)
        self.decode_steps += n
        self.decode_batch_area += b * n
        self.new_token_ratio = max(self._ratio_min, self.new_token_ratio - self._ratio_decay * n)
        done = []
        for r in self.decoding.values():
            r.generated += n
            r.kv += n
            if r.generated >= r.y:
                done.append(r)
        self.request_tokens += b * n
        for r in done:
            self._finish(r)
        if recheck:
            self._steps_since_check += n
            if self._steps_since_check >= self.config.recheck_steps:
                self._dirty = True
        self._settle()
        self._record_timeline()

    def _out_of_memory(self, b: int) -> None:
        """Decode cannot take one more step: evict unreferenced prefixes, then retract requests."""
        if not self.manages:
            self._make_room(b)
        free = self.budget - self.prefix_tokens - self.request_tokens
        if free >= b:
            return
        # SGLang retract_decode: keep the requests with most generated tokens (then shortest input).
        order = sorted(self.decoding.values(), key=lambda r: (r.generated, -r.x, r.rid), reverse=True)
        steps = self.config.retract_decode_steps
        while len(order) > 1 and free < len(order) * steps:
            victim = order.pop()
            free += victim.kv
            self._stop(victim, by_engine=True)
        self.new_token_ratio = self._ratio_init
        if free < len(order):
            # A lone request that cannot grow: only unreferenced (pinned) prefixes are in the way.
            self._make_room(len(order))

    def _advance(self, dt: float) -> None:
        self._idle_retry = False
        self.now += dt
        self.busy_time += dt

    def _record_timeline(self) -> None:
        if self.config.record_timeline:
            self.timeline.append(
                (self.now, self.prefix_tokens, self.request_tokens, len(self.decoding),
                 len(self.prefill_queue), len(self.waiting), self.evictable_tokens)
            )
