"""k-LPM: LPM with every k-th admission given to the oldest waiting request.

The baseline of Dexter, Tang, Fatahibaarzi, Song, Dharamsi and Gupta, "LLM Query Scheduling with
Prefix Reuse and Latency Constraints" (arXiv:2502.04677), which "generalizes existing methods by
balancing prefix reuse and fairness in query processing" (abstract) and reports lower P99 TTFT
than FCFS and LPM. Its algorithm section could not be read here (only the abstract was
reachable), so the rule below is the one as summarized to us -- *of every k admissions, one is
the oldest waiting request (FCFS) and k-1 are LPM's picks* -- and its details are **choices**:

1. **Two orders.** At each scheduling point, LPM's order of the waiting queue
   (``topas.policies.lpm``: radix-tree match, in-batch deprioritization, stable in-place sort,
   FCFS fallback above ``fcfs_fallback_queue``; an LPM instance is composed, not copied, and sees
   every view a standalone LPM would) and FCFS's order (``topas.policies.fcfs``: ready time, then
   request id; a retracted request rejoins at the end).
2. **Interleave.** The admission order is built slot by slot from a counter *c* of admissions
   since the last FCFS pick: a slot with c = k-1 takes the oldest not-yet-placed request in FCFS
   order and resets c to 0; any other slot takes LPM's next not-yet-placed pick and adds 1 to c.
   Every waiting request is placed (the engine admits a prefix of the order while it fits).
3. **The counter lasts across scheduling points** (**choice**: "of every k admissions" counts
   admissions, not slots of one decision; with a per-decision restart, a scheduling point that
   admits a single request would always admit the same kind). At the next scheduling point the
   policy replays its last order over the requests that were admitted (the order's leading
   requests that have left the queue, or were admitted and retracted since) and advances c as
   they were FCFS or LPM slots; the slots past them were not admitted and do not count.
4. **Phase.** c starts at 0 (**choice**: no FCFS pick yet), so a fresh policy's order is k-1 LPM
   picks, then the oldest, then k-1 LPM picks, ... Hence k = 1 is pure FCFS order (every slot is
   an FCFS slot), and k larger than the queue is LPM's order until k-1 admissions have been made.
5. **LPM's knobs.** k-LPM takes LPM's parameters unchanged (**choice**: the paper's LPM is
   SGLang's, which we model with them) and adds ``k``.
"""

from __future__ import annotations

from dataclasses import dataclass

from topas.engine.view import Decision, EngineView, RequestView
from topas.policies.base import Policy, PolicyError, register
from topas.policies.fcfs import FCFS
from topas.policies.lpm import LPM, LPMParams


@dataclass(frozen=True)
class KLPMParams(LPMParams):
    #: one admission in every k goes to the oldest waiting request (k = 1: FCFS; large k: LPM);
    #: 8 chosen among 2, 4, 8, 16 on tuning seeds (scripts/select_plan_execution.py)
    k: int = 8

    def __post_init__(self) -> None:
        if self.k < 1:
            raise PolicyError(f"k-lpm parameter k={self.k!r} is out of range (>= 1)")


@register
class KLPM(Policy):
    name = "k-lpm"
    reads_tasks = False  # it orders the waiting requests alone
    Params = KLPMParams

    def reset(self) -> None:
        p = self.params
        self._lpm = LPM(fcfs_fallback_queue=p.fcfs_fallback_queue,
                        in_batch_check_tokens=p.in_batch_check_tokens,
                        in_batch_deprioritize_tokens=p.in_batch_deprioritize_tokens)
        self._fcfs = FCFS()
        self._since_fcfs = 0  # admissions since the last FCFS pick (step 3)
        self._last: list[tuple[str, bool]] = []  # the last order: (rid, was an FCFS slot)
        self._retracted: set[str] = set()  # rids retracted or preempted since the last decision

    def on_preempt(self, request: RequestView, time: float, by_engine: bool) -> None:
        self._lpm.on_preempt(request, time, by_engine)
        self._fcfs.on_preempt(request, time, by_engine)
        self._retracted.add(request.rid)

    def decide(self, view: EngineView) -> Decision:
        self._count_admissions(view)
        lpm = list(self._lpm.decide(view).admit)
        fcfs = list(self._fcfs.decide(view).admit)
        placed: set[str] = set()
        order: list[tuple[str, bool]] = []
        c, i, j = self._since_fcfs, 0, 0
        for _ in range(len(fcfs)):
            take_fcfs = c >= self.params.k - 1
            if take_fcfs:
                while fcfs[i] in placed:
                    i += 1
                rid, c = fcfs[i], 0
            else:
                while lpm[j] in placed:
                    j += 1
                rid, c = lpm[j], c + 1
            placed.add(rid)
            order.append((rid, take_fcfs))
        self._last = order
        return Decision(admit=tuple(rid for rid, _ in order))

    def sent(self, admit: tuple[str, ...]) -> None:
        """The order the engine was given is ``admit``, a subsequence of this decision's (the
        in-batch guard, ``topas.policies.guarded``, held the others back): the counter of step 3
        walks that order, so a held request is neither an admission nor where the engine stopped."""
        kept = set(admit)
        self._last = [(rid, was_fcfs) for rid, was_fcfs in self._last if rid in kept]

    def _count_admissions(self, view: EngineView) -> None:
        """Step 3: advance the counter over the last order's requests that were admitted."""
        waiting = {r.rid for r in view.waiting}
        for rid, was_fcfs in self._last:
            if rid in waiting and rid not in self._retracted:
                break  # the engine stops at the first request that does not fit
            self._since_fcfs = 0 if was_fcfs else self._since_fcfs + 1
        self._last = []
        self._retracted.clear()
