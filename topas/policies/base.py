"""The policy interface and the registry of policies by name.

A policy is an object with ``decide(view) -> Decision`` (see ``topas.engine.view``), in the
spirit of SGLang's ``schedule_policy.py``: at each decision point it orders the waiting queue
and, if it manages prefixes, also says which agent prefixes to keep, load or evict and which
running requests to preempt. Parameters are a dataclass (``Params``) so they are documented,
typed, settable by name from the CLI (``--param beta=0.5``) and from notebooks, and checked.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Iterable, Mapping

from topas.engine.policy_api import PolicyAPI, PolicyError
from topas.engine.view import Decision, EngineView
from topas.registry import Registry


@dataclasses.dataclass(frozen=True)
class NoParams:
    """This policy has no parameters."""


class Policy(PolicyAPI, ABC):
    """Base class: subclasses set ``name``, optionally ``Params``, ``manages_prefixes``,
    ``may_preempt`` and ``plans_admissions``, implement :meth:`decide` and may override the
    engine's hooks (:class:`topas.engine.policy_api.PolicyAPI`: ``reset``, ``on_finish``,
    ``on_preempt``, ``request_priority``, ``eviction_values``)."""

    Params: ClassVar[type] = NoParams

    def __init__(self, **params: Any) -> None:
        self.params = make_params(self.Params, params, policy=self.name)
        self.reset()

    @abstractmethod
    def decide(self, view: EngineView) -> Decision:
        """The decision at this scheduling point."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params})"


_REGISTRY: Registry[type[Policy]] = Registry("policy", valid="valid policies", error=PolicyError,
                                              builtins="topas.policies")  # importing it registers the built-ins


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make a policy available by its ``name``."""
    return _REGISTRY.add(cls.name, cls)


def available_policies() -> list[str]:
    return _REGISTRY.names()


def policy_class(name: str) -> type[Policy]:
    return _REGISTRY.get(name)


def make_policy(name: str, params: Mapping[str, Any] | None = None, **kw: Any) -> Policy:
    """A fresh policy by name, e.g. ``make_policy("topas", beta=0.5)``."""
    return policy_class(name)(**{**(params or {}), **kw})


#: ``dataclasses.field(metadata=OMIT_DEFAULT)``: a parameter added after results were stored;
#: :func:`key_params` leaves it out at its default, so the canonical form of a default run does
#: not change (the key still moves with the code fingerprint).
OMIT_DEFAULT = {"key": "omit-default"}


def key_params(params: Any) -> dict[str, Any]:
    """A Params dataclass as the experiment key sees it: every field, except those declared with
    ``metadata=OMIT_DEFAULT`` while they hold their default."""
    out = dataclasses.asdict(params)
    for f in dataclasses.fields(params):
        if f.metadata.get("key") == "omit-default" and getattr(params, f.name) == f.default:
            del out[f.name]
    return out


def param_names(name: str) -> list[str]:
    return [f.name for f in dataclasses.fields(policy_class(name).Params)]


def make_params(cls: type, given: Mapping[str, Any], policy: str = "?") -> Any:
    """Build a Params dataclass from ``given``, coercing strings (from the CLI) to field types."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(given) - set(fields))
    if unknown:
        valid = ", ".join(fields) or "(none)"
        raise PolicyError(
            f"policy {policy!r} has no parameter {', '.join(map(repr, unknown))}; valid parameters: {valid}"
        )
    hints = typing.get_type_hints(cls)
    values = {k: _coerce(v, hints[k], policy, k) for k, v in given.items()}
    return cls(**values)


def _coerce(value: Any, typ: Any, policy: str, key: str) -> Any:
    origin = typing.get_origin(typ)
    choices = typing.get_args(typ) if origin is typing.Literal else None
    base = type(choices[0]) if choices else typ
    try:
        if base is bool and isinstance(value, str):
            low = value.strip().lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            out: Any = low in ("true", "1", "yes")
        elif base in (int, float, str, bool):
            if base is int and isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            out = base(value)
        else:
            out = value
    except (TypeError, ValueError):
        raise PolicyError(
            f"policy {policy!r} parameter {key!r}: {value!r} is not a valid {getattr(base, '__name__', base)}"
        ) from None
    if choices and out not in choices:
        raise PolicyError(f"policy {policy!r} parameter {key!r}: {out!r} is not one of {choices}")
    if base in (int, float) and not isinstance(out, bool):
        low = PARAM_MINIMUM.get(key, 0)
        high = MAX_FLOAT_PARAM if base is float else MAX_INT_PARAM
        if (base is float and not math.isfinite(out)) or not low <= out <= high:
            allowed = f"a number from {low} to {high:g}" if base is float else f"an integer from {low} to 2**63-1"
            raise PolicyError(f"policy {policy!r} parameter {key!r}: {str(value)[:40]!r} is out of range "
                              f"({allowed})")
    return out


#: The smallest value of a numeric parameter (by name, in every policy); any other numeric
#: parameter must be >= 0 (:func:`_coerce`).
PARAM_MINIMUM: dict[str, int] = {"num_queues": 1, "samples": 1, "max_samples": 1}
#: The largest value of a float parameter: far beyond any meaningful weight or time, small enough
#: that a parameter times a token count stays a finite number.
MAX_FLOAT_PARAM = 1e12
#: The largest value of an integer parameter (what numpy's int64 holds).
MAX_INT_PARAM = 2**63 - 1


def parse_param_strings(items: Iterable[str]) -> dict[str, str]:
    """``["beta=0.5", "M=6"]`` -> ``{"beta": "0.5", "M": "6"}`` (types are coerced by the policy)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise PolicyError(f"parameter {item!r} is not of the form NAME=VALUE")
        out[key.strip()] = value.strip()
    return out
