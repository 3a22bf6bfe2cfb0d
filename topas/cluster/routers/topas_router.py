"""``topas``: ours, a router that carries TOPAS's pricing across engines.

TOPAS (docs/method.md) prices, on one engine, what loading an agent's prefix costs (``J_move``: a
recompute without a host tier), what a request waits for and what admitting it does to the
running batch, and weighs a task's requests by its critical path. This router applies the same
prices to the choice of engine; the engines' own policies (TOPAS, or any other) then schedule as
usual. Designed here for issue 15; no paper defines it.

For request r (agent a, prefix ``l_a``, input ``x``, output prior ``y_a``) and engine e (cost
model ``c_e``, ``b_e`` running and ``q_e`` waiting requests, ``K_e`` KV tokens in use):

* ``J_e`` (prefix): 0 if a's prefix is resident on e, else ``c_e.prefill_time([(l_a, 0)])``, the
  recompute a load costs there;
* ``P_e`` (own prefill): ``c_e.prefill_time([(x, l_a)])``;
* ``D_e`` (own decode): ``y_a`` steps in e's batch, ``y_a * c_e.decode_time(b_e + 1, K_e + l_a + x)``;
* ``W_e`` (wait): the ``q_e`` requests ahead of it, served about ``b_e + 1`` at a time, each batch
  taking about r's own service: ``q_e / (b_e + 1) * (P_e + D_e)``;
* ``X_e`` (what it does to e's batch): every running request's decode steps slow down while r
  decodes beside them, ``b_e * y_a * (c_e.decode_time(b_e + 1, K_e + l_a + x) - c_e.decode_time(b_e, K_e))``;
* ``w_r`` (critical path): the number of stages on the longest path from r's stage to the end of
  its task (r included; 1 without a DAG), as the policies see the DAG.

The score is ``w_r * (W_e + J_e + P_e + D_e) + beta * X_e``: the request's own time, weighted up
when more of its task still depends on it, plus the delay it imposes on others (each counted once:
their weights are not visible to the router). The engine with the smallest score gets it; ties go
to the lowest index. ``beta = 0`` ignores the batch; a prefix held elsewhere is worth moving to
only when the wait there exceeds the recompute here.

What it sees is what :class:`topas.cluster.state.EngineState` shows (counts, KV in use, resident
prefixes) and the profile (:class:`topas.cluster.state.ClusterInfo`); never an output length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from topas.cluster.routers.base import Router, RouterError, register
from topas.cluster.routers.profile import path_to_end
from topas.cluster.state import ClusterInfo, EngineState, RouteRequest


@dataclass(frozen=True)
class TopasRouterParams:
    #: weight of the delay the request imposes on the engine's running batch
    beta: float = 1.0

    def __post_init__(self) -> None:
        if not self.beta >= 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")


@register
class TopasRouter(Router):
    name = "topas"
    Params = TopasRouterParams

    def reset(self, n_engines: int, seed: int = 0, info: ClusterInfo | None = None) -> None:
        super().reset(n_engines, seed, info)
        if info is None:
            raise RouterError("router 'topas' needs the agents' profile and the engines' cost models (ClusterInfo)")
        self._prefill: dict[tuple[int, int, int], float] = {}

    def prefill_time(self, engine: int, new: int, cached: int) -> float:
        """``c_e.prefill_time([(new, cached)])``, memoised (a pure function of the profile)."""
        key = (engine, new, cached)
        t = self._prefill.get(key)
        if t is None:
            t = self._prefill[key] = self.info.costs[engine].prefill_time([(new, cached)])
        return t

    def route(self, request: RouteRequest, engines: Sequence[EngineState]) -> int:
        w = self.weight(request)
        return min(range(len(engines)), key=lambda i: (self.score(request, engines[i], w), i))

    @staticmethod
    def weight(request: RouteRequest) -> int:
        """``w_r``: stages on the longest path from the request's stage to its task's end."""
        tv = request.task
        if tv is None or request.stage_id not in tv.stages:
            return 1
        return int(path_to_end(tv, lambda s: 1)[request.stage_id])

    def score(self, request: RouteRequest, e: EngineState, w: int = 1) -> float:
        c = self.info.costs[e.index]
        l, x, y = request.prefix_tokens, request.input_tokens, self.info.output_priors[request.agent]
        b, kv = e.running, e.kv_used
        load = 0.0 if request.agent in e.resident else self.prefill_time(e.index, l, 0)
        prefill = self.prefill_time(e.index, x, l)
        step = c.decode_time(b + 1, kv + l + x)
        decode = y * step
        wait = e.waiting / (b + 1) * (prefill + decode)
        slowdown = b * y * (step - c.decode_time(b, kv)) if b else 0.0
        return w * (wait + load + prefill + decode) + self.params.beta * slowdown
