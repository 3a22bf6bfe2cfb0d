"""One profile (:class:`Spec`) fitted from the tables: the whole-model iteration time at each
measured point, the prefill and decode fits, the KV budget, the host tier; and the shape-scaling
cross-check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from topas.engine.cost import decode_design, fit_relative, prefill_design
from topas.fidelity.profile_fit.hardware import (GIB, GPU, LOAD_OVERHEAD_BYTES, OVERHEAD_DECODE_MS,
    OVERHEAD_PREFILL_MS, PCIE_EFFICIENCY, SCHEMA, SGLANG_CHUNKED_PREFILL, SGLANG_CUDA_GRAPH_MAX_BS, SWAP_LATENCY_S,
    USABLE_AT_START_BYTES, ModelShape, sglang_mem_fraction_static)
from topas.fidelity.profile_fit.tables import (Calibration, CalibrationError, LinearFn, layer_linear_ms, lm_head_ms,
    measured_linear, rel_err, shape_scaled_linear, sig)


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
        raise CalibrationError(f"{spec.name}: no KV memory left ({kv_bytes} bytes)")
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
