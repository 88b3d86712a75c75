"""The edge cases where a tree can go wrong silently, shared by the CPU engine's test (float32, token identity:
``test_ddtree_edge_cases_cpu.py``) and the GPU suite's (bfloat16, CUDA graphs, served over HTTP:
``gpu/test_gpu_edge_cases.py``).

A verify accepts up to block - 1 drafted tokens at once, so a stop, an EOS, a length limit or a grammar's end can
fall inside an accepted path, and a grammar must mask every node of the tree, not only its root. The cases are
placed on the target's own greedy continuations (``place_cases``): its EOS is moved onto a token that one
continuation first reaches a few tokens in, and the stops are taken from the continuations too, so each lands where
a tree with accepted drafts may be mid-path. Ids 4-9 spell JSON pieces (the other words are ``t<id>``; the EOS and
the stop word are chosen among ids >= 10), so that a JSON schema can be served at all.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from tiny_models import BOOLEAN_SCHEMA, JSON_WORDS, TinyShape, make_dflash_drafter, make_qwen3_target, write_tokenizer

VOCAB, LAYERS, BLOCK, BUDGET, CONTEXT = 64, 4, 4, 8, 48
PROMPTS = [[(7 * i + 3 * j) % (VOCAB - 4) + 4 for j in range(length)] for i, length in enumerate([1, 3, 6, 9, 14, 20, 29, 37])]
CONTINUATION = 16
PENALTIES = [("frequency_penalty", 0.5), ("presence_penalty", 0.5), ("repetition_penalty", 1.3)]
PENALISED_TOKENS = 4  # AR serves a penalty (DDTREE refuses it at once): a few tokens show that
LONG_PROMPT = [(5 * j) % 60 + 4 for j in range(CONTEXT)]
INPUT_LIMIT = CONTEXT - 7  # SGLang's longest prompt at this context length (it refuses 47 tokens: limit 42)
# (case, prompt, request's grammar, what the output's words joined must fully match): each one changes AR's greedy
# output; on PROMPTS[7] the tree accepts drafts under the grammar (the tests assert that some are accepted).
GRAMMARS = [
    ("regex", 7, {"regex": "(t51|t3[0-46-9])+"}, r"(t51|t3[0-46-9])+"),
    ("regex ending inside a path", 7, {"regex": "(t51|t3[0-46-9]){4}"}, r"(t51|t3[0-46-9]){4}"),
    ("ebnf", 3, {"ebnf": 'root ::= pair+\npair ::= "t5" [0-9] "t1" [0-9]'}, r"(t5[0-9]t1[0-9])+(t5[0-9])?"),
    ("json_schema", 3, {"json_schema": json.dumps(BOOLEAN_SCHEMA)}, r'\{"a":(true|false)\}'),
]
STOPLESS = {"temperature": 0.0, "ignore_eos": True, "max_new_tokens": 8}  # the path stop's prompt without it
# Each case whose name ends in " streamed" is its namesake sent with ``stream=True``.
STREAMED = ["stop_token_ids inside a path streamed", "stop string inside a path streamed", "no stop streamed"]
# The cases both tests compare token for token (float32) or under the bf16 margin rule (GPU).
COMPARED = ["max_new_tokens=1", "max_new_tokens=2", "max_new_tokens=3", "eos", "eos ignored", "stop_token_ids",
            "stop string", "n=2", "into the context limit", "prompt of context length - 1",
            "prompt at the input limit", "stop_token_ids inside a path", "stop string inside a path", "no stop",
            *(case for case, _, _, _ in GRAMMARS)]  # fmt: skip


def make_models(root: str) -> tuple[str, str]:
    """The target and the drafter, under ``root``. The cases are placed on this target's continuations at a random
    init's attention scale, not on the sharper default's (tiny_models.ATTENTION_QK_NORM_GAIN)."""
    target = make_qwen3_target(os.path.join(root, "qwen3"), TinyShape(num_layers=LAYERS, vocab_size=VOCAB),
                               qk_norm_gain=1.0)  # fmt: skip
    drafter = make_dflash_drafter(os.path.join(root, "dflash"), target_num_layers=LAYERS, block_size=BLOCK,
                                  shape=TinyShape(num_layers=1, vocab_size=VOCAB), target_layer_ids=[0, 2])  # fmt: skip
    return target, drafter


def fresh_token(continuations: list[list[int]], position: int, minimum: int = 4, avoid: int = -1) -> tuple[int, int]:
    """``(prompt index, token)``: the first continuation (one without the token ``avoid``) with a token id >=
    ``minimum`` at or after ``position`` that it has not produced before."""
    for prompt, continuation in enumerate(continuations):
        for index in range(position, len(continuation)):
            token = continuation[index]
            if avoid not in continuation and token >= minimum and token not in continuation[:index]:
                return prompt, token
    raise AssertionError(f"no continuation has a fresh token at or after position {position}: {continuations}")


def path_stop_cases(prompt: int, stop: int) -> dict[str, tuple[list[int], dict[str, Any]]]:
    """A stop token (and its word as a stop string) that falls inside a path the tree accepts in one step, and the
    same request without it, each also streamed."""
    greedy = {"temperature": 0.0, "max_new_tokens": CONTINUATION}
    cases = {
        "stop_token_ids inside a path": (PROMPTS[prompt], {**greedy, "stop_token_ids": [stop]}),
        "stop string inside a path": (PROMPTS[prompt], {**greedy, "stop": [f"t{stop}"]}),
        "no stop": (PROMPTS[prompt], STOPLESS),
    }
    return {**cases, **{case: cases[case.removesuffix(" streamed")] for case in STREAMED}}


def place_cases(
    target: str, continuations: list[list[int]], path_stop: Optional[tuple[int, int]]
) -> tuple[dict[str, tuple[list[int], dict[str, Any]]], dict[int, str], int]:
    """Moves ``target``'s EOS onto a token of its greedy ``continuations`` (one per prompt, EOS ignored), writes its
    tokenizer with the JSON words, and returns ``({case: (prompt, sampling params)}, {id: JSON word}, EOS id)``.
    ``path_stop``: ``(prompt index, continuation index)`` of the stop inside an accepted path, or None when it is
    chosen later from the served tree's steps (:func:`path_stop_cases`; its token must be >= 10 and no JSON word)."""
    eos_prompt, eos = fresh_token(continuations, 3)
    for name in ("config.json", "generation_config.json"):
        path = os.path.join(target, name)
        with open(path) as f:
            config = json.load(f)
        with open(path, "w") as f:
            json.dump({**config, "eos_token_id": eos}, f)
    stop_prompt, stop_id = fresh_token(continuations, 4, avoid=eos)  # stop ids act only with ignore_eos off
    word_prompt, stop_word = fresh_token(continuations, 4, minimum=10)  # "t10".."t63": no word prefixes another
    taken = [eos, stop_id, stop_word]
    if path_stop is not None:
        prompt, index = path_stop
        stop = continuations[prompt][index]
        assert stop >= 10 and stop not in continuations[prompt][:index] + [eos], continuations[prompt]
        taken.append(stop)
    json_words = dict(zip([i for i in range(4, VOCAB) if i not in taken], JSON_WORDS.values()))
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
    }
    if path_stop is not None:
        cases.update(path_stop_cases(path_stop[0], stop))
    return cases, json_words, eos


def words(ids: list[int], json_words: dict[int, str], eos: int) -> str:
    """The output's words joined as the grammar reads them, without the EOS a finished grammar ends on."""
    return "".join(json_words.get(token, f"t{token}") for token in (ids[:-1] if ids and ids[-1] == eos else ids))
