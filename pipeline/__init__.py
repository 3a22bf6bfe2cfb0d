"""The reproduction pipeline: what ``make reproduce`` and ``make figures`` run
(``scripts/reproduce.py``).

:mod:`.reproduce` the driver (the results table, then every notebook; plans, resume, Ctrl-C),
:mod:`.notebooks` the notebook runner (papermill, in reading order), :mod:`.results_table` the
synthetic-workload results table, :mod:`.results_doc` docs/results.md and the README's tables
from the files in ``figures/``. It imports the library and the studies; neither imports it.
"""
