"""The built-in engines: importing this module registers them (:mod:`topas.engine.registry`).

``sim`` (:mod:`topas.engine.sim_engine`), ``cluster`` (:mod:`topas.cluster.sim_engine`) and
``sglang`` (:mod:`topas.sglang.engine`). None of them imports SGLang or aiohttp here.
"""

from topas.engine.registry import available_engines, get_engine, registered_engines

# the order of registration is the order engines are listed in: the simulator first
from topas.engine import sim_engine as _sim  # noqa: E402, F401, I001  (registers "sim")
from topas.cluster import sim_engine as _cluster  # noqa: E402, F401  (registers "cluster")
from topas.sglang import engine as _sglang  # noqa: E402, F401  (registers "sglang")

__all__ = ["available_engines", "get_engine", "registered_engines"]
