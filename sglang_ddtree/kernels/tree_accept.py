"""Greedy acceptance of a batch of DDTrees in one launch: the accepted path, its committed tokens, the bonus token
and the new lengths, from the target's argmax at every node.

SGLang's tree verification (``eagle_sample`` + ``_finalize_accept_tree_path``) spends ~1 ms of host time per
step at batch 1 around a walk that is one kernel (tests/gpu/RESULTS.md run 57's host ranges): buffers allocated and
filled, the penalty and NaN checks, a bonus-token kernel, the predictions and the hidden states gathered to the
front of each block. Here one program per request reads its whole tree into registers and decides every node at
once: node ``i`` is on the accepted path iff every node on its root path (itself included, the root excepted)
carries the token the target predicted at its parent, i.e. iff its ancestor bits (``tree_verify_tensors``) lie
inside the bit set of such nodes. Children of one node carry distinct tokens (each is a different rank of the
same depth's top-K), so the accepted nodes form one path, as SGLang's sibling walk finds it.

Under the cost-only acceptance simulation (``SIMULATED``) the path is instead each tree's first-child chain cut
at a drawn length (``ddtree_simulation``), with the chain's drafted tokens committed and the root's token as
the bonus, as ``simulate_acceptance_along_the_best_branch`` commits it.

Outputs, in SGLang's layouts: ``accept_index [bs, W]`` int32 flat node ids (``b * N + node``) by depth, -1 past
the path (``W = min(block, N)``: ``max_tree_depth``); ``accept_lens [bs]`` int32 (accepted drafts + 1);
``predict [bs * N]`` int32, the committed tokens at the front of each request's block, 0 after them; ``bonus
[bs]`` int32, the last committed token; ``new_seq_lens [bs]`` = ``seq_lens + accept_lens``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["length"])
def _tree_accept_kernel(
    target_predict_ptr,
    draft_token_ptr,
    parent_ptr,
    depth_ptr,
    ancestor_ptr,
    next_token_ptr,
    seq_lens_ptr,
    lengths_ptr,
    accept_index_ptr,
    accept_lens_ptr,
    predict_ptr,
    bonus_ptr,
    new_seq_lens_ptr,
    budget,
    width,
    length,
    NP: tl.constexpr,
    WP: tl.constexpr,
    WORDS: tl.constexpr,
    SIMULATED: tl.constexpr,
    PER_REQUEST: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    n = budget + 1
    base = b * n
    nodes = tl.arange(0, NP)
    is_node = nodes < n
    is_draft = (nodes >= 1) & is_node
    parent = tl.load(parent_ptr + b * budget + nodes - 1, mask=is_draft, other=-1).to(tl.int64)
    depth = tl.load(depth_ptr + b * budget + nodes - 1, mask=is_draft, other=0).to(tl.int32)
    real = is_draft & (parent >= 0)  # padding nodes (parent -1) are never accepted
    safe_parent = tl.where(real, parent, 0)
    if SIMULATED:
        if PER_REQUEST:
            length = tl.load(lengths_ptr + b).to(tl.int32)
        first_child = tl.load(next_token_ptr + base + safe_parent, mask=real, other=-1)
        step_ok = real & (first_child == nodes) & (depth < length)
    else:
        token = tl.load(draft_token_ptr + base + nodes, mask=real, other=-1)
        wanted = tl.load(target_predict_ptr + base + safe_parent, mask=real, other=-2)
        step_ok = real & (token == wanted)
    step_ok = step_ok | (nodes == 0)

    accepted = is_node
    for w in tl.static_range(WORDS):
        in_word = (nodes >= 64 * w) & (nodes < 64 * (w + 1))
        one = tl.full([NP], 1, dtype=tl.int64)
        bit = one << tl.where(in_word, nodes - 64 * w, 0).to(tl.int64)
        # distinct bits: their sum is their union (two's complement keeps bit 63)
        ok_bits = tl.sum(tl.where(step_ok & in_word, bit, 0), axis=0)
        ancestors = tl.load(ancestor_ptr + (base + nodes) * WORDS + w, mask=is_node, other=0)
        accepted = accepted & ((ancestors & (ok_bits ^ -1)) == 0)
    accept_len = tl.sum(accepted.to(tl.int32), axis=0)

    slots = tl.arange(0, WP)
    on_slot = accepted[None, :] & (depth[None, :] == slots[:, None])
    node_at = tl.sum(tl.where(on_slot, nodes[None, :], 0), axis=1)
    slot_ok = slots < accept_len
    tl.store(accept_index_ptr + b * width + slots, tl.where(slot_ok, base + node_at, -1).to(tl.int32),
             mask=slots < width)  # fmt: skip
    if SIMULATED:
        after_slot = accepted[None, :] & (depth[None, :] == slots[:, None] + 1)
        next_node = tl.sum(tl.where(after_slot, nodes[None, :], 0), axis=1)  # 0 (the root) after the last
        committed = tl.load(draft_token_ptr + base + next_node, mask=slot_ok, other=0)
    else:
        committed = tl.load(target_predict_ptr + base + node_at, mask=slot_ok, other=0)
    tl.store(predict_ptr + base + slots, committed.to(tl.int32), mask=slot_ok)
    tl.store(predict_ptr + base + nodes, tl.zeros([NP], dtype=tl.int32), mask=is_node & (nodes >= accept_len))
    bonus = tl.sum(tl.where(slots == accept_len - 1, committed, 0), axis=0)
    tl.store(bonus_ptr + b, bonus.to(tl.int32))
    tl.store(accept_lens_ptr + b, accept_len)
    seq_len = tl.load(seq_lens_ptr + b)
    tl.store(new_seq_lens_ptr + b, seq_len + accept_len.to(seq_len.dtype))


@dataclass
class TreeAcceptance:
    """One verify's outcome per request, in the layouts SGLang's speculative bookkeeping reads."""

    accept_index: torch.Tensor  # [bs, W] int32, flat node ids by depth, -1 past the path
    accept_lens: torch.Tensor  # [bs] int32, committed tokens (accepted drafts + bonus)
    predict: torch.Tensor  # [bs * N] int32, committed tokens at the front of each block
    bonus_tokens: torch.Tensor  # [bs] int32
    new_seq_lens: torch.Tensor  # [bs], seq_lens' dtype


def accept_tree_greedy(
    target_predict: torch.Tensor,
    draft_token: torch.Tensor,
    parent: torch.Tensor,
    depth: torch.Tensor,
    ancestor_bits: torch.Tensor,
    seq_lens: torch.Tensor,
    width: int,
    *,
    simulated_length: Optional[Union[int, torch.Tensor]] = None,
    next_token: Optional[torch.Tensor] = None,
) -> TreeAcceptance:
    """The accepted path of every tree (see the module docstring).

    Args:
        target_predict: ``[bs * N]`` the target's token after each node (its argmax).
        draft_token, ancestor_bits: the verify tensors (``tree_ops.DDTreeTensors``), ``N = B + 1`` nodes.
        parent, depth: ``[bs, B]`` the expansion in pop order (node ``i + 1``; parent -1: padding).
        seq_lens: ``[bs]`` the committed lengths before this verify.
        width: ``W``, the accept index's row (``min(block, N)``).
        simulated_length: cost-only simulation: commit the first-child chain up to this length (an int, or
            ``[bs]`` on the device) instead; needs ``next_token`` (``retrieve_next_token``).
    """
    bs, budget = parent.shape
    n, device = budget + 1, parent.device
    words = ancestor_bits.shape[-1]
    out = TreeAcceptance(
        accept_index=torch.empty((bs, width), dtype=torch.int32, device=device),
        accept_lens=torch.empty((bs,), dtype=torch.int32, device=device),
        predict=torch.empty((bs * n,), dtype=torch.int32, device=device),
        bonus_tokens=torch.empty((bs,), dtype=torch.int32, device=device),
        new_seq_lens=torch.empty_like(seq_lens),
    )
    if bs == 0:
        return out
    simulated = simulated_length is not None
    if simulated and next_token is None:
        raise ValueError("accept_tree_greedy: a simulated length needs the trees' first-child links (next_token)")
    per_request = isinstance(simulated_length, torch.Tensor)
    _tree_accept_kernel[(bs,)](
        target_predict, draft_token, parent, depth, ancestor_bits.contiguous(),
        next_token if simulated else parent, seq_lens, simulated_length if per_request else seq_lens,
        out.accept_index, out.accept_lens, out.predict, out.bonus_tokens, out.new_seq_lens,
        budget, width, int(simulated_length) if simulated and not per_request else 0,
        NP=triton.next_power_of_2(n), WP=triton.next_power_of_2(width), WORDS=words, SIMULATED=simulated,
        PER_REQUEST=per_request,
    )  # fmt: skip
    return out
