"""The parts of an experiment's key (:meth:`topas.experiments.spec.Experiment.canonical`) that many
experiments of a sweep share, memoised per process: a sweep's or a notebook's thousands of keys
name a few policies, profiles and engine options, and building each part from scratch (a policy
with its parameters checked, a profile read and hashed, an engine configuration) was most of a
key's cost. Each function returns what ``canonical`` would compute from scratch, a fresh copy
for a dict; an input that fails raises at every call (nothing failed is kept), and a profile is
read again when its file changes (resolved path, modification time, size)."""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any

from topas.engine.config import engine_config as _engine_config
from topas.engine.cost import _resolve as _profile_path
from topas.engine.cost import load_profile
from topas.experiments.traces import _file_stamp
from topas.policies.base import key_params
from topas.policies.base import make_policy as _make_policy

__all__ = ["policy_key_params", "engine_config_dict", "profile_hash"]


def policy_key_params(policy: str, params: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """``key_params`` of the policy's resolved parameters (the policy is built, so a bad name or
    value raises here); a fresh copy per call."""
    return _shared(_policy_key_params_memo, policy, params)


def engine_config_dict(options: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """The engine configuration with ``options`` applied, as a dict; a fresh copy per call."""
    return _shared(_engine_config_dict_memo, options)


def profile_hash(profile: str, kv_budget: int | None) -> str:
    """The cost model's ``profile_hash`` (``Experiment.load_cost``), memoised per profile file
    (its resolved path, modification time and size: an edited profile is read again)."""
    try:
        stamp = _file_stamp(_profile_path(profile))
    except OSError:  # missing: load_profile says which and what is available
        stamp = None
    return _profile_hash_memo(profile, kv_budget, stamp)


def _shared(memo: Any, *args: Any) -> dict[str, Any]:
    """``memo(*args)`` as a copy its caller may change (shallow where every value is immutable,
    the usual case, else deep); computed afresh where an argument cannot be hashed."""
    try:
        hash(args)
    except TypeError:  # a value a memo cannot hold: built each time
        return memo.__wrapped__(*args)
    d = memo(*args)
    if all(v is None or isinstance(v, (str, int, float)) for v in d.values()):
        return dict(d)
    return copy.deepcopy(d)


@functools.lru_cache(maxsize=1024)
def _policy_key_params_memo(policy: str, params: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    return key_params(_make_policy(policy, dict(params)).params)


@functools.lru_cache(maxsize=256)
def _engine_config_dict_memo(options: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    return dataclasses.asdict(_engine_config(dict(options)))


@functools.lru_cache(maxsize=256)
def _profile_hash_memo(profile: str, kv_budget: int | None, stamp: tuple[str, int, int] | None) -> str:
    cost = load_profile(profile)
    return (cost.with_budget(kv_budget) if kv_budget is not None else cost).profile_hash
