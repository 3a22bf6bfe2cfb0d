"""One experiment = (trace, policy + parameters, engine profile, arrival rate, seed): its spec,
its key, and how to run it.

:class:`Experiment` is a frozen, hashable, picklable value. :meth:`Experiment.key` identifies the
*result* of running it: the sha256 of the canonical JSON (sorted keys, no spaces) of everything
the result depends on, so a results store can reuse a result exactly when it is still valid:

* ``trace_sha256``: sha256 of the trace file's bytes (so an edited or regenerated trace never
  reuses a stale result), and ``n_tasks`` (the head of the trace that runs);
* ``rate``: the *resolved* arrival rate (``load * meta["rate"]`` when ``load`` is given, so
  ``load=1.2`` and the equal ``rate`` give the same key) and ``seed``; with neither rate nor load
  the trace's own arrival times are used and ``seed`` is dropped from the key (it is unused);
* ``policy`` and ``params``: the policy's *resolved* parameters (every field of its ``Params``
  dataclass after coercion and defaults, ablations' fixed values applied), so ``beta="0.5"``
  (from the CLI) and ``beta=0.5`` agree, and changing a default in code changes the key;
* ``profile_hash``: :attr:`topas.engine.cost.CostModel.profile_hash` of the profile after the
  ``kv_budget`` override (the profile's numbers, not its name or path);
* ``engine`` and ``engine_config``: the engine and every :class:`EngineConfig` field after the
  experiment's ``engine_options`` (e.g. ``host_tier``) are applied;
* ``code``: :func:`topas.provenance.engine_fingerprint`, a sha256 of the source files of the
  packages that produce the engine's result (``topas/engine``, ``topas/policies``,
  ``topas/workload``; plus ``topas/sglang`` for ``sglang``), so any edit to that code gives new keys: a sweep after a policy tweak runs again
  instead of returning the result of the old code;
* ``knowledge`` (only when not today's: ``prior_noise``, ``prior_bias``, ``dag_visibility``,
  with the seed when there is noise; :class:`topas.engine.knowledge.Knowledge`) and
  ``arrivals`` (only when not ``"poisson"``): what the policy may know and how tasks arrive
  (issue 16). Absent at their defaults, so the canonical form of a default run is what it was before
  they existed (its key still moves with ``code``); likewise a policy parameter declared with ``metadata={"key": "omit-default"}`` (added
  later, e.g. ``output_estimator``) is left out of ``params`` at its default
  (:func:`topas.policies.base.key_params`);
* what else the engine's results depend on (:meth:`topas.engine.registry.Engine.key_entries`):
  for a replay on a real server (``engine="sglang"``), ``server``, the identity of the SGLang
  server(s) it replays on (:class:`topas.sglang.server.ServerIdentity`: model name and config
  hash, KV pool, SGLang version, schedule policy, device, tensor parallelism, page size, plugin
  version), asked once per process and server, so a result measured on one server is never
  reused for another;
* ``cluster`` (only for a cluster: ``engines > 1`` or a ``router`` named; issue 15): the number
  of engines, the router and its resolved parameters; the run is then the engine's ``cluster``
  engine, whose ``code`` also covers ``topas/cluster``. Absent for a single engine, so a single-engine key is what it was before
  clusters existed;
* ``schema``: :data:`KEY_SCHEMA`, bumped when the meaning of a result changes in a way none of
  the above captures (e.g. a change to how this module prepares a run).

The workload's and profile's *names* are labels, not part of the key: the same file under two
names gives the same result.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import numbers
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from topas import engines as _engines
from topas.cluster.routers import RouterError, available_routers
from topas.cluster.routers import make_router as _make_router
from topas.engine.config import LEGACY_ENGINE
from topas.engine.config import engine_config as _engine_config
from topas.engine.cost import DEFAULT_PROFILE, load_profile
from topas.engine.knowledge import Knowledge, KnowledgeError
from topas.errors import ExperimentError
from topas.experiments.key_parts import engine_config_dict, policy_key_params, profile_hash
from topas.experiments.spec_args import _labels, _norm_params, _positive
from topas.experiments.traces import (  # noqa: F401
    _read_trace,
    available_traces,
    read_head,
    resolve_trace_path,
    trace_sha256,
)
from topas.policies.base import make_policy as _make_policy
from topas.provenance import code_fingerprint
from topas.workload.arrivals import canonical_process, retime
from topas.workload.validate import validate_trace

if TYPE_CHECKING:  # pragma: no cover
    from topas.engine.config import EngineConfig
    from topas.engine.cost import CostModel
    from topas.engine.registry import Engine
    from topas.engine.metrics import SimResult
    from topas.policies.base import Policy
    from topas.cluster.routers.base import Router
    from topas.workload.model import Trace

__all__ = [
    "Experiment",
    "ExperimentError",
    "KEY_SCHEMA",
    "KNOWLEDGE_FIELDS",
    "ENGINES",
    "Prepared",
    "available_traces",
    "resolve_trace_path",
    "prepare",
    "run_experiment",
    "run_prepared",
]

#: Version of the key's canonical form (see the module docstring).
KEY_SCHEMA = "topas.experiment/4"  # 4: the code in the key; 3: one SGLang-faithful engine model (issue 12); 2: TOPAS ties
#: Engines an experiment may name: the registered, listed ones (:mod:`topas.engines`; the
#: simulator first, whose ``engine_options`` switch stock SGLang's behaviours, see
#: :class:`topas.engine.config.EngineConfig`).
ENGINES = _engines.available_engines()
#: The engine an experiment names when it names none.
DEFAULT_ENGINE = ENGINES[0]
#: The knowledge and arrival-process fields (issue 16) and their defaults (today's behaviour):
#: rows of results stored before they existed are read with these values.
KNOWLEDGE_FIELDS = {"prior_noise": 0.0, "prior_bias": 1.0, "dag_visibility": "full", "arrivals": "poisson"}


# ----------------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class Experiment:
    """One simulation run, as a value.

    ``params`` may be given as a mapping or as (name, value) pairs; it is stored as a tuple of
    pairs sorted by name (hashable). Values are kept as given (strings from the command line are
    coerced by the policy); :meth:`key` uses the coerced values. ``rate`` (tasks/s) and ``load``
    (a multiple of the trace's nominal ``meta["rate"]``) re-time the tasks with Poisson arrivals
    from ``seed``; give at most one of them; with neither the trace's own arrival times are used.
    ``n_tasks`` takes the first tasks of the trace (``None``: all). ``kv_budget`` overrides the
    profile's KV budget (tokens). ``engine_options`` sets :class:`~topas.engine.config.EngineConfig`
    fields of the simulator (e.g. ``{"host_tier": True}`` models SGLang HiCache; a mapping or
    pairs, stored sorted; checked by name and type).

    Knowledge (issue 16; :mod:`topas.engine.knowledge`, applied to the policy's view only):
    ``prior_noise`` (sigma of the seeded log-normal factor on each agent's output prior; the
    factor's seed is ``seed``), ``prior_bias`` (all priors x B), ``dag_visibility`` (``"full"``
    or ``"online"``). ``arrivals``: ``"poisson"`` or ``"gamma:CV"`` (a renewal process of the
    same mean rate, :mod:`topas.workload.arrivals`; needs ``rate`` or ``load``).

    Several engines (issue 15; :mod:`topas.cluster`, docs/cluster.md): ``engines`` identical
    engines of the profile, each with its own instance of ``policy``, behind ``router`` (a name
    from ``topas routers``; required when ``engines > 1``) with ``router_params``. The default
    (``engines=1``, no router) is the single-engine simulator; ``engines=1`` with a router runs
    the cluster simulator with one engine (the same result, a different key).
    """

    workload: str
    policy: str
    params: tuple[tuple[str, Any], ...] = ()
    profile: str = DEFAULT_PROFILE
    rate: float | None = None
    load: float | None = None
    seed: int = 0
    n_tasks: int | None = None
    engine: str = DEFAULT_ENGINE
    kv_budget: int | None = None
    engine_options: tuple[tuple[str, Any], ...] = ()
    prior_noise: float = 0.0
    prior_bias: float = 1.0
    dag_visibility: str = "full"
    arrivals: str = "poisson"
    engines: int = 1
    router: str | None = None
    router_params: tuple[tuple[str, Any], ...] = ()
    #: per-instance cache of the resolved, file-dependent parts (not part of equality or hash)
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if isinstance(self.workload, os.PathLike):
            object.__setattr__(self, "workload", os.fspath(self.workload))
        if not isinstance(self.workload, str) or not self.workload:
            raise ExperimentError(f"workload must be a trace name or path, got {self.workload!r}")
        if not isinstance(self.policy, str) or not self.policy:
            raise ExperimentError(f"policy must be a policy name, got {self.policy!r}")
        if not isinstance(self.profile, str) or not self.profile:
            raise ExperimentError(f"profile must be a profile name or path, got {self.profile!r}")
        object.__setattr__(self, "params", _norm_params(self.params))
        if self.rate is not None and self.load is not None:
            raise ExperimentError(f"give either rate or load, not both (rate={self.rate!r}, load={self.load!r})")
        object.__setattr__(self, "rate", _positive("rate", self.rate))
        object.__setattr__(self, "load", _positive("load", self.load))
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise ExperimentError(f"seed must be an integer, got seed={self.seed!r}")
        object.__setattr__(self, "seed", int(self.seed))
        for name in ("n_tasks", "kv_budget"):
            v = getattr(self, name)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                    raise ExperimentError(f"{name} must be an integer >= 1 or None, got {name}={v!r}")
                object.__setattr__(self, name, int(v))
        listed = _engines.available_engines()  # the registry as it is now (an engine may register later)
        if self.engine not in listed:
            raise ExperimentError(f"unknown engine {self.engine!r}; valid engines: {', '.join(listed)}")
        opts = _norm_params(self.engine_options)
        object.__setattr__(self, "engine_options", opts)
        if opts:
            if not self.base_engine().options:
                raise ExperimentError(f"engine_options {dict(opts)} apply to {_labels('options')} only, not "
                                      f"engine {self.engine!r}; configure the server instead")
            try:
                cfg = self.engine_config()
            except ValueError as e:
                raise ExperimentError(str(e)) from None
            # stored coerced ("true" from the CLI and True agree)
            object.__setattr__(self, "engine_options", tuple((k, getattr(cfg, k)) for k, _ in opts))
        try:
            k = self.knowledge()
        except KnowledgeError as e:
            raise ExperimentError(str(e)) from None
        object.__setattr__(self, "prior_noise", k.prior_noise)
        object.__setattr__(self, "prior_bias", k.prior_bias)
        try:
            object.__setattr__(self, "arrivals", canonical_process(self.arrivals))
        except ValueError as e:
            raise ExperimentError(str(e)) from None
        if self.arrivals != "poisson" and self.rate is None and self.load is None:
            raise ExperimentError(f"arrivals={self.arrivals!r} re-times the tasks: give rate or load as well")
        self._check_cluster()

    def _check_cluster(self) -> None:
        n = self.engines
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ExperimentError(f"engines must be an integer >= 1, got engines={n!r}")
        object.__setattr__(self, "engines", int(n))
        object.__setattr__(self, "router_params", _norm_params(self.router_params))
        if self.router is None:
            if self.engines > 1:
                raise ExperimentError(f"engines={self.engines} needs a router (router=NAME); valid routers: "
                                      f"{', '.join(available_routers())}")
            if self.router_params:
                raise ExperimentError(f"router_params {dict(self.router_params)} given without a router")
            return
        if not isinstance(self.router, str) or not self.router:
            raise ExperimentError(f"router must be a router name, got router={self.router!r}")
        if self.base_engine().cluster is None:
            raise ExperimentError(f"a cluster (engines={self.engines}, router={self.router!r}) runs on "
                                  f"{_labels('cluster')} only, not engine {self.engine!r}")
        try:
            self.make_router()
        except RouterError as e:
            raise ExperimentError(str(e)) from None

    @property
    def is_cluster(self) -> bool:
        """Whether this experiment runs several engines behind a router (a router is named)."""
        return self.router is not None

    def base_engine(self) -> "Engine":
        """The registered engine this experiment names (:func:`topas.engine.registry.get_engine`)."""
        return _engines.get_engine(self.engine)

    def runner(self) -> "Engine":
        """The registered engine that runs it: the named one, or for a cluster that engine's
        ``cluster`` engine."""
        base = self.base_engine()
        return _engines.get_engine(base.cluster) if self.is_cluster and base.cluster else base

    # ------------------------------------------------------------------ resolution
    @property
    def params_dict(self) -> dict[str, Any]:
        return dict(self.params)

    def trace_path(self) -> Path:
        """The trace file (see :func:`resolve_trace_path`)."""
        return resolve_trace_path(self.workload)

    def resolve_rate(self, trace: "Trace | None" = None) -> float | None:
        """The arrival rate (tasks/s) this experiment runs at, or ``None`` for the trace's own
        arrival times. With ``load``, it is ``load * trace.meta["rate"]`` (``trace`` is read from
        :meth:`trace_path` when not given)."""
        if self.rate is not None:
            return self.rate
        if self.load is None:
            return None
        if trace is None:
            trace = _read_trace(self.trace_path())
        nominal = trace.meta.get("rate")
        if isinstance(nominal, bool) or not isinstance(nominal, numbers.Real) or not nominal > 0:
            raise ExperimentError(
                f"workload {self.workload!r}: load={self.load} needs the trace's nominal meta['rate'] "
                f"(tasks/s), but it has {nominal!r}; give rate instead"
            )
        return float(self.load * nominal)

    def load_cost(self) -> "CostModel":
        """The cost model: the profile, with the ``kv_budget`` override applied."""
        cost = load_profile(self.profile)
        return cost.with_budget(self.kv_budget) if self.kv_budget is not None else cost

    def knowledge(self) -> "Knowledge":
        """What the policy may know (:class:`topas.engine.knowledge.Knowledge`); its noise is
        seeded by ``seed``."""
        return Knowledge(self.prior_noise, self.prior_bias, self.dag_visibility, self.seed)

    def engine_config(self) -> "EngineConfig":
        """The simulator's configuration: stock SGLang's, with ``engine_options`` applied."""
        return _engine_config(dict(self.engine_options))

    @property
    def engine_model(self) -> str:
        """A label of the engine options: ``stock`` (none), ``legacy``
        (:data:`topas.engine.config.LEGACY_ENGINE`), else ``name=value,...``."""
        opts = dict(self.engine_options)
        if not opts:
            return "stock"
        if opts == dict(sorted(LEGACY_ENGINE.items())):
            return "legacy"
        return ",".join(f"{k}={v}" for k, v in sorted(opts.items()))

    def make_policy(self) -> "Policy":
        return _make_policy(self.policy, self.params_dict)

    def make_router(self) -> "Router":
        """A fresh router of a cluster experiment (:mod:`topas.cluster.routers`)."""
        if self.router is None:
            raise ExperimentError("this experiment has no router (a single engine)")
        return _make_router(self.router, dict(self.router_params))

    def prepare(self) -> "Prepared":
        """Every input built and checked (:func:`prepare`)."""
        return prepare(self)

    def canonical(self) -> dict[str, Any]:
        """What the result depends on (see the module docstring); :meth:`key` hashes it."""
        if "canonical" not in self._cache:
            path = self.trace_path()
            params = policy_key_params(self.policy, self.params)
            rate = self.resolve_rate()
            runner = self.runner()

            canon = self._cache["canonical"] = {
                "schema": KEY_SCHEMA,
                "code": code_fingerprint(runner.code),
                "engine": self.engine,
                "engine_config": engine_config_dict(self.engine_options),
                "trace_sha256": trace_sha256(path),
                "n_tasks": self.n_tasks,
                "rate": rate,
                "seed": self.seed if rate is not None else None,
                "policy": self.policy,
                "params": params,
                "profile_hash": profile_hash(self.profile, self.kv_budget),
            }
            knowledge = self.knowledge().settings()
            if knowledge:
                canon["knowledge"] = knowledge
            if self.arrivals != "poisson":
                canon["arrivals"] = self.arrivals
            canon.update(runner.key_entries(self))
            if self.is_cluster:
                canon["cluster"] = {"engines": self.engines, "router": self.router,
                                    "router_params": dataclasses.asdict(self.make_router().params)}
        return self._cache["canonical"]

    def key(self) -> str:
        """sha256 (hex) of the canonical JSON of :meth:`canonical`: stable across processes and
        machines; changes with the trace's content, the profile's numbers, the resolved params,
        the rate, the seed, the task count, the engine and its config, and the code."""
        if "key" not in self._cache:
            canon = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"),
                               ensure_ascii=True, allow_nan=False, default=str)
            self._cache["key"] = hashlib.sha256(canon.encode("ascii")).hexdigest()
        return self._cache["key"]

    def label(self) -> str:
        """A short human-readable name, e.g. ``dag-4/topas[beta=0.5]@load=1.2,seed=0``."""
        p = ",".join(f"{k}={v}" for k, v in self.params)
        at = (f"rate={self.rate:g}" if self.rate is not None
              else f"load={self.load:g}" if self.load is not None else "trace-arrivals")
        n = f",tasks={self.n_tasks}" if self.n_tasks is not None else ""
        eng = f",engine[{self.engine_model}]" if self.engine_options else ""
        know = "".join(f",{k}={v:g}" if isinstance(v, float) else f",{k}={v}"
                       for k, v in self.knowledge().settings().items() if k != "seed")
        arr = f",arrivals={self.arrivals}" if self.arrivals != "poisson" else ""
        rp = ",".join(f"{k}={v}" for k, v in self.router_params)
        cl = f",engines={self.engines},router={self.router}{f'[{rp}]' if rp else ''}" if self.is_cluster else ""
        return f"{self.workload}/{self.policy}{f'[{p}]' if p else ''}@{at},seed={self.seed}{n}{eng}{arr}{know}{cl}"

    def fields(self) -> dict[str, Any]:
        """The spec as a flat row (``params`` as canonical JSON text, for tables and Parquet)."""
        return {
            "workload": self.workload,
            "policy": self.policy,
            "params": json.dumps(dict(self.params), sort_keys=True, separators=(",", ":")),
            "profile": self.profile,
            "rate": self.rate,
            "load": self.load,
            "seed": self.seed,
            "n_tasks": self.n_tasks,
            "engine": self.engine,
            "kv_budget": self.kv_budget,
            "engine_model": self.engine_model,
            **{k: getattr(self, k) for k in KNOWLEDGE_FIELDS},
            # a cluster's columns only on cluster rows (single-engine rows are what they were)
            **({"engines": self.engines, "router": self.router,
                "router_params": json.dumps(dict(self.router_params), sort_keys=True, separators=(",", ":"))}
               if self.is_cluster else {}),
        }

    def __getstate__(self) -> dict[str, Any]:  # do not ship the cache to worker processes
        state = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "_cache"}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)
        object.__setattr__(self, "_cache", {})


# ----------------------------------------------------------------------------- running


@dataclass
class Prepared:
    """Everything a run needs, built and checked: the re-timed trace, the policy, the engine."""

    experiment: Experiment
    trace: "Trace"
    trace_path: Path
    rate: float | None
    #: the trace file's ``meta["rate"]`` (its nominal arrival rate), ``None`` if absent
    nominal_rate: float | None
    policy: "Policy"
    cost: "CostModel"
    config: "EngineConfig"
    #: what the policy may see (default: everything a real scheduler could know today)
    knowledge: "Knowledge | None" = None
    #: a cluster's router (``None``: a single engine)
    router: "Router | None" = None


def prepare(exp: Experiment) -> Prepared:
    """Resolve and check every input of ``exp`` without simulating.

    Raises (each naming the bad item): :class:`ExperimentError` (unknown workload, listing the
    available traces; bad spec; unimplemented engine), ``FileNotFoundError`` (missing trace file),
    :class:`topas.workload.validate.TraceError` (invalid trace, including a prefix or request
    larger than the KV budget), :class:`topas.engine.cost.ProfileError` (unknown or bad profile,
    listing the available ones), :class:`topas.policies.base.PolicyError` (unknown policy or
    parameter, listing the valid ones).
    """
    policy = exp.make_policy()
    cost = exp.load_cost()
    path = exp.trace_path()
    trace = read_head(path, exp.n_tasks)
    # the budget rules (every prefix and every single request fits) on the tasks that run
    validate_trace(trace, source=str(path), kv_budget=cost.kv_budget_tokens)
    rate = exp.resolve_rate(trace)
    nominal = trace.meta.get("rate")
    nominal = float(nominal) if isinstance(nominal, numbers.Real) and not isinstance(nominal, bool) else None
    if rate is not None:
        trace = retime(trace, rate, exp.seed, exp.arrivals)
    router = exp.make_router() if exp.is_cluster else None
    return Prepared(exp, trace, path, rate, nominal, policy, cost, exp.engine_config(), exp.knowledge(), router)


def run_experiment(exp: Experiment, progress: bool = False) -> "SimResult":
    """Run one experiment on its engine (:meth:`Experiment.runner`) and return its
    :class:`~topas.engine.metrics.SimResult`: the simulator's tables and summary, whichever engine
    ran it (the simulator, the cluster simulator, a replay on an SGLang server)."""
    return run_prepared(prepare(exp), progress=progress)


def run_prepared(p: Prepared, progress: bool = False) -> "SimResult":
    """Run a :class:`Prepared` experiment on its engine (see :func:`run_experiment`)."""
    return p.experiment.runner().run(p, progress=progress)
