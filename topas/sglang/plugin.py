"""The SGLang side of the topas scheduler plugin (entry point ``sglang.srt.plugins: topas``).

SGLang's ``load_plugins()`` calls :func:`register` in every scheduler process (whitelist it
with ``SGLANG_PLUGINS=topas``). It registers hooks (``HookRegistry``) that copy the scheduler's
state into a :class:`topas.sglang.adapter.Snapshot` each iteration, let the
:class:`~topas.sglang.adapter.Adapter` run the policy, and apply its actions:

* ``Scheduler.__init__`` (AFTER): keep the scheduler; build the adapter from the environment.
* ``Scheduler.get_new_batch_prefill`` (AROUND): once per iteration, before SGLang picks the
  prefill batch: snapshot, decide, preempt (``release_req`` + ``filter_batch``), reconcile prefix
  pins (``tree_cache.lock``/``unlock`` of the agent's prefix node); after it: re-queue the
  preempted requests (only then: re-queuing before lets a request be re-admitted in the same
  step) and report the admitted requests to the adapter and the log.
* ``SchedulePolicy.calc_priority`` (AROUND): with a decision in force, order the waiting queue
  as the policy said (requests without topas metadata first) instead of SGLang's policy.
* ``PrefillAdder.add_one_req`` (AROUND): a topas request the policy did not admit returns
  ``AddReqResult.OTHER``, which ends SGLang's admission loop; so SGLang admits a prefix of the
  policy's list, stopping at the first request that does not fit, exactly as the simulator.
* ``Scheduler.flush_cache`` (AROUND): a flush resets the radix tree regardless of locks; the
  saved locks are dropped (and re-taken when the prefixes are cached again).
* ``Scheduler.get_internal_state`` (AROUND): adds a ``topas`` block to each scheduler's internal
  state, which SGLang's ``GET /server_info`` returns (:func:`Controller.info`: the plugin's
  version, the server's default policy, the policies it can run, the device, the model config's
  hash, the KV pool and the decisions of the latest runs). It is the client's handshake
  (:mod:`topas.sglang.server`): a server without this block does not run the plugin.

Any exception in the topas code is logged and that iteration falls back to SGLang's own policy;
so does a policy that raises or returns an infeasible decision (the adapter says so). Requests
are never dropped by the plugin.

Environment (set by ``topas serve``; scheduler processes are spawned, so it is the only channel):

``TOPAS_POLICY`` (default ``fcfs``), ``TOPAS_POLICY_PARAMS`` (JSON object), ``TOPAS_PROFILE``
(the policy's cost model; its KV budget is replaced by the server's), ``TOPAS_DECISION_LOG``
(JSONL file: one line per decision, admission, pin change and fallback; rank > 0 appends
``.rank<N>``), ``TOPAS_RECHECK_STEPS`` (default 32), ``TOPAS_POLICY_MODULES`` (comma-separated
modules imported first, for policies registered outside topas, e.g. ``topas.sglang.testing``).
A run's metadata may name its own policy (``RequestMeta.policy``), so one server can replay
every policy of a sweep.

``SGLANG_PLUGINS`` (SGLang's own variable) decides whether the plugin loads at all: unset, SGLang
loads *every* installed plugin, so any server started from an environment where topas is installed
runs it (with ``TOPAS_POLICY`` unset: ``fcfs``, switched per run by the metadata); ``topas`` (or a
list containing it) loads it; any list without it (e.g. ``none``) leaves SGLang's own scheduler in
charge, which :mod:`topas.sglang.server` detects and refuses to replay on.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import platform
import threading
import time
from array import array
from typing import Any
import topas
from topas.sglang.snapshot import output_reserve_of

logger = logging.getLogger("topas.sglang.plugin")

_LOCK = threading.Lock()

#: Version of what the plugin reports in ``/server_info`` and of its scheduling behaviour; part of
#: an ``engine="sglang"`` result's key (with the topas version), so a changed plugin never reuses a
#: result measured with the old one.
PLUGIN_PROTOCOL = 2
#: How many recent runs the ``/server_info`` block keeps decision counts of.
RUNS_KEPT = 256


class _Log:
    """Appends JSON lines to ``TOPAS_DECISION_LOG`` (flushed per line)."""

    def __init__(self, path: str | None) -> None:
        self.f = open(path, "a", buffering=1, encoding="utf-8") if path else None

    def write(self, kind: str, rec: dict[str, Any]) -> None:
        if self.f is None:
            return
        try:
            self.f.write(json.dumps({"kind": kind, "epoch": time.time(), **rec}, default=str) + "\n")
        except Exception:  # logging must never break scheduling
            logger.exception("topas: cannot write the decision log")


class Controller:
    """Per scheduler process: the adapter, the prefix locks and the log."""

    def __init__(self, scheduler: Any) -> None:
        # lazy: SGLang loads this module in every server process; the adapter, the policies and the
        # tokens (~0.3 s, numpy) load only once a scheduler starts
        from topas.engine.cost import DEFAULT_PROFILE, load_profile
        from topas.policies.base import make_policy
        from topas.sglang.adapter import Adapter

        for mod in filter(None, (m.strip() for m in os.environ.get("TOPAS_POLICY_MODULES", "").split(","))):
            importlib.import_module(mod)
        name = os.environ.get("TOPAS_POLICY", "fcfs")
        params = json.loads(os.environ.get("TOPAS_POLICY_PARAMS", "") or "{}")
        policy = make_policy(name, params)
        cost = load_profile(os.environ.get("TOPAS_PROFILE", DEFAULT_PROFILE))
        rank = int(getattr(scheduler, "tp_rank", 0) or 0)
        path = os.environ.get("TOPAS_DECISION_LOG")
        if path and rank:
            path = f"{path}.rank{rank}"
        self.log = _Log(path)
        self.sched = scheduler
        self.adapter = Adapter(
            policy, cost, recheck_steps=int(os.environ.get("TOPAS_RECHECK_STEPS", "32")),
            recorder=self.record,
            policy_factory=lambda n, p: make_policy(n, p),
        )
        self.policy_name, self.policy_params = name, params
        self.runs: dict[str, dict[str, Any]] = {}  # run id -> {"policy", "decisions", "fallbacks"}
        self.meta_cache: dict[str, Any] = {}  # SGLang rid -> RequestMeta | None
        self.last_running: dict[str, Any] = {}  # SGLang rid -> Req
        self.locks: dict[str, tuple[Any, int]] = {}  # agent -> (TreeLock, pinned tokens)
        self.actions = None
        self.requeue: list[Any] = []
        self.page = int(getattr(scheduler, "page_size", 1) or 1)
        try:  # SGLang's CLIP_MAX_NEW_TOKENS (env SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION, default 4096)
            from sglang.srt.managers.schedule_policy import CLIP_MAX_NEW_TOKENS as clip  # lazy: SGLang (server only)
        except Exception:
            clip = int(os.environ.get("SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION", "4096"))
        self.clip = int(clip)
        self.log.write("start", {"policy": name, "params": params, "pid": os.getpid(), "rank": rank,
                                 "kv_budget": self.budget()})
        logger.info("topas plugin: policy %s %s, decision log %s", name, params, path)

    # ------------------------------------------------------------------ reporting
    def record(self, rec: dict[str, Any]) -> None:
        """A decision record: count it for its run (``/server_info``) and log it."""
        run = self.runs.pop(rec.get("run"), None) or {"policy": rec.get("policy"), "decisions": 0, "fallbacks": 0}
        run["policy"] = rec.get("policy")
        run["decisions"] += 1
        run["fallbacks"] += rec.get("fallback") is not None
        self.runs[rec.get("run")] = run  # re-inserted: the dict is in least-recent-first order
        while len(self.runs) > RUNS_KEPT:
            self.runs.pop(next(iter(self.runs)))
        self.log.write("decision", rec)

    def info(self) -> dict[str, Any]:
        """What ``GET /server_info`` reports of the plugin (``internal_states[i]["topas"]``)."""
        from topas.policies.base import available_policies  # lazy: as in Controller

        return {
            "plugin": "topas", "protocol": PLUGIN_PROTOCOL, "topas_version": topas.__version__,
            "policy": self.policy_name, "params": self.policy_params, "policies": available_policies(),
            "kv_pool_tokens": self.budget(), "page_size": self.page, "device": device_name(self.sched),
            "model_config_sha256": model_config_hash(self.sched), "runs": dict(self.runs),
        }

    # ------------------------------------------------------------------ snapshot
    def budget(self) -> int:
        s = self.sched
        n = getattr(s, "max_total_num_tokens", None)
        if not n:
            n = s.token_to_kv_pool_allocator.size
        return int(n)

    def meta(self, req: Any):
        rid = req.rid
        if rid not in self.meta_cache:
            from topas.sglang.adapter import meta_from_request, short_rid  # lazy: as in Controller

            try:
                self.meta_cache[rid] = meta_from_request(getattr(req.sampling_params, "custom_params", None), rid)
            except ValueError as e:
                logger.warning("topas: request %s: %s; scheduled as a plain request", short_rid(rid), e)
                self.meta_cache[rid] = None
        return self.meta_cache[rid]

    def reserve(self, req: Any, running: bool) -> int:
        """The KV SGLang's ``PrefillAdder`` reserves for ``req``'s future output at this
        iteration (:func:`topas.sglang.snapshot.output_reserve_of`): its ``max_new_tokens`` left,
        clipped at ``CLIP_MAX_NEW_TOKENS``; in full while waiting or with ``ignore_eos``, else
        the scheduler's new-token ratio of it (:meth:`new_token_ratio`)."""

        sp = req.sampling_params
        max_new = getattr(sp, "max_new_tokens", None)
        if max_new is None:
            return 0
        return output_reserve_of(max_new, len(req.output_ids), running, bool(getattr(sp, "ignore_eos", False)),
                                 self.new_token_ratio(), self.clip)

    def new_token_ratio(self) -> float:
        """The ratio this iteration's ``PrefillAdder`` gets: ``new_token_ratio_tracker.current``
        (SGLang 0.5.23), ``new_token_ratio`` on older schedulers."""
        tracker = getattr(self.sched, "new_token_ratio_tracker", None)
        if tracker is not None:
            return float(tracker.current)
        return float(getattr(self.sched, "new_token_ratio", 1.0))

    def snapshot(self, running_batch: Any):
        from topas.sglang.adapter import ReqSnap, Snapshot  # lazy: as in Controller

        s = self.sched
        now = time.time()
        running_reqs = [r for r in running_batch.reqs if not r.finished()]
        if s.chunked_req is not None and s.chunked_req not in running_reqs:
            running_reqs.append(s.chunked_req)
        waiting = []
        for r in s.waiting_queue:
            m = self.meta(r)
            waiting.append(ReqSnap(r.rid, m, len(r.output_ids), 0, self.reserve(r, False) if m is not None else 0))
        running = []
        for r in running_reqs:
            m = self.meta(r)
            gen = len(r.output_ids)
            kv = (m.input_tokens + gen) if m is not None else len(r.origin_input_ids) + gen
            running.append(ReqSnap(r.rid, m, gen, kv, self.reserve(r, True) if m is not None else 0))
        present = {r.rid for r in running_reqs} | {r.rid for r in s.waiting_queue}
        finished, aborted = [], []
        for rid, r in self.last_running.items():
            if rid in present:
                continue
            if r.finished() and not _is_abort(r):
                finished.append((rid, len(r.output_ids), now))
            else:
                aborted.append(rid)
            self.meta_cache.pop(rid, None)
        self.last_running = {r.rid: r for r in running_reqs}
        # a locked pin is in the tree (the lock keeps it there); the probe asks for the others
        return Snapshot(now=now, waiting=tuple(waiting), running=tuple(running), kv_budget=self.budget(),
                        finished=tuple(finished), aborted=tuple(aborted), cached=frozenset(self.locks),
                        probe=self.is_cached,
                        n_decoding=len(running_batch.reqs))

    # ------------------------------------------------------------------ prefixes
    def pin_len(self, agent: str) -> int:
        n = self.adapter.prefix_tokens_of(agent)
        return n - n % self.page

    def is_cached(self, agent: str) -> bool:
        """Is the agent's prefix fully in the device tree? A read-only walk where the tree core has
        one (``match_full_device_prefix``), so probing does not refresh the prefix's LRU time and
        SGLang's own eviction order (what the baselines rely on) is left as it is."""
        from sglang.srt.mem_cache.radix_cache import RadixKey  # lazy: SGLang (server only)

        from topas.sglang.tokens import prefix_ids  # lazy: as in Controller

        n = self.pin_len(agent)
        core = getattr(self.sched.tree_cache, "tree_core", None)
        if core is not None and hasattr(core, "match_full_device_prefix"):
            return int(core.match_full_device_prefix(RadixKey(array("q", prefix_ids(agent, n))))[0]) >= n
        return self.cached_len(agent)[0] >= n  # touches the prefix (older tree cores)

    def cached_len(self, agent: str):
        """Match (and split the tree at) the agent's prefix: its cached length and last node, to lock."""
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams  # lazy: SGLang (server only)
        from sglang.srt.mem_cache.radix_cache import RadixKey  # lazy: SGLang (server only)

        from topas.sglang.tokens import prefix_ids  # lazy: as in Controller

        ids = prefix_ids(agent, self.pin_len(agent))
        m = self.sched.tree_cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", ids))))
        return int(m.device_prefix_len), m.last_device_node

    def reconcile_pins(self, wanted: frozenset) -> None:
        tree = self.sched.tree_cache
        for agent in [a for a in self.locks if a not in wanted]:
            lock, n = self.locks.pop(agent)
            tree.unlock(lock)
            self.log.write("unpin", {"agent": agent, "tokens": n})
        for agent in wanted:
            if agent in self.locks:
                continue
            n = self.pin_len(agent)
            if n <= 0:
                continue
            got, node = self.cached_len(agent)
            if got >= n:
                self.locks[agent] = (tree.lock(node), n)
                self.log.write("pin", {"agent": agent, "tokens": n})
            # else: pinned as soon as a request of the agent has computed it (next iterations)

    def flushed(self) -> None:
        self.locks.clear()
        self.log.write("flush", {})

    # ------------------------------------------------------------------ the iteration
    def before(self, running_batch: Any) -> None:
        self.actions = None
        self.requeue = []
        snap = self.snapshot(running_batch)
        acts = self.adapter.step(snap)
        if acts.fallback:
            logger.warning("topas: falling back to SGLang's policy for this step: %s", acts.fallback)
        self.reconcile_pins(acts.pinned)
        if acts.preempt:
            self.preempt(running_batch, set(acts.preempt))
        self.actions = acts

    def preempt(self, rb: Any, rids: set) -> None:
        idx = [i for i, r in enumerate(rb.reqs) if r.rid in rids]
        if not idx:
            return
        reqs: list[Any] = []
        try:
            for i in idx:
                rb.release_req(i, 0)  # 0: evict nothing beyond what it frees
                reqs.append(rb.reqs[i])
        finally:  # whatever was released leaves the batch and is re-queued after the step
            if reqs:
                released = {id(r) for r in reqs}
                rb.filter_batch(keep_indices=[i for i, r in enumerate(rb.reqs) if id(r) not in released])
                rb.batch_is_full = False
                self.requeue = reqs
                for r in reqs:
                    self.last_running.pop(r.rid, None)
        from topas.sglang.adapter import short_rid  # lazy: as in Controller

        self.log.write("preempt", {"run": self.adapter.run, "rids": [short_rid(r.rid) for r in reqs],
                                   "released_tokens": [len(r.origin_input_ids) + len(r.output_ids) for r in reqs]})

    def after(self, plan: Any) -> None:
        for req in self.requeue:
            self.sched._add_request_to_queue(req, is_retracted=True)
        self.requeue = []
        batch = getattr(plan, "batch_to_run", None)
        if batch is None or not getattr(batch, "reqs", None):
            return
        now = time.time()
        new = [r for r in batch.reqs if r.rid not in self.last_running]
        for r in batch.reqs:
            self.last_running[r.rid] = r
        if not new:
            return
        self.adapter.on_admitted([r.rid for r in new], now)
        from topas.sglang.adapter import short_rid  # lazy: as in Controller

        admitted = []
        for r in new:
            m = self.meta(r)
            if m is not None:
                admitted.append({"rid": m.rid, "erid": short_rid(r.rid), "cached": len(r.prefix_indices)
                                 if getattr(r, "prefix_indices", None) is not None else None})
        if admitted:
            acts = self.actions
            self.log.write("admit", {"run": self.adapter.run, "time": now - self.adapter.t0, "admitted": admitted,
                                     "decided": bool(acts and acts.decided),
                                     "fallback": bool(acts is None or not acts.restrict),
                                     "decision_seq": self.adapter.n_decisions})


def device_name(scheduler: Any) -> str:
    """The scheduler's device, e.g. ``NVIDIA H100 80GB HBM3`` (CUDA) or ``cpu (x86_64)``."""

    device = str(getattr(getattr(scheduler, "server_args", None), "device", "") or "")
    if device.startswith("cuda"):
        try:
            import torch  # lazy: torch, present only inside the server

            return torch.cuda.get_device_name(torch.cuda.current_device())
        except Exception:  # reported, not fatal
            return "cuda (name unknown)"
    return f"{device or 'unknown'} ({platform.machine()})"


def model_config_hash(scheduler: Any) -> str:
    """sha256 of the served model's Hugging Face config (sorted JSON): two servers of the same
    model name but another config (size, layers, context) never share results."""

    try:
        cfg = scheduler.model_config.hf_config.to_dict()
    except Exception:
        return "unknown"
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()


def _is_abort(req: Any) -> bool:
    fr = getattr(req, "finished_reason", None)
    return fr is not None and type(fr).__name__ == "FINISH_ABORT"


_CTL: Controller | None = None


# ----------------------------------------------------------------------------- hooks


def _after_scheduler_init(result, self, *args, **kwargs):
    global _CTL
    try:
        _CTL = Controller(self)
    except Exception:
        logger.exception("topas: the plugin could not start; SGLang's own policy stays in charge")
        _CTL = None
    return result


def _around_get_new_batch_prefill(original, self, running_batch, *args, **kwargs):
    ctl = _CTL
    if ctl is None or ctl.sched is not self:
        return original(self, running_batch, *args, **kwargs)
    try:
        ctl.before(running_batch)
    except Exception:
        logger.exception("topas: scheduling step failed; SGLang's own policy runs this step")
        ctl.log.write("error", {"where": "before"})
        ctl.actions = None
    try:
        plan = original(self, running_batch, *args, **kwargs)
    finally:
        acts, ctl.actions = ctl.actions, None
    try:
        ctl.actions = acts
        ctl.after(plan)
    except Exception:
        logger.exception("topas: post-step bookkeeping failed")
        ctl.log.write("error", {"where": "after"})
    finally:
        ctl.actions = None
    return plan


def _active_actions():
    ctl = _CTL
    acts = ctl.actions if ctl is not None else None
    return ctl, (acts if acts is not None and acts.restrict else None)


def _around_calc_priority(original, self, waiting_queue, *args, **kwargs):
    ctl, acts = _active_actions()
    if acts is None:
        return original(self, waiting_queue, *args, **kwargs)
    try:
        pos = {rid: k for k, rid in enumerate(acts.admit)}
        plain = [r for r in waiting_queue if ctl.meta(r) is None]
        chosen = sorted((r for r in waiting_queue if r.rid in pos), key=lambda r: pos[r.rid])
        rest = [r for r in waiting_queue if ctl.meta(r) is not None and r.rid not in pos]
        waiting_queue[:] = plain + chosen + rest
    except Exception:
        logger.exception("topas: reordering failed; SGLang's policy orders this step")
        ctl.actions = None
        return original(self, waiting_queue, *args, **kwargs)
    return None


def _around_add_one_req(original, self, req, *args, **kwargs):
    ctl, acts = _active_actions()
    if acts is not None:
        try:
            if ctl.meta(req) is not None and req.rid not in acts.admit:
                from sglang.srt.managers.schedule_policy import AddReqResult  # lazy: SGLang (server only)

                return AddReqResult.OTHER
        except Exception:
            logger.exception("topas: admission check failed; SGLang decides")
    return original(self, req, *args, **kwargs)


def _around_flush_cache(original, self, *args, **kwargs):
    out = original(self, *args, **kwargs)
    ctl = _CTL
    if ctl is not None and ctl.sched is self:
        try:
            ctl.flushed()
        except Exception:
            logger.exception("topas: flush bookkeeping failed")
    return out


def _around_get_internal_state(original, self, *args, **kwargs):
    out = original(self, *args, **kwargs)
    ctl = _CTL
    if ctl is not None and ctl.sched is self:
        try:
            out.internal_state["topas"] = ctl.info()
        except Exception:
            logger.exception("topas: cannot report the plugin's state")
            out.internal_state["topas"] = {"plugin": "topas", "error": "the plugin failed to report its state"}
    return out


def register() -> None:
    """The entry point: register the hooks (SGLang applies them after all plugins ran)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType  # lazy: SGLang (server only)

    base = "sglang.srt.managers"
    HookRegistry.register(f"{base}.scheduler.Scheduler.__init__", _after_scheduler_init, HookType.AFTER)
    HookRegistry.register(f"{base}.scheduler.Scheduler.get_new_batch_prefill", _around_get_new_batch_prefill,
                          HookType.AROUND)
    HookRegistry.register(f"{base}.schedule_policy.SchedulePolicy.calc_priority", _around_calc_priority,
                          HookType.AROUND)
    HookRegistry.register(f"{base}.schedule_policy.PrefillAdder.add_one_req", _around_add_one_req,
                          HookType.AROUND)
    HookRegistry.register(f"{base}.scheduler.Scheduler.flush_cache", _around_flush_cache, HookType.AROUND)
    HookRegistry.register(f"{base}.scheduler.Scheduler.get_internal_state", _around_get_internal_state,
                          HookType.AROUND)
    logger.info("topas plugin registered (policy %s)", os.environ.get("TOPAS_POLICY", "fcfs"))
