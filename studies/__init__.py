"""The studies: one notebook's analysis each (its grid, tables and figures), apart from the library.

Each notebook's first code cell imports its study, so a reader finds the code from there:

=====================  ============================================================================
notebook               study
=====================  ============================================================================
02, 03, 08, 16         :mod:`studies.protocol_runs` (the protocol's final runs, load curves, collapses,
                       overload marks, figures); 03 also :mod:`studies.cache_study`; 08 also
                       :mod:`studies.paper_compare`
04-07, 11, 14          :mod:`studies.grid` (their grids), :mod:`studies.analysis` (their tables),
                       :mod:`studies.mechanism_plots` (05-08, 11), :mod:`studies.robustness_plots` (14);
                       06 also :mod:`studies.plan_study` and :mod:`studies.protocol_runs.overload_marks`
09                     :mod:`studies.explorer`
12                     :mod:`studies.claims`
13                     :mod:`studies.cluster`
15                     :mod:`studies.eviction`
=====================  ============================================================================

Notebooks 01 and 10 need no study: they call the library (``topas.plots``, ``topas.fidelity``).
A study may import the library and other studies; nothing in ``topas/`` imports a study
(``tests/test_imports.py``). The policy and workload sets every study uses are :mod:`topas.sets`.
"""
