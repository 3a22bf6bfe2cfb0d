"""Several engines behind a router (issue 15; docs/cluster.md).

:class:`ClusterSimulator` runs N engines of the single-GPU engine model on one clock, each with
its own instance of a scheduling policy; a router (``topas.cluster.routers``) picks the engine of
each request when it becomes ready. :func:`simulate_cluster` is the one-call form.
"""

from topas.cluster.metrics import ClusterResult
from topas.cluster.routers import Router, RouterError, available_routers, make_router, router_class
from topas.cluster.simulator import ClusterSimulator, simulate_cluster

__all__ = ["ClusterResult", "ClusterSimulator", "Router", "RouterError", "available_routers", "make_router",
           "router_class", "simulate_cluster"]
