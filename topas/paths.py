"""Where the repository's data lives.

The package is installed editable from the repository, so ``data/`` is found next to the
``topas/`` folder. ``TOPAS_DATA`` overrides it (e.g. to point a notebook at another results store).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    """The ``data/`` folder: ``$TOPAS_DATA`` if set, else ``<repo>/data``."""
    return Path(os.environ.get("TOPAS_DATA", REPO_ROOT / "data"))


def traces_dir() -> Path:
    return data_dir() / "traces"


def profiles_dir() -> Path:
    return data_dir() / "profiles"
