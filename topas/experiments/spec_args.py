"""Checks of an :class:`~topas.experiments.spec.Experiment`'s arguments: parameter lists
normalised to sorted ``(name, value)`` pairs (:func:`_norm_params`), finite positive numbers
(:func:`_positive`), and the engines that take an option, named in messages (:func:`_labels`).
Each bad argument raises :class:`~topas.errors.ExperimentError` naming it."""

from __future__ import annotations

import math
import numbers
from typing import Any, Mapping

from topas import engines as _engines
from topas.errors import ExperimentError


def _norm_params(params: Any) -> tuple[tuple[str, Any], ...]:
    if params is None:
        return ()
    items = list(params.items()) if isinstance(params, Mapping) else list(params)
    out: dict[str, Any] = {}
    for item in items:
        try:
            k, v = item
        except (TypeError, ValueError):
            raise ExperimentError(f"params: {item!r} is not a (name, value) pair") from None
        if not isinstance(k, str) or not k:
            raise ExperimentError(f"params: parameter name {k!r} is not a non-empty string")
        if k in out:
            raise ExperimentError(f"params: parameter {k!r} given twice")
        if v is not None and not isinstance(v, (str, bool, numbers.Real)):
            raise ExperimentError(f"params: {k}={v!r} is not a string, number or boolean")
        if isinstance(v, numbers.Real) and not isinstance(v, bool):
            v = int(v) if isinstance(v, numbers.Integral) else float(v)
        out[k] = v
    return tuple(sorted(out.items()))


def _positive(name: str, v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v <= 0:
        raise ExperimentError(f"{name} must be a finite number > 0, got {name}={v!r}")
    return float(v)


def _labels(capability: str) -> str:
    """The labels of the registered engines with ``capability`` (``options``, ``cluster``), for messages."""
    names = [n for n in _engines.registered_engines()
             if getattr(_engines.get_engine(n), capability) and _engines.get_engine(n).listed]
    return " or ".join(_engines.get_engine(n).label for n in names)
