"""The results store: one directory of Parquet tables per experiment, keyed by its key.

This module is the store's public face; the work is done in

* :mod:`topas.experiments.result_store`: :class:`ResultStore` (reading, writing, the checks on read);
* :mod:`topas.experiments.sweep`: :func:`run_sweep` and :func:`ensure_stored` (run what a store lacks);
* :mod:`topas.experiments.store_meta`: a result's ``meta.json`` (written, and read back as a
  summary row or the :func:`experiment_of` it describes);
* :mod:`topas.experiments.store_layout`: file names, environment variables, the default root and
  the shipped packs.

Layout (``root`` defaults to ``data/results/store``)::

    <root>/<key[:2]>/<key>/tasks.parquet          the SimResult tables, zstd-compressed
                           requests.parquet
                           decisions.parquet
                           prefix_events.parquet
                           timeline.parquet
                           meta.json              spec, key, canonical inputs, summary, provenance

``key`` is :meth:`topas.experiments.Experiment.key`, which covers everything a result depends on
(trace bytes, resolved parameters, resolved rate, seed, profile numbers, engine, and the source
code of the engine, policies and workload packages), so a changed trace, profile, parameter or
line of that code gets a new key and never reuses a stale result.

Writes are atomic: :meth:`ResultStore.put` writes every file into ``<root>/.tmp-<key>-<pid>``
(``meta.json`` last), then renames that directory to its final place. A directory without
``meta.json`` (or a left-over ``.tmp-*``) is never taken as a result. A killed sweep therefore
loses at most the runs in flight; :func:`run_sweep` re-run on the same store runs only the
experiments that are missing. Each worker process writes its own result, so results already
finished survive the parent being killed.

``meta.json`` also records ``topas_version``, ``git_commit`` (``git rev-parse HEAD`` of the
repository, ``"unknown"`` outside git), ``git_dirty`` (whether the working tree had changes),
``environment`` (:func:`topas.provenance.environment`: the versions of Python, numpy, pandas,
pyarrow, matplotlib, seaborn, networkx and topas, commit and dirty flag), ``profile_hash``,
``engine`` and ``created`` (UTC, ISO 8601). The key itself covers the code
(:func:`topas.provenance.engine_fingerprint`), so a result of edited code is never served for
the committed code, nor the reverse.

**Shipped results (packs).** The repository ships the results of the full grid as read-only
*packs*, one per engine: ``data/results/sim/`` (and ``data/results/sglang/`` once GPU-box runs
are committed), laid out like a store plus a ``manifest.json`` (``scripts/pack_results.py``
writes them). The default store (``ResultStore()``) looks in ``data/results/store`` first and then
in the packs, so a fresh clone re-renders every figure without simulating; new results are always
written to ``data/results/store``, never into a pack. To keep the repository small a pack holds
every experiment's summary and ``tasks`` table, the ``requests`` table of arrival seed 0, and every
table only of the experiments whose full tables the notebooks read (``scripts/pack_results.py``);
loading a table a pack left out raises :class:`TrimmedResult`, naming it.

**Verified on read (issue 44).** ``meta.json`` records the sha256 and size of every table
(``"checksums"``); a result is checked before it is served (:mod:`topas.experiments.verify`, once
per process while its files are unchanged): a table missing, damaged, truncated or swapped, or an
unreadable ``meta.json``, makes it *damaged*: a :class:`DamagedResultWarning` names it and it is
treated as absent (:meth:`ResultStore.has` is False, a sweep re-runs it and :meth:`ResultStore.put`
replaces it). A pack's ``meta.json`` records the checksums of the tables the pack ships only
(none for a run it ships the summary of alone), and each of those is checked; results written
before the checksums are checked structurally: every table they should hold (all of them, or those
the pack's manifest lists) is present and a whole Parquet file. :meth:`ResultStore.put` also removes the temporary folders of writers that
were killed (:meth:`ResultStore.clean_tmp`).

**Store-only mode.** With ``$TOPAS_STORE_ONLY=1`` (``make figures`` sets it) :func:`run_sweep`
runs nothing: a missing result raises :class:`MissingResults` naming the experiments.
``$TOPAS_STORE_LOG=<file>`` appends ``sweep <key>`` for every experiment a sweep returns
(``summary <key>`` for a sweep that uses only the summaries: ``run_sweep(..., tables=False)``) and
``load <key>`` for every full load, which is how ``scripts/pack_results.py`` learns what to ship.
``$TOPAS_STORE=<dir>`` moves the default store's root (the working store) elsewhere.
``$TOPAS_USE_PACKS=0`` makes the default store ignore the packs (``make reproduce`` sets it, so a
reproduction simulates everything instead of reading the shipped results).
"""

from topas.experiments.result_store import DamagedResultWarning, ResultStore, TrimmedResult
from topas.experiments.store_layout import (
    MANIFEST,
    META,
    STORE_ENV,
    STORE_LOG_ENV,
    STORE_ONLY_ENV,
    TABLES,
    USE_PACKS_ENV,
    default_packs,
    default_store_root,
)
from topas.experiments.store_meta import experiment_of
from topas.experiments.sweep import MissingResults, ensure_stored, run_sweep
from topas.provenance import git_commit

__all__ = [
    "DamagedResultWarning",
    "MANIFEST",
    "META",
    "MissingResults",
    "ResultStore",
    "STORE_ENV",
    "STORE_LOG_ENV",
    "STORE_ONLY_ENV",
    "TABLES",
    "TrimmedResult",
    "USE_PACKS_ENV",
    "default_packs",
    "default_store_root",
    "ensure_stored",
    "experiment_of",
    "git_commit",
    "run_sweep",
]
