"""Best-first DDTree expansion on the GPU: one program per request, no host synchronisation.

Implements rules 2-4 of ``sglang_ddtree.tree.tree_reference`` exactly (bit-identical outputs).

The frontier never holds more than one candidate per parent (a parent's next unexplored rank),
so it is an array indexed by node id: slot ``p`` holds the candidate whose parent is node
``p``. Each slot is one int64 key::

    bits 63..32  order-preserving int32 of the candidate's float32 path score
    bits 27..17  2047 - p      (equal scores -> lower parent id wins)
    bits 16..6   rank r        (index into the depth's top-K list)
    bits  5..0   depth d       (the candidate's depth, 1..L)

so one integer max over the ``next_pow2(B + 1)`` slots pops the best candidate *and* tells
where it came from. The pop is a single register reduction that also carries the winning slot's
payload (its parent's score and the two log-probs its pushes need), so nothing on the pop-to-pop
dependency chain waits for memory: the log-probs of newly pushed candidates are loaded while the
next pop reduces, and tokens are looked up in one parallel pass after the loop. Work is
O(B * next_pow2(B + 1)) per request, cheap for the budgets DDTree uses (B <= 2047 supported).
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
def _best_slot(key_a, score_a, next_a, child_a, key_b, score_b, next_b, child_b):
    """Combine of the pop reduction: the larger key wins and brings its slot's payload along."""
    a = key_a > key_b
    return (
        tl.where(a, key_a, key_b),
        tl.where(a, score_a, score_b),
        tl.where(a, next_a, next_b),
        tl.where(a, child_a, child_b),
    )


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
    slots = tl.arange(0, NP)
    first = slots == 0

    # Per slot p (candidates under parent p, at depth d): the frontier key, the parent's score,
    # next_q = logq[d-1][r+1] (the current candidate's next sibling) and child_q = logq[d][0].
    # Slot 0 = the root's children: depth 1, rank 0, score logq[0][0]; the root's score is 0.
    key = tl.where(first, _frontier_key(tl.load(logq), 0, 0, 1), SENTINEL)
    node_score = tl.zeros([NP], dtype=tl.float32)
    next_q = tl.where(first, tl.load(logq + 1, mask=k > 1, other=0.0), 0.0)
    child_q = tl.where(first, tl.load(logq + k, mask=depth_limit > 1, other=0.0), 0.0)
    # q values of the candidates pushed by the previous pop, loaded but not yet in the vectors.
    late_slot = -1
    late_next_q = 0.0
    late_node = -1
    late_node_next_q = 0.0
    late_node_child_q = 0.0

    for step in range(budget):
        best, parent_score, sibling_q, down_q = tl.reduce((key, node_score, next_q, child_q), 0, _best_slot)
        found = best != SENTINEL
        low = (best & 0xFFFFFFFF).to(tl.int32)
        parent = 2047 - (low >> 17)
        rank = (low >> 6) & 2047
        depth = low & 63
        score = ordered_to_float((best >> 32).to(tl.int32))
        node = step + 1
        sibling_q = tl.where(parent == late_slot, late_next_q, sibling_q)
        sibling_q = tl.where(parent == late_node, late_node_next_q, sibling_q)
        down_q = tl.where(parent == late_node, late_node_child_q, down_q)

        has_sibling = found & (rank + 1 < k)
        has_child = found & (depth < depth_limit)
        sibling_key = _frontier_key(parent_score + sibling_q, parent, rank + 1, depth)
        child_key = _frontier_key(score + down_q, node, 0, depth + 1)
        key = tl.where(found & (slots == parent), tl.where(has_sibling, sibling_key, SENTINEL), key)
        key = tl.where(slots == node, tl.where(has_child, child_key, SENTINEL), key)
        node_score = tl.where(slots == node, score, node_score)
        next_q = tl.where(slots == late_slot, late_next_q, next_q)
        next_q = tl.where(slots == late_node, late_node_next_q, next_q)
        child_q = tl.where(slots == late_node, late_node_child_q, child_q)

        # Loads for the two new candidates: their values are first needed by the next pop,
        # after its reduction, so the load latency hides behind it.
        row = (depth - 1) * k
        late_slot = tl.where(found, parent, -1)
        late_next_q = tl.load(logq + row + rank + 2, mask=found & (rank + 2 < k), other=0.0)
        late_node = node
        late_node_next_q = tl.load(logq + row + k + 1, mask=has_child & (k > 1), other=0.0)
        late_node_child_q = tl.load(logq + row + 2 * k, mask=has_child & (depth + 1 < depth_limit), other=0.0)

        out = b * budget + step
        tl.store(parent_out + out, tl.where(found, parent, -1))
        tl.store(depth_out + out, tl.where(found, depth, 0))
        tl.store(score_out + out, tl.where(found, score, float("-inf")))
        # The token is looked up after the loop: here only where it sits in the top-K table.
        tl.store(token_out + out, tl.where(found, row + rank, -1).to(tl.int64))

    tl.debug_barrier()
    pops = slots < budget
    entry = tl.load(token_out + b * budget + slots, mask=pops, other=-1)
    token = tl.load(token_ptr + b * depth_limit * k + entry, mask=pops & (entry >= 0), other=0)
    tl.store(token_out + b * budget + slots, token, mask=pops)


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
        # A single warp keeps the per-pop reduction in registers and shuffles (no barriers);
        # past 512 slots, more warps keep the five per-slot vectors out of local memory.
        num_warps=max(1, num_slots // 512),
    )
    return parent, token, depth, path_logprob
