"""A server's radix eviction policy as the simulator's config (``EngineConfig.eviction``).

SGLang 0.5.23 takes ``--radix-eviction-policy NAME`` and ``--radix-eviction-policy-config JSON``
(``arg_groups/fields/memory.py``); ``/server_info`` reports both
(:func:`topas.fidelity.profile_server.server_settings`). :func:`eviction_config_kw` turns them
into the :class:`topas.engine.config.EngineConfig` fields of the same eviction.
"""

from __future__ import annotations

import dataclasses as dc
from typing import Any, Mapping

from topas.engine.config import EngineConfig

__all__ = ["eviction_config_kw"]


def eviction_config_kw(policy: str | None, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The :class:`topas.engine.config.EngineConfig` fields for a server's
    ``--radix-eviction-policy`` (and its ``--radix-eviction-policy-config``, a JSON object, which
    ``EngineConfig.eviction`` spells ``NAME:key=value,...``): nothing for SGLang's default (lru,
    or None), so a default config stays the default; ValueError when the simulator has no such
    option (an engine without ``EngineConfig.eviction``)."""
    if not policy or str(policy).lower() == "lru":
        if config:
            raise ValueError(f"an lru server has no eviction policy config, got {config!r}")
        return {}
    fields = {f.name for f in dc.fields(EngineConfig)}
    if "eviction" not in fields:
        raise ValueError(f"the server evicts with --radix-eviction-policy {policy}, which this simulator cannot "
                         f"model (EngineConfig has no 'eviction' field)")
    name = str(policy).lower()
    if config:  # EngineConfig.eviction spells SGLang's JSON config as NAME:key=value,...
        name += ":" + ",".join(f"{k}={v}" for k, v in sorted(dict(config).items()))
    kw: dict[str, Any] = {"eviction": name}
    return kw
