"""Where the results store lives and how it is laid out (:mod:`topas.experiments.store`).

The file names of a stored result (:data:`TABLES`, :data:`META`) and of a pack's
:data:`MANIFEST`, the environment variables that move or restrict the default store, the default
store's root (:func:`default_store_root`) and the shipped read-only packs
(:func:`default_packs`, and which tables a pack's manifest says it kept), and the store log
(``$TOPAS_STORE_LOG``) that tells ``scripts/pack_results.py`` what to ship.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from topas.experiments.spec import ENGINES
from topas.paths import data_dir

__all__ = [
    "MANIFEST",
    "META",
    "PACK_ENGINES",
    "STORE_ENV",
    "STORE_LOG_ENV",
    "STORE_ONLY_ENV",
    "TABLES",
    "USE_PACKS_ENV",
    "default_packs",
    "default_store_root",
]

#: The SimResult tables the store keeps, one Parquet file each.
TABLES = ("tasks", "requests", "decisions", "prefix_events", "timeline")
META = "meta.json"
MANIFEST = "manifest.json"
TMP_PREFIX = ".tmp-"
#: Engines whose shipped packs the default store reads, in this order (``data/results/<engine>``):
#: the engines an experiment may name (the simulator first).
PACK_ENGINES = ENGINES
STORE_ONLY_ENV = "TOPAS_STORE_ONLY"
STORE_ENV = "TOPAS_STORE"
STORE_LOG_ENV = "TOPAS_STORE_LOG"
USE_PACKS_ENV = "TOPAS_USE_PACKS"


def default_store_root() -> Path:
    """``$TOPAS_STORE`` when set, else ``data/results/store`` (under ``$TOPAS_DATA`` when set)."""
    root = os.environ.get(STORE_ENV, "").strip()
    return Path(root) if root else data_dir() / "results" / "store"


def default_packs() -> list[Path]:
    """The shipped read-only packs that exist: ``data/results/<engine>`` for each engine; none
    when ``$TOPAS_USE_PACKS=0`` (``make reproduce`` sets it, so that it simulates everything)."""
    if os.environ.get(USE_PACKS_ENV, "1") == "0":
        return []
    packs = [data_dir() / "results" / engine for engine in PACK_ENGINES]
    return [p for p in packs if (p / MANIFEST).is_file()]


def pack_tables(pack: Path) -> dict[str, list[str]]:
    """The tables a pack's manifest says it kept, by key (``{}`` if it lists none)."""
    return _pack_tables_cached(str(pack), (pack / MANIFEST).stat().st_mtime_ns if (pack / MANIFEST).is_file() else 0)


@functools.lru_cache(maxsize=8)
def _pack_tables_cached(pack: str, _mtime: int) -> dict[str, list[str]]:
    try:
        manifest = json.loads((Path(pack) / MANIFEST).read_text())
        return {e["key"]: list(e.get("tables", [])) for e in manifest.get("experiments", [])}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}


def log(kind: str, key: str) -> None:
    """Append ``<kind> <key>`` to the store log (``$TOPAS_STORE_LOG``), if one is set."""
    path = os.environ.get(STORE_LOG_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{kind} {key}\n")
