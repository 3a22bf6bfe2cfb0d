"""The simulator with three SGLang behaviours that the fidelity runs found it lacked.

:class:`SGLangSimulator` is :class:`topas.engine.simulator.Simulator` plus (each found by replaying
the same trace on the CPU SGLang server and reading the plugin's decision log):

1. **Admission stays shut after a failed admission.** SGLang's scheduler sets
   ``running_batch.batch_is_full`` when ``PrefillAdder.add_one_req`` answers ``NO_TOKEN`` while
   something can run, and clears it only when a request leaves the running batch (it finishes or
   is retracted) or the batch is empty (``scheduler.py``, ``get_new_batch_prefill``). New
   arrivals do not reopen admission. The simulator re-tried admission at every arrival and every
   ``recheck_steps`` decode steps, so it started waiting requests earlier than SGLang does.
2. **An uncached prefix is not shared inside one prefill batch.** SGLang matches each request
   against the radix tree *before* the batch runs; two requests of an agent whose prefix is not
   cached both match 0 tokens, so the second is charged the whole prefix again and, under memory
   pressure, does not fit (``NO_TOKEN``, then 1.). The simulator let every request of the agent
   share the prefix being loaded in the same decision. Here the second and later such requests
   must find room for their own copy of the prefix to be admitted (they then share it, as the
   radix tree dedups the copies after the prefill: the cost of the duplicate prefill is not
   charged).
3. **The request path.** A stage's request reaches the scheduler some milliseconds after its
   parent's reply left it (HTTP, the tokenizer manager, ZMQ; the replay client's reply handling),
   and the task's last reply reaches the client after the scheduler finished it. With
   ``request_latency_s`` (the profile's ``overhead.request_s``) a request becomes ready that long
   after its parents finished (a root: after its task's arrival), split half before the
   scheduler sees it and half after the last stage finishes (added to the task's finish).

Everything else (costs, memory, retraction, LRU, policies) is the base simulator's. These fixes
live here, not in ``topas.engine.simulator``, because folding them into the default engine
changes every stored result (the experiment key covers the engine config) and the paper
figures are regenerated from the store; with ``gate=False, own_prefix_copy=False,
request_latency_s=0`` the class is the base simulator exactly (tested).
"""

from __future__ import annotations

import heapq

from topas.engine.config import EngineConfig
from topas.engine.cost import CostModel
from topas.engine.entities import DECODE, PREFILL, Request
from topas.engine.metrics import SimResult
from topas.engine.simulator import Simulator
from topas.engine.view import Decision, InfeasibleDecision
from topas.policies.base import Policy
from topas.workload.model import Trace

__all__ = ["SGLangSimulator", "simulate_sglang"]


class SGLangSimulator(Simulator):
    def __init__(self, trace: Trace, policy: Policy, cost: CostModel, config: EngineConfig | None = None,
                 gate: bool = True, own_prefix_copy: bool = True, request_latency_s: float = 0.0) -> None:
        super().__init__(trace, policy, cost, config)
        self.gate = gate
        self.own_prefix_copy = own_prefix_copy
        self.request_latency_s = float(request_latency_s)
        self._batch_full = False
        self._delayed: list[tuple[float, int, Request]] = []
        self._seq = 0
        if self.request_latency_s > 0:
            # roots become ready half a request path after the task arrives: shift via the heap
            self._half = 0.5 * self.request_latency_s
        else:
            self._half = 0.0

    # ------------------------------------------------------------------ 3. request path
    def _make_ready(self, r: Request, t: float) -> None:
        if self._half <= 0:
            super()._make_ready(r, t)
            return
        # a root's task arrived at t; a child's parent finished at t: the request reaches the
        # scheduler a full path later for a child (reply + new request), half for a root
        delay = self._half if not r.stage.parents else 2 * self._half
        self._seq += 1
        heapq.heappush(self._delayed, (t + delay, self._seq, r))

    def _admit_arrivals(self) -> None:
        super()._admit_arrivals()
        while self._delayed and self._delayed[0][0] <= self.now:
            t, _, r = heapq.heappop(self._delayed)
            Simulator._make_ready(self, r, t)

    def _next_idle_event(self) -> float | None:
        """The next arrival or delayed readiness, whichever is first."""
        nxt = [t for t in (super()._next_idle_event(), self._delayed[0][0] if self._delayed else None)
               if t is not None]
        return min(nxt) if nxt else None

    def _before_result(self) -> None:
        if self._half <= 0:
            return
        for ts in self.tasks.values():
            if ts.finish_time is not None:
                ts.finish_time += self._half

    def _decode_until_event(self) -> None:
        if self._half <= 0 or not self._delayed:
            super()._decode_until_event()
            return
        # cap the closed-form decode run at the next delayed readiness, as the base does at the
        # next arrival: temporarily expose it as the next arrival
        gap = self._delayed[0][0] - self.now - self._pending_move_time
        if self._next_arrival < len(self._arrivals):
            nxt = self._arrivals[self._next_arrival].arrival
            if nxt <= self._delayed[0][0]:
                super()._decode_until_event()
                return
        saved = self._arrivals, self._next_arrival

        class _At:
            def __init__(self, arrival: float) -> None:
                self.arrival = arrival

        try:
            self._arrivals = [_At(self.now + self._pending_move_time + max(gap, 0.0))]
            self._next_arrival = 0
            super()._decode_until_event()
        finally:
            self._arrivals, self._next_arrival = saved

    # ------------------------------------------------------------------ 1. batch-full gate
    def _decide(self) -> None:
        if self.gate and self._batch_full and (self.prefill_queue or self.decoding):
            self._dirty = False
            return
        self._batch_full = False
        super()._decide()

    def _finish(self, r: Request) -> None:
        super()._finish(r)
        self._batch_full = False

    def _stop(self, r: Request, by_engine: bool) -> None:
        super()._stop(r, by_engine)
        self._batch_full = False

    # ------------------------------------------------------------------ 2. uncached prefixes
    def apply(self, d: Decision) -> int:
        if self.policy.manages_prefixes or not self.own_prefix_copy:
            n_running = len(self.prefill_queue) + len(self.decoding)
            admitted = super().apply(d)
            if admitted < len(d.admit) and n_running + admitted < self.config.max_running_requests \
                    and (n_running + admitted) > 0:
                self._batch_full = True
            return admitted
        # a baseline: only an admit order (checked as the base does)
        pname = self.policy.name
        if d.evict or d.load or d.preempt:
            return super().apply(d)  # raises InfeasibleDecision with the base's message
        if len(set(d.admit)) != len(d.admit):
            return super().apply(d)
        for rid in d.admit:
            if rid not in self.waiting:
                raise InfeasibleDecision(f"policy {pname!r} admits {rid}, which is not waiting")
        admitted = 0
        reserved = self._reserved()
        loading: set[str] = set()  # agents whose prefix is computed in this batch
        for p in self.prefixes.values():
            if p.resident and p.prefill_left > 0:
                loading.add(p.agent.name)
        stopped = False
        for rid in d.admit:
            r = self.waiting[rid]
            if len(self.prefill_queue) + len(self.decoding) >= self.config.max_running_requests:
                break
            p = self.prefixes[r.agent]
            need = r.x + r.generated + 1
            own_reserve = self._reserve(r)
            if not p.resident:
                if not self._make_room(p.tokens + need + own_reserve + reserved, exclude=p):
                    stopped = True
                    break
                self._load(p)
                if p.prefill_left > 0:
                    loading.add(r.agent)
            else:
                extra = p.tokens if r.agent in loading else 0  # its own copy of an uncached prefix
                if self.budget - self.prefix_tokens - self.request_tokens - reserved < need + own_reserve + extra:
                    if not self._make_room(need + own_reserve + extra + reserved, exclude=p):
                        stopped = True
                        break
            self._start(r, p)
            reserved += own_reserve
            admitted += 1
        if stopped and (self.prefill_queue or self.decoding):
            self._batch_full = True
        return admitted


def simulate_sglang(trace: Trace, policy: Policy, cost: CostModel, config: EngineConfig | None = None,
                    request_latency_s: float | None = None, **kw) -> SimResult:
    """Run ``trace`` on :class:`SGLangSimulator`; ``request_latency_s`` defaults to the profile's
    ``overhead.request_s`` (0 when the profile has none)."""
    if request_latency_s is None:
        request_latency_s = float((cost.meta.get("overhead") or {}).get("request_s") or 0.0)
    return SGLangSimulator(trace, policy, cost, config, request_latency_s=request_latency_s, **kw).run()


# keep the import used (states are referenced by the base class's loop)
_ = (DECODE, PREFILL)
