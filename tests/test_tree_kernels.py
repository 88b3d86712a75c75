"""The DDTree Triton kernels equal the reference (CPU under TRITON_INTERPRET=1, or on a GPU).

Tree and verify-tensor kernels are fed the reference's own top-K lists, so they must match it
bit for bit. The top-K kernel must pick exactly the reference's tokens; its log-probs may
differ from torch.logsumexp by float rounding only.
"""

from __future__ import annotations

import os

import pytest
import torch

from sglang_ddtree.kernels.tree_build import build_tree
from sglang_ddtree.kernels.tree_topk import (
    local_topk_payload,
    merge_topk_payloads,
    topk_logprobs,
    topk_workspace_numel,
)
from sglang_ddtree.kernels.tree_verify_tensors import (
    VerifyTensors,
    build_verify_tensors,
    full_mask_numel,
)
from sglang_ddtree.tree.tree_ops import DDTreeTensors, build_ddtree
from sglang_ddtree.tree.tree_reference import (
    reference_build_tree,
    reference_topk_logprobs,
    reference_verify_tensors,
)

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"
pytestmark = pytest.mark.skipif(
    not INTERPRET and not torch.cuda.is_available(), reason="needs TRITON_INTERPRET=1 or a GPU"
)
LOGPROB_TOLERANCE = dict(rtol=1e-6, atol=1e-5)


def make_logits(bs: int, depth: int, vocab: int, style: str, seed: int = 0) -> torch.Tensor:
    """Draft logits on the CPU.

    ``normal``: continuous, no ties. ``peaked``: one token per depth boosted by a random margin,
    which gives deep, uneven trees (up to L). ``ties``: four tokens per depth get a logit in
    {-1, 0, 1} (zeros of either sign), all others -8; so equal logits, equal log-probs and
    equal path scores under different parents are everywhere.
    """
    gen = torch.Generator().manual_seed(seed)
    if style == "normal":
        return torch.randn(bs, depth, vocab, generator=gen) * 3
    if style == "peaked":
        logits = torch.randn(bs, depth, vocab, generator=gen) * 2
        top = torch.randint(0, vocab, (bs, depth, 1), generator=gen)
        margin = 9 + 9 * torch.rand(bs, depth, 1, generator=gen)
        return logits.scatter_add(-1, top, margin)
    assert style == "ties"
    logits = torch.full((bs, depth, vocab), -8.0)
    top = torch.rand(bs, depth, vocab, generator=gen).argsort(-1)[..., :4]
    values = torch.randint(-1, 2, top.shape, generator=gen).float()
    negative = torch.rand(top.shape, generator=gen) < 0.5
    values = torch.where((values == 0) & negative, torch.tensor(-0.0), values)
    return logits.scatter(-1, top, values)


def reference_tree(bs: int, depth: int, vocab: int, budget: int, style: str, seed: int = 0):
    logq, tokens = reference_topk_logprobs(make_logits(bs, depth, vocab, style, seed), min(budget, vocab))
    return logq, tokens, reference_build_tree(logq, tokens, budget)


# --- (a) per-depth log-softmax + top-K --------------------------------------------------


@pytest.mark.parametrize(
    "bs,depth,vocab,k,style",
    [
        (1, 1, 49152, 64, "normal"),  # 12 chunks -> one merge round
        (3, 7, 1000, 63, "ties"),
        (1, 15, 50, 50, "normal"),  # k == V: every token ranked
        (8, 1, 1000, 256, "ties"),
        (3, 7, 1000, 1, "ties"),
    ],
)
def test_topk_matches_reference(bs, depth, vocab, k, style):
    logits = make_logits(bs, depth, vocab, style)
    logq, tokens = topk_logprobs(logits.to(DEVICE), k)
    ref_logq, ref_tokens = reference_topk_logprobs(logits, k)
    assert torch.equal(tokens.cpu(), ref_tokens)
    torch.testing.assert_close(logq.cpu(), ref_logq, **LOGPROB_TOLERANCE)


@pytest.mark.parametrize(
    "vocab,k,start",
    [
        (9000, 64, 4160),  # the whole top-64 inside one 64-entry group
        (9000, 64, 4190),  # ... straddling two groups
        (5000, 1500, 700),  # KP = 2048: groups of two entries, two expansion parts
        (5000, 1, 4095),  # K = 1: one group per 4096-entry chunk
    ],
)
def test_topk_finds_top_entries_crowded_into_few_groups(vocab, k, start):
    """The selection only opens the K groups with the largest maxima (``tree_topk``); top
    entries packed into consecutive ids are the case where one group holds many of them."""
    logits = make_logits(2, 1, vocab, "normal")
    logits[..., start : start + k] += 40.0
    logq, tokens = topk_logprobs(logits.to(DEVICE), k)
    ref_logq, ref_tokens = reference_topk_logprobs(logits, k)
    assert torch.equal(tokens.cpu(), ref_tokens)
    torch.testing.assert_close(logq.cpu(), ref_logq, **LOGPROB_TOLERANCE)


def test_topk_reads_strided_half_precision_logits():
    # The worker's logits cover the whole block; the L draft positions are a strided view.
    block = make_logits(2, 8, 1000, "normal").to(torch.bfloat16)
    logq, tokens = topk_logprobs(block.to(DEVICE)[:, 1:], 16)
    ref_logq, ref_tokens = reference_topk_logprobs(block[:, 1:].float(), 16)
    assert torch.equal(tokens.cpu(), ref_tokens)
    torch.testing.assert_close(logq.cpu(), ref_logq, **LOGPROB_TOLERANCE)


def test_topk_uses_the_given_buffers():
    logits = make_logits(3, 2, 1000, "normal").to(DEVICE)
    out_logq = torch.empty(3, 2, 16, device=DEVICE)
    out_tokens = torch.empty(3, 2, 16, dtype=torch.int64, device=DEVICE)
    workspace = torch.empty(topk_workspace_numel(6, 1000, 16), dtype=torch.int64, device=DEVICE)
    logq, tokens = topk_logprobs(logits, 16, out_logprobs=out_logq, out_tokens=out_tokens, workspace=workspace)
    assert logq is out_logq and tokens is out_tokens
    assert torch.equal(tokens.cpu(), reference_topk_logprobs(logits.cpu(), 16)[1])


def test_topk_large_vocab_k64_merges_64_chunk_records():
    """V = 248320, K = 64: 61 chunk records -> one 64-source merge of 64-key records (8 warps).

    Triton 3.6 miscompiled the former sum-based pair split in that merge (see
    ``tree_topk._compare_exchange``): on an H200 it returned token ids outside the vocabulary.
    The interpreter cannot see a miscompile, but the GPU suite runs this file too. One row
    keeps the interpreter fast.
    """
    vocab = 248320
    logits = make_logits(1, 1, vocab, "peaked").to(torch.bfloat16)
    logq, tokens = topk_logprobs(logits.to(DEVICE), 64)
    tokens = tokens.cpu()
    assert int(tokens.min()) >= 0 and int(tokens.max()) < vocab
    ref_logq, ref_tokens = reference_topk_logprobs(logits.float(), 64)
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logq.cpu(), ref_logq, **LOGPROB_TOLERANCE)


def _garbage(shape, dtype) -> torch.Tensor:
    """Stand-in for torch.empty on a GPU: stale bytes, here the worst ones for a top-K (the
    largest key, NaN log-probs, huge token ids)."""
    if dtype == torch.float32:
        return torch.full(shape, float("nan"), device=DEVICE)
    return torch.full(shape, 2**63 - 1, dtype=dtype, device=DEVICE)


def test_topk_never_reads_unwritten_buffer_words():
    """Every output and workspace word is written before it is read (single GPU and TP)."""
    bs, depth, vocab, k = 2, 3, 1000, 63
    logits = make_logits(bs, depth, vocab, "ties").to(DEVICE)
    ref_logq, ref_tokens = reference_topk_logprobs(logits.cpu(), k)
    rows = bs * depth
    logq, tokens = topk_logprobs(
        logits, k,
        out_logprobs=_garbage((bs, depth, k), torch.float32),
        out_tokens=_garbage((bs, depth, k), torch.int64),
        workspace=_garbage((topk_workspace_numel(rows, vocab, k),), torch.int64),
    )
    assert torch.equal(tokens.cpu(), ref_tokens)
    torch.testing.assert_close(logq.cpu(), ref_logq, **LOGPROB_TOLERANCE)

    # 20 shards of 50: the gathered merge takes two rounds, so its workspace is used too.
    k, cuts = 256, list(range(0, vocab + 1, 50))
    kp = 256
    payloads = [
        local_topk_payload(
            logits[..., lo:hi].contiguous(), k, vocab_offset=lo,
            out=_garbage((bs, depth, kp + 1), torch.int64),
            workspace=_garbage((topk_workspace_numel(rows, hi - lo, k),), torch.int64),
        )
        for lo, hi in zip(cuts, cuts[1:])
    ]
    numel = topk_workspace_numel(rows, 0, k, num_sources=len(payloads))
    assert numel > 0
    logq, tokens = merge_topk_payloads(
        torch.stack(payloads), k,
        out_logprobs=_garbage((bs, depth, k), torch.float32),
        out_tokens=_garbage((bs, depth, k), torch.int64),
        workspace=_garbage((numel,), torch.int64),
    )
    ref_logq, ref_tokens = reference_topk_logprobs(logits.cpu(), k)
    assert torch.equal(tokens.cpu(), ref_tokens)
    torch.testing.assert_close(logq.cpu(), ref_logq, **LOGPROB_TOLERANCE)


def _sharded_topk(logits: torch.Tensor, k: int, cuts: list) -> tuple:
    """Each 'rank' sees logits[..., cuts[r]:cuts[r+1]]; payloads are stacked in rank order,
    which is what all_gather_into_tensor produces."""
    payloads = [
        local_topk_payload(logits[..., lo:hi].contiguous(), k, vocab_offset=lo)
        for lo, hi in zip(cuts, cuts[1:])
    ]
    return merge_topk_payloads(torch.stack(payloads), k)


@pytest.mark.parametrize(
    "vocab,k,cuts,style",
    [
        (1000, 64, [0, 400, 750, 1000], "ties"),  # ties straddle shard boundaries
        (1000, 256, [0, 100, 1000], "normal"),  # first shard smaller than k
        (2000, 256, list(range(0, 2001, 100)), "normal"),  # 20 ranks: two merge rounds
    ],
)
def test_sharded_merge_equals_unsharded(vocab, k, cuts, style):
    logits = make_logits(1, 2, vocab, style).to(DEVICE)
    logq, tokens = topk_logprobs(logits, k)
    shard_logq, shard_tokens = _sharded_topk(logits, k, cuts)
    assert torch.equal(shard_tokens, tokens)
    assert torch.equal(shard_tokens.cpu(), reference_topk_logprobs(logits.cpu(), k)[1])
    torch.testing.assert_close(shard_logq, logq, **LOGPROB_TOLERANCE)


# --- (b) best-first expansion -------------------------------------------------------------


@pytest.mark.parametrize(
    "bs,depth,vocab,budget,style",
    [
        (1, 15, 1000, 256, "peaked"),
        (1, 15, 1000, 512, "peaked"),  # largest budget the design targets
        (3, 7, 1000, 64, "ties"),
        (3, 15, 50, 63, "peaked"),
        (8, 1, 50, 16, "normal"),  # depth 1: a star of 16 root children
        (3, 1, 49152, 2, "ties"),
        (8, 7, 1000, 1, "normal"),
        (3, 15, 50, 16, "ties"),
        (2, 2, 3, 16, "normal"),  # only 3 + 9 nodes exist: 4 padding entries
    ],
)
def test_build_tree_matches_reference(bs, depth, vocab, budget, style):
    logq, tokens, expected = reference_tree(bs, depth, vocab, budget, style)
    got = build_tree(logq.to(DEVICE), tokens.to(DEVICE), budget)
    for name, g, e in zip(("parent", "token", "depth", "path_logprob"), got, expected):
        assert g.dtype == e.dtype, name
        assert torch.equal(g.cpu(), e), name


@pytest.mark.parametrize("style", ["peaked", "ties"])
def test_the_first_nodes_of_a_wide_tree_are_the_tree_a_smaller_budget_builds(style):
    """What ``--budget auto`` prices and verifies: the first ``b`` popped nodes of the widest tree (top-K of 64 per
    depth) are exactly the budget-``b`` tree (top-K of ``b``, as ``build_ddtree`` picks), for every captured width."""
    logits = make_logits(2, 7, 100, style)
    wide = build_tree(*topk_logprobs(logits.to(DEVICE), 64), 64)
    for budget in (1, 7, 32):
        narrow = build_tree(*topk_logprobs(logits.to(DEVICE), budget), budget)
        for name, w, n in zip(("parent", "token", "depth", "path_logprob"), wide, narrow):
            assert torch.equal(w[:, :budget].cpu(), n.cpu()), (budget, name)


def test_peaked_logits_reach_full_depth():
    """Guards the parametrisation above: the depth-15 cases really build depth-15 paths."""
    _, _, (_, _, depth, _) = reference_tree(1, 15, 1000, 256, "peaked")
    assert int(depth.max()) == 15


# --- (c) verify tensors -------------------------------------------------------------------


@pytest.mark.parametrize(
    "bs,depth,vocab,budget,seq_lens",
    [
        (1, 15, 1000, 256, [600]),  # 600 prefix columns: several prefix blocks per split
        (1, 15, 1000, 512, [40]),  # N = 513: nine ancestor words
        (3, 7, 1000, 63, [1, 70, 5]),  # N = 64: exactly one ancestor word
        (3, 15, 1000, 64, [9, 1, 300]),  # N = 65: the second word holds one node
        (8, 1, 1000, 16, [3, 1, 4, 1, 5, 9, 2, 6]),
        (2, 2, 3, 16, [7, 2]),  # padded trees
    ],
)
def test_verify_tensors_match_reference(bs, depth, vocab, budget, seq_lens):
    _, _, (parent, token, node_depth, _) = reference_tree(bs, depth, vocab, budget, "peaked", seed=bs)
    roots = torch.arange(100, 100 + bs)
    seq = torch.tensor(seq_lens)
    expected = reference_verify_tensors(parent, token, node_depth, roots, seq)

    got = build_verify_tensors(
        parent.to(DEVICE), token.to(DEVICE), node_depth.to(DEVICE), roots.to(DEVICE), seq.to(DEVICE),
        depth, seq_lens_sum=sum(seq_lens),
    )
    assert got.custom_mask.numel() == full_mask_numel(sum(seq_lens), bs, budget)
    for name, value in expected.items():
        assert torch.equal(getattr(got, name).cpu(), value), name


def test_verify_tensors_write_only_the_used_part_of_a_larger_mask_buffer():
    bs, depth, budget, seq_lens = 3, 4, 16, [5, 1, 12]
    _, _, (parent, token, node_depth, _) = reference_tree(bs, depth, 1000, budget, "peaked")
    roots, seq = torch.zeros(bs, dtype=torch.int64), torch.tensor(seq_lens)
    used = full_mask_numel(sum(seq_lens), bs, budget)
    out = VerifyTensors.allocate(bs, budget, used + 100, torch.device(DEVICE))
    out.custom_mask.zero_()
    build_verify_tensors(
        parent.to(DEVICE), token.to(DEVICE), node_depth.to(DEVICE), roots.to(DEVICE), seq.to(DEVICE),
        depth, out=out,
    )
    expected = reference_verify_tensors(parent, token, node_depth, roots, seq)
    assert torch.equal(out.custom_mask[:used].cpu(), expected["custom_mask"])
    assert not out.custom_mask[used:].any()


def test_verify_tensors_without_the_full_mask_are_the_same_and_write_no_mask():
    """For an attention that takes the tree block from ``ancestor_bits`` (``flashinfer_split_verify``)."""
    bs, depth, budget, seq_lens = 3, 6, 31, [40, 0, 7]
    _, _, (parent, token, node_depth, _) = reference_tree(bs, depth, 1000, budget, "peaked", seed=5)
    roots, seq = torch.arange(3, 3 + bs), torch.tensor(seq_lens)
    expected = reference_verify_tensors(parent, token, node_depth, roots, seq)
    got = build_verify_tensors(
        parent.to(DEVICE), token.to(DEVICE), node_depth.to(DEVICE), roots.to(DEVICE), seq.to(DEVICE), depth,
        full_mask=False,
    )
    assert got.custom_mask is None
    for name, value in expected.items():
        if name != "custom_mask":
            assert torch.equal(getattr(got, name).cpu(), value), name


def test_mask_round_trips_to_parents():
    """The parent of node i is the largest tree column < i visible from row i (-1 if none)."""
    bs, depth, budget, seq_lens = 3, 15, 63, [4, 0, 17]
    _, _, (parent, token, node_depth, _) = reference_tree(bs, depth, 50, budget, "peaked")
    out = build_verify_tensors(
        parent.to(DEVICE), token.to(DEVICE), node_depth.to(DEVICE), torch.zeros(bs, dtype=torch.int64, device=DEVICE),
        torch.tensor(seq_lens, device=DEVICE), depth, seq_lens_sum=sum(seq_lens),
    )
    n, offset = budget + 1, 0
    for b, seq_len in enumerate(seq_lens):
        block = out.custom_mask[offset : offset + n * (seq_len + n)].view(n, seq_len + n).cpu()
        offset += n * (seq_len + n)
        assert block[:, :seq_len].all()
        tree = block[:, seq_len:]
        assert tree.diagonal().all() and not tree.triu(1).any()
        strict = tree & ~torch.eye(n, dtype=torch.bool)
        cols = torch.arange(n).expand(n, n)
        recovered = torch.where(strict, cols, -1).max(dim=1).values
        assert recovered[1:].tolist() == parent[b].tolist()
        assert recovered[0] == -1


# --- glue: build_ddtree ---------------------------------------------------------------------


def test_build_ddtree_fills_preallocated_buffers_and_matches_reference():
    bs, depth, vocab, budget, seq_lens = 3, 4, 1000, 16, [5, 20, 1]
    logits = make_logits(bs, depth, vocab, "peaked").to(DEVICE)
    roots = torch.tensor([7, 8, 9], device=DEVICE)
    seq = torch.tensor(seq_lens, device=DEVICE)
    out = DDTreeTensors.allocate(
        bs, depth, budget, vocab, full_mask_numel(sum(seq_lens), bs, budget), torch.device(DEVICE)
    )
    pointers = {name: t.data_ptr() for name, t in vars(out).items()}
    result = build_ddtree(logits, budget, roots, seq, out=out)
    assert result is out
    assert {name: t.data_ptr() for name, t in vars(out).items()} == pointers

    ref_logq, ref_tokens = reference_topk_logprobs(logits.cpu(), budget)
    assert torch.equal(out.top_tokens.cpu(), ref_tokens)
    torch.testing.assert_close(out.top_logprobs.cpu(), ref_logq, **LOGPROB_TOLERANCE)
    # The tree must be the reference tree *of the kernel's own log-probs* (exact comparison).
    tree = reference_build_tree(out.top_logprobs.cpu(), out.top_tokens.cpu(), budget)
    for name, value in zip(("parent", "token", "depth", "path_logprob"), tree):
        assert torch.equal(getattr(out, name).cpu(), value), name
    verify = reference_verify_tensors(*tree[:3], roots.cpu(), seq.cpu())
    for name, value in verify.items():
        assert torch.equal(getattr(out, name).cpu(), value), name

    allocated = build_ddtree(logits, budget, roots, seq, seq_lens_sum=sum(seq_lens))
    for name in pointers.keys() - {"topk_workspace"}:
        assert torch.equal(getattr(allocated, name), getattr(out, name)), name


def test_a_bonus_only_tree_has_the_reference_verify_tensors_of_a_tree_without_nodes():
    """``--budget auto``'s width 1 (``root_only_ddtree``, no kernel): each request verifies its bonus token alone."""
    from sglang_ddtree.tree.tree_ops import root_only_ddtree

    roots, seq = torch.tensor([7, 8, 9]), torch.tensor([4, 1, 6])
    no_nodes = torch.empty((3, 0), dtype=torch.int32)
    expected = reference_verify_tensors(no_nodes, no_nodes.long(), no_nodes, roots, seq)
    got = root_only_ddtree(roots.to(DEVICE), seq.to(DEVICE), seq_lens_sum=int(seq.sum()) + 5)  # a loose bound
    for name, value in expected.items():
        tensor = getattr(got, name).cpu()
        if name == "custom_mask":
            assert bool(tensor.all()) and tensor.numel() >= value.numel()
            tensor = tensor[: value.numel()]
        assert torch.equal(tensor, value.to(tensor.dtype)), name
    split = root_only_ddtree(roots.to(DEVICE), seq.to(DEVICE), seq_lens_sum=0, full_mask=False)  # the split verify
    assert split.custom_mask is None and torch.equal(split.ancestor_bits.cpu(), expected["ancestor_bits"])


@pytest.mark.parametrize("per_request", [False, True])
def test_the_first_child_branch_kernel_walks_each_trees_chain_as_the_plain_loop_does(per_request):
    """The simulation's commit (``kernels/tree_branch.py``) on real trees, against a Python walk of each chain."""
    from sglang_ddtree.kernels.tree_branch import first_child_branch

    _, _, (parent, token, node_depth, _) = reference_tree(6, 7, 1000, 32, "peaked", seed=3)
    seq = torch.tensor([5, 1, 9, 2, 7, 3])
    next_token = reference_verify_tensors(parent, token, node_depth, torch.arange(6), seq)["retrieve_next_token"]
    lengths = torch.tensor([1, 3, 8, 2, 5, 4])
    length = lengths.to(DEVICE) if per_request else 5
    got = first_child_branch(next_token.to(DEVICE), length, width=8).cpu()
    num_nodes = next_token.shape[1]
    for b in range(6):
        expected, node = [b * num_nodes], 0
        cut = int(lengths[b]) if per_request else 5
        while len(expected) < min(cut, 8) and int(next_token[b, node]) >= 0:
            node = int(next_token[b, node])
            expected.append(b * num_nodes + node)
        assert got[b].tolist() == expected + [-1] * (8 - len(expected)), b
