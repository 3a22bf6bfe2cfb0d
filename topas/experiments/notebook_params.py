"""Checking a notebook's parameters: one cell, one line of error.

Every notebook's cell right after its papermill ``parameters`` cell calls :func:`check_params`
with a rule per parameter::

    from topas.experiments.notebook_params import check_params, each_of, one_of, ...
    check_params(globals(), workload=one_of(available_traces()), load=positive, quick=flag, ...)

A value a rule refuses raises :class:`ParameterError`, whose message names the parameter, the
value given and what is allowed; in a notebook (IPython) it is shown as that one line, without a
traceback. A rule is any object with ``ok(value) -> bool`` and a ``allowed`` description.

:func:`declared_parameters` reads a notebook's parameters cell; the notebook runner
(:mod:`pipeline.notebooks`) refuses a parameter a notebook does not declare.
"""

from __future__ import annotations

import ast
import math
import numbers
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from topas.policies.topas_params import TopasParams

__all__ = ["HEADLESS_ENV", "ParameterError", "Rule", "check_params", "declared_parameters", "dict_of", "each_of", "flag",
           "integer", "non_negative", "numbers_list", "headless", "one_of", "optional", "path_or_none", "positive", "topas_fields", "topas_params_rule"]

#: Set to "1" in the kernels of a headless run (``make reproduce`` / ``make figures``, the test
#: suite): no one is there to move a slider.
HEADLESS_ENV = "TOPAS_HEADLESS"


def headless() -> bool:
    """Whether this notebook runs headless (:data:`HEADLESS_ENV`): interactive widgets are then not
    built. Executing a cell that displays ipywidgets can hang nbclient now and then
    (jupyter/nbclient#312), and a headless run has no use for them."""
    return os.environ.get(HEADLESS_ENV) == "1"


class ParameterError(ValueError):
    """A notebook parameter outside its allowed values; shown by IPython as one line."""

    def _render_traceback_(self) -> list[str]:  # IPython: show this instead of the traceback
        return [f"ParameterError: {self}"]


@dataclass(frozen=True)
class Rule:
    """Which values a parameter takes: ``ok(value)`` and, for the error, ``allowed``."""

    ok: Callable[[Any], bool]
    allowed: str


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v))


#: True or False
flag = Rule(lambda v: isinstance(v, bool), "True or False")
#: a finite number > 0
positive = Rule(lambda v: _is_number(v) and v > 0, "a number > 0")
#: a finite number >= 0
non_negative = Rule(lambda v: _is_number(v) and v >= 0, "a number >= 0")
#: a non-empty list of finite numbers
numbers_list = Rule(lambda v: isinstance(v, (list, tuple)) and len(v) > 0 and all(_is_number(x) for x in v),
                    "a list of numbers")
#: None (the default folder) or a folder path
path_or_none = Rule(lambda v: v is None or isinstance(v, (str, os.PathLike)), "None or a folder path")


def integer(minimum: int = 0) -> Rule:
    """An integer >= ``minimum``."""
    return Rule(lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= minimum,
                f"an integer >= {minimum}")


def one_of(choices: Iterable[Any]) -> Rule:
    """One of ``choices``."""
    choices = list(choices)
    return Rule(lambda v: _hashable_in(v, choices), "one of " + ", ".join(map(str, choices)))


def each_of(choices: Iterable[Any]) -> Rule:
    """A non-empty list (or tuple) whose items are each one of ``choices``."""
    choices = list(choices)
    return Rule(lambda v: isinstance(v, (list, tuple)) and len(v) > 0 and all(_hashable_in(x, choices) for x in v),
                "a list of " + ", ".join(map(str, choices)))


def optional(rule: Rule) -> Rule:
    """None, or what ``rule`` allows."""
    return Rule(lambda v: v is None or rule.ok(v), f"None or {rule.allowed}")


def dict_of(keys: Iterable[str], value: Rule) -> Rule:
    """A dict whose keys are among ``keys`` and whose values ``value`` allows."""
    keys = list(keys)
    return Rule(lambda v: isinstance(v, Mapping) and all(k in keys and value.ok(x) for k, x in v.items()),
                f"a dict of {', '.join(keys)} -> {value.allowed}")


def topas_fields() -> list[str]:
    """The names of :class:`~topas.policies.topas_params.TopasParams`'s fields."""
    return [f.name for f in fields(TopasParams)]


def topas_params_rule() -> Rule:
    """TOPAS's parameters as a dict (``{}`` = defaults): keys are :class:`TopasParams` fields."""
    return dict_of(topas_fields(), Rule(lambda v: True, "a value"))


def _hashable_in(v: Any, choices: list) -> bool:
    try:
        return v in choices
    except TypeError:
        return False


def check_params(values: Mapping[str, Any], **rules: Rule) -> None:
    """Check ``values[name]`` (a notebook's ``globals()``) against each rule; raise
    :class:`ParameterError` at the first refused value, naming it and what is allowed."""
    for name, rule in rules.items():
        if name not in values:
            raise ParameterError(f"parameter {name} is not set")
        v = values[name]
        if not rule.ok(v):
            raise ParameterError(f"parameter {name}={v!r} is not allowed: {rule.allowed}")


def declared_parameters(notebook: str | os.PathLike) -> list[str]:
    """The names the notebook's ``parameters`` cell assigns, in order."""
    import nbformat  # lazy: nbformat is in the optional notebooks extra

    nb = nbformat.read(Path(notebook), as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if not cells:
        return []
    return [t.id for node in ast.parse(cells[0].source).body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)]
