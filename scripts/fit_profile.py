#!/usr/bin/env python3
"""Fit the engine cost-model profiles ``data/profiles/*.json`` from measured GPU operator timings.

Usage::

    python scripts/fit_profile.py                      # (re)write every profile into data/profiles/
    python scripts/fit_profile.py --out /tmp/p         # write elsewhere
    python scripts/fit_profile.py --check              # exit 1 if data/profiles/ differs from a refit
    python scripts/fit_profile.py --calibration DIR    # the Vidur tables (default below)

Inputs: the Vidur operator tables in ``data/calibration/vidur/`` (override with
``--calibration`` or ``$TOPAS_CALIBRATION_DIR``; see that folder's README.md). Only ``csv`` and
``numpy`` are used, and the output is byte-identical on every run: keys sorted, every float rounded
to a fixed number of significant digits before it is written.

The method, in short (``data/profiles/README.md`` has it in full, with the numbers):

1. Whole-model time of one iteration at each *measured* point, Vidur's composition: per layer the
   medians of the linear operators at the iteration's token count + the attention kernel, times the
   layer count; plus the embedding once, the LM head on the sampled tokens (one per request) and a
   per-iteration CPU/scheduling overhead (an assumption). Prefill points are the 264 (chunk, cached)
   attention samples, decode points the 227 (batch, context) samples, both A100 Llama-3-8B TP1.
   ``kv_save`` (Vidur's separate KV-cache write kernel) is left out; see ``KV_SAVE_NOTE``.
2. Fit ``prefill(N, C) = c0 + c_new N + c_new_cached N C + c_new_sq N^2`` and
   ``decode(B, T) = c0 + c_batch B + c_kv T`` (T = B x context) by least squares on the *relative*
   error (rows weighted by 1/y), coefficients constrained to be >= 0 (active set).
3. Profiles other than A100 Llama-3-8B scale the measured tables by model shape or GPU, as stated
   per profile; the scaling error is estimated where the data allow it and otherwise said to be
   unquantified.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# The fit itself (design matrices, relative least squares with coefficients >= 0) lives in the
# library, shared with the server profiler (topas.fidelity.profile_server).
from topas.engine.cost import decode_design, fit_relative, prefill_design  # noqa: E402

DEFAULT_CALIBRATION = REPO / "data" / "calibration" / "vidur"
DEFAULT_OUT = REPO / "data" / "profiles"
SCHEMA = "topas.profile/1"

GIB = 1 << 30
MIB = 1 << 20

#: The per-layer linear (non-attention) operators of Vidur's ``mlp.csv`` tables, each counted once
#: per layer (Vidur's composition). ``emb`` is also in the tables and is counted once per iteration.
LAYER_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_act", "mlp_down_proj",
             "input_layernorm", "post_attention_layernorm", "attn_rope", "add")
ONCE_OPS = ("emb",)
ALL_OPS = LAYER_OPS + ONCE_OPS

VIDUR_SOURCE = ("Vidur operator profiles (microsoft/vidur, commit 7d47513, 2024-11-19, MIT), "
                "data/profiling/compute/{a100,h100}/<model>/mlp.csv and the A100 Llama-3-8B TP1 "
                "FlashInfer attention profile; copied/transcribed in data/calibration/vidur/")

KV_SAVE_NOTE = (
    "Vidur's kv_save (writing the new tokens' K/V into the paged cache) is excluded: it measures "
    "~0.56 us per token per layer (4.6 ms for 8192 tokens per layer), i.e. 4 KiB/token written at "
    "~7 GB/s, two orders of magnitude below A100 HBM bandwidth and ~20% of prefill time; SGLang "
    "stores K/V with one fused bandwidth-bound scatter (set_kv_buffer), whose cost at HBM speed "
    "(~0.7 ms for an 8192-token chunk of a 32-layer model) is below 0.2% of the prefill and is "
    "neglected.")


# ----------------------------------------------------------------------------- model and GPU
@dataclass(frozen=True)
class ModelShape:
    name: str
    hf_id: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype_bytes: int = 2
    qkv_bias: bool = False
    tied_embeddings: bool = False

    @property
    def params(self) -> int:
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if self.qkv_bias else 0)
        mlp = 3 * h * self.intermediate
        per_layer = attn + mlp + 2 * h          # + two RMSNorm weights
        emb = self.vocab * h
        head = 0 if self.tied_embeddings else self.vocab * h
        return self.layers * per_layer + emb + head + h   # + final norm

    @property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """mu = 2 (K and V) x layers x kv_heads x head_dim x dtype bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def op_size(self, op: str) -> int:
        """Per-token size of an operator (FLOPs and weight bytes both scale with it)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "attn_pre_proj": h * (q + 2 * kv),            # fused QKV projection
            "attn_post_proj": q * h,                      # O projection
            "mlp_up_proj": h * 2 * self.intermediate,     # fused gate+up projection
            "mlp_down_proj": self.intermediate * h,
            "mlp_act": self.intermediate,                 # SiLU(gate) * up, elementwise
            "input_layernorm": h, "post_attention_layernorm": h, "add": h, "emb": h,
            "attn_rope": q + kv,                          # rotary on Q and K
            "lm_head": h * self.vocab,
        }[op]

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "hf_id": self.hf_id, "params": self.params,
                "layers": self.layers, "hidden": self.hidden, "heads": self.heads,
                "kv_heads": self.kv_heads, "head_dim": self.head_dim,
                "intermediate": self.intermediate, "vocab": self.vocab,
                "dtype_bytes": self.dtype_bytes, "qkv_bias": self.qkv_bias,
                "tied_embeddings": self.tied_embeddings}


# Shapes from the models' Hugging Face config.json.
QWEN25_32B = ModelShape("Qwen2.5-32B-Instruct", "Qwen/Qwen2.5-32B-Instruct", layers=64, hidden=5120,
                        heads=40, kv_heads=8, head_dim=128, intermediate=27648, vocab=152064,
                        qkv_bias=True)
LLAMA3_8B = ModelShape("Meta-Llama-3-8B", "meta-llama/Meta-Llama-3-8B", layers=32, hidden=4096,
                       heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=128256)


@dataclass(frozen=True)
class GPU:
    name: str
    smi_mib: int              # nvidia-smi memory.total (what SGLang's heuristics read)
    hbm_bytes_per_s: float    # datasheet HBM bandwidth
    pcie: str
    pcie_bytes_per_s: float   # theoretical per-direction host link bandwidth

    @property
    def memory_bytes(self) -> int:
        return self.smi_mib * MIB


A100_80GB = GPU("NVIDIA A100-SXM4-80GB", 81920, 2.039e12, "PCIe 4.0 x16", 31.5e9)
H100_80GB = GPU("NVIDIA H100-SXM5-80GB (HBM3)", 81559, 3.35e12, "PCIe 5.0 x16", 63.0e9)

# ----------------------------------------------------------------------------- assumptions
#: Memory torch reports free when SGLang starts (its ``total_gpu_memory``): capacity minus the CUDA
#: context and driver reservations. Assumption from typical SGLang start-up logs on 80 GB parts
#: ("avail mem=78.x GB"), +-0.3 GiB.
USABLE_AT_START_BYTES = int(78.6 * GIB)
#: Memory used while loading besides the weights (buffers, rotary cache, workspaces). Assumption.
LOAD_OVERHEAD_BYTES = int(0.2 * GIB)
#: Effective share of the theoretical PCIe rate a host<->GPU KV copy achieves (pinned memory,
#: page-granular copies as in SGLang's hierarchical cache): assumption; large contiguous pinned
#: copies reach ~80%, scattered pages less.
PCIE_EFFICIENCY = 0.70
#: Fixed cost per prefix transfer (copy launch/synchronisation, per-layer page copies). Assumption.
SWAP_LATENCY_S = 1.0e-4
#: Per-iteration CPU/scheduling time not in the kernel sums (scheduler, batch preparation,
#: sampling, launch gaps not hidden by SGLang's overlap scheduler; decode runs in a CUDA graph,
#: prefill does not). Assumptions, in ms.
OVERHEAD_PREFILL_MS = 3.0
OVERHEAD_DECODE_MS = 2.0
#: SGLang v0.5.3 defaults for a GPU with 60-90 GB: chunked_prefill_size 8192, cuda_graph_max_bs 256
#: (TP < 4). server_args.py, _handle_gpu_memory_settings (PR #10975, merged 2025-09-27).
SGLANG_CHUNKED_PREFILL = 8192
SGLANG_CUDA_GRAPH_MAX_BS = 256
TP = 1


def sglang_mem_fraction_static(gpu: GPU) -> tuple[float, dict[str, float]]:
    """SGLang v0.5.3's default ``mem_fraction_static`` (server_args.py, TP1, no DP attention,
    no speculative decoding): ``round((gpu_mem - reserved) / gpu_mem, 3)``, reserved (MiB) =
    512 + 1.5 * max(chunked_prefill_size, 2048) + 2 * cuda_graph_max_bs + tp*pp/8 * 1024,
    at least 10 GiB when gpu_mem > 60 GiB."""
    reserved = 512 + 1.5 * max(SGLANG_CHUNKED_PREFILL, 2048) + 2 * SGLANG_CUDA_GRAPH_MAX_BS \
        + TP * 1 / 8 * 1024
    if gpu.smi_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu.smi_mib - reserved) / gpu.smi_mib, 3), {"reserved_mib": reserved}


# ----------------------------------------------------------------------------- the tables
class OpTable:
    """One Vidur ``mlp.csv`` at TP1: per operator the median kernel time (ms) vs ``num_tokens``.
    Rows repeated for a token count are averaged."""

    def __init__(self, path: Path):
        self.path = path
        with path.open(newline="") as f:
            rows = [r for r in csv.DictReader(f) if r["num_tensor_parallel_workers"] == "1"]
        if not rows:
            raise SystemExit(f"{path}: no TP1 rows")
        missing = [op for op in ALL_OPS if f"time_stats.{op}.median" not in rows[0]]
        if missing:
            raise SystemExit(f"{path}: missing operator columns {missing}")
        acc: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        for r in rows:
            for op in ALL_OPS:
                acc[op][int(r["num_tokens"])].append(float(r[f"time_stats.{op}.median"]))
        self.n = np.array(sorted(acc[ALL_OPS[0]]), dtype=float)
        self.t = {op: np.array([np.mean(acc[op][int(k)]) for k in self.n]) for op in ALL_OPS}
        r0 = rows[0]
        heads, hidden = int(r0["n_head"]), int(r0["n_embd"])
        self.shape = ModelShape(path.stem, "", layers=0, hidden=hidden, heads=heads,
                                kv_heads=int(r0["n_kv_head"]), head_dim=hidden // heads,
                                intermediate=int(r0["n_expanded_embd"]),
                                vocab=int(r0["vocab_size"]))
        self.n_max = int(self.n[-1])

    def at(self, op: str, tokens: np.ndarray) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=float)
        if tokens.min() < self.n[0] or tokens.max() > self.n[-1]:
            raise ValueError(f"{self.path.name}: {op} asked outside the measured range")
        return np.interp(tokens, self.n, self.t[op])


def read_points(path: Path) -> dict[str, np.ndarray]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return {k: np.array([float(r[k]) for r in rows]) for k in rows[0]}


@dataclass
class Calibration:
    root: Path
    l3: OpTable            # A100 Llama-3-8B
    cl34: OpTable          # A100 CodeLlama-34B
    l2_7_a100: OpTable
    l2_7_h100: OpTable
    l2_70: OpTable
    qwen72: OpTable
    prefill: dict[str, np.ndarray]   # chunk, kv, attn_prefill, kv_save  (ms per layer)
    decode: dict[str, np.ndarray]    # batch, kv, attn_decode (ms per layer)

    @classmethod
    def load(cls, root: Path) -> "Calibration":
        need = ["a100_Meta-Llama-3-8B_mlp.csv", "a100_CodeLlama-34b-Instruct-hf_mlp.csv",
                "a100_Llama-2-7b-hf_mlp.csv", "h100_Llama-2-7b-hf_mlp.csv",
                "a100_Llama-2-70b-hf_mlp.csv", "a100_Qwen-72B_mlp.csv",
                "a100_l3_8b_tp1_prefill_sampled.csv", "a100_l3_8b_tp1_decode_sampled.csv"]
        if not root.is_dir():
            raise SystemExit(
                f"calibration folder {root} not found: the Vidur operator tables are needed "
                "(data/calibration/vidur in the repository; pass --calibration DIR or set "
                "$TOPAS_CALIBRATION_DIR)")
        absent = [f for f in need if not (root / f).is_file()]
        if absent:
            raise SystemExit(f"calibration folder {root} lacks {absent}")
        return cls(root, OpTable(root / need[0]), OpTable(root / need[1]), OpTable(root / need[2]),
                   OpTable(root / need[3]), OpTable(root / need[4]), OpTable(root / need[5]),
                   read_points(root / need[6]), read_points(root / need[7]))


# ----------------------------------------------------------------------------- linear operators
LinearFn = Callable[[str, np.ndarray], np.ndarray]   # (op, tokens) -> ms (per layer, or once)


def measured_linear(table: OpTable) -> LinearFn:
    return lambda op, n: table.at(op, n)


def shape_scaled_linear(base: OpTable, target: ModelShape, tail: OpTable | None = None) -> LinearFn:
    """``base``'s per-op times scaled by the per-token size ratio of each operator
    (``ModelShape.op_size``). Above ``base``'s largest token count, the op's time at that count is
    extended along ``tail``'s measured growth curve (same op, same GPU)."""
    def f(op: str, n: np.ndarray) -> np.ndarray:
        n = np.asarray(n, dtype=float)
        ratio = target.op_size(op) / base.shape.op_size(op)
        inside = np.minimum(n, base.n_max)
        out = base.at(op, inside) * ratio
        if tail is not None and (n > base.n_max).any():
            grow = tail.at(op, np.maximum(n, base.n_max)) / tail.at(op, np.array([base.n_max]))
            out = out * grow
        elif (n > base.n_max).any():
            raise ValueError(f"{op}: token count above {base.n_max} and no tail table")
        return out
    return f


def gpu_ratio_linear(base: LinearFn, a100: OpTable, h100: OpTable) -> LinearFn:
    """``base`` (A100) times the measured H100/A100 ratio of the same operator at the same token
    count (Llama-2-7B tables); above their largest count, the op's mean ratio over 2048..4096."""
    hi = (a100.n >= 2048) & (a100.n <= a100.n_max)

    def f(op: str, n: np.ndarray) -> np.ndarray:
        n = np.asarray(n, dtype=float)
        r = h100.t[op] / a100.t[op]
        ratio = np.where(n <= a100.n_max, np.interp(np.minimum(n, a100.n_max), a100.n, r),
                         float(np.mean(r[hi])))
        return base(op, n) * ratio
    return f


def layer_linear_ms(lin: LinearFn, n: np.ndarray) -> np.ndarray:
    return sum(lin(op, n) for op in LAYER_OPS)


def lm_head_ms(lin: LinearFn, model: ModelShape, sampled: np.ndarray) -> np.ndarray:
    """LM head on ``sampled`` tokens: a [k, hidden] x [hidden, vocab] GEMM, estimated from the
    model's own fused gate+up GEMM ([k, hidden] x [hidden, 2*intermediate]) scaled by the weight
    size ratio vocab / (2 * intermediate) (both weight-read bound at these token counts)."""
    return lin("mlp_up_proj", sampled) * model.op_size("lm_head") / model.op_size("mlp_up_proj")


# ----------------------------------------------------------------------------- fitting
def sig(x: float, digits: int = 6) -> float:
    """``x`` rounded to ``digits`` significant digits (the fixed formatting of the JSON)."""
    x = float(x)
    if x == 0.0 or not math.isfinite(x):
        return x
    return float(f"{x:.{digits}g}")


def rel_err(pred: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    e = np.abs(pred - y) / y
    return {"mean_rel_err": sig(e.mean(), 4), "max_rel_err": sig(e.max(), 4), "n_points": int(e.size)}


# ----------------------------------------------------------------------------- one profile
@dataclass
class Spec:
    name: str
    gpu: GPU
    model: ModelShape
    linear: LinearFn
    attn_prefill_scale: float
    attn_decode_scale: float
    method: str
    sources: list[str]
    scaling_error: dict[str, Any]


def build(spec: Spec, cal: Calibration) -> dict[str, Any]:
    m, L = spec.model, spec.model.layers
    # ---- prefill points: one request, N new tokens on top of C cached ones
    N, C = cal.prefill["chunk"], cal.prefill["kv"]
    one = np.ones_like(N)
    pre_layers = L * (layer_linear_ms(spec.linear, N) + spec.attn_prefill_scale * cal.prefill["attn_prefill"])
    pre_emb = spec.linear("emb", N)
    pre_head = lm_head_ms(spec.linear, m, one)
    y_pre_kernels = pre_layers + pre_emb
    y_pre = y_pre_kernels + pre_head + OVERHEAD_PREFILL_MS
    # ---- decode points: B requests each with K context tokens, T = B*K
    B, K = cal.decode["batch"], cal.decode["kv"]
    T = B * K
    dec_layers = L * (layer_linear_ms(spec.linear, B) + spec.attn_decode_scale * cal.decode["attn_decode"])
    y_dec_kernels = dec_layers + spec.linear("emb", B)
    y_dec = y_dec_kernels + lm_head_ms(spec.linear, m, B) + OVERHEAD_DECODE_MS

    Xp, Xd = prefill_design(N, C), decode_design(B, T)
    cp = [sig(c * 1e-3) for c in fit_relative(Xp, y_pre)]          # seconds
    cd = [sig(c * 1e-3) for c in fit_relative(Xd, y_dec)]
    # the fit of the Vidur kernels alone (layers + embedding; no LM head, no overhead): the
    # number to compare with data/calibration/vidur/README.md's "first fit"
    kp = [sig(c * 1e-3) for c in fit_relative(Xp, y_pre_kernels)]
    kd = [sig(c * 1e-3) for c in fit_relative(Xd, y_dec_kernels)]

    # ---- memory
    frac, frac_detail = sglang_mem_fraction_static(spec.gpu)
    mu = m.kv_bytes_per_token
    kv_bytes = int(frac * USABLE_AT_START_BYTES) - m.weight_bytes - LOAD_OVERHEAD_BYTES
    budget = kv_bytes // mu
    if budget < 1:
        raise SystemExit(f"{spec.name}: no KV memory left ({kv_bytes} bytes)")
    # the feasible region of this profile: requests that fit in its KV budget
    feas_p = (N + C) <= budget
    feas_d = T <= budget

    def errs(coef_s: list[float], X: np.ndarray, y_ms: np.ndarray, feas: np.ndarray) -> dict[str, Any]:
        pred = X @ (np.array(coef_s) * 1e3)
        out = rel_err(pred, y_ms)
        out["within_kv_budget"] = rel_err(pred[feas], y_ms[feas]) if feas.sum() >= 3 else {
            "n_points": int(feas.sum()), "note": "too few measured points fit in this budget"}
        return out

    fit_error = {
        "target": ("relative error of the fitted formula against the composed per-point times "
                   "(measured kernels + the stated estimates), on the measured points; "
                   "'within_kv_budget' restricts to points that fit in this profile's KV budget"),
        "prefill": errs(cp, Xp, y_pre, feas_p),
        "decode": errs(cd, Xd, y_dec, feas_d),
        "shape_scaling": spec.scaling_error,
    }
    components = {
        "note": ("fits of the Vidur kernel sums alone (layers x (linear ops + attention) + "
                 "embedding), without the LM head and the CPU overhead, seconds; for A100 "
                 "Llama-3-8B this is the quantity of data/calibration/vidur/README.md's first fit "
                 "(without kv_save)"),
        "kernels_only_prefill": dict(zip(("c0", "c_new", "c_new_cached", "c_new_sq"), kp)),
        "kernels_only_decode": dict(zip(("c0", "c_batch", "c_kv"), kd)),
        "kernels_only_fit_error": {"prefill": rel_err(Xp @ (np.array(kp) * 1e3), y_pre_kernels),
                                   "decode": rel_err(Xd @ (np.array(kd) * 1e3), y_dec_kernels)},
        "lm_head_s": {"one_token": sig(float(lm_head_ms(spec.linear, m, np.array([1.0]))[0]) * 1e-3),
                      "batch_256": sig(float(lm_head_ms(spec.linear, m, np.array([256.0]))[0]) * 1e-3)},
        "overhead_s": {"prefill_iteration": sig(OVERHEAD_PREFILL_MS * 1e-3),
                       "decode_step": sig(OVERHEAD_DECODE_MS * 1e-3)},
        "attention_scale": {"prefill": sig(spec.attn_prefill_scale), "decode": sig(spec.attn_decode_scale)},
    }
    swap_bw = sig(PCIE_EFFICIENCY * spec.gpu.pcie_bytes_per_s)
    return {
        "schema": SCHEMA,
        "name": spec.name,
        "gpu": {"name": spec.gpu.name, "memory_bytes": spec.gpu.memory_bytes,
                "hbm_bytes_per_s": sig(spec.gpu.hbm_bytes_per_s), "host_link": spec.gpu.pcie},
        "model": m.as_json(),
        "memory": {
            "weight_bytes": m.weight_bytes,
            "mem_fraction_static": frac,
            "usable_at_start_bytes": USABLE_AT_START_BYTES,
            "load_overhead_bytes": LOAD_OVERHEAD_BYTES,
            "kv_bytes_per_token": mu,
            "kv_budget_tokens": int(budget),
            "derivation": (
                "SGLang's KV pool: B = floor((mem_fraction_static * M0 - W - R) / mu). "
                f"mem_fraction_static = {frac}: SGLang v0.5.3's default for this GPU at TP1, "
                f"round((gpu_mem - reserved) / gpu_mem, 3) with gpu_mem = {spec.gpu.smi_mib} MiB "
                f"(nvidia-smi) and reserved = {frac_detail['reserved_mib']:.0f} MiB (512 + "
                f"1.5 x chunked_prefill_size {SGLANG_CHUNKED_PREFILL} + 2 x cuda_graph_max_bs "
                f"{SGLANG_CUDA_GRAPH_MAX_BS} + 128 for TP1); the activation/CUDA-graph reserve is "
                "the remaining (1 - mem_fraction_static) share. M0 = memory free when SGLang "
                f"starts, assumed {USABLE_AT_START_BYTES / GIB:.1f} GiB (+-0.3 GiB); "
                f"W = {m.params} params x {m.dtype_bytes} bytes; R = "
                f"{LOAD_OVERHEAD_BYTES / GIB:.1f} GiB loaded besides the weights (assumption); "
                f"mu = 2 x {m.layers} layers x {m.kv_heads} kv heads x {m.head_dim} x "
                f"{m.dtype_bytes} bytes = {mu}. One GiB more or less changes B by "
                f"{GIB // mu} tokens."),
        },
        "prefill": dict(zip(("c0", "c_new", "c_new_cached", "c_new_sq"), cp)),
        "decode": dict(zip(("c0", "c_batch", "c_kv"), cd)),
        "swap": {
            "bandwidth_bytes_per_s": swap_bw,
            "latency_s": SWAP_LATENCY_S,
            "source": (
                f"{spec.gpu.pcie} host link, {spec.gpu.pcie_bytes_per_s / 1e9:.1f} GB/s per direction "
                f"theoretical; assumed {PCIE_EFFICIENCY:.0%} effective for KV-page copies from/to "
                f"pinned host memory = {swap_bw / 1e9:.2f} GB/s (an assumption: large contiguous "
                "pinned copies reach ~80%, page-scattered copies less); a fixed "
                f"{SWAP_LATENCY_S * 1e3:.1f} ms per transfer for copy launch and synchronisation "
                "(an assumption)."),
        },
        "max_prefill_tokens": SGLANG_CHUNKED_PREFILL,
        "method": spec.method,
        "sources": spec.sources,
        "fit_error": fit_error,
        "components": components,
    }


# ----------------------------------------------------------------------------- scaling checks
def cross_check_shape_scaling(cal: Calibration, tokens: np.ndarray) -> dict[str, Any]:
    """Error of the shape scaling used for Qwen2.5-32B, measured where we can: predict the per-layer
    linear-op time of the other A100 tables from CodeLlama-34B by the same per-op size ratios and
    compare with their measured times, at the given token counts (<= 4096)."""
    out: dict[str, Any] = {}
    for table in (cal.l3, cal.l2_7_a100, cal.l2_70, cal.qwen72):
        lin = shape_scaled_linear(cal.cl34, table.shape)
        pred = layer_linear_ms(lin, tokens)
        meas = layer_linear_ms(measured_linear(table), tokens)
        e = (pred - meas) / meas
        s = table.shape
        out[table.path.name.split("_")[1]] = {
            "hidden": s.hidden, "heads": s.heads, "kv_heads": s.kv_heads,
            "intermediate": s.intermediate,
            "mean_abs_rel_err": sig(np.abs(e).mean(), 3), "max_abs_rel_err": sig(np.abs(e).max(), 3),
            "mean_signed_rel_err": sig(e.mean(), 3)}
    return out


def specs(cal: Calibration) -> list[Spec]:
    vidur_common = [
        VIDUR_SOURCE,
        "SGLang v0.5.3 server_args.py _handle_gpu_memory_settings (sgl-project/sglang PR #10975, "
        "merged 2025-09-27): chunked_prefill_size 8192 and cuda_graph_max_bs 256 for 60-90 GB "
        "GPUs at TP<4; mem_fraction_static = round((gpu_mem - reserved)/gpu_mem, 3)",
        "SGLang ModelRunner.profile_max_num_token: KV pool = free memory after loading - "
        "total memory x (1 - mem_fraction_static)",
    ]
    # token counts at which the two fits evaluate linear operators, for the scaling cross-check
    pre_tokens = np.unique(np.minimum(cal.prefill["chunk"], 4096))
    dec_tokens = np.unique(cal.decode["batch"])
    shape_check = {
        "method": ("per-op size-ratio scaling from A100 CodeLlama-34B (hidden 8192, 64 heads, 8 kv "
                   "heads, intermediate 22016) applied to the other measured A100 tables; "
                   "per-layer linear-op sum, relative error vs measured"),
        "at_prefill_token_counts": cross_check_shape_scaling(cal, pre_tokens),
        "at_decode_batch_sizes": cross_check_shape_scaling(cal, dec_tokens),
    }
    l3_linear = measured_linear(cal.l3)
    h100_linear = gpu_ratio_linear(l3_linear, cal.l2_7_a100, cal.l2_7_h100)
    hbm = A100_80GB.hbm_bytes_per_s / H100_80GB.hbm_bytes_per_s
    q = QWEN25_32B
    qwen_attn_prefill = (q.heads * q.head_dim) / (LLAMA3_8B.heads * LLAMA3_8B.head_dim)
    qwen_attn_decode = (q.kv_heads * q.head_dim) / (LLAMA3_8B.kv_heads * LLAMA3_8B.head_dim)
    cl = cal.cl34.shape
    common_method = (
        "Whole-model iteration time at each measured point = layers x (sum of the per-layer linear "
        "operators' median kernel times at the iteration's token count + attention) + embedding "
        "once + LM head on the sampled tokens (one per request; estimated from the model's own "
        "gate+up GEMM x vocab/(2 x intermediate)) + a per-iteration CPU/scheduling overhead "
        f"(assumed: {OVERHEAD_PREFILL_MS:g} ms per prefill iteration, {OVERHEAD_DECODE_MS:g} ms per "
        "decode step). Prefill points: Vidur's 264 A100 Llama-3-8B FlashInfer attention samples "
        "(chunk N of new tokens over C cached, N 64..9600, C 0..15360, one request); decode points: "
        "its 227 decode samples (B requests x K context, B 1..512, K 672..8960, T = B x K). "
        "Fitted by least squares on the relative error with non-negative coefficients: "
        "prefill = c0 + c_new N + c_new_cached N C + c_new_sq N^2 (a batch: linear terms on the "
        "total, attention terms per request), decode = c0 + c_batch B + c_kv T. " + KV_SAVE_NOTE)
    return [
        Spec(
            name="a100-80gb_qwen2.5-32b", gpu=A100_80GB, model=q,
            linear=shape_scaled_linear(cal.cl34, q, tail=cal.l3),
            attn_prefill_scale=qwen_attn_prefill, attn_decode_scale=qwen_attn_decode,
            method=common_method + (
                " SHAPE-SCALED (the paper's setup; no measured Qwen2.5-32B table exists here): "
                "linear operators from the closest measured table, A100 CodeLlama-34B (CSV: "
                f"hidden {cl.hidden}, {cl.heads} heads, {cl.kv_heads} kv heads, intermediate "
                f"{cl.intermediate}, 48 layers), each scaled by its per-token size ratio (FLOPs "
                "and weight bytes scale alike, so the ratio holds in both the memory- and the "
                "compute-bound regime): QKV by hidden x (heads + 2 kv_heads) x head_dim "
                f"({q.op_size('attn_pre_proj') / cl.op_size('attn_pre_proj'):.4f}), O by "
                f"hidden x heads x head_dim ({q.op_size('attn_post_proj') / cl.op_size('attn_post_proj'):.4f}), "
                f"gate+up and down by hidden x intermediate ({q.op_size('mlp_up_proj') / cl.op_size('mlp_up_proj'):.4f}), "
                f"activation by intermediate ({q.op_size('mlp_act') / cl.op_size('mlp_act'):.4f}), "
                f"norms/add/embedding by hidden ({q.op_size('add') / cl.op_size('add'):.4f}), rotary "
                f"by (heads + kv_heads) x head_dim ({q.op_size('attn_rope') / cl.op_size('attn_rope'):.4f}), "
                f"and summed over Qwen's {q.layers} layers. Above 4096 tokens (CodeLlama's largest) "
                "each op follows the measured A100 Llama-3-8B growth curve of the same op. "
                "Attention from the A100 Llama-3-8B samples: Qwen2.5-32B has the same KV per layer "
                f"(8 kv heads x 128), so decode attention (KV-read bound) is scaled by "
                f"{qwen_attn_decode:g}; prefill attention (compute bound) by the query-head ratio "
                f"40/32 = {qwen_attn_prefill:g}. The scaling adds error that the fit error does "
                "not include: for the linear operators it is estimated by the cross-check in "
                "fit_error.shape_scaling; for attention it is unquantified."),
            sources=vidur_common + [
                "Qwen/Qwen2.5-32B-Instruct config.json (Hugging Face): 64 layers, hidden 5120, "
                "40 heads, 8 kv heads, intermediate 27648, vocab 152064, untied embeddings, "
                "QKV bias, bfloat16",
                "PCI-SIG PCIe 4.0: 16 GT/s x 16 lanes, 128b/130b = 31.5 GB/s per direction",
                "NVIDIA A100 datasheet: 80GB SXM HBM2e 2,039 GB/s",
            ],
            scaling_error={
                "applies": True,
                "statement": ("The linear operators are shape-scaled and attention is scaled by "
                              "head counts: this adds error not included in the fit errors. Its "
                              "linear-operator part is estimated by the cross-check below; the "
                              "attention part is unquantified (one attention table exists)."),
                "linear_ops_cross_check": shape_check,
            },
        ),
        Spec(
            name="a100-80gb_llama3-8b", gpu=A100_80GB, model=LLAMA3_8B,
            linear=l3_linear, attn_prefill_scale=1.0, attn_decode_scale=1.0,
            method=common_method + (
                " MEASURED: every layer operator and the attention come from A100 Llama-3-8B TP1 "
                "tables (no shape scaling). Only the LM head (from the measured gate+up GEMM) and "
                "the CPU overhead are estimates. The kernels-only fit (components) reproduces "
                "data/calibration/vidur/README.md's first fit."),
            sources=vidur_common + [
                "meta-llama/Meta-Llama-3-8B config.json (Hugging Face): 32 layers, hidden 4096, "
                "32 heads, 8 kv heads, intermediate 14336, vocab 128256, untied, bfloat16",
                "PCI-SIG PCIe 4.0: 16 GT/s x 16 lanes, 128b/130b = 31.5 GB/s per direction",
            ],
            scaling_error={"applies": False,
                           "statement": "none for the layers and attention: all measured on this GPU and model"},
        ),
        Spec(
            name="h100-80gb_llama3-8b", gpu=H100_80GB, model=LLAMA3_8B,
            linear=h100_linear, attn_prefill_scale=hbm, attn_decode_scale=hbm,
            method=common_method + (
                " GPU-SCALED: A100 Llama-3-8B tables moved to H100 SXM. Linear operators: the A100 "
                "time of each op times the measured H100/A100 ratio of the same op at the same "
                "token count in the Llama-2-7B tables (per op, per token count, linear "
                "interpolation; above 4096 tokens the op's mean ratio over 2048..4096); the ratio "
                "runs from ~0.6 (weight-read bound, small batches) to ~0.3 (compute bound). "
                f"Attention: times the HBM bandwidth ratio A100/H100 = 2.039/3.35 = {hbm:.4f} "
                "(an assumption: exact for KV-read-bound decode attention, conservative for "
                "compute-bound prefill attention, where H100 gains more; the kernels also differ, "
                "SGLang uses FA3 on H100). The scaling adds error that the fit error does not "
                "include, and it is unquantified (no measured H100 Llama-3-8B or attention table "
                "here)."),
            sources=vidur_common + [
                "meta-llama/Meta-Llama-3-8B config.json (Hugging Face)",
                "NVIDIA H100 datasheet: H100 SXM 80GB HBM3 3.35 TB/s; A100 80GB SXM 2,039 GB/s",
                "PCI-SIG PCIe 5.0: 32 GT/s x 16 lanes = 63 GB/s per direction",
            ],
            scaling_error={
                "applies": True,
                "statement": ("GPU-scaled (per-op H100/A100 ratios from Llama-2-7B, attention by "
                              "the HBM ratio): adds error not included in the fit errors, "
                              "unquantified."),
            },
        ),
    ]


# ----------------------------------------------------------------------------- output
def dumps(profile: dict[str, Any]) -> str:
    return json.dumps(profile, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


def fit_all(cal_dir: Path) -> dict[str, str]:
    cal = Calibration.load(cal_dir)
    return {s.name: dumps(build(s, cal)) for s in specs(cal)}


def write(texts: dict[str, str], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in texts.items():
        p = out / f"{name}.json"
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=out, delete=False,
                                         prefix=f".{name}.", suffix=".tmp") as f:
            f.write(text)
        os.chmod(f.name, 0o644)
        os.replace(f.name, p)
        paths.append(p)
    return paths


def summary(path: Path) -> str:
    from topas.engine.cost import load_profile   # validates what was written
    cm = load_profile(path)
    fe = cm.meta["fit_error"]
    return (f"{cm.name}: B={cm.kv_budget_tokens} tokens, mu={cm.kv_bytes_per_token:g} B/token | "
            f"prefill 4k={cm.prefill_time([(4096, 0)]):.3f}s (err mean {fe['prefill']['mean_rel_err']:.1%}, "
            f"max {fe['prefill']['max_rel_err']:.1%}) | decode b32@32k={cm.decode_time(32, 32768) * 1e3:.1f}ms "
            f"(err mean {fe['decode']['mean_rel_err']:.1%}, max {fe['decode']['max_rel_err']:.1%})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calibration", type=Path,
                    default=Path(os.environ.get("TOPAS_CALIBRATION_DIR", DEFAULT_CALIBRATION)),
                    help="folder with the Vidur tables (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write (default: %(default)s)")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if the files in --out differ from a refit")
    args = ap.parse_args(argv)
    texts = fit_all(args.calibration)
    if args.check:
        bad = [n for n, t in texts.items()
               if not (args.out / f"{n}.json").is_file()
               or (args.out / f"{n}.json").read_text(encoding="utf-8") != t]
        for n in bad:
            print(f"differs from a refit: {args.out / (n + '.json')}", file=sys.stderr)
        return 1 if bad else 0
    for p in write(texts, args.out):
        print(summary(p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
