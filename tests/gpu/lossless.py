"""What the GPU suites share to judge losslessness in bfloat16: greedy requests, divergences from AR with AR's
top-2 margin at the first differing token, and a chi-square test of sampled tokens against AR's.

SGLang's CUDA kernels have no float32 path for these models (``sgl_kernel.rmsnorm`` and ``gemma_rmsnorm`` refuse
it: tests/gpu/RESULTS.md run 7, ../shared/design/measurements.md), so GPU runs are bfloat16, where greedy decoding
is not reproducible across kernel paths (a tree verify and an AR decode step add in different orders). A
divergence at a margin of at least ``BF16_CLEAR_MARGIN`` counts as a failure. Token identity in float32 is the
CPU suites' test (tests/test_ddtree_cpu.py, tests/test_hybrid_cpu.py).
"""

from __future__ import annotations

import math
import threading
import time
import urllib.error
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from support import http_json, record

BF16_CLEAR_MARGIN = 0.1  # nats between AR's top-1 and top-2 at the first differing token
SAMPLING_ALPHA = 1e-3
# Graph replay vs eager re-run of the same tree verify. A tree mask missing from the graph would let nodes attend
# to non-ancestors: logits off by O(1) on most rows. bf16 kernel differences stay within a few ulps and only flip
# near-tied rows.
GRAPH_CHECK_MAX_ABS_DIFF = 0.0625
GRAPH_CHECK_ARGMAX_MISMATCH_RATE = 0.01


def generate(url: str, input_ids: list[int], max_new_tokens: int, **extra) -> dict:
    params = {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}
    return http_json(url + "/generate", {"input_ids": input_ids, "sampling_params": params, **extra}, timeout=600)


def generate_all(url: str, prompts: list[list[int]], max_new_tokens: int) -> list[dict]:
    """All prompts at once, one request each: the server batches them."""
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda ids: generate(url, ids, max_new_tokens), prompts))


def top2_margin(ar_url: str, context: list[int]) -> float:
    """AR's log-probability gap between its first and second choice after ``context``."""
    out = generate(ar_url, context, 1, return_logprob=True, top_logprobs_num=2)
    (first, *_), (second, *_) = out["meta_info"]["output_top_logprobs"][0][:2]
    return first - second


def divergences(ar_url: str, prompts, expected, got) -> list[dict]:
    """Where each output first differs from AR's, and AR's margin there."""
    found = []
    for prompt, want, have in zip(prompts, expected, got):
        if want == have:
            continue
        at = next((i for i, (a, b) in enumerate(zip(want, have)) if a != b), min(len(want), len(have)))
        found.append({"prompt_len": len(prompt), "at": at, "margin": top2_margin(ar_url, prompt + want[:at])})
    return found


def assert_lossless(backend: str, ar_url: str, prompts, expected, got, label: str) -> None:
    found = divergences(ar_url, prompts, expected, got)
    record({"test": "ddtree_equals_ar", "case": label, "backend": backend, "requests": len(prompts),
            "divergences": found})  # fmt: skip
    assert all(d["margin"] < BF16_CLEAR_MARGIN for d in found), found


def assert_abort_leaves_the_others_lossless(
    url: str, ar_url: str, backend: str, prompts: list[list[int]], expected: list[list[int]], new_tokens: int
) -> None:
    """A long request on ``prompts[0]`` is aborted mid-generation while ``prompts[1:5]`` run beside it; they, and a
    request on ``prompts[5]`` after it, must still follow AR (``expected`` holds AR's outputs)."""
    victim: dict = {}

    def run_victim():
        try:
            victim["finish"] = generate(url, prompts[0], 1900, rid="ddtree-abort-victim")["meta_info"]["finish_reason"]
        except urllib.error.HTTPError as e:  # SGLang may answer an aborted non-streaming request with an error
            victim["finish"] = {"type": "abort", "http_status": e.code}

    thread = threading.Thread(target=run_victim)
    thread.start()
    with ThreadPoolExecutor(4) as pool:
        others = pool.map(lambda ids: generate(url, ids, new_tokens), prompts[1:5])
        time.sleep(1.0)
        http_json(url + "/abort_request", {"rid": "ddtree-abort-victim"})
        others = [o["output_ids"] for o in others]
    thread.join(timeout=300)
    record({"test": "ddtree_abort", "backend": backend, "victim_finish": victim.get("finish")})
    assert victim["finish"]["type"] == "abort", victim
    assert_lossless(backend, ar_url, prompts[1:5], expected[1:5], others, "abort: the others")
    after = [generate(url, prompts[5], new_tokens)["output_ids"]]
    assert_lossless(backend, ar_url, prompts[5:6], expected[5:6], after, "abort: a request after it")


def homogeneity_pvalue(first: list[int], second: list[int]) -> float:
    """Chi-square test that two samples of tokens come from one distribution (rare tokens pooled)."""
    from scipy.stats import chi2_contingency

    a, b = Counter(first), Counter(second)
    common = [t for t in set(a) | set(b) if a[t] + b[t] >= 10]
    rare_a = sum(c for t, c in a.items() if t not in common)
    rare_b = sum(c for t, c in b.items() if t not in common)
    table = [[a[t] for t in common] + [rare_a], [b[t] for t in common] + [rare_b]]
    if rare_a + rare_b == 0:
        table = [row[:-1] for row in table]
    if len(table[0]) < 2:
        return 1.0
    return float(chi2_contingency(table)[1])


def sampled_pvalues(ar_url: str, spec_url: str, prompt: list[int], sampling: dict, samples: int,
                    tokens: int) -> tuple[list[float], list[dict]]:  # fmt: skip
    """``samples`` sampled continuations of ``tokens`` tokens from each server; one p-value per position after the
    first (the first comes from the prefill, the others from speculative verification), and per position the
    token counts of both sides (``{"ar": {token: count}, "spec": {...}}``, for reading a failure)."""
    params = {**sampling, "max_new_tokens": tokens, "ignore_eos": True}

    def sample(url: str) -> list[list[int]]:
        out = http_json(url + "/generate", {"input_ids": [prompt] * samples, "sampling_params": params}, timeout=900)
        return [o["output_ids"] for o in out]

    ar, spec = sample(ar_url), sample(spec_url)
    pvalues = [homogeneity_pvalue([s[i] for s in ar], [s[i] for s in spec]) for i in range(1, tokens)]
    histograms = [{"ar": dict(Counter(s[i] for s in ar)), "spec": dict(Counter(s[i] for s in spec))}
                  for i in range(tokens)]  # fmt: skip
    return pvalues, histograms


def top_logprobs_after(ar_url: str, context: list[int], count: int) -> list[tuple[float, int]]:
    """AR's ``count`` largest next-token log-probabilities after ``context``, as (logprob, token), largest first."""
    out = generate(ar_url, context, 1, return_logprob=True, top_logprobs_num=count)
    return sorted(((lp, token) for lp, token, *_ in out["meta_info"]["output_top_logprobs"][0]), reverse=True)


def top_k_renormalised(ranked: list[tuple[float, int]], k: int, keep_ties: bool) -> dict[int, float]:
    """Top-k of one row: exactly the ``k`` first of ``ranked``, or (``keep_ties``) every token whose logprob is at
    least the k-th's, as SGLang's ``top_k_renorm_prob`` keeps them; renormalised."""
    kept = [entry for entry in ranked if entry[0] >= ranked[k - 1][0]] if keep_ties else ranked[:k]
    assert len(kept) < len(ranked), "too few logprobs asked for to see the top-k boundary"
    total = sum(math.exp(lp) for lp, _ in kept)
    return {token: math.exp(lp) / total for lp, token in kept}


def second_token_marginal(ar_url: str, prompt: list[int], k: int, keep_ties: bool) -> tuple[dict[int, float], int]:
    """The second sampled token's distribution under top-k sampling: the first from the prefill's exact top-k
    (every algorithm samples it with the server's sampler), the second under the given tie rule; and how many
    of the first token's contexts have a tie at their k-th logprob."""
    marginal: dict[int, float] = Counter()
    tied = 0
    for first, p_first in top_k_renormalised(top_logprobs_after(ar_url, prompt, 2 * k), k, False).items():
        ranked = top_logprobs_after(ar_url, prompt + [first], 2 * k)
        tied += ranked[k - 1][0] == ranked[k][0]
        for second, p_second in top_k_renormalised(ranked, k, keep_ties).items():
            marginal[second] += p_first * p_second
    return dict(marginal), tied


def goodness_of_fit_pvalue(sample: list[int], expected: dict[int, float]) -> float:
    """Chi-square test that ``sample`` was drawn from ``expected`` (tokens expected fewer than 5 times pooled with
    tokens ``expected`` does not hold)."""
    from scipy.stats import chisquare

    counts, n = Counter(sample), len(sample)
    common = [t for t, p in expected.items() if p * n >= 5]
    observed = [counts[t] for t in common] + [n - sum(counts[t] for t in common)]
    predicted = [expected[t] * n for t in common] + [max(n - sum(expected[t] * n for t in common), 1e-9)]
    scale = n / sum(predicted)  # the pooled bin's floor keeps the totals a hair apart
    return float(chisquare(observed, [p * scale for p in predicted])[1])
