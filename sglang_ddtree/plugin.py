"""SGLang plugin entry point (group ``sglang.srt.plugins``, name ``ddtree``).

SGLang calls :func:`register` through ``load_plugins()`` in every process it starts: the launcher, the engine
and each spawned scheduler (spawned children inherit nothing from their parent's imports). The call must
therefore be cheap, import nothing heavy at module level and be idempotent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sglang_ddtree

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner

_SCHEDULER_INTERNAL_STATE = "sglang.srt.managers.scheduler.Scheduler.get_internal_state"
_EXTEND_FORWARD_KWARGS = "sglang.srt.model_executor.model_runner.ModelRunner._extend_forward_kwargs"
_GRAPH_RUNNER = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner"
_DUMMY_VERIFY_INPUT = "sglang.srt.speculative.spec_info.create_dummy_verify_input"
_AUX_HIDDEN_CAPTURE = (
    "sglang.srt.model_executor.model_runner_components.attention_backend_setup.configure_aux_hidden_state_capture"
)
_REQ_TO_TOKEN_HEADROOM = "sglang.srt.mem_cache.allocation_sizing.get_req_to_token_extra_context_len"
_DFLASH_REQUEST_CHECK = "sglang.srt.speculative.dflash_utils.validate_dflash_request"
_HTTP_SERVER_SETUP = "sglang.srt.entrypoints.http_server._setup_and_run_http_server"
_REQUEST_VALIDATION = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
_registered = False


def report_plugin_in_internal_state(
    output: GetInternalStateReqOutput, *args: Any, **kwargs: Any
) -> GetInternalStateReqOutput:
    """Add the plugin version to each scheduler's ``/server_info`` ``internal_states`` entry.

    It proves, from the outside, that the plugin was loaded inside the scheduler process that serves the
    requests (the benchmark records it with every run).
    """
    from sglang_ddtree.speculative.ddtree_auto_budget import auto_budget_report
    from sglang_ddtree.speculative.ddtree_cuda_graph import graph_draft_check_report, graph_verify_check_report
    from sglang_ddtree.speculative.ddtree_greedy_verify import lean_verify_report
    from sglang_ddtree.profiling.ddtree_host_profile import host_profile_report
    from sglang_ddtree.profiling.ddtree_step_profile import step_profile_report
    from sglang_ddtree.profiling.ddtree_trace_ranges import host_ranges_report
    from sglang_ddtree.speculative.flashinfer_split_verify import split_verify_report
    from sglang_ddtree.speculative.flashinfer_tree_plan import sync_free_plan_report
    from sglang_ddtree.speculative.ddtree_tp_check import tp_tree_check_report
    from sglang_ddtree.speculative.ddtree_simulation import simulation_report
    from sglang_ddtree.speculative.hybrid_tree_verify import wy_verify_report

    output.internal_state["sglang_ddtree_version"] = sglang_ddtree.__version__
    for name, report in (("ddtree_graph_verify_check", graph_verify_check_report()),
                         ("ddtree_graph_draft_check", graph_draft_check_report()),
                         ("ddtree_tp_tree_check", tp_tree_check_report()),
                         ("ddtree_step_profile", step_profile_report()),
                         ("ddtree_host_ranges", host_ranges_report()),
                         ("ddtree_host_profile", host_profile_report()),
                         ("ddtree_flashinfer_plans", sync_free_plan_report()),
                         ("ddtree_split_verify_attention", split_verify_report()),
                         ("ddtree_gdn_wy_verify", wy_verify_report()),
                         ("ddtree_lean_verify", lean_verify_report()),
                         ("ddtree_simulated_acceptance", simulation_report()),
                         ("ddtree_budget_auto", auto_budget_report())):  # fmt: skip
        if report is not None:
            output.internal_state[name] = report
    return output


def keep_input_embeds_in_model_dtype(
    original, runner: ModelRunner, forward_batch: ForwardBatch, *args: Any, **kwargs: Any
) -> dict[str, Any]:
    """Feed ``input_embeds`` to the model in the runner's dtype instead of always in bfloat16.

    SGLang 0.5.17 casts ``forward_batch.input_embeds`` to bfloat16 unconditionally
    (``ModelRunner._extend_forward_kwargs``). The DFlash drafter receives its block embeddings that way, so
    any float16/float32 target fails with a dtype mismatch in the drafter's first linear layer, and
    float32 is what the exactness tests need. Multimodal replacement embeddings keep upstream's path.
    """
    forward_kwargs = original(runner, forward_batch, *args, **kwargs)
    if forward_batch.input_embeds is not None and forward_batch.replace_embeds is None:
        forward_kwargs["input_embeds"] = forward_batch.input_embeds.to(runner.dtype)
    return forward_kwargs


def register() -> None:
    """Register this package's hooks with SGLang; safe to call any number of times per process."""
    global _registered
    if _registered:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_ddtree import server_hygiene
    from sglang_ddtree.profiling import ddtree_host_profile, ddtree_trace_ranges
    from sglang_ddtree.speculative import (
        ddtree_auto_budget,
        ddtree_cuda_graph,
        ddtree_requests,
        ddtree_simulation,
        ddtree_spec,
        flashinfer_split_verify,
        flashinfer_tree_plan,
        hybrid_targets,
        hybrid_tree_verify,
    )

    HookRegistry.register(_SCHEDULER_INTERNAL_STATE, report_plugin_in_internal_state, HookType.AFTER)
    HookRegistry.register(_EXTEND_FORWARD_KWARGS, keep_input_embeds_in_model_dtype, HookType.AROUND)
    HookRegistry.register(
        f"{_GRAPH_RUNNER}.get_spec_info", ddtree_cuda_graph.capture_tree_verify_with_mask, HookType.AROUND
    )
    HookRegistry.register(_DUMMY_VERIFY_INPUT, ddtree_cuda_graph.warmup_tree_verify_with_mask, HookType.AROUND)
    HookRegistry.register(
        _AUX_HIDDEN_CAPTURE, hybrid_targets.capture_dflash_layers_of_text_only_qwen35, HookType.AROUND
    )
    HookRegistry.register(_REQ_TO_TOKEN_HEADROOM, ddtree_spec.reserve_row_headroom_for_two_trees, HookType.AROUND)
    HookRegistry.register(_DFLASH_REQUEST_CHECK, ddtree_requests.refuse_what_ddtree_cannot_serve, HookType.AROUND)
    HookRegistry.register(_HTTP_SERVER_SETUP, server_hygiene.install_request_error_handlers, HookType.BEFORE)
    HookRegistry.register(_REQUEST_VALIDATION, server_hygiene.refuse_token_ids_outside_the_vocabulary, HookType.BEFORE)
    if ddtree_cuda_graph.graph_verify_check_requested():
        HookRegistry.register(
            f"{_GRAPH_RUNNER}.execute", ddtree_cuda_graph.compare_graph_verify_with_eager, HookType.AROUND
        )
    ddtree_simulation.register(HookRegistry, HookType)  # a pass-through unless a DDTREE worker simulates
    ddtree_trace_ranges.register(HookRegistry, HookType)  # nothing unless a profile asks for it
    ddtree_host_profile.register(HookRegistry, HookType)  # likewise
    flashinfer_tree_plan.register(HookRegistry, HookType)  # a pass-through but for DDTREE's verify graph replays
    flashinfer_split_verify.register(HookRegistry, HookType)  # a pass-through but for DDTREE's split verify layers
    if ddtree_auto_budget.auto_budget_requested():
        ddtree_auto_budget.register(HookRegistry, HookType)  # keeps each verify's accepted nodes for the policy
    if hybrid_tree_verify.wy_verify_requested():
        hybrid_tree_verify.register(HookRegistry, HookType)
    _register_ddtree_algorithm()
    _registered = True


def _ddtree_worker_class(server_args):
    from sglang_ddtree.speculative.ddtree_worker import DDTreeWorker

    return DDTreeWorker


def _register_ddtree_algorithm() -> None:
    """Make ``--speculative-algorithm DDTREE`` resolvable in this process (SGLang keeps a per-process registry)."""
    from sglang.srt.speculative import spec_registry
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_ddtree.speculative.ddtree_spec import DDTreeSpecAlgo

    if spec_registry.get_spec(sglang_ddtree.DDTREE_ALGORITHM_NAME) is None:
        register = SpeculativeAlgorithm.register(
            sglang_ddtree.DDTREE_ALGORITHM_NAME, supports_overlap=True, spec_class=DDTreeSpecAlgo
        )
        register(_ddtree_worker_class)
