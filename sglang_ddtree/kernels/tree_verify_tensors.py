"""Verify tensors for SGLang tree verification from a DDTree in pop order.

Given the expansion output (parent/token/depth per node, ``tree_build``), the bonus tokens and
the sequence lengths, one kernel writes everything ``EagleVerifyInput`` needs, with ``N = B + 1``
nodes per request (node 0 = root = bonus token). Definitions are in
``sglang_ddtree.tree.tree_reference.reference_verify_tensors``; in short:

* ``draft_token [bs*N]`` and ``positions [bs*N] = seq_len + depth`` (int64),
* ``retrieve_index [bs, N] = b*N + i``, ``retrieve_next_token`` (first = smallest-index child)
  and ``retrieve_next_sibling`` (next larger-index node with the same parent), -1 if none,
* the FULL custom mask (FlashInfer / Triton backends): per request a row-major
  ``[N, seq_len + N]`` block at offset ``N*N*b + N*sum(seq_len[:b])``; prefix columns True,
  tree column ``j`` of row ``i`` True iff ``j`` is ``i`` or an ancestor of ``i``,
* ``ancestor_bits [bs, N, ceil(N/64)]`` int64: the tree block of the mask, packed.

Grid ``(bs, cdiv(N, ROWS), prefix_splits)``: program ``(b, r, s)`` writes the prefix columns of
rows ``r*ROWS ...`` in column blocks ``s, s + prefix_splits, ...`` (the prefix dominates the
bytes written); programs with ``s == 0`` also walk the ancestor chains and write the per-node
tensors and the tree columns. Nothing is read back from the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

_ROWS = 16
_PREFIX_BLOCK = 256


@triton.jit(do_not_specialize=["batch_size"])
def _verify_tensors_kernel(
    parent_ptr,
    token_ptr,
    depth_ptr,
    root_ptr,
    seq_lens_ptr,
    draft_token_ptr,
    positions_ptr,
    retrieve_index_ptr,
    next_token_ptr,
    next_sibling_ptr,
    ancestor_ptr,
    mask_ptr,
    batch_size,
    budget,
    num_words,
    max_depth,
    BS_P: tl.constexpr,
    ROWS: tl.constexpr,
    NP: tl.constexpr,
    WP: tl.constexpr,
    PREFIX_BLOCK: tl.constexpr,
    FULL_MASK: tl.constexpr,
):
    b = tl.program_id(0)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    n = budget + 1
    rows = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n

    seq_len = tl.load(seq_lens_ptr + b).to(tl.int64)

    if FULL_MASK:
        # Mask offset of this request: N*N*b + N*sum(seq_lens[:b]).
        batch = tl.arange(0, BS_P)
        all_lens = tl.load(seq_lens_ptr + batch, mask=batch < batch_size, other=0).to(tl.int64)
        mask_base = n * n * b.to(tl.int64) + n * tl.sum(tl.where(batch < b, all_lens, 0), 0)
        row_ptrs = mask_ptr + mask_base + rows.to(tl.int64) * (seq_len + n)
        cols = tl.arange(0, PREFIX_BLOCK)
        ones = tl.full([ROWS, PREFIX_BLOCK], 1, dtype=tl.uint8)
        for start in range(split * PREFIX_BLOCK, seq_len, num_splits * PREFIX_BLOCK):
            c = start + cols
            tl.store(row_ptrs[:, None] + c[None, :], ones, mask=row_ok[:, None] & (c < seq_len)[None, :])

    if split == 0:
        node_base = b.to(tl.int64) * budget - 1  # node i >= 1 lives at [b, i - 1]
        is_node = row_ok & (rows >= 1)
        parent = tl.load(parent_ptr + node_base + rows, mask=is_node, other=-1)
        depth = tl.load(depth_ptr + node_base + rows, mask=is_node, other=0).to(tl.int64)
        token = tl.load(token_ptr + node_base + rows, mask=is_node, other=0)
        token = tl.where(rows == 0, tl.load(root_ptr + b).to(tl.int64), token)
        flat = b.to(tl.int64) * n + rows
        tl.store(draft_token_ptr + flat, token, mask=row_ok)
        tl.store(positions_ptr + flat, seq_len + depth, mask=row_ok)
        tl.store(retrieve_index_ptr + flat, flat, mask=row_ok)

        # Links: first child = smallest j with parent[j] == i; next sibling = smallest j > i
        # with parent[j] == parent[i] (padding nodes have parent -1 and no siblings).
        nodes = tl.arange(0, NP)
        node_parent = tl.load(
            parent_ptr + node_base + nodes, mask=(nodes >= 1) & (nodes < n), other=-1
        )
        is_child = node_parent[None, :] == rows[:, None]
        first_child = tl.min(tl.where(is_child, nodes[None, :], NP), 1)
        is_sibling = (node_parent[None, :] == parent[:, None]) & (nodes[None, :] > rows[:, None])
        is_sibling = is_sibling & (parent[:, None] >= 0)
        next_sibling = tl.min(tl.where(is_sibling, nodes[None, :], NP), 1)
        tl.store(next_token_ptr + flat, tl.where(first_child < NP, first_child, -1), mask=row_ok)
        tl.store(next_sibling_ptr + flat, tl.where(next_sibling < NP, next_sibling, -1), mask=row_ok)

        # Ancestor-or-self bit sets: walk up at most max_depth + 1 nodes (self ... root).
        words = tl.arange(0, WP)
        bits = tl.zeros([ROWS, WP], dtype=tl.int64)
        current = tl.where(row_ok, rows, -1)
        for _ in range(max_depth + 1):
            live = current >= 0
            bit = tl.full([ROWS], 1, dtype=tl.int64) << (current & 63).to(tl.int64)
            hit = live[:, None] & (words[None, :] == (current >> 6)[:, None])
            bits = bits | tl.where(hit, bit[:, None], 0)
            up = tl.load(parent_ptr + node_base + current, mask=live & (current >= 1), other=-1)
            current = tl.where(live, up, -1)
        word_ptrs = ancestor_ptr + flat[:, None] * num_words + words[None, :]
        tl.store(word_ptrs, bits, mask=row_ok[:, None] & (words[None, :] < num_words))

        if FULL_MASK:  # tree columns of the mask, one 64-bit word (64 columns) at a time
            lanes = tl.arange(0, 64)
            for w in range(num_words):
                word = tl.sum(tl.where(words[None, :] == w, bits, 0), 1)
                visible = ((word[:, None] >> lanes[None, :].to(tl.int64)) & 1).to(tl.uint8)
                c = w * 64 + lanes
                tl.store(
                    row_ptrs[:, None] + seq_len + c[None, :],
                    visible,
                    mask=row_ok[:, None] & (c < n)[None, :],
                )


@dataclass
class VerifyTensors:
    """Outputs of :func:`build_verify_tensors` (``N = B + 1`` nodes per request)."""

    draft_token: torch.Tensor  # [bs*N] int64
    positions: torch.Tensor  # [bs*N] int64
    retrieve_index: torch.Tensor  # [bs, N] int64
    retrieve_next_token: torch.Tensor  # [bs, N] int64
    retrieve_next_sibling: torch.Tensor  # [bs, N] int64
    custom_mask: Optional[torch.Tensor]  # [>= sum(N*(seq_len+N))] bool or uint8, FULL layout; None: not built
    ancestor_bits: torch.Tensor  # [bs, N, ceil(N/64)] int64

    @classmethod
    def allocate(
        cls, batch_size: int, budget: int, mask_numel: int, device: torch.device
    ) -> "VerifyTensors":
        n = budget + 1
        longs = dict(dtype=torch.int64, device=device)
        return cls(
            draft_token=torch.empty(batch_size * n, **longs),
            positions=torch.empty(batch_size * n, **longs),
            retrieve_index=torch.empty((batch_size, n), **longs),
            retrieve_next_token=torch.empty((batch_size, n), **longs),
            retrieve_next_sibling=torch.empty((batch_size, n), **longs),
            custom_mask=torch.empty(mask_numel, dtype=torch.bool, device=device),
            ancestor_bits=torch.empty((batch_size, n, triton.cdiv(n, 64)), **longs),
        )


def full_mask_numel(seq_lens_sum: int, batch_size: int, budget: int) -> int:
    """Entries of the FULL mask: ``sum_b N * (seq_len_b + N)``."""
    n = budget + 1
    return n * seq_lens_sum + batch_size * n * n


def build_verify_tensors(
    parent: torch.Tensor,
    token: torch.Tensor,
    depth: torch.Tensor,
    root_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    max_depth: int,
    *,
    out: Optional[VerifyTensors] = None,
    seq_lens_sum: Optional[int] = None,
    prefix_splits: int = 4,
    full_mask: bool = True,
) -> VerifyTensors:
    """Write the verify tensors for trees given in pop order (``tree_build.build_tree`` output).

    Args:
        parent, token, depth: ``[bs, B]`` (int32, int64, int32), entry ``i`` = node ``i + 1``.
        root_tokens: ``[bs]`` bonus tokens (node 0).
        seq_lens: ``[bs]`` committed lengths before the tree (int32 or int64).
        max_depth: bound on node depth (the number of draft positions ``L``).
        out: preallocated outputs (``VerifyTensors.allocate``); its mask must hold
            :func:`full_mask_numel` entries. With ``out`` given nothing is allocated and
            nothing synchronises, so the call can be captured in a CUDA graph.
        seq_lens_sum: host value of ``seq_lens.sum()``, used only to size a new mask.
        prefix_splits: programs sharing the prefix columns of one row block.
        full_mask: write the FULL mask; without it (an attention that takes the tree block from
            ``ancestor_bits``, e.g. ``flashinfer_split_verify``) ``custom_mask`` is None, or left as
            it is in ``out``.
    """
    bs, budget = parent.shape
    n = budget + 1
    for tensor in (parent, token, depth):
        assert tensor.shape == (bs, budget) and tensor.is_contiguous()
    assert token.dtype == torch.int64 and root_tokens.shape == (bs,)
    if out is None:
        if full_mask and seq_lens_sum is None:
            seq_lens_sum = int(seq_lens.sum().item())
        mask_numel = full_mask_numel(seq_lens_sum, bs, budget) if full_mask else 0
        out = VerifyTensors.allocate(bs, budget, mask_numel, parent.device)
        if not full_mask:
            out.custom_mask = None
    if full_mask:
        mask = out.custom_mask
        if mask.dtype == torch.bool:
            mask = mask.view(torch.uint8)
        assert mask.dtype == torch.uint8 and mask.is_contiguous()
    else:
        mask, prefix_splits = out.ancestor_bits, 1  # not written: FULL_MASK off

    num_words = triton.cdiv(n, 64)
    _verify_tensors_kernel[(bs, triton.cdiv(n, _ROWS), prefix_splits)](
        parent,
        token,
        depth,
        root_tokens,
        seq_lens,
        out.draft_token,
        out.positions,
        out.retrieve_index,
        out.retrieve_next_token,
        out.retrieve_next_sibling,
        out.ancestor_bits,
        mask,
        bs,
        budget,
        num_words,
        max_depth,
        BS_P=triton.next_power_of_2(bs) if full_mask else 1,  # only the FULL mask's offsets read the batch
        ROWS=_ROWS,
        NP=triton.next_power_of_2(n),
        WP=triton.next_power_of_2(num_words),
        PREFIX_BLOCK=_PREFIX_BLOCK,
        FULL_MASK=full_mask,
        num_warps=4,
    )
    return out
