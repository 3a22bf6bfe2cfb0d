"""The cluster simulator as a registered engine: ``cluster`` (:mod:`topas.engine.registry`).

``engines`` identical simulated engines, each with its own instance of the experiment's policy,
behind its router (:func:`topas.cluster.simulator.simulate_cluster`). Experiments do not name it:
an experiment on ``sim`` with a router runs here (``SimEngine.cluster``), and its key's code
covers ``topas/cluster`` as well.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topas.cluster.simulator import simulate_cluster
from topas.engine.registry import Engine, PreparedRun, register
from topas.provenance import CODE_PACKAGES

if TYPE_CHECKING:  # pragma: no cover
    from topas.cluster.metrics import ClusterResult

__all__ = ["ClusterSimEngine"]


class ClusterSimEngine(Engine):
    """N simulated engines on one clock behind a router."""

    name = "cluster"
    label = "the cluster simulator"
    code = (*CODE_PACKAGES, "cluster")
    options = True
    listed = False

    def run(self, prepared: PreparedRun, progress: bool = False) -> "ClusterResult":
        """Run the prepared trace on ``experiment.engines`` engines, the prepared policy on the
        first and a fresh instance (``experiment.make_policy()``) on each other one."""

        p = prepared
        exp = p.experiment
        policies = [p.policy, *(exp.make_policy() for _ in range(exp.engines - 1))]
        return simulate_cluster(p.trace, policies, p.router, p.cost, p.config, knowledge=p.knowledge,
                                seed=exp.seed, progress=progress)


register(ClusterSimEngine())
