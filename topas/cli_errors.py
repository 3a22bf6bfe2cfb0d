"""The one error path of the command line (``topas`` and ``scripts/reproduce.py``): an exception
that escapes a command becomes one line on stderr naming the item, and a non-zero exit status; the
traceback is shown only with ``--debug`` (or ``$TOPAS_DEBUG=1``).

Expected failures (bad input, a damaged file or store, a full disk, a misbehaving server) are
``ValueError``, ``OSError``, ``LookupError`` and ``RuntimeError`` (their subclasses: every topas
error, ``json``'s and Parquet's decoding errors, ``RecursionError``) and ``zlib.error``; they give
``error: <message>``. Anything else is a bug: it gives ``internal error: ...`` and asks for a
report, still in one line.
"""

from __future__ import annotations

import errno
import os
import zlib

__all__ = ["DEBUG_ENV", "EXIT_ERROR", "debug_enabled", "error_line", "is_expected"]

DEBUG_ENV = "TOPAS_DEBUG"
#: The exit status of a failure reported by :func:`error_line`.
EXIT_ERROR = 1
EXPECTED: tuple[type[BaseException], ...] = (ValueError, OSError, LookupError, RuntimeError, zlib.error)
_MAX = 400  # characters of a message kept on its one line


def debug_enabled(flag: bool = False) -> bool:
    """``--debug`` given, or ``$TOPAS_DEBUG`` set to anything but ``""``/``0``."""
    return flag or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def is_expected(e: BaseException) -> bool:
    """Whether ``e`` is a failure a user can meet (see the module docstring), not a bug."""
    return isinstance(e, EXPECTED)


def _oserror_text(e: OSError) -> str:
    what = e.strerror or str(e)
    if e.errno == errno.ENOSPC:
        what = "no space left on device (free some space and run the same command again: finished work is kept)"
    names = [str(n) for n in (e.filename, e.filename2) if n is not None]
    return f"{' -> '.join(names)}: {what}" if names else what


def error_line(e: BaseException) -> str:
    """The one line that reports ``e``: ``error: ...`` for an expected failure, ``internal error:
    ...`` for anything else; newlines folded, at most 400 characters of message."""
    if isinstance(e, OSError):
        text = _oserror_text(e)
    elif isinstance(e, RecursionError):
        text = "input nested too deeply to process"
    elif isinstance(e, KeyError) and e.args:
        text = str(e.args[0])
    else:
        text = str(e) or type(e).__name__
    text = " ".join(text.split())
    if len(text) > _MAX:
        text = text[: _MAX - 3] + "..."
    if is_expected(e):
        return f"error: {text}"
    return (f"internal error: {type(e).__name__}: {text} (a bug in topas: please report it; "
            f"--debug or {DEBUG_ENV}=1 shows the traceback)")
