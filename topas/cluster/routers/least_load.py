"""``least-load``: send each request to the engine with the fewest in-flight requests.

Source: the issue's definition ("fewest in-flight requests"), which is SGLang router's
shortest-queue fallback inside ``cache_aware`` used on its own. In-flight = routed to that
engine and not finished (waiting, on its way, or running), as the router counts it.
Interpretation: ties go to the lowest engine index (Rust's ``min_by_key`` keeps the first).
"""

from __future__ import annotations

from typing import Sequence

from topas.cluster.routers.base import Router, least_loaded, register
from topas.cluster.state import EngineState, RouteRequest


@register
class LeastLoad(Router):
    name = "least-load"

    def route(self, request: RouteRequest, engines: Sequence[EngineState]) -> int:
        return least_loaded(engines)
