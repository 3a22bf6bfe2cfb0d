"""Named things found by name: the one registry behind policies, routers, eviction strategies,
engines and eviction-priority rules.

A :class:`Registry` maps a name to an entry (a class, an engine object, a factory) in registration
order. Registering a second entry under a taken name is an error naming both; a name it lacks is
an error listing the valid ones. Each user keeps its own public functions (``make_policy``,
``make_router``, ``eviction_strategy``, ``get_engine``, ``make_rule``) over one of these.
"""

from __future__ import annotations

import importlib
from typing import Callable, Generic, Iterable, TypeVar

T = TypeVar("T")

__all__ = ["Registry"]


def _qualname(entry: object) -> str:
    return getattr(entry, "__qualname__", type(entry).__qualname__)


class Registry(Generic[T]):
    """Entries by name, in registration order.

    ``kind`` names an entry in messages (``"policy"``), ``valid`` heads the list of names in an
    unknown-name error (``"valid policies"``), ``error`` is the exception raised; ``builtins`` is
    the module whose import registers the built-in entries (imported before the first lookup: the
    registry lives below the modules that register into it); ``suggest`` gives the names an
    unknown-name error lists when they are not simply every registered one."""

    def __init__(self, kind: str, *, valid: str, error: type[Exception] = ValueError,
                 builtins: str | None = None, suggest: Callable[[], Iterable[str]] | None = None) -> None:
        self.kind = kind
        self.valid = valid
        self.error = error
        self.builtins = builtins
        self.suggest = suggest
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> T:
        """Register ``entry`` as ``name`` and return it. A name already taken by another entry is
        an error; the same entry, or one of the same qualified name (its module reloaded),
        replaces it."""
        old = self._entries.get(name)
        if old is not None and old is not entry and _qualname(old) != _qualname(entry):
            raise self.error(f"{self.kind} {name!r} is already registered ({_qualname(old)})")
        self._entries[name] = entry
        return entry

    def get(self, name: str) -> T:
        """The entry registered as ``name``; an unknown name raises ``error`` listing the valid ones."""
        self._load()
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            names = self.suggest() if self.suggest else self._entries
            raise self.error(f"unknown {self.kind} {name!r}; {self.valid}: {', '.join(names)}") from None

    def names(self) -> list[str]:
        """Every registered name, in registration order."""
        self._load()
        return list(self._entries)

    def items(self) -> list[tuple[str, T]]:
        self._load()
        return list(self._entries.items())

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def copy(self) -> "Registry[T]":
        """An independent registry with the same entries (tests register into a copy)."""
        new = type(self)(self.kind, valid=self.valid, error=self.error, builtins=self.builtins, suggest=self.suggest)
        new._entries = dict(self._entries)
        return new

    def _load(self) -> None:
        if self.builtins:
            importlib.import_module(self.builtins)
