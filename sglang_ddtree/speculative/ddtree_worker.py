"""DDTree speculative worker: one DFlash drafter pass -> a draft tree built on the GPU -> one tree verify.

Per decode step, for a batch of requests with independent trees:

1. Draft: the DFlash drafter runs the block ``[bonus, MASK x (block-1)]`` of every request (DFlash's draft
   KV cache, block preparation kernel and draft model runner, reused from ``DFlashWorkerV2``), and its
   head (``ddtree_draft_head``: target LM head at the block-1 masked positions, under TP each rank's
   vocabulary shard merged across ranks, per-depth top-K, best-first expansion under the node budget) runs
   in the same CUDA graph when the batch replays one.
2. Tree: the verify tensors and the FULL tree mask of the expanded trees (they depend on the sequence
   lengths, so they stay outside the graph); no FULL mask where FlashInfer attends the prefix and the tree
   block apart (``flashinfer_split_verify``: FlashInfer targets, a hybrid one's attention layers too). With
   FlashInfer and CUDA graphs (on hybrid targets: where their attention layers verify split) the step reads the
   sequence lengths back once, before the draft launch, so that the draft block's and the verify graph's
   FlashInfer plans need no reads of their own (``flashinfer_tree_plan``): one blocking read per step instead of
   three before the draft and four after it.
3. Verify: all-greedy batches without grammar, penalties or logit bias take this package's own verify
   (``ddtree_greedy_verify``; ``SGLANG_DDTREE_LEAN_VERIFY=0`` turns it off): SGLang's verify preparation, the
   target forward over the N = budget + 1 tree nodes with the tree mask, the KV move and the recurrent-state
   commit of hybrid models, with the acceptance in one kernel. Every other batch takes SGLang's EAGLE tree
   verification (``run_eagle_verify``), which accepts the longest matching path greedy or sampled.
4. Draft context: the target's hidden features of the committed tokens are written into the draft KV
   cache, as DFlash does for its chain.

Under ``--budget auto`` (``ddtree_auto_budget``) each step verifies the best tree of the width the policy chose,
a prefix of the drafted widest tree's pop order; width 1 skips steps 1-2 and verifies the bonus token alone. Each
width replays target-verify graphs of its own (``ddtree_verify_graphs``), captured after SGLang's.

Under a torch profiler each phase is a ``ddtree.<function>`` range (``ddtree_trace_ranges.traced_range``: one flag
check otherwise; host-timed under ``SGLANG_DDTREE_TRACE_RANGES=1``), as SGLang marks its scheduler's functions.

Prefill and idle batches are DFlash's.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from typing import Optional

import torch
from sglang.kernels.ops.speculative.dflash import _prepare_dflash_draft_block_unchecked
from sglang.srt.distributed import get_tp_group
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.scheduler import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.runtime_context import get_exec
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
from sglang.srt.speculative.draft_worker_common import make_draft_input_v2
from sglang.srt.speculative.eagle_worker_common import run_eagle_verify
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from sglang_ddtree.profiling.ddtree_step_profile import STEP_PROFILE
from sglang_ddtree.profiling.ddtree_trace_ranges import traced_range
from sglang_ddtree.speculative.ddtree_auto_budget import AutoBudget
from sglang_ddtree.speculative.ddtree_draft_head import DDTreeDraftHead, DraftTree
from sglang_ddtree.speculative.ddtree_greedy_verify import (
    count_verify,
    lean_verify_requested,
    lean_verify_serves,
    run_greedy_tree_verify,
)
from sglang_ddtree.speculative.ddtree_info import DDTreeDraftBlockInput, DDTreeVerifyInput
from sglang_ddtree.speculative.ddtree_simulation import (
    CURRENT_TREE,
    check_simulation_settings,
    simulated_acceptance_mean,
)
from sglang_ddtree.speculative.ddtree_spec import TREE_MODE_TOPK
from sglang_ddtree.speculative.ddtree_tp_check import TP_TREE_CHECK, tp_tree_check_requested
from sglang_ddtree.speculative.ddtree_verify_graphs import (
    VerifyGraphsPerWidth,
    capture_verify_graphs,
    verify_graphs_per_width_requested,
)
from sglang_ddtree.speculative.flashinfer_split_verify import split_verify_supported
from sglang_ddtree.speculative.flashinfer_tree_plan import (
    compare_with_scheduler_mirror,
    planned_from_host_lengths,
    scheduler_mirror_lengths,
)
from sglang_ddtree.tree.tree_ops import DDTreeTensors, ddtree_from_expansion, root_only_ddtree

logger = logging.getLogger(__name__)


def _lm_head_vocab_shard(lm_head) -> Optional[tuple[int, int]]:
    """``(first token id, token count)`` of this rank's LM-head rows under tensor parallelism, else None."""
    if get_tp_group().world_size == 1:
        return None
    shard = lm_head.shard_indices
    if int(shard.num_added_elements) != 0:
        raise ValueError("DDTREE with --tp > 1 does not support an LM head with added vocabulary (LoRA tokens)")
    return int(shard.org_vocab_start_index), int(shard.num_org_elements)


def _mean_over_tp_ranks(row: list[float]) -> list[float]:
    """One measured step-time row for every tensor-parallel rank (each measured its own host clock): their mean.
    Every rank calls it at the same decode step (``measured_step_times``), once per batch-size bucket."""
    group = get_tp_group()
    if group.world_size == 1:
        return row
    total = torch.tensor(row, dtype=torch.float64)
    torch.distributed.all_reduce(total, group=group.cpu_group)
    return (total / group.world_size).tolist()


class DDTreeWorker(DFlashWorkerV2):
    def __init__(self, server_args: ServerArgs, gpu_id: int, ps, nccl_port: int, target_worker) -> None:
        self.tree_width = int(server_args.speculative_num_draft_tokens)
        self.budget = self.tree_width - 1
        block_size = int(server_args.speculative_dflash_block_size)
        # The DFlash machinery underneath drafts one block per request with a chain-shaped draft runner.
        draft_args = copy.deepcopy(server_args)
        draft_args.override("ddtree.worker", speculative_num_draft_tokens=block_size, speculative_eagle_topk=1)
        super().__init__(
            server_args=draft_args, gpu_id=gpu_id, ps=ps, nccl_port=nccl_port, target_worker=target_worker
        )
        self.speculative_num_draft_tokens = self.tree_width
        self.vocab_size = int(self.model_runner.model_config.vocab_size)
        # Candidates per depth: min(B, V), as in the paper.
        self.candidates_per_depth = min(self.budget, self.vocab_size)
        self._lm_head_shard = _lm_head_vocab_shard(self.target_worker.model_runner.model.lm_head)
        self._check_tp_trees = tp_tree_check_requested()
        self._simulating = simulated_acceptance_mean() > 0
        self._lean_verify = lean_verify_requested()
        # Eager until init_cuda_graphs replaces it with a head sized for the captured batches.
        self._draft_head = self._make_draft_head(max_bs=0)
        self._cuda_graphs = not server_args.disable_cuda_graph
        # Decided in init_attention_backends, once the target's backends exist.
        self._plans_from_host_lengths = False
        self._draft_plans_from_host_lengths = False
        self._split_verify_attention = False
        self._draft_block_spec_info = DDTreeDraftBlockInput(
            draft_token=torch.empty((0,), dtype=torch.long, device=self.device),
            positions=torch.empty((0,), dtype=torch.int64, device=self.device),
            draft_token_num=int(self.block_size),
            capture_hidden_mode=CaptureHiddenMode.NULL,
        )
        # None: a fixed budget.
        self._auto_budget = AutoBudget.from_environment(self.tree_width, self.device, agree=_mean_over_tp_ranks)
        self._verify_graphs: Optional[VerifyGraphsPerWidth] = None  # captured in init_cuda_graphs under auto
        check_simulation_settings(simulated_acceptance_mean())
        if self._simulating:
            logger.warning("DDTREE simulates acceptance (SGLANG_SIMULATE_ACC_LEN=%s, along each tree's best branch): "
                           "cost only, the output is not the target's", simulated_acceptance_mean())  # fmt: skip

    def init_attention_backends(self) -> None:
        """SGLang builds the target worker's attention backends, then the draft worker's (this call): only now can
        the step know whether its verify graphs are planned from host lengths (``flashinfer_tree_plan``) and
        whether its verify attends the prefix and the tree apart (``flashinfer_split_verify``)."""
        super().init_attention_backends()
        self._plans_from_host_lengths = planned_from_host_lengths(
            getattr(self.target_worker.model_runner, "attn_backend", None), self._cuda_graphs
        )
        self._draft_plans_from_host_lengths = planned_from_host_lengths(
            getattr(self.draft_model_runner, "attn_backend", None), self._cuda_graphs
        )
        self._split_verify_attention = split_verify_supported(
            getattr(self.target_worker.model_runner, "attn_backend", None)
        )

    def init_cuda_graphs(self) -> None:
        """The drafter's graphs (DFlash's), then, under ``--budget auto``, the target's verify graphs of every other
        width of the policy (``ddtree_verify_graphs``; ``SGLANG_DDTREE_AUTO_VERIFY_GRAPHS=0`` verifies those
        eagerly): SGLang has captured the target's own graphs (at the widest width) before this call
        (``Scheduler.init_all_cuda_graphs``)."""
        super().init_cuda_graphs()
        from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

        target_runner = self.target_worker.model_runner
        if (
            self._auto_budget is not None
            and verify_graphs_per_width_requested()
            and isinstance(target_runner.decode_cuda_graph_runner, DecodeCudaGraphRunner)
        ):
            self._verify_graphs = capture_verify_graphs(target_runner, self._auto_budget.policy.widths)
            self._auto_budget.verify_graphs = self._verify_graphs

    def _maybe_build_draft_sampler(self) -> DDTreeDraftHead:
        """Called before the draft graphs are captured: DFlash folds the returned callable into their tail
        (a greedy argmax upstream); DDTree folds its head, with output buffers for the largest graph."""
        self._draft_head = self._make_draft_head(max_bs=max(get_exec().graph.cuda_graph_config.decode.bs))
        return self._draft_head

    def _make_draft_head(self, max_bs: int) -> DDTreeDraftHead:
        lm_head = self.target_worker.model_runner.model.lm_head
        vocab_start, vocab_count = self._lm_head_shard or (0, self.vocab_size)
        return DDTreeDraftHead(
            lm_head.weight, vocab_count, vocab_start, int(self.block_size), self.budget,
            topk=self.candidates_per_depth, max_bs=max_bs,
            tp_group=get_tp_group() if self._lm_head_shard is not None else None, certain_top1=self._simulating,
        )  # fmt: skip

    def forward_batch_generation(
        self, batch: ScheduleBatch, on_publish=None, grammar_barrier=None
    ) -> GenerationBatchResult:
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch or batch.forward_mode.is_idle():
            if self._auto_budget is not None:
                self._auto_budget.interrupt()
            result = super().forward_batch_generation(batch, on_publish, grammar_barrier)
            result.speculative_num_draft_tokens = self.tree_width
            return result
        if getattr(batch, "return_logprob", False):
            raise ValueError("DDTREE speculative decoding does not support return_logprob.")
        self._validate_phase1_sampling_support(batch)
        draft_input = batch.spec_info
        if not isinstance(draft_input, DFlashDraftInputV2):
            raise RuntimeError("DDTREE expected DFlashDraftInputV2 state on the running batch.")
        batch.seq_lens.record_stream(torch.get_device_module(self.device).current_stream())

        timer = STEP_PROFILE.start(self.device)
        prefix_lens = batch.seq_lens
        width = self._auto_budget.next_width(len(prefix_lens)) if self._auto_budget is not None else self.tree_width
        prefix_lens_cpu = self._host_prefix_lens(batch, width)  # before the draft launch: see _host_prefix_lens
        kv_lens_cpu = self._verify_kv_lens(prefix_lens_cpu, width)
        drafted = None
        if width > 1:
            with traced_range("_draft_block"):
                draft_out = self._draft_block(batch, draft_input, prefix_lens_cpu)
            timer.mark()
            if self._draft_sampler is not None and draft_out.can_run_graph:
                drafted = self._draft_head.tree(len(prefix_lens))  # written by the draft graph's replay
            else:
                drafted = self._draft_head(draft_out.logits_output.hidden_states)
        else:
            timer.mark()  # a bonus-only verify: no draft, no head
        timer.mark()
        with traced_range("ddtree_from_expansion"):
            tree = self._tree_to_verify(drafted, width, batch, draft_input)
        if self._check_tp_trees:
            TP_TREE_CHECK.record(tree, get_tp_group())
        with traced_range("_verify_input"):
            batch.spec_info = self._verify_input(tree, batch, kv_lens_cpu, width)
        if self._simulating:
            CURRENT_TREE.next_token, CURRENT_TREE.width = tree.retrieve_next_token, width
        timer.mark()
        with self._verifying(width):
            result, committed_hidden = self._verify(batch, tree, width, grammar_barrier)
        timer.mark()
        if self._auto_budget is not None:
            self._auto_budget.observe(drafted.path_logprob if drafted is not None else None, width)
            if self._verify_graphs is not None:
                self._verify_graphs.record(width, result.can_run_cuda_graph)
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        with traced_range("_append_committed_to_draft_kv"):
            self._append_committed_to_draft_kv(batch, prefix_lens, result, width, committed_hidden)
        timer.mark()
        STEP_PROFILE.finish(timer, width)
        self._publish_read_done()
        result.logits_output.hidden_states = None  # not copied to the host under overlap scheduling
        result.next_draft_input = make_draft_input_v2(
            bonus_tokens=result.next_draft_input.bonus_tokens, new_seq_lens=result.new_seq_lens
        )
        return result

    def _verify(
        self, batch: ScheduleBatch, tree: DDTreeTensors, width: int, grammar_barrier
    ) -> tuple[GenerationBatchResult, Optional[torch.Tensor]]:
        """The tree verify: this package's greedy one where it is on and serves the batch
        (``ddtree_greedy_verify``, which also returns the committed tokens' hidden states), else SGLang's EAGLE
        tree verification (the hidden states compacted to the front of each block)."""
        if self._lean_verify and lean_verify_serves(batch):
            with traced_range("run_greedy_tree_verify"):
                verified = run_greedy_tree_verify(
                    batch, tree, target_worker=self.target_worker,
                    req_to_token_pool=self.model_runner.req_to_token_pool,
                    token_to_kv_pool_allocator=self.model_runner.token_to_kv_pool_allocator, width=width,
                    simulating=self._simulating,
                )  # fmt: skip
            return verified.result, verified.committed_hidden
        if self._lean_verify:
            count_verify(lean=False)
        with traced_range("run_eagle_verify"):
            result = run_eagle_verify(
                batch,
                target_worker=self.target_worker,
                req_to_token_pool=self.model_runner.req_to_token_pool,
                token_to_kv_pool_allocator=self.model_runner.token_to_kv_pool_allocator,
                plan_stream=None,
                plan_stream_ctx=contextlib.nullcontext(),
                topk=TREE_MODE_TOPK,
                num_steps=self.block_size - 1,
                num_draft_tokens=width,
                device=self.device,
                metadata_ready_pre_pad=False,
                finalize_tree_path=True,
                grammar_barrier=grammar_barrier,
            )
        return result, None

    def _verifying(self, width: int) -> contextlib.AbstractContextManager:
        """The target's verify graphs and attention backend of ``width`` for the verify (the server's own at its
        capture width, and wherever no graphs were captured)."""
        if self._verify_graphs is None:
            return contextlib.nullcontext()
        return self._verify_graphs.verifying(width)

    def _tree_to_verify(
        self, drafted: Optional[DraftTree], width: int, batch: ScheduleBatch, draft_input: DFlashDraftInputV2
    ) -> DDTreeTensors:
        """The verify tensors of the best ``width``-node tree: the drafted (widest) tree, a prefix of its pop
        order, or the bonus token alone (``drafted`` None, width 1)."""
        full_mask = not self._split_verify_attention
        seq_lens_sum = self._seq_lens_upper_bound(batch, draft_input) if full_mask else 0
        if drafted is None:
            return root_only_ddtree(draft_input.bonus_tokens, batch.seq_lens, seq_lens_sum, full_mask=full_mask)
        nodes = drafted if width == self.tree_width else drafted.first_nodes(width - 1)
        return ddtree_from_expansion(
            **vars(nodes), root_tokens=draft_input.bonus_tokens, seq_lens=batch.seq_lens, seq_lens_sum=seq_lens_sum,
            full_mask=full_mask,
        )  # fmt: skip

    def _publish_read_done(self) -> None:
        """Move the scheduler's write-after-read fence to the end of this step.

        Under overlap scheduling the scheduler's next writes to the shared ``req_to_token`` table wait on a
        read-done event. DFlash-family graph replays publish it *before* the replay (a chain verify reads
        the table only there), but tree verification reads it again afterwards, to move the accepted
        nodes' KV; publishing a fresh event here keeps those reads ahead of the writes.
        """
        if str(self.device).startswith("cuda"):
            read_done = torch.cuda.Event()
            read_done.record()
            self.war_fastpath_runner.war_fastpath_read_done_event = read_done

    def _draft_block(
        self, batch: ScheduleBatch, draft_input: DFlashDraftInputV2, prefix_lens_cpu: Optional[torch.Tensor]
    ):
        """Run the drafter on ``[bonus, MASK...]`` per request; returns the draft runner's output (hidden states
        ``[bs * block, H]``; ``can_run_graph`` when the replayed graph also ran the head). ``prefix_lens_cpu``: the
        exact committed lengths on the host, when read for a plan without device reads."""
        bs, block_size = len(batch.seq_lens), int(self.block_size)
        self._draft_block_spec_info.kv_lens_cpu = (
            prefix_lens_cpu + block_size if prefix_lens_cpu is not None and self._draft_plans_from_host_lengths else None
        )
        self._ensure_draft_block_buffers(bs)
        block_ids = self._draft_block_ids_buf[:bs]
        positions = self._draft_block_positions_buf[:bs]
        cache_loc = self._draft_verify_out_cache_loc_buf[:bs]
        _prepare_dflash_draft_block_unchecked(
            bonus_tokens=draft_input.bonus_tokens.view(-1),
            prefix_lens=batch.seq_lens.view(-1),
            req_pool_indices=batch.req_pool_indices.view(-1),
            req_to_token=self.model_runner.req_to_token_pool.req_to_token,
            block_ids_out=block_ids,
            positions_out=positions,
            cache_loc_out=cache_loc,
            mask_token_id=int(self._mask_token_id),
        )
        embed = self.target_worker.model_runner.model.get_input_embeddings()
        seq_lens_cpu = self._draft_seq_lens_cpu_buf[:bs]
        seq_lens_cpu.copy_(self._host_seq_lens(batch, draft_input))
        seq_lens_cpu.add_(block_size)
        forward_batch = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY,
            batch_size=bs,
            input_ids=block_ids.flatten(),
            req_pool_indices=batch.req_pool_indices,
            seq_lens=batch.seq_lens,
            out_cache_loc=cache_loc.reshape(-1),
            seq_lens_sum=int(seq_lens_cpu.sum()),
            seq_lens_cpu=seq_lens_cpu,
            positions=positions.reshape(-1),
            input_embeds=embed(block_ids).view(bs * block_size, -1),
            spec_algorithm=SpeculativeAlgorithm.DFLASH,
            spec_info=self._draft_block_spec_info,
            capture_hidden_mode=CaptureHiddenMode.NULL,
        )
        with torch.inference_mode():
            return self.draft_model_runner.forward(forward_batch)

    @staticmethod
    def _host_seq_lens(batch: ScheduleBatch, draft_input: DFlashDraftInputV2) -> torch.Tensor:
        """Host upper bound of the committed lengths (the host view lags one step under overlap)."""
        if batch.seq_lens_cpu is not None:
            return batch.seq_lens_cpu
        return draft_input.reserved_seq_lens_cpu

    def _host_prefix_lens(self, batch: ScheduleBatch, width: int) -> Optional[torch.Tensor]:
        """The committed lengths on the host, for FlashInfer plans of the draft block and the verify graph that
        read nothing back.

        Under overlap scheduling the host knows the committed lengths only a step late, and FlashInfer's plan
        cannot take bounds (a key chunk planned past a request's real length underflows in its kernel: the
        upper-bound version failed the GPU suite, tests/gpu/RESULTS.md run 38). So the step reads the device
        lengths once, here, where the GPU has finished the previous step's verify or is about to: FlashInfer's
        plans would otherwise read them back twice per step (the draft block's and the verify's, the latter
        after the draft forward). Only where such a plan runs (FlashInfer, CUDA graphs; the verify at a width with
        verify graphs, the draft block at any width but 1). Each read is compared with the scheduler's own host
        mirror of the lengths (``compare_with_scheduler_mirror``): if they always agree, this read can go, and under
        ``SGLANG_DDTREE_LENGTHS_FROM_SCHEDULER=1`` it does (``scheduler_mirror_lengths``).
        """
        verify = self._plans_from_host_lengths and self._has_verify_graph(width)
        draft = self._draft_plans_from_host_lengths and width > 1
        if not (verify or draft):
            return None
        mirrored = scheduler_mirror_lengths(batch.seq_lens_cpu, len(batch.seq_lens))
        if mirrored is not None:
            return mirrored
        read = batch.seq_lens.to("cpu", torch.int32)
        compare_with_scheduler_mirror(read, batch.seq_lens_cpu)
        return read

    def _verify_kv_lens(self, prefix_lens_cpu: Optional[torch.Tensor], width: int) -> Optional[torch.Tensor]:
        """The verify's key lengths on the host (prefix + tree), where its graph's plan takes them."""
        if prefix_lens_cpu is None or not self._plans_from_host_lengths or not self._has_verify_graph(width):
            return None
        return prefix_lens_cpu + width

    def _has_verify_graph(self, width: int) -> bool:
        if self._verify_graphs is not None:
            return self._verify_graphs.has_graph(width)
        return width == self.tree_width

    def _seq_lens_upper_bound(self, batch: ScheduleBatch, draft_input: DFlashDraftInputV2) -> int:
        """Size for the FULL tree mask without reading the device lengths: the reserved lengths bound them."""
        reserved = draft_input.reserved_seq_lens_cpu
        host = reserved if reserved is not None else self._host_seq_lens(batch, draft_input)
        return int(host.sum())

    def _verify_input(
        self, tree: DDTreeTensors, batch: ScheduleBatch, kv_lens_cpu: Optional[torch.Tensor], width: int
    ) -> DDTreeVerifyInput:
        return DDTreeVerifyInput(
            draft_token=tree.draft_token,
            custom_mask=tree.custom_mask,
            positions=tree.positions,
            retrieve_index=tree.retrieve_index,
            retrieve_next_token=tree.retrieve_next_token,
            retrieve_next_sibling=tree.retrieve_next_sibling,
            retrieve_cum_len=None,
            spec_steps=int(self.block_size) - 1,
            topk=TREE_MODE_TOPK,
            draft_token_num=width,
            capture_hidden_mode=CaptureHiddenMode.FULL,
            seq_lens_sum=batch.seq_lens_sum,
            seq_lens_cpu=batch.seq_lens_cpu,
            ancestor_bits=tree.ancestor_bits,
            kv_lens_cpu=kv_lens_cpu,
            split_attention=self._split_verify_attention,
        )

    def _append_committed_to_draft_kv(
        self, batch: ScheduleBatch, prefix_lens: torch.Tensor, result: GenerationBatchResult, tree_width: int,
        committed_hidden: Optional[torch.Tensor],
    ) -> None:
        """Write the target features of the committed tokens into the draft KV cache, at their final slots (their
        KV is at the front of each request's verify block of ``tree_width`` nodes). The features: by depth in
        ``committed_hidden`` (``[bs, W, H]``), or, from SGLang's verify, compacted to the front of each block."""
        bs = len(prefix_lens)
        width = min(tree_width, int(self.block_size))
        if committed_hidden is not None:
            hidden = committed_hidden[:, :width]
        else:
            hidden = result.logits_output.hidden_states.view(bs, tree_width, -1)[:, :width]
        cache_loc_2d = batch.out_cache_loc.view(bs, tree_width)[:, :width]
        positions = prefix_lens.view(-1, 1) + torch.arange(width, device=prefix_lens.device)
        self._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=hidden.reshape(-1, hidden.shape[-1]),
            cache_loc=cache_loc_2d.reshape(-1),
            cache_loc_2d=cache_loc_2d,
            positions=positions.reshape(-1),
            commit_lens=result.accept_lens.to(torch.int32),
        )
