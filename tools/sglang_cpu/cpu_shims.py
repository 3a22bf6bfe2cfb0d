"""CPU-only import shims for SGLang 0.5.23 (installed into the lean venv by build_env.sh).

Loaded at interpreter start-up from ``topas_sglang_cpu_shims.pth``; costs nothing until
``torchvision`` is imported, and imports no heavy module itself.

1. The registry's torchvision wheel is a CUDA build: beside the CPU torch its compiled ops do
   not load, and ``torchvision/_meta_registrations.py`` then fails with "operator
   torchvision::nms does not exist". Defining the ``torchvision::nms`` and ``torchvision::qnms``
   schemas before torchvision is imported lets it import (the ops are never called here).
2. ``sglang/srt/layers/rotary_embedding/base.py`` imports ``vllm._custom_ops``; a stub package
   ``vllm`` (written by build_env.sh next to this file) satisfies the import. It is never called
   on CPU.
"""

import importlib.abc
import sys

_LIB = None


def _define_torchvision_schemas() -> None:
    global _LIB
    if _LIB is not None:
        return
    import torch

    try:
        _LIB = torch.library.Library("torchvision", "DEF")
        _LIB.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _LIB.define(
            "qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor"
        )
    except RuntimeError:  # already defined (a working torchvision build): nothing to do
        pass


class _TorchvisionFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            _define_torchvision_schemas()
        return None


sys.meta_path.insert(0, _TorchvisionFinder())
