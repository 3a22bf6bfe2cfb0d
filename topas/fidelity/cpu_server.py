"""Start the CPU test server (tiny dummy-weight Llama, the topas plugin) for fidelity runs.

The server of ``make test-sglang`` (``topas.sglang.launcher.cpu_test_args``), with what timing
needs on a shared 2-core machine: ``--enable-metrics`` (the scheduler's per-request timestamps,
used by the profiler), ``--sleep-on-idle`` (an idle scheduler does not spin a core),
``OMP_NUM_THREADS=1`` (one core for the model; the client and the other processes keep the
other) and a raised CPU priority (``nice``; needs root, skipped otherwise), so that other work
on the machine moves the measured times less.
"""

from __future__ import annotations

import contextlib
import os
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from topas.paths import REPO_ROOT
from topas.sglang import launcher
from topas.sglang.launcher import cpu_test_args, eviction_args

VENV = REPO_ROOT / ".venvs" / "sglang-cpu"
MODEL = VENV / "tiny-llama"
#: what the server logs when another socket took its port before it bound it; it then does not
#: exit but waits, its scheduler still running
PORT_TAKEN = b"address already in use"
#: starts tried, each on a fresh port, when the port chosen was taken before the server bound it
PORT_TRIES = 3


class PortTaken(RuntimeError):
    """The server could not bind its port: another socket took it after it was chosen."""


def cpu_server_args(port: int, max_total_tokens: int = 4096, schedule_policy: str | None = None,
                    eviction: str | None = None, eviction_config: Mapping[str, Any] | None = None) -> list[str]:
    """The server's flags. ``eviction``: SGLang's ``--radix-eviction-policy`` (lru, lfu, slru, priority,
    tlru, ...; None: SGLang's default, lru, no flag); ``eviction_config``: its
    ``--radix-eviction-policy-config`` (a JSON object, e.g. slru's ``protected_threshold``)."""
    extra = ["--schedule-policy", schedule_policy] if schedule_policy else []
    return (cpu_test_args(MODEL, port, max_total_tokens) + ["--enable-metrics", "--sleep-on-idle", *extra]
            + eviction_args(eviction, eviction_config))


def raise_priority(niceness: int = -19) -> bool:
    """Lower this process's nice value (children inherit it); False when not permitted."""
    try:
        os.nice(niceness - os.nice(0))
        return True
    except (PermissionError, OSError):
        return False


@contextlib.contextmanager
def cpu_server(port: int | None = None, policy: str = "fcfs", log_path: str | Path | None = None,
               decision_log: str | Path | None = None, niceness: int | None = -19,
               startup_s: float = 180.0, max_total_tokens: int = 4096, plugin: bool = True,
               schedule_policy: str | None = None, profile: str | Path | None = None,
               eviction: str | None = None, eviction_config: Mapping[str, Any] | None = None,
               extra_args: Sequence[str] = ()) -> Iterator[str]:
    """Start the CPU test server with the plugin; yields its URL; stops it on exit. With
    ``plugin=False`` it is stock SGLang (``SGLANG_PLUGINS=none``: no plugin loaded; the requests'
    topas metadata is ignored) scheduling with ``--schedule-policy schedule_policy`` (SGLang's
    default, ``fcfs``, when None). ``profile``: the cost profile the plugin's policy prices its
    decisions with (``TOPAS_PROFILE``; default: the plugin's, the A100 profile). A comparison with
    the simulator must give the profile the simulation uses, or TOPAS decides on other costs.
    ``eviction`` / ``eviction_config``: the radix cache's eviction policy (:func:`cpu_server_args`);
    ``extra_args``: more SGLang flags (e.g. ``--enable-hierarchical-cache``)."""
    if not (VENV / ".ready").exists():
        raise RuntimeError(f"{VENV} is not built: run tools/sglang_cpu/build_env.sh (make test-sglang builds it)")
    env = (launcher.server_env(policy, decision_log=decision_log, profile=os.fspath(profile) if profile else None)
           if plugin else launcher.plain_env())
    env["OMP_NUM_THREADS"] = "1"
    if niceness is not None:
        raise_priority(niceness)
    tries = 1 if port else PORT_TRIES  # a port given is the caller's: not replaced
    for attempt in range(1, tries + 1):
        chosen = port or launcher.free_port()
        log_from = Path(log_path).stat().st_size if log_path and Path(log_path).exists() else 0
        proc = launcher.start([*cpu_server_args(chosen, max_total_tokens, schedule_policy, eviction, eviction_config),
                               *extra_args], env, log_path=log_path, python=str(VENV / "bin" / "python"))
        url = f"http://127.0.0.1:{chosen}"
        try:
            wait_until_up(proc, url, startup_s, log_path, log_from)
        except PortTaken as e:
            launcher.stop(proc)
            if attempt == tries:
                raise RuntimeError(f"{e}, at each of {tries} start(s)") from None
            continue
        except BaseException:
            launcher.stop(proc)
            raise
        break
    try:
        yield url
    finally:
        launcher.stop(proc)


def wait_until_up(proc: Any, url: str, startup_s: float, log_path: str | Path | None = None,
                  log_from: int = 0) -> None:
    """Wait until the server started as ``proc`` answers ``url``/health; raise
    :class:`PortTaken` as soon as its log (from byte ``log_from`` on: what this start wrote)
    says its port was taken, RuntimeError if it exits or is not up in ``startup_s`` seconds (with
    the last lines this start logged)."""
    t0 = time.time()
    while True:
        if log_path is not None and PORT_TAKEN in _logged(Path(log_path), log_from).lower():
            raise PortTaken(f"the CPU server could not bind {url}: address already in use (log: {log_path})")
        if proc.poll() is not None:
            raise RuntimeError(f"the CPU server exited with {proc.returncode} during startup "
                               f"(log: {log_path}){_tail(log_path, log_from)}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.time() - t0 > startup_s:
            raise RuntimeError(f"the CPU server did not come up in {startup_s:g} s "
                               f"(log: {log_path}){_tail(log_path, log_from)}")
        time.sleep(1.0)


def _logged(log_path: Path, log_from: int) -> bytes:
    """What the log holds from byte ``log_from`` on (nothing if it cannot be read)."""
    try:
        with open(log_path, "rb") as f:
            f.seek(log_from)
            return f.read()
    except OSError:
        return b""


def _tail(log_path: str | Path | None, log_from: int, chars: int = 3000) -> str:
    if log_path is None:
        return ""
    text = _logged(Path(log_path), log_from).decode(errors="replace")[-chars:]
    return f"; its last lines:\n{text}" if text else ""
