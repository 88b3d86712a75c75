"""The packed tree mask is bit for bit what FlashInfer's ``segment_packbits`` makes of the FULL boolean mask.

FlashInfer's reference semantics (``flashinfer.quantization.segment_packbits(x, indptr, bitorder="little")``):
each request's segment of the flattened FULL mask (row-major ``[N, seq_len + N]``) is packed on its own into
``ceil(len / 8)`` bytes, element ``8k + j`` in bit ``j`` of byte ``k``, and the returned indptr is the
cumulative byte count. The reference here is numpy's ``packbits(..., bitorder="little")`` per segment.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_tree_kernels import DEVICE, reference_tree

from sglang_ddtree.kernels.tree_mask_packed import pack_tree_mask, packed_mask_bytes
from sglang_ddtree.kernels.tree_verify_tensors import build_verify_tensors

pytestmark = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a GPU")


def segment_packbits_reference(full_mask: torch.Tensor, seq_lens: list[int], n: int) -> tuple[bytes, list[int]]:
    packed, indptr, offset = b"", [0], 0
    for seq_len in seq_lens:
        segment = full_mask[offset : offset + n * (seq_len + n)].numpy().astype(np.uint8)
        offset += segment.size
        packed += np.packbits(segment, bitorder="little").tobytes()
        indptr.append(len(packed))
    return packed, indptr


@pytest.mark.parametrize(
    "budget,seq_lens,programs",
    [
        (32, [17], 8),  # N * kv_len = 1650 bits: not a whole number of bytes
        (32, [0, 5, 300, 1], 8),  # an empty prefix; segments start mid-way through nothing shared
        (64, [9, 1, 300], 3),  # N = 65: the second ancestor word holds one node; few programs loop
        (16, [3, 1, 4, 1, 5, 9, 2, 6], 1),  # one program per request walks the whole segment
        (7, [1000], 8),  # a long prefix dominates
    ],
)
def test_packed_mask_equals_segment_packbits_of_the_full_mask(budget, seq_lens, programs):
    bs, n = len(seq_lens), budget + 1
    _, _, (parent, token, depth, _) = reference_tree(bs, 15, 1000, budget, "peaked", seed=budget + bs)
    seq = torch.tensor(seq_lens, device=DEVICE)
    verify = build_verify_tensors(
        parent.to(DEVICE), token.to(DEVICE), depth.to(DEVICE), torch.zeros(bs, dtype=torch.int64, device=DEVICE),
        seq, 15, seq_lens_sum=sum(seq_lens),
    )  # fmt: skip
    expected, expected_indptr = segment_packbits_reference(verify.custom_mask.cpu(), seq_lens, n)
    kv_lens = torch.tensor(seq_lens) + n
    assert packed_mask_bytes(kv_lens, n) == len(expected)

    poison = 0xA5  # bytes past the masks must stay as they were
    mask = torch.full((len(expected) + 64,), poison, dtype=torch.uint8, device=DEVICE)
    indptr = torch.full((bs + 2,), -7, dtype=torch.int32, device=DEVICE)
    pack_tree_mask(verify.ancestor_bits, seq, mask, indptr, programs_per_request=programs)

    assert indptr[: bs + 1].tolist() == expected_indptr and indptr[bs + 1].item() == -7
    assert bytes(mask[: len(expected)].cpu().tolist()) == expected
    assert (mask[len(expected) :] == poison).all()


def test_a_request_sees_its_whole_prefix_and_exactly_its_ancestors():
    """Read back through FlashInfer's own addressing (bit ``i * kv_len + j`` from byte ``mask_indptr[b]``)."""
    budget, seq_lens = 12, [3, 10]
    bs, n = len(seq_lens), budget + 1
    _, _, (parent, token, depth, _) = reference_tree(bs, 6, 1000, budget, "peaked", seed=3)
    seq = torch.tensor(seq_lens, device=DEVICE)
    verify = build_verify_tensors(parent.to(DEVICE), token.to(DEVICE), depth.to(DEVICE),
                                  torch.zeros(bs, dtype=torch.int64, device=DEVICE), seq, 6)  # fmt: skip
    mask = torch.zeros(packed_mask_bytes(seq.cpu() + n, n), dtype=torch.uint8, device=DEVICE)
    indptr = torch.zeros(bs + 1, dtype=torch.int32, device=DEVICE)
    pack_tree_mask(verify.ancestor_bits, seq, mask, indptr)
    mask, indptr = mask.cpu(), indptr.cpu()
    for b, seq_len in enumerate(seq_lens):
        kv_len = seq_len + n
        for i in range(n):
            ancestors, node = set(), i
            while node >= 0:
                ancestors.add(node)
                node = int(parent[b, node - 1]) if node >= 1 else -1
            for j in range(kv_len):
                offset = i * kv_len + j
                visible = (int(mask[int(indptr[b]) + offset // 8]) >> (offset % 8)) & 1
                assert visible == (j < seq_len or (j - seq_len) in ancestors), (b, i, j)


def test_graph_padding_requests_get_an_all_visible_segment_of_their_own():
    """A replay padded from 2 requests to 4 (SGLang's fill length 1): the padded segments follow the real ones."""
    budget, seq_lens, fill = 8, [5, 2], 1
    n = budget + 1
    _, _, (parent, token, depth, _) = reference_tree(2, 4, 1000, budget, "peaked", seed=5)
    seq = torch.tensor(seq_lens, device=DEVICE)
    verify = build_verify_tensors(parent.to(DEVICE), token.to(DEVICE), depth.to(DEVICE),
                                  torch.zeros(2, dtype=torch.int64, device=DEVICE), seq, 4)  # fmt: skip
    expected, expected_indptr = segment_packbits_reference(verify.custom_mask.cpu(), seq_lens, n)
    padded = torch.tensor(seq_lens + [fill, fill], device=DEVICE)
    total = packed_mask_bytes(padded.cpu() + n, n)
    mask = torch.zeros(total, dtype=torch.uint8, device=DEVICE)
    indptr = torch.zeros(5, dtype=torch.int32, device=DEVICE)
    pack_tree_mask(verify.ancestor_bits, padded, mask, indptr)
    pad_bytes = (n * (fill + n) + 7) // 8
    assert indptr.tolist() == expected_indptr + [expected_indptr[-1] + pad_bytes, expected_indptr[-1] + 2 * pad_bytes]
    assert bytes(mask[: len(expected)].cpu().tolist()) == expected
    pad_bits = n * (fill + n)
    for b in (2, 3):
        segment = mask[int(indptr[b]) : int(indptr[b + 1])].cpu().numpy()
        bits = np.unpackbits(segment, bitorder="little")
        assert bits[:pad_bits].all() and not bits[pad_bits:].any()
