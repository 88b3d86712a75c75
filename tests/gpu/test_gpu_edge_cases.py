"""GPU suite: the edge cases of ``tests/edge_cases.py`` (stops, an EOS, length and context limits, n > 1, grammars,
each where a tree may be mid-path) served by a DDTREE and an AR server on CUDA, bfloat16, with CUDA graphs and
xgrammar's CUDA mask, over HTTP as a user sends them (issue 15 points 1 and 2; the CPU engine's float32 test is
``tests/test_ddtree_edge_cases_cpu.py``).

The cases are placed on the target's greedy continuations as this card computes them: an AR server on the fresh
target gives them, then the target's EOS is moved and the AR and DDTREE servers start on it. The stop inside an
accepted path is chosen from DDTREE's own streamed steps (a token a step committed together with the one after it).

Judged as in bfloat16 (``lossless.py``): DDTREE's output equals AR's, or where they first part AR prefers its own
token by less than ``BF16_CLEAR_MARGIN`` nats over DDTREE's (a near tie that the two kernel paths may break apart;
the gap between two tokens does not depend on which others a grammar masks). Equal tokens must come with the same
text and finish reason, a refusal with the same message; a grammar's output must follow it on both servers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import urllib.error
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any, NamedTuple, Optional

import pytest

from edge_cases import (
    BUDGET, COMPARED, CONTEXT, CONTINUATION, GRAMMARS, PENALISED_TOKENS, PENALTIES, PROMPTS, STOPLESS, STREAMED,
    VOCAB, make_models, path_stop_cases, place_cases, words,
)  # fmt: skip
from lossless import BF16_CLEAR_MARGIN, top_logprobs_after
from server_load import Stream
from suite_servers import mem_fraction_flags, prefill_graph_flags
from sglang_ddtree.serving import launched_server
from support import http_json, record

pytestmark = pytest.mark.gpu

BACKENDS = [b for b in os.environ.get("GPU_SUITE_BACKENDS", "flashinfer,triton").split(",") if b]
H200_MEM_SHARE = 0.04
FLAGS = [
    "--dtype", "bfloat16",
    "--context-length", str(CONTEXT),
    "--max-running-requests", "8",
    "--cuda-graph-max-bs", "8",
    "--sampling-backend", "pytorch",
    "--grammar-backend", "xgrammar",
    "--disable-radix-cache",
    *prefill_graph_flags(),
]  # fmt: skip


class Served(NamedTuple):
    """One case as a server answered it (``ids``, ``text``, ``finish``: lists of n for n > 1)."""

    ids: Any
    text: Any
    finish: Any
    refusal: Optional[str]
    meta: Any
    chunks: Optional[list[dict[str, Any]]]  # streamed: each chunk's cumulative (text, output_ids, finish_reason)


def serve(url: str, prompt: list[int], params: dict[str, Any], streamed: bool = False, rid: str = "") -> Served:
    try:
        if streamed:
            stream = Stream(url, prompt, params, rid)
            chunks = [{"text": c["text"], "output_ids": c["output_ids"],
                       "finish_reason": c["meta_info"]["finish_reason"]} for c in stream.chunks()]  # fmt: skip
            stream.close()
            last = chunks[-1]
            return Served(last["output_ids"], last["text"], last["finish_reason"], None, None, chunks)
        out = http_json(url + "/generate", {"input_ids": prompt, "sampling_params": params}, timeout=300)
    except urllib.error.HTTPError as error:
        body = json.loads(error.read().decode() or "{}")
        message = body.get("message") or body.get("error", {}).get("message") or str(body)
        return Served(None, None, None, f"HTTP {error.code}: {message}", None, None)
    if isinstance(out, list):  # n > 1: one answer per choice
        metas = [o["meta_info"] for o in out]
        return Served([o["output_ids"] for o in out], [o["text"] for o in out],
                      [meta["finish_reason"] for meta in metas], None, metas, None)  # fmt: skip
    return Served(out["output_ids"], out["text"], out["meta_info"]["finish_reason"], None, out["meta_info"], None)


def preference(ar_url: str, context: list[int], ar_token: int, other: int) -> float:
    """How many nats AR's log-probability puts ``ar_token`` above ``other`` after ``context``."""
    logprob = {token: lp for lp, token in top_logprobs_after(ar_url, context, VOCAB)}
    return logprob[ar_token] - logprob[other]


def parting(ar_url: str, prompt: list[int], ar: list[int], ddtree: list[int]) -> Optional[dict[str, Any]]:
    """None if the outputs are equal; else where they first part and AR's preference there (None where one output
    is a prefix of the other: they ended differently on the same tokens)."""
    if ar == ddtree:
        return None
    at = next((i for i, (a, b) in enumerate(zip(ar, ddtree)) if a != b), min(len(ar), len(ddtree)))
    nats = preference(ar_url, prompt + ar[:at], ar[at], ddtree[at]) if at < min(len(ar), len(ddtree)) else None
    return {"at": at, "ar_prefers_by": nats}


def assert_served_as_ar(ar_url: str, prompt: list[int], ar: Served, ddtree: Served, label: str) -> None:
    """The judgement of the module's docstring, recorded for tests/gpu/RESULTS.md."""
    assert ddtree.refusal == ar.refusal
    if ar.refusal is not None:
        return
    choices = zip(ar.ids, ddtree.ids, ar.text, ddtree.text, ar.finish, ddtree.finish) if isinstance(ar.ids[0], list) \
        else [(ar.ids, ddtree.ids, ar.text, ddtree.text, ar.finish, ddtree.finish)]  # fmt: skip
    partings = []
    for ar_ids, ids, ar_text, text, ar_finish, finish in choices:
        found = parting(ar_url, prompt, ar_ids, ids)
        if found is None:
            assert (text, finish) == (ar_text, ar_finish)
        partings.append(found)
    record({"test": "edge_case", "case": label, "partings": partings})
    for found in filter(None, partings):
        assert found["ar_prefers_by"] is not None and found["ar_prefers_by"] < BF16_CLEAR_MARGIN, (label, found)


def greedy_continuations(url: str) -> list[list[int]]:
    params = {"temperature": 0.0, "max_new_tokens": CONTINUATION, "ignore_eos": True}
    return [serve(url, prompt, params).ids for prompt in PROMPTS]


def stop_inside_a_path(url: str, json_words: dict[int, str], eos: int) -> tuple[int, int]:
    """``(prompt index, token)``: a fresh token >= t10 (no JSON word, not the EOS) within the stopless stream's 8
    tokens that DDTREE's step committed together with the token after it."""
    for prompt_index, prompt in enumerate(PROMPTS):
        chunks = serve(url, prompt, STOPLESS, streamed=True, rid=f"edge-path-{prompt_index}").chunks
        ids, committed = chunks[-1]["output_ids"], [len(c["output_ids"]) for c in chunks]
        for before, after in zip(committed, committed[1:]):
            for index in range(before, after - 1):  # the stop ends the output at index + 1 < after
                token = ids[index]
                if token >= 10 and token not in json_words and token != eos and token not in ids[:index]:
                    return prompt_index, token
    raise AssertionError("no DDTREE step committed a fresh word token together with the token after it")


@pytest.fixture(scope="module", params=BACKENDS)
def edge(request, tmp_path_factory):
    """On one attention backend: the servers' URLs, the case setup and every case as each server answered it."""
    backend = request.param
    root = str(tmp_path_factory.mktemp(f"edge_{backend}"))
    target, drafter = make_models(root)

    def args(algo: str, model: str) -> list[str]:
        extra = ["--draft-model-path", drafter, "--budget", str(BUDGET)] if algo == "ddtree" else []
        return ["--algo", algo, "--model-path", model, *extra, "--attention-backend", backend, *FLAGS,
                *mem_fraction_flags(H200_MEM_SHARE)]  # fmt: skip

    with launched_server(args("ar", target), ready_timeout=420) as fresh_ar:
        continuations = greedy_continuations(fresh_ar)
    placed = os.path.join(root, "qwen3_cases")
    shutil.copytree(target, placed)
    cases, json_words, eos = place_cases(placed, continuations, None)
    with ExitStack() as stack, ThreadPoolExecutor(2) as pool:  # the two start side by side
        ar_url, ddtree_url = pool.map(lambda algo: stack.enter_context(
            launched_server(args(algo, placed), ready_timeout=420)), ("ar", "ddtree"))  # fmt: skip
        path_prompt, path_stop = stop_inside_a_path(ddtree_url, json_words, eos)
        cases.update(path_stop_cases(path_prompt, path_stop))
        served = {
            name: {case: serve(url, prompt, params, case in STREAMED, rid=f"edge-{name}-{i}")
                   for i, (case, (prompt, params)) in enumerate(cases.items())}
            for name, url in (("AR", ar_url), ("DDTREE", ddtree_url))
        }  # fmt: skip
        record({"test": "edge_case_setup", "backend": backend, "eos": eos, "path_stop": [path_prompt, path_stop],
                "accepted_drafts": {case: s.meta.get("spec_num_correct_drafts", 0)
                                    for case, s in served["DDTREE"].items() if isinstance(s.meta, dict)}})  # fmt: skip
        yield {"ar_url": ar_url, "cases": cases, "json_words": json_words, "eos": eos, "served": served}


@pytest.mark.parametrize("case", COMPARED)
def test_ddtree_serves_the_edge_case_as_ar(edge, case):
    prompt = edge["cases"][case][0]
    assert_served_as_ar(edge["ar_url"], prompt, edge["served"]["AR"][case], edge["served"]["DDTREE"][case], case)


@pytest.mark.parametrize("name, value", PENALTIES)
def test_a_penalty_is_refused_by_ddtree_with_the_reason_and_served_by_ar(edge, name, value):
    ar, ddtree = edge["served"]["AR"][f"{name} {value}"], edge["served"]["DDTREE"][f"{name} {value}"]
    assert ar.refusal is None and len(ar.ids) == PENALISED_TOKENS
    assert ddtree.refusal.startswith("HTTP 400")
    assert f"DDTREE speculative decoding does not support {name}" in ddtree.refusal


def test_min_new_tokens_is_refused_by_ddtree_with_the_reason_and_served_by_ar(edge):
    ar, ddtree = (edge["served"][name]["min_new_tokens past a stop"] for name in ("AR", "DDTREE"))
    assert ar.refusal is None and ar.ids
    assert ddtree.refusal.startswith("HTTP 400")
    assert "DDTREE speculative decoding does not support min_new_tokens" in ddtree.refusal


def test_the_cases_exercise_what_they_name(edge):
    """The stops and the EOS end AR's generations early, the context limit cuts one, and DDTREE's trees accepted
    drafts in those generations (the stops inside a path are checked by the streamed test)."""
    ar = edge["served"]["AR"]
    assert [len(ar[f"max_new_tokens={n}"].ids) for n in (1, 2, 3)] == [1, 2, 3]
    assert len(ar["eos"].ids) < CONTINUATION and len(ar["eos ignored"].ids) == CONTINUATION
    assert len(ar["stop_token_ids"].ids) < CONTINUATION and len(ar["stop string"].ids) < CONTINUATION
    assert len(ar["into the context limit"].ids) < CONTEXT - len(PROMPTS[7])
    assert ar["prompt of context length - 1"].refusal and not ar["prompt at the input limit"].refusal
    ddtree = edge["served"]["DDTREE"]
    ended_early = ("eos", "stop_token_ids", "stop string", "into the context limit")
    assert sum(ddtree[case].meta.get("spec_num_correct_drafts", 0) for case in ended_early) > 0


@pytest.mark.parametrize("case, prompt, pattern", [(case, prompt, pattern) for case, prompt, _, pattern in GRAMMARS])
def test_a_grammar_constrains_both_servers_and_changes_the_output(edge, case, prompt, pattern):
    """xgrammar's CUDA mask on every node the verify walks: DDTREE's output follows the grammar as AR's does (their
    tokens are compared by ``test_ddtree_serves_the_edge_case_as_ar``), and the grammar changed AR's output."""
    served, json_words, eos = edge["served"], edge["json_words"], edge["eos"]
    for name in ("AR", "DDTREE"):
        text = words(served[name][case].ids, json_words, eos)
        assert served[name][case].refusal is None and re.fullmatch(pattern, text), (name, text)
    assert served["AR"][case].ids != served["AR"][f"no grammar {prompt}"].ids
    assert sum(served["DDTREE"][c].meta.get("spec_num_correct_drafts", 0) for c, _, _, _ in GRAMMARS) > 0


@pytest.mark.parametrize("case", ["stop_token_ids inside a path streamed", "stop string inside a path streamed"])
def test_a_streamed_stop_inside_an_accepted_path_streams_nothing_past_it(edge, case):
    """Every chunk is a prefix of the server's own non-streamed output and the last one is that output; DDTREE's
    stopless stream committed the stop's position and the token after it in one step."""
    for name in ("AR", "DDTREE"):
        whole = edge["served"][name][case.removesuffix(" streamed")]
        chunks = edge["served"][name][case].chunks
        for chunk in chunks[:-1]:
            assert whole.ids[: len(chunk["output_ids"])] == chunk["output_ids"] and chunk["finish_reason"] is None
            assert whole.text.startswith(chunk["text"])
        last = chunks[-1]
        assert (last["output_ids"], last["text"], last["finish_reason"]) == (whole.ids, whole.text, whole.finish)
    stopped = edge["served"]["DDTREE"][case.removesuffix(" streamed")].ids
    committed = [len(chunk["output_ids"]) for chunk in edge["served"]["DDTREE"]["no stop streamed"].chunks]
    assert any(before < len(stopped) < after for before, after in zip(committed, committed[1:])), committed
