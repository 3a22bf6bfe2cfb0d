"""The engine cost model: how long a prefill iteration, a decode step and a prefix swap take.

One :class:`CostModel` is one GPU + model pair, loaded from a profile file
``data/profiles/<gpu>_<model>.json`` (schema ``topas.profile/1``, documented field by field in
``data/profiles/README.md``; written by ``scripts/fit_profile.py`` or, on a GPU box, by the GPU
profiling script). All times are in seconds, all sizes in tokens or bytes.

The paper's symbols (docs/method.md) map onto the fields as follows:

* ``mu``      = :attr:`CostModel.kv_bytes_per_token`, KV bytes per token (all layers, K and V);
* ``B_swap``  = :attr:`CostModel.swap_bandwidth`, host<->GPU bandwidth in bytes/s, so moving a
  prefix of ``l_a`` tokens costs ``mu * l_a / B_swap`` (plus a small fixed latency, our addition);
* ``B_t``     = the KV budget; the profile gives the GPU's :attr:`CostModel.kv_budget_tokens`
  (prefixes + running requests), an experiment may override it with :meth:`CostModel.with_budget`;
* ``T_decode``= the time of one decode step, :meth:`CostModel.decode_time` (J_redo charges
  ``T_decode * y_r`` for rebuilding ``y_r`` generated tokens).

The time model (fitted to measured GPU operator timings, see the profile's ``method``):

* one prefill (extend) iteration over a batch of chunks ``[(n_new, n_cached), ...]``::

      c0 + c_new * sum(n) + sum(c_new_cached * n * c + c_new_sq * n * n + c_cached_sq * c * c)

  ``c0`` is the weight-read floor plus per-iteration overhead, ``c_new`` the linear layers per new
  token, ``c_new_cached`` the attention of new tokens over cached ones (prefix-cache hits) and
  ``c_new_sq`` the attention among the new tokens plus the GEMMs' super-linear part;
  ``c_cached_sq`` (optional, default 0) a cost quadratic in a chunk's cached tokens, independent
  of its new tokens: SGLang's torch-native attention on a CPU works over the whole (cached +
  new) context of each request, so a short suffix on a long cached prefix costs ~c^2 (measured on
  the CPU test server by ``topas profile-server``; GPU kernels attend only from the new tokens,
  so the GPU profiles leave it at 0);
* one decode step of ``batch`` requests holding ``total_kv`` context tokens in all::

      c0 + c_batch * batch + c_kv * total_kv
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from topas.paths import profiles_dir

__all__ = [
    "CostModel",
    "ProfileError",
    "load_profile",
    "available_profiles",
    "DEFAULT_PROFILE",
    "PROFILE_SCHEMA",
    "fit_relative",
    "prefill_design",
    "decode_design",
]

#: The paper's setup: one A100 80GB serving Qwen2.5-32B-Instruct.
DEFAULT_PROFILE = "a100-80gb_qwen2.5-32b"
#: The profile file schema this module reads (and ``scripts/fit_profile.py`` writes).
PROFILE_SCHEMA = "topas.profile/1"


class ProfileError(ValueError):
    """A profile file (or a :class:`CostModel`) is missing, unreadable or has a bad field."""


# Numeric fields: (name, kind) where kind is "coef" (finite, >= 0), "pos" (finite, > 0),
# "posint" (integer >= 1) or "nonneg" (finite, >= 0).
_NUMERIC_FIELDS: tuple[tuple[str, str], ...] = (
    ("kv_budget_tokens", "posint"),
    ("kv_bytes_per_token", "pos"),
    ("swap_bandwidth", "pos"),
    ("swap_latency", "nonneg"),
    ("prefill_c0", "coef"),
    ("prefill_c_new", "coef"),
    ("prefill_c_new_cached", "coef"),
    ("prefill_c_new_sq", "coef"),
    ("decode_c0", "coef"),
    ("decode_c_batch", "coef"),
    ("decode_c_kv", "coef"),
    ("max_prefill_tokens", "posint"),
    ("prefill_c_cached_sq", "coef"),
)
#: Fields added after profiles and results existed: left out of :meth:`CostModel.numeric_fields`
#: (and so of :attr:`CostModel.profile_hash`) while they are 0, so older profiles keep their hash.
_OPTIONAL_FIELDS = ("prefill_c_cached_sq",)


def _check_value(value: Any, kind: str) -> str | None:
    """Why ``value`` is not acceptable for a field of ``kind``, or ``None`` if it is."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return f"must be a number, got {value!r}"
    if kind == "posint":
        if not isinstance(value, numbers.Integral):
            if not (math.isfinite(value) and float(value).is_integer()):
                return f"must be a positive integer, got {value!r}"
        if value < 1:
            return f"must be a positive integer, got {value!r}"
        return None
    if not math.isfinite(value):
        return f"must be finite, got {value!r}"
    if kind == "pos" and value <= 0:
        return f"must be positive, got {value!r}"
    if kind in ("coef", "nonneg") and value < 0:
        return f"must be non-negative, got {value!r}"
    return None


def _nonneg_int(value: Any, what: str) -> int:
    if type(value) is int and value >= 0:     # the hot path (the simulator calls this a lot)
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer():
            value = int(value)
        else:
            raise ValueError(f"{what} must be a non-negative integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class CostModel:
    """Iteration times, KV sizes and swap costs of one GPU + model (all times in seconds).

    Construct it with :func:`load_profile`; direct construction validates the fields too
    (a :class:`ProfileError` names the bad one). Instances are immutable, hashable and picklable.
    """

    name: str
    #: B: GPU KV tokens available to resident prefixes + running requests (the paper's B_t).
    kv_budget_tokens: int
    #: mu: KV bytes per token, all layers, K and V.
    kv_bytes_per_token: float
    #: B_swap: host<->GPU copy bandwidth, bytes/s.
    swap_bandwidth: float
    #: Fixed latency per swap transfer, seconds.
    swap_latency: float
    prefill_c0: float
    prefill_c_new: float
    prefill_c_new_cached: float
    prefill_c_new_sq: float
    decode_c0: float
    decode_c_batch: float
    decode_c_kv: float
    #: SGLang's chunked-prefill size for this GPU: tokens prefilled per iteration at most.
    max_prefill_tokens: int = 8192
    #: Prefill cost quadratic in a chunk's cached tokens (see the module docstring); 0 in every
    #: GPU profile.
    prefill_c_cached_sq: float = 0.0
    #: The rest of the profile (gpu, model, memory, method, sources, fit_error, path).
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        problems = [f"{n} {why}" for n, kind in _NUMERIC_FIELDS
                    if (why := _check_value(getattr(self, n), kind)) is not None]
        if problems:
            raise ProfileError(f"CostModel {self.name!r}: " + "; ".join(problems))
        for n in ("kv_budget_tokens", "max_prefill_tokens"):
            object.__setattr__(self, n, int(getattr(self, n)))
        for n, kind in _NUMERIC_FIELDS:
            if kind != "posint":
                object.__setattr__(self, n, float(getattr(self, n)))

    # ------------------------------------------------------------------ prefill
    def prefill_time(self, chunks: Sequence[tuple[int, int]]) -> float:
        """Seconds for one prefill (extend) iteration over a batch of chunks.

        ``chunks`` holds one ``(n_new, n_cached)`` per request: ``n_new`` tokens computed in this
        iteration on top of ``n_cached`` tokens whose KV is already on the GPU (a resident prefix,
        earlier chunks). Time = ``c0 + c_new * sum(n) + sum(c_new_cached*n*c + c_new_sq*n*n)
        + c_cached_sq * sum(c*c over chunks with n > 0)``.
        An empty batch (or one with no new tokens) takes 0.0.
        """
        total_new = 0
        total_cached = 0
        attn = 0.0
        for i, chunk in enumerate(chunks):
            try:
                n_raw, c_raw = chunk
            except (TypeError, ValueError):
                raise ValueError(f"prefill chunk {i} must be a pair (n_new, n_cached), got {chunk!r}") from None
            n = _nonneg_int(n_raw, f"prefill chunk {i} n_new")
            c = _nonneg_int(c_raw, f"prefill chunk {i} n_cached")
            total_new += n
            if n:
                total_cached += c * c
            attn += n * (self.prefill_c_new_cached * c + self.prefill_c_new_sq * n)
        if total_new == 0:
            return 0.0
        t = self.prefill_c0 + self.prefill_c_new * total_new + attn
        return t + self.prefill_c_cached_sq * total_cached if self.prefill_c_cached_sq else t

    # ------------------------------------------------------------------- decode
    def decode_time(self, batch: int, total_kv: int) -> float:
        """T_decode: seconds for one decode step of ``batch`` requests holding ``total_kv``
        context tokens in all (prefix tokens counted once per request that attends to them).
        ``c0 + c_batch * batch + c_kv * total_kv``; an empty batch takes 0.0."""
        b = _nonneg_int(batch, "batch")
        t = _nonneg_int(total_kv, "total_kv")
        if b == 0:
            return 0.0
        return self.decode_c0 + self.decode_c_batch * b + self.decode_c_kv * t

    def decode_steps_time(self, batch: int, kv0: int, steps: int) -> float:
        """Seconds for ``steps`` consecutive decode steps of a fixed batch whose total context
        starts at ``kv0`` and grows by ``batch`` tokens per step (each request adds one token):
        the closed form of ``sum(decode_time(batch, kv0 + batch*k) for k in range(steps))``."""
        b = _nonneg_int(batch, "batch")
        t0 = _nonneg_int(kv0, "kv0")
        s = _nonneg_int(steps, "steps")
        if b == 0 or s == 0:
            return 0.0
        first = self.decode_c0 + self.decode_c_batch * b + self.decode_c_kv * t0
        return s * first + self.decode_c_kv * b * (s * (s - 1) // 2)

    def steps_until(self, batch: int, kv0: int, seconds: float) -> int:
        """The smallest ``n >= 1`` with ``decode_steps_time(batch, kv0, n) >= seconds``.

        How many decode steps the batch completes before (or at) a deadline ``seconds`` away:
        the simulator uses it to jump over steps in closed form. Exact with respect to
        :meth:`decode_steps_time`: the quadratic is solved in floating point, then corrected by
        +-1 checks against :meth:`decode_steps_time` itself.
        """
        b = _nonneg_int(batch, "batch")
        t0 = _nonneg_int(kv0, "kv0")
        if b == 0:
            raise ValueError("steps_until needs a non-empty batch (batch >= 1)")
        if type(seconds) is not float:  # (a float is checked for nan below: the simulator's hot path)
            if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real):
                raise ValueError(f"seconds must be a real number, got {seconds!r}")
            seconds = float(seconds)
        if math.isnan(seconds):
            raise ValueError(f"seconds must be a real number, got {seconds!r}")
        if math.isinf(seconds) and seconds > 0:
            raise ValueError("steps_until(seconds=inf): no finite number of steps reaches it")
        first = self.decode_c0 + self.decode_c_batch * b + self.decode_c_kv * t0
        if first <= 0.0:
            raise ValueError(f"CostModel {self.name!r}: a decode step takes no time; "
                             "steps_until is undefined")
        f = lambda n: self.decode_steps_time(b, t0, n)  # noqa: E731
        if seconds <= first:
            return 1
        # f(n) = a n^2 + lin n, a = c_kv*b/2, lin = first - a (first > 0).
        a = 0.5 * self.decode_c_kv * b
        lin = first - a
        if a == 0.0:
            root = seconds / first
        else:
            disc = math.sqrt(lin * lin + 4.0 * a * seconds)
            # the numerically stable branch of the positive root
            root = (2.0 * seconds / (lin + disc)) if lin >= 0 else ((disc - lin) / (2.0 * a))
        n = max(1, math.ceil(root))
        while f(n) < seconds:
            n += 1
        while n > 1 and f(n - 1) >= seconds:
            n -= 1
        return n

    # --------------------------------------------------------------------- swap
    def swap_time(self, tokens: int) -> float:
        """Seconds to move ``tokens`` tokens of KV between host and GPU (either direction):
        ``swap_latency + tokens * mu / B_swap``; 0 tokens take 0.0."""
        n = _nonneg_int(tokens, "tokens")
        if n == 0:
            return 0.0
        return self.swap_latency + n * self.kv_bytes_per_token / self.swap_bandwidth

    # -------------------------------------------------------------------- other
    def with_budget(self, kv_budget_tokens: int) -> "CostModel":
        """The same model with a different KV budget B (tokens), e.g. to study memory pressure."""
        if isinstance(kv_budget_tokens, bool) or not isinstance(kv_budget_tokens, numbers.Integral) \
                or kv_budget_tokens < 1:
            raise ValueError(f"kv_budget_tokens must be a positive integer, got {kv_budget_tokens!r}")
        meta = dict(self.meta)
        meta["kv_budget_override"] = {"profile_kv_budget_tokens": self.kv_budget_tokens,
                                      "kv_budget_tokens": int(kv_budget_tokens)}
        return replace(self, kv_budget_tokens=int(kv_budget_tokens), meta=meta)

    def with_swap_bandwidth_scale(self, scale: float) -> "CostModel":
        """The same model with ``B_swap`` multiplied by ``scale`` (> 0): a slower or faster
        host<->GPU link (``EngineConfig.swap_bandwidth_scale``)."""
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"swap bandwidth scale must be a finite number > 0, got {scale!r}")
        meta = dict(self.meta)
        meta["swap_bandwidth_scale"] = {"profile_swap_bandwidth": self.swap_bandwidth, "scale": float(scale)}
        return replace(self, swap_bandwidth=self.swap_bandwidth * float(scale), meta=meta)

    def numeric_fields(self) -> dict[str, float | int]:
        """The fields that determine every time and size this model produces (an optional field,
        e.g. ``prefill_c_cached_sq``, only when it is not 0)."""
        return {n: getattr(self, n) for n, _ in _NUMERIC_FIELDS
                if n not in _OPTIONAL_FIELDS or getattr(self, n) != 0}

    @property
    def profile_hash(self) -> str:
        """sha256 (hex) of the canonical JSON of :meth:`numeric_fields`: identifies the timing
        behaviour (not the name or metadata), stable across runs and platforms."""
        canon = json.dumps(self.numeric_fields(), sort_keys=True, separators=(",", ":"),
                           allow_nan=False)
        return hashlib.sha256(canon.encode("utf-8")).hexdigest()

    @classmethod
    def from_profile_dict(cls, data: Mapping[str, Any], source: str = "<dict>") -> "CostModel":
        """Build a model from a parsed profile (schema ``topas.profile/1``); ``source`` names the
        file in error messages. Raises :class:`ProfileError` naming the offending field."""
        def err(fieldname: str, why: str) -> ProfileError:
            return ProfileError(f"profile {source}: field '{fieldname}' {why}")

        if not isinstance(data, Mapping):
            raise ProfileError(f"profile {source}: top level must be a JSON object")
        if "schema" not in data:
            raise err("schema", f"is missing (expected {PROFILE_SCHEMA!r})")
        if data["schema"] != PROFILE_SCHEMA:
            raise err("schema", f"is {data['schema']!r}, an unknown version (expected {PROFILE_SCHEMA!r})")

        def get(path: str) -> Any:
            cur: Any = data
            done = []
            for part in path.split("."):
                done.append(part)
                if not isinstance(cur, Mapping) or part not in cur:
                    raise err(".".join(done), "is missing")
                cur = cur[part]
            return cur

        def num(path: str, kind: str) -> Any:
            v = get(path)
            why = _check_value(v, kind)
            if why is not None:
                raise err(path, why)
            return v

        name = get("name")
        if not isinstance(name, str) or not name:
            raise err("name", f"must be a non-empty string, got {name!r}")
        values = {
            "kv_budget_tokens": num("memory.kv_budget_tokens", "posint"),
            "kv_bytes_per_token": num("memory.kv_bytes_per_token", "pos"),
            "swap_bandwidth": num("swap.bandwidth_bytes_per_s", "pos"),
            "swap_latency": num("swap.latency_s", "nonneg"),
            "prefill_c0": num("prefill.c0", "coef"),
            "prefill_c_new": num("prefill.c_new", "coef"),
            "prefill_c_new_cached": num("prefill.c_new_cached", "coef"),
            "prefill_c_new_sq": num("prefill.c_new_sq", "coef"),
            "decode_c0": num("decode.c0", "coef"),
            "decode_c_batch": num("decode.c_batch", "coef"),
            "decode_c_kv": num("decode.c_kv", "coef"),
            "max_prefill_tokens": num("max_prefill_tokens", "posint"),
        }
        if isinstance(data.get("prefill"), Mapping) and "c_cached_sq" in data["prefill"]:
            values["prefill_c_cached_sq"] = num("prefill.c_cached_sq", "coef")
        meta_keys = ("gpu", "model", "memory", "swap", "method", "sources", "fit_error",
                     "components", "overhead", "server_settings")
        meta = {k: data[k] for k in meta_keys if k in data}
        meta["source"] = source
        return cls(name=name, meta=meta, **values)

    def to_profile_fields(self) -> dict[str, Any]:
        """The model's numbers in the profile file's nesting (the inverse of the loader for the
        numeric part; a profile writer adds gpu/model/method/sources/fit_error)."""
        return {
            "schema": PROFILE_SCHEMA,
            "name": self.name,
            "memory": {"kv_bytes_per_token": self.kv_bytes_per_token,
                       "kv_budget_tokens": self.kv_budget_tokens},
            "prefill": {"c0": self.prefill_c0, "c_new": self.prefill_c_new,
                        "c_new_cached": self.prefill_c_new_cached, "c_new_sq": self.prefill_c_new_sq},
            "decode": {"c0": self.decode_c0, "c_batch": self.decode_c_batch, "c_kv": self.decode_c_kv},
            "swap": {"bandwidth_bytes_per_s": self.swap_bandwidth, "latency_s": self.swap_latency},
            "max_prefill_tokens": self.max_prefill_tokens,
            **({"prefill": {"c0": self.prefill_c0, "c_new": self.prefill_c_new,
                            "c_new_cached": self.prefill_c_new_cached, "c_new_sq": self.prefill_c_new_sq,
                            "c_cached_sq": self.prefill_c_cached_sq}} if self.prefill_c_cached_sq else {}),
        }


def available_profiles() -> list[str]:
    """Names of the profiles shipped in ``data/profiles/`` (sorted), loadable by name."""
    d = profiles_dir()
    if not d.is_dir():
        return []
    return sorted(p.stem for p in d.glob("*.json") if p.is_file())


def _resolve(name_or_path: str | Path) -> Path:
    if isinstance(name_or_path, Path):
        return name_or_path
    s = str(name_or_path)
    if not s:
        raise ProfileError("profile name is empty")
    if s.endswith(".json") or "/" in s or "\\" in s:
        return Path(s)
    return profiles_dir() / f"{s}.json"


def load_profile(name_or_path: str | Path = DEFAULT_PROFILE) -> CostModel:
    """Load a cost model: a profile name (``"a100-80gb_qwen2.5-32b"`` ->
    ``data/profiles/a100-80gb_qwen2.5-32b.json``) or a path to a profile JSON file.

    Raises :class:`ProfileError` (a ``ValueError``) naming the file and the offending field for
    a missing file (listing the available names), invalid JSON, an unknown schema version, a
    missing field, a negative or non-finite coefficient, or a non-positive budget, bandwidth or
    KV size.
    """
    path = _resolve(name_or_path)
    if not path.is_file():
        avail = available_profiles()
        raise ProfileError(
            f"profile file {path} not found; available profiles in {profiles_dir()}: "
            + (", ".join(avail) if avail else "(none)"))
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ProfileError(f"profile {path}: cannot read: {e}") from e
    try:
        data = json.loads(text, parse_constant=lambda c: float(c))
    except json.JSONDecodeError as e:
        raise ProfileError(f"profile {path}: invalid JSON: {e}") from e
    return CostModel.from_profile_dict(data, source=str(path))


# ----------------------------------------------------------------------------- fitting
# The least-squares fit of the time model above, shared by scripts/fit_profile.py (profiles from
# operator tables) and topas.fidelity.profile_server (profiles measured on a running server).

def prefill_design(N, C, cached_term: bool = False):
    """Design matrix of the prefill form for single-chunk iterations of ``N`` new tokens on ``C``
    cached ones: columns ``[1, N, N*C, N*N]`` (c0, c_new, c_new_cached, c_new_sq), and ``C*C``
    (c_cached_sq) with ``cached_term``."""
    import numpy as np  # lazy: numpy (~90 ms) only to fit; the policies' view imports this module

    N, C = np.asarray(N, dtype=float), np.asarray(C, dtype=float)
    X = np.c_[np.ones_like(N), N, N * C, N * N]
    return np.c_[X, C * C] if cached_term else X


def decode_design(B, T):
    """Design matrix of the decode form for steps of batch ``B`` holding ``T`` KV tokens in all:
    columns ``[1, B, T]`` (c0, c_batch, c_kv)."""
    import numpy as np  # lazy: numpy (~90 ms) only to fit; the policies' view imports this module

    B, T = np.asarray(B, dtype=float), np.asarray(T, dtype=float)
    return np.c_[np.ones_like(B), B, T]


def fit_relative(X, y):
    """Least squares on the relative error (rows divided by y), coefficients >= 0: unconstrained
    fit, then drop the most negative coefficient (fix it at 0) and refit until none is negative."""
    import numpy as np  # lazy: numpy (~90 ms) only to fit; the policies' view imports this module

    X, y = np.asarray(X, dtype=float), np.asarray(y, dtype=float)
    active = list(range(X.shape[1]))
    Xw, yw = X / y[:, None], np.ones_like(y)
    while True:
        coef = np.zeros(X.shape[1])
        coef[active] = np.linalg.lstsq(Xw[:, active], yw, rcond=None)[0]
        if (coef >= 0).all():
            return coef
        active.remove(int(np.argmin(coef)))
