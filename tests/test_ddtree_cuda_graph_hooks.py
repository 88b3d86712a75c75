"""DDTREE's target CUDA graphs are captured in tree-mask mode; every other runner keeps SGLang's dummies.

Without the plugin's hooks, SGLang captures DFlash-family verify graphs with a mask-less dummy: the backends
then verify every tree as a causal chain on replay, silently. These tests call the hooked SGLang entry points
the way the graph runner and the warm-up pass do (the graph replay itself is checked on the H200:
tests/gpu/test_gpu_ddtree.py).
"""

from types import SimpleNamespace

import pytest
import torch


@pytest.fixture(scope="module")
def hooked():
    from sglang.srt.plugins import load_plugins
    from sglang.srt.speculative import spec_registry

    load_plugins()
    return SimpleNamespace(ddtree=spec_registry.get_spec("DDTREE"))


def graph_runner(spec_algorithm, *, is_draft_worker: bool, width: int = 9):
    model_runner = SimpleNamespace(
        spec_algorithm=spec_algorithm,
        is_draft_worker=is_draft_worker,
        server_args=SimpleNamespace(speculative_num_steps=7, speculative_eagle_topk=2),
        attn_backend=SimpleNamespace(),
    )
    return SimpleNamespace(
        model_runner=model_runner,
        buffers=SimpleNamespace(custom_mask=torch.ones(64, dtype=torch.bool)),
        captured_req_width=width,
        speculative_num_steps=7,
        speculative_num_draft_tokens=width,
        _capture_ragged_verify_layout=lambda num_tokens: None,
    )


def test_ddtree_target_graph_is_captured_with_the_tree_mask_buffer(hooked):
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    from sglang_ddtree.speculative.ddtree_info import DDTreeVerifyInput

    runner = graph_runner(hooked.ddtree, is_draft_worker=False, width=33)
    spec_info = DecodeCudaGraphRunner.get_spec_info(runner, 4 * 33)
    assert isinstance(spec_info, DDTreeVerifyInput)
    assert spec_info.custom_mask is runner.buffers.custom_mask
    assert spec_info.draft_token_num == spec_info.num_tokens_per_req == 33
    assert spec_info.spec_steps == 7 and spec_info.topk == 2
    assert spec_info.capture_hidden_mode == CaptureHiddenMode.FULL


def test_ddtree_drafter_graph_keeps_dflash_causal_block_dummy(hooked):
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    spec_info = DecodeCudaGraphRunner.get_spec_info(graph_runner(hooked.ddtree, is_draft_worker=True, width=8), 32)
    assert isinstance(spec_info, DFlashVerifyInput)
    assert spec_info.custom_mask is None


def test_builtin_dflash_target_graph_is_untouched(hooked):
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_ddtree.speculative.ddtree_info import DDTreeVerifyInput

    spec_info = DecodeCudaGraphRunner.get_spec_info(
        graph_runner(SpeculativeAlgorithm.DFLASH, is_draft_worker=False, width=8), 32
    )
    assert isinstance(spec_info, DFlashVerifyInput) and not isinstance(spec_info, DDTreeVerifyInput)


def test_warmup_dummy_of_the_ddtree_target_carries_the_mask(hooked):
    from sglang.srt.model_executor.runner import base_runner
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    from sglang_ddtree.speculative.ddtree_info import DDTreeVerifyInput

    args = SimpleNamespace(speculative_num_steps=7, speculative_num_draft_tokens=33)
    mask = torch.ones(8, dtype=torch.bool)
    # base_runner imported the function by name before the plugin loaded: the hook must reach that binding.
    target = base_runner.create_dummy_verify_input(hooked.ddtree, args, mask, 33, False)
    assert isinstance(target, DDTreeVerifyInput)
    assert target.custom_mask is mask and target.draft_token_num == 33 and target.spec_steps == 7
    drafter = base_runner.create_dummy_verify_input(hooked.ddtree, args, mask, 8, True)
    assert isinstance(drafter, DFlashVerifyInput) and drafter.custom_mask is None


def test_graph_verify_check_counts_rows_that_pick_another_token():
    from sglang_ddtree.speculative.ddtree_cuda_graph import GraphVerifyCheck

    check = GraphVerifyCheck()
    graph = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]])
    check.record(graph, graph.clone())
    assert check.as_dict() == {"verifies": 1, "rows": 2, "argmax_mismatches": 0, "max_abs_diff": 0.0}
    causal = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 3.0]])  # second node attended to a non-ancestor
    check.record(causal, graph)
    assert check.verifies == 2 and check.rows == 4
    assert check.argmax_mismatches == 1 and check.max_abs_diff == 3.0


def test_each_graph_replayed_draft_block_is_re_run_eagerly_and_its_hidden_states_compared(hooked):
    """The draft block's graph replays are planned by DDTREE too (``flashinfer_tree_plan``), so the debug check
    re-runs each eagerly, after SGLang's own plan, and tallies how far the drafter's hidden states moved; the
    step goes on with the graph's output."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from sglang_ddtree.speculative import ddtree_cuda_graph
    from sglang_ddtree.speculative.ddtree_info import DDTreeDraftBlockInput

    planned = []
    graph_out = SimpleNamespace(hidden_states=torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    eager_out = SimpleNamespace(hidden_states=torch.tensor([[1.0, 2.0], [3.0, 4.5]]))
    runner = graph_runner(hooked.ddtree, is_draft_worker=True)
    runner.model_runner.attn_backend = SimpleNamespace(init_forward_metadata=planned.append)
    runner.model_runner.eager_runner = SimpleNamespace(execute=lambda forward_batch: eager_out)
    spec_info = DDTreeDraftBlockInput(draft_token=torch.empty(0), positions=torch.empty(0), draft_token_num=4)
    forward_batch = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, spec_info=spec_info)
    before = ddtree_cuda_graph.GRAPH_DRAFT_CHECK.as_dict()

    out = ddtree_cuda_graph.compare_graph_verify_with_eager(lambda graph_runner, batch: graph_out, runner, forward_batch)
    assert out is graph_out and planned == [forward_batch]
    after = ddtree_cuda_graph.GRAPH_DRAFT_CHECK.as_dict()
    assert after["blocks"] == before["blocks"] + 1 and after["rows"] == before["rows"] + 2
    assert after["max_abs_diff"] >= 0.5
