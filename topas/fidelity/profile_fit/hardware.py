"""The model shapes and GPUs a profile is fitted for, the operators of Vidur's tables, and the
stated assumptions about SGLang's memory (usable memory, overheads, the static memory fraction)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from topas.paths import REPO_ROOT


DEFAULT_CALIBRATION = REPO_ROOT / "data" / "calibration" / "vidur"
DEFAULT_OUT = REPO_ROOT / "data" / "profiles"
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
