"""LPM: SGLang's longest-prefix-match ordering (``schedule_policy.py``, policy ``lpm``).

As SGLang 0.5.x's ``SchedulePolicy.calc_priority`` does it, at each scheduling point:

1. **Match.** A request's match is the prefix the radix tree holds for it now, in tokens: its
   agent's prefix ``l_a`` when that is in the tree (``PrefixView.in_tree``), plus, on a trace
   with segments, the segments beyond it that the tree holds (``EngineView.segment_match``);
   else 0. A prefix that a running prefill is still computing is *not* matched, though its KV
   is on the GPU.
2. **In-batch prefix caching** (``_compute_prefix_matches``). Walking the queue in its order, a
   request whose match is at most ``in_batch_check_tokens`` is looked up in a scratch tree of the
   queue's earlier such requests: if it shares at least ``in_batch_deprioritize_tokens`` with one
   (an earlier request of the same agent, when ``l_a`` is that long) it is deprioritized, else its
   prompt joins the scratch tree. So of several requests waiting on one uncached prefix, one goes
   ahead and computes it; the others wait behind everything else and hit it later.
3. **Sort** (``_sort_by_longest_prefix``): longer match first, deprioritized requests last. The
   sort is stable and *in place*: ties keep the queue's order, which is the previous sort's
   order with new (and retracted) requests appended in arrival order. The policy keeps that
   order between decisions, as SGLang's ``waiting_queue`` does (``topas.policies.queue``).

Above ``fcfs_fallback_queue`` waiting requests SGLang skips the matching and sorting (too
expensive) and serves the queue in its current order.
"""

from __future__ import annotations

from dataclasses import dataclass

from topas.engine.view import Decision, EngineView, RequestView, in_batch_deprioritized
from topas.policies.base import Policy, register
from topas.policies.queue import WaitingQueue


@dataclass(frozen=True)
class LPMParams:
    #: ``WAITING_QUEUE_PREFIX_MATCH_MAX``: above this queue length LPM serves the queue as it is
    fcfs_fallback_queue: int = 128
    #: ``IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD``: requests matching at most this many cached
    #: tokens are checked against the queue's other requests
    in_batch_check_tokens: int = 32
    #: ``IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD``: sharing at least this many tokens with
    #: an earlier checked request deprioritizes a request (a huge value turns step 2 off)
    in_batch_deprioritize_tokens: int = 32


@register
class LPM(Policy):
    name = "lpm"
    reads_tasks = False  # it orders the waiting requests alone
    Params = LPMParams

    def reset(self) -> None:
        self._queue = WaitingQueue()

    def on_preempt(self, request: RequestView, time: float, by_engine: bool) -> None:
        self._queue.requeue(request.rid, time)  # it re-enters the queue at its end

    def decide(self, view: EngineView) -> Decision:
        queue = self._queue.current(view)
        if len(queue) <= self.params.fcfs_fallback_queue:
            prefixes, beyond = view.prefixes, view.segment_match

            def match(r: RequestView) -> int:
                p = prefixes[r.agent]
                return p.tokens + beyond.get(r.rid, 0) if p.in_tree else 0

            q = self.params
            deprioritized = in_batch_deprioritized(queue, match, prefixes, q.in_batch_check_tokens,
                                                   q.in_batch_deprioritize_tokens)
            queue.sort(key=lambda r: float("inf") if r.rid in deprioritized else -match(r))
        self._queue.keep(queue)
        return Decision(admit=tuple(r.rid for r in queue))
