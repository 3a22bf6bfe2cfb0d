"""Fit the engine cost-model profiles ``data/profiles/*.json`` from measured GPU operator timings
(``scripts/fit_profile.py`` is its command line).

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

from topas.fidelity.profile_fit.hardware import (  # noqa: F401
    A100_80GB,
    ALL_OPS,
    DEFAULT_CALIBRATION,
    DEFAULT_OUT,
    GIB,
    GPU,
    H100_80GB,
    KV_SAVE_NOTE,
    LAYER_OPS,
    LLAMA3_8B,
    LOAD_OVERHEAD_BYTES,
    MIB,
    ModelShape,
    ONCE_OPS,
    OVERHEAD_DECODE_MS,
    OVERHEAD_PREFILL_MS,
    PCIE_EFFICIENCY,
    QWEN25_32B,
    SCHEMA,
    SGLANG_CHUNKED_PREFILL,
    SGLANG_CUDA_GRAPH_MAX_BS,
    SWAP_LATENCY_S,
    TP,
    USABLE_AT_START_BYTES,
    VIDUR_SOURCE,
    sglang_mem_fraction_static,
)
from topas.fidelity.profile_fit.tables import (  # noqa: F401
    CalibrationError,
    Calibration,
    LinearFn,
    OpTable,
    gpu_ratio_linear,
    layer_linear_ms,
    lm_head_ms,
    measured_linear,
    read_points,
    rel_err,
    shape_scaled_linear,
    sig,
)
from topas.fidelity.profile_fit.build import (  # noqa: F401
    Spec,
    build,
    cross_check_shape_scaling,
)
from topas.fidelity.profile_fit.catalog import (  # noqa: F401
    specs,
)
from topas.fidelity.profile_fit.output import (  # noqa: F401
    dumps,
    fit_all,
    summary,
    write,
)

__all__ = [
    "CalibrationError",
    "A100_80GB",
    "ALL_OPS",
    "Calibration",
    "DEFAULT_CALIBRATION",
    "DEFAULT_OUT",
    "GIB",
    "GPU",
    "H100_80GB",
    "KV_SAVE_NOTE",
    "LAYER_OPS",
    "LLAMA3_8B",
    "LOAD_OVERHEAD_BYTES",
    "LinearFn",
    "MIB",
    "ModelShape",
    "ONCE_OPS",
    "OVERHEAD_DECODE_MS",
    "OVERHEAD_PREFILL_MS",
    "OpTable",
    "PCIE_EFFICIENCY",
    "QWEN25_32B",
    "SCHEMA",
    "SGLANG_CHUNKED_PREFILL",
    "SGLANG_CUDA_GRAPH_MAX_BS",
    "SWAP_LATENCY_S",
    "Spec",
    "TP",
    "USABLE_AT_START_BYTES",
    "VIDUR_SOURCE",
    "build",
    "cross_check_shape_scaling",
    "dumps",
    "fit_all",
    "gpu_ratio_linear",
    "layer_linear_ms",
    "lm_head_ms",
    "measured_linear",
    "read_points",
    "rel_err",
    "sglang_mem_fraction_static",
    "shape_scaled_linear",
    "sig",
    "specs",
    "summary",
    "write",
]
