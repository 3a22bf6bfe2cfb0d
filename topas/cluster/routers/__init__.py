"""Routers behind one interface (``topas.cluster.routers.base.Router``), one module per router.

Importing this package registers every built-in router by name; use ``make_router(name, ...)``.
"""

from topas.cluster.routers.base import (
    Router,
    RouterError,
    available_routers,
    make_router,
    register,
    router_class,
)
from topas.cluster.routers import (  # noqa: F401  (registration)
    autellix_locality,
    flowguard,
    kairos,
    least_load,
    power_of_two,
    prefixplace,
    round_robin,
    sglang_cache_aware,
    topas_router,
    wasma,
)

__all__ = ["Router", "RouterError", "available_routers", "make_router", "register", "router_class"]
