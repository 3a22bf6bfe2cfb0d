"""``topas serve``: start an SGLang server whose scheduler runs a topas policy.

Scheduler processes are spawned, so the policy reaches them through the environment that the
plugin (:mod:`topas.sglang.plugin`) reads; ``SGLANG_PLUGINS=topas`` whitelists the plugin (other
installed packages register plugins in the same entry-point group).
"""

from __future__ import annotations

import importlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from topas.paths import REPO_ROOT
from topas.policies.base import make_policy


def server_env(policy: str, params: Mapping[str, Any] | None = None, profile: str | None = None,
               decision_log: str | os.PathLike | None = None, recheck_steps: int | None = None,
               policy_modules: Sequence[str] = (), base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for ``python -m sglang.launch_server`` with the plugin running ``policy``.

    The policy and its parameters are checked here (``PolicyError`` names a bad one)."""

    for m in policy_modules:
        importlib.import_module(m)
    make_policy(policy, dict(params or {}))  # fail here, not inside the server
    env = dict(os.environ if base is None else base)
    plugins = [p for p in env.get("SGLANG_PLUGINS", "").split(",") if p.strip()]
    env["SGLANG_PLUGINS"] = ",".join(dict.fromkeys([*plugins, "topas"]))
    env["TOPAS_POLICY"] = policy
    env["TOPAS_POLICY_PARAMS"] = json.dumps(dict(params or {}))
    if profile:
        env["TOPAS_PROFILE"] = profile
    if decision_log:
        env["TOPAS_DECISION_LOG"] = os.fspath(decision_log)
    if recheck_steps:
        env["TOPAS_RECHECK_STEPS"] = str(recheck_steps)
    if policy_modules:
        env["TOPAS_POLICY_MODULES"] = ",".join(policy_modules)
    return env


def plain_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for stock SGLang: no plugin loaded (``SGLANG_PLUGINS`` is a whitelist, and
    an empty one loads every installed plugin, topas included, so it names none that exists)."""
    env = dict(os.environ if base is None else base)
    env["SGLANG_PLUGINS"] = "none"
    for k in ("TOPAS_POLICY", "TOPAS_POLICY_PARAMS", "TOPAS_DECISION_LOG"):
        env.pop(k, None)
    return env


def launch_command(sglang_args: Sequence[str], python: str | None = None) -> list[str]:
    return [python or sys.executable, "-m", "sglang.launch_server", *sglang_args]


#: where :func:`free_port` looks below the kernel's ephemeral range
PORT_FLOOR = 10000
#: SGLang picks its own torch.distributed port (``PortArgs.nccl_port``, bound by the scheduler
#: before the server binds its HTTP port) at random from 22000-29999 when that is below the
#: ephemeral range (``sglang.srt.utils.network.get_free_port_below_ephemeral``): :func:`free_port`
#: stays below it, so that no server starting meanwhile, this one included, takes the port chosen
PORT_CEILING = 22000


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, for a server to bind later. Chosen at random from
    :data:`PORT_FLOOR` up to the kernel's ephemeral port range, where that range can be read
    (Linux), and below :data:`PORT_CEILING`: a server binds its port only once its model is
    loaded, and until then a port from the ephemeral range can be handed to any socket bound to
    port 0 or connecting out (SGLang's own processes open several), and one from SGLang's own
    range to a starting server's torch.distributed store, which then holds the server's address
    ("address already in use"). Elsewhere, one the kernel picks."""
    low = _ephemeral_low()
    if low is not None and low > PORT_FLOOR + 100:
        high = min(low, PORT_CEILING)
        pick = random.Random()  # unseeded: two test sessions at once should not pick the same
        for _ in range(200):
            port = pick.randrange(PORT_FLOOR, high)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int | None:
    """The lowest port of the kernel's ephemeral range, or None where it cannot be read."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


#: Model configs shipped under ``data/models/`` (config.json only, no weights): SGLang builds the
#: model from it and fills the weights with random values (``--load-format dummy``), which serves
#: the replay exactly as real weights would (it sends token ids and ``ignore_eos``, so neither the
#: tokenizer nor the sampled tokens matter) and runs at the real model's speed.
DUMMY_MODELS: dict[str, str] = {"qwen2.5-32b-instruct": "qwen2.5-32b-instruct"}


def dummy_model_dir(name: str):
    """The folder of a shipped model config (``data/models/<name>``); ``ValueError`` names the known ones."""

    if name not in DUMMY_MODELS:
        raise ValueError(f"unknown dummy model {name!r} (known: {', '.join(sorted(DUMMY_MODELS))})")
    d = REPO_ROOT / "data" / "models" / DUMMY_MODELS[name]
    if not (d / "config.json").is_file():
        raise ValueError(f"dummy model {name!r}: {d / 'config.json'} is missing")
    return d


def dummy_weight_args(name: str) -> list[str]:
    """SGLang flags that serve a shipped model config with random weights and no tokenizer:
    ``--model-path data/models/<name> --load-format dummy --skip-tokenizer-init``. Nothing is
    downloaded: SGLang reads only ``config.json`` (the generation config and the tokenizer are
    optional, and skipped without a tokenizer)."""
    return ["--model-path", os.fspath(dummy_model_dir(name)), "--load-format", "dummy", "--skip-tokenizer-init"]


def cpu_test_args(model_dir: str | os.PathLike, port: int, max_total_tokens: int = 4096,
                  tokenizer: bool = False) -> list[str]:
    """SGLang flags for the tiny dummy-weight model on a CPU (tools/sglang_cpu). ``tokenizer``:
    load the model folder's tokenizer (:mod:`topas.sglang.text`, for text requests through a
    text-matching router) instead of ``--skip-tokenizer-init`` (token ids only)."""
    return ["--model-path", os.fspath(model_dir), "--load-format", "dummy",
            *(() if tokenizer else ("--skip-tokenizer-init",)),
            "--device", "cpu", "--attention-backend", "torch_native", "--sampling-backend", "pytorch",
            "--disable-cuda-graph", "--max-total-tokens", str(max_total_tokens), "--dtype", "float32",
            "--host", "127.0.0.1", "--port", str(port)]


#: SGLang 0.5.23's ``--radix-eviction-policy`` choices (``mem_cache/utils.py``
#: ``_EVICTION_POLICY_FACTORIES``; the strategies in ``mem_cache/evict_policy.py``).
RADIX_EVICTION_POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru")


def eviction_args(policy: str | None, config: Mapping[str, Any] | None = None) -> list[str]:
    """``--radix-eviction-policy POLICY`` (and ``--radix-eviction-policy-config JSON`` with
    ``config``); nothing for ``policy`` None (SGLang's default, lru). ValueError naming the valid
    policies for an unknown one (SGLang itself would refuse to start)."""
    if policy is None:
        if config:
            raise ValueError("an eviction policy config needs an eviction policy")
        return []
    if policy not in RADIX_EVICTION_POLICIES:
        raise ValueError(f"unknown radix eviction policy {policy!r}; SGLang 0.5.23 has: {', '.join(RADIX_EVICTION_POLICIES)}")
    out = ["--radix-eviction-policy", policy]
    if config:
        out += ["--radix-eviction-policy-config", json.dumps(dict(config), sort_keys=True)]
    return out


#: The CPU stand-in for a GPU server (docs/gpu.md, ``topas serve --cpu-test``): the tiny model with
#: a context of 16,384 positions (MetaGPT-TL's longest prompts; the model's config has 8,192, so
#: SGLang needs ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1``) and a KV pool that holds them.
CPU_STANDIN_CONTEXT = 16384
CPU_STANDIN_POOL = 32768


def tiny_model_dir():
    """The tiny CPU model (``$TOPAS_TINY_MODEL``, else ``.venvs/sglang-cpu/tiny-llama``, written by
    ``tools/sglang_cpu/build_env.sh``)."""

    return Path(os.environ.get("TOPAS_TINY_MODEL") or REPO_ROOT / ".venvs" / "sglang-cpu" / "tiny-llama")


def cpu_standin_args(model_dir: str | os.PathLike, port: int, max_total_tokens: int = CPU_STANDIN_POOL) -> list[str]:
    """:func:`cpu_test_args` for real traces: ``--context-length`` :data:`CPU_STANDIN_CONTEXT`
    (with :func:`cpu_standin_env`), and ``--sleep-on-idle``: an idle CPU server's scheduler loop
    otherwise keeps a core busy polling (SGLang's ``IdleSleeper`` instead blocks on its sockets and
    wakes on the next message), so several stand-ins on a small machine leave the replay client no
    core."""
    return [*cpu_test_args(model_dir, port, max_total_tokens), "--context-length", str(CPU_STANDIN_CONTEXT),
            "--sleep-on-idle"]


def cpu_standin_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` plus what the stand-in needs: the longer context allowed, one thread per server
    (several stand-ins share a few cores)."""
    return {**env, "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1", "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1")}


def start(sglang_args: Sequence[str], env: Mapping[str, str], log_path: str | os.PathLike | None = None,
          python: str | None = None) -> subprocess.Popen:
    """Start the server in its own process group (stop it with :func:`stop`)."""
    return _spawn(launch_command(sglang_args, python), env, log_path)


def _spawn(cmd: Sequence[str], env: Mapping[str, str] | None, log_path: str | os.PathLike | None) -> subprocess.Popen:
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    return subprocess.Popen(list(cmd), env=dict(env) if env is not None else None, stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True)


def router_command(worker_urls: Sequence[str], port: int, policy: str = "cache_aware",
                   python: str | None = None, host: str = "127.0.0.1") -> list[str]:
    """``sglang-router``'s launch command (``python -m sglang_router.launch_router``) in front of
    ``worker_urls``, with its CLI defaults otherwise (``cache_aware``: cache_threshold 0.3,
    balance thresholds 64 / 1.5, as :mod:`topas.cluster.routers.sglang_cache_aware` models them)."""
    return [python or sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *worker_urls,
            "--policy", policy, "--host", host, "--port", str(port)]


def start_router(worker_urls: Sequence[str], port: int, log_path: str | os.PathLike | None = None,
                 policy: str = "cache_aware", python: str | None = None) -> subprocess.Popen:
    """Start ``sglang-router`` in its own process group (stop it with :func:`stop`)."""
    return _spawn(router_command(worker_urls, port, policy, python), None, log_path)


def stop(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """Stop a server started by :func:`start` and its children (its process group)."""

    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout)
    except ProcessLookupError:
        pass
