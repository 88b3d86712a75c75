"""GPU suite (H200): a DDTree server as the launcher runs it by default, under load and faults (issue 15 point 3).

The server is what a user gets from ``python -m sglang_ddtree.launch --algo ddtree``: ``--budget auto`` with step
times measured on its first steps, verify graphs per width, the radix cache on, on the tiny dense pair
(``qwen3_v64`` + ``dflash_v64``, bfloat16). SGLang's strict memory checks are on: every idle scheduler iteration
checks that the KV and request pools add up and takes the scheduler down on a leak.

- 256 concurrent requests of mixed prompt (1-1,500 tokens, some one another's prefix) and output lengths (1-256),
  greedy and sampled mixed, past the graphs' largest batch (64): every request served to its length, the greedy
  ones equal to AR's (an AR server given the same greedy requests at once; bfloat16, judged by AR's top-2 margin,
  ``lossless.py``).
- A 1,000-request soak, 64 clients at a time, of the same kind of mix with every 10th request a stream its client
  closes after two chunks and every 25th aborted by rid: no failure, the GPU memory in use after the soak within
  ``MEMORY_GROWTH_MIB`` of what it was after a warm-up of the same mix, and afterwards no request or KV token held
  (``/v1/loads``), the scheduler still serving and no leak in its log.

The figures (wall times, tokens per second, pool peaks, memory) go to the suite's report for tests/gpu/RESULTS.md.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from lossless import assert_lossless
from server_load import LEAK_MESSAGES, LoadSampler, Stream, pools, wait_idle
from suite_servers import mem_fraction_flags, prefill_graph_flags, started_servers, url_of
from sglang_ddtree.serving import default_log_path
from support import http_json, record

pytestmark = pytest.mark.gpu

MODELS = os.environ.get("GPU_SUITE_MODELS", "/tmp/tiny_models")
BACKENDS = [b for b in os.environ.get("GPU_SUITE_BACKENDS", "flashinfer,triton").split(",") if b]
CONCURRENT, SOAK_REQUESTS, SOAK_CLIENTS = 256, 1000, 64
MEMORY_GROWTH_MIB = 512
H200_MEM_SHARE = 0.08
FLAGS = [
    "--context-length", "4096",
    "--max-total-tokens", "262144",
    "--max-running-requests", str(CONCURRENT),
    "--cuda-graph-max-bs", "64",
    "--sampling-backend", "pytorch",
    "--grammar-backend", "none",
    "--dtype", "bfloat16",
    *prefill_graph_flags(),
]  # fmt: skip
STRICT_MEMORY_CHECKS = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1", "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1"}
SERVERS = {
    "ar": ["--algo", "ar"],
    "ddtree": ["--algo", "ddtree", "--draft-model-path", f"{MODELS}/dflash_v64"],  # the launcher's default budget
}
SAMPLED = {"temperature": 0.8, "top_p": 0.9, "top_k": 20}


def mixed_request(i: int, max_prompt: int, max_new: int) -> tuple[list[int], dict[str, Any]]:
    """Request ``i`` of a mix: prompt and output lengths spread over their ranges, even requests greedy and odd
    ones sampled; prompts ``i`` and ``i + 60`` are one the other's prefix (radix-cache hits)."""
    prompt = [(7 * i + 3 * j) % 60 + 4 for j in range(1 + (97 * i) % max_prompt)]
    params = {"max_new_tokens": 1 + (53 * i) % max_new, "ignore_eos": True}
    return prompt, {**params, **({"temperature": 0} if i % 2 == 0 else SAMPLED)}


def served(url: str, prompt: list[int], params: dict[str, Any]) -> dict[str, Any]:
    out = http_json(url + "/generate", {"input_ids": prompt, "sampling_params": params}, timeout=600)
    assert out["meta_info"]["finish_reason"]["type"] == "length", out["meta_info"]
    assert len(out["output_ids"]) == params["max_new_tokens"]
    return out


def gpu_memory_used_mib() -> int:
    query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    return int(subprocess.run(query, capture_output=True, text=True, check=True).stdout.split()[0])


@pytest.fixture(scope="module")
def servers(request):
    """{(kind, backend): url or an error string}; the servers the selected tests use start side by side."""

    def launch(kind: str, backend: str) -> tuple[list[str], dict[str, str]]:
        args = [*SERVERS[kind], "--model-path", f"{MODELS}/qwen3_v64", "--attention-backend", backend, *FLAGS,
                *mem_fraction_flags(H200_MEM_SHARE)]
        return args, STRICT_MEMORY_CHECKS

    yield from started_servers(request, launch, "load", ready_timeout=420)


@pytest.mark.servers("ar", "ddtree")
@pytest.mark.parametrize("backend", BACKENDS)
def test_256_concurrent_mixed_requests_are_served_and_the_greedy_ones_follow_ar(servers, backend):
    url, ar_url = url_of(servers, "ddtree", backend), url_of(servers, "ar", backend)
    requests = [mixed_request(i, max_prompt=1500, max_new=256) for i in range(CONCURRENT)]
    start = time.monotonic()
    with LoadSampler(url) as sampler, ThreadPoolExecutor(CONCURRENT) as pool:
        outs = list(pool.map(lambda request: served(url, *request), requests))
    wall_s = time.monotonic() - start
    greedy = [i for i, (_, params) in enumerate(requests) if params["temperature"] == 0]
    with ThreadPoolExecutor(len(greedy)) as pool:
        expected = list(pool.map(lambda i: served(ar_url, *requests[i])["output_ids"], greedy))
    metas = [out["meta_info"] for out in outs]
    load, idle_s = wait_idle(url)
    record({"test": "load_256_mixed", "backend": backend, "requests": CONCURRENT, "greedy": len(greedy),
            "wall_s": round(wall_s, 2), "output_tokens": sum(len(out["output_ids"]) for out in outs),
            "output_tok_per_s": round(sum(len(out["output_ids"]) for out in outs) / wall_s, 1), "peak": sampler.peak,
            "cached_prompt_tokens": sum(m["cached_tokens"] for m in metas),
            # a request that ends at its prefill (max_new_tokens 1) has no speculative counters in its meta_info
            "verifies": sum(m.get("spec_verify_ct", 0) for m in metas),
            "accepted_drafts": sum(m.get("spec_num_correct_drafts", 0) for m in metas), "idle_after_s": idle_s})  # fmt: skip
    assert sampler.peak["num_running_reqs"] > 64  # past the largest captured batch: eager verifies too
    assert_lossless(backend, ar_url, [requests[i][0] for i in greedy], expected, [outs[i]["output_ids"] for i in greedy],
                    "load: 256 concurrent mixed")  # fmt: skip
    assert not any(pools(load).values())


@pytest.mark.servers("ddtree")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_1000_request_soak_with_disconnects_and_aborts_holds_memory_and_frees_everything(servers, backend):
    url = url_of(servers, "ddtree", backend)
    log_path = default_log_path(urllib.parse.urlparse(url).port)
    requests = [mixed_request(i, max_prompt=600, max_new=128) for i in range(SOAK_REQUESTS)]

    def disconnect(i: int) -> str:
        stream = Stream(url, requests[i][0], {**requests[i][1], "max_new_tokens": 1000}, f"soak-disconnect-{i}")
        chunks = [chunk for _, chunk in zip(range(2), stream.chunks())]
        stream.close()
        assert len(chunks) == 2 and chunks[-1]["meta_info"]["finish_reason"] is None
        return "disconnected"

    def abort(i: int) -> str:
        rid = f"soak-abort-{i}"
        stream = Stream(url, requests[i][0], {**requests[i][1], "max_new_tokens": 1000}, rid)
        chunks = [chunk for _, chunk in zip(range(2), stream.chunks())]
        http_json(url + "/abort_request", {"rid": rid})
        final = (chunks + list(stream.chunks()))[-1]["meta_info"]
        stream.close()
        assert final["finish_reason"]["type"] == "abort" and final["completion_tokens"] < 1000, final
        return "aborted"

    def one(i: int) -> str:
        if i % 10 == 3:
            return disconnect(i)
        if i % 25 == 7:
            return abort(i)
        served(url, *requests[i])
        return "served"

    with ThreadPoolExecutor(SOAK_CLIENTS) as pool:  # warm-up: the same mix's first 64 requests, every kind of end
        list(pool.map(one, range(SOAK_CLIENTS)))
    wait_idle(url)
    memory_before = gpu_memory_used_mib()
    start = time.monotonic()
    with LoadSampler(url) as sampler, ThreadPoolExecutor(SOAK_CLIENTS) as pool:
        ends = list(pool.map(one, range(SOAK_REQUESTS)))
    wall_s = time.monotonic() - start
    load, idle_s = wait_idle(url)
    memory_after = gpu_memory_used_mib()
    time.sleep(1)  # idle scheduler iterations, each running SGLang's leak check
    assert http_json(url + "/health_generate") is None  # the scheduler still serves
    with open(log_path) as f:
        leaks = [message for message in LEAK_MESSAGES if message in f.read()]
    record({"test": "load_soak", "backend": backend, "requests": SOAK_REQUESTS, "clients": SOAK_CLIENTS,
            "ends": {end: ends.count(end) for end in sorted(set(ends))}, "wall_s": round(wall_s, 2),
            "peak": sampler.peak, "gpu_memory_mib_before": memory_before, "gpu_memory_mib_after": memory_after,
            "idle_after_s": idle_s, "after": pools(load), "budget_auto": http_json(url + "/server_info")[
                "internal_states"][0].get("ddtree_budget_auto")})  # fmt: skip
    assert ends.count("served") == SOAK_REQUESTS - ends.count("disconnected") - ends.count("aborted")
    assert not any(pools(load).values()) and not leaks
    assert memory_after - memory_before <= MEMORY_GROWTH_MIB, (memory_before, memory_after)
