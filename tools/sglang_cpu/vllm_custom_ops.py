"""Stub of ``vllm._custom_ops`` for the topas CPU environment (installed by build_env.sh).

``sglang/srt/layers/rotary_embedding/base.py`` imports ``rotary_embedding`` from here when no
CUDA/ROCm kernel is available; on the CPU test server the rotary embedding runs SGLang's
native PyTorch path, so this function is never called. If it ever is, it says so loudly.
"""


def rotary_embedding(*args, **kwargs):
    raise NotImplementedError(
        "vllm._custom_ops.rotary_embedding is a stub in the topas CPU environment "
        "(tools/sglang_cpu); it must not be called"
    )
