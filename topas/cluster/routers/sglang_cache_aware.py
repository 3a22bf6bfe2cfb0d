"""``sglang-cache-aware``: SGLang router's ``cache_aware`` policy, as its source defines it.

Source: ``sgl-router/src/policies/cache_aware.rs`` and ``sgl-router/src/tree.rs``
(sgl-project/sglang; in later versions ``sgl-model-gateway/src/policies/``), with the launch
defaults of ``sglang-router`` 0.3.2's CLI (``sglang_router/router_args.py``):
``cache_threshold = 0.3``, ``balance_abs_threshold = 64``, ``balance_rel_threshold = 1.5``,
``eviction_interval_secs = 60``, ``max_tree_size = 2**26``.

Which worker a *miss* goes to changed between versions (``on_miss``): the older ``sgl-router``
source sends it to the worker with the smallest tree (``Tree::get_smallest_tenant``); the
SGLang Model Gateway source that ``sglang-router`` 0.3.2 is built from sends it to the
least-loaded healthy worker (``min_by_key(load)`` over the healthy workers: the first in the
router's worker list on ties; its ``select_worker_with_text``). Checked on the real 0.3.2 router
(docs/cluster.md, "Real servers behind a real router"): a new agent's request goes to the first
worker when loads are equal even when that worker's tree is far larger, and to the idle worker
when the first one has requests in flight. So the default is ``on_miss="least-load"`` (0.3.2);
``"smallest-tree"`` is the older rule.

The rule, for each request (``select_worker``):

1. Loads are the workers' in-flight request counts (``Worker::load``: requests the router sent
   that have not completed). The system is *imbalanced* when
   ``max - min > balance_abs_threshold`` **and** ``max > balance_rel_threshold * min``; then the
   request goes to the least-loaded worker.
2. Otherwise the request's text is matched against one approximate radix tree shared by all
   workers, each node tagged with the workers ("tenants") that sent text through it. If the
   match rate ``matched / len(text)`` is ``> cache_threshold`` the request goes to the worker
   holding the deepest matched node; else (a *miss*) to the least-loaded worker (0.3.2,
   ``on_miss="least-load"``) or the worker with the smallest tree (fewest characters tagged with
   it; older versions, ``on_miss="smallest-tree"``).
3. Either way the request's text is then inserted into the tree under the chosen worker.
4. Every ``eviction_interval_secs`` a background thread evicts, per worker, least-recently-used
   leaves until its tree holds at most ``max_tree_size`` characters.

Interpretations (the simulator has token counts, not text):

* The request's text is its agent's prefix (``l_a`` tokens, identical for every request of the
  agent, and sharing nothing with other agents' prefixes) followed by its own input (``x_v``
  tokens, shared with no other request): the text the replay sends when it sends text whose
  tokens share exactly each agent's prefix. Lengths are counted in tokens, not characters (the
  match rate is a ratio, the same at a constant characters-per-token); ``max_tree_size`` is
  applied to tokens. So a request matches ``l_a`` tokens if some worker's tree holds its agent's
  prefix, else 0 (no partial match into another request's input).
* Ties: the least-loaded worker and the smallest tree go to the lowest worker index (Rust's
  ``min_by_key`` keeps the first minimum; the tree's smallest-tenant scan iterates a hash map,
  an arbitrary but fixed order); of several workers holding the matched prefix node, the lowest
  index (the real tree returns the first tenant of the node's hash map: again arbitrary but fixed).
  Engine i is the router's i-th worker (its ``GET /workers`` order, the order of ``--worker-urls``).
* The real router's tree lives as long as the router: a second run through the same router
  finds the first run's prefixes (``/flush_cache`` flushes the workers, not the router's tree).
  A simulated run starts from empty trees, as a freshly started router does.
* Load is read before the request is counted (the router increments it after selecting).
* The eviction thread's clock is simulated time from the start of the run: rounds run at
  ``k * eviction_interval_secs`` (k = 1, 2, ...), before the first request routed at or after
  that time. An evicted leaf is a request's input; a prefix node is a leaf of a worker once none
  of that worker's inputs hang below it, and is evicted in LRU order like any leaf. The tree
  never sees the engines' real caches (the router does not either).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from topas.cluster.routers.base import Router, least_loaded, register
from topas.cluster.state import EngineState, RouteRequest


MISS_RULES = ("least-load", "smallest-tree")


@dataclass(frozen=True)
class CacheAwareParams:
    #: minimum prefix match rate (0..1) to route to the worker holding the match
    cache_threshold: float = 0.3
    #: imbalance needs max load - min load > this (requests)
    balance_abs_threshold: int = 64
    #: imbalance needs max load > this x min load
    balance_rel_threshold: float = 1.5
    #: seconds between LRU eviction rounds of the trees (0: never evict)
    eviction_interval_secs: float = 60.0
    #: per-worker tree size above which a round evicts (tokens here; characters in SGLang)
    max_tree_size: int = 2**26
    #: where a miss (match rate <= cache_threshold) goes: "least-load" (sglang-router 0.3.2) or
    #: "smallest-tree" (the older sgl-router source)
    on_miss: str = "least-load"

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {self.cache_threshold}")
        if self.balance_abs_threshold < 0 or self.balance_rel_threshold < 0:
            raise ValueError("balance thresholds must be >= 0")
        if self.eviction_interval_secs < 0 or self.max_tree_size < 0:
            raise ValueError("eviction_interval_secs and max_tree_size must be >= 0")
        if self.on_miss not in MISS_RULES:
            raise ValueError(f"on_miss must be one of {', '.join(MISS_RULES)}, got {self.on_miss!r}")


class _WorkerTree:
    """One worker's part of the approximate tree: its agent-prefix nodes and its inputs' leaves."""

    __slots__ = ("prefixes", "leaves", "size")

    def __init__(self) -> None:
        self.prefixes: dict[str, tuple[float, int]] = {}  # agent -> (last access, l_a)
        self.leaves: dict[str, tuple[float, int, str]] = {}  # rid -> (last access, x, agent)
        self.size = 0

    def insert(self, req: RouteRequest) -> None:
        if req.prefix_tokens and req.agent not in self.prefixes:
            self.size += req.prefix_tokens
        if req.prefix_tokens:
            self.prefixes[req.agent] = (req.time, req.prefix_tokens)
        if req.input_tokens and req.rid not in self.leaves:
            self.size += req.input_tokens
            self.leaves[req.rid] = (req.time, req.input_tokens, req.agent)

    def evict_to(self, limit: int) -> None:
        """Remove least-recently-used leaves until ``size <= limit`` (ties: the name)."""
        while self.size > limit:
            has_leaves = {a for _, _, a in self.leaves.values()}
            cands = [(t, 1, rid) for rid, (t, _, _) in self.leaves.items()]
            cands += [(t, 0, a) for a, (t, _) in self.prefixes.items() if a not in has_leaves]
            if not cands:
                return
            _, kind, name = min(cands)
            if kind:
                self.size -= self.leaves.pop(name)[1]
            else:
                self.size -= self.prefixes.pop(name)[1]


@register
class SGLangCacheAware(Router):
    name = "sglang-cache-aware"
    Params = CacheAwareParams

    def reset(self, n_engines: int, seed: int = 0, info=None) -> None:
        super().reset(n_engines, seed, info)
        self.trees = [_WorkerTree() for _ in range(n_engines)]
        self._rounds = 0  # eviction rounds run so far

    def route(self, request: RouteRequest, engines: Sequence[EngineState]) -> int:
        p = self.params
        self._evict_until(request.time)
        loads = [e.in_flight for e in engines]
        hi, lo = max(loads), min(loads)
        if hi - lo > p.balance_abs_threshold and hi > lo * p.balance_rel_threshold:
            chosen = least_loaded(engines)
        else:
            holder = self.holder(request.agent)
            total = request.prompt_tokens
            rate = (request.prefix_tokens if holder is not None else 0) / total if total else 0.0
            if holder is not None and rate > p.cache_threshold:
                chosen = holder
            elif p.on_miss == "least-load":
                chosen = least_loaded(engines)
            else:
                chosen = self.smallest_tree()
        self.trees[chosen].insert(request)
        return chosen

    def holder(self, agent: str) -> int | None:
        """The worker whose tree holds ``agent``'s prefix node (lowest index), or None."""
        return next((i for i, t in enumerate(self.trees) if agent in t.prefixes), None)

    def smallest_tree(self) -> int:
        return min(range(len(self.trees)), key=lambda i: (self.trees[i].size, i))

    def _evict_until(self, now: float) -> None:
        interval = self.params.eviction_interval_secs
        if interval <= 0:
            return
        due = int(now // interval)
        if due > self._rounds:
            self._rounds = due
            for t in self.trees:
                t.evict_to(self.params.max_tree_size)
