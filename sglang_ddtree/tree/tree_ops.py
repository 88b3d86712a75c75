"""One entry point from drafter logits to every DDTree tensor the verify step needs.

``build_ddtree`` chains the three kernels (top-K -> best-first expansion -> verify tensors)
without host synchronisation. With a preallocated :class:`DDTreeTensors` passed as ``out`` it
allocates nothing either, so a worker can capture it in a CUDA graph. Under tensor
parallelism, compute the top-K with ``tree_topk.local_topk_payload`` + all-gather +
``merge_topk_payloads`` and continue with :func:`build_ddtree_from_topk`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

import torch

from sglang_ddtree.kernels.tree_build import build_tree
from sglang_ddtree.kernels.tree_topk import topk_logprobs, topk_workspace_numel
from sglang_ddtree.kernels.tree_verify_tensors import (
    VerifyTensors,
    build_verify_tensors,
    full_mask_numel,
)


@dataclass
class DDTreeTensors:
    """All tensors of one batch of DDTrees; ``B`` = budget, ``N = B + 1`` nodes incl. the root.

    Per-depth candidates and the tree in pop order (entry ``i`` = node ``i + 1``; parent -1 marks
    padding, see ``tree_reference``), then the ``EagleVerifyInput`` tensors.
    """

    top_logprobs: torch.Tensor  # [bs, L, K] float32, K = min(B, V) unless capped
    top_tokens: torch.Tensor  # [bs, L, K] int64
    parent: torch.Tensor  # [bs, B] int32, node ids (0 = root)
    token: torch.Tensor  # [bs, B] int64
    depth: torch.Tensor  # [bs, B] int32, 1..L
    path_logprob: torch.Tensor  # [bs, B] float32
    draft_token: torch.Tensor  # [bs*N] int64, root first
    positions: torch.Tensor  # [bs*N] int64, seq_len + depth
    retrieve_index: torch.Tensor  # [bs, N] int64, b*N + i
    retrieve_next_token: torch.Tensor  # [bs, N] int64, first child or -1
    retrieve_next_sibling: torch.Tensor  # [bs, N] int64, next sibling or -1
    custom_mask: Optional[torch.Tensor]  # FULL layout, >= sum_b N*(seq_len_b + N) bool; None: not built
    ancestor_bits: torch.Tensor  # [bs, N, ceil(N/64)] int64
    topk_workspace: Optional[torch.Tensor] = None  # int64 scratch of the top-K kernels

    @classmethod
    def allocate(
        cls,
        batch_size: int,
        depth: int,
        budget: int,
        vocab_size: int,
        mask_numel: int,
        device: torch.device,
        topk: Optional[int] = None,
    ) -> "DDTreeTensors":
        """Buffers for :func:`build_ddtree`; ``mask_numel`` bounds ``sum_b N*(seq_len_b + N)``
        (e.g. ``full_mask_numel(max_bs * max_context_len, max_bs, budget)``)."""
        k = topk or min(budget, vocab_size)
        verify = VerifyTensors.allocate(batch_size, budget, mask_numel, device)
        pairs = (batch_size, budget)
        return cls(
            top_logprobs=torch.empty((batch_size, depth, k), dtype=torch.float32, device=device),
            top_tokens=torch.empty((batch_size, depth, k), dtype=torch.int64, device=device),
            parent=torch.empty(pairs, dtype=torch.int32, device=device),
            token=torch.empty(pairs, dtype=torch.int64, device=device),
            depth=torch.empty(pairs, dtype=torch.int32, device=device),
            path_logprob=torch.empty(pairs, dtype=torch.float32, device=device),
            topk_workspace=torch.empty(
                topk_workspace_numel(batch_size * depth, vocab_size, k), dtype=torch.int64, device=device
            ),
            **_verify_fields(verify),
        )


def _verify_fields(tensors) -> dict:
    """The :class:`VerifyTensors` fields of ``tensors`` (which share their names)."""
    return {f.name: getattr(tensors, f.name) for f in fields(VerifyTensors)}


def ddtree_from_expansion(
    top_logprobs: torch.Tensor,
    top_tokens: torch.Tensor,
    parent: torch.Tensor,
    token: torch.Tensor,
    depth: torch.Tensor,
    path_logprob: torch.Tensor,
    root_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    seq_lens_sum: Optional[int] = None,
    full_mask: bool = True,
) -> DDTreeTensors:
    """The verify tensors of an already expanded tree (``build_tree``'s outputs, e.g. written by the draft
    graph's head): the part of the build that depends on the sequence lengths (``full_mask``: see
    ``build_verify_tensors``)."""
    verify = build_verify_tensors(
        parent, token, depth, root_tokens, seq_lens, top_logprobs.shape[1], seq_lens_sum=seq_lens_sum,
        full_mask=full_mask,
    )  # fmt: skip
    return DDTreeTensors(
        top_logprobs=top_logprobs,
        top_tokens=top_tokens,
        parent=parent,
        token=token,
        depth=depth,
        path_logprob=path_logprob,
        **_verify_fields(verify),
    )


def root_only_ddtree(
    root_tokens: torch.Tensor, seq_lens: torch.Tensor, seq_lens_sum: int, full_mask: bool = True
) -> DDTreeTensors:
    """The verify tensors of trees that are only their root (a verify of the bonus tokens, width 1), without a
    kernel: each request's one row sees its whole prefix and itself, so the FULL mask is all True.

    ``seq_lens_sum``: a host bound on ``seq_lens.sum()`` (a larger mask is only longer than it needs to be);
    without ``full_mask`` no FULL mask is made (``custom_mask`` None)."""
    bs, device = root_tokens.shape[0], root_tokens.device
    empty = {"dtype": torch.int64, "device": device}
    return DDTreeTensors(
        top_logprobs=torch.empty((bs, 0, 0), dtype=torch.float32, device=device),
        top_tokens=torch.empty((bs, 0, 0), **empty),
        parent=torch.empty((bs, 0), dtype=torch.int32, device=device),
        token=torch.empty((bs, 0), **empty),
        depth=torch.empty((bs, 0), dtype=torch.int32, device=device),
        path_logprob=torch.empty((bs, 0), dtype=torch.float32, device=device),
        draft_token=root_tokens.to(torch.int64).reshape(bs),
        positions=seq_lens.to(torch.int64).reshape(bs),
        retrieve_index=torch.arange(bs, **empty).view(bs, 1),
        retrieve_next_token=torch.full((bs, 1), -1, **empty),
        retrieve_next_sibling=torch.full((bs, 1), -1, **empty),
        custom_mask=(
            torch.ones(full_mask_numel(seq_lens_sum, bs, budget=0), dtype=torch.bool, device=device)
            if full_mask
            else None
        ),
        ancestor_bits=torch.ones((bs, 1, 1), **empty),
    )


def build_ddtree_from_topk(
    top_logprobs: torch.Tensor,
    top_tokens: torch.Tensor,
    budget: int,
    root_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    out: Optional[DDTreeTensors] = None,
    seq_lens_sum: Optional[int] = None,
) -> DDTreeTensors:
    """Expansion + verify tensors from per-depth top-K lists ``[bs, L, K]`` (e.g. the TP merge).

    The lists are read from the arguments; with ``out``, have the TP merge write straight into
    ``out.top_logprobs``/``out.top_tokens`` so the returned object describes them too.
    ``seq_lens_sum`` (host int) avoids a sync when ``out`` is not given.
    """
    depth_limit = top_logprobs.shape[1]
    if out is None:
        parent, token, depth, path_logprob = build_tree(top_logprobs, top_tokens, budget)
        return ddtree_from_expansion(
            top_logprobs, top_tokens, parent, token, depth, path_logprob, root_tokens, seq_lens,
            seq_lens_sum=seq_lens_sum,
        )  # fmt: skip
    build_tree(top_logprobs, top_tokens, budget, out=(out.parent, out.token, out.depth, out.path_logprob))
    build_verify_tensors(
        out.parent, out.token, out.depth, root_tokens, seq_lens, depth_limit,
        out=VerifyTensors(**_verify_fields(out)),
    )
    return out


def build_ddtree(
    draft_logits: torch.Tensor,
    budget: int,
    root_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    out: Optional[DDTreeTensors] = None,
    seq_lens_sum: Optional[int] = None,
    topk: Optional[int] = None,
) -> DDTreeTensors:
    """Build a DDTree per request from the drafter's logits and its verify tensors.

    Args:
        draft_logits: ``[bs, L, V]`` logits of the L masked draft positions (any float dtype;
            the vocabulary dimension must be contiguous, the others may be strided).
        budget: ``B`` tree nodes per request, root excluded.
        root_tokens: ``[bs]`` bonus tokens (tree roots).
        seq_lens: ``[bs]`` committed sequence lengths (positions of the roots).
        out: buffers from :meth:`DDTreeTensors.allocate`; then nothing is allocated.
        seq_lens_sum: host ``seq_lens.sum()``, only used to size a new mask when ``out`` is None.
        topk: candidates per depth; default ``min(B, V)`` as in the paper (ignored with ``out``,
            whose ``top_logprobs`` width is used).
    """
    if out is not None:
        k = out.top_logprobs.shape[-1]
        top_logprobs, top_tokens = topk_logprobs(
            draft_logits,
            k,
            out_logprobs=out.top_logprobs,
            out_tokens=out.top_tokens,
            workspace=out.topk_workspace,
        )
    else:
        k = topk or min(budget, draft_logits.shape[-1])
        top_logprobs, top_tokens = topk_logprobs(draft_logits, k)
    return build_ddtree_from_topk(
        top_logprobs, top_tokens, budget, root_tokens, seq_lens, out=out, seq_lens_sum=seq_lens_sum
    )


__all__ = ["DDTreeTensors", "build_ddtree", "build_ddtree_from_topk", "ddtree_from_expansion", "full_mask_numel",
           "root_only_ddtree"]
