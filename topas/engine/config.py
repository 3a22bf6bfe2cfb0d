"""Engine configuration: SGLang's scheduler knobs and behaviours that the simulator models.

Defaults are stock SGLang 0.5.x (``server_args`` / ``global_config``, no HiCache), the real server
being the ground truth for the engine model (docs/design.md, "Engine model"). Every behaviour that
an earlier version of this simulator modelled differently is a named switch, so that a
sensitivity study (notebook 11) can turn the old reading back on: :data:`LEGACY_ENGINE` is the
engine model of the figures before issue 12.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

# strategies in their own modules register on import, before any name is checked
from topas.engine import belady as _belady  # noqa: F401  (the offline bound "belady")
from topas.engine import eviction_kvflow as _kvflow  # noqa: F401  (KVFlow's "kvflow")
from topas.engine import eviction_policy as _policy  # noqa: F401  (a policy's own next-use values: "policy")
from topas.engine.eviction import check_eviction


@dataclass(frozen=True)
class EngineConfig:
    #: KV budget B in tokens; ``None`` takes the profile's ``kv_budget_tokens``.
    kv_budget: int | None = None
    #: Tokens prefilled per iteration (SGLang ``chunked_prefill_size``); ``None`` = the profile's.
    max_prefill_tokens: int | None = None
    #: SGLang ``max_running_requests`` (its default is derived from memory; large here).
    max_running_requests: int = 4096
    #: Running requests reserve ``new_token_ratio * min(max_new - generated, clip)`` tokens for
    #: their future output. The ratio starts at ``init``, decays linearly to ``init * min_factor``
    #: over ``decay_steps`` decode steps and is reset to ``init`` on a retraction (SGLang computes
    #: a data-dependent ratio there; resetting is our simplification). ``max_new`` is the stage's
    #: ``max_new_tokens`` (the trace's; its output length when absent, as the replay client sends
    #: it). Engine-internal: policies never see it.
    init_new_token_ratio: float = 0.7
    min_new_token_ratio_factor: float = 0.14
    new_token_ratio_decay_steps: int = 600
    clip_max_new_tokens: int = 4096
    #: On decode memory exhaustion SGLang retracts requests until this many further steps fit.
    retract_decode_steps: int = 20
    #: While requests wait, re-run the policy at least every this many decode steps (SGLang
    #: re-checks the queue every iteration; we batch steps between events).
    recheck_steps: int = 32
    #: Record KV occupancy after every iteration (for the mechanism figures).
    record_timeline: bool = True

    # ---- behaviours (stock SGLang 0.5.x by default; docs/design.md explains each)
    #: A host (CPU) KV tier (SGLang HiCache, ``--enable-hierarchical-cache``): an evicted prefix is
    #: written to host memory and a later load is a swap at the profile's bandwidth, not a
    #: prefill. Off in stock SGLang: an evicted prefix is recomputed. Applies to every policy.
    host_tier: bool = False
    #: SGLang's radix cache: a finished request's KV stays cached as a least-recently-used leaf
    #: under its agent's prefix; a fresh prefix shares its radix node with the request that
    #: computed it until another request matches it; evictions happen when memory is allocated,
    #: after the admission walk has locked every admitted request's prefix (``PrefillAdder``
    #: counts evictable KV as available); a prefix-managing policy's ``evict`` unpins (the
    #: prefix stays cached until the LRU takes it). Off: KV is freed at finish and unreferenced
    #: prefixes are evicted (LRU) during the admission walk, as soon as a request needs room.
    radix_cache: bool = True
    #: With the radix cache, on a trace whose prompts carry segments (``topas.trace/2``): the tree
    #: holds every prompt's segments below its agent prefix (``topas.engine.radix_cache``), so a
    #: request also matches the headers and task context that earlier calls left cached, as
    #: SGLang matches any shared token prefix. Off: agent prefixes are the only shared KV (the
    #: engine model of traces without segments). No effect on a trace without segments.
    segment_cache: bool = True
    #: Requests admitted in one prefill batch share a prefix that is still being computed. Off
    #: (SGLang): each such request matches none of it, computes and holds its own copy during
    #: its prefill (charged in compute and memory), and shares the prefix only once it is cached.
    prefill_prefix_sharing: bool = False
    #: SGLang's overlap scheduler (on unless ``--disable-overlap-schedule``): batch k+1 is scheduled
    #: before batch k's results are processed (``Scheduler.event_loop_overlap``: ``get_next_batch_to_run``,
    #: ``run_batch``, then ``process_batch_result`` of the previous batch), and a prefill's KV enters
    #: the radix tree only there (``cache_unfinished_req``). So the batch scheduled right after a
    #: prefill matches none of the prefix that prefill computed: its requests compute their own
    #: copy, as inside one batch (without ``prefill_prefix_sharing``). The duplicate copy a request
    #: computed is freed there too (``cache_unfinished_req`` finds the prefix already inserted), so
    #: it still holds memory when that next batch is admitted. Off: the prefix is matchable, and
    #: the copy freed, from the next batch on. (That finished requests leave the batch one step late
    #: is not modelled.)
    overlap_schedule: bool = True
    #: SGLang's ``batch_is_full``: after an admission fails for lack of memory while requests
    #: run, admission stays shut until a request leaves the running (decode) batch; a failure
    #: while the decode batch is empty lasts until that prefill batch has run.
    admission_gate: bool = True
    #: ``PrefillAdder.add_one_req``: a request is admitted only if its whole remaining output
    #: (``max_new_tokens``, clipped) + 1 fits beside what is promised; off: ``new_token_ratio``
    #: of it.
    full_output_reserve: bool = True
    #: Requests are sent with ``ignore_eos`` (the replay client does, to get the trace's exact
    #: output lengths): running requests reserve their whole remaining output (SGLang's ratio 1
    #: for them). Off (a real model ends at EOS): the decaying ``new_token_ratio``.
    ignore_eos: bool = False
    #: The request path (HTTP, tokenizer manager, ZMQ, the client's reply handling), seconds per
    #: request: a request reaches the scheduler this long after its parents finished (a root:
    #: half of it after its task arrived) and a task ends half of it after its last stage.
    request_latency_s: float = 0.0
    #: Multiplies the profile's host<->GPU bandwidth ``B_swap`` (a slower or faster link). The
    #: engine swaps only with ``host_tier``; policies see the scaled bandwidth in their cost model
    #: (a real scheduler knows its hardware), so TOPAS, whose J_move and V_reuse are priced with
    #: ``B_swap``, decides differently even without a host tier.
    swap_bandwidth_scale: float = 1.0
    #: The in-batch guard for every policy (ours; ``topas.engine.view.admit_cap``): walking a
    #: policy's admission order, of an agent whose prefix is not in the radix tree the engine
    #: admits one request (it computes the prefix) and holds the others back for a later
    #: decision, none while a request computes it; so no request computes its own copy of a
    #: prefix. Off (stock SGLang): only the cache-aware policies guard, in their own ordering
    #: (``lpm``: SGLang's in-batch check, which deprioritizes rather than holds back).
    in_batch_guard: bool = False
    #: A prefix entering the radix tree while requests of its agent wait is a scheduling event:
    #: the policy is asked again (SGLang re-runs its scheduling at every iteration; the simulator
    #: otherwise re-asks only at arrivals, finishes and every ``recheck_steps`` decode steps).
    recheck_on_insert: bool = True
    #: The radix cache's eviction order (SGLang ``--radix-eviction-policy``, with
    #: ``--radix-eviction-policy-config`` as ``NAME:key=value,...``): ``lru`` (stock), ``lfu``,
    #: ``slru``, ``priority``, ``tlru`` (``topas.engine.eviction``; ``topas evictions`` lists them).
    eviction: str = "lru"

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
        if not self.request_latency_s >= 0:
            raise ValueError(f"EngineConfig.request_latency_s must be >= 0, got {self.request_latency_s}")
        s = self.swap_bandwidth_scale
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not (math.isfinite(s) and s > 0):
            raise ValueError(f"EngineConfig.swap_bandwidth_scale must be a finite number > 0, got {s!r}")
        # the canonical form (an experiment's key): lower case, parameters at their default left out
        object.__setattr__(self, "eviction", check_eviction(self.eviction))


#: The engine model of the figures before issue 12 (host tier for every policy, prefixes shared
#: inside a prefill batch, no admission gate, ratio reservations, KV freed at finish, eager LRU
#: eviction during admission): notebook 11's sensitivity study.
LEGACY_ENGINE: Mapping[str, Any] = {
    "host_tier": True,
    "radix_cache": False,
    "prefill_prefix_sharing": True,
    "admission_gate": False,
    "full_output_reserve": False,
    "recheck_on_insert": False,
}

def engine_config(options: Mapping[str, Any] | None = None, **base: Any) -> EngineConfig:
    """An :class:`EngineConfig` from ``base`` fields and ``options`` (names checked, values
    coerced from the strings a command line gives); a bad name or value raises ``ValueError``
    naming it and listing the valid ones."""
    fields = {f.name: f for f in dataclasses.fields(EngineConfig)}
    kw = dict(base)
    for name, value in (options or {}).items():
        if name not in fields:
            raise ValueError(f"unknown engine option {name!r}; valid options: {', '.join(sorted(fields))}")
        default = getattr(EngineConfig(), name)
        kw[name] = _coerce(name, value, int if default is None else type(default))
    return EngineConfig(**kw)


def _coerce(name: str, value: Any, kind: type) -> Any:
    if isinstance(value, str):
        s = value.strip().lower()
        if kind is bool:
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"engine option {name}={value!r}: expected true/false")
        try:
            return kind(s) if kind in (int, float) else value
        except ValueError:
            raise ValueError(f"engine option {name}={value!r}: expected a {kind.__name__}") from None
    if kind is bool and not isinstance(value, bool):
        raise ValueError(f"engine option {name}={value!r}: expected true/false")
    if kind in (int, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"engine option {name}={value!r}: expected a number")
    return kind(value) if kind in (int, float) and value is not None else value
