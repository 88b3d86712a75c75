"""Debug check that every tensor-parallel rank built the same draft trees (``SGLANG_DDTREE_CHECK_TP_TREES=1``).

Each rank verifies, masks, accepts and moves KV for its own copy of the tree; a tree that differed on one rank
would corrupt that rank's KV cache and recurrent state without any error. The tree is built from all-gathered
top-K payloads so that it cannot differ; this check proves it on a running server: after every tree build the
ranks all-gather their tree tensors and compare them. It synchronises with the host each step, so it is only
enabled when asked for; the tests read its tally from ``/server_info``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Optional

import torch

from sglang_ddtree.env_flags import env_flag

if TYPE_CHECKING:
    from sglang_ddtree.tree.tree_ops import DDTreeTensors

CHECK_TP_TREES_ENV = "SGLANG_DDTREE_CHECK_TP_TREES"


def tp_tree_check_requested() -> bool:
    return env_flag(CHECK_TP_TREES_ENV)


@dataclass
class TreeAgreementCheck:
    """Tally of tree builds compared across the TP group."""

    trees: int = 0
    ranks: int = 0
    disagreements: int = 0

    def record(self, tree: DDTreeTensors, tp_group) -> None:
        mine = torch.cat(
            [tree.draft_token.reshape(-1).long(), tree.positions.reshape(-1).long(),
             tree.retrieve_next_token.reshape(-1).long(), tree.retrieve_next_sibling.reshape(-1).long()]
        )  # fmt: skip
        everyone = tp_group.all_gather(mine.unsqueeze(0), dim=0)
        self.trees += 1
        self.ranks = tp_group.world_size
        self.disagreements += int((everyone != everyone[0]).any().item())

    def as_dict(self) -> dict:
        return asdict(self)


TP_TREE_CHECK = TreeAgreementCheck()


def tp_tree_check_report() -> Optional[dict]:
    return TP_TREE_CHECK.as_dict() if tp_tree_check_requested() else None
