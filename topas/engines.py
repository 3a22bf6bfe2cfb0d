"""The built-in engines: importing this module registers them (:mod:`topas.engine.registry`).

``sim`` (:mod:`topas.engine.sim_engine`), ``cluster`` (:mod:`topas.cluster.sim_engine`) and
``sglang`` (:mod:`topas.sglang.engine`). None of them imports SGLang or aiohttp here.
"""

# registration order is the order engines are listed in (the simulator first)
from topas.engine import sim_engine as _sim  # noqa: F401, I001  (registration)
from topas.cluster import sim_engine as _cluster  # noqa: F401  (registration)
from topas.sglang import engine as _sglang  # noqa: F401  (registration)
from topas.engine.registry import available_engines, get_engine, registered_engines  # noqa: E402

__all__ = ["available_engines", "get_engine", "registered_engines"]
