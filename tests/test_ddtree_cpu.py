"""DDTree on a real SGLang engine (CPU): greedy output is token-identical to AR greedy.

Exactness is judged in float32 with the radix cache off, where it is well defined. The drafter is random, so
most steps accept only the bonus token; the best-first tree still spreads up to ``budget`` candidates over the
first depths, so some steps accept drafted nodes and exercise the tree's KV compaction.
"""

import pytest

from support import CONCURRENT_REQUESTS, CPU_ENGINE_ARGS, run_engine_generate
from tiny_models import TinyShape, make_dflash_drafter, make_qwen3_target

pytestmark = pytest.mark.slow

TARGET_LAYERS = 4
BLOCK_SIZE = 4
# Eight prompts of different lengths (1 to 37 tokens).
PROMPTS = [[(7 * i + 3 * j) % 500 + 4 for j in range(length)] for i, length in enumerate([1, 3, 6, 9, 14, 20, 29, 37])]
GREEDY = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddtree_models")
    target = make_qwen3_target(str(root / "qwen3"), TinyShape(num_layers=TARGET_LAYERS))
    drafter = make_dflash_drafter(
        str(root / "dflash"), target_num_layers=TARGET_LAYERS, block_size=BLOCK_SIZE, target_layer_ids=[0, 2]
    )
    return target, drafter


def exact_engine_args(target: str) -> dict:
    return {**CPU_ENGINE_ARGS, "model_path": target, "attention_backend": "triton", "dtype": "float32",
            "disable_radix_cache": True}  # fmt: skip


@pytest.fixture(scope="module")
def ar_outputs(models):
    target, _ = models
    return run_engine_generate(exact_engine_args(target), PROMPTS, GREEDY)["sequential"]["output_ids"]


@pytest.mark.parametrize("budget", [1, 8, 32])
def test_ddtree_greedy_equals_ar_greedy_alone_and_concurrent(models, ar_outputs, budget):
    target, drafter = models
    report = run_engine_generate(
        {
            **exact_engine_args(target),
            "speculative_algorithm": "DDTREE",
            "speculative_draft_model_path": drafter,
            "speculative_num_draft_tokens": budget + 1,
        },
        PROMPTS,
        GREEDY,
        modes=("sequential", "concurrent"),
    )
    assert report["scheduler_states"][0]["speculative_algorithm"] == "DDTREE"
    assert report["scheduler_states"][0]["speculative_num_draft_tokens"] == budget + 1
    assert report["sequential"]["output_ids"] == ar_outputs
    assert report["concurrent"]["output_ids"] == ar_outputs[:CONCURRENT_REQUESTS]
    for mode in ("sequential", "concurrent"):
        for meta in report[mode]["meta_info"]:
            assert meta["completion_tokens"] == GREEDY["max_new_tokens"]
            assert meta["spec_verify_ct"] > 0
            # Each verify commits the bonus token plus the accepted nodes, at most one per draft depth.
            assert 1.0 <= meta["spec_accept_length"] <= BLOCK_SIZE
