"""TOPAS's parameters (``TopasParams``): the paper's symbols (beta, rho, H_age, M, K), our
choices and the readings of what the paper leaves open (docs/method.md "Readings")."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Literal

from topas.policies.base import OMIT_DEFAULT, PolicyError


@dataclass(frozen=True)
class TopasParams:
    # Defaults: one set for every workload. preempt, beta, rho and move_cost were re-selected on
    # tuning seeds once the plan was the engine's (scripts/select_plan_execution.py, its rule in
    # its docstring; data/results/selection/plan_execution_ranking.csv): beta 1 -> 4, the others
    # kept. output_reserve and revalue_credit come from the earlier sweep
    # (scripts/sweep_topas_defaults.py); H_age, M, K, samples and candidates_per_agent were not swept.
    #: weight of the prefix-reuse value V_reuse
    beta: float = 4.0
    #: aging strength rho in g_i(t) = 1 + rho * log(1 + (t - tau_i) / H_age)
    rho: float = 0.5
    #: aging horizon H_age, seconds
    H_age: float = 60.0
    #: enumerate every prefix subset when the pool has at most M agents
    M: int = 6
    #: cap on admissions and on preemptions per decision
    K: int = 64
    #: E[LP] estimator: "expected" (longest path over expected residuals) or "sampled"
    estimator: Literal["expected", "sampled"] = "expected"
    #: draws per stage for the sampled estimator
    samples: int = 16
    #: fraction of a request's expected remaining output reserved in d_r(t)
    output_reserve: float = 0.5
    #: waiting requests considered per agent (the best by initial gain), for speed
    candidates_per_agent: int = 32
    #: prior pseudo-observations of each agent's expected output length
    prior_weight: int = 1
    #: include V_reuse (ablation switch)
    reuse: bool = True
    #: include aging (ablation switch)
    aging: bool = True
    #: seed of the sampled estimator's draws
    seed: int = 0
    #: allow dropping a prefix whose agent has running requests (preempting them)
    preempt: bool = True
    #: revalue a running request's credit at its task's current age when revoking it
    #: (the paper charges lambda_r as recorded at admission: set False for that)
    revalue_credit: bool = True
    #: output lengths: "online" (learned from finished requests, the prior as prior_weight
    #: observations) or "prior" (the prior only); see ``topas.policies.estimates``
    output_estimator: Literal["online", "prior"] = field(default="online", metadata=OMIT_DEFAULT)

    # ---- readings: choices the paper leaves open (docs/method.md "Readings"); each default is
    # the reading of the figures so far, and ``topas.experiments.readings`` lists the axes.
    #: search over R' when the pool has more than M agents: "local" (add one, add two, drop
    #: one, swap), "local+" (also drop two and add one, so a large prefix can displace two small
    #: ones) or "exhaustive" (every subset of the pool whatever M: 2^|pool| prefix sets per
    #: decision, those over the budget skipped before GREEDYPACK; 2,048 on MetaGPT-TL)
    search: Literal["local", "local+", "exhaustive"] = field(default="local", metadata=OMIT_DEFAULT)
    #: the form of g_i(t): "log" (1 + rho * log(1 + (t - tau_i) / H_age)) or "linear"
    #: (1 + rho * (t - tau_i) / H_age)
    aging_form: Literal["log", "linear"] = field(default="log", metadata=OMIT_DEFAULT)
    #: J_admit's unit: "absolute" (g_i * Delta_task, seconds of critical path), "fraction"
    #: (g_i * Delta_task / L_i(H, t): the fraction of the task's remaining path committed,
    #: unitless beside the other terms' seconds) or "remaining" (that fraction times the mean
    #: L_i(H, t) of the decision's tasks: ranked by fraction, back in seconds)
    admit_norm: Literal["absolute", "remaining", "fraction"] = field(default="absolute", metadata=OMIT_DEFAULT)
    #: how parallel siblings split g_i * Delta_task(F | H): "residual" (in proportion to their
    #: expected residual times), "equal", or "last" (sequential conditioning read literally:
    #: all to the last sibling in topological order, 0 to the others)
    sibling_share: Literal["residual", "equal", "last"] = field(default="residual", metadata=OMIT_DEFAULT)
    #: J_redo: "decode" (T_decode * y_r, the paper's) or "reprefill" (the engine rebuilds the y_r
    #: tokens with one prefill of x_r + y_r on the cached prefix, plus the re-wait: the earliest
    #: expected finish in Q', when the preempted request can be readmitted at the soonest)
    redo: Literal["decode", "reprefill"] = field(default="decode", metadata=OMIT_DEFAULT)
    #: J_move's prices: "swap" (an eviction without a host copy costs the swap mu * l_a / B_swap
    #: even when the engine has no host tier) or "engine" (as the engine does it: without a host
    #: tier an eviction only unpins (free) and a load is a prefill unless the prefix is still
    #: cached (free); with one, as "swap")
    move_cost: Literal["swap", "engine"] = field(default="swap", metadata=OMIT_DEFAULT)

    # ---- plan = execution (docs/method.md "The plan and the engine"): what a decision scores is
    # what the engine then does; each switch's other value is the earlier reading, for ablation.
    #: of an agent whose prefix is not in the radix tree, admit at most one request (it computes
    #: the prefix; the others wait until it is cached, as SGLang's in-batch check makes LPM do),
    #: none while a request computes it. Off: GREEDYPACK packs every request of a just-loaded
    #: agent, and the engine computes one copy of the prefix per request
    in_batch_guard: bool = True
    #: d_r(t): "engine" (the engine's admission rule, read from the view: a waiting request's
    #: prompt + its first token's slot + its whole remaining max_new_tokens, a running one's KV +
    #: its reservation) or "estimate" (suffix input + generated + output_reserve x the expected
    #: remaining output; the engine may then refuse what the plan admits)
    demand: Literal["engine", "estimate"] = "engine"
    #: V_reuse's price of one later use of a resident prefix: "engine" (what the engine pays to
    #: bring it back: a prefill of l_a without a host tier, a swap with one) or "swap" (the
    #: paper's mu * l_a / B_swap, whatever the engine)
    reuse_cost: Literal["engine", "swap"] = "engine"

    def __post_init__(self) -> None:
        checks = {
            "beta": self.beta >= 0, "rho": self.rho >= 0, "H_age": self.H_age > 0, "M": self.M >= 0,
            "K": self.K >= 1, "samples": self.samples >= 1, "output_reserve": self.output_reserve >= 0,
            "candidates_per_agent": self.candidates_per_agent >= 1, "prior_weight": self.prior_weight >= 0,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise PolicyError(f"topas parameter {bad[0]}={getattr(self, bad[0])!r} is out of range")
        for name, typ in typing.get_type_hints(type(self)).items():
            choices = typing.get_args(typ) if typing.get_origin(typ) is Literal else ()
            if choices and getattr(self, name) not in choices:
                raise PolicyError(f"topas parameter {name}={getattr(self, name)!r} is not one of {choices}")


#: The plan = execution switches at their earlier values (docs/method.md "The plan and the
#: engine"): TOPAS then plans as it did before them (with the engine's ``recheck_on_insert`` off,
#: bit for bit: ``tests/test_readings.py``).
EARLIER_PLAN: dict[str, object] = {"in_batch_guard": False, "demand": "estimate", "reuse_cost": "swap"}
