"""The ``kvflow`` eviction strategy: KVFlow's workflow-aware eviction and (with a host tier) its
prefetch (arXiv 2507.07400; docs/method.md, "KVFlow"; the Agent Step Graph is
``topas.engine.kvflow_steps``).

Before each eviction pass the engine gives the strategy its knowledge-limited view
(:meth:`KVFlowEviction.prepare`); the strategy computes every agent's steps-to-execution from the
tasks the view shows and keys each evictable entry by

1. its KVFlow pass (:func:`topas.engine.kvflow_steps.eviction_pass` of its agent's node value):
   the entries of agents due furthest away (value ``>= H - 1``) first, then ``H - 2``, ... 1, and
   those of agents due now last (KVFlow's ``HiRadixCache.evict``: passes with ``steps`` from
   ``H - 1`` down to 1, then ``ignore_holding``);
2. within a pass but the last, request-specific KV (segment nodes, finished outputs) before
   agent prefixes;
3. then the engine's plain order (least recently used first, then :attr:`Evictable.tie`).

Entries are evicted as leaves only (the engine's rule), so an agent's own suffixes always go
before its prefix; (2) also puts another agent's suffixes of the same pass first. Every node of
the simulated tree lies below one agent's prefix, so "the minimum over the agents using a node"
is that agent's value. Parameters: ``horizon`` (``H``, KVFlow's ``evict_pri_level``, 4),
``lookahead`` (``L``, ``load_ahead_step``, 2) and ``prefetch`` (1: with ``EngineConfig.host_tier``
the engine prefetches the host-resident prefixes of the agents due within ``L`` steps and skips
requests whose prefix is still loading, ``topas.engine.prefetch``; 0: eviction only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topas.engine.eviction import PREFIX, Evictable, EvictionStrategy, OfflineFuture, register_eviction
from topas.engine.kvflow_steps import (DEFAULT_HORIZON, DEFAULT_LOOKAHEAD, AgentStepCache, eviction_pass,
    node_value, prefetch_order)

if TYPE_CHECKING:
    from topas.engine.view import EngineView


@register_eviction
class KVFlowEviction(EvictionStrategy):
    """KVFlow (arXiv 2507.07400): agents due furthest away first, in passes; see the module docstring."""

    name = "kvflow"
    description = ("KVFlow: entries of agents due furthest away (steps-to-execution) first, in passes; "
                   "with a host tier, prefetch of agents due within lookahead steps")
    params = {"horizon": DEFAULT_HORIZON, "lookahead": DEFAULT_LOOKAHEAD, "prefetch": 1}
    needs_view = True

    def __init__(self, **kw: int) -> None:
        super().__init__(**kw)
        h, la, pf = self.values["horizon"], self.values["lookahead"], self.values["prefetch"]
        if h < 1 or la < 0 or pf not in (0, 1):
            raise ValueError(f"eviction 'kvflow' needs horizon >= 1, lookahead >= 0 and prefetch 0 or 1, "
                             f"got horizon={h}, lookahead={la}, prefetch={pf}")
        self._steps: dict[str, int] = {}
        self._cache = AgentStepCache()

    @property
    def prefetches(self) -> bool:
        """Whether the engine prefetches for this strategy (with a host tier only)."""
        return bool(self.values["prefetch"])

    def prepare(self, view: "EngineView", future: OfflineFuture | None = None) -> None:
        self._steps = self._cache.agent_steps(view)

    def prefetch_agents(self, view: "EngineView") -> tuple[tuple[str, int], ...]:
        """The agents whose host-resident prefixes to load now, with their steps, nearest first."""
        steps = self._cache.agent_steps(view)
        return tuple((a, steps[a]) for a in prefetch_order(steps, self.values["lookahead"]))

    def priority(self, e: Evictable) -> tuple:
        h = self.values["horizon"]
        k = eviction_pass(node_value((e.agent,), self._steps, h), h)
        # the last pass (ignore_holding) is the plain order: no suffix-before-prefix rule there
        return (k, 1 if e.kind == PREFIX and k < h - 1 else 0, e.last_access)
