"""LPM: SGLang's longest-prefix-match ordering (``schedule_policy.py``, policy ``lpm``).

Requests whose agent prefix is resident on the GPU come first, longer matched prefix first; ties
by ready time (FCFS), then request id. In our model a request's reusable prefix is exactly its
agent's prefix (suffixes are not shared), so the match length is ``l_a`` if resident, else 0.
Like SGLang, LPM falls back to FCFS when the waiting queue is longer than 128 requests (SGLang
skips the radix-tree matching then because it is too expensive).
"""

from __future__ import annotations

from dataclasses import dataclass

from topas.engine.view import Decision, EngineView
from topas.policies.base import Policy, register


@dataclass(frozen=True)
class LPMParams:
    fcfs_fallback_queue: int = 128  # SGLang: above this queue length LPM degrades to FCFS


@register
class LPM(Policy):
    name = "lpm"
    Params = LPMParams

    def decide(self, view: EngineView) -> Decision:
        if len(view.waiting) > self.params.fcfs_fallback_queue:
            order = sorted(view.waiting, key=lambda r: (r.ready_time, r.rid))
        else:
            prefixes = view.prefixes

            def match(r) -> int:
                p = prefixes[r.agent]
                return p.tokens if p.resident else 0

            order = sorted(view.waiting, key=lambda r: (-match(r), r.ready_time, r.rid))
        return Decision(admit=tuple(r.rid for r in order))
