"""The experiment grids behind the paper's figures, in full and quick sizes.

Notebooks ask for a section's experiments here, hand them to :func:`run_sweep` (which only runs
what the results store lacks) and plot the summaries, so the grid is defined once and a notebook
stays thin::

    from studies import grid
    from topas.experiments import run_sweep
    exps = grid.jct_vs_load(["dag-4"], quick=True)
    summaries = run_sweep(exps)

Sizes: full = 500 tasks per run, 3 arrival seeds, loads 0.8-1.4x each trace's nominal rate;
quick = 40 tasks, 1 seed, two loads (for CI and a first look). Loads are multiples of the
trace's ``meta["rate"]`` (see ``data/traces/README.md`` for what the nominal rate means).

:func:`gpu_afternoon` is the named grid for a first measurement on a GPU box (about 3.8 h of
arrivals on one server; see :data:`AFTERNOON` and the README's GPU-box section), and
:func:`notebook_grid` the union of what the notebooks sweep (for ``scripts/reproduce.py``'s plan).

Engine: the grids run on the simulator unless ``$TOPAS_ENGINE`` says ``sglang``
(``make reproduce ENGINE=sglang`` sets it for the notebooks' kernels), in which case every run
is replayed on the SGLang server at ``$TOPAS_SGLANG_URL`` and stored under its own keys, labelled
``engine=sglang``; simulated and measured results never mix.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import os

from topas.engine.config import LEGACY_ENGINE
from topas.sets import ABLATIONS, METAGPT, PAPER_BASELINES, PAPER_POLICIES, SYNTHETIC
from topas.experiments.spec import ENGINES, Experiment, ExperimentError

ENGINE_ENV = "TOPAS_ENGINE"



@dataclass(frozen=True)
class Size:
    n_tasks: int
    seeds: tuple[int, ...]
    loads: tuple[float, ...]


FULL = Size(n_tasks=500, seeds=(0, 1, 2), loads=(0.8, 1.0, 1.2, 1.4))
QUICK = Size(n_tasks=40, seeds=(0,), loads=(1.0, 1.3))


def size(quick: bool) -> Size:
    return QUICK if quick else FULL


def default_engine() -> str:
    """The engine the grids use: ``$TOPAS_ENGINE`` (``sim`` when unset)."""
    engine = os.environ.get(ENGINE_ENV, "").strip() or "sim"
    if engine not in ENGINES:
        raise ExperimentError(f"${ENGINE_ENV}={engine!r} is not an engine; valid engines: {', '.join(ENGINES)}")
    return engine


def _grid(
    workloads: Iterable[str],
    policies: Iterable[str],
    loads: Iterable[float],
    sz: Size,
    params: Mapping[str, object] | None = None,
) -> list[Experiment]:
    return [
        Experiment(w, p, dict(params or {}) if p.startswith("topas") else {}, load=l, seed=s, n_tasks=sz.n_tasks,
                   engine=default_engine())
        for w, p, l, s in itertools.product(workloads, policies, loads, sz.seeds)
    ]


def jct_vs_load(
    workloads: Sequence[str] = SYNTHETIC,
    policies: Sequence[str] = PAPER_POLICIES,
    quick: bool = False,
    params: Mapping[str, object] | None = None,
) -> list[Experiment]:
    """Mean/p99 JCT and throughput against load: every policy x load x seed per workload.

    ``params`` apply to the TOPAS policies only (e.g. utility weights from a notebook).
    """
    sz = size(quick)
    return _grid(workloads, policies, sz.loads, sz, params)


#: Notebook 05 times TOPAS's decisions on this workload at this load (its parameters' defaults;
#: notebook 08 reads the same runs for the paper's overhead row).
OVERHEAD_WORKLOAD, OVERHEAD_LOAD = "dag-10-wide", 1.4


def overhead_runs(
    workload: str = OVERHEAD_WORKLOAD,
    load: float = OVERHEAD_LOAD,
    quick: bool = False,
    params: Mapping[str, object] | None = None,
) -> list[Experiment]:
    """TOPAS's runs whose decision wall times are the overhead result: every seed of
    :func:`jct_vs_load`'s TOPAS runs on ``workload``, at ``load``. ``make reproduce`` runs them
    first and one at a time, so that no other simulation shares the machine while they are timed."""
    runs = {dataclasses.replace(e, load=load): None for e in jct_vs_load([workload], ["topas"], quick, params)}
    return list(runs)


def ablations(
    workloads: Sequence[str] = ("dag-4",),
    load: float = 1.2,
    quick: bool = False,
    params: Mapping[str, object] | None = None,
) -> list[Experiment]:
    """Full TOPAS and its four ablations (plus the baselines for reference) at one load."""
    sz = size(quick)
    return _grid(workloads, ABLATIONS + PAPER_BASELINES, (load,), sz, params)


#: Notebook 11's engine models: label -> the simulator's engine options.
ENGINE_MODELS: dict[str, dict[str, object]] = {
    "stock": {},
    "host_tier=True": {"host_tier": True},
    "legacy": dict(LEGACY_ENGINE),
}


#: Notebook 11's quick workloads (what the tests run): one synthetic workload and one MetaGPT trace
#: (36 runs instead of 90 on all five).
ENGINE_MODEL_QUICK_WORKLOADS = ("dag-4", "metagpt-sop")


def engine_model_workloads(quick: bool = False) -> tuple[str, ...]:
    """Notebook 11's workloads: every synthetic and MetaGPT workload (quick:
    :data:`ENGINE_MODEL_QUICK_WORKLOADS`)."""
    return ENGINE_MODEL_QUICK_WORKLOADS if quick else SYNTHETIC + METAGPT


def engine_model(
    workloads: Sequence[str] | None = None,
    load: float = 1.2,
    quick: bool = False,
    params: Mapping[str, object] | None = None,
) -> list[Experiment]:
    """Every policy at one load on each engine model of :data:`ENGINE_MODELS`: the figures'
    simulator (stock SGLang's behaviours), the same with a host tier for every policy (SGLang
    HiCache), and the engine model of the figures before issue 12 (``legacy``), for notebook
    11's question whether the figures' conclusions depend on the engine model. The ``stock`` third
    is :func:`jct_vs_load`'s runs at that load (the same keys, so a store that has the figures
    has it). ``workloads``: default :func:`engine_model_workloads`."""
    sz = size(quick)
    if workloads is None:
        workloads = engine_model_workloads(quick)
    return [
        Experiment(w, p, dict(params or {}) if p.startswith("topas") else {}, load=load, seed=s, n_tasks=sz.n_tasks,
                   engine_options=opts)
        for opts in ENGINE_MODELS.values()
        for w, p, s in itertools.product(workloads, PAPER_POLICIES, sz.seeds)
    ]


def sensitivity(
    workload: str = "dag-4",
    axes: Mapping[str, Sequence[object]] | None = None,
    load: float = 1.2,
    quick: bool = False,
) -> list[Experiment]:
    """TOPAS over a grid of its parameters (default: beta x rho, and rho x H_age) at one load."""
    sz = size(quick)
    axes = dict(axes or {"beta": (0.0, 0.5, 1.0, 2.0), "rho": (0.0, 0.5, 1.0, 2.0)})
    if quick:
        axes = {k: tuple(v)[:2] for k, v in axes.items()}
    names = list(axes)
    return [
        Experiment(workload, "topas", dict(zip(names, values)), load=load, seed=s, n_tasks=sz.n_tasks,
                   engine=default_engine())
        for values in itertools.product(*(axes[n] for n in names))
        for s in sz.seeds
    ]


# ----------------------------------------------------------------------------- robustness (notebook 14)

#: The policies that read what the knowledge settings degrade: output priors (SPF, TOPAS) and
#: DAGs beyond the ready stages (SPF's and TOPAS's remaining paths). FCFS, LPM and Autellix-LAS
#: read neither; Parrot-FCFS reads only the order of the ready stages, which ``online`` keeps.
#: For those the baseline run stands for every knowledge setting (``tests/test_knowledge.py``
#: checks that their results do not change).
KNOWLEDGE_POLICIES = ("spf", "topas", "topas-plus")
#: Notebook 14's policies: every registered baseline, TOPAS and TOPAS+ (ours; it reads output
#: priors and DAGs as TOPAS does).
ROBUST_POLICIES = PAPER_POLICIES + ("topas-plus",)


@dataclass(frozen=True)
class RobustnessSize:
    n_tasks: int
    seeds: tuple[int, ...]
    noise: tuple[float, ...]
    bias: tuple[float, ...]
    cvs: tuple[float, ...]


#: Sizes: TOPAS takes ~10-20 s per 100 MetaGPT tasks, so the full grid keeps 60 tasks and one
#: seed to add about 3 minutes to ``make reproduce`` on 2 cores (issue 16's budget).
ROBUST_FULL = RobustnessSize(n_tasks=60, seeds=(0,), noise=(0.5, 1.0), bias=(0.5, 2.0), cvs=(2.0, 4.0))
ROBUST_QUICK = RobustnessSize(n_tasks=16, seeds=(0,), noise=(1.0,), bias=(2.0,), cvs=(3.0,))
#: Notebook 14's quick workloads (what the tests run): one synthetic workload, the one with a load
#: override in :data:`ROBUST_LOAD_OVERRIDES`, and one MetaGPT trace (58 runs instead of 145 on all five).
ROBUST_QUICK_WORKLOADS = ("dag-10-wide", "metagpt-sop")


def robustness_workloads(quick: bool = False) -> tuple[str, ...]:
    """Notebook 14's workloads: every synthetic and MetaGPT workload (quick:
    :data:`ROBUST_QUICK_WORKLOADS`)."""
    return ROBUST_QUICK_WORKLOADS if quick else SYNTHETIC + METAGPT


def robustness_size(quick: bool) -> RobustnessSize:
    return ROBUST_QUICK if quick else ROBUST_FULL


#: Notebook 14's loads (x nominal rate): 0.8 where every policy is stable, lower where it is not
#: (on the stock-SGLang engine FCFS and SPF's last-quarter JCT on DAG-10-Wide is 2.6-3.1x the first
#: quarter's at 0.8; at 0.6 at most 1.44x with 150 tasks). Chosen by hand: issue 13's capacity
#: measurement does not exist yet.
ROBUST_LOAD = 0.8
ROBUST_LOAD_OVERRIDES: Mapping[str, float] = {"dag-10-wide": 0.6}


def robustness(
    workloads: Sequence[str] | None = None,
    load: float = ROBUST_LOAD,
    quick: bool = False,
    params: Mapping[str, object] | None = None,
    load_overrides: Mapping[str, float] | None = None,
) -> list[Experiment]:
    """Every policy under less knowledge, at a stable load (notebook 14, issue 16): ``load`` x each
    trace's nominal rate, or ``load_overrides[workload]`` (default :data:`ROBUST_LOAD_OVERRIDES`):

    * the reference: exact priors, full DAGs, Poisson arrivals (every policy);
    * ``prior_noise`` sigma in ``noise``, ``prior_bias`` B in ``bias``, ``online`` DAGs: the
      :data:`KNOWLEDGE_POLICIES` only (the others do not read what changes);
    * the same noise's largest sigma and every bias with ``output_estimator="prior"`` (SPF and
      TOPAS trusting the prior instead of learning from finished calls);
    * gamma arrivals of each CV in ``cvs`` (same mean rate): every policy.

    Every policy is :data:`ROBUST_POLICIES`. ``params`` apply to the TOPAS policies (merged
    under the knowledge runs' own). ``workloads``: default :func:`robustness_workloads`."""
    sz = robustness_size(quick)
    if workloads is None:
        workloads = robustness_workloads(quick)
    engine = default_engine()
    overrides = dict(ROBUST_LOAD_OVERRIDES if load_overrides is None else load_overrides)
    out: list[Experiment] = []

    def add(w: str, p: str, s: int, extra: Mapping[str, object] | None = None, **knowledge: object) -> None:
        base = dict(params or {}) if p.startswith("topas") else {}
        out.append(Experiment(w, p, {**base, **dict(extra or {})}, load=overrides.get(w, load), seed=s,
                              n_tasks=sz.n_tasks, engine=engine, **knowledge))

    for w, s in itertools.product(workloads, sz.seeds):
        for p in ROBUST_POLICIES:
            add(w, p, s)
            for cv in sz.cvs:
                add(w, p, s, arrivals=f"gamma:{cv:g}")
        for p in KNOWLEDGE_POLICIES:
            for sigma in sz.noise:
                add(w, p, s, prior_noise=sigma)
            for b in sz.bias:
                add(w, p, s, prior_bias=b)
            add(w, p, s, dag_visibility="online")
            add(w, p, s, {"output_estimator": "prior"}, prior_noise=max(sz.noise))
            for b in sz.bias:
                add(w, p, s, {"output_estimator": "prior"}, prior_bias=b)
    return out


# ----------------------------------------------------------------------------- gpu-afternoon


@dataclass(frozen=True)
class Afternoon:
    """The ``gpu-afternoon`` grid: what a real server measures first, in under 4 h of arrivals on one server (half an hour on 8).

    A replay takes its arrivals' span of wall time on any hardware (tasks are submitted at their
    arrival times), so the grid is sized in arrival time, not GPU work. Chosen from the simulator's
    results (the shipped ``data/results/sim`` pack and the same grid on the simulator; README,
    'Running on a GPU box'):

    * every synthetic workload and MetaGPT-TL (the paper's real workflow with the largest
      TOPAS-vs-baseline gap in the simulator), the first ``n_tasks[w]`` tasks of each;
    * one load, 1.4x the nominal rate: the load where the simulator's TOPAS and best baseline differ
      most on every one of these workloads (mean JCT, full grid: chain-3 -34 %, dag-4 +12 %,
      dag-10-wide +42 %, MetaGPT-TL +203 %);
    * TOPAS and ``topas-plus`` (ours, issue 13) against the baselines that are best somewhere
      at that load in the simulator: LPM (chain-3, MetaGPT-TL), Parrot-FCFS (dag-4, dag-10-wide at
      500 tasks) and SPF (dag-4 at this grid's 100 tasks); FCFS and Autellix-LAS trail them by 2-5x
      there and are left out to fit the afternoon;
    * one arrival seed (0): the afternoon buys breadth (workloads x policies), not spread.
    """

    n_tasks: tuple[tuple[str, int], ...] = (("chain-3", 100), ("dag-4", 100), ("dag-10-wide", 60),
                                            ("metagpt-tl", 24))
    load: float = 1.4
    policies: tuple[str, ...] = ("topas", "topas-plus", "lpm", "parrot-fcfs", "spf")
    seeds: tuple[int, ...] = (0,)


AFTERNOON = Afternoon()
#: The named grids ``scripts/reproduce.py --grid`` knows (``full`` and ``quick`` are the
#: paper-figure grids of :func:`size`; ``gpu-afternoon`` is :func:`gpu_afternoon`).
GRIDS = ("full", "quick", "gpu-afternoon")


def gpu_afternoon(tasks: int | None = None, engine: str | None = None) -> list[Experiment]:
    """The ``gpu-afternoon`` grid (:data:`AFTERNOON`); ``tasks`` overrides every workload's task
    count (e.g. a tiny smoke run). Policies not registered in this topas (``topas-plus`` before it
    exists) are left out."""
    from topas.policies import available_policies

    have = set(available_policies())
    a = AFTERNOON
    return [
        Experiment(w, p, load=a.load, seed=s, n_tasks=tasks or n, engine=engine or default_engine())
        for w, n in a.n_tasks for p in a.policies if p in have for s in a.seeds
    ]


def swept_policies() -> list[str]:
    """The registered policies a sweep over "every policy" runs: all but those that decide eviction
    themselves (:data:`studies.eviction.study.OWN_EVICTION`, TOPAS-both), which run in
    the eviction study with their own order; under the engine's default eviction they would only
    repeat another policy (TOPAS-both with LRU is TOPAS+)."""
    from studies.eviction.study import OWN_EVICTION
    from topas.policies import available_policies

    return [p for p in available_policies() if p not in OWN_EVICTION]


def results_table(quick: bool = False, engine: str | None = None, load: float = 1.2, seeds: int | None = None,
                  tasks: int | None = None, profile: str | None = None,
                  policies: Sequence[str] | None = None) -> list[Experiment]:
    """The runs of ``scripts/reproduce.py``'s results table: every synthetic workload under every
    swept policy (default; :func:`swept_policies`) at ``load``, seeds ``0..seeds-1`` (default 3; quick 1), the first
    ``tasks`` tasks (default 500; quick 100)."""
    from topas.engine.cost import DEFAULT_PROFILE

    seeds = seeds if seeds is not None else (1 if quick else 3)
    tasks = tasks if tasks is not None else (100 if quick else 500)
    return [Experiment(w, p, profile=profile or DEFAULT_PROFILE, load=load, seed=s, n_tasks=tasks,
                       engine=engine or default_engine())
            for w in SYNTHETIC for p in (policies or swept_policies()) for s in range(seeds)]


def named_grid(name: str, engine: str | None = None) -> list[Experiment]:
    """Every experiment of a named grid (:data:`GRIDS`): ``gpu-afternoon``, or the results table
    and the notebooks' grids of ``full`` / ``quick`` (what ``make pack ENGINE=sglang GRID=...`` packs)."""
    if name == "gpu-afternoon":
        return gpu_afternoon(engine=engine)
    if name not in GRIDS:
        raise ExperimentError(f"unknown grid {name!r}; grids: {', '.join(GRIDS)}")
    quick = name == "quick"
    return [*results_table(quick, engine), *notebook_grid(quick, engine)]


def one_run_per_policy(workloads: Sequence[str], policies: Sequence[str], load: float, seed: int,
                       n_tasks: int, params: Mapping[str, object] | None = None) -> list[Experiment]:
    """One experiment per workload x policy (``params`` go to the TOPAS policies only)."""
    return [
        Experiment(w, p, dict(params or {}) if p.startswith("topas") else {}, load=load, seed=seed, n_tasks=n_tasks,
                   engine=default_engine())
        for w in workloads
        for p in policies
    ]


def notebook_grid(quick: bool = False, engine: str | None = None) -> list[Experiment]:
    """The experiments the notebooks sweep on ``engine`` (04-07, 14 and 15: notebook 05's timed
    TOPAS runs, the ablations, the sensitivity grids, the mechanism runs, the robustness grid, and
    on the simulator the MetaGPT cache study and the eviction study), without duplicates: what ``make
    reproduce`` runs after its table, for the plan it prints. Notebook 11 compares the two
    *simulated* engines only and runs nothing on a server."""
    import os

    from studies.cache_study import cache_study_grid
    from studies.eviction.study import eviction_study_grid

    engine = engine or default_engine()
    old = os.environ.get(ENGINE_ENV)
    os.environ[ENGINE_ENV] = engine
    try:
        # notebooks 02, 03 and 08 read the protocol's grid (notebook 16, a simulator study, not
        # planned here); notebook 05 times TOPAS's decisions
        exps = [*overhead_runs(quick=quick),
                *ablations(("dag-4", "metagpt-tl"), load=1.2, quick=quick),
                *sensitivity("dag-4", {"beta": (0.0, 0.5, 1.0, 2.0), "rho": (0.0, 0.5, 1.0, 2.0)}, quick=quick),
                *sensitivity("dag-4", {"rho": (0.0, 0.5, 1.0, 2.0), "H_age": (15.0, 30.0, 60.0, 120.0)},
                             quick=quick),
                *robustness(quick=quick)]
        if engine == "sim":  # the cache models and eviction orders are the simulator's (notebook 03's cache
            # study and notebook 15 are not run on a server)
            exps += [*cache_study_grid(quick=quick), *eviction_study_grid(quick=quick)]
        exps += [e for e in one_run_per_policy(("dag-4", "dag-10-wide"), ("lpm", "spf", "parrot-fcfs", "topas"),
                                               1.2, 0, size(quick).n_tasks, {})]
    finally:
        if old is None:
            os.environ.pop(ENGINE_ENV, None)
        else:
            os.environ[ENGINE_ENV] = old
    seen: dict[Experiment, None] = {}
    for e in exps:
        seen.setdefault(dataclasses.replace(e, engine=engine), None)  # equal specs once
    return list(seen)
