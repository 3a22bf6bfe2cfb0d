"""Per-request eviction priorities the replay client sends (``topas replay --eviction-priority RULE``).

SGLang 0.5.23 keeps each radix node's ``priority`` (``mem_cache/unified_cache/unified_tree_core.py``:
every node an insert walks takes ``max(node.priority, req.priority)``, a new leaf ``req.priority``)
and, with ``--radix-eviction-policy priority``, evicts the unlocked leaf with the smallest
``(priority, last_access_time)`` first (``mem_cache/evict_policy.py`` ``PriorityStrategy``). The
request's priority is the top-level ``"priority"`` integer of its ``/generate`` call (higher: kept
longer); no scheduler flag is needed (a server started with ``--abort-on-priority-when-disabled``
refuses it). So a workflow-aware eviction runs on stock SGLang by sending each request's priority.

A *rule* has a policy hook's signature, ``rule(request, view) -> int | None`` (None: send
nothing), so the simulator can run the same rule through ``Policy.request_priority``. The client
shows it the request as it is submitted (:func:`request_view`: waiting, nothing generated) and
what a client knows (:func:`client_view`: the tasks submitted and not finished, their DAGs and
finished stages; no server state), built from a :class:`PriorityContext`. Rules (:data:`RULES`,
:func:`make_rule`):

* ``none`` (the default): send nothing; the server treats the request as priority 0.
* ``policy``: the run's policy's own ``request_priority(request, view)`` hook.
* ``reuse``: :func:`reuse_priority`, the number of future stages on the request's agent in the
  tasks in view (a workflow-aware rule that needs no policy).
* ``steps``: :func:`steps_priority`, KVFlow's steps-to-execution of the request's agent after
  this call (``topas.engine.kvflow_steps``).
* more by :func:`register_rule`, or lazily by a module named in :data:`PROVIDERS`.
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from topas.engine.kvflow_steps import kvflow_request_priority
from topas.engine.view import EngineView, RequestView, StageView, TaskView
from topas.registry import Registry

if TYPE_CHECKING:  # pragma: no cover
    from topas.workload.model import Stage, Task, Trace

__all__ = ["PriorityContext", "PriorityRule", "RULES", "PROVIDERS", "register_rule", "make_rule", "rule_names",
           "client_view", "request_view", "client_priority", "check_priority", "reuse_priority", "steps_priority", "apply_rule"]


@dataclass(frozen=True)
class PriorityContext:
    """What the client knows when it submits one request: the ``trace``, the request's ``task`` and
    ``stage``, ``now`` (run time, s), ``done`` (per task submitted and not finished, its finished
    stage ids; the request's own task included), the run's ``policy`` and ``cost`` (may be None)."""

    trace: "Trace"
    task: "Task"
    stage: "Stage"
    now: float
    done: Mapping[str, frozenset[str]]
    cost: Any = None
    #: the trace's tasks by id (built from ``trace`` when None)
    index: "Mapping[str, Task] | None" = None


#: A rule: ``rule(request, view)`` -> the request's priority, or None to send none; the signature
#: of a policy's ``request_priority`` hook, so the simulator runs the same rule as the client.
PriorityRule = Callable[["RequestView", "EngineView"], "int | None"]
#: A rule factory: ``factory(policy)`` -> the rule for a run of that policy (None: send nothing).
RuleFactory = Callable[[Any], "PriorityRule | None"]

RULES: Registry[RuleFactory] = Registry("eviction-priority rule", valid="valid", suggest=lambda: rule_names())

#: Rules registered by another module on import: name -> module (none today).
PROVIDERS: dict[str, str] = {}


def register_rule(name: str, factory: RuleFactory) -> None:
    """Register a rule factory under ``name`` (a name taken by another factory is an error)."""
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"a rule name is a plain word, got {name!r}")
    RULES.add(name, factory)


def rule_names() -> list[str]:
    """The rules that can be asked for: those registered and those :data:`PROVIDERS` name."""
    return sorted(set(RULES.names()) | set(PROVIDERS))


def make_rule(name: str | None, policy: Any = None) -> PriorityRule | None:
    """The rule ``name`` for a run of ``policy``; None for ``none`` (or None). ValueError naming
    the rules for an unknown one, or the missing module for a provided one."""
    if name is None or name == "none":
        return None
    if name not in RULES and name in PROVIDERS:
        try:
            importlib.import_module(PROVIDERS[name])
        except ImportError as e:
            raise ValueError(f"eviction-priority rule {name!r} comes with {PROVIDERS[name]}, which this install "
                             f"lacks ({e}); rules here: {', '.join(sorted(RULES.names()))}") from None
        if name not in RULES:
            raise ValueError(f"{PROVIDERS[name]} did not register the eviction-priority rule {name!r}")
    return RULES.get(name)(policy)


def check_priority(value: Any, what: str) -> int | None:
    """A rule's answer as the integer SGLang takes (signed 64-bit, ``tokenizer_manager``
    ``_set_default_priority``), or None; ValueError naming ``what`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        if not isinstance(value, np.integer):
            raise ValueError(f"{what}: a priority must be an int or None, got {value!r}")
        value = int(value)
    if not -(1 << 63) <= value < (1 << 63):
        raise ValueError(f"{what}: priority {value} is not a signed 64-bit integer")
    return int(value)


def client_view(ctx: PriorityContext) -> "EngineView":
    """The engine view a client can build: the time, the tasks submitted and not finished (their
    whole DAGs, the finished stages), the cost model when the run has one; no requests, prefixes or
    memory (server state the client does not see; memory fields are 0)."""

    tasks = {}
    by_id = ctx.index if ctx.index is not None else {t.id: t for t in ctx.trace.tasks}
    for tid in sorted(ctx.done):
        t = by_id[tid]
        kids = t.children
        stages = MappingProxyType({s.id: StageView(s.id, s.agent, s.input_tokens, s.parents, kids[s.id])
                                   for s in t.stages})
        tasks[tid] = TaskView(id=t.id, arrival=t.arrival, workflow=t.workflow, stages=stages, topo_order=t.topo_order,
                              done=frozenset(ctx.done[tid]), observed_output={})
    return EngineView(time=ctx.now, kv_budget=0, prefix_tokens=0, request_tokens=0, prefixes=MappingProxyType({}),
                      running=(), waiting=(), tasks=MappingProxyType(tasks), cost=ctx.cost)


def request_view(ctx: PriorityContext) -> "RequestView":
    """The request as a waiting request's view at its submission (nothing generated, no KV)."""

    s = ctx.stage
    return RequestView(rid=f"{ctx.task.id}/{s.id}", task_id=ctx.task.id, stage_id=s.id, agent=s.agent,
                       input_tokens=s.input_tokens, generated=0, ready_time=ctx.now, kv_tokens=0,
                       service_time=0.0, preemptions=0)


def client_priority(rule: PriorityRule, ctx: PriorityContext) -> int | None:
    """What ``rule`` gives the request of ``ctx`` (its :func:`request_view` and :func:`client_view`)."""
    return check_priority(rule(request_view(ctx), client_view(ctx)), f"request {ctx.task.id}/{ctx.stage.id}")


def _none(policy: Any) -> PriorityRule | None:
    return None


def _policy(policy: Any) -> PriorityRule:
    hook = getattr(policy, "request_priority", None)
    if hook is None:
        name = getattr(policy, "name", type(policy).__name__)
        raise ValueError(f"eviction-priority rule 'policy': policy {name!r} has no request_priority(request, view) hook")
    return hook


def reuse_priority(request: "RequestView", view: "EngineView") -> int:
    """The ``reuse`` rule: how many stages of the tasks in ``view``, not finished and not this
    request's own, run on this request's agent (its prefix's future uses the scheduler can see from
    the DAGs; 0 when none). A workflow-aware rule that needs no policy; KVFlow's steps-to-execution
    (``steps``) orders by how soon the next use comes instead."""
    n = 0
    for tid in sorted(view.tasks):
        t = view.tasks[tid]
        for sid in t.topo_order:
            st = t.stages[sid]
            if st.agent == request.agent and sid not in t.done and not (tid == request.task_id and sid == request.stage_id):
                n += 1
    return n


def apply_rule(policy: Any, name: str | None) -> Any:
    """``policy`` whose ``request_priority`` hook is the rule ``name`` (so the simulator gives each
    request the priority the replay sends): ``policy`` itself for ``none``/None and ``policy``
    (its own hook), else a copy whose class is a subclass overriding the hook (the engine asks a
    policy for priorities only when its class overrides ``Policy.request_priority``,
    ``topas.engine.evict_pass``)."""

    rule = make_rule(name, policy)
    if rule is None or name == "policy":
        return policy
    cls = type(policy)
    sub = type(f"{cls.__name__}With{name.title().replace('-', '').replace('_', '')}Priority", (cls,), {
        "__slots__": (), "__module__": cls.__module__, "__doc__": f"{cls.__name__} with the {name!r} request priorities",
        "request_priority": lambda self, request, view: rule(request, view)})
    out = copy.copy(policy)
    out.__class__ = sub
    return out


def steps_priority(request: "RequestView", view: "EngineView") -> int:
    """The ``steps`` rule: KVFlow's steps-to-execution (Pan et al. 2025) of the request's agent once
    this call is done, as SGLang's priority (higher kept longer): ``H + 1 - min(steps, H + 1)`` with
    KVFlow's horizon ``H`` (its ``evict_pri_level``, 4): an agent due right after this call gets
    ``H + 1``, one no known stage waits for 0. That is
    :func:`topas.engine.kvflow_steps.kvflow_request_priority` less one: KVFlow keeps its lowest
    value for a node no known agent uses, which a request (its agent is known) never is, so the rule
    starts at 0, the priority of a request that sends none."""

    return kvflow_request_priority(view, request.task_id, request.stage_id) - 1


register_rule("none", _none)
register_rule("policy", _policy)
register_rule("reuse", lambda policy: reuse_priority)
register_rule("steps", lambda policy: steps_priority)
