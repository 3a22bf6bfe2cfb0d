"""Autellix-LAS: Autellix's ATLAS scheduler (non-clairvoyant least-attained-service over programs).

Reproduces ATLAS (Adaptive Thread-Level Attained Service, Algorithm 1) of Autellix (Luo et al.,
"Autellix: An Efficient Serving Engine for LLM Agents as General Programs", arXiv 2502.13965)
as docs/method.md "Baselines" specifies it, with one task = one Autellix program and one stage =
one LLM call. Nothing here reads an output length; only observed service times are used.

The algorithm, term by term (method names in brackets):

- *Task service* [``task_service``]: each task keeps one scalar, the longest critical-path service
  observed so far. When a call finishes, ``service = max(service, p + e)`` where ``p`` is the
  priority the call inherited and ``e`` its execution time (``RequestView.service_time`` at
  completion: time spent in running batches, prefill + decode, all admissions summed).
- *Inherited priority* [``priority``]: a new call inherits its task's scalar as its priority, at
  the first decision point where the call is seen waiting (the engine calls the policy at every
  request-ready event, after the completions that made it ready have been reported; calls
  finishing in the same engine iteration count as simultaneous).
- *Queues* [``queue_of``]: ``num_queues`` = K queues with ranges ``[Q_k_lo, Q_k_hi)`` over
  seconds of service; a call sits in the queue containing ``base + attained``, where ``base`` is
  its inherited priority and ``attained`` the service it has received since its last reset.
  Lower queues first; FCFS within a queue by ready time (then request id). The ranges are
  geometric: ``Q_1 = [0, q)``, ``Q_k = [q g^(k-2), q g^(k-1))`` for ``1 < k < K`` and
  ``Q_K = [q g^(K-2), inf)``, with ``q = first_queue_s`` and ``g = queue_growth``; the quantum of
  queue ``k`` is its width ``Q_k_hi - Q_k_lo``.
- *Demotion*: a call whose ``base + attained`` passes its queue's upper bound is demoted (its
  queue is recomputed from the attained service at every decision).
- *Anti-starvation* [``starvation_ratio``]: a waiting call is promoted to Q_1 when
  ``(task wait + call wait) / (task service + call service) >= beta_starve``; after promotion
  the call's own wait and service count from zero again (its ``base`` becomes Q_1's lower bound,
  0). "Task wait" and "task service" here are the sums of the waiting time and of the execution
  time of the task's *finished* calls (Autellix's process table accumulates them per program);
  "call wait" is the time the call has spent waiting since it became ready (or since its last
  promotion) and "call service" its execution time since then.

Deviations and interpretations (stated plainly):

- **Preemption is a parameter** (``preempt``, default off: the figures' reading). Autellix
  preempts a running call when it is demoted below a waiting call of a higher queue. This policy
  does not manage prefixes (``manages_prefixes = False``: the engine loads prefixes on demand and
  evicts by LRU, as for FCFS/LPM). With ``preempt=False`` it returns only an admission order, so
  a running call runs to completion and demotion matters only for a call the *engine* retracted
  (decode out of memory): it returns to the waiting queue in the queue of its ``base +
  attained``, behind fresher calls. With ``preempt=True`` (``may_preempt``: the engine accepts
  preemptions from a policy that does not manage prefixes, and stops the call as it stops a
  retracted one: its KV is freed and its generated tokens are rebuilt by a prefill when it is
  readmitted) the rule is [``preemption``]: at a decision where the highest-priority waiting call
  was already offered to the engine at our previous decision and is still waiting (the engine
  could not admit it: memory or the batch is full) and the lowest-priority running call (highest
  queue; among equals the one admitted last) sits in a strictly lower queue, that running call
  is preempted, one per decision (the engine decides again as soon as a request leaves the
  batch). Strictly lower: two calls of one queue never preempt each other, so there is no
  ping-pong; the victim keeps its attained service and waits in its queue. Autellix's code is
  not public; this is the vLLM priority scheduler's rule (preempt the lowest-priority running
  request while a higher-priority one cannot be scheduled), which Autellix builds on, without
  its memory accounting (a non-clairvoyant policy does not know the engine's output
  reservations; a refusal is what it observes).
- The critical-path scalar uses the call's *inherited* priority, even if the call was promoted
  in the meantime (promotion is a fairness device and should not erase what was learnt about the
  program's critical path).
- The starvation check runs for waiting calls only (a running call needs no promotion) and only
  for calls not already in Q_1.
- Parameter values. K, the queue ranges, the quanta and beta are not published (docs/method.md); we
  found no public Autellix code to take them from. Our defaults: ``num_queues = 4``;
  ``first_queue_s = 4.0`` and ``queue_growth = 4.0``, i.e. Q_1 = [0, 4 s), Q_2 = [4, 16 s),
  Q_3 = [16, 64 s), Q_4 = [64 s, inf). On the default A100/Qwen2.5-32B profile a default
  synthetic call (512 input, 256 output tokens) receives about 13-16 s of service in a loaded
  batch (measured in the simulator on DAG-4 at 0.15-0.25 tasks/s), so a task's first call lands
  in Q_1, a call after one completed call in Q_2, after two to four sequential calls in Q_3, and
  longer programs in Q_4: geometric growth as in MLFQ, sized so that the queues separate
  programs by how many sequential calls they have completed. ``beta_starve = 4.0``: a call is
  promoted once its task's calls have waited four times as long as they have been served, a
  safety valve that rarely fires under moderate load. ``scripts/autellix_sensitivity.py`` shows
  how mean and p99 JCT move when each of these choices is changed.

Per-task and per-call state is kept in insertion-ordered dicts (no set iteration) and dropped when
the call or task is finished, so runs are deterministic.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from topas.engine.view import Decision, EngineView, RequestView
from topas.policies.base import OMIT_DEFAULT, Policy, PolicyError, register


@dataclass(frozen=True)
class AutellixParams:
    #: K, the number of priority queues.
    num_queues: int = 4
    #: Upper bound of Q_1 (s of critical-path service); Q_1 = [0, first_queue_s).
    first_queue_s: float = 4.0
    #: Each further queue's upper bound is this many times the previous one.
    queue_growth: float = 4.0
    #: Promote a waiting call to Q_1 when (task wait + call wait) / (task service + call service)
    #: reaches this ratio.
    beta_starve: float = 4.0
    #: Preempt a running call demoted below a waiting call that the engine could not admit (the
    #: real Autellix's behaviour; off: running calls run to completion). See the module docstring.
    preempt: bool = field(default=False, metadata=OMIT_DEFAULT)


@dataclass
class _Call:
    """Per-call state: inherited priority, queue base, and the reset points of wait/service."""

    inherited: float  # the task's scalar when the call was first seen (for the critical path)
    base: float  # queue position before attained service (0 after a promotion)
    wait0: float = 0.0  # wait already counted before the last promotion
    service0: float = 0.0  # service already counted before the last promotion
    promotions: int = 0


@dataclass
class _Task:
    """Per-task (program) state, Autellix's process-table row."""

    service: float = 0.0  # longest observed critical-path service
    wait_sum: float = 0.0  # total waiting time of finished calls
    exec_sum: float = 0.0  # total execution time of finished calls


def call_wait(r: RequestView, now: float) -> float:
    """Time ``r`` has spent waiting since it became ready: elapsed minus served."""
    return max(0.0, (now - r.ready_time) - r.service_time)


@register
class AutellixLAS(Policy):
    name = "autellix-las"
    Params = AutellixParams
    may_preempt = True  # only with the parameter preempt=True

    def __init__(self, **params) -> None:
        super().__init__(**params)
        p = self.params
        if p.num_queues < 1:
            raise PolicyError(f"policy {self.name!r} parameter 'num_queues': must be >= 1, got {p.num_queues}")
        if not (p.first_queue_s > 0 and math.isfinite(p.first_queue_s)):
            raise PolicyError(f"policy {self.name!r} parameter 'first_queue_s': must be > 0, got {p.first_queue_s}")
        if not (p.queue_growth > 1 and math.isfinite(p.queue_growth)):
            raise PolicyError(f"policy {self.name!r} parameter 'queue_growth': must be > 1, got {p.queue_growth}")
        if not p.beta_starve > 0:
            raise PolicyError(f"policy {self.name!r} parameter 'beta_starve': must be > 0, got {p.beta_starve}")
        #: Upper bounds Q_k_hi of Q_1..Q_{K-1} (Q_K is unbounded).
        self.bounds: tuple[float, ...] = tuple(
            p.first_queue_s * p.queue_growth**k for k in range(p.num_queues - 1)
        )

    def reset(self) -> None:
        self._tasks: dict[str, _Task] = {}
        self._calls: dict[str, _Call] = {}
        self._offered: set[str] = set()  # the calls of our last admission order

    # ------------------------------------------------------------------ terms
    def queue_ranges(self) -> list[tuple[float, float]]:
        """``[(Q_k_lo, Q_k_hi), ...]`` for k = 1..K (the last upper bound is ``inf``)."""
        los = (0.0, *self.bounds)
        his = (*self.bounds, math.inf)
        return list(zip(los, his))

    def queue_of(self, value: float) -> int:
        """Index (0 = Q_1, highest priority) of the queue whose range contains ``value`` seconds."""
        return bisect.bisect_right(self.bounds, value)

    def task_service(self, task_id: str) -> float:
        """The task's longest observed critical-path service (0 before any call finished)."""
        t = self._tasks.get(task_id)
        return t.service if t is not None else 0.0

    def priority(self, r: RequestView) -> float:
        """The priority ``r`` inherited from its task (recorded the first time it is seen)."""
        return self._call(r).inherited

    def attained(self, r: RequestView) -> float:
        """Service ``r`` has received since its last reset (promotion)."""
        return max(0.0, r.service_time - self._call(r).service0)

    def level(self, r: RequestView) -> int:
        """The queue ``r`` is in now: that of ``base + attained`` (demotion included)."""
        c = self._call(r)
        return self.queue_of(c.base + self.attained(r))

    def starvation_ratio(self, r: RequestView, now: float) -> float:
        """``(task wait + call wait) / (task service + call service)`` (inf if nothing served)."""
        c = self._call(r)
        t = self._tasks.get(r.task_id) or _Task()
        wait = t.wait_sum + max(0.0, call_wait(r, now) - c.wait0)
        service = t.exec_sum + self.attained(r)
        if service <= 0.0:
            return math.inf if wait > 0.0 else 0.0
        return wait / service

    def _call(self, r: RequestView) -> _Call:
        c = self._calls.get(r.rid)
        if c is None:
            p = self.task_service(r.task_id)
            c = self._calls[r.rid] = _Call(inherited=p, base=p)
        return c

    # ------------------------------------------------------------------ hooks
    def on_finish(self, request: RequestView, time: float, output_tokens: int) -> None:
        c = self._call(request)
        t = self._tasks.setdefault(request.task_id, _Task())
        t.service = max(t.service, c.inherited + request.service_time)
        t.wait_sum += call_wait(request, time)
        t.exec_sum += request.service_time
        del self._calls[request.rid]

    # ------------------------------------------------------------------ decision
    def decide(self, view: EngineView) -> Decision:
        now = view.time
        # Forget finished tasks (a task leaves view.tasks when its last call finishes).
        for tid in [tid for tid in self._tasks if tid not in view.tasks]:
            del self._tasks[tid]
        for r in view.running:
            self._call(r)  # a running call keeps the priority it was admitted with
        beta = self.params.beta_starve
        levels: dict[str, int] = {}  # each waiting call's queue after its promotion, if any
        bounds = self.bounds
        for r in view.waiting:
            c = self._call(r)
            level = bisect.bisect_right(bounds, c.base + max(0.0, r.service_time - c.service0))  # self.level(r)
            if level > 0 and self.starvation_ratio(r, now) >= beta:
                c.wait0 = call_wait(r, now)
                c.service0 = r.service_time
                c.base = 0.0
                c.promotions += 1
                level = self.level(r)
            levels[r.rid] = level
        order = sorted(view.waiting, key=lambda r: (levels[r.rid], r.ready_time, r.rid))
        preempt = self.preemption(view, order) if self.params.preempt else ()
        self._offered = {r.rid for r in order}
        return Decision(admit=tuple(r.rid for r in order), preempt=preempt)

    def preemption(self, view: EngineView, order: list[RequestView]) -> tuple[str, ...]:
        """The running call to preempt (at most one): the lowest-priority one, if it sits in a
        strictly lower queue than the head of ``order`` and the engine refused that head at our
        previous decision."""
        if not order or not view.running or order[0].rid not in self._offered:
            return ()
        head = order[0]
        victim = max(view.running, key=lambda r: (self.level(r), r.admitted_time or 0.0, r.rid))
        return (victim.rid,) if self.level(victim) > self.level(head) else ()
