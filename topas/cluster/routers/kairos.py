"""``kairos``: Kairos's workflow-aware priority scheduler and memory-aware dispatcher.

Source: Kairos (Chen, Shi, Chen, Guo, "Kairos: Low-latency Multi-Agent Serving with Shared LLMs
and Excessive Loads in the Public Cloud", arXiv 2508.06948), as its abstract and our issue's
summary of the paper describe it (its full algorithm text and code were not read here, so every
constant below is ours): a global queue ordered by a priority from the request's profiled
remaining workflow time, and a dispatcher that projects each engine's KV use over the request's
expected duration in time slots and sends the head of the queue to the feasible engine with the
smallest projected peak; when no engine is feasible the head waits and so does everything behind
it (head-of-line blocking). Inside the engines: FCFS (run it with ``--policy fcfs``).

Interpretations:

* **Profile.** A stage's expected duration on engine i is ``prefill_time([(x, l_a)])`` (its
  own input on its cached prefix) plus ``prior_a`` decode steps of ``ref_batch`` requests each
  holding ``l_a + x + prior_a / 2`` tokens (``CostModel.decode_time``); ``prior_a`` is the agent's
  output prior as the policies see it (:class:`topas.cluster.state.ClusterInfo`).
* **Priority.** The request's remaining workflow time: the longest path, in expected durations on
  engine 0, from its stage to the end of its task's DAG (itself included; the DAG as the policies
  see it). Smaller first (the workflow closest to its end); ties by ready time, then request id.
* **Projection.** The dispatcher's ledger holds the requests it sent and that have not finished,
  each with its send time ``t0``, expected duration ``D`` and KV ``x + prior * min(1, (tau - t0) / D)``
  at time ``tau`` (its output grows linearly over its expected duration); an agent's prefix
  ``l_a`` counts once per engine while any of its requests is projected active there. Time is cut
  in slots of ``slot_s`` from now; in each slot a request counts at its largest size in the slot;
  a request still running past its expected end is projected to end within the current slot.
  The projected peak is the largest slot total with the new request added (sent now).
* **Feasible.** Projected peak <= ``memory_fraction`` x the engine's KV budget, or nothing
  sent to the engine is unfinished (a request always fits an idle engine, whatever its prior
  says: the trace validator checks its true size; without this a prior above the budget would
  block the queue for ever). Ties in the peak go to the lowest engine index.
* **When.** The dispatcher runs when a request becomes ready and when one finishes (the ledger
  changes only then); time passing alone does not trigger it. With every engine idle every
  request is feasible, so the queue cannot stall.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Sequence

from topas.cluster.routers.base import Router, RouterError, register
from topas.cluster.routers.profile import expected_duration, remaining_path
from topas.cluster.state import ClusterInfo, EngineState, RouteRequest

_MAX_SLOTS = 100_000


@dataclass(frozen=True)
class KairosParams:
    #: length of a projection time slot (seconds)
    slot_s: float = 1.0
    #: the decode batch the duration profile assumes
    ref_batch: int = 8
    #: an engine is feasible while the projected peak <= this x its KV budget
    memory_fraction: float = 1.0

    def __post_init__(self) -> None:
        if not self.slot_s > 0 or self.ref_batch < 1 or not 0 < self.memory_fraction:
            raise ValueError("slot_s must be > 0, ref_batch >= 1 and memory_fraction > 0")


@dataclass(frozen=True, slots=True)
class _Entry:
    agent: str
    prefix: int
    x: int
    out: float
    t0: float
    duration: float


@register
class Kairos(Router):
    name = "kairos"
    Params = KairosParams
    holds = True

    def reset(self, n_engines: int, seed: int = 0, info: ClusterInfo | None = None) -> None:
        super().reset(n_engines, seed, info)
        if info is None:
            raise RouterError("router 'kairos' needs the agents' profile and the engines' cost models (ClusterInfo)")
        self.queue: list[tuple[float, float, str]] = []
        self.pending: dict[str, RouteRequest] = {}
        self.ledger: list[dict[str, _Entry]] = [{} for _ in range(n_engines)]
        self._durations: dict[tuple[str, int, int], float] = {}

    # ------------------------------------------------------------------ profile
    def duration(self, agent: str, x: int, engine: int) -> float:
        """Expected seconds of a request of ``agent`` with ``x`` input tokens on ``engine``."""
        key = (agent, x, engine)
        d = self._durations.get(key)
        if d is None:
            d = self._durations[key] = expected_duration(self.info, agent, x, engine, self.params.ref_batch)
        return d

    def priority(self, req: RouteRequest) -> float:
        """Remaining workflow time from ``req``'s stage (itself included), on engine 0."""
        return remaining_path(self.info, req, self.params.ref_batch)

    # ------------------------------------------------------------------ routing
    def route(self, request: RouteRequest, engines: Sequence[EngineState]) -> None:
        self.pending[request.rid] = request
        heapq.heappush(self.queue, (self.priority(request), request.time, request.rid))
        return None

    def on_finish(self, rid: str, engine: int, time: float) -> None:
        self.ledger[engine].pop(rid, None)

    def dispatch(self, engines: Sequence[EngineState], now: float) -> list[tuple[str, int]]:
        sends: list[tuple[str, int]] = []
        while self.queue:
            rid = self.queue[0][2]
            req = self.pending[rid]
            best: tuple[float, int] | None = None
            for e in engines:
                new = _Entry(req.agent, req.prefix_tokens, req.input_tokens, self.info.output_priors[req.agent], now,
                             self.duration(req.agent, req.input_tokens, e.index))
                peak = self.projected_peak(e.index, new, now)
                feasible = peak <= self.params.memory_fraction * e.kv_budget or not self.ledger[e.index]
                if feasible and (best is None or peak < best[0]):
                    best = (peak, e.index)
            if best is None:
                break  # head-of-line blocking
            heapq.heappop(self.queue)
            del self.pending[rid]
            i = best[1]
            self.ledger[i][rid] = _Entry(req.agent, req.prefix_tokens, req.input_tokens,
                                         self.info.output_priors[req.agent], now,
                                         self.duration(req.agent, req.input_tokens, i))
            sends.append((rid, i))
        return sends

    def projected_peak(self, engine: int, new: _Entry, now: float) -> float:
        """The largest projected KV total over the time slots from ``now`` on ``engine`` with
        ``new`` added (see the module docstring)."""
        slot = self.params.slot_s
        entries = []
        for e in (*self.ledger[engine].values(), new):
            end = e.t0 + e.duration
            if e is not new:
                end = max(end, now + slot)  # still running past its expected end
            entries.append((e, end))
        last = max(end for _, end in entries)
        n_slots = min(_MAX_SLOTS, max(1, math.ceil((last - now) / slot)))
        return max(0.0, *(_slot_total(entries, now + k * slot, now + (k + 1) * slot)
                          for k in _peak_candidates(entries, now, slot, n_slots)))


def _slot_total(entries: list[tuple[_Entry, float]], lo: float, hi: float) -> float:
    """The projected KV in the slot [lo, hi): each request active in it at its largest size there,
    plus each of their agents' prefix once."""
    total, agents = 0.0, {}
    for e, end in entries:
        if e.t0 < hi and end > lo:
            frac = min(1.0, (min(hi, end) - e.t0) / e.duration) if e.duration > 0 else 1.0
            total += e.x + e.out * frac
            agents[e.agent] = e.prefix
    return total + sum(agents.values())


def _peak_candidates(entries: list[tuple[_Entry, float]], now: float, slot: float, n_slots: int) -> list[int]:
    """Slots among which the largest :func:`_slot_total` of slots 0..n_slots-1 lies.

    A request is active in a contiguous run of slots (``t0 < hi`` and ``end > lo``, both monotone
    in the slot). While the set of active requests does not change, a slot's total can only grow
    (each request's size grows with ``hi``; floating-point sums of growing terms do not shrink),
    so each stretch peaks at its last slot: the slot before a request becomes active, the last
    slot of a request, or the last slot. Each boundary is found with the very comparisons
    :func:`_slot_total` makes, so the maximum over these slots equals the maximum over all."""
    if any(e.out < 0 for e, _ in entries):  # a shrinking size: every slot may peak
        return list(range(n_slots))

    def lo(k: int) -> float:
        return now + k * slot

    def first_active(t0: float) -> int:  # the smallest k >= 0 with t0 < hi(k) = lo(k + 1)
        k = max(0, min(n_slots, math.floor((t0 - now) / slot)))
        while k > 0 and t0 < lo(k):
            k -= 1
        while k < n_slots and not t0 < lo(k + 1):
            k += 1
        return k

    def last_active(end: float) -> int:  # the largest k < n_slots with end > lo(k) (-1: none)
        k = max(-1, min(n_slots - 1, math.ceil((end - now) / slot) - 1))
        while k + 1 < n_slots and end > lo(k + 1):
            k += 1
        while k >= 0 and not end > lo(k):
            k -= 1
        return k

    cands = {n_slots - 1}
    for e, end in entries:
        cands.add(first_active(e.t0) - 1)
        cands.add(last_active(end))
    return sorted(k for k in cands if 0 <= k < n_slots)
