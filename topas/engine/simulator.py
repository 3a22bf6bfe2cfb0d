"""An event-driven, SGLang-like single-GPU serving simulator (DESIGN.md "Engine model").

Time advances by engine iterations, as in SGLang's scheduler loop: if requests are admitted and
not yet prefilled, one (chunked) prefill iteration runs; otherwise one decode step runs for the
whole running batch. Between events (an arrival, a completion, memory exhaustion, a periodic
re-check while requests wait) the decode batch is fixed and each request's context grows by one
token per step, so runs of decode steps are advanced in closed form
(``CostModel.decode_steps_time``): cost grows with the number of events, not tokens.

Memory (tokens): the KV budget B holds the resident agent prefixes (each paid once, shared by all
running requests of that agent) and every running request's own KV (suffix input + generated
tokens; admission also allocates the slot of the token its prefill will produce, so finishing a
prefill never overshoots the budget). A request runs only while its agent's prefix is resident.
Prefix moves: a load from the host tier costs ``swap_time(l_a)``; a first-ever load (or with no
host copy) is a prefill of l_a tokens; an eviction writes the prefix to the host tier
(``swap_time``) unless a host copy already exists, which is then free. Move times are serialised
with the next iteration's compute.

Admission follows SGLang's ``PrefillAdder``: the policy's admission list is walked in order and
stops at the first request that does not fit after reserving ``new_token_ratio`` of every
running request's remaining output; on decode memory exhaustion requests are retracted
(fewest generated tokens first), their KV freed and their generated tokens recomputed on
readmission. Policies that do not manage prefixes get SGLang's radix-cache behaviour (load on
demand, LRU eviction of unreferenced prefixes); policies that do (TOPAS) pin their prefix set.

Deterministic: no randomness, no iteration over hash-ordered sets.
"""

from __future__ import annotations

import heapq
import time as _time
from typing import Iterable

from tqdm.auto import tqdm

from topas.engine.config import EngineConfig
from topas.engine.cost import CostModel
from topas.engine.entities import DECODE, DONE, PENDING, PREFILL, WAITING, Prefix, Request, TaskState
from topas.engine.metrics import SimResult, build_result
from topas.engine.view import Decision, EngineView, InfeasibleDecision, PrefixView
from topas.policies.base import Policy
from topas.workload.model import Trace
from topas.workload.validate import validate_trace


class SimulationStuck(RuntimeError):
    """The engine is idle with requests waiting and the policy admits none of them."""


class Simulator:
    def __init__(
        self,
        trace: Trace,
        policy: Policy,
        cost: CostModel,
        config: EngineConfig | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        if self.config.kv_budget is not None:
            cost = cost.with_budget(self.config.kv_budget)
        self.cost = cost
        self.budget = cost.kv_budget_tokens
        self.chunk = self.config.max_prefill_tokens or cost.max_prefill_tokens
        validate_trace(trace, kv_budget=self.budget)
        self.trace = trace
        self.policy = policy
        policy.reset()

        self.now = 0.0
        self.prefixes: dict[str, Prefix] = {name: Prefix(agent=a) for name, a in trace.agents.items()}
        self.prefix_tokens = 0
        self.request_tokens = 0
        self.tasks: dict[str, TaskState] = {}
        self.active_tasks: dict[str, TaskState] = {}  # arrived, not finished
        self.finished_tasks = 0
        self.requests: dict[str, Request] = {}
        self.waiting: dict[str, Request] = {}  # insertion-ordered
        self.prefill_queue: list[Request] = []
        self.decoding: dict[str, Request] = {}
        self._arrivals = list(trace.tasks)
        self._next_arrival = 0
        self._pending_move_time = 0.0
        self._dirty = False
        self._idle_retry = False
        cfg = self.config
        self._ratio_init = cfg.init_new_token_ratio
        self._ratio_min = cfg.init_new_token_ratio * cfg.min_new_token_ratio_factor
        self._ratio_decay = (self._ratio_init - self._ratio_min) / cfg.new_token_ratio_decay_steps
        self.new_token_ratio = self._ratio_init
        self._steps_since_check = 0
        # records
        self.prefix_events: list[tuple] = []
        self.timeline: list[tuple] = []
        self.decisions: list[tuple] = []
        self.decode_steps = 0
        self.decode_batch_area = 0  # sum over decode steps of the batch size
        self.busy_time = 0.0

    # ------------------------------------------------------------------ main loop
    def run(self, progress: bool = False) -> SimResult:
        n_tasks = len(self._arrivals)
        wall0 = _time.perf_counter()
        bar = tqdm(total=n_tasks, desc=f"simulate {self.policy.name}", unit="task", disable=not progress)
        finished = 0
        while True:
            self._admit_arrivals()
            if self._dirty and self.waiting:
                self._decide()
            if self.prefill_queue or self._pending_prefix_prefill():
                self._prefill_iteration()
            elif self.decoding:
                self._decode_until_event()
            elif self.waiting and not self._idle_retry:
                # Idle with requests waiting and nothing admitted: ask the policy once more (it can
                # see that nothing changed and fall back) before waiting for the next arrival.
                self._idle_retry = True
                self._dirty = True
            elif (t_next := self._next_idle_event()) is not None:
                self.now = max(self.now, t_next)
                self._idle_retry = False
            elif self.waiting:
                raise SimulationStuck(
                    f"policy {self.policy.name!r} admitted none of the {len(self.waiting)} waiting "
                    f"requests (e.g. {next(iter(self.waiting))}) while the engine is idle at t={self.now:.6f}s"
                )
            else:
                break
            if self.finished_tasks != finished:
                bar.update(self.finished_tasks - finished)
                finished = self.finished_tasks
        bar.close()
        self._before_result()
        return build_result(self, wall_seconds=_time.perf_counter() - wall0)

    def _next_idle_event(self) -> float | None:
        """When an idle engine next has something to do: the next task arrival (None: never).
        Engine models with other sources of events (``topas.fidelity.engine``) extend it."""
        return self._arrivals[self._next_arrival].arrival if self._next_arrival < len(self._arrivals) else None

    def _before_result(self) -> None:
        """Called once the run is over, before the result tables are built (a hook)."""

    # ------------------------------------------------------------------ arrivals and readiness
    def _admit_arrivals(self) -> None:
        while self._next_arrival < len(self._arrivals) and self._arrivals[self._next_arrival].arrival <= self.now:
            task = self._arrivals[self._next_arrival]
            self._next_arrival += 1
            ts = TaskState(task=task)
            self.tasks[task.id] = ts
            self.active_tasks[task.id] = ts
            for s in task.stages:
                rid = f"{task.id}/{s.id}"
                r = Request(rid=rid, task=ts, stage=s, agent=s.agent, x=s.input_tokens, y=s.output_tokens)
                ts.requests[s.id] = r
                self.requests[rid] = r
            for s in task.stages:
                if not s.parents:
                    self._make_ready(ts.requests[s.id], task.arrival)

    def _make_ready(self, r: Request, t: float) -> None:
        r.ready_time = t
        r.state_since = t
        r.state = WAITING
        self.waiting[r.rid] = r
        self._dirty = True

    # ------------------------------------------------------------------ decisions
    def view(self) -> EngineView:
        now = self.now
        prefixes = {
            a: PrefixView(a, p.tokens, p.agent.expected_output_tokens, p.resident, p.on_host, p.refcount, p.last_used)
            for a, p in self.prefixes.items()
        }
        running = tuple(r.view(now) for r in self._running())
        waiting = tuple(r.view(now) for r in self.waiting.values())
        tasks = {tid: ts.view() for tid, ts in self.active_tasks.items()}
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
        )

    def _running(self) -> Iterable[Request]:
        yield from self.prefill_queue
        yield from self.decoding.values()

    def _decide(self) -> None:
        self._dirty = False
        self._steps_since_check = 0
        view = self.view()
        t0 = _time.perf_counter()
        decision = self.policy.decide(view)
        wall = _time.perf_counter() - t0
        admitted = self.apply(decision)
        self.decisions.append(
            (self.now, wall, len(view.waiting), len(view.running), len(decision.admit), admitted,
             len(decision.preempt), len(decision.evict), len(decision.load), dict(decision.info))
        )

    def apply(self, d: Decision) -> int:
        """Apply a Decision (validating it); returns the number of requests admitted."""
        pname = self.policy.name
        manages = self.policy.manages_prefixes
        if not manages and (d.evict or d.load or d.preempt):
            moves = "; ".join(f"{k} {tuple(v)!r}" for k, v in
                              (("evict", d.evict), ("load", d.load), ("preempt", d.preempt)) if v)
            raise InfeasibleDecision(
                f"policy {pname!r} does not manage prefixes (manages_prefixes = False) but returned {moves}; "
                "such a policy may only return an admit order"
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
        for rid in d.preempt:
            self._stop(self.requests[rid], by_engine=False)
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
        # 4. admissions, SGLang PrefillAdder style
        return self._admit(d.admit)

    def _admit(self, admit: tuple[str, ...]) -> int:
        """Admit the (validated, waiting) requests of ``admit`` in order while they fit; stop at
        the first that does not. Returns the number admitted."""
        pname = self.policy.name
        manages = self.policy.manages_prefixes
        admitted = 0
        reserved = self._reserved()
        for rid in admit:
            r = self.waiting[rid]
            if len(self.prefill_queue) + len(self.decoding) >= self.config.max_running_requests:
                break
            p = self.prefixes[r.agent]
            need = r.x + r.generated + 1  # the KV that _start allocates
            own_reserve = self._reserve(r)
            if not p.resident:
                if manages:
                    raise InfeasibleDecision(
                        f"policy {pname!r} admits {rid} but its prefix {r.agent!r} is not resident or loaded"
                    )
                if not self._make_room(p.tokens + need + own_reserve + reserved, exclude=p):
                    break
                self._load(p)
            else:
                fit = need + own_reserve + self._prefix_copy(r, p)
                if self.budget - self.prefix_tokens - self.request_tokens - reserved < fit:
                    if manages or not self._make_room(fit + reserved, exclude=p):
                        break
            self._start(r, p)
            reserved += own_reserve
            admitted += 1
        return admitted

    def _prefix_copy(self, r: Request, p: Prefix) -> int:
        """KV that admitting ``r`` needs for its resident prefix ``p`` beyond its own: 0 here (the
        prefix is shared); :class:`topas.fidelity.engine.SGLangSimulator` charges SGLang's copy."""
        return 0

    def _prefix(self, agent: str, pname: str) -> Prefix:
        p = self.prefixes.get(agent)
        if p is None:
            raise InfeasibleDecision(f"policy {pname!r} names unknown agent prefix {agent!r}")
        return p

    # ------------------------------------------------------------------ memory
    def _reserve(self, r: Request) -> int:
        """SGLang's reservation for r's future output: ratio * min(y - generated, clip)."""
        remaining = min(r.y - r.generated, self.config.clip_max_new_tokens)
        return int(self.new_token_ratio * max(remaining, 0))

    def _reserved(self) -> int:
        return sum(self._reserve(r) for r in self._running())

    def _make_room(self, tokens: int, exclude: Prefix | None = None) -> bool:
        """Evict unreferenced prefixes (LRU) until ``tokens`` fit; False if they cannot."""
        free = self.budget - self.prefix_tokens - self.request_tokens
        if free >= tokens:
            return True
        victims = sorted(
            (p for p in self.prefixes.values() if p.resident and p.refcount == 0 and p is not exclude),
            key=lambda p: (p.last_used, p.agent.name),
        )
        if free + sum(p.tokens for p in victims) < tokens:
            return False
        for p in victims:
            if free >= tokens:
                break
            self._evict(p)
            free += p.tokens
        return True

    def _evict(self, p: Prefix) -> None:
        tokens = p.tokens
        # A prefix whose first-ever prefill has not finished has no complete KV to save: it is
        # dropped (free), and a later load prefills it again.
        if self.config.host_tier and not p.on_host and p.prefill_left == 0:
            self._pending_move_time += self.cost.swap_time(tokens)
            p.on_host = True
            self._record_prefix("evict_swap", p, tokens * self.cost.kv_bytes_per_token)
        else:
            self._record_prefix("evict_free", p, 0.0)
        p.resident = False
        p.prefill_left = 0
        self.prefix_tokens -= tokens

    def _load(self, p: Prefix) -> None:
        if p.on_host:
            self._pending_move_time += self.cost.swap_time(p.tokens)
            self._record_prefix("load_swap", p, p.tokens * self.cost.kv_bytes_per_token)
        else:
            p.prefill_left = p.tokens
            self._record_prefix("load_prefill", p, 0.0)
        p.resident = True
        p.last_used = self.now
        p.loaded_at = self.now
        self.prefix_tokens += p.tokens

    def _record_prefix(self, kind: str, p: Prefix, nbytes: float) -> None:
        self.prefix_events.append((self.now, p.agent.name, kind, p.tokens, nbytes))

    # ------------------------------------------------------------------ request lifecycle
    def _start(self, r: Request, p: Prefix) -> None:
        del self.waiting[r.rid]
        if r.first_admit_time is None:
            r.first_admit_time = self.now
            r.prefix_hit = p.loaded_at != self.now  # resident before this decision
        r.recomputed_tokens += r.generated
        r.admitted_time = self.now
        r.prefill_total = r.prefill_left = r.x + r.generated
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
        self.policy.on_preempt(view, self.now, by_engine)

    def _finish(self, r: Request) -> None:
        view = r.view(self.now)
        del self.decoding[r.rid]
        r.enter(DONE, self.now)
        r.finish_time = self.now
        self.request_tokens -= r.kv
        r.kv = 0
        p = self.prefixes[r.agent]
        p.refcount -= 1
        p.last_used = self.now
        ts = r.task
        ts.done.add(r.stage.id)
        ts.invalidate()
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

    def _prefill_iteration(self) -> None:
        budget = self.chunk
        chunks: list[tuple[int, int]] = []
        for p in self.prefixes.values():  # first-ever loads: prefill the prefix itself
            if p.prefill_left > 0 and budget > 0:
                take = min(p.prefill_left, budget)
                chunks.append((take, p.tokens - p.prefill_left))
                p.prefill_left -= take
                budget -= take
        progressed: list[Request] = []
        for r in self.prefill_queue:
            if budget <= 0:
                break
            if self.prefixes[r.agent].prefill_left > 0:
                continue  # its prefix is still being computed
            take = min(r.prefill_left, budget)
            cached = self.prefixes[r.agent].tokens + (r.prefill_total - r.prefill_left)
            chunks.append((take, cached))
            r.prefill_left -= take
            budget -= take
            progressed.append(r)
        dt = self._pending_move_time + self.cost.prefill_time(chunks)
        self._pending_move_time = 0.0
        self._advance(dt)
        for r in progressed:
            if r.prefill_left == 0:
                self.prefill_queue.remove(r)
                r.generated += 1  # the prefill produces the first (next) output token (KV held since _start)
                r.enter(DECODE, self.now)
                self.decoding[r.rid] = r
                if r.generated >= r.y:
                    self._finish(r)
        self._record_timeline()

    def _decode_until_event(self) -> None:
        b = len(self.decoding)
        free = self.budget - self.prefix_tokens - self.request_tokens
        if free < b:
            self._out_of_memory(b)
            return
        n = min(r.y - r.generated for r in self.decoding.values())
        n = min(n, free // b)
        if self.waiting:
            n = min(n, max(1, self.config.recheck_steps - self._steps_since_check))
        kv0 = sum(self.prefixes[r.agent].tokens + r.kv for r in self.decoding.values())
        if self._next_arrival < len(self._arrivals):
            gap = self._arrivals[self._next_arrival].arrival - self.now - self._pending_move_time
            if gap > 0:
                n = min(n, self.cost.steps_until(b, kv0, gap))
            else:
                n = 1
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
        if self.waiting:
            self._steps_since_check += n
            if self._steps_since_check >= self.config.recheck_steps:
                self._dirty = True
        self._record_timeline()

    def _out_of_memory(self, b: int) -> None:
        """Decode cannot take one more step: evict unreferenced prefixes, then retract requests."""
        if not self.policy.manages_prefixes:
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
                 len(self.prefill_queue), len(self.waiting))
            )


def simulate(
    trace: Trace,
    policy: Policy,
    cost: CostModel,
    config: EngineConfig | None = None,
    progress: bool = False,
) -> SimResult:
    """Run ``trace`` under ``policy`` on the engine described by ``cost`` and ``config``."""
    return Simulator(trace, policy, cost, config).run(progress=progress)
