"""``support.run_engine_generate`` forks each engine run from a process that imported SGLang once
(``engine_zygote.py``). What every engine test relies on: a run's failure reaches the test with its traceback, a run
past its timeout is killed and fails, and the runs after either still serve what a fresh engine serves."""

from __future__ import annotations

import pytest

from support import CPU_ENGINE_ARGS, run_engine_generate
from tiny_models import TinyShape, make_qwen3_target

GREEDY = {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}
PROMPTS = [[5, 9, 13], [7, 11]]


def test_failed_and_timed_out_runs_fail_their_test_and_later_runs_serve_as_before(tmp_path):
    engine = {**CPU_ENGINE_ARGS, "model_path": make_qwen3_target(str(tmp_path / "qwen3"), TinyShape(num_layers=2)),
              "attention_backend": "triton", "dtype": "float32"}  # fmt: skip
    first = run_engine_generate(engine, PROMPTS, GREEDY)["sequential"]["output_ids"]
    assert [len(ids) for ids in first] == [4, 4]
    with pytest.raises(AssertionError, match="Unknown speculative algorithm name: NOPE"):
        run_engine_generate({**engine, "speculative_algorithm": "NOPE"}, PROMPTS, GREEDY)
    with pytest.raises(AssertionError, match="timed out after 3s"):
        run_engine_generate(engine, PROMPTS, {**GREEDY, "max_new_tokens": 2000}, timeout=3)
    assert run_engine_generate(engine, PROMPTS, GREEDY)["sequential"]["output_ids"] == first
