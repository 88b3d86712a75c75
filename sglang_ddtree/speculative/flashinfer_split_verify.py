"""DDTREE's tree verify on FlashInfer as two attentions merged: the prefix without a mask, the tree block with one.

SGLang verifies a tree with FlashInfer's paged prefill and a FULL custom mask, one row of ``prefix + N`` bits per
tree node. FlashInfer's custom-mask kernel reads a mask bit for every query-key pair it scores, so its cost grows
with the prefix faster than causal or unmasked attention: at 32K tokens of context and batch 8 it took 3.3x the
split form's time per layer on the SmolLM2 shape, 1.8x on Qwen3.6-27B's (``bench/verify_attention.py``), and made
DDTREE's step grow 2.4x faster with context than DFLASH's (tests/gpu/RESULTS.md run 50).

Every tree node sees the whole prefix, so the mask only matters inside the tree. Here each verify layer runs

- the paged prefill over the prefix alone (keys ``[0, seq_len)``), no mask, non-causal;
- a ragged prefill over the N tree nodes' own keys with the N x N ancestor mask (``kernels/tree_mask_packed.py``
  writes its bits from the trees' ancestor bits, ``seq_len`` 0);

and merges the two by log-sum-exp (SGLang's ``_safe_merge_state``), as SGLang's extend merges its paged and ragged
parts. The tree block's layout is the same every step (N queries and N keys per request), so its plan is made once
per batch shape; only its mask bits (and their byte offsets) are rewritten before each verify. The block's wrappers
are always FlashInfer's CUDA-graph kind, whose mask buffers are ours: given a packed mask, FlashInfer 0.6.15's plan
stores the segments' offsets in bits (``_compute_mask_indptr``) while its kernel reads them as bytes, so the offsets
the kernel reads must be the ones the mask kernel writes after each plan (an eager wrapper's plan would replace the
buffer with its own bit offsets: requests after the first read the wrong mask bits).

Two AROUND hooks carry it: the plan (``FlashInferIndicesUpdaterPrefill.call_begin_forward``, dispatched from
``flashinfer_tree_plan``) and the layer's forward (``FlashInferAttnBackend.forward_extend``), both only for a
``DDTreeVerifyInput`` whose ``split_attention`` is set. The worker and the graph capture set it where
:func:`split_verify_supported` holds for the target's attention backend (then the verify carries no FULL mask at
all, and SGLang's verify wrappers are built without a mask buffer). ``SGLANG_DDTREE_SPLIT_VERIFY_ATTENTION=0``
keeps SGLang's FULL-mask verify (for side-by-side measurements).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from sglang_ddtree.env_flags import env_flag

SPLIT_VERIFY_ENV = "SGLANG_DDTREE_SPLIT_VERIFY_ATTENTION"
FORWARD_EXTEND = "sglang.srt.layers.attention.flashinfer_backend.FlashInferAttnBackend.forward_extend"
_TREE_BLOCKS = "_ddtree_tree_blocks"  # attribute of a FlashInferAttnBackend: id(paged wrapper) -> TreeBlock
_counts = {"split_verify_plans": 0, "split_verify_plans_from_host_lengths": 0, "tree_block_plans": 0}


def split_verify_enabled() -> bool:
    return env_flag(SPLIT_VERIFY_ENV, default=True)


def split_verify_supported(attn_backend: Any) -> bool:
    """Whether a target with ``attn_backend`` verifies trees in the split form: switched on, and the attention
    layers on a plain ``FlashInferAttnBackend`` (the target's own, or on a hybrid target the full-attention one
    behind SGLang's ``HybridLinearAttnBackend``, which hands those layers' plans and forwards to it; its linear
    layers read no mask) in the layout the split covers (one wrapper: no sliding window or cross attention; fa2;
    page size 1; the KV cache in the queries' dtype, so that the tree's own keys can be read as the layer computed
    them; no FP4 dequantisation workspace; no sliding window in the model, even on one wrapper)."""
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend

    if type(attn_backend) is HybridLinearAttnBackend:
        attn_backend = attn_backend.full_attn_backend
    if not split_verify_enabled() or type(attn_backend) is not FlashInferAttnBackend:
        return False
    updater = getattr(attn_backend, "indices_updater_prefill", None)
    return (
        updater is not None
        and attn_backend.dispatch_reason is None
        and not attn_backend.use_sliding_window_kv_pool
        and not attn_backend.prefill_uses_dequant_workspace
        and attn_backend.prefill_backend == "fa2"
        and attn_backend.page_size == 1
        and updater.data_type == updater.q_data_type
        and getattr(updater, "sliding_window_size", None) in (None, -1)
    )


def tree_block_mask_bytes(nodes: int) -> int:
    """Bytes of one request's packed N x N tree-block mask."""
    return (nodes * nodes + 7) // 8


@dataclass
class TreeBlock:
    """The ragged prefill over the tree nodes' own keys of one paged verify wrapper, and its mask buffers."""

    wrapper: Any  # flashinfer.BatchPrefillWithRaggedKVCacheWrapper
    nodes: int
    mask: torch.Tensor  # uint8, packed N x N masks of the batch
    mask_indptr: torch.Tensor  # int32 [bs + 1]
    zero_lens: torch.Tensor  # int32 [bs]: the block has no prefix columns
    query_indptr: torch.Tensor  # int32 [bs + 1] on the device: N queries per request (the paged part's too)
    query_indptr_host: torch.Tensor  # the same on the host, for the paged part's plan

    def write_mask(self, ancestor_bits: Optional[torch.Tensor]) -> None:
        """The batch's N x N masks from the trees' ancestor bits (graph padding rows see every tree key). Without
        trees (a capture's dummy verify) the mask is left as it is (every bit set when the block is new)."""
        from sglang_ddtree.kernels.tree_mask_packed import pack_tree_mask

        if ancestor_bits is None:
            return
        pack_tree_mask(ancestor_bits, self.zero_lens, self.mask, self.mask_indptr)


def _host_indptr(bs: int, step: int) -> torch.Tensor:
    return torch.arange(0, (bs + 1) * step, step, dtype=torch.int32)


def _new_tree_block(updater: Any, bs: int, nodes: int) -> TreeBlock:
    """A ragged wrapper for ``bs`` requests of ``nodes`` tree nodes, on buffers of its own, planned here once."""
    from flashinfer import BatchPrefillWithRaggedKVCacheWrapper

    backend = updater.attn_backend
    device = backend.workspace_buffer.device
    indptr = _host_indptr(bs, nodes).to(device)
    block = TreeBlock(
        wrapper=None,
        nodes=nodes,
        mask=torch.full((bs * tree_block_mask_bytes(nodes),), 255, dtype=torch.uint8, device=device),
        mask_indptr=_host_indptr(bs, tree_block_mask_bytes(nodes)).to(device),
        zero_lens=torch.zeros(bs, dtype=torch.int32, device=device),
        query_indptr=indptr,
        query_indptr_host=_host_indptr(bs, nodes),
    )
    block.wrapper = BatchPrefillWithRaggedKVCacheWrapper(
        backend.workspace_buffer, "NHD", use_cuda_graph=True, backend="fa2", qo_indptr_buf=indptr,
        kv_indptr_buf=indptr.clone(), custom_mask_buf=block.mask, mask_indptr_buf=block.mask_indptr,
    )  # fmt: skip
    # From host indptrs: nothing read back. The plan writes bit offsets into mask_indptr, put back to bytes below.
    block.wrapper.plan(
        block.query_indptr_host, block.query_indptr_host, updater.num_qo_heads, updater.num_kv_heads,
        updater.head_dim, packed_custom_mask=block.mask, causal=False, q_data_type=updater.q_data_type,
        kv_data_type=updater.data_type, non_blocking=True,
    )  # fmt: skip
    block.mask_indptr.copy_(_host_indptr(bs, tree_block_mask_bytes(nodes)), non_blocking=True)
    _counts["tree_block_plans"] += 1
    return block


def _tree_block(updater: Any, paged_wrapper: Any, bs: int, nodes: int) -> TreeBlock:
    """The tree block that runs beside ``paged_wrapper``: a graph wrapper's is made at its capture and serves every
    replay; an eager wrapper's is made again whenever the batch's shape changes."""
    blocks = updater.attn_backend.__dict__.setdefault(_TREE_BLOCKS, {})
    block = blocks.get(id(paged_wrapper))
    if block is None or block.nodes != nodes or block.zero_lens.numel() != bs:
        if block is not None and getattr(paged_wrapper, "is_cuda_graph_enabled", False):
            raise RuntimeError(f"DDTREE: a verify of {bs} x {nodes} nodes on a graph captured for "
                               f"{block.zero_lens.numel()} x {block.nodes}")  # fmt: skip
        block = blocks[id(paged_wrapper)] = _new_tree_block(updater, bs, nodes)
    return block


def _prefix_host_lengths(updater: Any, spec_info: Any, nodes: int, bs: int) -> Optional[torch.Tensor]:
    """The prefix lengths of the graph's whole batch on the host (requests', then padding rows' fill value), when
    the worker read them for this step; else None."""
    if spec_info.kv_lens_cpu is None:
        return None
    requests = len(spec_info.kv_lens_cpu)
    padding = torch.full((bs - requests,), updater.attn_backend.get_cuda_graph_seq_len_fill_value())
    return torch.cat([spec_info.kv_lens_cpu - nodes, padding]).to(torch.int32)


def _fast_plan_ready(wrapper: Any) -> bool:
    """A graph wrapper planned once already (at capture), whose replays can take ``fast_prefill_plan``."""
    return (
        getattr(wrapper, "is_cuda_graph_enabled", False)
        and getattr(wrapper, "_backend", None) == "fa2"
        and getattr(wrapper, "_cached_module", None) is not None
    )


def plan_split_tree_verify(updater: Any, arguments: dict) -> None:
    """Plan one split verify (``arguments``: ``call_begin_forward``'s, bound): the paged wrapper over each
    request's prefix with N queries and no mask (from host lengths when the worker read them and the wrapper's
    graph was captured; else FlashInfer's own plan, which reads the layout back as SGLang's does), and the tree
    block beside it, whose mask bits it writes."""
    from sglang.kernels.ops.attention.utils import create_flashinfer_kv_indices_triton
    from sglang.srt.layers.attention.flashinfer_backend import fast_prefill_plan

    spec_info, wrapper = arguments["spec_info"], arguments["wrapper_paged"]
    prefix_lens, req_pool_indices = arguments["paged_kernel_lens"], arguments["req_pool_indices"]
    bs, nodes = len(arguments["seq_lens"]), int(spec_info.draft_token_num)
    kv_indptr = arguments["kv_indptr"][: bs + 1]
    kv_indptr[1:] = torch.cumsum(prefix_lens, dim=0)
    kv_indices = torch.empty(arguments["paged_kernel_lens_sum"] + nodes * bs + 256, dtype=torch.int32,
                             device=req_pool_indices.device)  # fmt: skip
    create_flashinfer_kv_indices_triton[(bs,)](
        updater.req_to_token, req_pool_indices, prefix_lens, kv_indptr, None, kv_indices, updater.req_to_token.shape[1]
    )
    tree_block = _tree_block(updater, wrapper, bs, nodes)
    qo_indptr = arguments["qo_indptr"][: bs + 1]
    qo_indptr.copy_(tree_block.query_indptr)  # device to device: no pageable host copy in the step
    layout = dict(num_qo_heads=updater.num_qo_heads, num_kv_heads=updater.num_kv_heads, head_dim_qk=updater.head_dim,
                  page_size=1, q_data_type=updater.q_data_type, kv_data_type=updater.data_type, causal=False,
                  non_blocking=True)  # fmt: skip
    last_page_len = updater.kv_last_page_len[:bs]
    prefix_host = _prefix_host_lengths(updater, spec_info, nodes, bs)
    if prefix_host is not None and _fast_plan_ready(wrapper):
        kv_indptr_host = torch.zeros(bs + 1, dtype=torch.int32)
        torch.cumsum(prefix_host, 0, out=kv_indptr_host[1:])
        fast_prefill_plan(
            wrapper, qo_indptr, kv_indptr, kv_indices, last_page_len, **layout,
            qo_indptr_host=tree_block.query_indptr_host, kv_indptr_host=kv_indptr_host, kv_lens_host=prefix_host,
            max_q_len=nodes, max_kv_len=int(prefix_host.max()),
        )  # fmt: skip
        _counts["split_verify_plans_from_host_lengths"] += 1
    else:
        wrapper.begin_forward(qo_indptr, kv_indptr, kv_indices, last_page_len, **layout)
    tree_block.write_mask(spec_info.ancestor_bits)
    _counts["split_verify_plans"] += 1


def forward_split_tree_verify(
    original: Callable[..., torch.Tensor], backend: Any, q: torch.Tensor, k: Optional[torch.Tensor],
    v: Optional[torch.Tensor], layer: Any, forward_batch: Any, save_kv_cache: bool = True, *args: Any, **kwargs: Any,
) -> torch.Tensor:  # fmt: skip
    """AROUND ``FlashInferAttnBackend.forward_extend``: a split tree verify's layer (anything else: SGLang's)."""
    split = getattr(forward_batch.spec_info, "split_attention", False)
    if not (split and forward_batch.forward_mode.is_target_verify()):
        return original(backend, q, k, v, layer, forward_batch, save_kv_cache, *args, **kwargs)
    from sglang.srt.layers.attention.flashinfer_backend import _safe_merge_state
    from sglang.srt.layers.radix_attention import AttentionType
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    if (
        layer.is_cross_attention
        or layer.attn_type == AttentionType.ENCODER_ONLY
        or (layer.sliding_window_size or -1) >= 0
    ):
        raise RuntimeError(
            f"DDTREE split verify attention reached layer {layer.layer_id}, which it does not cover (cross "
            f"attention, encoder-only or a sliding window); set {SPLIT_VERIFY_ENV}=0"
        )
    pool = backend.token_to_kv_pool
    cache_loc = forward_batch.out_cache_loc
    if k is not None and save_kv_cache:
        write = KVWriteLoc(cache_loc, backend.forward_metadata.swa_out_cache_loc)
        pool.set_kv_buffer(layer, write, k, v, *backend._kv_write_scales(layer))
    if k is None:
        k, v = pool.get_key_buffer(layer.layer_id)[cache_loc], pool.get_value_buffer(layer.layer_id)[cache_loc]
    paged = backend.forward_metadata.prefill_wrappers[0]
    tree_block = backend.__dict__[_TREE_BLOCKS][id(paged)]
    q = q.contiguous().view(-1, layer.tp_q_head_num, layer.head_dim)
    common = dict(causal=False, sm_scale=layer.scaling, logits_soft_cap=layer.logit_cap)
    out_prefix, lse_prefix = paged.forward_return_lse(q, pool.get_kv_buffer(layer.layer_id), **common)
    out_tree, lse_tree = tree_block.wrapper.forward_return_lse(
        q, k.view(-1, layer.tp_k_head_num, layer.head_dim), v.view(-1, layer.tp_v_head_num, layer.head_dim), **common
    )
    out, _ = _safe_merge_state(out_prefix, lse_prefix, out_tree, lse_tree)
    return out.view(-1, layer.tp_q_head_num * layer.head_dim)


def split_verify_report() -> Optional[dict[str, int]]:
    """For ``/server_info``: split verify plans in this process, how many from host lengths, tree blocks planned
    (None before any)."""
    return dict(_counts) if any(_counts.values()) else None


def register(registry: Any, hook_type: Any) -> None:
    """The forward hook (the plan is dispatched from ``flashinfer_tree_plan``'s hook of the same call)."""
    registry.register(FORWARD_EXTEND, forward_split_tree_verify, hook_type.AROUND)
