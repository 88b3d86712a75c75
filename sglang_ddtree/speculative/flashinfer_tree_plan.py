"""FlashInfer plans of DDTREE's graph replays from host lengths: the tree verify's (its mask packed on the device)
and the draft block's. A verify in the split form (``flashinfer_split_verify``) is planned there instead.

Before each replay of a tree-verify graph SGLang 0.5.17 re-plans FlashInfer's paged prefill
(``FlashInferIndicesUpdaterPrefill.call_begin_forward`` -> ``BatchPrefillWithPagedKVCacheWrapper.plan``) with the
tree's FULL boolean mask. ``plan()`` then reads ``qo_indptr``, ``paged_kv_indptr`` and ``paged_kv_last_page_len``
back to the host and packs the mask with ``segment_packbits``, whose size it reads back too: four blocking
device-to-host copies (torch's sync debug mode, tests/gpu/RESULTS.md run 37), and they come after the draft
forward was launched, so the host waits for the whole draft before it can launch the verify.

SGLang already has the replacement for its EAGLE draft-extend graph (``fast_prefill_plan``: the wrapper's plan
from host-known lengths). This AROUND hook uses it for DDTREE's verify graphs, with

- the key lengths on the host (``DDTreeVerifyInput.kv_lens_cpu``), read by the worker once at the start of the
  step, before the draft launch (``DDTreeWorker._host_prefix_lens``). They must be exact: planned from upper
  bounds (what the host knows without reading the device under overlap scheduling), FlashInfer's kernel gets
  key chunks that start past a request's real length, and the verify was wrong (run 38);
- the packed mask and its byte offsets written by ``kernels/tree_mask_packed.py`` straight into the graph's
  mask buffers, from the trees' ancestor bits and the device lengths (no boolean-mask packing pass).

The drafter's block forward (DFlash's, ``[bonus, MASK...]`` per request over the draft KV, no mask) is planned the
same way, from the same read (``DDTreeDraftBlockInput.kv_lens_cpu``: prefix + block): its plan read three more
lengths back, before the draft could launch. Anything else (eager forwards, the capture's own plans, other
algorithms, sliding-window or paged KV layouts, other FlashInfer backends) keeps SGLang's path. ``SGLANG_DDTREE_FLASHINFER_SYNC_FREE_PLAN=0`` turns it off
(for side-by-side measurements).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional

import torch

from sglang_ddtree.env_flags import env_flag

SYNC_FREE_PLAN_ENV = "SGLANG_DDTREE_FLASHINFER_SYNC_FREE_PLAN"
LENGTHS_FROM_SCHEDULER_ENV = "SGLANG_DDTREE_LENGTHS_FROM_SCHEDULER"
CALL_BEGIN_FORWARD = "sglang.srt.layers.attention.flashinfer_backend.FlashInferIndicesUpdaterPrefill.call_begin_forward"
_counts = {"sync_free_plans": 0, "upstream_plans": 0, "sync_free_draft_plans": 0, "upstream_draft_plans": 0,
           "read_lengths_equal_scheduler_mirror": 0, "read_lengths_differ_from_scheduler_mirror": 0,
           "lengths_taken_from_scheduler_mirror": 0}


def sync_free_plan_enabled() -> bool:
    return env_flag(SYNC_FREE_PLAN_ENV, default=True)


def planned_from_host_lengths(attn_backend: Any, cuda_graphs: bool) -> bool:
    """Whether the graph replays of a runner with ``attn_backend`` (the target's verify, the drafter's block) are
    planned from host lengths (and the worker reads the lengths for them): switched on, CUDA graphs on, and the
    attention a plain ``FlashInferAttnBackend``, or on a hybrid target the FlashInfer backend of its attention
    layers where they verify in the split form (``flashinfer_split_verify``, whose paged part takes the same
    plan; the FULL-mask plan of this module has not run behind SGLang's hybrid backend). Ask once the backends
    exist: SGLang builds them after the draft worker (``Scheduler.init_model_worker``), so at the worker's
    construction the answer is always no (run 41)."""
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend

    from sglang_ddtree.speculative.flashinfer_split_verify import split_verify_supported

    if not (sync_free_plan_enabled() and cuda_graphs):
        return False
    if type(attn_backend) is HybridLinearAttnBackend:
        return split_verify_supported(attn_backend)
    return type(attn_backend) is FlashInferAttnBackend


@functools.lru_cache(maxsize=4)
def _signature(function: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(function)


def _replayable(updater: Any, call: inspect.BoundArguments) -> bool:
    """A DDTREE verify or draft block planned for a captured graph's replay, in the one layout the fast path
    covers, with its key lengths on the host."""
    args, wrapper = call.arguments, call.arguments["wrapper_paged"]
    return (
        args["spec_info"].kv_lens_cpu is not None
        and not args["use_ragged"]
        and not args.get("use_sliding_window_kv_pool", False)
        and args.get("multi_item_params") is None
        and args.get("cross_attention_custom_mask") is None
        and args.get("custom_kv_indices") is None
        and args.get("window_left", -1) < 0
        and getattr(updater.attn_backend, "page_size", 1) == 1
        and getattr(wrapper, "is_cuda_graph_enabled", False)
        and getattr(wrapper, "_backend", None) == "fa2"
        and getattr(wrapper, "_cached_module", None) is not None  # planned once already, at capture
    )


def _has_packed_mask_buffers(wrapper: Any, spec_info: Any) -> bool:
    return (
        spec_info.ancestor_bits is not None
        and torch.is_tensor(getattr(wrapper, "_custom_mask_buf", None))
        and torch.is_tensor(getattr(wrapper, "_mask_indptr_buf", None))
    )


def _padded_host_lengths(updater: Any, spec_info: Any, seq_lens: torch.Tensor, queries: int) -> torch.Tensor:
    """The host key lengths of the graph's whole batch: the requests', then its padding rows' (SGLang's fill
    value plus the queries, as ``generate_attn_arg_prefill`` computes them on the device)."""
    bs, requests = len(seq_lens), len(spec_info.kv_lens_cpu)
    padding = torch.full((bs - requests,), updater.attn_backend.get_cuda_graph_seq_len_fill_value() + queries)
    return torch.cat([spec_info.kv_lens_cpu, padding]).to(torch.int32)


def _plan_from_host_lengths(updater: Any, wrapper: Any, kv_lens_host: torch.Tensor, queries: int,
                            device_layout: tuple, call: inspect.BoundArguments) -> None:  # fmt: skip
    """SGLang's ``fast_prefill_plan`` with ``queries`` rows per request and the given host key lengths."""
    from sglang.srt.layers.attention.flashinfer_backend import fast_prefill_plan

    kv_indices, kv_indptr, qo_indptr = device_layout
    bs = len(kv_lens_host)
    kv_indptr_host = torch.zeros(bs + 1, dtype=torch.int32)
    torch.cumsum(kv_lens_host, 0, out=kv_indptr_host[1:])
    fast_prefill_plan(
        wrapper, qo_indptr, kv_indptr, kv_indices, updater.kv_last_page_len[:bs], updater.num_qo_heads,
        updater.num_kv_heads, updater.head_dim, 1, q_data_type=updater.q_data_type, kv_data_type=updater.data_type,
        non_blocking=True, fixed_split_size=call.arguments.get("fixed_split_size"),
        qo_indptr_host=torch.arange(0, (bs + 1) * queries, queries, dtype=torch.int32), kv_indptr_host=kv_indptr_host,
        kv_lens_host=kv_lens_host, max_q_len=queries, max_kv_len=int(kv_lens_host.max()),
    )  # fmt: skip


def plan_tree_verify_without_host_sync(original: Callable[..., None], updater: Any, *args: Any, **kwargs: Any) -> None:
    """AROUND ``FlashInferIndicesUpdaterPrefill.call_begin_forward``."""
    from sglang_ddtree.speculative.ddtree_info import DDTreeDraftBlockInput, DDTreeVerifyInput

    call = _signature(original).bind(updater, *args, **kwargs)
    spec_info = call.arguments.get("spec_info")
    if isinstance(spec_info, DDTreeVerifyInput):
        return _plan_tree_verify(original, updater, call, args, kwargs)
    if isinstance(spec_info, DDTreeDraftBlockInput):
        return _plan_draft_block(original, updater, call, args, kwargs)
    return original(updater, *args, **kwargs)


def _plan_tree_verify(original: Callable[..., None], updater: Any, call: inspect.BoundArguments, args: tuple,
                      kwargs: dict) -> None:  # fmt: skip
    from sglang_ddtree.kernels.tree_mask_packed import pack_tree_mask, packed_mask_bytes

    from sglang_ddtree.speculative.flashinfer_split_verify import plan_split_tree_verify

    call.apply_defaults()
    spec_info, wrapper = call.arguments["spec_info"], call.arguments["wrapper_paged"]
    if spec_info.split_attention:
        return plan_split_tree_verify(updater, call.arguments)
    if not sync_free_plan_enabled() or not _replayable(updater, call) or not _has_packed_mask_buffers(wrapper, spec_info):
        _counts["upstream_plans"] += 1
        return original(updater, *args, **kwargs)
    n, seq_lens = int(spec_info.draft_token_num), call.arguments["seq_lens"]
    kv_lens_host = _padded_host_lengths(updater, spec_info, seq_lens, n)
    if packed_mask_bytes(kv_lens_host, n) > wrapper._custom_mask_buf.numel():
        _counts["upstream_plans"] += 1
        return original(updater, *args, **kwargs)
    kv_indices, kv_indptr, qo_indptr, _ = spec_info.generate_attn_arg_prefill(
        call.arguments["req_pool_indices"], call.arguments["paged_kernel_lens"],
        call.arguments["paged_kernel_lens_sum"], updater.req_to_token,
    )  # fmt: skip
    _plan_from_host_lengths(updater, wrapper, kv_lens_host, n, (kv_indices, kv_indptr, qo_indptr), call)
    pack_tree_mask(spec_info.ancestor_bits, seq_lens, wrapper._custom_mask_buf, wrapper._mask_indptr_buf)
    _counts["sync_free_plans"] += 1
    return None


def _plan_draft_block(original: Callable[..., None], updater: Any, call: inspect.BoundArguments, args: tuple,
                      kwargs: dict) -> None:  # fmt: skip
    """The draft block: every query of a request sees all of its keys (no mask), as DFlash plans it."""
    call.apply_defaults()
    spec_info, wrapper = call.arguments["spec_info"], call.arguments["wrapper_paged"]
    if not sync_free_plan_enabled() or not _replayable(updater, call) or spec_info.custom_mask is not None:
        _counts["upstream_draft_plans"] += 1
        return original(updater, *args, **kwargs)
    block = int(spec_info.draft_token_num)
    kv_lens_host = _padded_host_lengths(updater, spec_info, call.arguments["seq_lens"], block)
    kv_indices, kv_indptr, qo_indptr, _ = spec_info.generate_attn_arg_prefill(
        call.arguments["req_pool_indices"], call.arguments["paged_kernel_lens"],
        call.arguments["paged_kernel_lens_sum"], updater.req_to_token, kv_start_idx=call.arguments["kv_start_idx"],
    )  # fmt: skip
    _plan_from_host_lengths(updater, wrapper, kv_lens_host, block, (kv_indices, kv_indptr, qo_indptr), call)
    _counts["sync_free_draft_plans"] += 1
    return None


def compare_with_scheduler_mirror(read: torch.Tensor, mirror: Optional[torch.Tensor]) -> None:
    """Count whether the lengths the worker read from the device equal the scheduler's host mirror of them.

    Under overlap scheduling SGLang's ``FutureMap.resolve_seq_lens_cpu`` already copies the committed lengths to
    the host (a synchronised copy on a stream of its own) before the step, whenever an attention backend asks for
    them, FlashInfer's included. If that mirror always equals the worker's read, the read is a second blocking
    copy of the same numbers and can go; the counts on ``/server_info`` say so before anything relies on it (the
    plan from upper bounds was wrong, run 38). A host comparison of ``bs`` integers, no device access."""
    if mirror is None:
        return
    same = mirror.shape == read.shape and bool(torch.equal(mirror.to(read.dtype), read))
    _counts["read_lengths_equal_scheduler_mirror" if same else "read_lengths_differ_from_scheduler_mirror"] += 1


def scheduler_mirror_lengths(mirror: Optional[torch.Tensor], batch_size: int) -> Optional[torch.Tensor]:
    """The committed lengths from the scheduler's host mirror instead of a device read, where
    ``SGLANG_DDTREE_LENGTHS_FROM_SCHEDULER=1`` asks for it and the mirror covers the batch; else None (read them).

    Opt-in until a GPU run has served with it: the mirror equalled the worker's read in all 640 graph steps of
    tests/gpu/RESULTS.md run 55, and plans from lengths that are not exact are wrong (run 38)."""
    if mirror is None or mirror.shape != (batch_size,) or not env_flag(LENGTHS_FROM_SCHEDULER_ENV):
        return None
    _counts["lengths_taken_from_scheduler_mirror"] += 1
    return mirror.to(torch.int32)


def sync_free_plan_report() -> dict[str, int] | None:
    """For ``/server_info``: how many DDTREE verify and draft-block plans took each path in this process (None
    before any)."""
    return dict(_counts) if any(_counts.values()) else None


def register(registry: Any, hook_type: Any) -> None:
    registry.register(CALL_BEGIN_FORWARD, plan_tree_verify_without_host_sync, hook_type.AROUND)
