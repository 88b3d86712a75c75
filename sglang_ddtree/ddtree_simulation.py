"""Cost-only acceptance simulation for DDTREE: SGLang's ``SGLANG_SIMULATE_ACC_LEN`` benchmark knob, for trees.

SGLang 0.5.17 forces the acceptance length of EAGLE/NEXTN and DFLASH verifies with ``SGLANG_SIMULATE_ACC_LEN``
(a mean; ``SGLANG_SIMULATE_ACC_METHOD`` draws each verify's length around it) so that a model with random
weights runs the whole serving loop at a chosen acceptance. Its helper accepts nodes ``0 .. L-1``, a path only
in a chain's layout (and commits token 100, past a small vocabulary). On a DDTREE server this module replaces
that helper (AROUND ``spec_utils.generate_simulated_accept_index``, which the verify imports at each call): each
verify commits the first ``L`` nodes of the tree's most probable branch (root, then each node's first child: the
best-ranked one in pop order), shorter where that branch ends, with the branch's drafted tokens and the root's
token as the bonus. The target still verifies the whole
tree, and the KV, GDN-state and draft-context commits run on the path as they would on an accepted one: the step
costs what a real one does. The committed tokens are not the target's: the server logs that it is simulating,
``/server_info`` reports ``ddtree_simulated_acceptance``, and nothing of it is lossless.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

import torch

logger = logging.getLogger(__name__)

SIMULATE_TARGET = "sglang.srt.speculative.spec_utils.generate_simulated_accept_index"


class _CurrentTree:
    """The tree being verified (its first-child links), set by the worker just before SGLang's verify, which
    does not pass the tree to the simulation helper."""

    next_token: Optional[torch.Tensor] = None


CURRENT_TREE = _CurrentTree()


def simulated_acceptance_mean() -> float:
    """SGLang's knob, as SGLang reads it (negative: off)."""
    from sglang.srt.speculative.spec_utils import SIMULATE_ACC_LEN

    return float(SIMULATE_ACC_LEN)


def simulation_report() -> Optional[dict[str, Any]]:
    """For ``/server_info`` on a DDTREE server that simulates; None otherwise."""
    import sglang_ddtree
    from sglang.srt.runtime_context import get_spec
    from sglang.srt.speculative.spec_utils import SIMULATE_ACC_METHOD

    mean = simulated_acceptance_mean()
    if mean <= 0 or get_spec().speculative_algorithm != sglang_ddtree.DDTREE_ALGORITHM_NAME:
        return None
    return {"mean_accept_length": mean, "method": SIMULATE_ACC_METHOD,
            "note": "cost-only simulation: committed tokens are not the target's"}  # fmt: skip


def best_branch_accept_index(next_token: torch.Tensor, length: int, width: int) -> torch.Tensor:
    """``[bs, width]`` flat node indices (``b * N + node``) of each tree's first ``length`` nodes along its
    first-child chain from the root, ``-1`` past the end of the chain or of ``length``."""
    bs, num_nodes = next_token.shape
    rows = torch.arange(bs, device=next_token.device)
    index = torch.full((bs, width), -1, dtype=torch.int32, device=next_token.device)
    index[:, 0] = rows * num_nodes
    node = torch.zeros(bs, dtype=torch.long, device=next_token.device)
    alive = torch.ones(bs, dtype=torch.bool, device=next_token.device)
    for depth in range(1, min(length, width)):
        child = next_token[rows, node].long()
        alive &= child >= 0
        node = torch.where(alive, child, node)
        index[:, depth] = torch.where(alive, rows * num_nodes + node, -1).to(torch.int32)
    return index


def simulate_acceptance_along_the_best_branch(original: Callable[..., torch.Tensor], **kwargs: Any) -> torch.Tensor:
    """AROUND SGLang's ``generate_simulated_accept_index`` (called with keywords only) on a DDTREE server."""
    from sglang.srt.speculative.spec_utils import SIMULATE_ACC_METHOD, _sample_simulated_acc_len

    next_token = CURRENT_TREE.next_token
    if next_token is None:
        return original(**kwargs)
    width = kwargs["spec_steps"] + 1
    length = _sample_simulated_acc_len(kwargs["simulate_acc_len"], SIMULATE_ACC_METHOD, width)
    index = best_branch_accept_index(next_token, length, width)
    accepted = index >= 0
    kwargs["num_correct_drafts"].copy_(accepted.sum(1) - 1)
    candidates = kwargs["candidates"]
    tokens = candidates.reshape(-1)
    following = torch.cat([index[:, 1:], torch.full_like(index[:, :1], -1)], dim=1)
    committed = torch.where(following >= 0, tokens[following.clamp(min=0).long()], candidates[:, :1])
    # Without boolean indexing (a device-to-host read of the count, run 37's sync debug log): entries past the
    # chain rewrite the root's slot with the root's own value.
    predict = kwargs["predict"]
    slots = torch.where(accepted, index, index[:, :1]).long().reshape(-1)
    predict[slots] = torch.where(accepted, committed, committed[:, :1]).reshape(-1).to(predict.dtype)
    return index


def register(registry: Any, hook_type: Any) -> None:
    registry.register(SIMULATE_TARGET, simulate_acceptance_along_the_best_branch, hook_type.AROUND)
