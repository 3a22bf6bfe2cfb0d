"""Which KV the engine evicts (notebook 15): :mod:`.study` the grid and its tables, :mod:`.plots`
the figures. The eviction strategies are the engine's (:mod:`topas.engine.eviction`)."""
