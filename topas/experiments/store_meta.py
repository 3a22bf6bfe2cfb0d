"""A stored result's ``meta.json``: what :meth:`~topas.experiments.result_store.ResultStore.put`
writes, and what is read back from it (a summary row, the :class:`Experiment` it describes).

``meta.json`` holds the spec, the key, the canonical inputs, the summary and the provenance:
``topas_version``, ``git_commit`` (``git rev-parse HEAD`` of the repository, ``"unknown"``
outside git), ``git_dirty`` (whether the working tree had changes), ``environment``
(:func:`topas.provenance.environment`), ``profile_hash``, ``engine``, ``created`` (UTC, ISO 8601)
and the checksums of the tables (:mod:`topas.experiments.verify`).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
from pathlib import Path
from typing import Any, Mapping

import topas
from topas.engine.config import EngineConfig
from topas.engines import get_engine
from topas.experiments.spec import ENGINES, KNOWLEDGE_FIELDS, Experiment
from topas.experiments.verify import CHECKSUMS
from topas.provenance import environment, git_commit, git_dirty

__all__ = ["PROVENANCE_COLUMNS", "experiment_of", "result_meta", "summary_row", "write_meta"]

#: The columns :meth:`ResultStore.summaries` adds to a summary row: where the result came from.
PROVENANCE_COLUMNS = ("topas_version", "git_commit", "git_dirty", "profile_hash", "created")


def result_meta(exp: Experiment, result: Any, checksums: Mapping[str, Any]) -> dict[str, Any]:
    """The ``meta.json`` of ``result`` (a SimResult) of ``exp``, whose tables have ``checksums``."""
    canonical = exp.canonical()
    return {
        "key": exp.key(),
        "label": exp.label(),
        "experiment": exp.fields(),
        "canonical": canonical,
        "summary": dict(result.summary),
        "topas_version": getattr(topas, "__version__", "unknown"),
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
        "environment": environment(),
        "profile_hash": canonical["profile_hash"],
        "engine": exp.engine,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        CHECKSUMS: dict(checksums),
    }


def write_meta(path: Path, meta: Mapping[str, Any]) -> None:
    """Write ``meta`` to ``path`` and flush it to disk."""
    with open(path, "w") as f:
        json.dump(meta, f, indent=1, default=_json_default)  # insertion order: the summary keeps its column order
        f.flush()
        os.fsync(f.fileno())


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    return str(o)


def summary_row(meta: Mapping[str, Any], provenance: bool = True) -> dict[str, Any]:
    """One summary row from a meta.json, laid out like :func:`topas.experiments.local.run_row`
    plus (``provenance=True``) the provenance columns."""
    spec = meta["experiment"]
    row: dict[str, Any] = {"key": meta["key"]}
    for k in ("workload", "policy", "params", "profile", "engine", "kv_budget", "load"):
        row[k] = spec[k]
    row["engine_model"] = spec.get("engine_model", "stock")
    row["rate_given"] = spec["rate"]
    row["rate"] = meta["canonical"]["rate"]
    row["seed"] = spec["seed"]
    row["n_tasks_limit"] = spec["n_tasks"]
    for k, default in KNOWLEDGE_FIELDS.items():  # absent from results stored before issue 16
        row[k] = spec.get(k, default)
    summary = dict(meta["summary"])
    summary.pop("policy", None)
    row.update(summary)
    if provenance:
        for k in PROVENANCE_COLUMNS:
            row[k] = meta.get(k)
    return row


def experiment_of(meta: Mapping[str, Any]) -> Experiment:
    """The :class:`Experiment` a stored result's ``meta.json`` describes: its spec, the knowledge
    settings (defaults when the result predates them), for the simulator the engine options (the
    fields of its ``engine_config`` that differ from the default, stock-SGLang one) and, for a
    cluster, its engines, router and router parameters (issue 15). Its key
    equals the stored one exactly when nothing it depends on (inputs or code) has changed."""
    s = meta["experiment"]
    opts: dict[str, Any] = {}
    if s["engine"] in ENGINES and get_engine(s["engine"]).options:  # the simulator's engine options
        default = json.loads(json.dumps(dataclasses.asdict(EngineConfig())))
        stored = meta["canonical"].get("engine_config") or {}
        opts = {k: v for k, v in stored.items() if k in default and default[k] != v and k != "kv_budget"}
    # a spec has the cluster columns only for a cluster (Experiment.spec); router_params as JSON, as params
    cluster = ({"engines": s["engines"], "router": s["router"], "router_params": json.loads(s["router_params"])}
               if "router" in s else {})
    return Experiment(s["workload"], s["policy"], json.loads(s["params"]), profile=s["profile"], rate=s["rate"],
                      load=s["load"], seed=s["seed"], n_tasks=s["n_tasks"], engine=s["engine"],
                      kv_budget=s["kv_budget"], engine_options=opts,
                      **{k: s.get(k, v) for k, v in KNOWLEDGE_FIELDS.items()}, **cluster)
