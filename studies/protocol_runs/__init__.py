"""The protocol's final runs (notebook 16; its grid also serves notebooks 02, 03 and 08;
docs/protocol.md): :mod:`.study` the grid and the capacity, verdict, overload and convergence
tables, :mod:`.curves` the runs against load (02, 03), :mod:`.collapse` collapses that are not
monotone in load (``scripts/trace_collapse.py``), :mod:`.overload_marks` a table's runs marked past
capacity (06), :mod:`.plots` the figures. The statistics are the library's
(:mod:`topas.experiments.protocol`)."""
