"""Specification tests for the DDTree reference (sglang_ddtree.tree.tree_reference)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sglang_ddtree.tree.tree_reference import (
    reference_build_tree,
    reference_topk_logprobs,
    reference_verify_tensors,
)


def _logq(*rows):
    """A [1, L, K] top-K tensor from per-depth probability lists (sorted descending)."""
    return torch.tensor([[[math.log(p) for p in row] for row in rows]], dtype=torch.float32)


def _token_ids(depth: int, k: int) -> torch.Tensor:
    """Token ids 100*d + r, so a node's (depth, rank) can be read off its token."""
    return torch.tensor([[[100 * d + r for r in range(k)] for d in range(1, depth + 1)]])


def test_topk_orders_by_logit_then_lower_token_id():
    logits = torch.tensor([[[1.0, 3.0, 3.0, 0.0, 3.0, -0.0]]])
    logprobs, tokens = reference_topk_logprobs(logits, 5)
    assert tokens.tolist() == [[[1, 2, 4, 0, 3]]]
    log_z = torch.logsumexp(logits, dim=-1)
    expected = torch.tensor([3.0, 3.0, 3.0, 1.0, 0.0]) - log_z
    assert torch.allclose(logprobs, expected)


def test_expansion_pops_best_path_first():
    # Path probabilities: d1 = .6 / .4; under each, d2 = .7 / .3.
    # Pops: .6 (root child), .42 (its child), .4 (second root child), .28 (its child).
    logq = _logq([0.6, 0.4], [0.7, 0.3])
    parent, token, depth, score = reference_build_tree(logq, _token_ids(2, 2), budget=4)
    assert parent.tolist() == [[0, 1, 0, 3]]
    assert depth.tolist() == [[1, 2, 1, 2]]
    assert token.tolist() == [[100, 200, 101, 200]]
    assert torch.allclose(score.exp(), torch.tensor([[0.6, 0.42, 0.4, 0.28]]))


def test_equal_scores_pop_lower_parent_id_first():
    # Every depth is a fair coin, so all paths of one depth tie exactly.
    logq = _logq([0.5, 0.5], [0.5, 0.5])
    parent, _, depth, _ = reference_build_tree(logq, _token_ids(2, 2), budget=6)
    # Nodes 1, 2 = both root children; then the tied depth-2 candidates by parent id: node 1's
    # two children before node 2's.
    assert parent.tolist() == [[0, 0, 1, 1, 2, 2]]
    assert depth.tolist() == [[1, 1, 2, 2, 2, 2]]


def test_budget_beyond_the_full_tree_is_padded():
    # V = K = 2, L = 2: only 2 + 4 nodes exist.
    logq = _logq([0.9, 0.1], [0.8, 0.2])
    parent, token, depth, score = reference_build_tree(logq, _token_ids(2, 2), budget=9)
    assert (parent[0, :6] >= 0).all()
    assert parent[0, 6:].tolist() == [-1, -1, -1]
    assert depth[0, 6:].tolist() == [0, 0, 0]
    assert token[0, 6:].tolist() == [0, 0, 0]
    assert torch.isneginf(score[0, 6:]).all()


@pytest.mark.parametrize("seed", range(4))
def test_tree_is_consistent_with_its_topk_lists(seed):
    """Pop order numbering, ranks, tokens and fp32 path sums, checked node by node."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 5, 40, generator=gen) * 3
    budget = 48
    logq, tokens = reference_topk_logprobs(logits, budget)
    parent, token, depth, score = reference_build_tree(logq, tokens, budget)
    for b in range(3):
        node_depth, node_score, children = [0], [np.float32(0.0)], {0: 0}
        for i in range(budget):
            node, par, d = i + 1, int(parent[b, i]), int(depth[b, i])
            assert 0 <= par < node
            assert d == node_depth[par] + 1
            rank = children.get(par, 0)  # siblings are popped in rank order
            children[par] = rank + 1
            assert int(token[b, i]) == int(tokens[b, d - 1, rank])
            expected = np.float32(node_score[par] + logq[b, d - 1, rank].numpy())
            assert score[b, i].numpy() == expected
            node_depth.append(d)
            node_score.append(expected)
        assert (score[b, 1:] <= score[b, :-1]).all(), "best-first pops never improve"


def _best_prefix_closed_value(logq: np.ndarray, budget: int) -> float:
    """max over prefix-closed node sets of size ``budget`` of the sum of path probabilities.

    Nodes are rank tuples of the full K-ary tree of depth L; sets grow one frontier node at a
    time, which enumerates exactly the prefix-closed sets.
    """
    depth_limit, k = logq.shape

    def prob(path):
        return math.exp(sum(float(logq[d, r]) for d, r in enumerate(path)))

    sets = {frozenset()}
    for _ in range(budget):
        grown = set()
        for nodes in sets:
            frontier = [(r,) for r in range(k)] + [
                path + (r,) for path in nodes if len(path) < depth_limit for r in range(k)
            ]
            grown.update(nodes | {path} for path in frontier if path not in nodes)
        sets = grown
    return max(sum(prob(path) for path in nodes) for nodes in sets)


@pytest.mark.parametrize("vocab,depth_limit,budget", [(3, 3, 1), (3, 3, 4), (2, 3, 6), (3, 2, 5), (4, 1, 3)])
@pytest.mark.parametrize("integer_logits", [False, True])
def test_chosen_set_is_optimal_against_brute_force(vocab, depth_limit, budget, integer_logits):
    gen = torch.Generator().manual_seed(vocab * 100 + depth_limit * 10 + budget)
    logits = torch.randn(1, depth_limit, vocab, generator=gen) * 2
    if integer_logits:  # many exact ties
        logits = logits.round()
    logq, tokens = reference_topk_logprobs(logits, min(budget, vocab))
    _, _, _, score = reference_build_tree(logq, tokens, budget)
    # With K = min(B, V) < V the truncated lists must not matter, so compare to the full tree.
    full_logq = torch.log_softmax(logits.float(), -1).sort(-1, descending=True).values[0]
    best = _best_prefix_closed_value(full_logq.numpy(), budget)
    assert math.isclose(float(score.double().exp().sum()), best, rel_tol=1e-5)


def test_verify_tensors_of_a_known_tree():
    # Tree of test_expansion_pops_best_path_first: 0 -> {1 -> {2}, 3 -> {4}}.
    parent = torch.tensor([[0, 1, 0, 3]], dtype=torch.int32)
    depth = torch.tensor([[1, 2, 1, 2]], dtype=torch.int32)
    token = torch.tensor([[11, 12, 13, 14]])
    out = reference_verify_tensors(parent, token, depth, torch.tensor([10]), torch.tensor([2]))
    assert out["draft_token"].tolist() == [10, 11, 12, 13, 14]
    assert out["positions"].tolist() == [2, 3, 4, 3, 4]
    assert out["retrieve_index"].tolist() == [[0, 1, 2, 3, 4]]
    assert out["retrieve_next_token"].tolist() == [[1, 2, -1, 4, -1]]
    assert out["retrieve_next_sibling"].tolist() == [[-1, 3, -1, -1, -1]]
    mask = out["custom_mask"].view(5, 2 + 5).int().tolist()
    assert mask == [
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 0, 0, 1, 0],
        [1, 1, 1, 0, 0, 1, 1],
    ]
    assert out["ancestor_bits"].view(-1).tolist() == [0b1, 0b11, 0b111, 0b1001, 0b11001]


def test_full_mask_concatenates_requests_of_different_lengths():
    parent = torch.tensor([[0], [-1]], dtype=torch.int32)  # request 1: one padding node
    depth = torch.tensor([[1], [0]], dtype=torch.int32)
    token = torch.tensor([[5], [0]])
    out = reference_verify_tensors(parent, token, depth, torch.tensor([1, 2]), torch.tensor([1, 3]))
    n = 2
    first, second = out["custom_mask"][: n * (1 + n)], out["custom_mask"][n * (1 + n) :]
    assert first.view(n, 1 + n).int().tolist() == [[1, 1, 0], [1, 1, 1]]
    assert second.view(n, 3 + n).int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 0, 1]]
    assert out["retrieve_index"].tolist() == [[0, 1], [2, 3]]
    assert out["retrieve_next_token"].tolist() == [[1, -1], [-1, -1]]
    assert out["draft_token"].tolist() == [1, 5, 2, 0]


def test_ancestor_bits_use_the_sign_bit_of_the_last_word():
    # A chain of 64 nodes after the root: node 63 is bit 63 of word 0, node 64 bit 0 of word 1.
    budget = 64
    parent = torch.arange(budget, dtype=torch.int32).view(1, budget)
    depth = torch.arange(1, budget + 1, dtype=torch.int32).view(1, budget)
    token = torch.zeros(1, budget, dtype=torch.int64)
    bits = reference_verify_tensors(parent, token, depth, torch.tensor([0]), torch.tensor([0]))["ancestor_bits"]
    assert bits[0, 63].tolist() == [-1, 0]  # all 64 bits of word 0
    assert bits[0, 64].tolist() == [-1, 1]
    assert bits[0, 62].tolist() == [(1 << 63) - 1, 0]


def test_reference_outputs_have_documented_shapes_and_dtypes():
    bs, depth_limit, budget = 2, 3, 5
    logq, tokens = reference_topk_logprobs(torch.randn(bs, depth_limit, 7), 5)
    assert (logq.dtype, tokens.dtype) == (torch.float32, torch.int64)
    parent, token, depth, score = reference_build_tree(logq, tokens, budget)
    assert (parent.dtype, token.dtype, depth.dtype, score.dtype) == (
        torch.int32, torch.int64, torch.int32, torch.float32,
    )
    assert parent.shape == token.shape == depth.shape == score.shape == (bs, budget)
