"""``round-robin``: send the k-th routed request to engine ``k mod N``.

Source: SGLang router's ``round_robin`` policy (a counter incremented per request, modulo the
number of healthy workers). Interpretation: every engine is healthy; the counter starts at 0 at
the start of a run and counts requests in the order they become ready (ties in ready time: the
order the simulator makes them ready: task arrival order, then stage order).
"""

from __future__ import annotations

from typing import Sequence

from topas.cluster.routers.base import Router, register
from topas.cluster.state import EngineState, RouteRequest


@register
class RoundRobin(Router):
    name = "round-robin"

    def reset(self, n_engines: int, seed: int = 0, info=None) -> None:
        super().reset(n_engines, seed, info)
        self._next = 0

    def route(self, request: RouteRequest, engines: Sequence[EngineState]) -> int:
        i = self._next % len(engines)
        self._next += 1
        return i
