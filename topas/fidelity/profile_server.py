"""Measure a running SGLang server and fit the simulator's cost-model profile to it.

``topas profile-server --server URL --out data/profiles/<name>.json`` talks to the server only
through its HTTP API, so the same command profiles the CPU test server here and a GPU server:

* ``/server_info`` (or the older ``/get_server_info``): the KV budget (``max_total_num_tokens``),
  ``chunked_prefill_size``, ``page_size`` and the model path;
* ``/generate`` with ``input_ids`` (random token ids, so requests share nothing unless a point
  asks for a cached prefix), ``max_new_tokens``, ``ignore_eos`` and temperature 0; ``meta_info``
  gives ``prompt_tokens``, ``cached_tokens``, ``completion_tokens`` and ``e2e_latency`` (and, with
  ``--enable-metrics``, ``decode_throughput`` = 1 / time per output token);
* ``/flush_cache`` between points, so a point's cache state is the one it sets up.

What is measured:

* **prefill(N new, C cached)**: a request of ``C + N`` tokens whose first ``C`` were sent just
  before (``cached_tokens`` in the reply confirms the hit), ``max_new_tokens = 1``: with
  ``--enable-metrics`` the scheduler reports when it entered the forward batch and when its prefill
  finished, which is the iteration's time; without, its server-side latency (one prefill
  iteration plus the request's fixed path through the server) is used;
* **decode(B, T)**: ``B`` concurrent requests of ``L`` prompt tokens each. The time of a decode
  step is the difference between rounds with ``M2`` and ``M1`` output tokens, divided by
  ``M2 - M1`` (the prefill and the request path cancel), at the batch's mean total KV
  ``T = B * (L + (M1 + M2) / 2)``; with ``--enable-metrics`` the per-request time per output
  token (which excludes the prefills, so it is less noisy) is fitted instead, the difference
  recorded beside it;
* **per-iteration overhead**: ``prefill.c0`` and ``decode.c0`` are the fitted time of an
  iteration with (almost) nothing to compute: the scheduler loop, the launch and sampling
  overhead (dominant on a CPU server with a tiny model). They are reported under ``overhead``;
  ``overhead.request_s`` is the client's wall time of a 1-token request minus its prefill
  iteration, i.e. the request's fixed path (HTTP, tokenizer manager, scheduler hand-off,
  detokenizer), which does not occupy the engine.

Each point is measured ``repeats`` times and its median is fitted with
:func:`topas.engine.cost.fit_relative` (least squares on the relative error, coefficients >= 0),
the same fit as ``scripts/fit_profile.py``. The profile (schema ``topas.profile/1``) records the
raw points, the fit error (mean and max relative error per part) and the KV budget; the swap
fields are placeholders when the server has no host KV tier (the fidelity runs then simulate
without one).
"""

from __future__ import annotations

import json
import math
import statistics
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from topas.engine.cost import PROFILE_SCHEMA, CostModel, decode_design, fit_relative, prefill_design

__all__ = ["ServerClient", "ServerError", "measure_prefill", "measure_decode", "fit_server_profile",
           "profile_server", "prefill_grid", "decode_grid", "server_settings"]


class ServerError(RuntimeError):
    """The server is unreachable or answered with an error (the message names the URL)."""


# ----------------------------------------------------------------------------- client
class ServerClient:
    """A minimal blocking client of SGLang's HTTP API (stdlib only; thread-safe)."""

    def __init__(self, url: str, timeout: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _request(self, path: str, body: Mapping[str, Any] | None = None, method: str | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method or ("GET" if body is None else "POST"),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                text = r.read().decode()
        except urllib.error.HTTPError as e:
            raise ServerError(f"{self.url}{path}: HTTP {e.code}: {e.read()[:300]!r}") from e
        except (urllib.error.URLError, OSError) as e:
            raise ServerError(f"{self.url}{path}: cannot reach the server: {e}") from e
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text

    def server_info(self) -> dict[str, Any]:
        for path in ("/server_info", "/get_server_info"):
            try:
                info = self._request(path)
            except ServerError:
                continue
            if isinstance(info, dict):
                return info
        raise ServerError(f"{self.url}: neither /server_info nor /get_server_info answered")

    def flush_cache(self) -> None:
        try:
            self._request("/flush_cache", {}, method="POST")
        except ServerError:
            self._request("/flush_cache")

    def generate(self, input_ids: Sequence[int], max_new_tokens: int) -> tuple[float, dict[str, Any]]:
        """One request; returns (client wall seconds, meta_info)."""
        body = {"input_ids": list(map(int, input_ids)),
                "sampling_params": {"max_new_tokens": int(max_new_tokens), "ignore_eos": True,
                                    "temperature": 0.0}}
        t0 = time.perf_counter()
        out = self._request("/generate", body)
        wall = time.perf_counter() - t0
        if not isinstance(out, dict) or "meta_info" not in out:
            raise ServerError(f"{self.url}/generate: unexpected reply {str(out)[:200]!r}")
        return wall, out["meta_info"]


def server_settings(info: Mapping[str, Any]) -> dict[str, Any]:
    """The server's KV budget and scheduler settings from its ``/server_info`` reply."""
    def find(key: str) -> Any:
        if key in info:
            return info[key]
        for st in info.get("internal_states") or []:
            if isinstance(st, Mapping) and key in st:
                return st[key]
        return None

    budget = find("max_total_num_tokens")
    return {
        "kv_budget_tokens": int(budget) if budget else None,
        "chunked_prefill_size": find("chunked_prefill_size"),
        "page_size": find("page_size") or 1,
        "max_running_requests": find("max_running_requests"),
        "model_path": find("model_path"),
        "device": find("device"),
        "attention_backend": find("attention_backend"),
        "dtype": find("dtype"),
        "enable_metrics": find("enable_metrics"),
        "schedule_policy": find("schedule_policy"),
        "version": info.get("version"),
        "max_total_tokens_arg": find("max_total_tokens"),
        "enable_hierarchical_cache": find("enable_hierarchical_cache"),
        "schedule_conservativeness": find("schedule_conservativeness"),
        "disable_overlap_schedule": find("disable_overlap_schedule"),
        "radix_eviction_policy": find("radix_eviction_policy"),
        "radix_eviction_policy_config": find("radix_eviction_policy_config"),
    }


# ----------------------------------------------------------------------------- grids
def prefill_grid(budget: int, chunk: int, quick: bool = False) -> list[tuple[int, int]]:
    """(new, cached) points that fit one chunk and the KV budget."""
    cap = min(chunk, budget) * 0.9
    news = [16, 64, 256, 512, 1024, 2048, 4096, 8192] if not quick else [16, 256, 1024]
    cacheds = [0, 256, 512, 1024, 2048, 4096] if not quick else [0, 512]
    pts = [(n, c) for n in news for c in cacheds if n <= cap and n + c <= 0.9 * budget]
    return pts


def decode_grid(budget: int, quick: bool = False, m2: int = 64) -> list[tuple[int, int]]:
    """(batch, prompt length) points whose KV at the end of a round fits 80% of the budget."""
    batches = [1, 2, 4, 8, 16, 32, 64] if not quick else [1, 4, 16]
    lengths = [32, 256, 1024] if not quick else [32, 256]
    return [(b, l) for b in batches for l in lengths if b * (l + m2 + 1) <= 0.8 * budget]


# ----------------------------------------------------------------------------- measuring
@dataclass
class _Ids:
    """Random token ids (seeded) in [lo, hi): distinct prompts share no prefix by chance."""

    seed: int = 0
    lo: int = 10
    hi: int = 30000

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def take(self, n: int) -> list[int]:
        return self.rng.integers(self.lo, self.hi, size=n).tolist()


def _latency(wall: float, meta: Mapping[str, Any]) -> float:
    e2e = meta.get("e2e_latency")
    return float(e2e) if isinstance(e2e, (int, float)) and e2e > 0 else wall


def _prefill_seconds(wall: float, meta: Mapping[str, Any]) -> float:
    """The prefill iteration as the scheduler saw it (``prefill_finished_time - forward_entry_time``,
    reported with ``--enable-metrics``), else the request's server-side latency."""
    a, b = meta.get("forward_entry_time"), meta.get("prefill_finished_time")
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > 0 and b > a:
        return float(b - a)
    return _latency(wall, meta)


def measure_prefill(client: ServerClient, points: Sequence[tuple[int, int]], repeats: int = 3,
                    ids: _Ids | None = None, log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Median latency of a 1-output-token request per (new, cached) point; see the module doc."""
    ids = ids or _Ids(1)
    rows = []
    for n, c in points:
        lat, walls, cached = [], [], []
        for _ in range(repeats):
            client.flush_cache()
            prefix = ids.take(c)
            if c:
                client.generate(prefix, 1)
            wall, meta = client.generate(prefix + ids.take(n), 1)
            lat.append(_prefill_seconds(wall, meta))
            walls.append(wall)
            cached.append(int(meta.get("cached_tokens", 0) or 0))
        row = {"new": n, "cached": c, "seconds": statistics.median(lat), "min": min(lat), "max": max(lat),
               "client_wall": statistics.median(walls), "cached_reported": statistics.median(cached)}
        rows.append(row)
        if log:
            log(f"prefill new={n:5d} cached={c:5d}: {1e3 * row['seconds']:8.2f} ms "
                f"(min {1e3 * row['min']:.2f}, max {1e3 * row['max']:.2f}; cached reported {row['cached_reported']})")
    return rows


def _round(client: ServerClient, prompts: list[list[int]], m: int) -> tuple[float, list[dict[str, Any]]]:
    with ThreadPoolExecutor(max_workers=len(prompts)) as ex:
        t0 = time.perf_counter()
        futs = [ex.submit(client.generate, p, m) for p in prompts]
        res = [f.result() for f in futs]
        wall = time.perf_counter() - t0
    return wall, [r[1] for r in res]


def measure_decode(client: ServerClient, points: Sequence[tuple[int, int]], repeats: int = 3,
                   m1: int = 8, m2: int = 64, ids: _Ids | None = None,
                   log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Median decode-step time per (batch, prompt length) point; see the module doc."""
    ids = ids or _Ids(2)
    rows = []
    for b, l in points:
        steps, tpots = [], []
        for _ in range(repeats):
            times = {}
            for m in (m1, m2):
                client.flush_cache()
                wall, metas = _round(client, [ids.take(l) for _ in range(b)], m)
                lat = max(_latency(wall, mi) for mi in metas)
                times[m] = lat
                if m == m2:
                    tp = [1.0 / mi["decode_throughput"] for mi in metas
                          if isinstance(mi.get("decode_throughput"), (int, float)) and mi["decode_throughput"] > 0]
                    if tp:
                        tpots.append(statistics.median(tp))
            steps.append((times[m2] - times[m1]) / (m2 - m1))
        # with --enable-metrics the time per output token excludes the prefills: it is the cleaner
        # number, and the one fitted; the difference of rounds is the fallback
        use = tpots if len(tpots) == repeats else steps
        row = {"batch": b, "prompt": l, "total_kv": int(b * (l + (m1 + m2) / 2)),
               "seconds": statistics.median(use), "min": min(use), "max": max(use),
               "from": "tpot" if use is tpots else "difference",
               "difference": statistics.median(steps), "tpot": statistics.median(tpots) if tpots else float("nan")}
        rows.append(row)
        if log:
            log(f"decode batch={b:3d} prompt={l:5d} kv={row['total_kv']:6d}: {1e3 * row['seconds']:7.2f} ms/step "
                f"(min {1e3 * row['min']:.2f}, max {1e3 * row['max']:.2f}; tpot {1e3 * row['tpot']:.2f})")
    return rows


def measure_request_overhead(client: ServerClient, repeats: int = 5, ids: _Ids | None = None) -> dict[str, float]:
    """Latency of a 1-token prompt with 1 output token (server-side and client wall), medians."""
    ids = ids or _Ids(3)
    lat, walls, pre = [], [], []
    for _ in range(repeats):
        wall, meta = client.generate(ids.take(1), 1)
        lat.append(_latency(wall, meta))
        walls.append(wall)
        pre.append(_prefill_seconds(wall, meta))
    return {"server_s": statistics.median(lat), "client_wall_s": statistics.median(walls),
            "prefill_iteration_s": statistics.median(pre)}


# ----------------------------------------------------------------------------- fitting
def _sig(x: float, digits: int = 6) -> float:
    x = float(x)
    return x if x == 0.0 or not math.isfinite(x) else float(f"{x:.{digits}g}")


def _err(pred: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    e = np.abs(pred - y) / y
    return {"mean_rel_err": _sig(e.mean(), 4), "max_rel_err": _sig(e.max(), 4), "n_points": int(e.size)}


def fit_server_profile(name: str, prefill_rows: Sequence[Mapping[str, Any]], decode_rows: Sequence[Mapping[str, Any]],
                       settings: Mapping[str, Any], kv_bytes_per_token: float,
                       request: Mapping[str, float] | None = None, model: Mapping[str, Any] | None = None,
                       server: str = "", device: str = "") -> dict[str, Any]:
    """Fit the prefill and decode forms to measured rows and build a ``topas.profile/1`` dict."""
    if len(prefill_rows) < 4 or len(decode_rows) < 3:
        raise ValueError(f"need >= 4 prefill and >= 3 decode points to fit, got {len(prefill_rows)} and {len(decode_rows)}")
    N = np.array([r["new"] for r in prefill_rows], float)
    C = np.array([r["cached"] for r in prefill_rows], float)
    yp = np.array([r["seconds"] for r in prefill_rows], float)
    B = np.array([r["batch"] for r in decode_rows], float)
    T = np.array([r["total_kv"] for r in decode_rows], float)
    yd = np.array([r["seconds"] for r in decode_rows], float)
    if (yp <= 0).any() or (yd <= 0).any():
        raise ValueError("a measured time is <= 0: the measurements are too noisy to fit (rerun on a quieter machine)")
    Xp, Xd = prefill_design(N, C, cached_term=True), decode_design(B, T)
    cp = [_sig(c) for c in fit_relative(Xp, yp)]
    cd = [_sig(c) for c in fit_relative(Xd, yd)]
    budget = settings.get("kv_budget_tokens")
    if not budget:
        raise ValueError("the server did not report max_total_num_tokens (its KV budget)")
    chunk = settings.get("chunked_prefill_size")
    chunk = int(chunk) if isinstance(chunk, (int, float)) and chunk and chunk > 0 else int(budget)
    request_s = None
    if request:
        # the 1-token request's latency as the client sees it minus its prefill iteration
        # (measured, else fitted): HTTP both ways, the tokenizer manager, the scheduler hand-off
        pre1 = request.get("prefill_iteration_s")
        total = float(request.get("client_wall_s") or request["server_s"])
        pre1 = float(pre1) if pre1 and pre1 < total else cp[0] + cp[1] + cp[3]
        request_s = max(0.0, total - pre1)
    profile = {
        "schema": PROFILE_SCHEMA,
        "name": name,
        "gpu": {"name": device or str(settings.get("device") or "unknown"), "measured_on": server},
        "model": dict(model or {"path": settings.get("model_path")}),
        "memory": {"kv_budget_tokens": int(budget), "kv_bytes_per_token": _sig(kv_bytes_per_token),
                   "derivation": "the server's own KV pool size (max_total_num_tokens from /server_info)"},
        "prefill": dict(zip(("c0", "c_new", "c_new_cached", "c_new_sq", "c_cached_sq"), cp)),
        "decode": dict(zip(("c0", "c_batch", "c_kv"), cd)),
        "swap": {"bandwidth_bytes_per_s": 1.0e10, "latency_s": 0.0,
                 "source": "not measured: a placeholder (the server was profiled without a host KV tier)"},
        "max_prefill_tokens": chunk,
        "method": ("Measured on a running SGLang server through /generate (topas.fidelity.profile_server): "
                   "prefill = median time of the prefill iteration of a request with max_new_tokens=1 on top "
                   "of a just-cached prefix (the scheduler's forward-entry to prefill-finished times with "
                   "--enable-metrics, else the server-side latency), fitted with an extra term quadratic "
                   "in the cached tokens (c_cached_sq: torch-native attention on a CPU works over the whole "
                   "context); decode step = the median time per output token of B concurrent requests "
                   "(with --enable-metrics; else (latency with M2 - with M1 output tokens) / (M2 - M1)); fitted by least squares on the relative error with "
                   "coefficients >= 0 (topas.engine.cost.fit_relative, as scripts/fit_profile.py)."),
        "sources": [f"measured on {server or 'a running SGLang server'}, sglang {settings.get('version')}"],
        "fit_error": {"prefill": _err(Xp @ np.array(cp), yp), "decode": _err(Xd @ np.array(cd), yd),
                      "shape_scaling": {"applies": False}},
        "overhead": {"prefill_iteration_s": cp[0], "decode_step_s": cd[0],
                     "request_s": _sig(request_s) if request_s is not None else None,
                     "request_latency": dict(request or {}),
                     "note": ("c0 of each form is the per-iteration floor (scheduler loop + launch + sampling); "
                              "request_s is the fixed per-request path outside the engine's iterations (client wall time "
                              "of a 1-token request minus its prefill iteration)")},
        "server_settings": {k: v for k, v in settings.items() if v is not None},
        "measurements": {"prefill": [dict(r) for r in prefill_rows], "decode": [dict(r) for r in decode_rows]},
    }
    CostModel.from_profile_dict(profile, source=name)  # validates
    return profile


def _kv_bytes_per_token(model_path: str | None, dtype_bytes: int = 4) -> tuple[float, dict[str, Any]]:
    """mu from the model's config.json when the path is readable here, else 1.0 (a placeholder)."""
    if model_path:
        p = Path(model_path) / "config.json"
        if p.is_file():
            cfg = json.loads(p.read_text())
            layers = int(cfg["num_hidden_layers"])
            kvh = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
            hd = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
            dt = {"float32": 4, "float16": 2, "bfloat16": 2}.get(str(cfg.get("torch_dtype")), dtype_bytes)
            return float(2 * layers * kvh * hd * dt), {"path": model_path, **{k: cfg.get(k) for k in (
                "model_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                "head_dim", "vocab_size", "torch_dtype")}}
    return 1.0, {"path": model_path, "note": "config.json not readable here: kv_bytes_per_token is a placeholder"}


def profile_server(url: str, out: str | Path, name: str | None = None, quick: bool = False, repeats: int = 3,
                   log: Callable[[str], None] | None = print, device: str = "") -> dict[str, Any]:
    """Measure the server at ``url``, fit, write the profile to ``out`` and return it."""
    client = ServerClient(url)
    info = client.server_info()
    settings = server_settings(info)
    budget = settings["kv_budget_tokens"]
    if not budget:
        raise ServerError(f"{url}: /server_info has no max_total_num_tokens")
    chunk = int(settings.get("chunked_prefill_size") or budget)
    if chunk <= 0:
        chunk = budget
    out = Path(out)
    name = name or out.stem
    if log:
        log(f"server {url}: KV budget {budget} tokens, chunked prefill {chunk}, page size {settings['page_size']}")
    client.generate(_Ids(9).take(8), 4)  # warm-up
    pre = measure_prefill(client, prefill_grid(budget, chunk, quick), repeats, log=log)
    m2 = 32 if quick else 64
    dec = measure_decode(client, decode_grid(budget, quick, m2), repeats, m2=m2, log=log)
    req = measure_request_overhead(client)
    mu, model = _kv_bytes_per_token(settings.get("model_path"))
    profile = fit_server_profile(name, pre, dec, settings, mu, req, model, server=url, device=device)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(profile, indent=2, sort_keys=True) + "\n")
    if log:
        fe = profile["fit_error"]
        log(f"wrote {out}: prefill fit error mean {fe['prefill']['mean_rel_err']:.1%} max {fe['prefill']['max_rel_err']:.1%}; "
            f"decode mean {fe['decode']['mean_rel_err']:.1%} max {fe['decode']['max_rel_err']:.1%}")
    return profile


def refit_profile(path: str | Path, out: str | Path | None = None) -> dict[str, Any]:
    """Refit a measured profile from the raw points it records (after a change of the fitted
    form), keeping its measurements, settings and metadata; writes ``out`` (default: in place)."""
    path = Path(path)
    old = json.loads(path.read_text())
    ms = old["measurements"]
    settings = dict(old.get("server_settings") or {})
    settings.setdefault("kv_budget_tokens", old["memory"]["kv_budget_tokens"])
    settings.setdefault("chunked_prefill_size", old.get("max_prefill_tokens"))
    req = (old.get("overhead") or {}).get("request_latency") or None
    gpu = old.get("gpu") or {}
    new = fit_server_profile(old["name"], ms["prefill"], ms["decode"], settings,
                             old["memory"]["kv_bytes_per_token"], req, old.get("model"),
                             server=gpu.get("measured_on", ""), device=gpu.get("name", ""))
    Path(out or path).write_text(json.dumps(new, indent=2, sort_keys=True) + "\n")
    return new
