"""Several engines behind a router (notebook 13): :mod:`.grid` the grids, :mod:`.tables` the
tables, :mod:`.plots` the figures. The cluster simulator and the routers are the library's
(:mod:`topas.cluster`)."""
