"""GPU suite (H200) on the reference user's model family: DDTree on a Qwen3.5/3.6 hybrid target is lossless.

The target is ``tests/tiny_models.py``'s ``qwen35`` (2 x (3 Gated DeltaNet + 1 gated full attention) layers at
the real head dims, an MTP layer, a 64-token vocabulary), the drafter ``dflash_swa`` (a causal sliding-window
layer and a full-attention one, like z-lab's Qwen3.6 drafters). Tree verification through GDN layers runs
SGLang's tree path: a conv window and SSM state per tree node, the last accepted node's committed. On flashinfer the
attention layers verify the tree in the split form (``flashinfer_split_verify``), as on dense targets.

Per backend: AR and DDTree (budget 16) with the radix cache off, DDTree with CUDA graphs (graph-vs-eager verify
check on) and without, with the snapshot-free GDN verify (``ddtree_wy``), under ``--budget auto`` with verify
graphs per width (``ddtree_auto``, a fixed step table that makes it pick several widths), and DDTree with the
radix cache on (extra_buffer GDN snapshots), also with the snapshot-free verify. On flashinfer also MTP
and DFLASH on the same target, and DDTree and DFLASH on the text-only arch ``qwen35_text`` (the same weights).
Requests are 16 concurrent greedy generations of 320 tokens after prompts of 3-108 tokens: past the 256-token
mamba-track interval of the prefix cache. Exactness in bfloat16 is judged by AR's top-2 margin (``lossless.py``);
token identity in float32 is tests/test_hybrid_cpu.py's.
"""

from __future__ import annotations

import os
import urllib.request

import pytest

from lossless import (
    GRAPH_CHECK_ARGMAX_MISMATCH_RATE,
    GRAPH_CHECK_MAX_ABS_DIFF,
    SAMPLING_ALPHA,
    assert_abort_leaves_the_others_lossless,
    assert_lossless,
    generate,
    generate_all,
    goodness_of_fit_pvalue,
    sampled_pvalues,
    second_token_marginal,
)
from suite_servers import auto_budget_args, mem_fraction_flags, prefill_graph_flags, started_servers, url_of
from sglang_ddtree.env_flags import env_flag
from support import http_json, record

pytestmark = pytest.mark.gpu

MODELS = os.environ.get("GPU_SUITE_MODELS", "/tmp/tiny_models")
BACKENDS = [b for b in os.environ.get("GPU_SUITE_BACKENDS", "flashinfer,triton").split(",") if b]
FLASHINFER_ONLY = [b for b in BACKENDS if b == "flashinfer"]  # MTP, DFLASH and the text-only arch
BUDGET = 16
CONCURRENT = 16
SERVER_BATCH = 64  # the sampling tests' 8000 requests run 64 at a time
NEW_TOKENS = 320
PROMPTS = [[(13 * i + 7 * j) % 60 + 4 for j in range(length)] for i, length in enumerate(range(3, 3 + 7 * CONCURRENT, 7))]
H200_MEM_SHARE = 0.08  # 0.05 left no KV room when a neighbour allocated during the load
FLAGS = [
    "--context-length", "2048",
    "--max-total-tokens", "65536",
    "--max-running-requests", str(SERVER_BATCH),
    "--cuda-graph-max-bs", str(SERVER_BATCH),
    "--sampling-backend", "pytorch",
    "--grammar-backend", "none",
    *prefill_graph_flags(),
    "--skip-tokenizer-init",
    "--dtype", "bfloat16",  # GDN conv states are bfloat16; the float32 config would be served in float16
]  # fmt: skip
TARGET, TEXT_TARGET, DRAFTER = f"{MODELS}/qwen35", f"{MODELS}/qwen35_text", f"{MODELS}/dflash_swa"
DDTREE = ["--algo", "ddtree", "--draft-model-path", DRAFTER, "--budget", str(BUDGET)]
NO_RADIX = ["--disable-radix-cache"]
# SGLang's per-node GDN snapshots; the snapshot-free verify (the default since 2026-12-06) is the `ddtree_wy` kinds.
SNAPSHOTS = {"SGLANG_DDTREE_GDN_WY_VERIFY": "0"}
SERVERS = {  # kind: (launcher arguments, environment)
    "ar": (["--algo", "ar", "--model-path", TARGET, *NO_RADIX], {}),
    "ddtree_graphs": ([*DDTREE, "--model-path", TARGET, *NO_RADIX],
                      {**SNAPSHOTS, "SGLANG_DDTREE_CHECK_GRAPH_VERIFY": "1"}),
    "ddtree_eager": ([*DDTREE, "--model-path", TARGET, *NO_RADIX, "--disable-cuda-graph"], SNAPSHOTS),
    "ddtree_radix": ([*DDTREE, "--model-path", TARGET], SNAPSHOTS),
    "ddtree_wy_radix": ([*DDTREE, "--model-path", TARGET], {"SGLANG_DDTREE_GDN_WY_VERIFY": "1"}),
    # issue 17's snapshot-free GDN tree verify, graph replays checked against eager re-runs too
    "ddtree_wy": ([*DDTREE, "--model-path", TARGET, *NO_RADIX],
                  {"SGLANG_DDTREE_GDN_WY_VERIFY": "1", "SGLANG_DDTREE_CHECK_GRAPH_VERIFY": "1"}),
    # --budget auto with verify graphs per width (a GDN backend per width; the default since this passed with the
    # WY verify in run 85, named here so the test keeps them), suite_servers.AUTO_STEP_MS's table (the budget
    # arguments are added by the servers fixture)
    "ddtree_auto": ([*DDTREE[:-2], "--model-path", TARGET, *NO_RADIX],
                    {"SGLANG_DDTREE_AUTO_VERIFY_GRAPHS": "1", "SGLANG_DDTREE_CHECK_GRAPH_VERIFY": "1"}),
    "mtp": (["--algo", "mtp", "--model-path", TARGET, *NO_RADIX], {}),
    "dflash": (["--algo", "dflash", "--model-path", TARGET, "--draft-model-path", DRAFTER, *NO_RADIX], {}),
    "ddtree_text": ([*DDTREE, "--model-path", TEXT_TARGET, *NO_RADIX], {}),
    "dflash_text": (["--algo", "dflash", "--model-path", TEXT_TARGET, "--draft-model-path", DRAFTER, *NO_RADIX], {}),
}  # fmt: skip


AUTO_WIDTHS = [1, 2, 4, 8, BUDGET + 1]


@pytest.fixture(scope="module")
def servers(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """{(kind, backend): url or an error string}; the servers the selected tests use start side by side (a ``-k``
    run starts only those)."""
    auto_args = auto_budget_args(str(tmp_path_factory.mktemp("auto_budget")), AUTO_WIDTHS)

    def launch(kind: str, backend: str) -> tuple[list[str], dict[str, str]]:
        args, env = SERVERS[kind]
        return [*args, *(auto_args if kind == "ddtree_auto" else []), "--attention-backend", backend, *FLAGS,
                *mem_fraction_flags(H200_MEM_SHARE)], env

    yield from started_servers(request, launch, "hybrid", ready_timeout=480)


@pytest.fixture(scope="module")
def ar_outputs(servers):
    """AR's greedy outputs of ``PROMPTS`` on each backend with an AR server up."""
    return {backend: [o["output_ids"] for o in generate_all(url_of(servers, "ar", backend), PROMPTS, NEW_TOKENS)]
            for kind, backend in servers if kind == "ar"}  # fmt: skip


def check_greedy(servers, ar_outputs, kind: str, backend: str, algorithm: str) -> list[dict]:
    url = url_of(servers, kind, backend)
    assert http_json(url + "/server_info")["internal_states"][0]["speculative_algorithm"] == algorithm
    outputs = generate_all(url, PROMPTS, NEW_TOKENS)
    metas = [o["meta_info"] for o in outputs]
    assert all(len(o["output_ids"]) == NEW_TOKENS for o in outputs)
    verifies = sum(m["spec_verify_ct"] for m in metas)
    accepted = sum(m["spec_num_correct_drafts"] for m in metas)
    record({"test": "hybrid_acceptance", "kind": kind, "backend": backend, "verifies": verifies,
            "accepted_drafts": accepted, "mean_accept_length": round(NEW_TOKENS * len(metas) / verifies, 3)})  # fmt: skip
    assert accepted > 0  # otherwise a bonus-only verify would pass too
    if algorithm == "DDTREE" and backend == "flashinfer":  # the attention layers verified the tree split, the
        split = http_json(url + "/server_info")["internal_states"][0].get("ddtree_split_verify_attention")
        record({"test": "hybrid_split_verify_plans", "kind": kind, "backend": backend, **(split or {})})
        assert split and split["split_verify_plans"] > 0, split
        if "--disable-cuda-graph" not in SERVERS[kind][0]:  # graph replays planned from the step's host lengths
            assert split["split_verify_plans_from_host_lengths"] > 0, split
    assert_lossless(backend, url_of(servers, "ar", backend), PROMPTS, ar_outputs[backend],
                    [o["output_ids"] for o in outputs], f"hybrid {kind}")  # fmt: skip
    return metas


@pytest.mark.servers("ar")
@pytest.mark.parametrize("kind", ["ddtree_graphs", "ddtree_eager", "ddtree_radix", "ddtree_wy", "ddtree_auto"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_ddtree_greedy_equals_ar_for_16_concurrent_long_requests(servers, ar_outputs, backend, kind):
    metas = check_greedy(servers, ar_outputs, kind, backend, "DDTREE")
    assert max(len(m["spec_accept_histogram"]) for m in metas) <= 8  # at most one node per drafted depth (block 8)
    if env_flag("SGLANG_DDTREE_LEAN_VERIFY", default=True):  # the servers inherit it: the package's greedy verify
        lean = http_json(url_of(servers, kind, backend) + "/server_info")["internal_states"][0]["ddtree_lean_verify"]
        record({"test": "hybrid_lean_verify", "kind": kind, "backend": backend, **lean})
        verifies = sum(m["spec_verify_ct"] for m in metas)
        assert lean["lean"] >= verifies / len(metas), lean  # at least one batch verify per request's verifies
    if kind == "ddtree_auto":  # every width verified through graphs captured for it, each replay == eager re-run
        state = http_json(url_of(servers, kind, backend) + "/server_info")["internal_states"][0]
        auto, check = state["ddtree_budget_auto"], state["ddtree_graph_verify_check"]
        record({"test": "hybrid_auto_widths", "backend": backend, **auto, "graph_check": check})
        assert sum(steps > 0 for steps in auto["steps"]) >= 2, auto
        assert auto["graph_widths"] == AUTO_WIDTHS and auto["graph_replays"] == auto["steps"], auto
        assert check["verifies"] == sum(auto["graph_replays"]), (check, auto)
        assert check["max_abs_diff"] <= GRAPH_CHECK_MAX_ABS_DIFF
        assert check["argmax_mismatches"] <= GRAPH_CHECK_ARGMAX_MISMATCH_RATE * check["rows"]


@pytest.mark.servers("ar")
@pytest.mark.parametrize("kind, algorithm", [("mtp", "EAGLE"), ("dflash", "DFLASH")])
@pytest.mark.parametrize("backend", FLASHINFER_ONLY)
def test_mtp_and_dflash_serve_the_same_hybrid_target_losslessly(servers, ar_outputs, backend, kind, algorithm):
    check_greedy(servers, ar_outputs, kind, backend, algorithm)


@pytest.mark.servers("ar")
@pytest.mark.parametrize("kind, algorithm", [("ddtree_text", "DDTREE"), ("dflash_text", "DFLASH")])
@pytest.mark.parametrize("backend", FLASHINFER_ONLY)
def test_text_only_arch_serves_dflash_family_drafters(servers, ar_outputs, backend, kind, algorithm):
    """The text-only checkpoint holds the same language model as the multimodal one: AR's outputs apply."""
    check_greedy(servers, ar_outputs, kind, backend, algorithm)


@pytest.mark.servers()
@pytest.mark.parametrize("kind", ["ddtree_graphs", "ddtree_wy"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_replayed_tree_verify_equals_eager_verify(servers, ar_outputs, backend, kind):
    url = url_of(servers, kind, backend)
    generate_all(url, PROMPTS[:4], NEW_TOKENS)
    check = http_json(url + "/server_info")["internal_states"][0]["ddtree_graph_verify_check"]
    record({"test": "hybrid_graph_check", "backend": backend, **check})
    assert check["verifies"] > 0 and check["rows"] >= check["verifies"] * (BUDGET + 1)
    assert check["max_abs_diff"] <= GRAPH_CHECK_MAX_ABS_DIFF
    assert check["argmax_mismatches"] <= GRAPH_CHECK_ARGMAX_MISMATCH_RATE * check["rows"]


@pytest.mark.servers("ar")
@pytest.mark.parametrize("kind", ["ddtree_radix", "ddtree_wy_radix"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_prefix_cache_hit_gives_the_full_prefills_output(servers, ar_outputs, backend, kind):
    """A conversation's second turn reuses the first turn's cached prefix (its GDN state restored from an
    extra_buffer snapshot), and must continue as a full prefill of the same tokens does. With the snapshot-free
    GDN verify the track node's state is built by ``gdn_tree_commit`` into the track slot, not copied."""
    url, ar_url = url_of(servers, kind, backend), url_of(servers, "ar", backend)
    first_turn = PROMPTS[-1]
    answer = generate(url, first_turn, NEW_TOKENS)["output_ids"]
    second_turn = first_turn + answer + PROMPTS[2]
    hit = generate(url, second_turn, 64)
    with urllib.request.urlopen(url + "/flush_cache?timeout=60", timeout=120) as response:  # waits for idle
        assert response.status == 200
    full = generate(url, second_turn, 64)
    record({"test": "hybrid_prefix_cache", "kind": kind, "backend": backend, "cached_tokens_hit": hit["meta_info"]["cached_tokens"],
            "cached_tokens_full": full["meta_info"]["cached_tokens"], "prompt_tokens": len(second_turn)})  # fmt: skip
    assert hit["meta_info"]["cached_tokens"] >= len(first_turn)
    assert full["meta_info"]["cached_tokens"] == 0
    assert_lossless(backend, ar_url, [second_turn], [full["output_ids"]], [hit["output_ids"]], "prefix-cache hit")


@pytest.mark.servers("ar", "ddtree_graphs")
@pytest.mark.parametrize("backend", BACKENDS)
def test_aborted_request_leaves_the_others_lossless(servers, ar_outputs, backend):
    assert_abort_leaves_the_others_lossless(url_of(servers, "ddtree_graphs", backend), url_of(servers, "ar", backend),
                                            backend, PROMPTS, ar_outputs[backend], NEW_TOKENS)  # fmt: skip


@pytest.mark.servers("ar")
@pytest.mark.parametrize(
    "sampling", [{"temperature": 1.0}, {"temperature": 1.0, "top_p": 0.8}, {"temperature": 1.0, "top_k": 8}],
    ids=["temperature-1", "top-p-0.8", "top-k-8"],
)
@pytest.mark.parametrize("backend, kind", [*[(b, "ddtree_graphs") for b in BACKENDS],
                                           *[(b, kind) for b in FLASHINFER_ONLY for kind in ("ddtree_wy", "mtp")]])  # fmt: skip
def test_sampled_tokens_follow_the_targets_distribution(request, servers, backend, kind, sampling):
    """tests/gpu/test_gpu_ddtree.py's test (8000 samples of 4 tokens, chi-square per position at alpha 1e-3) on
    the hybrid target: tokens 2-4 come from tree verification through the GDN layers (SGLang's per-node snapshots,
    or the snapshot-free verify on ``ddtree_wy``). MTP (upstream NEXTN,
    the same sampled verify kernels on a chain) takes the same test, so a failure shared with the baseline
    points at SGLang's verify rather than at the tree.

    Top-k on flashinfer is expected to fail for both: this prompt has a context with an exact bf16 tie at the
    k-th logit, where SGLang's verify keeps every tied token and AR's sampler exactly k (RESULTS.md run 32;
    ``test_top_k_verify_keeps_every_token_tied_with_the_kth`` tests DDTree against the tie-keeping rule)."""
    if backend == "flashinfer" and "top_k" in sampling:
        request.node.add_marker(pytest.mark.xfail(reason="SGLang's verify keeps ties at the k-th logit", strict=False))
    pvalues, histograms = sampled_pvalues(url_of(servers, "ar", backend), url_of(servers, kind, backend), PROMPTS[3],
                                          sampling, samples=8000, tokens=4)  # fmt: skip
    record({"test": "hybrid_sampling", "backend": backend, "kind": kind, **sampling, "pvalues": pvalues,
            "histograms": histograms})  # fmt: skip
    assert all(p >= SAMPLING_ALPHA for p in pvalues), pvalues


@pytest.mark.servers("mtp", "ddtree_graphs")
@pytest.mark.parametrize("sampling", [{"temperature": 1.0, "top_k": 8}], ids=["top-k-8"])
@pytest.mark.parametrize("backend", FLASHINFER_ONLY)
def test_sampled_tokens_follow_the_mtp_baselines_distribution(servers, backend, sampling):
    """DDTree's sampled tree verify against upstream MTP's chain verify, which runs the same SGLang sampling
    kernels: where both differ from AR (top-k on flashinfer, RESULTS.md run 29), the tree must add nothing."""
    pvalues, histograms = sampled_pvalues(url_of(servers, "mtp", backend), url_of(servers, "ddtree_graphs", backend),
                                          PROMPTS[3], sampling, samples=8000, tokens=4)  # fmt: skip
    record({"test": "hybrid_sampling_vs_mtp", "backend": backend, **sampling, "pvalues": pvalues,
            "histograms": histograms})  # fmt: skip
    assert all(p >= SAMPLING_ALPHA for p in pvalues), pvalues


@pytest.mark.servers("ar", "ddtree_graphs")
@pytest.mark.parametrize("backend", FLASHINFER_ONLY)
def test_top_k_verify_keeps_every_token_tied_with_the_kth(servers, backend):
    """Why top-k 8 on flashinfer differs from AR for DDTree and MTP alike (RESULTS.md run 29): the second token's
    distribution predicted from AR's log-probabilities under SGLang's verify rule (``top_k_renorm_prob`` keeps
    every token tied with the k-th, bf16 logits tie often) must fit DDTree's samples. AR's samples are fitted
    against exact top-k too (recorded: where a context's k-th logprob is tied, exact top-k is not unique)."""
    ar_url, url = url_of(servers, "ar", backend), url_of(servers, "ddtree_graphs", backend)
    params = {"temperature": 1.0, "top_k": 8, "max_new_tokens": 2, "ignore_eos": True}
    samples = {name: [o["output_ids"][1] for o in http_json(u + "/generate", {"input_ids": [PROMPTS[3]] * 8000,
                                                                             "sampling_params": params}, timeout=900)]
               for name, u in (("ar", ar_url), ("ddtree", url))}  # fmt: skip
    fits = {}
    for rule, keep_ties in (("ties_kept", True), ("exact_k", False)):
        expected, tied_contexts = second_token_marginal(ar_url, PROMPTS[3], 8, keep_ties)
        fits[rule] = {name: goodness_of_fit_pvalue(sample, expected) for name, sample in samples.items()}
    record({"test": "hybrid_top_k_tie_rule", "backend": backend, "tied_contexts": tied_contexts, "fits": fits})
    assert fits["ties_kept"]["ddtree"] >= SAMPLING_ALPHA, fits
