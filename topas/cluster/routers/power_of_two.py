"""``power-of-two``: sample two distinct engines at random, send to the one with fewer in-flight
requests (the "power of two choices", Mitzenmacher 2001; SGLang router's ``power_of_two``).

Interpretation: the two engines are drawn uniformly without replacement from a
``random.Random`` seeded by the experiment's seed (so a run is deterministic); load is the
in-flight count (routed, not finished); a tie goes to the first engine drawn. With one engine,
that engine.
"""

from __future__ import annotations

import random
from typing import Sequence

from topas.cluster.routers.base import Router, register
from topas.cluster.state import EngineState, RouteRequest


@register
class PowerOfTwo(Router):
    name = "power-of-two"

    def reset(self, n_engines: int, seed: int = 0, info=None) -> None:
        super().reset(n_engines, seed, info)
        self._rng = random.Random(f"power-of-two:{seed}")

    def route(self, request: RouteRequest, engines: Sequence[EngineState]) -> int:
        if len(engines) == 1:
            return 0
        a, b = self._rng.sample(range(len(engines)), 2)
        return b if engines[b].in_flight < engines[a].in_flight else a
