"""Which SGLang servers the ``sglang`` engine replays on: ``$TOPAS_SGLANG_URL``.

Imports neither SGLang nor aiohttp, so the experiment layer can name a missing server on a
machine without them.
"""

from __future__ import annotations

import os

from topas.errors import ExperimentError
from topas.sglang.server import ServerError, parse_servers

__all__ = ["SGLANG_IDENTITY_ENV", "SGLANG_URL_ENV", "sglang_urls"]

#: The SGLang server that ``engine="sglang"`` experiments replay on (``topas serve`` prints it).
SGLANG_URL_ENV = "TOPAS_SGLANG_URL"

#: The identity (JSON of :class:`topas.sglang.server.ServerIdentity`) that ``engine="sglang"`` keys
#: use when no server is named: to find stored measured results without a server
#: (``make figures ENGINE=sglang``; ``scripts/reproduce.py`` sets it from the store).
SGLANG_IDENTITY_ENV = "TOPAS_SGLANG_IDENTITY"


def sglang_urls() -> list[str]:
    """The server URLs from ``$TOPAS_SGLANG_URL`` (comma-separated: several identical servers
    share a sweep); :class:`~topas.errors.ExperimentError` when unset or malformed."""

    text = os.environ.get(SGLANG_URL_ENV, "").strip()
    if not text:
        raise ExperimentError(
            f"engine 'sglang' replays on a running SGLang server: start one with `topas serve --policy "
            f"<name> -- <sglang args>` and set {SGLANG_URL_ENV}=http://HOST:PORT (or pass --server)")
    try:
        return parse_servers(text)
    except ServerError as e:
        raise ExperimentError(f"${SGLANG_URL_ENV}: {e}") from None
