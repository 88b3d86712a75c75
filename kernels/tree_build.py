"""Best-first DDTree expansion on the GPU: one program per request, no host synchronisation.

Implements rules 2-4 of ``sglang_ddtree.tree_reference`` exactly (bit-identical outputs).

The frontier never holds more than one candidate per parent (a parent's next unexplored rank),
so it is an array indexed by node id: slot ``p`` holds the candidate whose parent is node
``p``. Each slot is one int64 key::

    bits 63..32  order-preserving int32 of the candidate's float32 path score
    bits 27..17  2047 - p      (equal scores -> lower parent id wins)
    bits 16..6   rank r        (index into the depth's top-K list)
    bits  5..0   depth d       (the candidate's depth, 1..L)

so one integer max over the ``next_pow2(B + 1)`` slots pops the best candidate *and* tells
where it came from. Each pop costs that max, one masked sum (the parent's score, needed for the
sibling's score) and three scalar loads: O(B * next_pow2(B + 1)) work per request, which is
cheap for the budgets DDTree uses (B <= 1023 supported).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from sglang_ddtree.kernels.tree_topk import float_to_ordered, ordered_to_float

SENTINEL = tl.constexpr(-(2**63))
# Field widths of the packed frontier key (see the module docstring).
MAX_NODES = 2048  # node ids (root included) fit in 11 bits
MAX_RANK = 2048  # top-K width fits in 11 bits
MAX_DEPTH = 63  # depth fits in 6 bits


@triton.jit
def _frontier_key(score, parent, rank, depth):
    score = tl.where(score == 0.0, 0.0, score)  # one key for -0.0 and +0.0
    low = ((2047 - parent) << 17) | (rank << 6) | depth
    return (float_to_ordered(score).to(tl.int64) << 32) | low.to(tl.int64)


@triton.jit
def _build_tree_kernel(
    logprob_ptr,
    token_ptr,
    parent_out,
    token_out,
    depth_out,
    score_out,
    depth_limit,
    k,
    budget,
    NP: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    logq = logprob_ptr + b * depth_limit * k
    toks = token_ptr + b * depth_limit * k
    slots = tl.arange(0, NP)

    # Slot 0 = the root's first child: depth 1, rank 0, score logq[0][0]; the root's score is 0.
    key = tl.where(slots == 0, _frontier_key(tl.load(logq), 0, 0, 1), SENTINEL)
    node_score = tl.zeros([NP], dtype=tl.float32)

    for step in range(budget):
        best = tl.max(key, 0)
        found = best != SENTINEL
        low = (best & 0xFFFFFFFF).to(tl.int32)
        parent = 2047 - (low >> 17)
        rank = (low >> 6) & 2047
        depth = low & 63
        score = ordered_to_float((best >> 32).to(tl.int32))
        node = step + 1

        row = (depth - 1) * k
        token = tl.load(toks + row + rank, mask=found, other=0)
        has_sibling = found & (rank + 1 < k)
        has_child = found & (depth < depth_limit)
        sibling_q = tl.load(logq + row + rank + 1, mask=has_sibling, other=0.0)
        child_q = tl.load(logq + row + k, mask=has_child, other=0.0)
        parent_score = tl.sum(tl.where(slots == parent, node_score, 0.0), 0)

        sibling_key = _frontier_key(parent_score + sibling_q, parent, rank + 1, depth)
        child_key = _frontier_key(score + child_q, node, 0, depth + 1)
        key = tl.where(found & (slots == parent), tl.where(has_sibling, sibling_key, SENTINEL), key)
        key = tl.where(slots == node, tl.where(has_child, child_key, SENTINEL), key)
        node_score = tl.where(slots == node, score, node_score)

        out = b * budget + step
        tl.store(parent_out + out, tl.where(found, parent, -1))
        tl.store(token_out + out, tl.where(found, token, 0))
        tl.store(depth_out + out, tl.where(found, depth, 0))
        tl.store(score_out + out, tl.where(found, score, float("-inf")))


def build_tree(
    top_logprobs: torch.Tensor,
    top_tokens: torch.Tensor,
    budget: int,
    *,
    out: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Expand ``budget`` nodes per request from per-depth top-K lists.

    Args:
        top_logprobs: ``[bs, L, K]`` float32, rows sorted descending (from ``tree_topk``).
        top_tokens: ``[bs, L, K]`` int64 aligned with ``top_logprobs``.
        budget: ``B``; node ids run 1..B, 0 is the root.
        out: optional preallocated ``(parent, token, depth, path_logprob)`` to write into.

    Returns ``(parent int32, token int64, depth int32, path_logprob float32)``, each ``[bs, B]``
    in pop order (entry ``i`` is node ``i + 1``); padding entries have parent -1 (see the
    reference). Never synchronises with the host.
    """
    bs, depth_limit, k = top_logprobs.shape
    assert top_tokens.shape == top_logprobs.shape
    assert top_logprobs.dtype == torch.float32 and top_tokens.dtype == torch.int64
    assert top_logprobs.is_contiguous() and top_tokens.is_contiguous()
    assert 1 <= budget < MAX_NODES and 1 <= k < MAX_RANK and 1 <= depth_limit <= MAX_DEPTH
    device = top_logprobs.device
    if out is None:
        out = (
            torch.empty((bs, budget), dtype=torch.int32, device=device),
            torch.empty((bs, budget), dtype=torch.int64, device=device),
            torch.empty((bs, budget), dtype=torch.int32, device=device),
            torch.empty((bs, budget), dtype=torch.float32, device=device),
        )
    parent, token, depth, path_logprob = out
    for tensor in out:
        assert tensor.shape == (bs, budget) and tensor.is_contiguous()
    num_slots = triton.next_power_of_2(budget + 1)
    _build_tree_kernel[(bs,)](
        top_logprobs,
        top_tokens,
        parent,
        token,
        depth,
        path_logprob,
        depth_limit,
        k,
        budget,
        NP=num_slots,
        # A single warp keeps the per-pop reductions in registers and shuffles (no barriers).
        num_warps=1 if num_slots <= 512 else 2,
    )
    return parent, token, depth, path_logprob
