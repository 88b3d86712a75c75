"""GPU suite (H200): ``python -m sglang_ddtree.launch`` with no model path serves real SmolLM2 text, with AR and with
DDTREE (the embedded drafter), and a newcomer's first chat request is timed where it can be slow.

The GPU machine has no network: ``SGLANG_DDTREE_DEMO_GGUF`` names the GGUF pieces that were carried there.
"""

import os
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from sglang_ddtree.serving import free_port, launched_server
from support import http_json
from test_gpu_servers import record

pytestmark = pytest.mark.gpu

# Where a kernel compiled on first use lands (tests/gpu/env.sh points the first three at the carried JIT cache).
JIT_CACHE_ENVS = ("TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "TVM_FFI_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")
QUESTION = {"role": "user", "content": "What is the capital of France?"}
# What the server log says of each request's batches, for reading a slow request's timeline against its send time.
SERVER_LOG_MARKS = ("Prefill batch", "Decode batch", "POST /", "GET /health")


def jit_cache_files() -> set[str]:
    """Every file under the JIT caches: a request that adds one compiled a kernel before it could run."""
    folders = {os.environ.get(name) for name in JIT_CACHE_ENVS} | {f"/tmp/torchinductor_{os.environ.get('USER', 'root')}"}
    return {str(path) for folder in folders if folder and os.path.isdir(folder)
            for path in Path(folder).rglob("*") if path.is_file()}  # fmt: skip


def timed_request(url: str, path: str, payload: Optional[dict[str, Any]]) -> tuple[Any, dict[str, Any]]:
    """(response, its timing: wall seconds, send time and the JIT cache files it added)."""
    before, sent_at = jit_cache_files(), time.time()
    t0 = time.perf_counter()
    response = http_json(url + path, payload)
    seconds = time.perf_counter() - t0
    added = sorted(jit_cache_files() - before)
    return response, {"s": round(seconds, 3), "sent_at": round(sent_at, 3), "jit_files_added": len(added),
                      "jit_added": [name.rsplit("/", 2)[-2] + "/" + name.rsplit("/", 1)[-1] for name in added[:12]]}


@pytest.mark.skipif(not os.environ.get("SGLANG_DDTREE_DEMO_GGUF"), reason="SmolLM2 GGUF pieces not carried")
@pytest.mark.parametrize("algo", ["ar", "ddtree"])
def test_demo_model_serves_real_text(algo, tmp_path):
    """Issue 15's first chat took 7.7 s on a DDTREE demo server (later ones milliseconds), not reproduced on the CPU
    engine: there the chat path makes no network lookup and, after start-up, launches no Triton kernel, nor a new
    specialisation of one, that start-up did not (an interpreter trace of the tiny DDTREE server), but for SGLang's
    sampled verify. So this test sends what a newcomer sends, in order — a readiness probe that generates one token
    (``/health_generate``, what ``/health`` does by default), a chat without sampling parameters (SGLang samples it
    at temperature 1), the same chat again — with a greedy chat and /generate after, and records per request its
    time, the JIT cache files it added and the server log's lines, so that one run tells a compile on first use
    from a slow first prefill or a stall before it."""
    log_path = str(tmp_path / f"demo_{algo}.log")
    t0 = time.perf_counter()
    flags = ["--algo", algo, "--attention-backend", "flashinfer", "--mem-fraction-static", "0.3",
             "--context-length", "4096", "--cuda-graph-max-bs", "8"]  # fmt: skip
    steps: dict[str, dict[str, Any]] = {}
    with launched_server(flags, free_port(), ready_timeout=540, log_path=log_path) as url:
        start_seconds = time.perf_counter() - t0
        _, steps["health_generate"] = timed_request(url, "/health_generate", None)
        newcomer_chat = {"model": "default", "messages": [QUESTION], "max_tokens": 24}
        for name in ("chat_default_1", "chat_default_2"):
            _, steps[name] = timed_request(url, "/v1/chat/completions", newcomer_chat)
        long_prompt = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM.<|im_end|>\n" * 2
        _, steps["long_generate"] = timed_request(
            url, "/generate", {"text": long_prompt, "sampling_params": {"max_new_tokens": 24, "temperature": 0}})
        chat, steps["chat_greedy"] = timed_request(url, "/v1/chat/completions", {**newcomer_chat, "temperature": 0})
        generated, steps["generate_code"] = timed_request(
            url, "/generate", {"text": "def add(a, b):\n    return", "sampling_params": {"max_new_tokens": 8,
                                                                                     "temperature": 0}})  # fmt: skip
    answer = chat["choices"][0]["message"]["content"]
    server_log = [line.rstrip()[:160] for line in open(log_path) if any(mark in line for mark in SERVER_LOG_MARKS)]
    record({"test": "demo_smollm2", "algo": algo, "server_start_s": round(start_seconds, 1), "steps": steps,
            "answer": answer, "generate": generated["text"], "server_log_tail": server_log[-40:]})  # fmt: skip
    # Real text, not a fixed answer: this 4-bit 135M model's first answer token is a near-tie ("The" leads
    # "L" by 0.098 in fp32, under one bf16 step at that magnitude), which the GPU's bf16 kernels decide for
    # "L" ("L'Étoile, ...") and the CPU engine for "The capital of France is Paris.". The code completion
    # has a clear margin.
    assert len(answer.split()) >= 3 and sum(c.isalpha() for c in answer) > 10
    assert "a + b" in generated["text"] or "a+b" in generated["text"]
