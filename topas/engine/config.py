"""Engine configuration: SGLang's scheduler knobs that the simulator models.

Defaults are SGLang's (v0.5.x ``global_config`` / ``server_args``) where SGLang has the knob;
the rest are this simulator's own choices, documented here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    #: KV budget B in tokens; ``None`` takes the profile's ``kv_budget_tokens``.
    kv_budget: int | None = None
    #: Tokens prefilled per iteration (SGLang ``chunked_prefill_size``); ``None`` = the profile's.
    max_prefill_tokens: int | None = None
    #: SGLang ``max_running_requests`` (its default is derived from memory; large here).
    max_running_requests: int = 4096
    #: SGLang admission reserves ``new_token_ratio * min(max_new - generated, clip)`` tokens for
    #: each running request's future output. The ratio starts at ``init``, decays linearly to
    #: ``init * min_factor`` over ``decay_steps`` decode steps and is reset to ``init`` on a
    #: retraction (SGLang computes a data-dependent ratio there; resetting is our simplification).
    #: ``max_new`` is the request's true output length, as when SGLang replays a trace with
    #: ``max_new_tokens = y, ignore_eos``. This is engine-internal: policies never see it.
    init_new_token_ratio: float = 0.7
    min_new_token_ratio_factor: float = 0.14
    new_token_ratio_decay_steps: int = 600
    clip_max_new_tokens: int = 4096
    #: On decode memory exhaustion SGLang retracts requests until this many further steps fit.
    retract_decode_steps: int = 20
    #: While requests wait, re-run the policy at least every this many decode steps (SGLang
    #: re-checks the queue every iteration; we batch steps between events, see DESIGN.md).
    recheck_steps: int = 32
    #: Keep evicted prefixes in a host (CPU) tier so a later load is a swap, not a prefill.
    #: Applies to every policy alike (SGLang HiCache).
    host_tier: bool = True
    #: Record KV occupancy after every iteration (for the mechanism figures).
    record_timeline: bool = True

    def __post_init__(self) -> None:
        for name in ("max_running_requests", "new_token_ratio_decay_steps", "retract_decode_steps",
                     "recheck_steps", "clip_max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("kv_budget", "max_prefill_tokens"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1 or None, got {v}")
        if not 0 < self.init_new_token_ratio <= 1:
            raise ValueError("EngineConfig.init_new_token_ratio must be in (0, 1]")
        if not 0 < self.min_new_token_ratio_factor <= 1:
            raise ValueError("EngineConfig.min_new_token_ratio_factor must be in (0, 1]")
