"""How SGLang resolves ``--speculative-algorithm DDTREE`` once the plugin is loaded (no engine is started)."""

import pytest

from tiny_models import TinyShape, make_dflash_drafter, make_qwen3_target


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("args_models")
    target = make_qwen3_target(str(root / "qwen3"), TinyShape(num_layers=4))
    drafter = make_dflash_drafter(str(root / "dflash"), target_num_layers=4, block_size=8, target_layer_ids=[0, 2])
    return target, drafter


def server_args(models, *extra: str):
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    load_plugins()
    target, drafter = models
    return prepare_server_args(
        ["--model-path", target, "--device", "cpu", "--speculative-algorithm", "DDTREE",
         "--speculative-draft-model-path", drafter, *extra]
    )  # fmt: skip


def test_tree_width_block_size_and_tree_mode_are_resolved(models):
    args = server_args(models, "--speculative-num-draft-tokens", "17", "--disable-cuda-graph")
    assert args.speculative_num_draft_tokens == 17  # budget 16 + root
    assert args.speculative_dflash_block_size == 8  # from the drafter's config
    assert args.speculative_num_steps == 7  # draft positions per block
    assert args.speculative_eagle_topk == 2  # SGLang's tree paths on
    assert args.enable_mixed_chunk is False


def test_default_budget_is_32_and_cuda_graphs_stay_on(models):
    args = server_args(models)
    assert args.speculative_num_draft_tokens == 33
    assert not args.disable_cuda_graph


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--disable-cuda-graph", "--speculative-num-draft-tokens", "3"], "budget 2 is too small for drafter block"),
        (["--disable-cuda-graph", "--speculative-num-draft-tokens", "1"], "needs --speculative-num-draft-tokens >= 2"),
        (["--disable-cuda-graph", "--speculative-draft-window-size", "16"], "--speculative-draft-window-size"),
    ],
)
def test_unsupported_settings_are_refused_with_the_reason(models, extra, message):
    with pytest.raises(ValueError, match=message):
        server_args(models, *extra)


def test_drafter_for_another_target_is_refused_before_any_process_starts(models, tmp_path):
    import json
    import os

    target, drafter = models
    with open(os.path.join(drafter, "config.json")) as f:
        config = json.load(f)
    config["dflash_config"] = {**config["dflash_config"], "target_layer_ids": [0, 4]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"target_layer_ids=\[0, 4\] but the target has only 4 layers"):
        server_args((target, str(tmp_path)))


def test_drafter_saved_in_float32_beside_a_bfloat16_target_is_loaded_in_bfloat16(models, tmp_path):
    """``--dtype auto`` resolves each checkpoint from its own config: float32 would become float16, and the
    drafter's first matmul on the target's bfloat16 features would fail on the first request."""
    import json
    import os
    import shutil

    target, drafter = models
    bf16_target = tmp_path / "target"
    shutil.copytree(target, bf16_target)
    config = json.loads((bf16_target / "config.json").read_text())
    (bf16_target / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16", "dtype": "bfloat16"}))
    with open(os.path.join(drafter, "config.json")) as f:
        assert json.load(f)["dtype"] == "float32"
    assert server_args((str(bf16_target), drafter), "--disable-cuda-graph").dtype == "bfloat16"
    assert server_args((str(bf16_target), drafter), "--disable-cuda-graph", "--dtype", "float16").dtype == "float16"


def test_ddtree_request_rows_hold_dflashs_two_step_reservation():
    """DFlash's decode reservation is committed + 2N slots per request; SGLang's rows hold context + 4 + N. A
    DDTREE row gets 4 + 2N beyond the context (tests/test_ddtree_edge_cases_cpu.py's context-limit case crashed
    the scheduler without it); other algorithms keep SGLang's own headroom."""
    from types import SimpleNamespace

    from sglang_ddtree.speculative.ddtree_spec import reserve_row_headroom_for_two_trees

    def sglang_headroom(args):
        return 4 + args.speculative_num_draft_tokens

    ddtree = SimpleNamespace(speculative_algorithm="DDTREE", speculative_num_draft_tokens=33)
    dflash = SimpleNamespace(speculative_algorithm="DFLASH", speculative_num_draft_tokens=16)
    assert reserve_row_headroom_for_two_trees(sglang_headroom, ddtree) == 4 + 2 * 33
    assert reserve_row_headroom_for_two_trees(sglang_headroom, dflash) == 4 + 16
    assert reserve_row_headroom_for_two_trees(lambda args: 200, ddtree) == 200  # never less than SGLang's
