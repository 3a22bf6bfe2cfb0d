"""Eviction strategies of the simulated radix cache: which evictable KV goes first
(docs/design.md, "Eviction").

In the style of SGLang 0.5.23's ``mem_cache/evict_policy.py``: a strategy maps an evictable
entry to a sort key (``EvictionStrategy.get_priority`` there, :meth:`EvictionStrategy.priority`
here) and the engine evicts the entry of the smallest key first, whole entries until the need is
met (``FullComponent._evict_device_next_node``: a heap over ``evictable_device_leaves``, a
parent pushed once its last child is gone). ``--radix-eviction-policy`` names the strategy
there, :attr:`topas.engine.config.EngineConfig.eviction` here (``NAME`` or
``NAME:key=value,...`` for a strategy's parameters, SGLang's ``--radix-eviction-policy-config``).

An *entry* (:class:`Evictable`) is anything the engine can evict: a segment node of the tree
below an agent prefix (``topas.engine.radix_cache``), a finished request's KV leaf (traces
without segments) or an unreferenced cached agent prefix whose children are gone. The engine
keeps, per entry, what SGLang's ``UnifiedTreeNode`` keeps (``unified_tree_core.py``):

* ``last_access``: the simulated clock when the entry was last matched, locked, released or
  created. SGLang's ``last_access_time`` is a counter (``get_and_increase_time_counter``), so
  two nodes never tie there; the simulated clock ties often (a batch of nodes touched in one
  iteration), so ties go on to :attr:`Evictable.tie` (finished leaves and segment nodes before
  prefixes, then creation order, prefixes by agent name): today's LRU order, kept bit-identical.
  Two differences kept from the LRU engine: a release touches the nodes here (SGLang's
  ``dec_lock_ref`` does not; a finished request's insertion touches its prompt path anyway), and
  SGLang's periodic touch of waiting requests' prefixes (``_touch_waiting_prefixes``, LRU only)
  is not modelled.
* ``hit_count``: raised by one each time a request's insertion walks through the entry
  (``_finish_insert_walk_node`` / ``_should_backup_after_insert`` -> ``_inc_hit_count_and_check``,
  once per request: ``node_end > inserted_len``); a new leaf starts at one; matching does not
  raise it.
* ``priority``: ``max`` of the priorities of the requests whose insertion walked through it
  (``_insert_walk_step``: ``node.priority = max(node.priority, state.priority)``), a new node
  the inserting request's; a finished request's prompt path is inserted once more with
  ``priority + 1`` (``checkpoint_into_tree``: the prompt-boundary split), so its output leaf
  (priority ``p``) goes before its prompt (``p + 1``). A request's priority is SGLang's
  ``req.priority or 0`` on a server without ``--enable-priority-scheduling`` (the scheduling
  order is left alone; with it, a request without a priority would get ``-sys.maxsize - 1``).
* ``depth`` and ``history`` (``tlru`` only): tokens from the root through the entry
  (``_tlru_cached_prefix_len``) and the deepest such count its branch ever reached
  (``_tlru_history_len``, raised at node creation, never lowered).

Hooks for dynamic strategies (:attr:`EvictionStrategy.needs_view`,
:attr:`EvictionStrategy.bound`): before an eviction pass the engine calls
:meth:`EvictionStrategy.prepare` with its knowledge-limited :class:`topas.engine.view.EngineView`
(what a real scheduler knows), and, for an offline bound only, an :class:`OfflineFuture` with the
run's true future. A strategy that declares neither is never given either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from topas.registry import Registry

if TYPE_CHECKING:
    from topas.engine.view import EngineView
    from topas.workload.model import Trace

#: :attr:`Evictable.kind` values
SEGMENT, LEAF, PREFIX = "segment", "leaf", "prefix"


@dataclass(frozen=True, slots=True)
class Evictable:
    """One evictable entry as a strategy sees it (a snapshot taken for one eviction pass)."""

    #: :data:`SEGMENT` (a node of the segment tree, finished outputs included), :data:`LEAF` (a
    #: finished request's KV under its prefix, traces without segments) or :data:`PREFIX`
    kind: str
    #: the agent whose prefix the entry is, or lies below
    agent: str
    #: the entry's own KV tokens (evicting a leaf may free its prefix too: the engine's rule)
    tokens: int
    last_access: float
    hit_count: int
    priority: int
    #: creation order (segment nodes: ``SegmentNode.serial``; leaves: the engine's sequence
    #: number; prefixes: 0)
    serial: int
    #: the engine's tie rule after a strategy's key: (0, serial) for segments and leaves, (1,
    #: agent) for prefixes (LRU: a leaf goes before a prefix last used at the same instant)
    tie: tuple
    #: identifies the entry across passes: a segment id, a request id (leaf) or the agent (prefix)
    key: str
    #: tokens from the root through this entry (its prefix included), and the deepest its
    #: branch ever reached (kept for ``needs_history`` strategies only, else 0)
    depth: int = 0
    history: int = 0


@dataclass(frozen=True, slots=True)
class OfflineFuture:
    """What an offline bound (:attr:`EvictionStrategy.bound`) is given beyond the view: the whole
    trace (every task, every stage, true output lengths) and the engine's state now. Never given
    to an online strategy."""

    trace: "Trace"
    time: float
    #: request id (``task/stage``) -> state (``pending``, ``waiting``, ``prefill``, ``decode``,
    #: ``done``) of every request that has arrived; a stage of a task not yet arrived is absent.
    #: The simulator gives a :class:`RequestStates`, which shows the engine as it is when read:
    #: read it in :meth:`EvictionStrategy.prepare`
    states: Mapping[str, str]


class RequestStates(Mapping):
    """``{request id: request.state}`` over the engine's requests (by id), read through, not
    copied: an offline bound reads the few states it needs at each eviction pass (Belady: the
    requests not yet finished and those arrived since), where a copy would take every request
    that has arrived, at every pass."""

    __slots__ = ("_requests",)

    def __init__(self, requests: Mapping[str, Any]) -> None:
        self._requests = requests

    def __getitem__(self, rid: str) -> str:
        return self._requests[rid].state

    def __contains__(self, rid: object) -> bool:
        return rid in self._requests

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self) -> Any:
        return iter(self._requests)


class EvictionStrategy:
    """Orders evictable entries: the smallest :meth:`priority` is evicted first, ties broken by
    :attr:`Evictable.tie`.

    Subclasses set :attr:`name`, :attr:`description`, :attr:`params` (name -> default) and
    implement :meth:`priority`. Dynamic strategies set :attr:`needs_view` (and
    :attr:`bound` for an offline bound) and override :meth:`prepare`."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: parameter name -> default (``NAME:key=value`` in ``EngineConfig.eviction`` sets them)
    params: ClassVar[Mapping[str, int]] = {}
    #: call :meth:`prepare` with the engine's view before every eviction pass
    needs_view: ClassVar[bool] = False
    #: an offline bound: :meth:`prepare` also gets the run's :class:`OfflineFuture` (results of
    #: such a strategy are a bound, not a policy a server could run)
    bound: ClassVar[bool] = False
    #: the engine may use its LRU heaps instead of scanning (``lru`` only)
    heap_fast_path: ClassVar[bool] = False
    #: the engine keeps ``depth``/``history`` for this strategy (SGLang's ``tlru_bookkeeping``)
    needs_history: ClassVar[bool] = False
    #: the strategy reads :attr:`Evictable.priority`: only then does the engine ask the policy's
    #: ``request_priority`` (otherwise every request's priority is 0, unread)
    reads_priority: ClassVar[bool] = False
    #: the strategy orders by the policy's own next-use values: before every pass the engine
    #: hands it ``Policy.eviction_values(view)`` (:meth:`take_values`); a policy without them is
    #: refused when the engine starts
    reads_policy: ClassVar[bool] = False

    def __init__(self, **kw: int) -> None:
        for k in kw:
            if k not in self.params:
                valid = ", ".join(self.params) or "none"
                raise ValueError(f"eviction {self.name!r} has no parameter {k!r}; its parameters: {valid}")
        self.values: dict[str, int] = {**self.params, **kw}

    def priority(self, e: Evictable) -> tuple:
        raise NotImplementedError

    def prepare(self, view: "EngineView | None", future: OfflineFuture | None = None) -> None:
        """Called before an eviction pass when :attr:`needs_view` or :attr:`bound` is set:
        ``view`` only with :attr:`needs_view` (else None), ``future`` only for a :attr:`bound`.
        Default: nothing."""

    def take_values(self, values: Mapping[str, float]) -> None:
        """Called before an eviction pass when :attr:`reads_policy` is set, with the policy's
        ``eviction_values`` of the engine's view. Default: nothing."""

    def spec(self) -> str:
        """The canonical ``NAME[:key=value,...]`` form (parameters at their default left out)."""
        changed = [f"{k}={v}" for k, v in self.values.items() if v != self.params[k]]
        return self.name + (":" + ",".join(changed) if changed else "")


_REGISTRY: Registry[type[EvictionStrategy]] = Registry("eviction", valid="valid")


def register_eviction(cls: type[EvictionStrategy]) -> type[EvictionStrategy]:
    """Class decorator: make ``cls`` available under ``cls.name`` (a name taken twice is an error)."""
    if not cls.name:
        raise ValueError(f"eviction strategy {cls.__qualname__} has no name")
    return _REGISTRY.add(cls.name, cls)


def available_evictions() -> dict[str, tuple[str, dict[str, int]]]:
    """name -> (one-line description, parameters with their defaults), in registration order."""
    return {n: (c.description, dict(c.params)) for n, c in _REGISTRY.items()}


def eviction_strategy(spec: str) -> EvictionStrategy:
    """The strategy ``spec`` names: ``NAME`` or ``NAME:key=value,...`` (integer values). An
    unknown name or parameter raises ``ValueError`` listing the valid ones."""
    name, _, args = spec.strip().partition(":")
    cls = _REGISTRY.get(name.strip().lower())
    kw: dict[str, int] = {}
    for item in filter(None, (s.strip() for s in args.split(","))):
        k, eq, v = item.partition("=")
        try:
            if not eq:
                raise ValueError
            kw[k.strip()] = int(v)
        except ValueError:
            raise ValueError(f"eviction {spec!r}: expected key=integer, got {item!r}") from None
    return cls(**kw)


# ---------------------------------------------------------------------------- SGLang 0.5.23's


@register_eviction
class LRU(EvictionStrategy):
    """``LRUStrategy``: least recently used first."""

    name = "lru"
    description = "least recently used first (SGLang's default)"
    heap_fast_path = True

    def priority(self, e: Evictable) -> tuple:
        return (e.last_access,)


@register_eviction
class LFU(EvictionStrategy):
    """``LFUStrategy``: fewest hits first, then least recently used."""

    name = "lfu"
    description = "fewest insertions through the entry first, then least recently used"

    def priority(self, e: Evictable) -> tuple:
        return (e.hit_count, e.last_access)


@register_eviction
class SLRU(EvictionStrategy):
    """``SLRUStrategy``: a probationary segment (``hit_count < protected_threshold``) evicted
    before the protected one, LRU within each."""

    name = "slru"
    description = "segmented LRU: entries hit fewer than protected_threshold times go first, LRU within"
    params = {"protected_threshold": 2}

    def priority(self, e: Evictable) -> tuple:
        return (1 if e.hit_count >= self.values["protected_threshold"] else 0, e.last_access)


@register_eviction
class Priority(EvictionStrategy):
    """``PriorityStrategy``: lower request priority first, then LRU."""

    name = "priority"
    description = "lowest request priority first (Policy.request_priority), then least recently used"
    reads_priority = True

    def priority(self, e: Evictable) -> tuple:
        return (e.priority, e.last_access)


@register_eviction
class TLRU(EvictionStrategy):
    """``TLRUStrategy`` (Tail-Optimized LRU, arXiv:2510.15152): an entry whose tokens all lie past
    ``history + next_prompt_estimate - threshold`` of its branch cannot help the branch's next
    prefill meet its TTFT budget ("TEL-safe") and goes first; then LRU. SGLang refuses
    ``threshold <= next_prompt_estimate`` at startup (``kv_cache_hook``: T-LRU would be LRU), and
    so does this."""

    name = "tlru"
    description = "tail-optimized LRU: tokens past a branch's history + next_prompt_estimate - threshold first"
    params = {"threshold": 0, "next_prompt_estimate": 0}
    needs_history = True

    def __init__(self, **kw: int) -> None:
        super().__init__(**kw)
        t, q = self.values["threshold"], self.values["next_prompt_estimate"]
        if t < 0 or q < 0 or t <= q:
            raise ValueError(
                f"eviction 'tlru' needs threshold > next_prompt_estimate >= 0, got {t} and {q} "
                "(e.g. tlru:threshold=4096,next_prompt_estimate=512)")

    def priority(self, e: Evictable) -> tuple:
        budget = max(e.history + self.values["next_prompt_estimate"] - self.values["threshold"], 0)
        return (-1 if e.depth - e.tokens >= budget else 0, e.last_access)


def check_eviction(spec: Any) -> str:
    """The canonical form of ``spec`` (:meth:`EvictionStrategy.spec`) if it names a valid
    strategy (``EngineConfig``'s check), else ``ValueError``."""
    if not isinstance(spec, str):
        raise ValueError(f"EngineConfig.eviction must be a string, got {spec!r}")
    return eviction_strategy(spec).spec()
