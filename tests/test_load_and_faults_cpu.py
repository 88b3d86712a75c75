"""A DDTREE server under load and faults (SGLang's CPU engine, float32, through the launcher).

Concurrency changes everything a tree verify touches: batches of mixed lengths, the trees of many requests in one
verify, KV slots allocated and freed out of order, prefix-cache hits. Requests that end early change it again: a
client that disconnects mid-stream and an ``/abort_request`` free their request's KV and tree state while other
requests share the batch. What must hold:

- 32 concurrent clients x 2 rounds (the first on a flushed prefix cache, the second on the first's cached
  prefixes) get exactly the tokens of the same request sent alone. The reference is AR's greedy decoding of the
  target (transformers, in this process): in float32 on the CPU engine DDTREE greedy is AR's token for token, and
  a few requests sent one at a time to this server are checked against it too. Each concurrent request also takes
  exactly the verify steps that ``drafter_acceptance`` replays for it alone (the tree of its own drafter block at
  every anchor), so a batched tree verify accepts what a lone one does, and the replay that
  ``test_acceptance_floors`` measures the demo pair with is what this server takes.
- Streams closed after a few chunks and requests aborted by rid end early, and the requests beside them still get
  their exact tokens.
- Afterwards the server is idle with nothing held, read from the server (``/v1/loads``: no running or waiting
  request, no KV token in use), and SGLang's own idle check ran clean: with ``SGLANG_ENABLE_STRICT_MEM_CHECK_
  DURING_IDLE`` every idle scheduler iteration checks that the KV pool's free + cached tokens and the request
  pool's free slots add up to the pools' sizes and raises on a leak, which takes the scheduler down; so the
  scheduler must still serve (``/health_generate``) and the log must carry no leak message.
  ``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY`` asserts the KV pool's accounting after every busy iteration too.

Bounded for CI (each request-step costs ~0.25 s here, the Triton kernels running under the interpreter): a
2-layer target, budget 4, 2-4 new tokens per request and prompts of 1-16 tokens. A 16-token vocabulary makes a
random drafter's top-4 hold the target's choice often, so trees are accepted beyond their roots (with 64 tokens,
2 drafts in 64 requests were).
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from sglang_ddtree.serving import free_port, launched_server
from server_load import LEAK_MESSAGES, LoadSampler, Stream, loads, pools, wait_idle
from support import http_json, record
from test_http_launch import CPU_SERVER_FLAGS
from tiny_models import MASK_TOKEN_ID, TinyShape, make_dflash_drafter, make_qwen3_target

pytestmark = pytest.mark.slow

VOCAB, LAYERS, FEATURE_LAYERS, BLOCK, BUDGET = 16, 2, [0], 4, 4
CLIENTS, ROUNDS, SEQUENTIAL = 32, 2, 4
# Prompts of 1-16 tokens, 2-4 new tokens each.
PROMPTS = [[(11 * i + 5 * j) % (VOCAB - 4) + 4 for j in range(1 + (13 * i) % 16)] for i in range(CLIENTS)]
NEW_TOKENS = [2 + (3 * i) % 3 for i in range(CLIENTS)]
LONG_TOKENS = 500  # the requests that end early: they would need minutes to finish


def greedy(tokens: int) -> dict[str, Any]:
    return {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}


def generate(url: str, prompt: list[int], tokens: int) -> dict[str, Any]:
    out = http_json(url + "/generate", {"input_ids": prompt, "sampling_params": greedy(tokens)})
    assert out["meta_info"]["finish_reason"]["type"] == "length" and len(out["output_ids"]) == tokens
    return out


def hf_greedy(model, prompt: list[int], tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=tokens, do_sample=False, eos_token_id=None,
                             pad_token_id=0)  # fmt: skip
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("load_models")
    target = make_qwen3_target(str(root / "qwen3"), TinyShape(num_layers=LAYERS, vocab_size=VOCAB))
    drafter = make_dflash_drafter(str(root / "dflash"), target_num_layers=LAYERS, block_size=BLOCK,
                                  shape=TinyShape(num_layers=1, vocab_size=VOCAB), target_layer_ids=FEATURE_LAYERS)  # fmt: skip
    return {"root": root, "target": target, "drafter": drafter}


@pytest.fixture(scope="module")
def reference(models):
    """Per request: AR's greedy tokens and the verifies the replay takes for it alone."""
    import transformers

    from sglang_ddtree.training.drafter_acceptance import greedy_acceptance
    from sglang_ddtree.training.drafter_model import DFlashDrafter, DrafterShape
    from sglang_ddtree.training.train_drafter import load_drafter

    target = transformers.AutoModelForCausalLM.from_pretrained(models["target"], dtype=torch.float32).eval()
    with open(f"{models['target']}/config.json") as f:
        shape = DrafterShape.for_target(json.load(f), num_layers=1, num_features=len(FEATURE_LAYERS), block_size=BLOCK)
    drafter = DFlashDrafter(dataclasses.replace(shape, target_layer_ids=tuple(FEATURE_LAYERS))).eval()
    load_drafter(drafter, models["drafter"])
    outputs = [hf_greedy(target, p, n) for p, n in zip(PROMPTS, NEW_TOKENS)]
    replayed = [greedy_acceptance(drafter, target, [(p + o, len(p))], MASK_TOKEN_ID, [BUDGET])[f"ddtree B={BUDGET}"]
                for p, o in zip(PROMPTS, outputs)]  # fmt: skip
    return {"outputs": outputs, "verifies": [len(steps) for steps in replayed]}


@pytest.fixture(scope="module")
def server(models):
    args = ["--algo", "ddtree", "--model-path", models["target"], "--draft-model-path", models["drafter"],
            "--budget", str(BUDGET), *CPU_SERVER_FLAGS, "--attention-backend", "triton", "--dtype", "float32",
            "--max-running-requests", str(CLIENTS + 8), "--skip-server-warmup"]  # fmt: skip
    log_path = str(models["root"] / "server.log")
    env = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1", "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1"}
    started = time.monotonic()
    with launched_server(args, free_port(), env=env, log_path=log_path) as url:
        figures: dict[str, Any] = {"server_start_s": round(time.monotonic() - started, 1)}
        yield {"url": url, "log": log_path, "figures": figures}
    record({"test": "load_and_faults_cpu", **figures})


def test_a_ddtree_server_under_load_and_faults_serves_exactly_and_frees_everything(server, reference):
    """One test, so that both phases share one server (a test per phase may land on two xdist workers, each
    starting its own): the load first, then the faults on the idle server it leaves."""
    concurrent_clients_get_the_tokens_and_verify_steps_of_requests_sent_alone(server, reference)
    disconnects_and_aborts_end_only_their_own_requests(server, reference)


def concurrent_clients_get_the_tokens_and_verify_steps_of_requests_sent_alone(server, reference) -> None:
    url, figures = server["url"], server["figures"]
    start = time.monotonic()
    alone = [generate(url, PROMPTS[i], NEW_TOKENS[i])["output_ids"] for i in range(SEQUENTIAL)]
    figures["sequential"] = {"requests": SEQUENTIAL, "wall_s": round(time.monotonic() - start, 2)}
    assert alone == reference["outputs"][:SEQUENTIAL]

    # SGLang refuses a flush (400) while a request is still running; ?timeout= waits for the scheduler to go idle.
    with urllib.request.urlopen(url + "/flush_cache?timeout=60", data=b"", timeout=120) as response:  # plain text
        assert response.status == 200
    accepted_drafts, cached = 0, []
    for round_index in range(ROUNDS):
        start = time.monotonic()
        with LoadSampler(url) as sampler, ThreadPoolExecutor(CLIENTS) as pool:
            outs = list(pool.map(lambda i: generate(url, PROMPTS[i], NEW_TOKENS[i]), range(CLIENTS)))
        figures[f"round_{round_index}"] = {"requests": CLIENTS, "wall_s": round(time.monotonic() - start, 2),
                                           "peak": sampler.peak}  # fmt: skip
        wrong = [i for i in range(CLIENTS) if outs[i]["output_ids"] != reference["outputs"][i]]
        assert not wrong, f"round {round_index}: requests {wrong} differ from the same requests sent alone"
        verifies = [out["meta_info"]["spec_verify_ct"] for out in outs]
        assert verifies == reference["verifies"], f"round {round_index}: verify steps differ from the replay's"
        assert sampler.peak["num_running_reqs"] > 1  # the requests were batched
        accepted_drafts += sum(out["meta_info"]["spec_num_correct_drafts"] for out in outs)
        cached.append(sum(out["meta_info"]["cached_tokens"] for out in outs))
    figures["cached_prompt_tokens_per_round"], figures["accepted_drafts"] = cached, accepted_drafts
    assert cached[1] > cached[0]  # the second round ran on the first's cached prefixes
    assert accepted_drafts > 0  # trees were accepted beyond their roots
    load, idle_s = wait_idle(url)
    figures["after_load"] = {**pools(load), "idle_after_s": idle_s, "kv_token_capacity": load["max_total_num_tokens"]}


def disconnects_and_aborts_end_only_their_own_requests(server, reference) -> None:
    url, figures = server["url"], server["figures"]
    figures["before_faults"] = pools(loads(url))
    others = [3, 10, 17, 24]
    ended: dict[str, list[dict]] = {}

    def disconnect(rid: str, prompt: list[int]) -> None:
        stream = Stream(url, prompt, greedy(LONG_TOKENS), rid)
        ended[rid] = [chunk for _, chunk in zip(range(3), stream.chunks())]
        stream.close()

    def abort(rid: str, prompt: list[int]) -> None:
        stream = Stream(url, prompt, greedy(LONG_TOKENS), rid)
        chunks = [chunk for _, chunk in zip(range(2), stream.chunks())]
        http_json(url + "/abort_request", {"rid": rid})
        ended[rid] = chunks + list(stream.chunks())
        stream.close()

    start = time.monotonic()
    with LoadSampler(url) as sampler, ThreadPoolExecutor(8) as pool:
        faults = [pool.submit(disconnect, f"disconnect-{i}", PROMPTS[i]) for i in (1, 2)]
        faults += [pool.submit(abort, f"abort-{i}", PROMPTS[i]) for i in (5, 6)]
        normal = [pool.submit(generate, url, PROMPTS[i], NEW_TOKENS[i]) for i in others]
        for future in faults:
            future.result()
        outs = [future.result() for future in normal]
    figures["faults"] = {"disconnected": 2, "aborted": 2, "others": len(others),
                         "wall_s": round(time.monotonic() - start, 2), "peak": sampler.peak}  # fmt: skip
    assert [out["output_ids"] for out in outs] == [reference["outputs"][i] for i in others]
    for rid in ("abort-5", "abort-6"):
        final = ended[rid][-1]["meta_info"]
        assert final["finish_reason"]["type"] == "abort" and final["completion_tokens"] < LONG_TOKENS, final
        figures["faults"][f"{rid}_completion_tokens"] = final["completion_tokens"]
    for rid in ("disconnect-1", "disconnect-2"):
        assert len(ended[rid]) == 3 and ended[rid][-1]["meta_info"]["finish_reason"] is None

    # The disconnected streams would run for minutes: idle now means the server ended them.
    load, idle_s = wait_idle(url)
    figures["after_faults"] = {**pools(load), "idle_after_s": idle_s}
    time.sleep(1)  # idle scheduler iterations, each running SGLang's leak check
    assert http_json(url + "/health_generate") is None  # the scheduler still serves
    with open(server["log"]) as f:
        log = f.read()
    assert not [message for message in LEAK_MESSAGES if message in log]
