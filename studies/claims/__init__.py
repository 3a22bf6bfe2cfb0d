"""When the paper's claim holds (notebook 12): :mod:`.grid` the grids (operating points set by the
best baseline's capacity, the space of readings, the ablations), :mod:`.tables` the tables,
:mod:`.headroom` lower bounds on any scheduler's mean JCT, :mod:`.readings` every choice the paper
leaves open as a named axis, :mod:`.plots` the figures."""
