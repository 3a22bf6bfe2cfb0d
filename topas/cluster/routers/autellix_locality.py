"""``autellix-locality``: Autellix's data-locality-aware load balancer.

Source: Autellix (Luo et al., "Autellix: An Efficient Serving Engine for LLM Agents as General
Programs", arXiv 2502.13965), its multi-engine load balancer (the paper's Algorithm 2): a short
request (at most 2048 prefill tokens) goes to the least-used engine, where it costs little to
recompute; a long one goes to the engine its program already uses, to reuse the program's KV
cache. The 2048 threshold is the paper's Algorithm 2 as a public reimplementation quotes it (the
paper's own text could not be read where this was written).

Interpretations:

* A program is a task (one workflow instance), as for ``autellix-las`` in ``topas.policies``.
* A request's prefill tokens are its whole prompt, the agent prefix plus its own input
  (``l_a + x_v``): what the load balancer sees when the call is submitted.
* "Least used" is the fewest in-flight requests (routed, not finished), ties to the lowest index.
* A program's engine is set by its first long request (sent to the least-used engine then) and
  kept for the program's life; short requests neither use nor set it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from topas.cluster.routers.base import Router, least_loaded, register
from topas.cluster.state import EngineState, RouteRequest


@dataclass(frozen=True)
class AutellixLocalityParams:
    #: a request with more prefill tokens than this stays with its program's engine
    long_prefill_tokens: int = 2048

    def __post_init__(self) -> None:
        if self.long_prefill_tokens < 0:
            raise ValueError(f"long_prefill_tokens must be >= 0, got {self.long_prefill_tokens}")


@register
class AutellixLocality(Router):
    name = "autellix-locality"
    Params = AutellixLocalityParams

    def reset(self, n_engines: int, seed: int = 0, info=None) -> None:
        super().reset(n_engines, seed, info)
        self.program_engine: dict[str, int] = {}

    def route(self, request: RouteRequest, engines: Sequence[EngineState]) -> int:
        if request.prompt_tokens <= self.params.long_prefill_tokens:
            return least_loaded(engines)
        home = self.program_engine.get(request.task_id)
        if home is None:
            home = self.program_engine[request.task_id] = least_loaded(engines)
        return home
