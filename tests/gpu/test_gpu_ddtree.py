"""GPU suite (H200): DDTree is lossless under CUDA graphs, batching and aborts, on flashinfer and triton.

Tiny random models with a 64-token vocabulary (``tests/tiny_models.py``: ``qwen3_v64`` + ``dflash_v64``, block
8), so that the random drafter's trees are often accepted beyond their root. Each backend gets an AR server and
three DDTree servers, all with the radix cache off: budget 16 with CUDA graphs plus the graph-vs-eager verify
check (``SGLANG_DDTREE_CHECK_GRAPH_VERIFY=1``), budget 16 without CUDA graphs, and ``--budget auto`` with graphs
and the same check (a step time table under which it verifies bonus-only, narrow and widest trees, each width
through verify graphs of its own: ``SGLANG_DDTREE_AUTO_VERIFY_GRAPHS=1``), and ``--budget auto`` as the launcher
runs it by default (a 32-node tree, step times measured by the server on its first steps, same check).

Exactness in bfloat16 is judged by AR's top-2 margin at the first differing token (``lossless.py``); token
identity in float32 is the CPU suite's test (tests/test_ddtree_cpu.py).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import pytest

from lossless import (
    GRAPH_CHECK_ARGMAX_MISMATCH_RATE,
    GRAPH_CHECK_MAX_ABS_DIFF,
    SAMPLING_ALPHA,
    assert_abort_leaves_the_others_lossless,
    assert_lossless,
    generate_all,
    sampled_pvalues,
)
from suite_servers import auto_budget_args, mem_fraction_flags, prefill_graph_flags, started_servers, url_of
from sglang_ddtree.env_flags import env_flag
from sglang_ddtree.serving import ServerStartError, free_port, launched_server
from support import http_json, record

pytestmark = pytest.mark.gpu

MODELS = os.environ.get("GPU_SUITE_MODELS", "/tmp/tiny_models")
BACKENDS = [b for b in os.environ.get("GPU_SUITE_BACKENDS", "flashinfer,triton").split(",") if b]
BUDGET = 16
CONCURRENT = 16
NEW_TOKENS = 320  # several KV reservation rounds per request (block 8 -> 2 x 17 slots reserved per step)
PROMPTS = [[(11 * i + 5 * j) % 60 + 4 for j in range(length)] for i, length in enumerate(range(3, 3 + 7 * CONCURRENT, 7))]
H200_MEM_SHARE = 0.06
FLAGS = [
    "--context-length", "2048",
    "--max-total-tokens", "65536",
    "--max-running-requests", str(CONCURRENT),
    "--cuda-graph-max-bs", str(CONCURRENT),
    "--sampling-backend", "pytorch",
    "--grammar-backend", "none",
    *prefill_graph_flags(),
    "--disable-radix-cache",
]  # fmt: skip
SERVERS = {
    "ar": (["--algo", "ar"], {}),
    "ddtree_graphs": (["--algo", "ddtree"], {"SGLANG_DDTREE_CHECK_GRAPH_VERIFY": "1"}),
    "ddtree_eager": (["--algo", "ddtree", "--disable-cuda-graph"], {}),
    "ddtree_auto": (["--algo", "ddtree"], {"SGLANG_DDTREE_CHECK_GRAPH_VERIFY": "1", "SGLANG_DDTREE_AUTO_VERIFY_GRAPHS": "1"}),
    "ddtree_measured": (["--algo", "ddtree", "--budget", "auto"],
                        {"SGLANG_DDTREE_CHECK_GRAPH_VERIFY": "1", "SGLANG_DDTREE_AUTO_VERIFY_GRAPHS": "1"}),
}
MEASURED_WIDTHS = [1, 2, 4, 8, 16, 33]
AUTO_WIDTHS = [1, 2, 4, 8, BUDGET + 1]


@pytest.fixture(scope="module")
def servers(request, tmp_path_factory):
    """{(kind, backend): url or an error string}; the servers the selected tests use start side by side (a ``-k``
    run starts only those)."""
    auto_args = auto_budget_args(str(tmp_path_factory.mktemp("auto_budget")), AUTO_WIDTHS)

    def launch(kind: str, backend: str) -> tuple[list[str], dict[str, str]]:
        algo_args, env = SERVERS[kind]
        args = [*algo_args, "--model-path", f"{MODELS}/qwen3_v64", "--attention-backend", backend,
                "--dtype", "bfloat16", *FLAGS, *mem_fraction_flags(H200_MEM_SHARE)]  # fmt: skip
        if kind != "ar":
            budget = {"ddtree_auto": auto_args, "ddtree_measured": []}.get(kind, ["--budget", str(BUDGET)])
            args += ["--draft-model-path", f"{MODELS}/dflash_v64", *budget]
        return args, env

    yield from started_servers(request, launch, "ddtree", ready_timeout=420)


@pytest.fixture(scope="module")
def ar_outputs(servers):
    """AR's greedy outputs of ``PROMPTS`` on each backend with an AR server up."""
    return {backend: [o["output_ids"] for o in generate_all(url_of(servers, "ar", backend), PROMPTS, NEW_TOKENS)]
            for kind, backend in servers if kind == "ar"}  # fmt: skip


@pytest.mark.servers("ar")
@pytest.mark.parametrize("kind", ["ddtree_graphs", "ddtree_eager", "ddtree_auto", "ddtree_measured"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_ddtree_greedy_equals_ar_for_16_concurrent_long_requests(servers, ar_outputs, backend, kind):
    url = url_of(servers, kind, backend)
    info = http_json(url + "/server_info")
    assert info["internal_states"][0]["speculative_algorithm"] == "DDTREE"
    assert info["disable_cuda_graph"] is (kind == "ddtree_eager")
    outputs = generate_all(url, PROMPTS, NEW_TOKENS)
    got = [o["output_ids"] for o in outputs]
    metas = [o["meta_info"] for o in outputs]
    assert all(len(ids) == NEW_TOKENS for ids in got)
    accepted = sum(m["spec_num_correct_drafts"] for m in metas)
    verifies = sum(m["spec_verify_ct"] for m in metas)
    record({"test": "ddtree_acceptance", "kind": kind, "backend": backend, "verifies": verifies,
            "accepted_drafts": accepted, "mean_accept_length": round(NEW_TOKENS * len(metas) / verifies, 3)})  # fmt: skip
    assert accepted > 0
    if env_flag("SGLANG_DDTREE_LEAN_VERIFY", default=True):  # the servers inherit it: the package's greedy verify
        lean = http_json(url + "/server_info")["internal_states"][0]["ddtree_lean_verify"]
        record({"test": "ddtree_lean_verify", "kind": kind, "backend": backend, **lean})
        assert lean["lean"] >= verifies / len(PROMPTS), lean  # at least one batch verify per 16 request verifies
    if kind == "ddtree_auto":
        assert_every_width_replayed_its_own_graphs(url, backend, AUTO_WIDTHS)
    if kind == "ddtree_measured":
        auto = assert_every_width_replayed_its_own_graphs(url, backend, MEASURED_WIDTHS)
        assert "16" in auto["measured_step_ms"], auto  # sixteen requests at a time: bucket 16 was measured
        assert all(steps > 0 for steps in auto["steps"]), auto
    assert_lossless(backend, url_of(servers, "ar", backend), PROMPTS, ar_outputs[backend], got, kind)


def assert_every_width_replayed_its_own_graphs(url: str, backend: str, widths: list[int]) -> dict:
    """Under --budget auto each width's verifies replay graphs captured for that width (no batch here exceeds the
    captured batch sizes), and each replay equals an eager re-run of the same verify. Returns the auto report."""
    state = http_json(url + "/server_info")["internal_states"][0]
    auto, check = state["ddtree_budget_auto"], state["ddtree_graph_verify_check"]
    record({"test": "ddtree_auto_widths", "backend": backend, **auto, "graph_check": check,
            "plans": state.get("ddtree_flashinfer_plans")})  # fmt: skip
    assert sum(steps > 0 for steps in auto["steps"]) >= 2, auto
    assert auto["graph_widths"] == widths, auto
    assert auto["graph_replays"] == auto["steps"], auto
    assert check["verifies"] == sum(auto["graph_replays"]), (check, auto)
    assert check["max_abs_diff"] <= GRAPH_CHECK_MAX_ABS_DIFF
    assert check["argmax_mismatches"] <= GRAPH_CHECK_ARGMAX_MISMATCH_RATE * check["rows"]
    if backend == "flashinfer":  # every width's replays were planned without reading the device
        assert verify_plans_from_host_lengths(state) >= check["verifies"], state
    return auto


def verify_plans_from_host_lengths(state: dict) -> int:
    """Tree verifies a FlashInfer server planned from host lengths, in whichever form it verifies: split
    (flashinfer_split_verify, the default on dense targets) or one FULL mask (flashinfer_tree_plan)."""
    split = state.get("ddtree_split_verify_attention")
    return split["split_verify_plans_from_host_lengths"] if split else state["ddtree_flashinfer_plans"]["sync_free_plans"]


@pytest.mark.servers("ar", "ddtree_graphs")
@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_replayed_tree_verify_equals_eager_verify(servers, ar_outputs, backend):
    """Every tree verify and draft block that replayed a CUDA graph was re-run eagerly on the same batch by the
    server."""
    url = url_of(servers, "ddtree_graphs", backend)
    generate_all(url, PROMPTS[:4], NEW_TOKENS)
    state = http_json(url + "/server_info")["internal_states"][0]
    check = state["ddtree_graph_verify_check"]
    record({"test": "ddtree_graph_check", "backend": backend, **check, "plans": state.get("ddtree_flashinfer_plans")})
    draft = state["ddtree_graph_draft_check"]
    record({"test": "ddtree_graph_draft_check", "backend": backend, **draft})
    if backend == "flashinfer":  # the replays were planned without reading the device (flashinfer_tree_plan), the
        plans = state["ddtree_flashinfer_plans"]  # verifies in the split form (flashinfer_split_verify) unless off
        split = state.get("ddtree_split_verify_attention")
        record({"test": "ddtree_split_verify_plans", "backend": backend, **(split or {})})
        assert verify_plans_from_host_lengths(state) >= check["verifies"], (split, plans)
        assert plans["sync_free_draft_plans"] >= draft["blocks"], plans
    assert check["verifies"] > 0 and check["rows"] >= check["verifies"] * (BUDGET + 1)
    assert check["max_abs_diff"] <= GRAPH_CHECK_MAX_ABS_DIFF
    assert check["argmax_mismatches"] <= GRAPH_CHECK_ARGMAX_MISMATCH_RATE * check["rows"]
    # The drafter's hidden states of each replayed draft block, against an eager re-run (same bound as logits).
    assert draft["blocks"] > 0 and draft["max_abs_diff"] <= GRAPH_CHECK_MAX_ABS_DIFF, draft


@pytest.mark.servers("ar", "ddtree_graphs")
@pytest.mark.parametrize("backend", BACKENDS)
def test_aborted_request_leaves_the_others_lossless(servers, ar_outputs, backend):
    assert_abort_leaves_the_others_lossless(url_of(servers, "ddtree_graphs", backend), url_of(servers, "ar", backend),
                                            backend, PROMPTS, ar_outputs[backend], NEW_TOKENS)  # fmt: skip


SAMPLES = 8000
SAMPLED_TOKENS = 4


@pytest.mark.servers("ar")
@pytest.mark.parametrize(
    "sampling", [{"temperature": 1.0}, {"temperature": 1.0, "top_p": 0.8}, {"temperature": 1.0, "top_k": 8}],
    ids=["temperature-1", "top-p-0.8", "top-k-8"],
)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["ddtree_graphs", "ddtree_auto"])
def test_sampled_tokens_follow_the_targets_distribution(servers, backend, sampling, kind):
    """DDTree's sampled tree verification keeps the target's distribution.

    8000 samples of 4 tokens per side from one prompt; the first token comes from the prefill, tokens 2-4
    from tree verification. Each position's token distribution is compared with AR's by a chi-square
    homogeneity test at alpha = 1e-3 (9 tests per backend and server: false alarm <= 1% each). Power, simulated for 64-token
    distributions with mass moved onto the top token: 0.92 against a total-variation shift of 0.046 when the
    logits are ~N(0, 1), 0.52 against 0.045 for peakier ones (~N(0, 4)); a verification that fell back to
    greedy moves most of the mass and is always caught.
    """
    pvalues, histograms = sampled_pvalues(url_of(servers, "ar", backend), url_of(servers, kind, backend),
                                          PROMPTS[3], sampling, samples=SAMPLES, tokens=SAMPLED_TOKENS)  # fmt: skip
    record({"test": "ddtree_sampling", "kind": kind, "backend": backend, **sampling, "samples": SAMPLES,
            "pvalues": pvalues, "histograms": histograms})  # fmt: skip
    assert all(p >= SAMPLING_ALPHA for p in pvalues), pvalues


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


@pytest.fixture(scope="module")
def tp_servers():
    """AR and DDTree (tree check on) with --tp 2 on flashinfer; {kind: url or an error string}."""
    base = ["--model-path", f"{MODELS}/qwen3_v64", "--attention-backend", "flashinfer", "--dtype", "bfloat16",
            "--tp", "2", *FLAGS, *mem_fraction_flags(H200_MEM_SHARE)]  # fmt: skip
    configs = {
        "ar": (["--algo", "ar", *base], {}),
        "ddtree": (["--algo", "ddtree", *base, "--draft-model-path", f"{MODELS}/dflash_v64", "--budget", str(BUDGET)],
                   {"SGLANG_DDTREE_CHECK_TP_TREES": "1"}),
    }  # fmt: skip

    def start(stack: ExitStack, kind: str):
        args, env = configs[kind]
        try:
            return kind, stack.enter_context(launched_server(args, free_port(), env=env, ready_timeout=420))
        except ServerStartError as e:
            return kind, str(e)

    with ExitStack() as stack, ThreadPoolExecutor(len(configs)) as pool:
        yield dict(pool.map(lambda kind: start(stack, kind), configs))


@pytest.mark.skipif(_gpu_count() < 2, reason="needs two GPUs (the nvidia-h200-x2 machine)")
def test_tensor_parallel_ranks_build_identical_trees_and_match_ar(tp_servers):
    """TP=2 with CUDA graphs: every rank's tree is compared after every build (all-gathered), and the
    output follows AR's under the bf16 margin rule."""
    ar_url, ddtree_url = tp_servers["ar"], tp_servers["ddtree"]
    assert ar_url.startswith("http://") and ddtree_url.startswith("http://"), (ar_url, ddtree_url)
    expected = [o["output_ids"] for o in generate_all(ar_url, PROMPTS, NEW_TOKENS)]
    outputs = generate_all(ddtree_url, PROMPTS, NEW_TOKENS)
    assert_lossless("flashinfer", ar_url, PROMPTS, expected, [o["output_ids"] for o in outputs], "tp2")
    check = http_json(ddtree_url + "/server_info")["internal_states"][0]["ddtree_tp_tree_check"]
    record({"test": "ddtree_tp_tree_check", **check})
    assert check["ranks"] == 2 and check["trees"] > 0 and check["disagreements"] == 0
    assert sum(o["meta_info"]["spec_num_correct_drafts"] for o in outputs) > 0
