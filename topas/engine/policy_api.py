"""What an engine asks of a scheduling policy: the calls it makes and their defaults.

The engines (the simulator, the cluster, the SGLang plugin's adapter) run any object of a
:class:`PolicyAPI` subclass: at each decision point :meth:`PolicyAPI.decide` gets an
:class:`~topas.engine.view.EngineView` and returns a :class:`~topas.engine.view.Decision`; the
other calls are hooks a policy may leave at their defaults. The policies' base class,
``topas.policies.base.Policy``, adds names, parameters and the registry. The interface lives here,
beside the view, so that the engine needs nothing of ``topas.policies`` (the policies sit above
the engine: docs/design.md, "Layers").
"""

from __future__ import annotations

from typing import ClassVar, Mapping

from topas.engine.view import Decision, EngineView, RequestView

__all__ = ["PolicyAPI", "PolicyError", "overrides"]


class PolicyError(ValueError):
    """An unknown policy or parameter, a parameter of the wrong type, or a policy the engine
    cannot run as configured; names the valid ones."""


class PolicyAPI:
    """The calls an engine makes on a policy. Subclasses set ``name`` and implement :meth:`decide`."""

    name: ClassVar[str]
    manages_prefixes: ClassVar[bool] = False
    #: a policy that does not manage prefixes may still return ``Decision.preempt`` if it sets
    #: this (a prefix-managing policy always may): the engine stops those requests, frees their
    #: KV and rebuilds their generated tokens on readmission, as for TOPAS's preemptions
    may_preempt: ClassVar[bool] = False
    #: the admit list is a plan (the requests the policy means to start now, sized to the memory
    #: it expects), not an order of the whole queue: runs then report ``planned_admits`` beside
    #: ``admitted`` (topas.engine.metrics)
    plans_admissions: ClassVar[bool] = False
    #: whether :meth:`decide` reads ``view.tasks``; a policy that does not (FCFS, LPM and k-LPM
    #: order the waiting requests alone) sets False, and the engine then skips building the task
    #: views for its decisions: its views' ``tasks`` refuse every read
    #: (``topas.engine.view_cache.TasksNotShown``)
    reads_tasks: ClassVar[bool] = True

    def reset(self) -> None:
        """Forget all per-run state (called before a run)."""

    def decide(self, view: EngineView) -> Decision:
        """The decision at this scheduling point."""
        raise NotImplementedError

    def on_finish(self, request: RequestView, time: float, output_tokens: int) -> None:
        """A request finished at ``time`` having produced ``output_tokens`` (observed now)."""

    def request_priority(self, request: RequestView, view: EngineView) -> int:
        """The priority a request carries, fixed once when it reaches the scheduler (SGLang: the
        ``/generate`` request's top-level ``priority``; higher is kept longer by the ``priority``
        eviction, ``topas.engine.eviction``). Default 0: every request alike, so the radix
        cache's nodes differ only by SGLang's prompt-over-output rule. The engine asks only when
        its eviction strategy reads priorities (``EvictionStrategy.reads_priority``)."""
        return 0

    def eviction_values(self, view: EngineView) -> Mapping[str, float] | None:
        """Each agent's *next-use* value for the eviction strategy ``policy``
        (``topas.engine.eviction_policy``): the larger, the later the agent's KV is expected to be
        needed, so the sooner it is evicted. Asked before every eviction pass, from the same
        knowledge-limited view as :meth:`decide`. Default: none (``None``; that strategy then
        refuses the policy)."""
        return None

    def on_preempt(self, request: RequestView, time: float, by_engine: bool) -> None:
        """A running request was preempted (by this policy) or retracted (by the engine)."""


def overrides(policy: PolicyAPI, hook: str) -> bool:
    """Whether ``policy``'s class gives its own ``hook`` (a method of :class:`PolicyAPI`)."""
    return getattr(type(policy), hook) is not getattr(PolicyAPI, hook)
