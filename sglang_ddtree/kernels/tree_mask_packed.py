"""The tree verify's attention mask in FlashInfer's packed layout, written from the trees' ancestor bits.

FlashInfer's paged prefill reads a custom mask as bits: request ``b``'s mask starts at byte ``mask_indptr[b]``,
and query ``i`` may attend key ``j`` iff bit ``i * kv_len + j`` of that segment is set (little-endian within a
byte), with ``kv_len = seq_len + N`` for a verify of ``N`` tree nodes. Its ``plan()`` packs a boolean FULL mask
into that layout with ``segment_packbits``, which reads the packed size back to the host: a synchronisation
on every verify step. This kernel writes the packed bits and ``mask_indptr`` directly, on the device, from
the ``ancestor_bits`` the verify-tensor kernel already made (prefix columns set; tree column ``j`` of row
``i`` set iff node ``j`` is ``i`` or one of its ancestors): no boolean mask, no packing pass, no host read.

A CUDA-graph replay pads the batch to a captured size with dummy requests: those (``b >= num_trees``) get a
segment of their own, every bit set, so that every offset the kernel reads stays inside the buffer.

Grid ``(bs, programs_per_request)``: program ``(b, p)`` writes bytes ``p * BYTES ...`` of request ``b``'s
segment in strides of ``programs_per_request * BYTES``; ``(b, 0)`` writes ``mask_indptr[b + 1]``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BYTES = 128


@triton.jit(do_not_specialize=["batch_size", "num_trees"])
def _pack_tree_mask_kernel(
    ancestor_ptr,
    seq_lens_ptr,
    mask_ptr,
    mask_indptr_ptr,
    batch_size,
    num_trees,
    n,
    num_words,
    BS_P: tl.constexpr,
    BYTES: tl.constexpr,
):
    b = tl.program_id(0)
    p = tl.program_id(1)
    programs = tl.num_programs(1)

    batch = tl.arange(0, BS_P)
    lens = tl.load(seq_lens_ptr + batch, mask=batch < batch_size, other=0).to(tl.int64)
    segment_bytes = tl.where(batch < batch_size, (n * (lens + n) + 7) // 8, 0)
    start = tl.sum(tl.where(batch < b, segment_bytes, 0), 0)
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int64)
    kv_len = seq_len + n
    num_bits = n * kv_len
    num_bytes = (num_bits + 7) // 8
    if p == 0:
        tl.store(mask_indptr_ptr + b + 1, (start + num_bytes).to(tl.int32))
        if b == 0:
            tl.store(mask_indptr_ptr, 0)

    byte = tl.arange(0, BYTES)
    bit = tl.arange(0, 8)
    for first in range(p * BYTES, num_bytes, programs * BYTES):
        index = first + byte
        flat = index.to(tl.int64)[:, None] * 8 + bit[None, :]
        row = flat // kv_len
        col = flat - row * kv_len
        tree_col = col - seq_len
        in_tree = (tree_col >= 0) & (flat < num_bits) & (b < num_trees)
        word = tl.load(ancestor_ptr + (b * n + row) * num_words + (tree_col >> 6), mask=in_tree, other=0)
        visible = tl.where(in_tree, (word >> (tree_col & 63)) & 1, (flat < num_bits).to(tl.int64))
        packed = tl.sum(visible << bit[None, :].to(tl.int64), 1)
        tl.store(mask_ptr + start + index, packed.to(tl.uint8), mask=index < num_bytes)


def packed_mask_bytes(kv_lens: torch.Tensor, n: int) -> int:
    """Bytes of the packed masks of requests with these key lengths (``seq_len + N`` each; host tensor)."""
    return int(((n * kv_lens.to(torch.int64) + 7) // 8).sum())


def pack_tree_mask(
    ancestor_bits: torch.Tensor,
    seq_lens: torch.Tensor,
    mask_out: torch.Tensor,
    mask_indptr_out: torch.Tensor,
    programs_per_request: int = 8,
) -> None:
    """Write the packed masks of ``len(seq_lens)`` requests and their byte offsets (``mask_indptr_out[: bs + 1]``).

    Args:
        ancestor_bits: ``[trees, N, ceil(N/64)]`` int64, ancestor-or-self bit sets (``build_verify_tensors``)
            of the first ``trees`` requests; the others (graph padding) see every key.
        seq_lens: ``[bs]`` committed lengths before each tree, on the device (int32 or int64), ``bs >= trees``.
        mask_out: uint8 buffer of at least :func:`packed_mask_bytes` bytes (checked by the caller from host
            upper bounds: nothing here reads the device).
        mask_indptr_out: int32 ``[>= bs + 1]``.
    """
    trees, n, num_words = ancestor_bits.shape
    bs = seq_lens.shape[0]
    assert ancestor_bits.dtype == torch.int64 and ancestor_bits.is_contiguous() and seq_lens.dim() == 1 and bs >= trees
    assert mask_out.dtype == torch.uint8 and mask_indptr_out.dtype == torch.int32
    _pack_tree_mask_kernel[(bs, programs_per_request)](
        ancestor_bits, seq_lens, mask_out, mask_indptr_out, bs, trees, n, num_words,
        BS_P=triton.next_power_of_2(bs), BYTES=_BYTES, num_warps=4,
    )  # fmt: skip
