"""GPU suite (H200): every launcher algorithm on the flashinfer and triton backends with CUDA graphs on.

Run by ``tests/gpu/run_suite.sh`` on the GPU machine, which installs SGLang from the wheelhouse and builds the
tiny models (``tests/tiny_models.py``). Servers of one backend start concurrently (their start-up is mostly
Python imports and JIT work), each on its own loopback port. Timings go to ``$GPU_SUITE_REPORT`` (JSON lines)
for tests/gpu/RESULTS.md.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import pytest

import sglang_ddtree
from sglang_ddtree.serving import ServerStartError, free_port, launched_server
from suite_servers import mem_fraction_flags
from support import http_json, record

pytestmark = pytest.mark.gpu

MODELS = os.environ.get("GPU_SUITE_MODELS", "/tmp/tiny_models")
BACKENDS = [b for b in os.environ.get("GPU_SUITE_BACKENDS", "flashinfer,triton").split(",") if b]
H200_MEM_SHARE = 0.08
COMMON_FLAGS = [
    "--context-length", "4096",
    "--max-total-tokens", "65536",
    "--max-running-requests", "8",
    "--cuda-graph-max-bs", "8",
    "--sampling-backend", "pytorch",
    "--grammar-backend", "none",
]  # fmt: skip
ALGO_ARGS = {
    "ar": ["--model-path", f"{MODELS}/qwen3"],
    "dflash": ["--model-path", f"{MODELS}/qwen3", "--draft-model-path", f"{MODELS}/dflash"],
    # The MTP target is a config only: --load-format dummy gives target and MTP layer random weights.
    "mtp": ["--model-path", f"{MODELS}/mtp", "--load-format", "dummy", "--skip-tokenizer-init"],
}
PROMPT = list(range(10, 50))
NEW_TOKENS = 64


def greedy(url: str, max_new_tokens: int = NEW_TOKENS) -> tuple[dict, float]:
    start = time.perf_counter()
    out = http_json(
        url + "/generate",
        {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0,
                                                  "ignore_eos": True}},
    )  # fmt: skip
    return out, time.perf_counter() - start


@pytest.fixture(scope="module")
def servers():
    """Every (algorithm, backend) server, started side by side so their JIT builds overlap.

    Yields {(algo, backend): (url, seconds to healthy)}, or (None, error) for a server that failed to start.
    """

    def start(stack: ExitStack, algo: str, backend: str):
        t0 = time.perf_counter()
        try:
            url = stack.enter_context(
                launched_server(
                    ["--algo", algo, *ALGO_ARGS[algo], "--attention-backend", backend, *COMMON_FLAGS,
                     *mem_fraction_flags(H200_MEM_SHARE)],
                    free_port(),
                    ready_timeout=420,
                )
            )
        except ServerStartError as e:  # reported by the tests of this server only
            return (algo, backend), (None, str(e))
        return (algo, backend), (url, time.perf_counter() - t0)

    combos = [(algo, backend) for backend in BACKENDS for algo in ALGO_ARGS]
    with ExitStack() as stack, ThreadPoolExecutor(len(combos)) as pool:
        yield dict(pool.map(lambda combo: start(stack, *combo), combos))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(ALGO_ARGS))
def test_algorithm_serves_with_cuda_graphs(servers, algo, backend):
    url, start_seconds = servers[algo, backend]
    assert url is not None, start_seconds
    info = http_json(url + "/server_info")
    assert info["internal_states"][0]["sglang_ddtree_version"] == sglang_ddtree.__version__
    assert info["disable_cuda_graph"] is False
    assert info["attention_backend"] == backend

    greedy(url, 8)  # warm-up: first request of a path may still JIT
    out, seconds = greedy(url)
    assert len(out["output_ids"]) == NEW_TOKENS
    meta = out["meta_info"]
    if algo == "ar":
        assert info["speculative_algorithm"] is None
    else:
        assert info["speculative_algorithm"] == {"dflash": "DFLASH", "mtp": "EAGLE"}[algo]
        assert meta["spec_verify_ct"] > 0 and meta["spec_accept_length"] >= 1.0
    record(
        {
            "test": "algorithm", "algo": algo, "backend": backend, "server_start_s": round(start_seconds, 1),
            "request_s": round(seconds, 3), "new_tokens": NEW_TOKENS,
            "spec_accept_length": meta.get("spec_accept_length"), "spec_verify_ct": meta.get("spec_verify_ct"),
        }
    )  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_dflash_greedy_output_equals_ar_on_the_same_backend(servers, backend):
    """Random tiny models in bf16: logits are far from ties, so the outputs must agree token for token."""
    (ar_url, ar_error), (dflash_url, dflash_error) = servers["ar", backend], servers["dflash", backend]
    assert ar_url is not None and dflash_url is not None, (ar_error, dflash_error)
    ar, _ = greedy(ar_url)
    dflash, _ = greedy(dflash_url)
    record({"test": "dflash_equals_ar", "backend": backend, "equal": ar["output_ids"] == dflash["output_ids"]})
    assert dflash["output_ids"] == ar["output_ids"]
