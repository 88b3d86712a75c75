"""The draft head (``sglang_ddtree.speculative.ddtree_draft_head``) that the draft CUDA graph runs as its tail: from the
drafter's hidden states it writes exactly the tree that the LM head + reference top-K + reference expansion
give, into buffers at fixed addresses (what a graph replay needs); a batch larger than the captured ones gets
fresh tensors. Under TRITON_INTERPRET=1 on the CPU, or on a GPU. (The graph capture itself is exercised by the
GPU suite: tests/gpu/test_gpu_ddtree.py, graphs on.)
"""

from __future__ import annotations

import os

import pytest
import torch

from sglang_ddtree.speculative.ddtree_draft_head import DDTreeDraftHead
from sglang_ddtree.tree.tree_reference import reference_build_tree, reference_topk_logprobs

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"
pytestmark = pytest.mark.skipif(
    not INTERPRET and not torch.cuda.is_available(), reason="needs TRITON_INTERPRET=1 or a GPU"
)

HIDDEN, VOCAB, PADDED_VOCAB, BLOCK, BUDGET = 16, 96, 128, 5, 12


def head_and_inputs(bs: int, max_bs: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(PADDED_VOCAB, HIDDEN, generator=gen).to(DEVICE)  # rows past VOCAB: padding
    hidden = (torch.randn(bs * BLOCK, HIDDEN, generator=gen) * 2).to(DEVICE)
    head = DDTreeDraftHead(weight, VOCAB, 0, BLOCK, BUDGET, topk=BUDGET, max_bs=max_bs)
    return head, weight, hidden


def test_the_head_writes_the_reference_tree_of_the_drafters_masked_positions():
    bs = 3
    head, weight, hidden = head_and_inputs(bs, max_bs=4)
    tree = head(hidden)
    # Position 0 of each block is the bonus token (the root); depths 1..BLOCK-1 are the masked positions.
    logits = hidden.view(bs, BLOCK, HIDDEN)[:, 1:, :] @ weight[:VOCAB].t()
    top_logprobs, top_tokens = reference_topk_logprobs(logits.cpu(), BUDGET)
    parent, token, depth, path_logprob = reference_build_tree(top_logprobs, top_tokens, BUDGET)
    assert torch.equal(tree.top_tokens.cpu(), top_tokens)
    torch.testing.assert_close(tree.top_logprobs.cpu(), top_logprobs, rtol=1e-6, atol=1e-5)
    assert torch.equal(tree.parent.cpu(), parent) and torch.equal(tree.token.cpu(), token)
    assert torch.equal(tree.depth.cpu(), depth)
    torch.testing.assert_close(tree.path_logprob.cpu(), path_logprob, rtol=1e-6, atol=1e-5)


def test_outputs_stay_at_fixed_addresses_up_to_the_largest_captured_batch():
    head, _, hidden = head_and_inputs(bs=2, max_bs=4)
    first = head(hidden)
    again = head.tree(2)  # what the worker reads after a graph replay
    assert first.parent.data_ptr() == again.parent.data_ptr() == head.tree(4).parent.data_ptr()
    assert torch.equal(first.token, again.token)
    bigger, _, bigger_hidden = head_and_inputs(bs=6, max_bs=4, seed=1)
    tree = bigger(bigger_hidden)
    assert tree.parent.shape == (6, BUDGET) and tree.parent.data_ptr() != bigger.tree(4).parent.data_ptr()


def test_under_the_acceptance_simulation_the_most_probable_branch_spans_the_block():
    """Flat drafter distributions (a random-weight drafter's) make a best-first tree a star: every second
    candidate at depth 1 outscores a depth-2 path. With ``certain_top1`` (set while simulating acceptance) the
    first ``BLOCK - 1`` nodes are each depth's top candidate, a chain under the root, and the rest of the budget
    goes to siblings in the drafter's order; the candidates themselves are the drafter's."""
    bs = 2
    gen = torch.Generator().manual_seed(3)
    weight = (torch.randn(PADDED_VOCAB, HIDDEN, generator=gen) * 1e-3).to(DEVICE)
    hidden = (torch.randn(bs * BLOCK, HIDDEN, generator=gen) * 1e-3).to(DEVICE)
    flat = DDTreeDraftHead(weight, VOCAB, 0, BLOCK, BUDGET, topk=BUDGET, max_bs=bs)(hidden)
    assert flat.depth.max() == 1  # a star: the branch ends at depth 1
    head = DDTreeDraftHead(weight, VOCAB, 0, BLOCK, BUDGET, topk=BUDGET, max_bs=bs, certain_top1=True)
    tree = head(hidden)
    chain = BLOCK - 1
    assert tree.depth[:, :chain].tolist() == [list(range(1, BLOCK))] * bs
    assert tree.parent[:, :chain].tolist() == [list(range(chain))] * bs  # tree node k + 1 (root 0) under node k
    assert torch.equal(tree.token[:, :chain], tree.top_tokens[:, :, 0])
    assert torch.equal(tree.top_tokens, flat.top_tokens)


def test_the_lm_head_multiplies_every_drafted_row_in_one_product_not_one_per_request():
    """The drafted positions are a strided view of the drafter's states; ``torch.matmul`` on that view runs ``bmm``,
    one product per request, each reading the whole LM head (13.6 ms at 16 requests at Qwen3.6-27B's head, 1.03 as
    one product: tests/gpu/RESULTS.md runs 86-87)."""
    from torch.profiler import profile

    head, _, hidden = head_and_inputs(bs=3, max_bs=4)
    with profile() as trace:
        head(hidden)
    ops = [event.name for event in trace.events()]
    assert "aten::mm" in ops and "aten::bmm" not in ops
