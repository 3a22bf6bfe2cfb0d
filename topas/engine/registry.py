"""What an engine is, and the registry experiments find engines in by name.

An *engine* runs a prepared experiment (:class:`PreparedRun`: the re-timed trace, the policy, the
cost model, the :class:`~topas.engine.config.EngineConfig`, the knowledge, the router) and returns
its :class:`~topas.engine.metrics.SimResult`. Each engine registers itself under its name
(:func:`register`); the experiment layer asks :func:`get_engine` for the engine an experiment
names and never names one itself. The built-in engines (the simulator ``sim``, the cluster
simulator ``cluster``, the SGLang replay ``sglang``) register when :mod:`topas.engines` is
imported.

What an engine declares besides :meth:`Engine.run`:

* ``code``: the sub-packages of ``topas/`` whose code its results depend on; the key's ``code``
  entry is :func:`topas.provenance.code_fingerprint` of them;
* ``options``: whether it takes :class:`~topas.engine.config.EngineConfig` options
  (an experiment's ``engine_options``);
* ``cluster``: the registered engine that runs several of it behind a router (``None``: it runs
  no cluster);
* ``listed``: whether an experiment names it (a cluster engine is reached through ``cluster``);
* ``in_process``: its runs share something outside this process (a server), so a sweep runs
  them here, handed out by :meth:`Engine.map`, never on worker processes or Ray;
* :meth:`Engine.key_entries`: what else its results depend on (a server's identity).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol, Sequence, TypeVar

from topas.registry import Registry

if TYPE_CHECKING:  # pragma: no cover
    from topas.engine.config import EngineConfig
    from topas.engine.cost import CostModel
    from topas.engine.knowledge import Knowledge
    from topas.engine.metrics import SimResult
    from topas.engine.policy_api import PolicyAPI
    from topas.workload.model import Trace

__all__ = ["Engine", "EngineRegistryError", "PreparedRun", "available_engines", "get_engine", "register",
           "registered_engines"]

T = TypeVar("T")


class PreparedRun(Protocol):
    """What an engine is given: an experiment with every input built and checked
    (:class:`topas.experiments.spec.Prepared` is one)."""

    experiment: Any
    trace: "Trace"
    rate: float | None
    policy: "PolicyAPI"
    cost: "CostModel"
    config: "EngineConfig"
    knowledge: "Knowledge | None"
    router: Any


class EngineRegistryError(ValueError):
    """An unknown engine name, or a name registered twice; the message lists the engines."""


class Engine:
    """An engine: subclass it, set the class attributes, implement :meth:`run`, :func:`register` it."""

    #: the name experiments give (``Experiment.engine``)
    name: ClassVar[str] = ""
    #: a few words for messages, e.g. ``"the simulator"``
    label: ClassVar[str] = ""
    #: sub-packages of ``topas/`` whose code its results depend on (the key's ``code``)
    code: ClassVar[tuple[str, ...]] = ()
    #: takes ``EngineConfig`` options (``Experiment.engine_options``)
    options: ClassVar[bool] = False
    #: the registered engine that runs several of this one behind a router
    cluster: ClassVar[str | None] = None
    #: an experiment may name it
    listed: ClassVar[bool] = True
    #: its runs share a resource outside this process: a sweep hands them out with :meth:`map`
    in_process: ClassVar[bool] = False

    def key_entries(self, experiment: Any) -> dict[str, Any]:
        """Entries of the experiment's canonical form (its key) besides the engine-independent
        ones: what else a result of this engine depends on. None by default."""
        return {}

    def run(self, prepared: PreparedRun, progress: bool = False) -> "SimResult":
        """Run one prepared experiment; the result has the simulator's tables and summary."""
        raise NotImplementedError(f"engine {self.name!r} does not implement run")

    def map(self, fn: Callable[[Any], T], experiments: Sequence[Any], *, progress: bool = True,
            desc: str = "experiments", order: Callable[[Any], float] | None = None) -> list[T]:
        """``[fn(e) for e in experiments]`` for an ``in_process`` engine (``order``: a priority,
        larger first, for handing them out)."""
        raise NotImplementedError(f"engine {self.name!r} runs on worker processes, not through map")


def available_engines() -> tuple[str, ...]:
    """The engines an experiment may name (``listed``), in registration order."""
    return tuple(n for n, e in _REGISTRY.items() if e.listed)


_REGISTRY: Registry[Engine] = Registry("engine", valid="valid engines", error=EngineRegistryError,
                                       suggest=available_engines)


def register(engine: Engine) -> Engine:
    """Register ``engine`` under its ``name``; a second engine of the same name raises
    :class:`EngineRegistryError` (re-registering the same class, on a module reload, replaces it)."""
    if not isinstance(engine, Engine) or not engine.name:
        raise EngineRegistryError(f"{engine!r} is not an Engine with a name")
    return _REGISTRY.add(engine.name, engine)


def get_engine(name: str) -> Engine:
    """The engine registered as ``name``; an unknown one raises :class:`EngineRegistryError`
    listing the engines an experiment may name."""
    return _REGISTRY.get(name)


def registered_engines() -> tuple[str, ...]:
    """Every registered engine, listed or not, in registration order."""
    return tuple(_REGISTRY.names())
