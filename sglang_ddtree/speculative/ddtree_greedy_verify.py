"""DDTREE's own greedy tree verify (the default; ``SGLANG_DDTREE_LEAN_VERIFY=0`` turns it off).

SGLang's ``run_eagle_verify`` serves every EAGLE-family tree: around the target forward it allocates and fills
its buffers, applies penalties and NaN checks, walks the tree, fills the bonus tokens in a kernel of their own
and gathers the predictions and the hidden states to the front of each block (``eagle_sample`` and
``_finalize_accept_tree_path``: ~0.9 ms of host time per step at batch 1, tests/gpu/RESULTS.md run 57, where the
whole DDTree step is 4.8 ms and host-bound). For the batches that need none of that generality — all greedy, no
grammar, no penalties or logit bias, no log-probabilities — this verify keeps SGLang's parts that touch shared
state (the verify preparation and forward, the KV move, the GDN state commit) and replaces the rest with an argmax
and one kernel (``kernels/tree_accept.py``). The hidden states stay where the verify wrote them: the draft-context
append gathers the committed rows itself. Every other batch takes ``run_eagle_verify``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.speculative.eagle_utils import eagle_prepare_for_verify
from sglang.srt.speculative.spec_utils import (
    commit_mamba_states_after_verify,
    move_accept_tokens_to_target_kvcache,
    record_stream_each,
    record_stream_for_v2_verify,
)

from sglang_ddtree.env_flags import env_flag
from sglang_ddtree.kernels.tree_accept import accept_tree_greedy
from sglang_ddtree.speculative.ddtree_auto_budget import LAST_VERIFY
from sglang_ddtree.profiling.ddtree_trace_ranges import traced_range
from sglang_ddtree.speculative.ddtree_info import DDTreeVerifyInput
from sglang_ddtree.speculative.ddtree_simulation import simulated_lengths
from sglang_ddtree.tree.tree_ops import DDTreeTensors

LEAN_VERIFY_ENV = "SGLANG_DDTREE_LEAN_VERIFY"
_counts = {"lean": 0, "sglang": 0}


def lean_verify_requested() -> bool:
    """On unless ``SGLANG_DDTREE_LEAN_VERIFY=0``: greedy == AR on the H200 with CUDA graphs, auto widths, and on a
    hybrid target with either GDN verify (tests/gpu/RESULTS.md runs 64, 65), and one kernel in place of
    ``eagle_sample`` and the tree path's compaction (run 64's step A/B: 4.27 -> 4.14 ms at batch 1)."""
    return env_flag(LEAN_VERIFY_ENV, default=True)


def lean_verify_serves(batch: ScheduleBatch) -> bool:
    """Whether this batch's verify needs nothing of ``eagle_sample`` beyond the argmax: every request greedy, no
    grammar, no penalty, no logit bias, no log-probabilities (SGLang applies those to the logits first)."""
    info = batch.sampling_info
    return bool(
        info.is_all_greedy
        and not batch.has_grammar
        and not getattr(batch, "return_logprob", False)
        and info.acc_additive_penalties is None
        and info.acc_scaling_penalties is None
        and info.logit_bias is None
    )


def count_verify(lean: bool) -> None:
    _counts["lean" if lean else "sglang"] += 1


def lean_verify_report() -> Optional[dict[str, int]]:
    """For ``/server_info``: verifies served by this path and by SGLang's, unless the path is off."""
    return dict(_counts) if lean_verify_requested() else None


@dataclass
class GreedyVerifyOutput:
    result: GenerationBatchResult
    committed_hidden: torch.Tensor  # [bs, W, H]: the target's hidden states of the committed tokens, by depth


def run_greedy_tree_verify(
    batch: ScheduleBatch,
    tree: DDTreeTensors,
    *,
    target_worker: Any,
    req_to_token_pool: Any,
    token_to_kv_pool_allocator: Any,
    width: int,
    simulating: bool,
) -> GreedyVerifyOutput:
    """The target verifies ``batch.spec_info`` (the tree's ``DDTreeVerifyInput``, ``width`` nodes per request) and
    the longest path whose tokens the target predicts is committed: its KV moved to the front of each request's
    verify block, its GDN states committed (hybrid targets), its tokens returned as SGLang's verify returns them."""
    verify_input: DDTreeVerifyInput = batch.spec_info
    stream = torch.get_device_module(batch.device).current_stream()
    record_stream_for_v2_verify(batch, verify_input, stream)
    forward_batch, can_run_cuda_graph = eagle_prepare_for_verify(verify_input, req_to_token_pool, batch, target_worker)
    record_stream_each((batch.input_ids, batch.out_cache_loc), stream)
    output = target_worker.forward_batch_generation(batch=None, forward_batch=forward_batch, is_verify=True)
    logits_output = output.logits_output
    bs, accept_width = len(batch.seq_lens), verify_input.max_tree_depth
    with traced_range("accept_tree_greedy"):
        target_predict = torch.argmax(logits_output.next_token_logits, dim=-1)
        lengths = simulated_lengths(bs, accept_width, target_predict.device, width) if simulating else None
        accepted = accept_tree_greedy(
            target_predict, tree.draft_token, tree.parent, tree.depth, tree.ancestor_bits, batch.seq_lens,
            accept_width, simulated_length=lengths, next_token=tree.retrieve_next_token,
        )  # fmt: skip
    LAST_VERIFY.accept_index = accepted.accept_index  # what --budget auto learns from
    clear_unaccepted = getattr(token_to_kv_pool_allocator.get_kvcache(), "clear_unaccepted_c128_draft_states", None)
    if clear_unaccepted is not None:
        clear_unaccepted(batch.req_pool_indices, batch.seq_lens, accepted.accept_lens, width)
    commit_mamba_states_after_verify(target_worker, batch, accepted.accept_lens, accepted.accept_index, width)
    move_accept_tokens_to_target_kvcache(batch, accepted.accept_index, accepted.accept_lens - 1,
                                         token_to_kv_pool_allocator)  # fmt: skip
    hidden = logits_output.hidden_states
    committed_hidden = hidden[accepted.accept_index.clamp(min=0).long()]  # rows past a path: never read
    count_verify(lean=True)
    result = GenerationBatchResult(
        logits_output=logits_output,
        next_token_ids=accepted.predict,
        can_run_cuda_graph=can_run_cuda_graph,
        speculative_num_draft_tokens=width,
        next_draft_input=EagleDraftInput(bonus_tokens=accepted.bonus_tokens),
        accept_lens=accepted.accept_lens,
        new_seq_lens=accepted.new_seq_lens,
        routed_experts_output=output.routed_experts_output,
        indexer_topk_output=output.indexer_topk_output,
        extra_keep_alive_refs=[forward_batch],
    )
    return GreedyVerifyOutput(result=result, committed_hidden=committed_hidden)
