"""The profiles shipped in ``data/profiles/`` (:func:`specs`): which model, GPU and scaling each is
fitted with."""

from __future__ import annotations

import numpy as np

from topas.fidelity.profile_fit.build import Spec, cross_check_shape_scaling
from topas.fidelity.profile_fit.hardware import (A100_80GB, H100_80GB, KV_SAVE_NOTE, LLAMA3_8B, OVERHEAD_DECODE_MS,
    OVERHEAD_PREFILL_MS, QWEN25_32B, VIDUR_SOURCE)
from topas.fidelity.profile_fit.tables import Calibration, gpu_ratio_linear, measured_linear, shape_scaled_linear


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
