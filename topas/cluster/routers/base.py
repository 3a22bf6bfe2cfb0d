"""The router interface and the registry of routers by name (like ``topas.policies.base``).

A router picks, for each request that becomes ready, the engine it is sent to
(:meth:`Router.route`). It sees the request and every engine's state
(:mod:`topas.cluster.state`) and may keep its own state across calls (SGLang's cache-aware
router keeps an approximate radix tree per worker). Parameters are a frozen dataclass
(``Params``), documented, typed, settable by name (``--router-param cache_threshold=0.5``).
Routers are deterministic: a router that draws at random is seeded by the experiment's seed.
"""

from __future__ import annotations

import dataclasses
import typing
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Mapping, Sequence

from topas.cluster.state import ClusterInfo, EngineState, RouteRequest
from topas.registry import Registry


class RouterError(ValueError):
    """An unknown router or parameter, or a parameter of the wrong type; names the valid ones."""


@dataclasses.dataclass(frozen=True)
class NoParams:
    """This router has no parameters."""


class Router(ABC):
    """Base class: subclasses set ``name`` and optionally ``Params``; ``reset`` is called before
    a run with the number of engines and the experiment's seed."""

    name: ClassVar[str]
    Params: ClassVar[type] = NoParams
    #: a router that may hold requests in its own queue: :meth:`route` returns ``None`` for a
    #: request it holds, and the cluster asks :meth:`dispatch` for held requests to send
    holds: ClassVar[bool] = False

    def __init__(self, **params: Any) -> None:
        self.params = make_router_params(self.Params, params, router=self.name)
        self.n_engines = 0
        self.seed = 0
        self.info: ClusterInfo | None = None

    def reset(self, n_engines: int, seed: int = 0, info: ClusterInfo | None = None) -> None:
        """Forget all per-run state; the cluster has ``n_engines`` engines (indices 0..n-1);
        ``info``: what a profiler knows of the agents and the engines."""
        if n_engines < 1:
            raise RouterError(f"router {self.name!r}: a cluster needs at least 1 engine, got {n_engines}")
        self.n_engines = n_engines
        self.seed = seed
        self.info = info

    @abstractmethod
    def route(self, request: RouteRequest, engines: Sequence[EngineState]) -> int | None:
        """The index of the engine ``request`` is sent to (``engines[i].index == i``), or
        ``None`` to hold it (routers with ``holds`` only)."""

    def dispatch(self, engines: Sequence[EngineState], now: float) -> list[tuple[str, int]]:
        """Held requests to send now, as (request id, engine index), in sending order (called
        after every request becomes ready and after every request finishes)."""
        return []

    def on_finish(self, rid: str, engine: int, time: float) -> None:
        """Request ``rid`` finished on ``engine`` at ``time`` (its response reached the router)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params})"


def least_loaded(engines: Sequence[EngineState], candidates: Sequence[int] | None = None) -> int:
    """The candidate with the fewest in-flight requests; ties to the lowest index (Rust's
    ``min_by_key`` keeps the first minimum)."""
    idx = range(len(engines)) if candidates is None else candidates
    return min(idx, key=lambda i: (engines[i].in_flight, i))


_REGISTRY: Registry[type[Router]] = Registry("router", valid="valid routers", error=RouterError,
                                              builtins="topas.cluster.routers")  # importing it registers the built-ins


def register(cls: type[Router]) -> type[Router]:
    """Class decorator: make a router available by its ``name``."""
    return _REGISTRY.add(cls.name, cls)


def available_routers() -> list[str]:
    return _REGISTRY.names()


def router_class(name: str) -> type[Router]:
    return _REGISTRY.get(name)


def make_router(name: str, params: Mapping[str, Any] | None = None, **kw: Any) -> Router:
    """A fresh router by name, e.g. ``make_router("sglang-cache-aware", cache_threshold=0.5)``."""
    return router_class(name)(**{**(params or {}), **kw})


def make_router_params(cls: type, given: Mapping[str, Any], router: str = "?") -> Any:
    """Build a Params dataclass from ``given``, coercing strings (from the CLI) to field types."""
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(given) - fields)
    if unknown:
        raise RouterError(f"router {router!r} has no parameter {', '.join(map(repr, unknown))}; "
                          f"valid parameters: {', '.join(sorted(fields)) or '(none)'}")
    hints = typing.get_type_hints(cls)
    values = {}
    for k, v in given.items():
        typ = hints[k]
        try:
            if typ is bool and isinstance(v, str):
                if v.strip().lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(v)
                v = v.strip().lower() in ("true", "1", "yes")
            elif typ is int and isinstance(v, float) and not v.is_integer():
                raise ValueError(v)
            elif typ in (int, float):
                if isinstance(v, bool):
                    raise ValueError(v)
                v = typ(v)
        except (TypeError, ValueError):
            raise RouterError(f"router {router!r} parameter {k!r}: {v!r} is not a valid "
                              f"{getattr(typ, '__name__', typ)}") from None
        values[k] = v
    try:
        return cls(**values)
    except ValueError as e:  # a Params' own range check
        raise RouterError(f"router {router!r}: {e}") from None


def has_room(engine: EngineState, sent: int, max_queue: int) -> bool:
    """Whether a holding router may send one more request (or batch) to ``engine`` now: fewer than
    ``max_queue`` requests queued there, counting the ``sent`` it already sent in this dispatch
    (the state was read before them), or nothing of the router's unfinished there (an idle engine
    always takes one: otherwise a request that fits nowhere by the estimates would wait for ever)."""
    return engine.waiting + sent < max_queue or engine.in_flight + sent == 0
