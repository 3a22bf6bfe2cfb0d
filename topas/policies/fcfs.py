"""FCFS: first come, first served, by the time a request became ready.

A request becomes ready when all its parent stages have finished (or at its task's arrival for a
root stage). Ties (same ready time) are broken by request id, so the order is deterministic.
Prefixes are left to the engine (SGLang's radix cache: load on demand, LRU eviction).
"""

from __future__ import annotations

from topas.engine.view import Decision, EngineView
from topas.policies.base import Policy, register


@register
class FCFS(Policy):
    name = "fcfs"

    def decide(self, view: EngineView) -> Decision:
        order = sorted(view.waiting, key=lambda r: (r.ready_time, r.rid))
        return Decision(admit=tuple(r.rid for r in order))
