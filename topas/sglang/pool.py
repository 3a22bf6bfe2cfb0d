"""Replays on several SGLang servers at once: one replay per server at a time.

A replay's wall time is its arrivals' span whatever the hardware, so a sweep of replays is sped up
only by running independent replays side by side, each on its own server (a GPU box has several
GPUs: one server each). Two replays on one server would measure each other, so a server never
runs more than one. :func:`map_on_servers` gives each server a thread that takes the next
experiment of the sweep as soon as its previous replay finished, so no server waits while replays
remain; they are handed out longest first (:func:`hand_out_order`, by a duration the caller
gives, so the servers finish close together). :func:`schedule` computes, with the same order and
the same rule, when each replay starts and ends on each server from their expected durations:
the plan (:mod:`topas.experiments.plan`) is this schedule. :func:`current_server` tells the
replay in a thread which server is its own (``topas.sglang.engine.sglang_url``).

The servers must be identical (:func:`topas.sglang.server.common_identity`): then a result does
not depend on which server measured it and the sweep's results are those of one server.
"""

from __future__ import annotations

import heapq
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

from tqdm.auto import tqdm

from topas.errors import ExperimentFailed
from topas.sglang.urls import sglang_urls

__all__ = ["current_server", "map_on_servers", "hand_out_order", "schedule", "Slot", "Schedule"]

T = TypeVar("T")
_LOCAL = threading.local()


def hand_out_order(durations: Sequence[float]) -> list[int]:
    """The order a pool hands replays out in: longest expected duration first, ties in the input
    order (a stable sort), so the last replays to start are the short ones."""
    return sorted(range(len(durations)), key=lambda i: -float(durations[i]))


@dataclass(frozen=True)
class Slot:
    """One replay in a :class:`Schedule`: its index in the input, its server and its times."""

    index: int
    server: int
    start: float
    end: float


@dataclass(frozen=True)
class Schedule:
    """When each replay of a pool starts and ends (:func:`schedule`)."""

    slots: tuple[Slot, ...]
    servers: int

    @property
    def wall(self) -> float:
        """Seconds from the first start to the last end (0 for no replays)."""
        return max((s.end for s in self.slots), default=0.0)

    @property
    def used(self) -> int:
        """How many servers run at least one replay."""
        return len({s.server for s in self.slots})

    def busy(self, server: int) -> float:
        return sum(s.end - s.start for s in self.slots if s.server == server)


def schedule(durations: Sequence[float], servers: int) -> Schedule:
    """The schedule :func:`map_on_servers` follows for replays of these expected ``durations``
    on ``servers`` servers: handed out in :func:`hand_out_order`, each to the server that becomes
    free first (the lowest index among ties), so no server is idle while a replay waits."""
    if servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers}")
    free = [(0.0, k) for k in range(servers)]  # (time the server is free, server)
    heapq.heapify(free)
    slots = []
    for i in hand_out_order(durations) if servers > 1 else range(len(durations)):
        t, k = heapq.heappop(free)
        end = t + float(durations[i])
        slots.append(Slot(i, k, t, end))
        heapq.heappush(free, (end, k))
    return Schedule(tuple(slots), servers)


def current_server() -> str | None:
    """The server assigned to this thread by :func:`map_on_servers` (``None`` outside one)."""
    return getattr(_LOCAL, "server", None)


def map_on_servers(
    fn: Callable[[Any], T],
    exps: Sequence[Any],
    servers: Sequence[str] | None = None,
    progress: bool = True,
    desc: str = "replays",
    order: Callable[[Any], float] | None = None,
) -> list[T]:
    """``[fn(e) for e in exps]`` with each call on one of ``servers`` (default: the servers of
    ``$TOPAS_SGLANG_URL``), at most one at a time per server, in the input order.

    ``order(e)``: the expected duration of each experiment; several servers take them longest
    first (:func:`hand_out_order`, as :func:`schedule` plans them); one server takes them in the
    input order.
    The first failure stops handing out experiments, waits for the replays in flight (their
    results, if ``fn`` stores them, are kept) and raises
    :class:`topas.errors.ExperimentFailed` naming the experiment. On Ctrl-C nothing new
    starts; the replays in flight are abandoned (the threads are daemons) and
    ``KeyboardInterrupt`` propagates.
    """

    servers = list(servers) if servers is not None else sglang_urls()
    out: list[Any] = [None] * len(exps)
    todo: "queue.Queue[int]" = queue.Queue()
    idx = list(range(len(exps)))
    if order is not None and len(servers) > 1:  # on one server the order changes nothing
        idx = hand_out_order([order(e) for e in exps])
    for i in idx:
        todo.put(i)
    stop = threading.Event()
    failures: list[tuple[int, BaseException]] = []
    bar = tqdm(total=len(exps), desc=desc, unit="replay", disable=not progress)
    lock = threading.Lock()

    def worker(server: str) -> None:
        _LOCAL.server = server
        while not stop.is_set():
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            try:
                out[i] = fn(exps[i])
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                with lock:
                    failures.append((i, e))
                stop.set()
                return
            with lock:
                bar.update(1)

    threads = [threading.Thread(target=worker, args=(s,), name=f"replay@{s}", daemon=True)
               for s in servers[: max(1, min(len(servers), len(exps)))]]
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.5)
    except KeyboardInterrupt:
        stop.set()
        raise
    finally:
        bar.close()
    if failures:
        i, err = min(failures, key=lambda f: f[0])
        raise ExperimentFailed(f"experiment {exps[i].label()} failed: {err}") from err
    return out
