"""Where a result comes from: the code that produced it and the environment it ran in.

* :func:`code_fingerprint`: sha256 over the source files of the packages that produce an
  engine's result (:data:`ENGINE_CODE`): every file under ``topas/<package>/`` except Python
  caches, in sorted relative-path order, each hashed as its path, its length and its bytes. It is
  part of every experiment's key (:meth:`topas.experiments.Experiment.canonical`), so any edit to
  that code (a policy tweaked, the simulator fixed, even a comment) gives new keys and a sweep
  runs again instead of reusing a stale result. Computed once per process and package set.
* :func:`environment`: the versions of Python and the libraries a result or a figure depends on,
  the ``topas`` version, the git commit and whether the working tree was dirty. Every stored
  result's ``meta.json``, the shipped pack's manifest and ``scripts/reproduce.py``'s inputs file
  record it.

A dirty tree is *recorded*, not refused, for a result: the fingerprint already tells a result of
edited code from one of the committed code, and the dirty flag says the commit alone cannot
rebuild it. "Dirty" means changed outside :data:`OUTPUT_PATHS` (``figures/`` and
``data/results/``, what a reproduction writes while it runs), so a reproduction started from a
clean commit records clean results although it rewrites the figures as it goes. Packing the
shipped results (``scripts/pack_results.py``) refuses a dirty tree unless told otherwise.
"""

from __future__ import annotations

import functools
import hashlib
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import topas

__all__ = ["CODE_PACKAGES", "ENGINE_CODE", "code_fingerprint", "engine_fingerprint", "environment",
           "dirty_entries", "git_commit", "git_dirty", "versions", "VERSIONED", "OUTPUT_PATHS", "MEASURED_ON_ENV"]

PACKAGE_DIR = Path(__file__).resolve().parent
#: The sub-packages whose code produces a simulated result: the workload model and arrivals, the
#: engine (cost model, KV memory, simulator, metrics) and the policies.
CODE_PACKAGES = ("engine", "policies", "workload")
#: Per engine (:data:`topas.experiments.spec.ENGINES`), the sub-packages its results depend on:
#: the simulator's are :data:`CODE_PACKAGES`; a replay on a real server (``sglang``) adds the
#: replay client and the scheduler plugin (``topas/sglang``).
ENGINE_CODE: dict[str, tuple[str, ...]] = {
    "sim": CODE_PACKAGES,
    "sglang": (*CODE_PACKAGES, "sglang"),
}
#: Set (by ``scripts/reproduce.py --engine sglang``) to the SGLang server's short identity: the
#: figures and tables then say they were measured there (``topas.plots.captions.measured_caption``).
MEASURED_ON_ENV = "TOPAS_MEASURED_ON"
#: Distributions whose versions :func:`versions` records (besides Python).
VERSIONED = ("numpy", "pandas", "pyarrow", "matplotlib", "seaborn", "networkx", "topas")


def _source_files(root: Path) -> list[Path]:
    return sorted((p for p in root.rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")),
                  key=lambda p: p.relative_to(root).as_posix())


@functools.lru_cache(maxsize=None)
def code_fingerprint(packages: tuple[str, ...] = CODE_PACKAGES, package_dir: Path = PACKAGE_DIR) -> str:
    """sha256 (hex) of the source of ``topas/<p>/`` for each ``p`` in ``packages`` (see the
    module docstring); ``ValueError`` naming a package that does not exist."""
    h = hashlib.sha256()
    for name in sorted(set(packages)):
        root = package_dir / name
        if not root.is_dir():
            raise ValueError(f"code_fingerprint: no package topas/{name} in {package_dir}")
        for path in _source_files(root):
            data = path.read_bytes()
            rel = path.relative_to(package_dir).as_posix().encode()
            h.update(len(rel).to_bytes(8, "big") + rel + len(data).to_bytes(8, "big") + data)
    return h.hexdigest()


def engine_fingerprint(engine: str) -> str:
    """:func:`code_fingerprint` of the packages ``engine``'s results depend on (:data:`ENGINE_CODE`)."""
    try:
        packages = ENGINE_CODE[engine]
    except KeyError:
        raise ValueError(f"unknown engine {engine!r}; engines: {', '.join(ENGINE_CODE)}") from None
    return code_fingerprint(packages)


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(PACKAGE_DIR.parent), *args], capture_output=True, text=True,
                             timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """``git rev-parse HEAD`` of the repository the package runs from, or ``"unknown"`` (e.g. a
    wheel install)."""
    sha = (_git("rev-parse", "HEAD") or "").strip()
    return sha if len(sha) == 40 else "unknown"


#: Folders (relative to the repository root) that a reproduction writes: changes there do not make
#: the tree dirty.
OUTPUT_PATHS = ("figures", "data/results")


def dirty_entries() -> list[str] | None:
    """``git status --porcelain`` lines of the changes outside :data:`OUTPUT_PATHS` (tracked
    changes and untracked files that git does not ignore); ``None`` outside git."""
    out = _git("status", "--porcelain", "--", ":(top)", *(f":(top,exclude){p}" for p in OUTPUT_PATHS))
    return None if out is None else [line for line in out.splitlines() if line.strip()]


@functools.lru_cache(maxsize=1)
def git_dirty() -> bool | None:
    """Whether the working tree differs from ``HEAD`` outside :data:`OUTPUT_PATHS`
    (:func:`dirty_entries`); ``None`` outside git."""
    entries = dirty_entries()
    return None if entries is None else bool(entries)


def versions() -> dict[str, str]:
    """``{"python": "3.11.7", "numpy": ..., ...}`` for Python and :data:`VERSIONED`
    (``"not installed"`` for a missing one); read once per process (every stored result records
    them, and reading a distribution's metadata costs more than a short run's bookkeeping)."""
    return dict(_versions())


@functools.lru_cache(maxsize=1)
def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in VERSIONED:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    if out["topas"] == "not installed":  # run from a checkout without installing

        out["topas"] = topas.__version__
    return out


def environment() -> dict[str, Any]:
    """:func:`versions` plus ``git_commit`` and ``git_dirty``: what a result's provenance records."""
    return {**versions(), "git_commit": git_commit(), "git_dirty": git_dirty()}
