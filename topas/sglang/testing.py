"""Policies that misbehave on purpose, for the plugin's fault tests (``make test-sglang``).

Registered only when imported (the server imports it with ``TOPAS_POLICY_MODULES=topas.sglang.testing``),
so they never appear in ``topas policies``.
"""

from __future__ import annotations

import dataclasses

from topas.engine.view import Decision, EngineView
from topas.policies.base import Policy, register
from topas.policies.fcfs import FCFS


@dataclasses.dataclass(frozen=True)
class RaisingParams:
    #: raise on every ``every``-th decision (1: always)
    every: int = 2


@register
class RaisingPolicy(Policy):
    """FCFS that raises RuntimeError on every ``every``-th decision."""

    name = "test-raising"
    Params = RaisingParams

    def reset(self) -> None:
        self.calls = 0
        self.inner = FCFS()

    def decide(self, view: EngineView) -> Decision:
        self.calls += 1
        if self.calls % self.params.every == 0:
            raise RuntimeError(f"deliberate failure at decision {self.calls}")
        return self.inner.decide(view)


@register
class InfeasiblePolicy(Policy):
    """Admits a request that does not exist (every decision is infeasible)."""

    name = "test-infeasible"

    def decide(self, view: EngineView) -> Decision:
        return Decision(admit=tuple(r.rid for r in view.waiting) + ("no-such-task/X",))
