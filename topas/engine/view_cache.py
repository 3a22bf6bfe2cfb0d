"""What an :class:`~topas.engine.view.EngineView` shows, kept between views and built again only
where it changed: a dict that keeps each value's view (the engine's waiting requests and active
tasks) and the agent prefixes' views (:class:`PrefixViews`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Callable

from topas.engine.view import PrefixView, prefix_view

if TYPE_CHECKING:
    from topas.engine.memory import KVMemory


class ViewedDict(dict):
    """A dict that keeps each value's view, in the dict's order, built at the first read after
    the value was set or :meth:`touch`-ed: an engine view then re-views only what changed."""

    __slots__ = ("views", "fresh")

    def __init__(self) -> None:
        super().__init__()
        self.views: dict[Any, Any] = {}
        self.fresh: list[Any] = []

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self.views[key] = None  # (an existing key keeps its place, as in the dict)
        self.fresh.append(key)

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key)
        del self.views[key]

    def pop(self, key: Any, *default: Any) -> Any:
        self.views.pop(key, None)
        return super().pop(key, *default)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return dict.__getitem__(self, key)

    def touch(self, key: Any) -> None:
        """``key``'s view may have changed: build it again at the next read."""
        if key in self.views:
            self.fresh.append(key)

    def touch_all(self) -> None:
        """Every value's view may have changed: build them all again at the next read."""
        self.fresh = list(self.views)

    def viewed(self, view_of: Callable[[Any], Any]) -> dict[Any, Any]:
        """Each value's view, by key, in the dict's order (live: copy it to keep it)."""
        views = self.views
        for key in self.fresh:
            if key in views:
                views[key] = view_of(dict.__getitem__(self, key))
        self.fresh.clear()
        return views

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("this dict changes by item only (set, del, pop)")

    update = popitem = clear = __ior__ = _refuse  # type: ignore[assignment]


class ExpiredView(RuntimeError):
    """A decision's running requests were read after the decision (the engine has moved on)."""


class RunningViews(Sequence):
    """The running requests' views of one scheduling point, built at their first read: most
    policies (FCFS, LPM and the others that order the waiting queue) never read them, and building
    them is a view per running request at every point. Read them during the decision only: the
    engine :meth:`seal` s them once the policy has decided, and a first read after that raises
    :class:`ExpiredView` instead of showing the engine as it is later."""

    __slots__ = ("_build", "_items")

    def __init__(self, build: Callable[[], tuple[Any, ...]]) -> None:
        self._build: Callable[[], tuple[Any, ...]] | None = build
        self._items: tuple[Any, ...] | None = None

    @property
    def items(self) -> tuple[Any, ...]:
        """The views, as a tuple (built now if they were not)."""
        if self._items is None:
            if self._build is None:
                raise ExpiredView("EngineView.running read after the policy's decision: read it in decide() or keep "
                                  "a copy (tuple(view.running))")
            self._items, self._build = self._build(), None
        return self._items

    @property
    def built(self) -> bool:
        return self._items is not None

    def seal(self) -> None:
        """The decision is taken: a first read from now on raises."""
        self._build = None

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: Any) -> Any:
        return self.items[i]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.items)

    def __bool__(self) -> bool:
        return bool(self.items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RunningViews):
            other = other.items
        return self.items == other if isinstance(other, tuple) else NotImplemented

    def __hash__(self) -> int:
        return hash(self.items)

    def __repr__(self) -> str:
        return repr(self.items) if self.built else "RunningViews(<not built>)"


class TasksNotShown(RuntimeError):
    """A policy that declares ``reads_tasks = False`` read ``EngineView.tasks``."""


class UnreadTasks(Mapping):
    """``EngineView.tasks`` of a decision whose policy declares it does not read the tasks
    (``PolicyAPI.reads_tasks``): the engine has not built them, and every read raises
    :class:`TasksNotShown` instead of showing no tasks."""

    __slots__ = ("policy",)

    def __init__(self, policy: str) -> None:
        self.policy = policy

    def _refuse(self, *args: Any) -> Any:
        raise TasksNotShown(f"policy {self.policy!r} read EngineView.tasks but declares reads_tasks = False: "
                            "set reads_tasks = True on its class to be shown the tasks")

    __getitem__ = __iter__ = __len__ = __contains__ = _refuse

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"UnreadTasks({self.policy!r})"


def seal(view: Any) -> None:
    """The decision or eviction pass that read ``view`` is over: its running requests, if not yet
    built, can no longer be (:meth:`RunningViews.seal`)."""
    running = view.running
    if isinstance(running, RunningViews):
        running.seal()


class PrefixViews:
    """Each agent prefix's :class:`~topas.engine.view.PrefixView`, kept while everything it shows
    is unchanged: an engine view builds again only the prefixes whose state moved since the last
    (a prefix's tokens and output prior never change)."""

    __slots__ = ("memory", "prior", "kept")

    def __init__(self, memory: "KVMemory", prior: Callable[[str, float], float]) -> None:
        """``prior``: the output prior a policy is shown (``Knowledge.prior``)."""
        self.memory = memory
        self.prior = prior
        self.kept: dict[str, tuple[tuple, PrefixView]] = {}  # agent -> (its state, its view)

    def views(self) -> dict[str, PrefixView]:
        """Every agent prefix's view now, by agent, in the pool's order (a new dict)."""
        memory, kept = self.memory, self.kept
        computing, loading, ghost = memory.computing, memory.prefetch.loading, memory._ghost
        out: dict[str, PrefixView] = {}
        for a, p in memory.prefixes.items():
            busy = a in computing
            # (KVMemory.cached_unpinned and KVMemory.in_tree, inlined: read at every view)
            state = (p.resident, p.on_host, p.refcount, p.last_used, ghost.get(a, False),
                     p.resident and p.prefill_left == 0 and not busy and a not in loading, busy)
            k = kept.get(a)
            if k is None or k[0] != state:
                k = kept[a] = (state, prefix_view(a, p.tokens, self.prior(a, p.agent.expected_output_tokens), *state))
            out[a] = k[1]
        return out
