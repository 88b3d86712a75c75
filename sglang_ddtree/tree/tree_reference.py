"""Plain PyTorch + heapq reference for DDTree tree construction (the executable specification).

This follows the authors' ``ddtree.py::build_ddtree_tree`` (liranringel/ddtree) and pins down
every detail the Triton kernels in ``sglang_ddtree.kernels`` must reproduce bit for bit:

1. **Per-depth candidates.** For each of the ``L`` draft depths, the top ``K`` tokens of the
   drafter's logits, ``K = min(B, V)``, ordered by logit descending; equal logits: lower token
   id first. ``logq = logit - logsumexp(logits)`` in float32. Selection uses the raw logits, so
   the token lists do not depend on how the log-sum-exp is rounded (or sharded).
2. **Path score.** ``w(root) = 0`` and ``w(child) = fp32(w(parent) + logq[depth][rank])``, i.e.
   the float32 sum of the path's log-probs taken root to leaf. (The authors update a sibling's
   score as ``w - logq[r] + logq[r+1]``; the sum is the same in exact arithmetic but this form
   is reproducible and exactly monotone, so best-first order is exact.)
3. **Best-first expansion.** The frontier holds at most one candidate per parent: the parent's
   next unexplored rank. Pop the best candidate, add it as the next node, then push its next
   sibling (same parent, rank + 1, if rank + 1 < K) and its first child (rank 0 at depth + 1,
   if depth < L). Stop after ``B`` pops. **Tie-break:** higher score first; equal scores ->
   lower parent node id first. With one candidate per parent this is a total order, and it is
   cheap to evaluate in a kernel (a single integer max over packed keys).
4. **Numbering.** Nodes are numbered in pop order, root = 0, so parent < child and the
   children of a node are numbered in rank order. If the frontier empties before ``B`` pops
   (only possible when ``sum_d K**d < B``, i.e. a vocabulary smaller than the budget), the
   remaining entries are padding: parent -1, depth 0, token 0, path log-prob -inf. Padding
   nodes are linked to nothing, so verification can never accept them.

The verify tensors (EagleVerifyInput conventions, ``N = B + 1`` nodes per request incl. root)
are defined in :func:`reference_verify_tensors`.
"""

from __future__ import annotations

import heapq
from typing import Tuple

import numpy as np
import torch

from sglang_ddtree.tree.tree_ops import DDTreeTensors

PADDING_PARENT = -1


def reference_topk_logprobs(logits: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` log-probs and token ids per row of ``logits [..., V]``.

    Returns ``(logprobs float32 [..., k], tokens int64 [..., k])``, sorted by logit descending
    with ties broken by lower token id (a stable descending sort keeps equal logits in index
    order).
    """
    x = logits.float()
    log_z = torch.logsumexp(x, dim=-1, keepdim=True)
    values, ids = torch.sort(x, dim=-1, descending=True, stable=True)
    return (values[..., :k] - log_z).contiguous(), ids[..., :k].contiguous()


def reference_build_tree(
    top_logprobs: torch.Tensor, top_tokens: torch.Tensor, budget: int
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Best-first expansion (rules 2-4 of the module docstring) for every request.

    Args:
        top_logprobs: ``[bs, L, K]`` float32, each row sorted descending.
        top_tokens: ``[bs, L, K]`` token ids aligned with ``top_logprobs``.
        budget: ``B``, number of nodes to add (root excluded).

    Returns ``(parent int32, token int64, depth int32, path_logprob float32)``, each ``[bs, B]``
    in pop order; entry ``i`` describes node ``i + 1`` and parents use node ids (0 = root).
    """
    bs, depth_limit, k = top_logprobs.shape
    logq = top_logprobs.detach().cpu().float().numpy()
    toks = top_tokens.detach().cpu().long().numpy()
    parent = np.full((bs, budget), PADDING_PARENT, dtype=np.int32)
    token = np.zeros((bs, budget), dtype=np.int64)
    depth = np.zeros((bs, budget), dtype=np.int32)
    path_logprob = np.full((bs, budget), -np.inf, dtype=np.float32)
    for b in range(bs):
        node_score = [np.float32(0.0)]  # node id -> path score; root = 0
        # Heap entries: (-score, parent id, rank, depth). (-score, parent) is the pop order.
        heap = [(-float(logq[b, 0, 0]), 0, 0, 1)]
        for i in range(budget):
            if not heap:
                break
            neg_score, par, rank, d = heapq.heappop(heap)
            node = i + 1
            score = np.float32(-neg_score)
            parent[b, i], token[b, i], depth[b, i] = par, toks[b, d - 1, rank], d
            path_logprob[b, i] = score
            node_score.append(score)
            if rank + 1 < k:
                sibling = np.float32(node_score[par] + logq[b, d - 1, rank + 1])
                heapq.heappush(heap, (-float(sibling), par, rank + 1, d))
            if d < depth_limit:
                child = np.float32(score + logq[b, d, 0])
                heapq.heappush(heap, (-float(child), node, 0, d + 1))
    return (
        torch.from_numpy(parent),
        torch.from_numpy(token),
        torch.from_numpy(depth),
        torch.from_numpy(path_logprob),
    )


def _to_int64_word(bits: int) -> int:
    """Reinterpret an unsigned 64-bit pattern as a signed int64 value."""
    return bits - (1 << 64) if bits >= (1 << 63) else bits


def tree_links(parents: list[int]) -> tuple[list[int], list[int]]:
    """SGLang's ``retrieve_next_token`` (each node's smallest-index child) and ``retrieve_next_sibling`` (the next
    larger-index child of its parent) of a tree numbered parent before child, -1 where there is none; a padding
    node (parent -1 past the root, :data:`PADDING_PARENT`) links nowhere."""
    first_child, next_sibling = [-1] * len(parents), [-1] * len(parents)
    last_child: dict[int, int] = {}
    for node, parent in enumerate(parents):
        if node == 0 or parent == PADDING_PARENT:
            continue
        if parent in last_child:
            next_sibling[last_child[parent]] = node
        else:
            first_child[parent] = node
        last_child[parent] = node
    return first_child, next_sibling


def reference_verify_tensors(
    parent: torch.Tensor,
    token: torch.Tensor,
    depth: torch.Tensor,
    root_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
) -> dict:
    """The tensors SGLang's tree verification consumes, written out from their definitions.

    For request ``b`` with ``N = B + 1`` nodes (node 0 = root = ``root_tokens[b]``):

    * ``draft_token [bs*N]`` int64: node tokens, root first; padding nodes carry token 0.
    * ``positions [bs*N]`` int64: ``seq_lens[b] + depth``.
    * ``retrieve_index [bs, N]`` int64: global flat node id ``b*N + i``.
    * ``retrieve_next_token [bs, N]`` int64: smallest-index child, or -1.
    * ``retrieve_next_sibling [bs, N]`` int64: next larger-index node with the same parent, or -1.
    * ``custom_mask`` bool, FULL layout: per request a row-major ``[N, seq_len + N]`` block,
      blocks concatenated in batch order; prefix columns True; tree column ``j`` of row ``i``
      True iff ``j`` is ``i`` or an ancestor of ``i``.
    * ``ancestor_bits [bs, N, ceil(N/64)]`` int64: bit ``j % 64`` of word ``j // 64`` set iff
      ``j`` is ``i`` or an ancestor of ``i`` (the tree block of the mask, packed).
    """
    bs, budget = parent.shape
    n = budget + 1
    words = (n + 63) // 64
    draft_token = torch.zeros(bs * n, dtype=torch.int64)
    positions = torch.zeros(bs * n, dtype=torch.int64)
    retrieve_index = torch.arange(bs * n, dtype=torch.int64).view(bs, n)
    next_token = torch.full((bs, n), -1, dtype=torch.int64)
    next_sibling = torch.full((bs, n), -1, dtype=torch.int64)
    ancestor_bits = torch.zeros((bs, n, words), dtype=torch.int64)
    mask_blocks = []
    for b in range(bs):
        par = [PADDING_PARENT] + parent[b].tolist()
        dep = [0] + depth[b].tolist()
        tok = [int(root_tokens[b])] + token[b].tolist()
        seq_len = int(seq_lens[b])
        draft_token[b * n : (b + 1) * n] = torch.tensor(tok)
        positions[b * n : (b + 1) * n] = seq_len + torch.tensor(dep)
        first_child, sibling = tree_links(par)
        next_token[b], next_sibling[b] = torch.tensor(first_child), torch.tensor(sibling)
        block = torch.zeros((n, seq_len + n), dtype=torch.bool)
        block[:, :seq_len] = True
        for i in range(n):
            j, bits = i, [0] * words
            while j != PADDING_PARENT:
                block[i, seq_len + j] = True
                bits[j // 64] |= 1 << (j % 64)
                j = par[j]
            ancestor_bits[b, i] = torch.tensor([_to_int64_word(w) for w in bits])
        mask_blocks.append(block.flatten())
    return {
        "draft_token": draft_token,
        "positions": positions,
        "retrieve_index": retrieve_index,
        "retrieve_next_token": next_token,
        "retrieve_next_sibling": next_sibling,
        "custom_mask": torch.cat(mask_blocks),
        "ancestor_bits": ancestor_bits,
    }


def reference_build_ddtree(
    draft_logits: torch.Tensor,
    budget: int,
    root_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
) -> DDTreeTensors:
    """The whole pipeline (top-K, expansion, verify tensors) on CPU, as :class:`DDTreeTensors`."""
    k = min(budget, draft_logits.shape[-1])
    top_logprobs, top_tokens = reference_topk_logprobs(draft_logits.cpu(), k)
    parent, token, depth, path_logprob = reference_build_tree(top_logprobs, top_tokens, budget)
    verify = reference_verify_tensors(parent, token, depth, root_tokens.cpu(), seq_lens.cpu())
    return DDTreeTensors(
        top_logprobs=top_logprobs,
        top_tokens=top_tokens,
        parent=parent,
        token=token,
        depth=depth,
        path_logprob=path_logprob,
        **verify,
    )
