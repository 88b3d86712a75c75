"""Where a tree can go wrong silently: a verify accepts up to block - 1 drafted tokens at once, so a stop, an EOS, a
length limit or a grammar's end can fall inside an accepted path, and a grammar must mask every node of the tree, not
only its root. Each case is served by DDTREE and by AR on SGLang's float32 CPU engine and must give the same tokens,
text and finish reason; streamed, every chunk must be a prefix of that output.

The target's EOS is set to a token that one greedy continuation first reaches a few tokens in, and the stops are
taken from the continuations too, so each lands where a tree with accepted drafts may be mid-path. Ids 4-9 spell
JSON pieces (the other words are ``t<id>``; the EOS and the stop word are chosen among ids >= 10), so that a JSON
schema can be served at all.
"""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

from support import CPU_ENGINE_ARGS, run_engine_generate
from tiny_models import BOOLEAN_SCHEMA, JSON_WORDS, TinyShape, make_dflash_drafter, make_qwen3_target, write_tokenizer

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("edge_cases")]  # one worker builds the module's servers

VOCAB, LAYERS, BLOCK, BUDGET, CONTEXT = 64, 4, 4, 8, 48
PROMPTS = [[(7 * i + 3 * j) % (VOCAB - 4) + 4 for j in range(length)] for i, length in enumerate([1, 3, 6, 9, 14, 20, 29, 37])]
CONTINUATION = 16
PENALTIES = [("frequency_penalty", 0.5), ("presence_penalty", 0.5), ("repetition_penalty", 1.3)]
PENALISED_TOKENS = 4  # AR serves a penalty (DDTREE refuses it at once): a few tokens show that
LONG_PROMPT = [(5 * j) % 60 + 4 for j in range(CONTEXT)]
INPUT_LIMIT = CONTEXT - 7  # SGLang's longest prompt at this context length (it refuses 47 tokens: limit 42)
# (case, prompt, request's grammar, what the output's words joined must fully match): each one changes AR's greedy
# output; on PROMPTS[7] the tree accepts drafts under the grammar (the test asserts that some are accepted).
GRAMMARS = [
    ("regex", 7, {"regex": "(t51|t3[0-46-9])+"}, r"(t51|t3[0-46-9])+"),
    ("regex ending inside a path", 7, {"regex": "(t51|t3[0-46-9]){4}"}, r"(t51|t3[0-46-9]){4}"),
    ("ebnf", 3, {"ebnf": 'root ::= pair+\npair ::= "t5" [0-9] "t1" [0-9]'}, r"(t5[0-9]t1[0-9])+(t5[0-9])?"),
    ("json_schema", 3, {"json_schema": json.dumps(BOOLEAN_SCHEMA)}, r'\{"a":(true|false)\}'),
]
# (prompt, continuation index) of the streamed stop: a fresh token >= t10 that DDTREE's tree commits in one step
# with the token after it (asserted from the stopless stream's steps), so the stop cuts an accepted path.
PATH_STOP = (2, 3)
STREAMED = ["stop_token_ids inside a path streamed", "stop string inside a path streamed", "no stop streamed"]


def hf_greedy(model_dir: str, prompt: list[int], tokens: int) -> list[int]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def fresh_token(continuations: list[list[int]], position: int, minimum: int = 4, avoid: int = -1) -> tuple[int, int]:
    """``(prompt index, token)``: the first continuation (one without the token ``avoid``) with a token id >=
    ``minimum`` that first occurs at an index >= ``position``."""
    for prompt, continuation in enumerate(continuations):
        for index in range(position, len(continuation)):
            token = continuation[index]
            if avoid not in continuation and token >= minimum and token not in continuation[:index]:
                return prompt, token
    raise AssertionError(f"no continuation has a fresh token at or after position {position}: {continuations}")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The models (the target's EOS moved onto a token of a greedy continuation), the cases and the ids that spell
    JSON pieces."""
    root = tmp_path_factory.mktemp("edge_models")
    # The cases (PATH_STOP, the grammars) are placed on this target's continuations at a random init's attention
    # scale, not on the sharper default's (tiny_models.ATTENTION_QK_NORM_GAIN).
    target = make_qwen3_target(str(root / "qwen3"), TinyShape(num_layers=LAYERS, vocab_size=VOCAB), qk_norm_gain=1.0)
    drafter = make_dflash_drafter(str(root / "dflash"), target_num_layers=LAYERS, block_size=BLOCK,
                                  shape=TinyShape(num_layers=1, vocab_size=VOCAB), target_layer_ids=[0, 2])  # fmt: skip
    continuations = [hf_greedy(target, p, CONTINUATION) for p in PROMPTS]
    eos_prompt, eos = fresh_token(continuations, 3)
    for name in ("config.json", "generation_config.json"):
        path = os.path.join(target, name)
        with open(path) as f:
            config = json.load(f)
        with open(path, "w") as f:
            json.dump({**config, "eos_token_id": eos}, f)
    stop_prompt, stop_id = fresh_token(continuations, 4, avoid=eos)  # stop ids act only with ignore_eos off
    word_prompt, stop_word = fresh_token(continuations, 4, minimum=10)  # "t10".."t63": no word prefixes another
    path_prompt, index = PATH_STOP
    path_stop = continuations[path_prompt][index]
    assert path_stop >= 10 and path_stop not in continuations[path_prompt][:index] + [eos], continuations[path_prompt]
    free_ids = [i for i in range(4, VOCAB) if i not in (eos, stop_id, stop_word, path_stop)]
    json_words = dict(zip(free_ids, JSON_WORDS.values()))
    write_tokenizer(target, vocab_size=VOCAB, words=json_words)
    greedy = {"temperature": 0.0, "max_new_tokens": CONTINUATION}
    ignore_eos = {**greedy, "ignore_eos": True}
    cases = {
        "max_new_tokens=1": (PROMPTS[1], {**ignore_eos, "max_new_tokens": 1}),
        "max_new_tokens=2": (PROMPTS[1], {**ignore_eos, "max_new_tokens": 2}),
        "max_new_tokens=3": (PROMPTS[1], {**ignore_eos, "max_new_tokens": 3}),
        "eos": (PROMPTS[eos_prompt], greedy),
        "eos ignored": (PROMPTS[eos_prompt], ignore_eos),
        "stop_token_ids": (PROMPTS[stop_prompt], {**greedy, "stop_token_ids": [stop_id]}),
        "stop string": (PROMPTS[word_prompt], {**ignore_eos, "stop": [f"t{stop_word}"]}),
        "min_new_tokens past a stop": (PROMPTS[stop_prompt], {**greedy, "stop_token_ids": [stop_id],
                                                              "min_new_tokens": 14}),  # fmt: skip
        "n=2": (PROMPTS[1], {**ignore_eos, "n": 2}),
        # Up to the last position the context holds, where a tree's deeper nodes would lie past it (this crashed the
        # DDTREE scheduler until its req_to_token rows got room for DFlash's 2N-slot reservation).
        "into the context limit": (PROMPTS[7], {**ignore_eos, "max_new_tokens": CONTEXT - len(PROMPTS[7])}),
        "prompt of context length - 1": (LONG_PROMPT[: CONTEXT - 1], {**ignore_eos, "max_new_tokens": 1}),
        "prompt at the input limit": (LONG_PROMPT[:INPUT_LIMIT], {**ignore_eos, "max_new_tokens": CONTEXT - INPUT_LIMIT}),
        **{f"{name} {value}": (PROMPTS[4], {**ignore_eos, "max_new_tokens": PENALISED_TOKENS, name: value})
           for name, value in PENALTIES},  # fmt: skip
        **{case: (PROMPTS[prompt], {**greedy, "max_new_tokens": 9, **grammar})
           for case, prompt, grammar, _ in GRAMMARS},  # fmt: skip
        **{f"no grammar {prompt}": (PROMPTS[prompt], {**greedy, "max_new_tokens": 9}) for prompt in (3, 7)},
        "stop_token_ids inside a path": (PROMPTS[path_prompt], {**greedy, "stop_token_ids": [path_stop]}),
        "stop string inside a path": (PROMPTS[path_prompt], {**greedy, "stop": [f"t{path_stop}"]}),
        "no stop": (PROMPTS[path_prompt], {**ignore_eos, "max_new_tokens": 8}),
    }
    cases.update({case: cases[case.removesuffix(" streamed")] for case in STREAMED})
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


CASES = ["max_new_tokens=1", "max_new_tokens=2", "max_new_tokens=3", "eos", "eos ignored", "stop_token_ids",
         "stop string", "n=2", "into the context limit", "prompt of context length - 1",
         "prompt at the input limit", "stop_token_ids inside a path", "stop string inside a path", "no stop",
         *(case for case, _, _, _ in GRAMMARS)]


@pytest.mark.parametrize("case", CASES)
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


def words(ids: list[int], json_words: dict[int, str], eos: int) -> str:
    """The output's words joined as the grammar reads them, without the EOS a finished grammar ends on."""
    return "".join(json_words.get(token, f"t{token}") for token in (ids[:-1] if ids and ids[-1] == eos else ids))


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
