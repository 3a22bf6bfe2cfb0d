"""Schedulers behind one interface (``topas.policies.base.Policy``), one module per policy.

Importing this package registers every built-in policy by name; use ``make_policy(name, ...)``.
"""

from topas.policies.base import (
    Policy,
    PolicyError,
    available_policies,
    make_policy,
    param_names,
    parse_param_strings,
    policy_class,
    register,
)
from topas.policies import autellix, fcfs, klpm, lpm, parrot, spf, topas, topas_both, topas_plus  # noqa: F401  (registration)
from topas.policies import guarded  # noqa: F401  (registration; after the baselines it wraps)

__all__ = [
    "Policy",
    "PolicyError",
    "available_policies",
    "make_policy",
    "param_names",
    "parse_param_strings",
    "policy_class",
    "register",
]
