"""Greedy acceptance of DDTrees in one kernel (``sglang_ddtree.kernels.tree_accept``): the path SGLang's sibling
walk accepts, the committed tokens, the bonus token and the new lengths; and, under the cost-only simulation, the
first-child chain cut at the drawn length. CPU under TRITON_INTERPRET=1, or on a GPU."""

from __future__ import annotations

import os

import pytest
import torch

from sglang_ddtree.kernels.tree_accept import accept_tree_greedy
from sglang_ddtree.speculative.ddtree_simulation import best_branch_accept_index
from sglang_ddtree.tree.tree_reference import reference_build_tree, reference_topk_logprobs, reference_verify_tensors

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"
pytestmark = pytest.mark.skipif(
    not INTERPRET and not torch.cuda.is_available(), reason="needs TRITON_INTERPRET=1 or a GPU"
)


def random_trees(bs: int, depth: int, vocab: int, budget: int, seed: int):
    """Best-first trees of peaked random drafts, their verify tensors, and target predictions that follow a random
    root path of each tree for a random number of steps (then a token no child carries, or a random one)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, depth, vocab, generator=gen) * 4
    if budget:
        logq, tokens = reference_topk_logprobs(logits, min(budget, vocab))
        parent, token, node_depth, _ = reference_build_tree(logq, tokens, budget)
    else:
        parent, node_depth = torch.empty((bs, 0), dtype=torch.int32), torch.empty((bs, 0), dtype=torch.int32)
        token = torch.empty((bs, 0), dtype=torch.int64)
    roots = torch.randint(0, vocab, (bs,), generator=gen)
    seq_lens = torch.randint(1, 50, (bs,), generator=gen)
    verify = reference_verify_tensors(parent, token, node_depth, roots, seq_lens)
    n = budget + 1
    predict = torch.randint(0, vocab, (bs * n,), generator=gen)
    for b in range(bs):
        node, steps = 0, int(torch.randint(0, depth + 1, (1,), generator=gen))
        for _ in range(steps):
            children = [j for j in range(1, n) if int(parent[b, j - 1]) == node]
            if not children:
                break
            child = children[int(torch.randint(0, len(children), (1,), generator=gen))]
            predict[b * n + node] = verify["draft_token"][b * n + child]
            node = child
    return parent, node_depth, verify, seq_lens, predict


def sibling_walk(verify: dict, predict: torch.Tensor, bs: int, n: int) -> list[list[int]]:
    """SGLang's greedy tree walk: from the root, the first child (in sibling order) carrying the token the target
    predicted at the current node, until none does."""
    paths = []
    for b in range(bs):
        path, node = [0], 0
        while True:
            child = int(verify["retrieve_next_token"][b, node])
            while child >= 0 and int(verify["draft_token"][b * n + child]) != int(predict[b * n + node]):
                child = int(verify["retrieve_next_sibling"][b, child])
            if child < 0:
                break
            path.append(child)
            node = child
        paths.append(path)
    return paths


@pytest.mark.parametrize(
    "bs,depth,vocab,budget",
    [
        (6, 7, 1000, 32),  # N = 33
        (4, 15, 1000, 64),  # N = 65: two words of ancestor bits
        (3, 3, 5, 12),  # a 5-token vocabulary: padding nodes (parent -1)
        (5, 4, 50, 0),  # root-only trees (width 1): the bonus token alone
    ],
)
def test_the_kernel_accepts_the_path_sglangs_sibling_walk_accepts(bs, depth, vocab, budget):
    parent, node_depth, verify, seq_lens, predict = random_trees(bs, depth, vocab, budget, seed=bs + budget)
    n, width = budget + 1, min(depth + 1, budget + 1)
    got = accept_tree_greedy(
        predict.to(DEVICE), verify["draft_token"].to(DEVICE), parent.to(DEVICE), node_depth.to(DEVICE),
        verify["ancestor_bits"].to(DEVICE), seq_lens.to(DEVICE), width,
    )  # fmt: skip
    paths = sibling_walk(verify, predict, bs, n)
    assert any(len(path) > 1 for path in paths) or budget == 0
    for b, path in enumerate(paths):
        committed = [int(predict[b * n + node]) for node in path]
        assert got.accept_index[b].tolist() == [b * n + node for node in path] + [-1] * (width - len(path)), b
        assert int(got.accept_lens[b]) == len(path)
        assert got.predict[b * n : (b + 1) * n].tolist() == committed + [0] * (n - len(path))
        assert int(got.bonus_tokens[b]) == committed[-1]
        assert int(got.new_seq_lens[b]) == int(seq_lens[b]) + len(path)
    assert got.new_seq_lens.dtype == seq_lens.dtype and got.accept_lens.dtype == torch.int32


@pytest.mark.parametrize("per_request", [False, True])
def test_under_the_simulation_the_first_child_chain_is_committed_up_to_the_drawn_length(per_request):
    """As ``simulate_acceptance_along_the_best_branch`` commits it: the chain's nodes, each committing the next
    chain node's drafted token, and the root's token as the bonus."""
    bs, depth, budget = 6, 7, 32
    parent, node_depth, verify, seq_lens, predict = random_trees(bs, depth, 1000, budget, seed=5)
    n, width = budget + 1, depth + 1
    lengths = torch.tensor([1, 3, 8, 2, 5, 4])
    length = lengths.to(DEVICE) if per_request else 5
    next_token = verify["retrieve_next_token"].to(DEVICE)
    got = accept_tree_greedy(
        predict.to(DEVICE), verify["draft_token"].to(DEVICE), parent.to(DEVICE), node_depth.to(DEVICE),
        verify["ancestor_bits"].to(DEVICE), seq_lens.to(DEVICE), width, simulated_length=length,
        next_token=next_token,
    )  # fmt: skip
    expected_index = best_branch_accept_index(next_token, length, width).cpu()
    assert torch.equal(got.accept_index.cpu(), expected_index)
    tokens = verify["draft_token"]
    for b in range(bs):
        chain = [int(i) - b * n for i in expected_index[b] if i >= 0]
        committed = [int(tokens[b * n + node]) for node in chain[1:]] + [int(tokens[b * n])]
        assert int(got.accept_lens[b]) == len(chain)
        assert got.predict[b * n : b * n + len(chain)].tolist() == committed
        assert int(got.bonus_tokens[b]) == int(tokens[b * n])
