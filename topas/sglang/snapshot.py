"""What the plugin and the adapter exchange once per scheduler iteration: a :class:`Snapshot` of
SGLang's scheduler (its requests as :class:`ReqSnap`) in, concrete :class:`Actions` out. Plain
data: no SGLang import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping


from topas.sglang.metadata import RequestMeta


@dataclass(frozen=True)
class ReqSnap:
    """One request in SGLang's waiting queue or running batch."""

    rid: str  # SGLang's request id
    meta: RequestMeta | None
    generated: int = 0  # output tokens produced so far (kept across a retraction)
    kv_tokens: int = 0  # own KV now (running requests), x_v + generated
    #: the KV the engine reserves now for the request's future output (``RequestView.reserve``:
    #: SGLang's ``PrefillAdder`` rule, :func:`output_reserve_of`)
    reserve: int = 0


def output_reserve_of(max_new_tokens: int, generated: int, running: bool, ignore_eos: bool,
                      new_token_ratio: float, clip: int = 4096) -> int:
    """What SGLang 0.5.23's ``PrefillAdder`` reserves for a request's future output, as the
    simulator counts it (:func:`topas.engine.reservation.output_reserve`): ``min(max_new_tokens
    - generated, clip)`` (``clip``: ``CLIP_MAX_NEW_TOKENS``, env
    ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``, 4096), in full for a waiting request
    (``add_one_req`` checks its whole remaining output) and for a running ``ignore_eos`` one
    (``_get_running_request_total_token_offset``'s ratio 1), else ``int(new_token_ratio * it)``."""
    remaining = max(min(int(max_new_tokens) - int(generated), int(clip)), 0)
    return remaining if (not running or ignore_eos) else int(new_token_ratio * remaining)


@dataclass(frozen=True)
class Snapshot:
    """SGLang's scheduler state at one iteration, as plain data.

    ``now`` is seconds since the epoch (converted to run time with the run's ``t0``).
    ``finished`` lists requests that left the running batch done since the last snapshot:
    (SGLang rid, output tokens, epoch time); ``aborted`` those that left without finishing.
    ``cached`` the agents whose prefix is known to be fully in the radix tree (the plugin: the
    ones it holds locked; ``probe`` asks for the others lazily, only at a decision), ``host``
    those with a host-tier copy.
    """

    now: float
    waiting: tuple[ReqSnap, ...]
    running: tuple[ReqSnap, ...]
    kv_budget: int
    finished: tuple[tuple[str, int, float], ...] = ()
    aborted: tuple[str, ...] = ()
    cached: frozenset[str] = frozenset()
    host: frozenset[str] = frozenset()
    n_decoding: int | None = None  # requests in the decode batch (default: all running)
    #: ``probe(agent) -> bool``: is the agent's prefix fully cached? Called only when a view is
    #: built (at a decision), for :meth:`Adapter.probe_agents`; adds to ``cached``.
    probe: Callable[[str], bool] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Actions:
    """What the plugin does in this iteration.

    ``restrict``: only ``admit`` (SGLang rids, in this order, after requests without topas
    metadata) may be admitted; the rest of the queue waits. ``preempt``: running requests to
    stop (their KV freed, back to the queue). ``pinned``: the agents whose prefix must stay
    locked in the radix tree (the plugin locks the new ones and unlocks the others).
    ``fallback``: the policy raised or returned an infeasible decision; SGLang's own policy
    runs this step (``restrict`` is False) and ``fallback`` says why.
    """

    restrict: bool = False
    admit: tuple[str, ...] = ()
    preempt: tuple[str, ...] = ()
    pinned: frozenset[str] = frozenset()
    decided: bool = False
    fallback: str | None = None
    record: Mapping[str, Any] | None = None
