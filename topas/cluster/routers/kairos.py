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
from typing import Iterable, Iterator, Sequence

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
            i = self.place(req, engines, now)
            if i is None:
                break  # head-of-line blocking
            heapq.heappop(self.queue)
            del self.pending[rid]
            self.ledger[i][rid] = self._entry(req, i, now)
            sends.append((rid, i))
        return sends

    def place(self, req: RouteRequest, engines: Sequence[EngineState], now: float) -> int | None:
        """The feasible engine with the smallest projected peak if ``req`` is sent now (ties: the
        lowest index), or None when no engine is feasible.

        The same choice as computing every engine's :meth:`projected_peak`, found faster: the
        first slot's total is a lower bound on an engine's peak, so engines are visited in order
        of that bound and the search stops once no bound can beat the best peak found."""
        slot = self.params.slot_s
        new: list[_Entry] = []  # req sent now, on each engine
        same: dict[float, _Entry] = {}  # (engines of one profile share it)
        for e in engines:
            d = self.duration(req.agent, req.input_tokens, e.index)
            if d not in same:
                same[d] = self._entry(req, e.index, now)
            new.append(same[d])
        bounds = sorted((_slot_total(self._projection(i, new[i], now), now, now + slot), i)
                        for i in range(len(engines)))
        best: tuple[float, int] | None = None
        for bound, i in bounds:
            if best is not None and (bound, i) > best:
                break  # this engine's (peak, index) and every later one's are above the best
            cap = self.params.memory_fraction * engines[i].kv_budget
            idle = not self.ledger[i]  # nothing unfinished sent there: always feasible
            if bound > cap and not idle:
                continue  # infeasible: its peak is at least the bound
            peak = _peak(list(self._projection(i, new[i], now)), now, slot)
            if (peak <= cap or idle) and (best is None or (peak, i) < best):
                best = (peak, i)
        return None if best is None else best[1]

    def projected_peak(self, engine: int, new: _Entry, now: float) -> float:
        """The largest projected KV total over the time slots from ``now`` on ``engine`` with
        ``new`` added (see the module docstring)."""
        return _peak(list(self._projection(engine, new, now)), now, self.params.slot_s)

    def _entry(self, req: RouteRequest, engine: int, now: float) -> _Entry:
        """``req`` as the ledger of ``engine`` would hold it if it were sent now."""
        return _Entry(req.agent, req.prefix_tokens, req.input_tokens, self.info.output_priors[req.agent], now,
                      self.duration(req.agent, req.input_tokens, engine))

    def _projection(self, engine: int, new: _Entry, now: float) -> Iterator[tuple[_Entry, float]]:
        """``engine``'s ledger with ``new`` added, each with its projected end."""
        overdue = now + self.params.slot_s  # a request still running past its expected end
        for e in self.ledger[engine].values():
            yield e, max(e.t0 + e.duration, overdue)
        yield new, new.t0 + new.duration


def _peak(entries: list[tuple[_Entry, float]], now: float, slot: float) -> float:
    """The largest :func:`_slot_total` over the slots from ``now`` to the last projected end."""
    last = max(end for _, end in entries)
    n_slots = min(_MAX_SLOTS, max(1, math.ceil((last - now) / slot)))
    peak = 0.0
    for k in range(n_slots):
        peak = max(peak, _slot_total(entries, now + k * slot, now + (k + 1) * slot))
    return peak


def _slot_total(entries: Iterable[tuple[_Entry, float]], lo: float, hi: float) -> float:
    """The projected KV in the slot [lo, hi): each request active in it at its largest size there,
    plus each of their agents' prefix once."""
    total, agents = 0.0, {}
    for e, end in entries:
        if e.t0 < hi and end > lo:
            frac = min(1.0, (min(hi, end) - e.t0) / e.duration) if e.duration > 0 else 1.0
            total += e.x + e.out * frac
            agents[e.agent] = e.prefix
    return total + sum(agents.values())
