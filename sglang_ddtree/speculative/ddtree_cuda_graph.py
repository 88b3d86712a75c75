"""CUDA-graph capture of DDTree's tree verification, and a graph-vs-eager check of it.

SGLang captures the target's TARGET_VERIFY graphs with a dummy spec input picked by algorithm family. The
DFlash family's dummy carries no custom mask (DFlash verifies a causal chain), so FlashInfer would build its
graph wrappers without a mask buffer and Triton would capture ``custom_mask=None``: on replay every tree
would be verified as a causal chain -- wrong acceptance, and no error. The AROUND hooks below give DDTREE's
target runner a tree-verify dummy that carries the mask buffer instead, at graph capture
(``DecodeCudaGraphRunner.get_spec_info``) and at warm-up runs (``create_dummy_verify_input``); the drafter's
runner keeps DFlash's dummies (its block is causal).

:func:`compare_graph_verify_with_eager` is a debug check (``SGLANG_DDTREE_CHECK_GRAPH_VERIFY=1``): each tree
verify that replays a graph is run again eagerly and the target logits are compared. It doubles the verify
cost (and on hybrid targets copies their whole recurrent-state pool three times per verify), so it is only
registered when asked for; the tests read its tally from ``/server_info``.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Optional

from sglang_ddtree.env_flags import env_flag

if TYPE_CHECKING:
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.server_args import ServerArgs

    from sglang_ddtree.speculative.ddtree_info import DDTreeVerifyInput

logger = logging.getLogger(__name__)

CHECK_GRAPH_VERIFY_ENV = "SGLANG_DDTREE_CHECK_GRAPH_VERIFY"


def graph_verify_check_requested() -> bool:
    return env_flag(CHECK_GRAPH_VERIFY_ENV)


def _is_ddtree_target(spec_algorithm: Any, is_draft_worker: bool) -> bool:
    from sglang_ddtree.speculative.ddtree_spec import DDTreeSpecAlgo

    return isinstance(spec_algorithm, DDTreeSpecAlgo) and not is_draft_worker


def _is_ddtree_draft_block(forward_batch: ForwardBatch) -> bool:
    from sglang_ddtree.speculative.ddtree_info import DDTreeDraftBlockInput

    return forward_batch.forward_mode.is_target_verify() and isinstance(forward_batch.spec_info, DDTreeDraftBlockInput)


def tree_verify_dummy(
    custom_mask: Optional[torch.Tensor], tree_width: int, spec_steps: int, split_attention: bool = False
) -> DDTreeVerifyInput:
    """The shape-only verify input a tree-verify graph is captured with: it must carry a mask buffer, unless
    FlashInfer attends the tree block apart (``flashinfer_split_verify``: then no FULL mask at all)."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    from sglang_ddtree.speculative.ddtree_info import DDTreeVerifyInput
    from sglang_ddtree.speculative.ddtree_spec import TREE_MODE_TOPK

    return DDTreeVerifyInput(
        draft_token=None,
        custom_mask=None if split_attention else custom_mask,
        positions=None,
        retrieve_index=None,
        retrieve_next_token=None,
        retrieve_next_sibling=None,
        retrieve_cum_len=None,
        spec_steps=spec_steps,
        topk=TREE_MODE_TOPK,
        draft_token_num=tree_width,
        capture_hidden_mode=CaptureHiddenMode.FULL,
        seq_lens_sum=None,
        seq_lens_cpu=None,
        split_attention=split_attention,
    )


def capture_tree_verify_with_mask(original, graph_runner: DecodeCudaGraphRunner, num_tokens: int, *args, **kwargs):
    """AROUND ``DecodeCudaGraphRunner.get_spec_info``: DDTREE's target graphs are captured in tree-mask mode (or
    in the split form, as the worker will verify: both ask ``split_verify_supported`` of the target's backend)."""
    from sglang_ddtree.speculative.flashinfer_split_verify import split_verify_supported

    runner = graph_runner.model_runner
    if not _is_ddtree_target(runner.spec_algorithm, runner.is_draft_worker):
        return original(graph_runner, num_tokens, *args, **kwargs)
    return tree_verify_dummy(
        graph_runner.buffers.custom_mask,
        tree_width=graph_runner.captured_req_width,
        spec_steps=int(runner.server_args.speculative_num_steps),
        split_attention=split_verify_supported(runner.attn_backend),
    )


def warmup_tree_verify_with_mask(
    original,
    spec_algorithm: Any,
    server_args: ServerArgs,
    custom_mask: torch.Tensor,
    num_tokens_per_req: int,
    is_draft_worker: bool,
    *args,
    **kwargs,
):
    """AROUND ``create_dummy_verify_input`` (warm-up/autotune forward passes): same substitution."""
    if not _is_ddtree_target(spec_algorithm, is_draft_worker):
        return original(spec_algorithm, server_args, custom_mask, num_tokens_per_req, is_draft_worker, *args, **kwargs)
    return tree_verify_dummy(
        custom_mask, tree_width=num_tokens_per_req, spec_steps=int(server_args.speculative_num_steps)
    )


@dataclass
class GraphVerifyCheck:
    """Tally of graph-replayed tree verifies compared with an eager re-run of the same batch."""

    verifies: int = 0
    rows: int = 0
    argmax_mismatches: int = 0
    max_abs_diff: float = 0.0

    def record(self, graph_logits: torch.Tensor, eager_logits: torch.Tensor) -> None:
        graph_logits, eager_logits = graph_logits.float(), eager_logits.float()
        mismatches = int((graph_logits.argmax(-1) != eager_logits.argmax(-1)).sum())
        diff = float((graph_logits - eager_logits).abs().max()) if graph_logits.numel() else 0.0
        self.verifies += 1
        self.rows += graph_logits.shape[0]
        self.argmax_mismatches += mismatches
        self.max_abs_diff = max(self.max_abs_diff, diff)
        if mismatches:
            logger.warning(
                "DDTREE graph verify differs from eager: %d of %d rows pick another token (max |dlogit| %.3g)",
                mismatches, graph_logits.shape[0], diff,
            )  # fmt: skip

    def as_dict(self) -> dict:
        return asdict(self)


GRAPH_VERIFY_CHECK = GraphVerifyCheck()


@dataclass
class GraphDraftCheck:
    """Tally of graph-replayed draft blocks compared with an eager re-run: the drafter's hidden states."""

    blocks: int = 0
    rows: int = 0
    max_abs_diff: float = 0.0

    def record(self, graph_hidden: torch.Tensor, eager_hidden: torch.Tensor) -> None:
        diff = float((graph_hidden.float() - eager_hidden.float()).abs().max()) if graph_hidden.numel() else 0.0
        self.blocks += 1
        self.rows += graph_hidden.shape[0]
        self.max_abs_diff = max(self.max_abs_diff, diff)

    def as_dict(self) -> dict:
        return asdict(self)


GRAPH_DRAFT_CHECK = GraphDraftCheck()


def compare_graph_verify_with_eager(
    original, graph_runner: DecodeCudaGraphRunner, forward_batch: ForwardBatch, *args, **kwargs
):
    """AROUND ``DecodeCudaGraphRunner.execute``: re-run each DDTREE tree verify eagerly and compare logits (and
    each draft block, comparing the drafter's hidden states: its plan is DDTREE's too, ``flashinfer_tree_plan``).

    The eager pass writes the same nodes' KV to the same slots. A hybrid (GDN) target's verify also moves the
    requests' recurrent state (conv windows are shifted in place, node states written): the eager pass starts
    from the state the replay started from, and the replay's state is put back after it, so the step's outcome
    is the graph's; the graph's output is returned.
    """
    runner = graph_runner.model_runner
    if _is_ddtree_draft_block(forward_batch):
        output = original(graph_runner, forward_batch, *args, **kwargs)
        graph_hidden = output.hidden_states.clone()  # the eager re-run rewrites the same draft KV slots
        runner.attn_backend.init_forward_metadata(forward_batch)
        GRAPH_DRAFT_CHECK.record(graph_hidden, runner.eager_runner.execute(forward_batch).hidden_states)
        return output
    if not (
        forward_batch.forward_mode.is_target_verify()
        and _is_ddtree_target(runner.spec_algorithm, runner.is_draft_worker)
    ):
        return original(graph_runner, forward_batch, *args, **kwargs)
    state_before = _recurrent_state_copy(runner)
    output = original(graph_runner, forward_batch, *args, **kwargs)
    graph_logits = output.next_token_logits.clone()
    state_after = _recurrent_state_copy(runner)
    _restore_recurrent_state(runner, state_before)
    runner.attn_backend.init_forward_metadata(forward_batch)
    eager_output = runner.eager_runner.execute(forward_batch)
    GRAPH_VERIFY_CHECK.record(graph_logits, eager_output.next_token_logits)
    _restore_recurrent_state(runner, state_after)
    return output


def _recurrent_state_tensors(runner) -> list[torch.Tensor]:
    """Every tensor of a hybrid target's recurrent-state pool (none for attention-only models)."""
    import torch

    mamba_pool = getattr(runner.req_to_token_pool, "mamba_pool", None)
    if mamba_pool is None:
        return []
    tensors = []
    for value in vars(mamba_pool.mamba_cache).values():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, torch.Tensor):
                tensors.append(item)
    return tensors


def _recurrent_state_copy(runner) -> list[torch.Tensor]:
    return [tensor.clone() for tensor in _recurrent_state_tensors(runner)]


def _restore_recurrent_state(runner, copies: list[torch.Tensor]) -> None:
    for tensor, copy in zip(_recurrent_state_tensors(runner), copies):
        tensor.copy_(copy)


def graph_verify_check_report() -> Optional[dict]:
    return GRAPH_VERIFY_CHECK.as_dict() if graph_verify_check_requested() else None


def graph_draft_check_report() -> Optional[dict]:
    return GRAPH_DRAFT_CHECK.as_dict() if graph_verify_check_requested() else None
