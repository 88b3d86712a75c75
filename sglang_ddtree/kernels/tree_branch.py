"""A tree's first-child branch as SGLang's accept index: the cost-only simulation's commit in one launch.

``best_branch_accept_index`` (``sglang_ddtree.speculative.ddtree_simulation``) walks each request's first-child chain
from the root; as a loop over depths in torch that is six small kernels per depth, ~90 launches per simulated verify
of a 16-token block: host time that a real verify does not spend, charged to every simulated DDTree step. Here one
program per request walks its chain in registers.
"""

from __future__ import annotations

from typing import Union

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["length"])
def _first_child_branch_kernel(
    next_token_ptr,
    lengths_ptr,
    index_ptr,
    num_nodes,
    width,
    length,
    PER_REQUEST: tl.constexpr,
):
    b = tl.program_id(0)
    row = b.to(tl.int64) * num_nodes
    if PER_REQUEST:
        length = tl.load(lengths_ptr + b).to(tl.int64)
    out = index_ptr + b.to(tl.int64) * width
    tl.store(out, row.to(tl.int32))
    node = row * 0  # int64 zero: the root
    alive = length > 0
    for depth in range(1, width):
        child = tl.load(next_token_ptr + row + node, mask=alive, other=-1)
        alive = alive & (child >= 0) & (length > depth)
        node = tl.where(alive, child, node)
        tl.store(out + depth, tl.where(alive, row + node, -1).to(tl.int32))


def first_child_branch(next_token: torch.Tensor, length: Union[int, torch.Tensor], width: int) -> torch.Tensor:
    """``[bs, width]`` int32 flat node indices (``b * N + node``) of each tree's first ``length`` nodes along its
    first-child chain from the root (``length``: one int, or ``[bs]`` on the device), ``-1`` past the end of the
    chain or of the length.

    Args:
        next_token: ``[bs, N]`` first child of each node (``retrieve_next_token``), -1 for none.
    """
    bs, num_nodes = next_token.shape
    index = torch.empty((bs, width), dtype=torch.int32, device=next_token.device)
    if bs == 0:
        return index
    per_request = isinstance(length, torch.Tensor)
    _first_child_branch_kernel[(bs,)](
        next_token.contiguous(), length if per_request else next_token, index, num_nodes, width,
        0 if per_request else int(length), PER_REQUEST=per_request,
    )  # fmt: skip
    return index
