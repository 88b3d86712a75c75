"""A real SGLang engine (CPU) with the plugin installed: registration, AR exactness, DFLASH losslessness."""

import pytest
import torch

import sglang_ddtree
from support import CPU_ENGINE_ARGS, run_engine_generate
from tiny_models import TinyShape, make_dflash_drafter, make_qwen3_target

pytestmark = pytest.mark.slow

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [400, 17, 250, 33, 98, 71, 64, 5, 300, 301, 12]]
GREEDY = {"max_new_tokens": 16, "temperature": 0.0, "ignore_eos": True}
TARGET_LAYERS = 4


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    target = make_qwen3_target(str(root / "qwen3"), TinyShape(num_layers=TARGET_LAYERS))
    drafter = make_dflash_drafter(
        str(root / "dflash"), target_num_layers=TARGET_LAYERS, block_size=4, target_layer_ids=[0, 2]
    )
    return target, drafter


def hf_greedy(model_path: str, prompt: list[int], max_new_tokens: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, min_new_tokens=max_new_tokens
        )
    return out[0, len(prompt) :].tolist()


def test_ar_engine_loads_plugin_in_scheduler_and_matches_hf_greedy(tiny_pair):
    target, _ = tiny_pair
    report = run_engine_generate(
        {**CPU_ENGINE_ARGS, "model_path": target, "attention_backend": "torch_native", "dtype": "float32"},
        PROMPTS,
        GREEDY,
    )
    # The scheduler is a spawned process: its state carries the plugin's mark only if the entry point ran there.
    assert [s.get("sglang_ddtree_version") for s in report["scheduler_states"]] == [sglang_ddtree.__version__]
    expected = [hf_greedy(target, prompt, GREEDY["max_new_tokens"]) for prompt in PROMPTS]
    assert report["sequential"]["output_ids"] == expected


def test_builtin_dflash_greedy_equals_ar_greedy(tiny_pair):
    target, drafter = tiny_pair
    engine_args = {**CPU_ENGINE_ARGS, "model_path": target, "attention_backend": "triton", "dtype": "float32"}
    ar = run_engine_generate(engine_args, PROMPTS, GREEDY)
    dflash = run_engine_generate(
        {**engine_args, "speculative_algorithm": "DFLASH", "speculative_draft_model_path": drafter},
        PROMPTS,
        GREEDY,
    )
    assert dflash["sequential"]["output_ids"] == ar["sequential"]["output_ids"]
    # Speculation really ran: every request went through verify steps, each committing >= 1 token.
    for meta in dflash["sequential"]["meta_info"]:
        assert meta["spec_verify_ct"] > 0
        assert meta["spec_accept_length"] >= 1.0
