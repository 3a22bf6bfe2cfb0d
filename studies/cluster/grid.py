"""Notebook 13's grids: several engines behind a router (the notebook imports this module as
``grid``: ``grid.cluster_grid``, ``grid.CLUSTER_FULL``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from studies.claims.grid import claim_policies
from topas.experiments.spec import Experiment


@dataclass(frozen=True)
class ClusterSize:
    """Notebook 13's sizes. JCT vs load: every router on each workload of ``workloads`` (pairs of
    a workload and its engine counts) with ``policies`` inside the engines, at ``loads`` per engine
    (the experiment's load is ``load x engines``: each engine is offered the trace's nominal rate
    times ``load``), ``tasks_per_engine`` tasks per engine. Scaling: ``scaling_runs`` (router,
    policy) pairs on DAG-4 at ``scaling_load`` per engine, at ``scaling_engines`` engines with
    ``scaling_tasks`` x N / max(``scaling_engines``) tasks (10,000 at 64 engines, from the 10,000-task
    DAG-4 trace :data:`SCALING_TRACE`). One arrival seed.

    Why these sizes: a cluster run costs about the engines times a single engine's, and the grid
    has every router x policy (30 per point), so the full grid keeps DAG-10-Wide (the costlier
    workload, 10 agents: more prefixes than engines) to 4 engines; 100 tasks per engine show a
    growing queue at 1.1x per engine (the stability indicators) but not its long-run JCT."""

    workloads: tuple[tuple[str, tuple[int, ...]], ...]
    loads: tuple[float, ...]
    tasks_per_engine: int
    policies: tuple[str, ...]
    scaling_engines: tuple[int, ...]
    scaling_tasks: int
    scaling_load: float
    scaling_runs: tuple[tuple[str, str], ...]
    seeds: tuple[int, ...] = (0,)

    @property
    def engines(self) -> tuple[int, ...]:
        """Every engine count of the JCT-vs-load grid."""
        return tuple(sorted({n for _, ns in self.workloads for n in ns}))


CLUSTER_FULL = ClusterSize(workloads=(("dag-4", (2, 4, 8)), ("dag-10-wide", (4,))), loads=(0.5, 0.8, 1.1),
                           tasks_per_engine=100, policies=("fcfs", "lpm", "topas"),
                           scaling_engines=(2, 4, 8, 16, 32, 64), scaling_tasks=10_000, scaling_load=0.8,
                           scaling_runs=(("least-load", "fcfs"), ("topas", "topas")))
CLUSTER_QUICK = ClusterSize(workloads=(("dag-4", (2,)),), loads=(0.8,), tasks_per_engine=15,
                            policies=("fcfs", "topas"), scaling_engines=(2, 4), scaling_tasks=80, scaling_load=0.8,
                            scaling_runs=(("least-load", "fcfs"),))


def cluster_size(quick: bool) -> ClusterSize:
    return CLUSTER_QUICK if quick else CLUSTER_FULL


def cluster_grid(quick: bool = False, routers: Sequence[str] | None = None) -> list[Experiment]:
    """Notebook 13's JCT-vs-load grid (:class:`ClusterSize`): every router (default: all
    registered, :func:`topas.cluster.available_routers`) x policy inside the engines x engine
    count x load per engine, on the simulator (a cluster has no ``sglang`` engine: real servers
    behind a real router are ``make test-cluster``)."""
    from topas.cluster import available_routers

    sz = cluster_size(quick)
    routers = list(routers or available_routers())
    return [Experiment(w, p, load=round(load * n, 6), seed=s, n_tasks=sz.tasks_per_engine * n, engines=n, router=r,
                       engine="sim")
            for w, ns in sz.workloads for n in ns for load in sz.loads for r in routers
            for p in claim_policies(sz.policies) for s in sz.seeds]


#: DAG-4 with 10,000 tasks (``data/traces/dag-4-10k.json.gz``; ``dag-4`` has 1,000).
SCALING_TRACE = "dag-4-10k"


def cluster_scaling_grid(quick: bool = False) -> list[Experiment]:
    """Notebook 13's scaling runs: simulation time against the number of engines, the tasks
    growing with it (:attr:`ClusterSize.scaling_tasks` x N / 64 DAG-4 tasks, from
    :data:`SCALING_TRACE`; quick: ``dag-4``)."""
    sz = cluster_size(quick)
    return [Experiment(SCALING_TRACE if not quick else "dag-4", p, load=round(sz.scaling_load * n, 6), seed=0,
                       n_tasks=max(1, round(sz.scaling_tasks * n / max(sz.scaling_engines))), engines=n, router=r,
                       engine="sim")
            for r, p in sz.scaling_runs for n in sz.scaling_engines]
