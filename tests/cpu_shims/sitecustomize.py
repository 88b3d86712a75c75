"""CPU-CI process setup, imported by every Python process (also SGLang's spawned children) through PYTHONPATH.

Active only when ``SGLANG_USE_CPU_ENGINE=1``. It does two things, both test-only:

1. torchvision: PyPI's torchvision wheels are CUDA builds whose compiled ops cannot register beside the CPU
   torch, and then ``torchvision._meta_registrations`` raises at import. SGLang imports torchvision's pure-Python
   parts only, so those two registration modules are served empty when the compiled ops are missing.
2. SGLang patches, applied right after the module executes (before others bind its names):
   - ``eagle_utils.default_tree_mask_mode``: upstream picks the QLEN_ONLY tree mask on CPU, for the intel_amx
     backend; the Triton backend that CI runs reads the FULL_MASK layout (else a tree token is dropped).
   - ``speculative_hook._handle_dflash``: DFLASH refuses any device but CUDA/NPU; the check sees "cuda".
   - ``Tensor.record_stream`` is a no-op for CPU tensors (DFlash's worker calls it unconditionally).
"""

import importlib.abc
import importlib.machinery
import os
import sys

_EMPTIED_TORCHVISION_MODULES = ("torchvision._meta_registrations", "torchvision._autograd_registrations")


class _EmptyModuleLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        module.__doc__ = "emptied by the CPU-CI shim: torchvision's compiled ops are unavailable"


def _patch_eagle_utils(module) -> None:
    module.default_tree_mask_mode = lambda: module.TreeMaskMode.FULL_MASK


def _patch_speculative_hook(module) -> None:
    original = module._handle_dflash

    def handle_dflash_on_cpu(server_args, *args, **kwargs):
        device = server_args.device
        server_args.device = "cuda"
        try:
            return original(server_args, *args, **kwargs)
        finally:
            server_args.device = device

    module._handle_dflash = handle_dflash_on_cpu


def _patch_record_stream(module) -> None:
    import torch

    original = torch.Tensor.record_stream
    if getattr(original, "_cpu_ci_patched", False):
        return

    def record_stream(tensor, stream):
        if tensor.device.type != "cpu":
            original(tensor, stream)

    record_stream._cpu_ci_patched = True
    torch.Tensor.record_stream = record_stream


_SGLANG_PATCHES = {
    "sglang.srt.speculative.eagle_utils": _patch_eagle_utils,
    "sglang.srt.arg_groups.speculative_hook": _patch_speculative_hook,
    "sglang.srt.speculative.dflash_worker_v2": _patch_record_stream,
}


class _PatchAfterExec(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, patch) -> None:
        self._inner, self._patch = inner, patch

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        self._patch(module)


class _CpuCiFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in _EMPTIED_TORCHVISION_MODULES:
            extension = sys.modules.get("torchvision.extension")
            if extension is not None and extension._has_ops():
                return None
            return importlib.machinery.ModuleSpec(name, _EmptyModuleLoader())
        patch = _SGLANG_PATCHES.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None:
            spec.loader = _PatchAfterExec(spec.loader, patch)
        return spec


if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1" and not any(
    isinstance(finder, _CpuCiFinder) for finder in sys.meta_path
):
    sys.meta_path.insert(0, _CpuCiFinder())
