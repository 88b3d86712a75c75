"""``sglang_ddtree.training.drafter_acceptance``: greedy verification replayed along a target's greedy path."""

import torch

from sglang_ddtree.training.drafter_acceptance import chain_accepted, greedy_path_end, tau, tree_accepted, walk

# Prompt (2 tokens), then the target's greedy answer 5 6 7 8 9 4.
PATH = [1, 2, 5, 6, 7, 8, 9, 4]


def test_a_chain_verify_accepts_the_blocks_leading_tokens_on_the_path():
    assert chain_accepted([6, 7, 0], PATH, anchor=2) == 2
    assert chain_accepted([0, 7, 8], PATH, anchor=2) == 0  # a wrong first token ends the chain
    assert chain_accepted([9, 4, 4], PATH, anchor=5) == 2  # the path ends: nothing beyond it is judged


def test_a_tree_verify_accepts_its_deepest_node_on_the_path():
    # root -> 6 (node 1) -> 3 (node 3); root -> 4 (node 2); node 1 -> 7 (node 4) -> 8 (node 5)
    parent, token = [0, 0, 1, 1, 4], [6, 4, 3, 7, 8]
    assert tree_accepted(parent, token, PATH, anchor=2) == 3
    assert tree_accepted(parent, token, PATH, anchor=3) == 0
    assert tree_accepted([0, 0, -1], [7, 6, 0], PATH, anchor=2) == 1  # the second child matches; padding never


def test_decoding_walks_from_anchor_to_anchor_until_the_path_is_committed():
    # The prefill produced token 5 (index 2); each verify commits its accepted drafts plus the target's token.
    outcomes = {2: 2, 5: 0, 6: 3}
    steps = walk(outcomes.__getitem__, start=2, end=len(PATH))
    assert steps == [2, 0, 3]  # anchors 2 -> 5 -> 6 -> 10: the whole answer is committed after three verifies
    assert tau(steps) == (3 + 1 + 4) / 3
    assert tau([]) is None


def test_the_greedy_path_ends_where_the_answer_leaves_the_targets_top_choice():
    ids = torch.tensor([1, 2, 5, 6, 7])
    logits = torch.zeros(5, 10)
    logits[1, 5] = logits[2, 6] = logits[3, 3] = 1.0  # the target would say 3 after "... 6", the answer has 7
    assert greedy_path_end(ids, logits, answer_start=2) == 4
    logits[3, 7] = 2.0
    assert greedy_path_end(ids, logits, answer_start=2) == 5
