"""Where the repository's data lives.

The package is meant to be installed editable from a clone of the repository (``make install``),
so ``data/`` (traces, engine profiles, shipped results) is found next to the ``topas/`` folder.
``$TOPAS_DATA`` overrides it: point it at a clone's ``data/`` folder when ``topas`` is installed
from a wheel (a wheel carries the code only), or at another folder of results for a notebook.

:func:`traces_dir` and :func:`profiles_dir` raise :class:`DataNotFound`, saying exactly this,
when the folder does not exist, instead of a later "available traces: (none)".
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_ENV = "TOPAS_DATA"

__all__ = ["DATA_ENV", "DataNotFound", "REPO_ROOT", "data_dir", "profiles_dir", "traces_dir"]


class DataNotFound(FileNotFoundError):
    """The data folder (or its ``traces/`` / ``profiles/``) is missing; the message says how to
    point ``topas`` at one."""


def data_dir() -> Path:
    """The ``data/`` folder: ``$TOPAS_DATA`` if set, else ``<repo>/data``."""
    env = os.environ.get(DATA_ENV, "").strip()
    return Path(env) if env else REPO_ROOT / "data"


def _required(sub: str) -> Path:
    d = data_dir() / sub
    if not d.is_dir():
        if os.environ.get(DATA_ENV, "").strip():
            where = f"${DATA_ENV}={os.environ[DATA_ENV]} has no {sub}/ folder"
        else:
            where = (f"{d} does not exist: this topas is installed without the repository's data/ "
                     f"(a wheel carries the code only)")
        raise DataNotFound(
            f"topas cannot find its {sub}: {where}. Use a clone of the repository (`make install`, or "
            f"`pip install -e .` in it), or set {DATA_ENV} to the data/ folder of a clone.")
    return d


def traces_dir() -> Path:
    """``data/traces`` (:class:`DataNotFound` when missing)."""
    return _required("traces")


def profiles_dir() -> Path:
    """``data/profiles`` (:class:`DataNotFound` when missing)."""
    return _required("profiles")


def umask() -> int:
    """The process's umask (from /proc where there is one: os.umask can only read it by setting it,
    which races with other threads creating files)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def usual_mode(path: str | os.PathLike[str]) -> None:
    """Give ``path`` the mode a plain ``open``/``mkdir`` would (0666/0777 less the umask, so 0644 /
    0755 by default): ``tempfile.mkstemp``/``mkdtemp`` make their files private (0600/0700), which a
    temporary-then-rename write would otherwise keep."""
    base = 0o777 if os.path.isdir(path) else 0o666
    os.chmod(path, base & ~umask())
