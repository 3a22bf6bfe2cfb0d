"""Notebook 12's grids: every policy at operating points set by the best baseline's capacity, the
space of readings and the ablations there (the notebook imports this module as
``grid``: ``grid.reading_grid``, ``grid.CLAIMS_FULL``)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from topas.experiments.spec import Experiment
from topas.sets import PAPER_BASELINES

def claim_policies(policies: Sequence[str]) -> list[str]:
    """``policies`` less those not registered (in their order)."""
    from topas.policies import available_policies

    have = set(available_policies())
    return [p for p in policies if p in have]


#: The policies of notebook 12's operating-point grid: the baselines, the paper's TOPAS and ours.
CLAIM_POLICIES = PAPER_BASELINES + ("topas", "topas-plus")
#: The reading axes crossed in notebook 12's small factorial: those that moved TOPAS most in the
#: one-at-a-time runs of issue 13's first measurement (DAG-4 and MetaGPT-TL at 1.0x nominal, 200
#: tasks; docs/method.md "Readings"): the host tier for TOPAS only, the search's moves and J_admit's
#: normalisation. The host tier takes none / topas-only only, so every baseline keeps its default
#: run as the reference.
FACTORIAL_AXES: Mapping[str, tuple[object, ...]] = {
    "host_tier": ("none", "topas-only"),
    "search": ("local", "local+"),
    "admit_norm": ("absolute", "remaining"),
}


@dataclass(frozen=True)
class ClaimsSize:
    """Notebook 12's sizes. Capacity: ``capacity_tasks`` per probe, ``capacity_steps`` bisection
    steps (:func:`topas.experiments.capacity.capacity_table`). Operating points: ``fractions`` of
    the best baseline's capacity (stable) and ``beyond`` it, ``op_tasks`` tasks (a MetaGPT trace has
    150: all of them). Readings: ``reading_fractions`` of the same capacity, ``reading_tasks``
    synthetic tasks and ``reading_tasks_metagpt`` MetaGPT tasks (TOPAS decides in ~3 ms there, 10x
    the synthetic workloads; the reading space is ~40 runs per point). One arrival seed each."""

    capacity_tasks: int
    capacity_steps: int
    fractions: tuple[float, ...]
    beyond: tuple[float, ...]
    op_tasks: int
    reading_fractions: tuple[float, ...]
    reading_tasks: int
    reading_tasks_metagpt: int
    seeds: tuple[int, ...]


CLAIMS_FULL = ClaimsSize(capacity_tasks=600, capacity_steps=3, fractions=(0.5, 0.8, 0.95), beyond=(1.2,),
                         op_tasks=1000, reading_fractions=(0.5, 0.8, 1.2), reading_tasks=200,
                         reading_tasks_metagpt=60, seeds=(0,))
#: Quick (the tests): the reading space at one point (0.8 of capacity), half the runs of two points; the
#: operating points still run below and beyond capacity, the ablations below it (:func:`ablation_grid`).
#: 20-task capacity probes and 24-task operating points (6 tasks per quarter for the last/first
#: quarter JCT): the MetaGPT trace's runs were most of the notebook's quick time.
CLAIMS_QUICK = ClaimsSize(capacity_tasks=20, capacity_steps=1, fractions=(0.8,), beyond=(1.2,), op_tasks=24,
                          reading_fractions=(0.8,), reading_tasks=30, reading_tasks_metagpt=12, seeds=(0,))


#: Notebook 12's quick workloads (what the tests run): one synthetic workload and one MetaGPT trace.
CLAIMS_QUICK_WORKLOADS = ("chain-3", "metagpt-sop")


def claims_size(quick: bool) -> ClaimsSize:
    return CLAIMS_QUICK if quick else CLAIMS_FULL


def operating_grid(points, quick: bool = False, policies: Sequence[str] = CLAIM_POLICIES,
                   params: Mapping[str, object] | None = None) -> list[Experiment]:
    """Every policy at every operating point of ``points`` (a
    :func:`topas.experiments.capacity.operating_points` table: loads as fractions of the best
    baseline's capacity), :attr:`ClaimsSize.op_tasks` tasks. ``params`` apply to ``topas``."""
    sz = claims_size(quick)
    return [Experiment(r["workload"], p, dict(params or {}) if p == "topas" else {}, load=r["load"], seed=s,
                       n_tasks=sz.op_tasks)
            for r in points.to_dict("records") for p in claim_policies(policies) for s in sz.seeds]


def search_matters(workload: str) -> bool:
    """The search axis changes nothing on a trace with at most M agents (every subset is scored)."""
    from topas.experiments.spec import _read_trace, resolve_trace_path
    from topas.policies.topas import TopasParams

    return len(_read_trace(resolve_trace_path(workload)).agents) > TopasParams().M


def reading_grid(points, quick: bool = False, factorial_axes: Mapping[str, Sequence[object]] | None = None):
    """Notebook 12's space of readings: at each point of ``points`` whose fraction is one of
    :attr:`ClaimsSize.reading_fractions`, every one-at-a-time variant of the baselines and TOPAS
    (:func:`studies.claims.readings.one_at_a_time`) plus TOPAS's factorial over
    ``factorial_axes`` (default :data:`FACTORIAL_AXES`). Variants of the ``search`` axis are left
    out on traces with at most M agents (they are the default run there).

    Returns ``(label, experiment)`` pairs; a label names the non-default readings of the run."""
    from studies.claims.readings import one_at_a_time, variant

    sz = claims_size(quick)
    axes = dict(FACTORIAL_AXES if factorial_axes is None else factorial_axes)
    variants = one_at_a_time(PAPER_BASELINES + ("topas",))
    have = {(v.policy, v.label) for v in variants}
    for combo in itertools.product(*axes.values()):
        v = variant("topas", dict(zip(axes, combo)))
        if (v.policy, v.label) not in have:
            have.add((v.policy, v.label))
            variants.append(v)
    out = []
    seen: set[tuple[str, Experiment]] = set()
    for r in points.to_dict("records"):
        if not any(math.isclose(r["fraction"], f) for f in sz.reading_fractions):
            continue
        w = r["workload"]
        n = sz.reading_tasks_metagpt if w.startswith("metagpt") else sz.reading_tasks
        search = search_matters(w)
        for v in variants:
            if not search and "search=" in v.label:
                continue
            for s in sz.seeds:
                e = v.experiment(w, load=r["load"], seed=s, n_tasks=n)
                if (v.label, e) not in seen:
                    seen.add((v.label, e))
                    out.append((v.label, e))
    return out


#: The ablations of notebook 12, each as (policy, params): the paper's (``topas`` without a term)
#: and topas-plus's (without one of its three parts; ``docs/topas_plus.md``).
CLAIM_ABLATIONS: Mapping[str, tuple[str, Mapping[str, object]]] = {
    "topas": ("topas", {}),
    "topas-no-reuse": ("topas-no-reuse", {}),
    "topas-no-aging": ("topas-no-aging", {}),
    "topas-base": ("topas-base", {}),
    "topas-request-only": ("topas-request-only", {}),
    "topas-plus": ("topas-plus", {}),
    "topas-plus: no residency tier": ("topas-plus", {"residency_first": False}),
    "topas-plus: FCFS inside tiers": ("topas-plus", {"rank": "fcfs"}),
    "topas-plus: no aging": ("topas-plus", {"H_age": 0.0}),
}


def ablation_grid(points, quick: bool = False) -> list[tuple[str, Experiment]]:
    """Both ablation sets (:data:`CLAIM_ABLATIONS`) and the baselines at the points of ``points``
    at 0.8 of the best baseline's capacity and beyond it, at the reading grid's sizes (so the
    baselines' runs are the reading grid's default runs): ``(label, experiment)`` pairs. ``quick``: at
    0.8 only (the runs beyond capacity were a fifth of the quick notebook's runs; the operating points
    still run beyond it)."""
    sz = claims_size(quick)
    have = set(claim_policies([p for p, _ in CLAIM_ABLATIONS.values()]))
    runs = [(b, (b, {})) for b in PAPER_BASELINES] + [(k, v) for k, v in CLAIM_ABLATIONS.items() if v[0] in have]
    out = []
    for r in points.to_dict("records"):
        if not (math.isclose(r["fraction"], 0.8) or (r["regime"] == "beyond" and not quick)):
            continue
        n = sz.reading_tasks_metagpt if r["workload"].startswith("metagpt") else sz.reading_tasks
        out += [(label, Experiment(r["workload"], p, dict(params), load=r["load"], seed=s, n_tasks=n))
                for label, (p, params) in runs for s in sz.seeds]
    return out
