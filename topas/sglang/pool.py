"""Replays on several SGLang servers at once: one replay per server at a time.

A replay's wall time is its arrivals' span whatever the hardware, so a sweep of replays is sped up
only by running independent replays side by side, each on its own server (a GPU box has several
GPUs: one server each). Two replays on one server would measure each other, so a server never
runs more than one. :func:`map_on_servers` gives each server a thread that takes the next
experiment of the sweep as soon as its previous replay finished (longest arrival spans first, so
the servers finish close together); :func:`current_server` tells the replay in a thread which
server is its own (``topas.sglang.engine.sglang_url``).

The servers must be identical (:func:`topas.sglang.server.common_identity`): then a result does
not depend on which server measured it and the sweep's results are those of one server.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Sequence, TypeVar

from tqdm.auto import tqdm

__all__ = ["current_server", "map_on_servers"]

T = TypeVar("T")
_LOCAL = threading.local()


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

    ``order(e)``: a priority (larger first) for handing out experiments to several servers, e.g.
    their arrival span (one server takes them in the input order).
    The first failure stops handing out experiments, waits for the replays in flight (their
    results, if ``fn`` stores them, are kept) and raises
    :class:`topas.errors.ExperimentFailed` naming the experiment. On Ctrl-C nothing new
    starts; the replays in flight are abandoned (the threads are daemons) and
    ``KeyboardInterrupt`` propagates.
    """
    from topas.errors import ExperimentFailed
    from topas.sglang.urls import sglang_urls

    servers = list(servers) if servers is not None else sglang_urls()
    out: list[Any] = [None] * len(exps)
    todo: "queue.Queue[int]" = queue.Queue()
    idx = list(range(len(exps)))
    if order is not None and len(servers) > 1:  # on one server the order changes nothing
        idx.sort(key=lambda i: -order(exps[i]))
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
