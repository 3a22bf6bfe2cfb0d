"""How one engine applies a policy's decision (docs/design.md, "Engine parts" and "Engine model").

:class:`Admission` validates a :class:`~topas.engine.view.Decision` and carries it out: the
preemptions (the running batch stops them), the evictions and loads of agent prefixes (the pool),
then the admission walk as SGLang's ``PrefillAdder``: the admission list in order, stopping at the
first request that does not fit beside what is promised (every running request's reserved output
and the admitted requests' whole remaining output), with the in-batch guard
(``EngineConfig.in_batch_guard``) and KVFlow's skip of a request whose prefix is loading; then the
allocation's evictions. It owns the count of preemptions whose room the walk left unused; the
waiting queue it takes admitted requests off is the scheduler's
(:class:`topas.engine.simulator.Simulator`).
"""

from __future__ import annotations

from topas.engine.config import EngineConfig
from topas.engine.entities import DECODE, PREFILL, Prefix, Request
from topas.engine.evict_pass import Eviction
from topas.engine.iterations import Batch
from topas.engine.memory import KVMemory
from topas.engine.policy_api import PolicyAPI
from topas.engine.prefetch import Prefetch
from topas.engine.segments import SegmentMemory
from topas.engine.view import Decision, InfeasibleDecision, admission_tokens, admit_cap, within_caps
from topas.engine.view_cache import ViewedDict


class Admission:
    """A policy's decision applied: validated, preemptions, evictions, loads, the admission walk."""

    def __init__(self, config: EngineConfig, policy: PolicyAPI, waiting: ViewedDict, requests: dict[str, Request],
                 memory: KVMemory, batch: Batch, segments: SegmentMemory | None, prefetch: Prefetch,
                 eviction: Eviction) -> None:
        """``waiting`` and ``requests``: the scheduler's waiting queue and every request it knows."""
        self.config = config
        self.policy = policy
        self.manages = policy.manages_prefixes
        self.waiting = waiting
        self.requests = requests
        self.memory = memory
        self.batch = batch
        self.segments = segments
        self.prefetch = prefetch
        self.eviction = eviction
        #: preempted requests whose room the decision's admissions left unused
        self.preempt_unused = 0

    def apply(self, d: Decision, reserved: int | None = None) -> int:
        """Apply a Decision (validating it): preemptions, evictions, loads, then the admission walk
        and the allocation's evictions; returns the number of requests admitted. ``reserved``: the
        running requests' reservations at the walk (:meth:`Batch.reserved` after the decision's
        preemptions), if the caller knows them (the scheduler's view has each); else the walk sums
        them."""
        pname = self.policy.name
        if not self.manages and (d.evict or d.load or (d.preempt and not self.policy.may_preempt)):
            moves = "; ".join(f"{k} {tuple(v)!r}" for k, v in
                              (("evict", d.evict), ("load", d.load), ("preempt", d.preempt)) if v)
            raise InfeasibleDecision(
                f"policy {pname!r} does not manage prefixes (manages_prefixes = False) but returned {moves}; "
                "such a policy may only return an admit order (and preemptions if it declares may_preempt)"
            )
        admit_set = set(d.admit)
        if len(admit_set) != len(d.admit):
            dup = sorted({r for r in d.admit if d.admit.count(r) > 1})
            raise InfeasibleDecision(f"policy {pname!r} admits {dup[0]} twice")
        if not self.waiting.keys() >= admit_set:  # (the first in the order is named)
            rid = next(rid for rid in d.admit if rid not in self.waiting)
            raise InfeasibleDecision(f"policy {pname!r} admits {rid}, which is not waiting")
        # 1. preemptions
        for rid in d.preempt:
            r = self.requests.get(rid)
            if r is None or r.state not in (PREFILL, DECODE):
                raise InfeasibleDecision(f"policy {pname!r} preempts {rid}, which is not running")
            if rid in d.admit:
                raise InfeasibleDecision(f"policy {pname!r} both preempts and admits {rid}")
        preempted = [(self.requests[rid], self.requests[rid].kv, self.batch.reserve(self.requests[rid]))
                     for rid in d.preempt]
        for r, _, _ in preempted:
            self.batch.stop(r, by_engine=False)
        # 2. evictions
        for a in d.evict:
            p = self._prefix(a, pname)
            if not p.resident:
                raise InfeasibleDecision(f"policy {pname!r} evicts prefix {a!r}, which is not resident")
            if p.refcount:
                raise InfeasibleDecision(
                    f"policy {pname!r} evicts prefix {a!r}, used by {p.refcount} running request(s)"
                )
            self.memory.evict(p)
        # 3. loads
        for a in d.load:
            p = self._prefix(a, pname)
            if p.resident:
                raise InfeasibleDecision(f"policy {pname!r} loads prefix {a!r}, which is already resident")
            m = self.memory
            if m.prefix_tokens + m.request_tokens + p.tokens > m.budget:
                raise InfeasibleDecision(
                    f"policy {pname!r} loads prefix {a!r} ({p.tokens} tokens) but only "
                    f"{m.budget - m.prefix_tokens - m.request_tokens} of {m.budget} KV tokens are free"
                )
            m.load(p)
        # 4. admissions, SGLang PrefillAdder style; then the allocation's evictions
        admit = self._guarded(d.admit) if self.config.in_batch_guard else d.admit
        admitted = self._admit(admit, reserved)
        if preempted:
            self._count_unused_preemptions(preempted, set(d.evict))
        self.eviction.settle()
        return admitted

    def _guarded(self, admit: tuple[str, ...]) -> tuple[str, ...]:
        """``admit`` under the in-batch guard (``EngineConfig.in_batch_guard``): the requests of an
        agent past its :func:`~topas.engine.view.admit_cap` (one for a prefix not in the tree, none
        while a request computes it) are held back for a later decision."""
        keep, held = within_caps([self.waiting[rid] for rid in admit], self._admit_cap)
        return tuple(r.rid for r in keep) if held else admit

    def _admit_cap(self, agent: str) -> int | None:
        """The engine's own :func:`~topas.engine.view.admit_cap` of ``agent`` (what the view shows)."""
        memory = self.memory
        p = memory.prefixes[agent]
        restorable = not p.resident and (p.on_host or memory.cached_unpinned(agent))
        return admit_cap(memory.in_tree(agent), agent in memory.computing, restorable,
                         self.config.prefill_prefix_sharing)

    def _count_unused_preemptions(self, preempted: list[tuple[Request, int, int]], evicted: set[str]) -> None:
        """Count the preempted requests whose room the admission walk left unused: in the order
        preempted, each that would still fit, with its KV, its reservation and (if the decision
        evicted it) its prefix, in what the walk left free (``PrefillAdder``'s remaining tokens)."""
        left = self.memory.locked_room() - self.batch.reserved()
        counted: set[str] = set()
        for r, kv, reserve in preempted:
            need = kv + reserve
            if r.agent in evicted and r.agent not in counted:
                need += self.memory.prefixes[r.agent].tokens
            if need <= left:
                left -= need
                counted.add(r.agent)
                self.preempt_unused += 1

    def _admit(self, admit: tuple[str, ...], reserved: int | None = None) -> int:
        """Admit the (validated, waiting) requests of ``admit`` in order while they fit; stop at
        the first that does not (``PrefillAdder.add_one_req``). Returns the number admitted.
        ``reserved``: :meth:`Batch.reserved` now, if known."""
        pname = self.policy.name
        memory, batch, segments, prefetch = self.memory, self.batch, self.segments, self.prefetch
        admitted = 0
        if reserved is None:
            reserved = batch.reserved()
        # the locked prefixes' tokens (KVMemory.locked_prefix_tokens), kept through the walk: an
        # admission locks its own prefix only (it is resident and used after it)
        locked = memory.locked_prefix_tokens()
        for rid in admit:
            r = self.waiting[rid]
            if batch.n_running() >= self.config.max_running_requests:
                break
            if prefetch.enabled and prefetch.skip_loading(r.agent):
                locked = memory.locked_prefix_tokens()  # (a host load it started locks its prefix)
                continue  # its prefix is loading from host: skipped, not blocking the walk
            p = memory.prefixes[r.agent]
            own_reserve = batch.reserve(r)
            if self.config.full_output_reserve and not admitted and not batch.prefill_queue and not batch.decoding:
                # Our one departure from add_one_req's strict inequality: an idle engine admits a
                # request that exactly fills the pool (the trace validator accepts l_a + x + y = B;
                # SGLang would refuse it forever).
                own_reserve = max(own_reserve - 1, 0)
            if not p.resident:
                if self.manages:
                    raise InfeasibleDecision(
                        f"policy {pname!r} admits {rid} but its prefix {r.agent!r} is not resident or loaded"
                    )
                # it computes the prefix itself: prefix + its prompt (+ the slot of its first token)
                if not self._fits(p.tokens + admission_tokens(r.x, r.generated, own_reserve) + reserved, p, locked):
                    break
                memory.load(p)
                copy = 0
                matched = 0
                newly_locked = p.tokens
            else:
                copy = self._prefix_copy(r, p)
                # locking a cached prefix takes it out of the evictable KV (add_one_req checks again
                # after _lock_node)
                newly_locked = 0 if memory.locked(p) else p.tokens
                lock = newly_locked if self.config.radix_cache else 0
                matched = 0
                if segments is not None and not copy and p.prefill_left == 0:
                    _, matched, seg_lock = segments.match(r)
                    lock += seg_lock
                if not self._fits(lock + copy - matched + admission_tokens(r.x, r.generated, own_reserve) + reserved,
                                  p, locked):
                    break
            del self.waiting[rid]
            batch.start(r, p, copy)
            locked += newly_locked
            reserved += own_reserve
            admitted += 1
        return admitted

    def _prefix_copy(self, r: Request, p: Prefix) -> int:
        """Prefix tokens ``r`` must compute in its own prefill: the whole prefix while another
        request is computing it (SGLang matched none of it), unless ``prefill_prefix_sharing``."""
        if self.config.prefill_prefix_sharing or r.agent not in self.memory.computing:
            return 0
        return p.tokens

    def _fits(self, tokens: int, exclude: Prefix, locked_prefix_tokens: int) -> bool:
        """Whether ``tokens`` more fit in the pool. With the radix cache: beside everything locked
        (running requests' KV, prefixes in use, pinned or being computed: ``locked_prefix_tokens``,
        :meth:`KVMemory.locked_prefix_tokens` now), evictable KV counting as available, as
        ``PrefillAdder`` counts it (:meth:`KVMemory.locked_room`). Without: in the free pool, after
        evicting unreferenced prefixes (LRU) at once for a policy that does not manage them."""
        if self.config.radix_cache:
            return self.memory.locked_room(locked_prefix_tokens) >= tokens
        if self.memory.free_tokens() >= tokens:
            return True
        return not self.manages and self.eviction.make_room(tokens, exclude=exclude)

    def _prefix(self, agent: str, pname: str) -> Prefix:
        p = self.memory.prefixes.get(agent)
        if p is None:
            raise InfeasibleDecision(f"policy {pname!r} names unknown agent prefix {agent!r}")
        return p
