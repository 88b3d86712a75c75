"""CPU-CI process setup, imported by every Python process (also SGLang's spawned children) through PYTHONPATH.

Active only when ``SGLANG_USE_CPU_ENGINE=1``. It does four things, all test-only:

1. torchvision: PyPI's torchvision wheels are CUDA builds whose compiled ops cannot register beside the CPU
   torch, and then ``torchvision._meta_registrations`` raises at import. SGLang imports torchvision's pure-Python
   parts only, so those two registration modules are served empty when the compiled ops are missing.
2. SGLang patches, applied right after the module executes (before others bind its names; so is 3):
   - ``eagle_utils.default_tree_mask_mode``: upstream picks the QLEN_ONLY tree mask on CPU, for the intel_amx
     backend; the Triton backend that CI runs reads the FULL_MASK layout (else a tree token is dropped).
   - ``speculative_hook._handle_dflash``: DFLASH refuses any device but CUDA/NPU; the check sees "cuda".
   - ``Tensor.record_stream`` is a no-op for CPU tensors (DFlash's worker calls it unconditionally).
   - ``torch.cuda.synchronize`` is a no-op without CUDA (Qwen3.5's MTP ``set_embed_and_head`` calls it
     unconditionally).
   - ``MambaPool.__init__`` allocates the speculative buffers (per-draft SSM states and conv windows) with
     ``device="cuda"`` hard-coded; those allocations go to the pool's own device.
   - ``mamba_state_scatter_triton``: the commit of accepted SSM states and conv windows after a verify refuses
     non-CUDA tensors; on CPU it is the same gather-scatter in torch indexing.
   - ``layernorm_gated._get_sm_count``: the Triton gated RMSNorm (Qwen3.5's GDN output norm; the CPU engine runs
     it when the CPU lacks AMX) sizes its row blocks from ``torch.cuda``'s SM count; on CPU it counts 1.
   - ``xgrammar_backend``: the grammar bitmask is allocated pinned (no pinned allocator without CUDA: the
     scheduler crashed on the first grammar request, AR's too) and applied only to CUDA/NPU logits; on CPU it is
     allocated unpinned and applied with xgrammar's own CPU kernel.
   - ``ServerArgs._validate_mamba_extra_buffer``: the prefix cache's ``extra_buffer`` strategy for GDN states (the
     tracking of a state at every ``mamba_track_interval`` tokens) is refused without a GPU ("needs FLA"); the
     CPU engine runs its kernels (SGLang's Triton ones, interpreted) and tracks them, so the other checks run as
     on CUDA.
   - ``schedule_batch``: the tracked slots' positions are staged in pinned memory (no pinned allocator without
     CUDA); on CPU its ``torch.tensor`` calls leave ``pin_memory`` out.
3. A faster Triton interpreter (``triton.runtime.interpreter``): a ``tl.reduce`` with a custom combine function
   reduces whole vectors pairwise instead of element by element, and a device function called inside a kernel
   does not patch ``triton.language`` again when the kernel's launch already has (same results: see
   ``_patch_triton_interpreter`` and ``_patch_device_function_calls``). With ``DDTREE_TEST_TRITON_LAUNCH_LOG``
   set, the interpreter also logs each launch a GPU would compile first (``_record_new_kernel_specialisations``).
4. With ``DDTREE_TEST_FAULT=NAME``, a fault in DDTREE's verify (``ddtree_test_faults.py``), for the tests that show
   the lossless tests fail on a wrong verify.
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


def _patch_cuda_synchronize(module) -> None:
    import torch

    original = torch.cuda.synchronize
    if getattr(original, "_cpu_ci_patched", False):
        return

    def synchronize(device=None):
        if torch.cuda.is_available():
            original(device)

    synchronize._cpu_ci_patched = True
    torch.cuda.synchronize = synchronize


def _patch_memory_pool(module) -> None:
    import torch

    original = module.MambaPool.__init__

    def init_on_own_device(self, *args, device, **kwargs):
        zeros = torch.zeros

        def zeros_on_pool_device(*zeros_args, **zeros_kwargs):
            if zeros_kwargs.get("device") == "cuda":
                zeros_kwargs["device"] = device
            return zeros(*zeros_args, **zeros_kwargs)

        torch.zeros = zeros_on_pool_device
        try:
            original(self, *args, device=device, **kwargs)
        finally:
            torch.zeros = zeros

    module.MambaPool.__init__ = init_on_own_device


def _patch_mamba_state_scatter(module) -> None:
    def scatter_accepted_steps(dst, src, dst_indices_raw, step_indices_raw):
        """``dst[:, dst_indices_raw[i]] = src[:, i, step_indices_raw[i]]`` for each request ``i`` with a step >= 0."""
        requests = (step_indices_raw >= 0).nonzero().flatten()
        dst[:, dst_indices_raw[requests].long()] = src[:, requests, step_indices_raw[requests].long()]

    module.fused_mamba_state_scatter_with_mask = scatter_accepted_steps
    module.fused_conv_window_scatter_with_mask = scatter_accepted_steps


def _patch_layernorm_gated(module) -> None:
    original = module._get_sm_count

    def get_sm_count(device):
        return 1 if device.type == "cpu" else original(device)

    module._get_sm_count = get_sm_count


def _patch_xgrammar_backend(module) -> None:
    import torch
    import xgrammar

    allocate = module._allocate_token_bitmask
    grammar_apply = module.XGrammarGrammar.apply_vocab_mask
    backend_apply = module.XGrammarGrammarBackend.apply_vocab_mask

    def allocate_unpinned_without_cuda(vocab_size, batch_size):
        if torch.cuda.is_available():
            return allocate(vocab_size, batch_size)
        return torch.full(xgrammar.get_bitmask_shape(batch_size, vocab_size), -1, dtype=xgrammar.bitmask_dtype)

    def grammar_apply_on_cpu(self, logits, vocab_mask):
        if logits.device.type == "cpu":
            xgrammar.apply_token_bitmask_inplace(logits, vocab_mask, backend="cpu")
        else:
            grammar_apply(self, logits, vocab_mask)

    def backend_apply_on_cpu(logits, vocab_mask):
        if logits.device.type == "cpu":
            xgrammar.apply_token_bitmask_inplace(logits, vocab_mask, backend="cpu")
        else:
            backend_apply(logits, vocab_mask)

    module._allocate_token_bitmask = allocate_unpinned_without_cuda
    module.XGrammarGrammar.apply_vocab_mask = grammar_apply_on_cpu
    module.XGrammarGrammarBackend.apply_vocab_mask = staticmethod(backend_apply_on_cpu)


def _patch_server_args(module) -> None:
    validate_on_this_device = module.ServerArgs._validate_mamba_extra_buffer

    def validate_as_on_cuda(self, view, model_arch):
        is_cuda = module.is_cuda
        module.is_cuda = lambda: True
        try:
            return validate_on_this_device(self, view, model_arch)
        finally:
            module.is_cuda = is_cuda

    module.ServerArgs._validate_mamba_extra_buffer = validate_as_on_cuda


def _patch_schedule_batch(module) -> None:
    import types

    import torch

    class TorchWithoutPinnedMemory(types.ModuleType):
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def tensor(*args, pin_memory=False, **kwargs):
            return torch.tensor(*args, **kwargs)

    module.torch = TorchWithoutPinnedMemory("torch")


def _patch_triton_interpreter(module) -> None:
    """Triton 3.7's interpreter folds a ``tl.reduce`` with a custom combine function one element at a time,
    running the (itself interpreted) combine function once per element on scalars: in CI about half of a budget-32
    DDTREE engine run went to the tree build's one such reduction per pop (py-spy, 2026-12-02). Here neighbours are
    combined pairwise, level by level: the combine function runs log2(n) times on whole vectors. ``tl.reduce``
    requires an associative combine function, and neighbours are combined in order, so the result is the
    element-by-element fold's (``tests/test_cpu_shims.py``). Triton's block sizes are powers of two."""
    import numpy as np

    element_by_element = module.ReduceOps.generic_reduce

    def pairwise_reduce(self, input):
        original_axis = self.axis
        tensors, axis = self.unravel(input, self.axis)
        dtypes = [tensor.dtype for tensor in tensors]
        data = [np.moveaxis(tensor.handle.data, axis, 0) for tensor in tensors]
        length = data[0].shape[0]
        if length & (length - 1):
            return element_by_element(self, input)
        while data[0].shape[0] > 1:
            pairs = data[0].shape[0] // 2
            combined = self.combine_fn.fn(*[self.to_tensor(d[0 : 2 * pairs : 2], t) for d, t in zip(data, dtypes)],
                                          *[self.to_tensor(d[1 : 2 * pairs : 2], t) for d, t in zip(data, dtypes)])
            combined = combined if isinstance(combined, tuple) else (combined,)
            shape = (pairs, *data[0].shape[1:])
            if not all(isinstance(c, module.tl.core.tensor) and c.handle.data.shape == shape for c in combined):
                return element_by_element(self, input)  # a combine function that does not keep the shape
            data = [c.handle.data.astype(d.dtype) for c, d in zip(combined, data)]
        results = []
        for d, dtype in zip(data, dtypes):
            d = d[0]
            if self.keep_dims:
                d = np.expand_dims(d, axis) if original_axis is not None else d.reshape((1,) * tensors[0].handle.data.ndim)
            elif original_axis is None:
                d = d.item()
            results.append(self.to_tensor(d, dtype))
        return results

    pairwise_reduce.element_by_element = element_by_element  # for the shim's own test
    module.ReduceOps.generic_reduce = pairwise_reduce
    _patch_device_function_calls(module)
    if os.environ.get(TRITON_LAUNCH_LOG_ENV):
        _record_new_kernel_specialisations(module, os.environ[TRITON_LAUNCH_LOG_ENV])


TRITON_LAUNCH_LOG_ENV = "DDTREE_TEST_TRITON_LAUNCH_LOG"


def _record_new_kernel_specialisations(module, log_path: str) -> None:
    """With ``DDTREE_TEST_TRITON_LAUNCH_LOG=FILE``: each kernel launch that a GPU would compile first, appended to
    FILE as a JSON line (the process, the kernel, its specialisation). A GPU compiles a Triton kernel once per
    specialisation, which is its constexpr values and, per other argument, its type and what Triton's JIT
    specialises on (an integer's divisibility by 16, a pointer's 16-byte alignment, ``None``): a request that
    launches a new one waits for a compile on a GPU (seconds), which the interpreter does not show."""
    import inspect
    import json

    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    run = module.InterpretedFunction.run
    seen: set = set()

    def specialisation(kernel, args, kwargs) -> tuple:
        parameters = inspect.signature(kernel.fn).parameters.values()
        unspecialised = set(kernel.kwargs.get("do_not_specialize") or ())
        values = dict(zip(kernel.arg_names, args), **kwargs)
        key = []
        for index, parameter in enumerate(parameters):
            if parameter.name not in values:
                continue
            value = values[parameter.name]
            if "constexpr" in str(parameter.annotation):
                key.append((parameter.name, repr(value)))
            else:
                plain = parameter.name in unspecialised or index in unspecialised
                key.append((parameter.name, repr(native_specialize_impl(BaseBackend, value, False, not plain, True))))
        options = sorted((name, repr(value)) for name, value in kwargs.items() if name not in kernel.arg_names)
        return (*key, *options)  # num_warps and the like compile too

    def run_recording_new_specialisations(self, *args, grid, warmup, **kwargs):
        name = f"{self.fn.__module__}.{self.fn.__name__}"
        key = (name, specialisation(self, args, kwargs))
        if key not in seen:
            seen.add(key)
            with open(log_path, "a") as log:
                log.write(json.dumps({"pid": os.getpid(), "kernel": name, "specialisation": key[1]}) + "\n")
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    module.InterpretedFunction.run = run_recording_new_specialisations


def _patch_device_function_calls(module) -> None:
    """Triton 3.7's interpreter patches ``triton.language`` for the interpreter (``_patch_lang``: a scan of every
    member of the language modules a function sees, ``tl`` and/or ``tl.core``) once per kernel launch, restoring
    what it patched after the launch, and again on every call of a ``@triton.jit`` device function inside the
    kernel (``tl.cdiv``, ``tl.max`` and the like are ``triton.language.standard``'s), once per program of the grid,
    never restoring: that was a third of a CPU-engine decode step (SGLang's Triton decode attention, py-spy,
    2026-12-02). Patching the same language modules again within one launch changes nothing (a patched builtin is
    no longer a builtin, and the rest are the same stateless closures set again), so a device function is called
    without patching when the running launch, or a device function called earlier in it, has already patched the
    language modules it sees; any other call patches as before (``tests/test_cpu_shims.py``)."""
    import inspect

    tl = module.tl
    launch = module.GridExecutor.__call__
    patched_in_running_launch = []  # per running kernel launch (innermost last): the language modules patched so far

    def languages(fn) -> set:
        return {v for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}

    def launch_knowing_what_is_patched(self, *args, **kwargs):
        patched_in_running_launch.append(languages(self.fn))
        try:
            return launch(self, *args, **kwargs)
        finally:
            patched_in_running_launch.pop()

    def call_device_function(self, *args, **kwargs):
        seen = languages(self.fn)
        if not (patched_in_running_launch and seen <= patched_in_running_launch[-1]):
            module._patch_lang(self.fn)
            if patched_in_running_launch:
                patched_in_running_launch[-1] |= seen
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise module.InterpreterError(repr(e)) from e

    call_device_function.patching_every_call = module.InterpretedFunction.__call__  # for the shim's own test
    module.GridExecutor.__call__ = launch_knowing_what_is_patched
    module.InterpretedFunction.__call__ = call_device_function


_PATCHES_AFTER_IMPORT = {
    "sglang.srt.speculative.eagle_utils": _patch_eagle_utils,
    "sglang.srt.arg_groups.speculative_hook": _patch_speculative_hook,
    "sglang.srt.speculative.dflash_worker_v2": _patch_record_stream,
    "sglang.srt.models.qwen3_5_mtp": _patch_cuda_synchronize,
    "sglang.srt.mem_cache.memory_pool": _patch_memory_pool,
    "sglang.kernels.ops.mamba.mamba_state_scatter_triton": _patch_mamba_state_scatter,
    "sglang.kernels.ops.attention.fla.layernorm_gated": _patch_layernorm_gated,
    "sglang.srt.constrained.xgrammar_backend": _patch_xgrammar_backend,
    "sglang.srt.server_args": _patch_server_args,
    "sglang.srt.managers.schedule_batch": _patch_schedule_batch,
    "triton.runtime.interpreter": _patch_triton_interpreter,
}


if os.environ.get("DDTREE_TEST_FAULT"):  # a fault in DDTREE's verify, for tests of the tests (ddtree_test_faults.py)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ddtree_test_faults import FAULT_ENV, patches

    _PATCHES_AFTER_IMPORT.update(patches(os.environ[FAULT_ENV]))


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
        patch = _PATCHES_AFTER_IMPORT.get(name)
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
