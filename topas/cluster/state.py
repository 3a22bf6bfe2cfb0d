"""What a router may see: the request being routed and each engine's state at that moment.

Both are immutable snapshots built by :class:`topas.cluster.simulator.ClusterSimulator` (and by
hand in the unit tests). Like a policy's ``EngineView``, they carry only what a real router could
know: a request's agent, its prefix length and its own input length (never its output length),
and per engine what a router counts itself (requests it sent there that have not finished) or
could read from the engine's metrics (queue, running batch, KV use, resident prefixes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from topas.engine.cost import CostModel
    from topas.engine.view import TaskView


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """A request that became ready and must be sent to an engine.

    ``prefix_tokens`` is l_a, its agent's system-prompt prefix; ``input_tokens`` x_v, its own
    input (unique to it: in the trace model no two requests share suffix tokens). ``time`` is
    when it became ready (its parents finished, or its task arrived for a root stage).
    """

    rid: str
    task_id: str
    stage_id: str
    agent: str
    prefix_tokens: int
    input_tokens: int
    time: float
    #: the request's task as a policy sees it (DAG shape, agents, stages done; no output lengths)
    task: "TaskView | None" = field(default=None, compare=False)

    @property
    def prompt_tokens(self) -> int:
        """The whole prompt: the agent prefix followed by the request's own input."""
        return self.prefix_tokens + self.input_tokens


@dataclass(frozen=True, slots=True)
class EngineState:
    """One engine as a router sees it when a request is routed.

    ``in_flight``: requests routed to it and not finished (SGLang router's per-worker ``load``:
    incremented when it sends a request, decremented when the response completes);
    ``waiting``: requests queued at the engine (including those still on their way);
    ``running``: requests in its running batch (prefill or decode); ``kv_budget`` and
    ``kv_used`` (tokens: resident prefixes + running requests' own KV); ``resident``: the agents
    whose prefix KV is on its GPU (its radix cache or pinned set).
    """

    index: int
    in_flight: int
    waiting: int = 0
    running: int = 0
    kv_budget: int = 0
    kv_used: int = 0
    resident: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ClusterInfo:
    """What a router may know before the run, as a profiler would: each agent's prefix length
    and output prior (as the policies see them), and each engine's cost model (its hardware)."""

    prefix_tokens: Mapping[str, int]
    output_priors: Mapping[str, float]
    costs: Sequence["CostModel"]
