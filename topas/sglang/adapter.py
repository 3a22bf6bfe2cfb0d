"""The engine-independent half of the SGLang plugin: snapshots in, concrete actions out.

SGLang's scheduler is reached only through :mod:`topas.sglang.plugin`, which copies the state
it needs into plain data (:class:`Snapshot`, :mod:`topas.sglang.snapshot`) once per scheduler
iteration and applies the :class:`Actions` that :meth:`Adapter.step` returns. Everything else
lives here, in :mod:`topas.sglang.adapter_state` (what is tracked between iterations) and in
:mod:`topas.sglang.decision_check` (the simulator's rules), and is tested without SGLang
(``tests/test_sglang_adapter.py``):

* per-task workflow state, learned from the metadata each request carries in
  ``sampling_params.custom_params["topas"]`` (:class:`RequestMeta`, :mod:`topas.sglang.metadata`:
  the task's DAG, without output lengths, the agents table, arrival and ready times);
* the policy's :class:`~topas.engine.view.EngineView`, built field by field as the simulator
  builds it (``Simulator.view``), so one policy object runs unchanged on either engine;
* when to decide: as in the simulator, when a request became ready, finished, or was preempted
  or retracted, and otherwise every ``recheck_steps`` scheduler iterations while requests wait
  (the simulator counts decode steps there); between decisions nothing new is admitted;
* validating the :class:`~topas.engine.view.Decision` with the simulator's rules
  (``Simulator.apply``, :func:`topas.sglang.decision_check.check_decision`); an invalid one, or
  a policy that raises, gives ``Actions.fallback`` (the plugin then leaves SGLang's own policy in
  charge for that step);
* every decision's record, with its wall time;
* what the policy may know (issue 16): a run's metadata may carry ``knowledge``
  (:meth:`topas.engine.knowledge.Knowledge.settings`: prior noise and bias, ``online`` DAGs),
  applied to the view exactly as the simulator applies it (noisy priors per agent; under
  ``online`` a task shows only the stages whose requests reached the server, or finished).

How SGLang's state maps onto the view (choices where the engines differ, see also
``topas/sglang/plugin.py``):

* ``kv_budget`` is the server's KV pool (``max_total_num_tokens``); ``request_tokens`` sums the
  running requests' own KV, ``x_v + generated``; ``prefix_tokens`` sums the resident prefixes.
* A prefix is *resident* while a running request uses it, and otherwise: for a policy that
  manages prefixes, while the policy keeps it pinned (``Decision.load``; the plugin locks it in
  the radix tree, or as soon as the first request of the agent has computed it; ``evict``
  unlocks it, leaving it to SGLang's LRU), as in the simulator, where such a policy owns the
  resident set; for the other policies, while it is fully cached in the radix tree (probed at
  each decision). ``on_host`` is set only with a host tier.
* For every policy, ``in_tree`` is whether the prefix is fully in the radix tree now (a locked
  pin is; the others are probed at each decision), so a request admitted now would match it;
  ``computing``: a running request of the agent and the prefix not in the tree (its prefill, or,
  under the overlap scheduler, the batch whose result is not processed yet); ``cached`` (a
  managing policy's unpinned prefix): still in the tree. Requests waiting on a prefix not in the
  tree make its entry into the tree a decision point (probed each iteration for those agents
  only), as the simulator's ``EngineConfig.recheck_on_insert``.
* ``RequestView.reserve`` is what SGLang's ``PrefillAdder`` reserves for the request's output,
  computed by the plugin from the request's ``max_new_tokens``, output so far and
  ``ignore_eos`` and the scheduler's new-token ratio (:func:`topas.sglang.snapshot.output_reserve_of`).
* Requests without topas metadata (SGLang's warm-up, health checks) are not shown to the policy
  and are never held back.
* Times are seconds since the replay run's start (``RequestMeta.t0``, the client's clock; the
  server is expected on the same host or with synchronised clocks).
"""

from __future__ import annotations

import math
import time as _time
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

from topas.engine.cost import CostModel
from topas.engine.knowledge import Knowledge
from topas.engine.view import Decision, EngineView, InfeasibleDecision, PrefixView, RequestView, StageView
from topas.policies.base import Policy
from topas.sglang.adapter_state import (RUNNING, VIEW_COMPUTING, WAITING, TrackedPrefix, TrackedRequest,
                                        TrackedTask)
from topas.sglang.decision_check import check_decision
# the metadata and the snapshot/actions types, re-exported: the plugin and the replay import them from here
from topas.sglang.metadata import (DECISION_COLUMNS, META_KEY, META_VERSION, RID_META_MARK,  # noqa: F401
                                   RequestMeta, meta_from_custom_params, meta_from_request, rid_with_meta, short_rid)
from topas.sglang.snapshot import Actions, ReqSnap, Snapshot, output_reserve_of  # noqa: F401
from topas.workload.model import Stage, Task


# ----------------------------------------------------------------------------- the adapter


class Adapter:
    """Runs one policy against a stream of :class:`Snapshot` s (one scheduler process).

    ``policy_factory(name, params)`` builds the policy a run's metadata asks for (default
    :func:`topas.policies.base.make_policy`); ``cost`` is the policy's cost model (its KV budget
    is replaced by the server's). ``recorder(record)`` receives every decision record.
    """

    def __init__(
        self,
        policy: Policy,
        cost: CostModel,
        recheck_steps: int = 32,
        recorder: Callable[[dict], None] | None = None,
        policy_factory: Callable[[str, Mapping[str, Any]], Policy] | None = None,
        clock: Callable[[], float] = _time.perf_counter,
        recheck_on_insert: bool = True,
    ) -> None:
        self.default_policy = policy
        self.policy = policy
        self.base_cost = cost
        self.recheck_steps = recheck_steps
        #: a prefix entering the radix tree while requests of its agent wait is a decision point
        #: (the simulator's ``EngineConfig.recheck_on_insert``): checked each iteration by probing
        #: only the agents that had requests waiting on a prefix not in the tree at the last view
        self.recheck_on_insert = recheck_on_insert
        self.recorder = recorder
        self.policy_factory = policy_factory
        self.clock = clock
        self.run: str | None = None
        self.t0 = 0.0
        self.knowledge = Knowledge()  # the run's, from its metadata (issue 16)
        self._reset_state()

    # ------------------------------------------------------------------ state
    def _reset_state(self) -> None:
        self.reqs: dict[str, TrackedRequest] = {}  # by SGLang rid, waiting or running
        self.by_rid: dict[str, str] = {}  # policy rid -> SGLang rid
        self.waiting_order: dict[str, None] = {}  # SGLang rids, in the order they became waiting
        self.tasks: dict[str, TrackedTask] = {}
        self.prefixes: dict[str, TrackedPrefix] = {}
        self.pinned: set[str] = set()
        self.held: frozenset[str] = frozenset()  # agents waiting on a prefix not in the tree (last view)
        self.dirty = False
        self.steps_since = 0
        self.n_decisions = 0
        self.last_view: EngineView | None = None
        self._cost: CostModel | None = None
        self._cost_budget: int | None = None
        self.policy.reset()

    def _start_run(self, meta: RequestMeta) -> None:
        self.run = meta.run
        self.t0 = meta.t0
        self.knowledge = Knowledge.from_settings(dict(meta.knowledge))
        if meta.policy is not None and self.policy_factory is not None:
            self.policy = self.policy_factory(meta.policy, dict(meta.params))
        else:
            self.policy = self.default_policy
        self._reset_state()

    def cost(self, budget: int) -> CostModel:
        if self._cost is None or self._cost_budget != budget:
            self._cost = self.base_cost.with_budget(budget) if budget != self.base_cost.kv_budget_tokens else self.base_cost
            self._cost_budget = budget
        return self._cost

    def probe_agents(self, known: frozenset[str] | set[str] = frozenset()) -> list[str]:
        """Agents whose prefix the plugin should probe in the radix tree at a decision: every
        known agent but those already ``known`` to be in it (``Snapshot.cached``: the plugin's
        locked pins). A resident prefix may still be being computed (a running request's
        prefill, or a pinned prefix not computed yet): the probe says whether a request admitted
        now would match it (``PrefixView.in_tree``, which LPM and TOPAS's in-batch guard read);
        for a prefix-managing policy it also says whether an unpinned prefix is still cached
        (``PrefixView.cached``: loading it again is free)."""
        return [a for a in self.prefixes if a not in known]

    def prefix_tokens_of(self, agent: str) -> int:
        return self.prefixes[agent].tokens

    def _learn(self, meta: RequestMeta) -> None:
        for name, l, e in meta.agents:
            if name not in self.prefixes:
                self.prefixes[name] = TrackedPrefix(name, l, e)
        if meta.task not in self.tasks:
            stages = tuple(Stage(s, a, x, 0, p) for s, a, x, p in meta.dag)  # no y: never sent
            task = Task(id=meta.task, arrival=meta.arrival, stages=stages, workflow=meta.workflow)
            kids = task.children
            views = MappingProxyType({s.id: StageView(s.id, s.agent, s.input_tokens, s.parents, kids[s.id])
                                      for s in stages})
            self.tasks[meta.task] = TrackedTask(task, views)
        self.tasks[meta.task].reach(meta.stage)  # online DAGs: the stage is shown from now on

    # ------------------------------------------------------------------ observing
    def observe(self, snap: Snapshot) -> float:
        """Update the workflow state from ``snap``; returns the run time of the snapshot."""
        for r in (*snap.waiting, *snap.running):
            if r.meta is not None and r.meta.run != self.run:
                self._start_run(r.meta)
                break
        now = snap.now - self.t0
        for erid, out, t_epoch in snap.finished:
            r = self.reqs.get(erid)
            if r is None:
                continue
            tf = t_epoch - self.t0
            r.generated = out
            view = self._finish(r, tf)
            self.policy.on_finish(view, tf, out)
        for erid in snap.aborted:
            r = self.reqs.pop(erid, None)
            if r is not None:
                self.by_rid.pop(r.meta.rid, None)
                self.waiting_order.pop(erid, None)
                self.dirty = True
        for s in snap.waiting:
            if s.meta is None:
                continue
            r = self.reqs.get(s.rid)
            if r is None:
                self._learn(s.meta)
                r = TrackedRequest(s.rid, s.meta, ready_time=s.meta.ready if math.isfinite(s.meta.ready) else now)
                self.reqs[s.rid] = r
                self.by_rid[s.meta.rid] = s.rid
                self.waiting_order[s.rid] = None
                self.dirty = True
            elif r.state == RUNNING:  # retracted by the engine
                view = r.view(now)
                self._stop(r, now)
                r.retractions += 1
                self.policy.on_preempt(view, now, True)
            r.generated = s.generated
            r.reserve = s.reserve
        for s in snap.running:
            if s.meta is None:
                continue
            r = self.reqs.get(s.rid)
            if r is None:  # admitted before we saw it wait (e.g. a fallback step)
                self._learn(s.meta)
                r = TrackedRequest(s.rid, s.meta, ready_time=s.meta.ready)
                self.reqs[s.rid] = r
                self.by_rid[s.meta.rid] = s.rid
                self._start(r, now)
                self.dirty = True
            elif r.state == WAITING:
                self._start(r, now)
            r.generated = s.generated
            r.kv = s.kv_tokens
            r.reserve = s.reserve
        return now

    def _start(self, r: TrackedRequest, now: float) -> None:
        r.state = RUNNING
        r.admitted_time = now
        if r.first_admit is None:
            r.first_admit = now
        self.waiting_order.pop(r.erid, None)
        self.prefixes[r.meta.agent].last_used = now

    def _stop(self, r: TrackedRequest, now: float) -> None:
        if r.admitted_time is not None:
            r.service += now - r.admitted_time
        r.admitted_time = None
        r.state = WAITING
        r.kv = 0
        self.waiting_order[r.erid] = None
        self.prefixes[r.meta.agent].last_used = now
        self.dirty = True

    def _finish(self, r: TrackedRequest, now: float) -> RequestView:
        view = r.view(now)
        del self.reqs[r.erid]
        self.by_rid.pop(r.meta.rid, None)
        self.waiting_order.pop(r.erid, None)
        self.prefixes[r.meta.agent].last_used = now
        ts = self.tasks.get(r.meta.task)
        if ts is not None:
            ts.done.add(r.meta.stage)
            ts.observed[r.meta.stage] = r.generated
            ts._view = None
            if len(ts.done) == len(ts.task.stages):
                del self.tasks[r.meta.task]
        self.dirty = True
        return view

    def on_admitted(self, erids: Sequence[str], now_epoch: float) -> None:
        """The engine admitted these requests in this iteration (SGLang rids)."""
        now = now_epoch - self.t0
        for erid in erids:
            r = self.reqs.get(erid)
            if r is not None and r.state == WAITING:
                self._start(r, now)

    def _entered_tree(self, snap: Snapshot) -> bool:
        """Whether a prefix that requests were waiting on (:attr:`held`) is in the radix tree now."""
        waiting = {self.reqs[e].meta.agent for e in self.waiting_order}
        for a in self.held:
            if a in waiting and (a in snap.cached or (snap.probe is not None and snap.probe(a))):
                return True
        return False

    # ------------------------------------------------------------------ the view
    def view(self, snap: Snapshot, now: float) -> EngineView:
        running = [self.reqs[s.rid] for s in snap.running if s.rid in self.reqs]
        refs: dict[str, int] = {}
        for r in running:
            refs[r.meta.agent] = refs.get(r.meta.agent, 0) + 1
        # A policy that manages prefixes owns the resident set (its pins; a cached but unpinned
        # prefix is evictable, i.e. free memory, and a load of it just pins it); for the others
        # SGLang's radix cache decides, so a prefix is resident while it is fully cached.
        manages = self.policy.manages_prefixes
        in_tree = set(snap.cached)  # agents whose prefix is fully in the radix tree
        if snap.probe is not None:  # every policy: in_tree (LPM's match, TOPAS's guard) and cached
            in_tree.update(a for a in self.probe_agents(in_tree) if snap.probe(a))
        cached = set() if manages else in_tree
        prefixes = {}
        prefix_tokens = 0
        for a, p in self.prefixes.items():
            refcount = refs.get(a, 0)
            resident = a in self.pinned or a in cached or refcount > 0
            if resident:
                prefix_tokens += p.tokens
            # a managing policy's unpinned prefix that the radix tree still holds (a load re-pins it)
            still_cached = manages and not resident and a in in_tree
            # a running request of the agent whose prefix is not in the tree is computing it (its
            # prefill, or under the overlap scheduler the batch whose result is not processed yet)
            extra = {"computing": refcount > 0 and a not in in_tree} if VIEW_COMPUTING else {}
            prefixes[a] = PrefixView(a, p.tokens, self.knowledge.prior(a, p.expected_output), resident,
                                     a in snap.host, refcount, p.last_used, still_cached,
                                     resident and a in in_tree, **extra)
        waiting = tuple(self.reqs[e].view(now) for e in self.waiting_order)
        if self.recheck_on_insert:
            self.held = frozenset(r.agent for r in waiting if r.agent not in in_tree)
        return EngineView(
            time=now,
            kv_budget=snap.kv_budget,
            prefix_tokens=prefix_tokens,
            request_tokens=sum(r.kv for r in running),
            prefixes=prefixes,
            running=tuple(r.view(now) for r in running),
            waiting=waiting,
            tasks={tid: ts.view(self.knowledge.online) for tid, ts in self.tasks.items()},
            cost=self.cost(snap.kv_budget),
            decode_batch=len(running) if snap.n_decoding is None else snap.n_decoding,
        )

    # ------------------------------------------------------------------ deciding
    def step(self, snap: Snapshot, force: bool = False) -> Actions:
        """Observe ``snap`` and, at a decision point (or with ``force``), ask the policy; returns
        the iteration's actions."""
        now = self.observe(snap)
        if not self.waiting_order:
            return Actions(restrict=False, pinned=frozenset(self.pinned))
        self.steps_since += 1
        if not force and not self.dirty and self.held and self.steps_since < self.recheck_steps:
            self.dirty = self._entered_tree(snap)
        if not force and not self.dirty and self.steps_since < self.recheck_steps:
            return Actions(restrict=True, pinned=frozenset(self.pinned))
        self.dirty = False
        self.steps_since = 0
        view = self.view(snap, now)
        self.last_view = view
        t0 = self.clock()
        try:
            decision = self.policy.decide(view)
        except Exception as e:  # a policy bug must not take the server down
            wall = self.clock() - t0
            return self._fallback(view, now, wall, f"policy raised {type(e).__name__}: {e}")
        wall = self.clock() - t0
        try:
            self.validate(decision, view)
        except InfeasibleDecision as e:
            return self._fallback(view, now, wall, f"infeasible decision: {e}")
        # apply to our own state (the plugin applies it to SGLang)
        preempt = []
        for rid in decision.preempt:
            r = self.reqs[self.by_rid[rid]]
            rv = r.view(now)
            self._stop(r, now)
            r.preemptions += 1
            preempt.append(r.erid)
            self.policy.on_preempt(rv, now, False)
        for a in decision.evict:
            self.pinned.discard(a)
            self.prefixes[a].last_used = now
        for a in decision.load:
            self.pinned.add(a)
            self.prefixes[a].last_used = now
        self.dirty = bool(preempt)  # re-decide next iteration only if we preempted (simulator: _stop)
        admit = tuple(self.by_rid[rid] for rid in decision.admit)
        record = self._record(view, now, wall, decision, None)
        return Actions(restrict=True, admit=admit, preempt=tuple(preempt), pinned=frozenset(self.pinned),
                       decided=True, record=record)

    def _fallback(self, view: EngineView, now: float, wall: float, why: str) -> Actions:
        record = self._record(view, now, wall, None, why)
        return Actions(restrict=False, pinned=frozenset(self.pinned), decided=True, fallback=why, record=record)

    def _record(self, view: EngineView, now: float, wall: float, d: Decision | None, why: str | None) -> dict:
        self.n_decisions += 1
        rec = {
            "run": self.run, "policy": self.policy.name, "seq": self.n_decisions, "time": now, "wall_s": wall,
            "n_waiting": len(view.waiting), "n_running": len(view.running),
            "waiting": [r.rid for r in view.waiting], "running": [r.rid for r in view.running],
            "resident": sorted(view.resident), "free_tokens": view.free_tokens,
            "admit": list(d.admit) if d else [], "preempt": list(d.preempt) if d else [],
            "evict": list(d.evict) if d else [], "load": list(d.load) if d else [],
            "info": {k: float(v) for k, v in d.info.items()} if d else {},
            "fallback": why,
        }
        if self.recorder is not None:
            self.recorder(rec)
        return rec

    def validate(self, d: Decision, view: EngineView) -> None:
        """The simulator's rules (``Simulator.apply``), on the view; raises InfeasibleDecision
        (:func:`topas.sglang.decision_check.check_decision`)."""
        check_decision(d, view, self.policy)
