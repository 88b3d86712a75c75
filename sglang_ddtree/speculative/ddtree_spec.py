"""``DDTREE`` as a SGLang speculative algorithm: the spec class the runtime dispatches on.

DDTree is a DFlash-family algorithm (the target captures the drafter's hidden layers, the draft KV cache
and its block reservation are DFlash's), verified like a tree (EAGLE's verification with an irregular
tree). Server arguments, after :meth:`DDTreeSpecAlgo.handle_server_args`:

- ``speculative_num_draft_tokens`` = N, the verify width: budget + 1 (the root is the bonus token);
- ``speculative_dflash_block_size`` = the drafter's block size, so ``spec_steps`` = block size - 1;
- ``speculative_eagle_topk`` = 2: a mode flag that turns on SGLang's tree paths (tree KV compaction,
  tree metadata of hybrid GDN models); DDTree's own per-depth candidate count is min(budget, vocab).
"""

from __future__ import annotations

import logging

from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from sglang_ddtree import DDTREE_ALGORITHM_NAME, DDTREE_DEFAULT_BUDGET
from sglang_ddtree.speculative.ddtree_auto_budget import check_auto_budget_settings

logger = logging.getLogger(__name__)

TREE_MODE_TOPK = 2


def _check_drafter_fits_target(server_args: ServerArgs) -> None:
    """Refuse, before any process starts, a drafter whose hidden size, vocabulary, target layers or mask
    token do not fit the target (the error names the field); load it in the target's dtype."""
    from sglang_ddtree import model_configs

    drafter_path = server_args.speculative_draft_model_path
    target_config = model_configs.load_config(server_args.model_path)
    drafter_config = model_configs.load_config(drafter_path, role="drafter")
    model_configs.check_dflash_drafter_matches_target(target_config, drafter_config, drafter_path)
    if server_args.dtype == "auto":
        # auto resolves each checkpoint from its own config: a float32 drafter would be loaded in float16
        # beside a bfloat16 target and fail on the first request.
        target_dtype = model_configs.auto_dtype(target_config)
        if model_configs.auto_dtype(drafter_config) != target_dtype:
            logger.warning("DDTREE: --dtype auto differs for target and drafter; loading both in %s", target_dtype)
            server_args.dtype = target_dtype


class DDTreeSpecAlgo(CustomSpecAlgo):
    """Dispatch predicates of DDTREE, plus the three methods SGLang 0.5.17's scheduler calls on every
    algorithm but ``CustomSpecAlgo`` lacks (``need_topk``, ``carries_draft_hidden_states``,
    ``create_future_map``)."""

    def is_dflash_family(self) -> bool:
        return True

    def supports_target_verify_for_draft(self) -> bool:
        return True

    def need_topk(self) -> bool:
        return False

    def carries_draft_hidden_states(self) -> bool:
        return False

    def create_future_map(
        self, device, req_to_token_pool, needs_cpu_seq_lens: bool = True, needs_confidence_relay: bool = False
    ):
        from sglang.srt.managers.overlap_utils import FutureMap

        return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

    def get_num_tokens_per_req_for_target_verify(self, num_draft_tokens: int, is_draft_worker: bool) -> int:
        """The target verifies N tree nodes per request; the drafter runs one block per request."""
        if is_draft_worker:
            from sglang.srt.runtime_context import get_spec

            return int(get_spec().speculative_dflash_block_size)
        return num_draft_tokens

    def handle_server_args(self, server_args: ServerArgs) -> None:
        """Resolve DDTree's arguments (main process only; schedulers read the resolved args)."""
        from sglang.srt.arg_groups import speculative_hook

        if server_args.speculative_draft_window_size is not None:
            raise ValueError("DDTREE does not support --speculative-draft-window-size")
        tree_width = server_args.speculative_num_draft_tokens or DDTREE_DEFAULT_BUDGET + 1
        if tree_width < 2:
            raise ValueError(
                f"DDTREE needs --speculative-num-draft-tokens >= 2 (budget + 1 root), got {tree_width}"
            )
        # DFlash's own resolution: device/pp/dp checks, drafter path, block size from the drafter config,
        # draft attention backend, max running requests, mixed chunking off.
        server_args.speculative_num_draft_tokens = server_args.speculative_dflash_block_size
        server_args.speculative_num_steps = None
        server_args.speculative_eagle_topk = None
        speculative_hook._handle_dflash(server_args)
        _check_drafter_fits_target(server_args)
        block_size = int(server_args.speculative_num_draft_tokens)
        if 2 * tree_width < block_size:
            # The drafter writes its block into the KV slots that DFlash's per-step reservation
            # (committed + 2 * N) provides; a smaller tree would let it write past them.
            raise ValueError(
                f"DDTREE budget {tree_width - 1} is too small for drafter block size {block_size}: "
                f"use a budget of at least {(block_size + 1) // 2 - 1}"
            )
        try:
            check_auto_budget_settings(tree_width)
        except ValueError as e:
            raise ValueError(f"DDTREE --budget auto: {e}") from None
        server_args.speculative_dflash_block_size = block_size
        server_args.speculative_num_draft_tokens = tree_width
        server_args.speculative_num_steps = block_size - 1
        server_args.speculative_eagle_topk = TREE_MODE_TOPK
        logger.info("DDTREE: budget %d tree nodes, drafter block size %d", tree_width - 1, block_size)


def reserve_row_headroom_for_two_trees(original, server_args: ServerArgs) -> int:
    """AROUND ``allocation_sizing.get_req_to_token_extra_context_len``: room in each request's ``req_to_token``
    row for the KV slots DFlash's decode reservation hands out.

    DFlash's ``prepare_for_decode`` reserves ``committed + 2 * N`` slots per request (N = the verify width; the
    2x absorbs overlap scheduling's lag), but SGLang sizes the rows ``context + 4 + N``: with a tree of 9 or more
    nodes a request near the context limit reserves past its row, which the CPU engine refuses and a GPU kernel
    writes into the next request's row. DDTREE rows get ``context + 4 + 2 * N``.
    """
    extra = original(server_args)
    if server_args.speculative_algorithm == DDTREE_ALGORITHM_NAME and server_args.speculative_num_draft_tokens:
        extra = max(extra, 4 + 2 * int(server_args.speculative_num_draft_tokens))
    return extra
