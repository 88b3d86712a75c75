"""Step data of DDTree: the tree verify's ``EagleVerifyInput`` with an irregular tree, and the draft block's
``DFlashVerifyInput`` with its key lengths on the host."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.eagle_info import EagleVerifyInput


@dataclass
class DDTreeVerifyInput(EagleVerifyInput):
    """A best-first DDTree flattened in pop order (root first, parent < child, siblings increasing).

    SGLang's tree verification (``run_eagle_verify``: tree attention mask, greedy/sampled acceptance,
    KV compaction, GDN tree path) reads any tree given as first-child/next-sibling links; only the
    two shape properties below differ from EAGLE's per-level top-k trees. ``ancestor_bits`` and ``kv_lens_cpu`` let
    a graph replay plan FlashInfer without reading the device (``flashinfer_tree_plan``).
    """

    ancestor_bits: Optional[torch.Tensor] = None  # [bs, N, ceil(N/64)] int64, the tree block of the mask, packed
    kv_lens_cpu: Optional[torch.Tensor] = None  # [bs] the key lengths (seq_len + N), on the host
    # FlashInfer attends the prefix and the tree block apart (``flashinfer_split_verify``); custom_mask is then None.
    split_attention: bool = False

    @property
    def max_tree_depth(self) -> int:
        """Longest root-to-leaf chain incl. the root: one node per draft position (``spec_steps``), and never
        more than the tree's nodes (a budget below the block size caps the depth)."""
        return min(self.spec_steps + 1, self.draft_token_num)

    @property
    def tree_topk(self) -> int:
        """Irregular tree (per-depth branching follows the budget), as for NGRAM."""
        return -1


@dataclass
class DDTreeDraftBlockInput(DFlashVerifyInput):
    """The drafter's block forward (``[bonus, MASK x (block-1)]`` per request over its draft KV), as DFlash runs it,
    plus the step's key lengths on the host when they were read (``kv_lens_cpu``: prefix + block) so that a graph
    replay plans FlashInfer without reading the device (``flashinfer_tree_plan``); None otherwise."""

    kv_lens_cpu: Optional[torch.Tensor] = None
