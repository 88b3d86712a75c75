"""The edge cases of ``edge_cases.py`` (stops, an EOS, length and context limits, grammars inside accepted paths),
each served by DDTREE and by AR on SGLang's float32 CPU engine: the same tokens, text and finish reason, or the same
refusal; streamed, every chunk a prefix of that output."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

from edge_cases import (
    BUDGET, COMPARED, CONTEXT, CONTINUATION, GRAMMARS, PENALISED_TOKENS, PENALTIES, PROMPTS, STREAMED, make_models,
    place_cases, words,
)  # fmt: skip
from support import CPU_ENGINE_ARGS, run_engine_generate

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("edge_cases")]  # one worker builds the module's servers

# (prompt, continuation index) of the streamed stop: a fresh token >= t10 that DDTREE's tree commits in one step
# with the token after it in float32 (asserted from the stopless stream's steps), so the stop cuts an accepted path.
PATH_STOP = (2, 3)


def hf_greedy(model_dir: str, prompt: list[int], tokens: int) -> list[int]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The models (the target's EOS moved onto a token of a float32 greedy continuation), the cases and the ids
    that spell JSON pieces."""
    target, drafter = make_models(str(tmp_path_factory.mktemp("edge_models")))
    continuations = [hf_greedy(target, p, CONTINUATION) for p in PROMPTS]
    cases, json_words, _ = place_cases(target, continuations, PATH_STOP)
    return target, drafter, cases, json_words


def engine_args(target: str) -> dict:
    return {**CPU_ENGINE_ARGS, "model_path": target, "attention_backend": "triton", "dtype": "float32",
            "disable_radix_cache": True, "context_length": CONTEXT, "skip_tokenizer_init": False}  # fmt: skip


@pytest.fixture(scope="module")
def served(setup):
    """{algorithm: {case: (output_ids, text, finish_reason, refusal, meta_info, chunks)}} from one AR and one DDTREE
    engine; ``chunks`` (the streamed cases only): each streamed chunk's ``(text, output_ids, finish_reason)``."""
    target, drafter, cases, _ = setup
    prompts, params = [ids for ids, _ in cases.values()], [p for _, p in cases.values()]
    runs = {
        "AR": engine_args(target),
        "DDTREE": {**engine_args(target), "speculative_algorithm": "DDTREE", "speculative_draft_model_path": drafter,
                   "speculative_num_draft_tokens": BUDGET + 1},  # fmt: skip
    }
    out = {}
    for algorithm, args in runs.items():
        report = run_engine_generate(args, prompts, params, streamed=[case in STREAMED for case in cases])["sequential"]
        out[algorithm] = {
            case: (ids, text, meta["finish_reason"] if isinstance(meta, dict) else [m["finish_reason"] for m in meta],
                   error, meta, chunks)
            for case, ids, text, error, meta, chunks in zip(cases, report["output_ids"], report["text"],
                                                            report["error"], report["meta_info"], report["chunks"])
        }  # fmt: skip
    return out


@pytest.mark.parametrize("case", COMPARED)
def test_ddtree_serves_the_edge_case_exactly_as_ar(served, case):
    """Same tokens, text and finish reason, or the same refusal."""
    assert served["DDTREE"][case][:4] == served["AR"][case][:4]


@pytest.mark.parametrize("name, value", PENALTIES)
def test_a_penalty_is_refused_by_ddtree_with_the_reason_and_served_by_ar(served, name, value):
    """A tree verify cannot apply penalties along its drafted path (served, DDTREE ignored them: its greedy output
    was the unpenalised one), so DDTREE refuses them in words rather than serving something else."""
    ar_ids, _, _, ar_error, _, _ = served["AR"][f"{name} {value}"]
    ids, _, _, error, _, _ = served["DDTREE"][f"{name} {value}"]
    assert ar_error is None and len(ar_ids) == PENALISED_TOKENS
    assert ids is None and error.startswith(f"DDTREE speculative decoding does not support {name}")


def test_min_new_tokens_is_refused_by_ddtree_with_the_reason_and_served_by_ar(served):
    """SGLang's verify keeps ``min_new_tokens``' stop-token mask on every node of a step, also past its end, so a
    stop that AR emits inside an accepted path was replaced (prompt 2, stop 58, min 4: AR ``[52, 52, 52, 46, 58]``,
    DDTREE ``[52, 52, 52, 46, 46, 46, 13, 46]``); DDTREE refuses the parameter rather than serve something else."""
    ar_ids, _, _, ar_error, _, _ = served["AR"]["min_new_tokens past a stop"]
    ids, _, _, error, _, _ = served["DDTREE"]["min_new_tokens past a stop"]
    assert ar_error is None and ar_ids
    assert ids is None and error.startswith("DDTREE speculative decoding does not support min_new_tokens")


def test_the_cases_exercise_what_they_name(served):
    """The stops and the EOS really end the generations early, and the tree accepted drafts on the way."""
    ar = served["AR"]
    assert [len(ar[f"max_new_tokens={n}"][0]) for n in (1, 2, 3)] == [1, 2, 3]
    assert len(ar["eos"][0]) < CONTINUATION  # ends at the EOS
    assert len(ar["eos ignored"][0]) == CONTINUATION
    assert len(ar["stop_token_ids"][0]) < CONTINUATION and len(ar["stop string"][0]) < CONTINUATION
    assert len(ar["min_new_tokens past a stop"][0]) > len(ar["stop_token_ids"][0])
    assert len(ar["into the context limit"][0]) < CONTEXT - len(PROMPTS[7])  # cut by the context limit
    assert ar["prompt of context length - 1"][3] and not ar["prompt at the input limit"][3]  # refused / served
    ddtree_meta = [served["DDTREE"][c][4] for c in ("eos", "stop_token_ids", "stop string", "into the context limit")]
    assert sum(m["spec_num_correct_drafts"] for m in ddtree_meta) > 0


@pytest.mark.parametrize("case, prompt, pattern", [(case, prompt, pattern) for case, prompt, _, pattern in GRAMMARS])
def test_a_grammar_constrains_ddtree_exactly_as_ar(setup, served, case, prompt, pattern):
    """Structured output (SGLang's ``regex``, ``ebnf`` and ``json_schema`` sampling parameters, which
    ``response_format`` on /v1/chat/completions becomes) is served by DDTREE with the grammar masking every tree
    node the verify walks: the output follows the grammar and equals AR's under the same grammar token for token.
    A grammar that changes nothing would prove nothing, so AR's unconstrained output must differ."""
    target, _, _, json_words = setup
    with open(os.path.join(target, "config.json")) as f:
        text = words(served["AR"][case][0], json_words, json.load(f)["eos_token_id"])
    assert served["AR"][case][3] is None and re.fullmatch(pattern, text), text
    assert served["AR"][case][0] != served["AR"][f"no grammar {prompt}"][0]
    assert served["DDTREE"][case][:4] == served["AR"][case][:4]


def test_the_grammar_cases_accept_drafted_tokens(served):
    """The tree's drafts are accepted under a grammar too (else only the root, as a chain of one, was checked)."""
    assert sum(served["DDTREE"][case][4]["spec_num_correct_drafts"] for case, _, _, _ in GRAMMARS) > 0


@pytest.mark.parametrize("case", ["stop_token_ids inside a path streamed", "stop string inside a path streamed"])
def test_a_streamed_stop_inside_an_accepted_path_streams_nothing_past_it(served, case):
    """Streamed (``stream=True``, as ``"stream": true`` on /generate), a stop that falls inside a path the tree
    accepted in one step: every chunk is a prefix of AR's non-streamed output, so nothing after the stop is ever
    streamed, and the last chunk is that output with its finish reason. Without the stop, DDTREE's step that
    reached the stop's position committed the next token too, so the stop really cut an accepted path."""
    ar_ids, ar_text, ar_finish, _, _, _ = served["AR"][case.removesuffix(" streamed")]
    for algorithm in ("AR", "DDTREE"):
        chunks = served[algorithm][case][5]
        for chunk in chunks[:-1]:
            assert ar_ids[: len(chunk["output_ids"])] == chunk["output_ids"] and chunk["finish_reason"] is None
            assert ar_text.startswith(chunk["text"])
        last = chunks[-1]
        assert (last["output_ids"], last["text"], last["finish_reason"]) == (ar_ids, ar_text, ar_finish)
    committed = [len(chunk["output_ids"]) for chunk in served["DDTREE"]["no stop streamed"][5]]
    assert any(before < len(ar_ids) < after for before, after in zip(committed, committed[1:])), committed
