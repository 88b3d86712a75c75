"""The drafter-to-tree tail of the DDTree step, folded into the drafter's CUDA graph.

From the drafter's hidden states at the block's masked positions: the target's LM head, the per-depth top-K
log-probabilities (under tensor parallelism each rank's vocabulary shard, all-gathered and merged) and the
best-first tree expansion under the node budget. All of it has static shapes per batch size and no host
synchronisation, so :class:`DDTreeDraftHead` is registered as a capture tail hook of the draft model runner,
as upstream DFlash folds its greedy head: the draft graph's replay then writes the tree into static buffers
that the worker reads. A batch that runs the drafter eagerly calls the head eagerly, with the same buffers.

The LM-head product is most of the head's time on a large target, so its form matters. Multiplying the strided
``[bs, block - 1, H]`` view of the drafter's states by ``W.T`` makes ``torch.matmul`` run one product per request
(a view it cannot fold into rows without a copy goes to ``bmm``), each reading the whole weight: at Qwen3.6-27B's head
(H = 5,120, V = 248,320, 2.5 GB) 0.86 ms per request, 13.6 ms at 16 requests on an H100 (``bench.draft_head_gemm``,
tests/gpu/RESULTS.md run 87). The head multiplies the rows as one ``[bs * (block - 1), H]`` matrix instead (``mm``):
1.03 ms at 16 requests (run 86). Padding those rows to a multiple of 128 or 256 (another cuBLAS kernel) never beat
them: 0.90-1.83 ms unpadded against 0.95-1.98 padded at 1-32 requests (run 89).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch

from sglang_ddtree.kernels.tree_build import build_tree
from sglang_ddtree.kernels.tree_topk import local_topk_payload, merge_topk_payloads, topk_logprobs


def lm_head_logits(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``rows [n, H] @ weight.T -> [n, V]`` as one product over all rows (``mm``: the weight read once)."""
    return torch.mm(rows, weight.t())


@dataclass
class DraftTree:
    """One batch's per-depth candidates and expanded tree, ``[bs, ...]`` views of the head's buffers."""

    top_logprobs: torch.Tensor  # [bs, L, K] float32
    top_tokens: torch.Tensor  # [bs, L, K] int64
    parent: torch.Tensor  # [bs, B] int32
    token: torch.Tensor  # [bs, B] int64
    depth: torch.Tensor  # [bs, B] int32
    path_logprob: torch.Tensor  # [bs, B] float32

    def first_nodes(self, count: int) -> "DraftTree":
        """The best tree of ``count`` nodes: the first ``count`` popped (best-first pops a parent before its
        children and never a more probable node later), contiguous as the verify-tensor kernel needs them."""
        return replace(self, **{name: getattr(self, name)[:, :count].contiguous()
                                for name in ("parent", "token", "depth", "path_logprob")})  # fmt: skip


class DDTreeDraftHead:
    """Writes each batch's :class:`DraftTree` into buffers sized for ``max_bs`` requests (the largest
    captured batch); a larger eager batch gets fresh tensors.

    Args:
        lm_head_weight: the target's LM head rows (this rank's shard under TP).
        vocab_count: rows of ``lm_head_weight`` that are real tokens (the rest is padding).
        vocab_start: global id of this rank's first token (0 without TP).
        block_size: the drafter's block (anchor + ``block_size - 1`` masked positions = tree depths).
        budget: tree nodes per request, root excluded.
        topk: candidates per depth.
        tp_group: SGLang's TP group coordinator when the vocabulary is sharded, else None.
        certain_top1: under the cost-only acceptance simulation (``ddtree_simulation``): score each depth's top
            candidate as certain (log-probability 0). A random-weight drafter's distributions are flat, so its
            best-first trees are stars (a second candidate at depth 1 outscores any depth-2 path) whose most
            probable branch ends at depth 1 and caps a simulated acceptance at 2; with this the branch spans the
            whole block and the rest of the budget goes to siblings in the drafter's order. Same kernels, same
            cost.
    """

    def __init__(
        self,
        lm_head_weight: torch.Tensor,
        vocab_count: int,
        vocab_start: int,
        block_size: int,
        budget: int,
        topk: int,
        max_bs: int,
        tp_group=None,
        certain_top1: bool = False,
    ) -> None:
        self.weight = lm_head_weight
        self.vocab_count, self.vocab_start = int(vocab_count), int(vocab_start)
        self.block_size, self.budget, self.topk = int(block_size), int(budget), int(topk)
        self.max_bs = int(max_bs)
        self.tp_group = tp_group
        self.certain_top1 = certain_top1
        # Only the outputs need fixed addresses (the worker reads them after a replay); intermediates allocated
        # during capture live in the graph's memory pool.
        self._buffers = self._allocate(max(self.max_bs, 1), lm_head_weight.device)

    def _allocate(self, bs: int, device: torch.device) -> DraftTree:
        candidates, nodes = (bs, self.block_size - 1, self.topk), (bs, self.budget)
        return DraftTree(
            top_logprobs=torch.empty(candidates, dtype=torch.float32, device=device),
            top_tokens=torch.empty(candidates, dtype=torch.int64, device=device),
            parent=torch.empty(nodes, dtype=torch.int32, device=device),
            token=torch.empty(nodes, dtype=torch.int64, device=device),
            depth=torch.empty(nodes, dtype=torch.int32, device=device),
            path_logprob=torch.empty(nodes, dtype=torch.float32, device=device),
        )

    def tree(self, bs: int) -> DraftTree:
        """The buffers of a ``bs``-request batch (valid after the head ran for it: graph replay or call)."""
        return DraftTree(**{name: buffer[:bs] for name, buffer in vars(self._buffers).items()})

    def __call__(self, hidden_states: torch.Tensor, input_ids: Optional[torch.Tensor] = None) -> DraftTree:
        """``hidden_states [bs * block_size, H]`` of the drafter -> the batch's tree (``input_ids`` unused:
        the signature of a capture tail hook)."""
        bs = hidden_states.shape[0] // self.block_size
        drafted = self.block_size - 1
        rows = hidden_states.view(bs, self.block_size, -1)[:, 1:, :].reshape(bs * drafted, -1)
        logits = lm_head_logits(rows.to(self.weight.dtype), self.weight[: self.vocab_count])
        logits = logits.view(bs, drafted, -1)
        out = self.tree(bs) if bs <= self.max_bs else self._allocate(bs, hidden_states.device)
        if self.tp_group is None:
            topk_logprobs(logits, self.topk, out_logprobs=out.top_logprobs, out_tokens=out.top_tokens)
        else:
            # This rank's top-K and log-sum-exp, all-gathered in rank order and merged with deterministic
            # ties: every rank writes the bit-identical tree.
            payload = local_topk_payload(logits, self.topk, self.vocab_start)
            gathered = self.tp_group.all_gather(payload.unsqueeze(0), dim=0)  # [ranks, bs, L, K + 1]
            merge_topk_payloads(gathered.contiguous(), self.topk, out_logprobs=out.top_logprobs,
                                out_tokens=out.top_tokens)  # fmt: skip
        if self.certain_top1:
            out.top_logprobs[:, :, 0].zero_()
        build_tree(out.top_logprobs, out.top_tokens, self.budget,
                   out=(out.parent, out.token, out.depth, out.path_logprob))  # fmt: skip
        return out
