"""The replay on a real SGLang server as a registered engine: ``sglang``
(:mod:`topas.engine.registry`).

A prepared experiment's trace is replayed on the server this thread was given
(:func:`sglang_url`; :func:`topas.sglang.replay.run_replay`), with the simulator's tables as its
result. A result depends on the server, so the key names the server's identity
(:func:`sglang_server_identity`); replays on one server would measure each other, so a sweep runs
them in this process, one at a time per server (:func:`topas.sglang.pool.map_on_servers`).

Registering it imports neither SGLang nor aiohttp: the replay client is imported when a run starts.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

from topas.engine.registry import Engine, PreparedRun, register
from topas.provenance import CODE_PACKAGES
from topas.sglang.pool import current_server, map_on_servers
from topas.sglang.replay import run_replay
from topas.sglang.server import check_policy, common_identity
from topas.sglang.urls import SGLANG_IDENTITY_ENV, SGLANG_URL_ENV, sglang_urls

if TYPE_CHECKING:  # pragma: no cover
    from topas.engine.metrics import SimResult

__all__ = ["SGLangReplay", "sglang_server_identity", "sglang_url"]

T = TypeVar("T")


def sglang_url() -> str:
    """The server this thread replays on: the one a multi-server sweep assigned to it
    (:func:`topas.sglang.pool.current_server`), else the first of :func:`sglang_urls`."""

    return current_server() or sglang_urls()[0]


def sglang_server_identity(policy: str | None = None) -> dict[str, Any]:
    """The identity of the server(s) in ``$TOPAS_SGLANG_URL`` (the handshake: each must run the
    topas plugin, able to run ``policy``, and all must be identical), or, with no server named,
    ``$TOPAS_SGLANG_IDENTITY``. Raises :class:`topas.sglang.server.ServerError` (one line)."""

    if not os.environ.get(SGLANG_URL_ENV, "").strip() and os.environ.get(SGLANG_IDENTITY_ENV):
        return json.loads(os.environ[SGLANG_IDENTITY_ENV])
    urls = sglang_urls()
    ident = common_identity(urls)
    if policy is not None:
        for u in urls:
            check_policy(u, policy)
    return ident.as_dict()


class SGLangReplay(Engine):
    """A replay of the trace on a running SGLang server with the topas plugin."""

    name = "sglang"
    label = "a replay on an SGLang server"
    code = (*CODE_PACKAGES, "sglang")
    in_process = True

    def key_entries(self, experiment: Any) -> dict[str, Any]:
        """``server``: the identity of the server(s) it replays on (asked once per process and server)."""
        return {"server": sglang_server_identity(experiment.policy)}

    def run(self, prepared: PreparedRun, progress: bool = False) -> "SimResult":
        url = sglang_url()

        return run_replay(prepared, url, progress=progress)

    def map(self, fn: Callable[[Any], T], experiments: Sequence[Any], *, progress: bool = True,
            desc: str = "experiments", order: Callable[[Any], float] | None = None) -> list[T]:
        return map_on_servers(fn, experiments, progress=progress, desc=desc, order=order)


register(SGLangReplay())
