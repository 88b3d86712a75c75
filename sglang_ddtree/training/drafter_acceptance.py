"""Greedy acceptance of a DFlash drafter along its target's own greedy paths, as SGLang verifies them.

At T = 0 a verify step commits the longest draft prefix that the target's greedy decoding reproduces, plus
the target's next token: for DFLASH the prefix of the drafted block, for DDTree the deepest root-to-node path
of the tree built from that block (``tree_reference``: per-depth top-K, best-first under the budget). Along a
sequence that *is* the target's greedy continuation, every step is determined by the drafter's block at its
anchor (the last committed token, seeing the target's features strictly before it). One target pass gives
every anchor's context, one batched drafter pass every anchor's block, and the walk from anchor to anchor
replays decoding exactly: ``tau`` = committed tokens per verify, what the server reports as accept length.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from sglang_ddtree.training.drafter_model import DFlashDrafter, block_logits, target_forward
from sglang_ddtree.tree.tree_reference import reference_build_tree, reference_topk_logprobs

ANCHOR_CHUNK = 64  # blocks per drafter pass: [A, B-1, V] float32 logits stay within a few hundred MB


def greedy_path_end(ids: torch.Tensor, target_logits: torch.Tensor, answer_start: int) -> int:
    """End of the longest prefix of ``ids`` (``[T]``) whose answer tokens are the target's own greedy choices
    (``target_logits [T, V]``): all of a greedy answer, up to near-ties the engine resolved otherwise."""
    differs = (ids[answer_start:] != target_logits[answer_start - 1 : -1].argmax(-1)).nonzero()
    return answer_start + int(differs[0]) if len(differs) else int(ids.shape[0])


def chain_accepted(block: Sequence[int], path: Sequence[int], anchor: int) -> int:
    """Draft tokens a DFLASH verify accepts at ``anchor``: the block's leading tokens that follow the path."""
    accepted = 0
    while accepted < len(block) and anchor + 1 + accepted < len(path) and block[accepted] == path[anchor + 1 + accepted]:
        accepted += 1
    return accepted


def tree_accepted_nodes(parent: Sequence[int], token: Sequence[int], path: Sequence[int], anchor: int) -> list[int]:
    """The nodes a DDTree verify accepts at ``anchor``, root excluded: the deepest tree path (nodes in pop order,
    node ``i + 1`` = ``parent[i]``'s child with ``token[i]``; root 0) that follows the greedy path. A parent pops
    before its children, so the ids ascend and a narrower tree (the first ``w - 1`` nodes) accepts a prefix."""
    children: dict[tuple[int, int], int] = {}
    for i, (p, t) in enumerate(zip(parent, token)):
        children.setdefault((int(p), int(t)), i + 1)
    nodes: list[int] = []
    while anchor + 1 + len(nodes) < len(path) and (nodes[-1] if nodes else 0, path[anchor + 1 + len(nodes)]) in children:
        nodes.append(children[nodes[-1] if nodes else 0, path[anchor + 1 + len(nodes)]])
    return nodes


def tree_accepted(parent: Sequence[int], token: Sequence[int], path: Sequence[int], anchor: int) -> int:
    """Draft tokens a DDTree verify accepts at ``anchor``: the depth of the deepest tree path that follows the
    greedy path (``tree_accepted_nodes``)."""
    return len(tree_accepted_nodes(parent, token, path, anchor))


def walk(accepted_at, start: int, end: int) -> list[int]:
    """Accepted draft tokens per verify from the first anchor ``start`` (the token the prefill produced) until
    the path ``[.., end)`` is committed; ``accepted_at(anchor)`` is one verify's outcome."""
    steps, anchor = [], start
    while anchor < end - 1:
        steps.append(accepted_at(anchor))
        anchor += steps[-1] + 1
    return steps


@torch.no_grad()
def anchor_block_logits(drafter: DFlashDrafter, model, ids_list: list[int], answer_start: int,
                        mask_token_id: int) -> tuple[int, torch.Tensor] | None:  # fmt: skip
    """The end of the answer's greedy path and the drafter's block logits ``[A, B-1, V]`` at each of its anchors
    ``answer_start .. end - 2`` (one target pass, one drafter pass per ``ANCHOR_CHUNK`` anchors); None for a path
    of fewer than two answer tokens (no verify to replay)."""
    device = next(drafter.parameters()).device
    ids = torch.tensor([ids_list], device=device)
    features, target_logits = target_forward(model, ids, drafter.shape.target_layer_ids)
    end = greedy_path_end(ids[0], target_logits[0], answer_start)
    if end - answer_start < 2:
        return None
    anchors = torch.arange(answer_start, end - 1, device=device)
    return end, torch.cat([block_logits(drafter, model, ids, chunk[None], features, mask_token_id)[0]
                           for chunk in anchors.split(ANCHOR_CHUNK)])  # fmt: skip


@torch.no_grad()
def greedy_acceptance(drafter: DFlashDrafter, model, sequences: Iterable[tuple[list[int], int]], mask_token_id: int,
                      budgets: Sequence[int] = ()) -> dict[str, list[int]]:  # fmt: skip
    """Accepted draft tokens of every verify along each sequence's greedy path (``(ids, answer_start)``):
    ``{"dflash": [...], "ddtree B=<b>": [...] for b in budgets}``, all sequences' steps concatenated."""
    steps: dict[str, list[int]] = {"dflash": [], **{f"ddtree B={b}": [] for b in budgets}}
    for ids_list, answer_start in sequences:
        blocks = anchor_block_logits(drafter, model, ids_list, answer_start, mask_token_id)
        if blocks is None:
            continue
        end, logits = blocks  # [A, B-1, V]
        path = ids_list[:end]
        drafts = logits.argmax(-1).tolist()
        steps["dflash"] += walk(lambda a: chain_accepted(drafts[a - answer_start], path, a), answer_start, end)
        if not budgets:
            continue
        # One sort for every budget: a budget's per-depth top-K (K = min(budget, V)) is a prefix of the largest.
        top_logprobs, top_tokens = (t.cpu() for t in reference_topk_logprobs(logits, min(max(budgets), logits.shape[-1])))
        for budget in budgets:
            k = min(budget, logits.shape[-1])

            def ddtree_accepted(anchor: int) -> int:
                row = slice(anchor - answer_start, anchor - answer_start + 1)
                parent, token, _, _ = reference_build_tree(top_logprobs[row, :, :k], top_tokens[row, :, :k], budget)
                return tree_accepted(parent[0].tolist(), token[0].tolist(), path, anchor)

            steps[f"ddtree B={budget}"] += walk(ddtree_accepted, answer_start, end)
    return steps


def tau(accepted: Sequence[int]) -> float | None:
    """Committed tokens per verify (accepted drafts + the target's own token)."""
    return sum(a + 1 for a in accepted) / len(accepted) if accepted else None
