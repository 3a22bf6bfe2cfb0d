"""The client's view of an SGLang server: its URL, its identity, and the plugin handshake.

Before anything is replayed on a server, :func:`identity` asks it once (per process and URL) for
``GET /server_info`` (``/get_server_info`` on older SGLang). The topas plugin adds a ``topas``
block to every scheduler's internal state there (:func:`topas.sglang.plugin.Controller.info`);

* a server whose answer has no such block does not run the plugin (``SGLANG_PLUGINS`` without
  ``topas``, or SGLang installed in an environment without topas): :class:`ServerError`, naming
  the fix; replaying on it would store SGLang's own FCFS under the run's policy name;
* a run whose policy the plugin cannot build (an older topas on the server) is refused
  (:func:`check_policy`);
* the answer gives the server's :class:`ServerIdentity` (model name and config hash, KV pool,
  SGLang version, schedule policy, device, tensor parallelism, page size, plugin version), which
  goes into the key and meta of every ``engine="sglang"`` result
  (:meth:`topas.experiments.spec.Experiment.canonical`): a result measured on one server is never
  reused for another;
* after a replay, :func:`run_decisions` reads how many decisions the plugin made for the run
  (a run with none was scheduled by SGLang alone: an error, not a result).

Several servers (one per GPU) serve one sweep only if their identities are equal (same model,
pool, version, ...; :func:`common_identity`), so their results are interchangeable.
"""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any, Sequence

__all__ = [
    "ServerError",
    "ServerIdentity",
    "check_url",
    "parse_servers",
    "server_info",
    "identity",
    "identity_from_info",
    "common_identity",
    "check_policy",
    "run_decisions",
    "router_workers",
    "servers_behind",
    "PLUGIN_FIX",
    "stored_identity",
    "preflight",
]

#: How to make a server run the plugin (quoted by every refusal).
PLUGIN_FIX = ("start it with `topas serve --policy <name> -- <sglang args>` from the topas environment, "
              "or, with SGLang in its own environment, install topas there (pip install -e <this checkout>) "
              "and set SGLANG_PLUGINS=topas (README, 'Running on a GPU box')")


class ServerError(RuntimeError):
    """A server is unreachable, does not answer like SGLang, or does not run the topas plugin; the
    message is one line naming the server and the fix."""


def check_url(url: str) -> str:
    """``url`` without a trailing slash; :class:`ServerError` unless it is ``http(s)://HOST[:PORT]``
    (a URL without a scheme would fail after every retry; it fails here at once)."""
    u = str(url).strip().rstrip("/")
    if not u.startswith(("http://", "https://")) or len(u.split("://", 1)[1]) == 0:
        raise ServerError(f"SGLang server URL {url!r} must start with http:// or https:// "
                          f"(e.g. http://127.0.0.1:30000)")
    return u


def parse_servers(text: str | Sequence[str]) -> list[str]:
    """Comma-separated (or a list of) server URLs, each checked; duplicates are an error."""
    items = text.split(",") if isinstance(text, str) else list(text)
    urls = [check_url(u) for u in items if str(u).strip()]
    if not urls:
        raise ServerError("no SGLang server URL given")
    dup = sorted({u for u in urls if urls.count(u) > 1})
    if dup:
        raise ServerError(f"SGLang server {dup[0]} given twice; give each server once")
    return urls


@dataclass(frozen=True)
class ServerIdentity:
    """What a measured result depends on about the server (all of it goes into the result's key)."""

    model: str
    model_config_sha256: str
    kv_pool_tokens: int
    sglang_version: str
    schedule_policy: str
    device: str
    tp_size: int
    page_size: int
    plugin_version: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def short(self) -> str:
        """A caption-sized name, e.g. ``Qwen2.5-32B-Instruct, NVIDIA H100 80GB HBM3, 512,000-token pool``."""
        model = self.model.rstrip("/").rsplit("/", 1)[-1]
        tp = f" x{self.tp_size}" if self.tp_size > 1 else ""
        return f"{model}, {self.device}{tp}, {self.kv_pool_tokens:,}-token KV pool, SGLang {self.sglang_version}"

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()[:12]


# ----------------------------------------------------------------------------- asking the server


def http_get(url: str, timeout_s: float) -> bytes:
    """The body of ``GET url``, all of it within ``timeout_s`` seconds: connecting, each read and
    the whole answer (a server that sends a byte every few seconds fails too: ``TimeoutError``).
    HTTP and connection errors are raised as ``urllib`` raises them."""
    box: dict[str, Any] = {}

    def fetch() -> None:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as r:
                box["body"] = r.read()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    t = threading.Thread(target=fetch, daemon=True, name="topas-http-get")
    t.start()
    t.join(timeout_s)
    if t.is_alive():  # the daemon thread is left to its socket timeout; nothing waits for it
        raise TimeoutError(f"no complete answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["body"]


def server_info(url: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """``GET /server_info`` (falling back to ``/get_server_info``) as JSON; :class:`ServerError`
    (one line) when the server cannot be reached or does not answer like SGLang."""
    url = check_url(url)
    last = ""
    for path in ("/server_info", "/get_server_info"):
        try:
            info = json.loads(http_get(f"{url}{path}", timeout_s).decode("utf-8"))
            if not isinstance(info, dict):
                raise ServerError(f"{url}{path} answered a JSON {type(info).__name__}, not an object: is {url} an "
                                  f"SGLang server?")
            return info
        except urllib.error.HTTPError as e:
            if e.code == 404:
                last = f"HTTP 404 on {path}"
                continue
            raise ServerError(f"SGLang server {url}: GET {path} answered HTTP {e.code}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e) or type(e).__name__
            raise ServerError(f"cannot reach the SGLang server at {url} ({reason}); is it running? "
                              f"(start one with `topas serve`, README 'Running on a GPU box')") from None
        except ValueError:
            raise ServerError(f"{url}{path} did not answer JSON: is {url} an SGLang server?") from None
    raise ServerError(f"{url} has neither /server_info nor /get_server_info ({last}): is it an SGLang server?")


def router_workers(url: str, timeout_s: float = 10.0) -> list[str] | None:
    """The worker URLs behind ``url`` when it is an SGLang router (``sglang-router`` /
    SGLang Model Gateway: ``GET /workers`` answers ``{"workers": [{"url": ...}, ...]}``), in the
    router's order; ``None`` when ``url`` is not a router (an SGLang server answers 404 there)."""
    url = check_url(url)
    try:
        d = json.loads(http_get(f"{url}/workers", timeout_s).decode("utf-8"))
    except TimeoutError:  # answering, but not within the time: a misbehaving server, not "no router"
        raise ServerError(f"SGLang server {url}: no complete answer to GET /workers within {timeout_s:g} s; "
                          f"is it an SGLang server or router?") from None
    except (urllib.error.URLError, OSError, ValueError):
        return None
    if not isinstance(d, dict) or not isinstance(d.get("workers"), list):
        return None
    urls = [w.get("url") for w in d["workers"] if isinstance(w, dict)]
    return [check_url(u) for u in urls if isinstance(u, str) and u] or None


def servers_behind(url: str, timeout_s: float = 10.0) -> list[str]:
    """The servers a request to ``url`` may reach: a router's workers (:func:`router_workers`),
    else ``[url]`` itself."""
    return router_workers(url, timeout_s) or [url]


def plugin_blocks(info: dict[str, Any]) -> list[dict[str, Any]]:
    """The plugin's block of every scheduler (data-parallel rank) in a ``/server_info`` answer."""
    states = info.get("internal_states") or []
    return [s["topas"] for s in states if isinstance(s, dict) and isinstance(s.get("topas"), dict)]


def identity_from_info(url: str, info: dict[str, Any]) -> tuple[ServerIdentity, dict[str, Any]]:
    """The identity and the plugin block of a ``/server_info`` answer; :class:`ServerError` when
    the server does not run the topas plugin (the handshake)."""
    blocks = plugin_blocks(info)
    states = info.get("internal_states") or []
    if "router_manager" in info or ("workers_count" in info and not states):
        raise ServerError(f"{url} is an SGLang router ({info.get('workers_count', '?')} workers), not one server: "
                          f"a result keyed by the server's identity needs one server; `topas replay --server` "
                          f"replays through a router (it checks every worker)")
    if not blocks or len(blocks) < len(states):
        raise ServerError(f"SGLang server {url} does not run the topas plugin (no 'topas' block in its "
                          f"/server_info), so SGLang's own scheduler would run every policy; {PLUGIN_FIX}")
    block = blocks[0]
    if "error" in block:
        raise ServerError(f"SGLang server {url}: the topas plugin failed ({block['error']}); see the server's log")
    model = info.get("served_model_name") or info.get("model_path") or "unknown"
    try:
        ident = _identity(info, block, model)
    except (KeyError, TypeError, ValueError) as e:
        field = e.args[0] if isinstance(e, KeyError) and e.args else e
        raise ServerError(f"SGLang server {url}: its /server_info has a missing or malformed field ({field}): "
                          f"the topas plugin there is broken or of another version; {PLUGIN_FIX}") from None
    return ident, block


def _identity(info: dict[str, Any], block: dict[str, Any], model: str) -> ServerIdentity:
    return ServerIdentity(
        model=str(info.get("model_path") or model),
        model_config_sha256=str(block.get("model_config_sha256", "unknown")),
        kv_pool_tokens=int(block["kv_pool_tokens"]),
        sglang_version=str(info.get("version", "unknown")),
        schedule_policy=str(info.get("schedule_policy", "unknown")),
        device=str(block.get("device", "unknown")),
        tp_size=int(info.get("tp_size", 1) or 1),
        page_size=int(block.get("page_size", info.get("page_size", 1)) or 1),
        plugin_version=f"{block.get('topas_version', 'unknown')}/protocol-{block.get('protocol', '?')}",
    )


_CACHE: dict[str, tuple[ServerIdentity, dict[str, Any]]] = {}
_CACHE_LOCK = threading.Lock()


def identity(url: str, refresh: bool = False) -> ServerIdentity:
    """The server's :class:`ServerIdentity`, asked once per process (``refresh`` asks again);
    :class:`ServerError` when it is unreachable or runs no topas plugin."""
    return _handshake(url, refresh)[0]


def plugin_block(url: str, refresh: bool = False) -> dict[str, Any]:
    """The plugin's ``/server_info`` block (policies it can run, its default policy, ...)."""
    return _handshake(url, refresh)[1]


def _handshake(url: str, refresh: bool) -> tuple[ServerIdentity, dict[str, Any]]:
    url = check_url(url)
    with _CACHE_LOCK:
        if refresh or url not in _CACHE:
            _CACHE[url] = identity_from_info(url, server_info(url))
        return _CACHE[url]


def common_identity(urls: Sequence[str]) -> ServerIdentity:
    """The identity the servers share; :class:`ServerError` naming the first difference when
    they differ (results from different servers must not be pooled under one key)."""
    urls = parse_servers(urls)
    first = identity(urls[0])
    for u in urls[1:]:
        other = identity(u)
        if other != first:
            a, b = first.as_dict(), other.as_dict()
            k = next(k for k in a if a[k] != b[k])
            raise ServerError(f"SGLang servers {urls[0]} and {u} differ in {k} ({a[k]!r} vs {b[k]!r}); "
                              f"one sweep runs on identical servers only (same model, KV pool, version, "
                              f"device); run the others separately")
    return first


def check_policy(url: str, policy: str) -> None:
    """:class:`ServerError` unless the plugin on ``url`` can run ``policy`` (it builds each run's
    policy from the run's metadata, from the policies registered in the server's topas)."""
    block = plugin_block(url)
    names = block.get("policies") or []
    if policy not in names:
        raise ServerError(f"the topas plugin on {url} (topas {block.get('topas_version')}) cannot run policy "
                          f"{policy!r} (it has: {', '.join(names) or 'none'}); update topas in the server's "
                          f"environment and restart it")


def preflight(urls: str | Sequence[str], policies: Sequence[str] = (), timeout_s: float = 10.0) -> ServerIdentity:
    """The checks before anything is replayed, shared by ``scripts/reproduce.py`` and ``topas
    replay``: every URL well-formed (``http(s)://``), every server reachable (a router: each of its
    workers), running the topas plugin, all identical, and able to run each of ``policies``.
    Returns their common identity; :class:`ServerError` (one line naming the fix) at the first
    failure. Nothing waits for a server to come up: an unreachable one fails at once."""
    targets: list[str] = []
    for u in parse_servers(urls):
        if router_workers(u, timeout_s) is None:
            server_info(u, timeout_s)  # reachable? (raises the one-line 'cannot reach' error)
        targets += servers_behind(u, timeout_s)
    ident = common_identity(targets)
    for u in targets:
        for p in policies:
            check_policy(u, p)
    return ident


def run_decisions(url: str, run_id: str) -> dict[str, Any] | None:
    """The plugin's count of a run's decisions, summed over schedulers (``{"policy",
    "decisions", "fallbacks"}``), or ``None`` if no scheduler saw the run."""
    blocks = plugin_blocks(server_info(url))
    runs = [b.get("runs", {}).get(run_id) for b in blocks]
    runs = [r for r in runs if r]
    if not runs:
        return None
    return {"policy": runs[0].get("policy"), "decisions": sum(int(r.get("decisions", 0)) for r in runs),
            "fallbacks": sum(int(r.get("fallbacks", 0)) for r in runs)}


def stored_identity(store: Any) -> dict[str, Any] | None:
    """The server identity of the ``engine="sglang"`` results in ``store`` (a
    :class:`topas.experiments.store.ResultStore`: its root and packs) when they all share one, so
    stored replays are found without a server (``make figures`` / ``make pack ENGINE=sglang``;
    ``$TOPAS_SGLANG_IDENTITY``); ``None`` when there are none. Several: :class:`ServerError`."""
    found: dict[str, dict[str, Any]] = {}
    for base in (store.root, *store.packs):
        if not base.is_dir():
            continue
        for meta in sorted(base.glob("*/*/meta.json")):
            m = json.loads(meta.read_text())
            server = (m.get("canonical") or {}).get("server")
            if m.get("engine") == "sglang" and server:
                found[json.dumps(server, sort_keys=True)] = server
    if len(found) > 1:
        raise ServerError(f"the results store holds replays of {len(found)} different SGLang servers; name the "
                          f"one to use with --server URL (it must be running)")
    return next(iter(found.values()), None)
