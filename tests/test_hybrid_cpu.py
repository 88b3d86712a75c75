"""Qwen3.5/3.6 hybrid targets (Gated DeltaNet linear attention + gated full attention) on SGLang's CPU engine.

1. SGLang's greedy output is token-identical to HF transformers' float32 greedy, for the multimodal checkpoint
   arch the real models ship (``Qwen3_5ForConditionalGeneration``) and the text-only one.
2. DDTREE on the multimodal arch is token-identical to AR greedy on the same engine, alone and batched, with
   paths of two drafts and more accepted: tree verify through the GDN layers (each node's conv window and recurrent
   state continue from its parent's), the commit of the accepted path's states and the KV compaction are exact.
   The target's GDN states remember tens of tokens and its tokens depend on them, and the drafter is fitted to the
   target's continuations of the prompts (``tiny_models.fit_dflash_drafter``): faults in the snapshot-free verify
   and commit at depth 2 change the outputs (the fault tests, ``cpu_shims/ddtree_test_faults.py``).
3. Upstream NEXTN (the checkpoint's MTP layer, chain verify) and DFLASH are token-identical to AR greedy too.
4. The text-only arch drafts from the same target layers (same trees), and at TP=2, with the GDN heads split over
   the ranks, both ranks build the same trees and the output stays AR's.

Exactness is judged in float32 with the radix cache off. Under the Triton interpreter every kernel program runs in
Python, so a verify costs about (GDN layers x GDN heads x tree tokens) interpreted loops: ``CPU_SHAPE`` keeps the
real attention heads (dim 256, partial rotary, interleaved mRoPE) and shrinks GDN to one key/value head of dim
32 over 2 x (2 GDN + 1 attention) layers; 6 layers give the drafter three distinct target layers (1, 2, 3).
One value head per key head also takes SGLang's fused qkvz/ba split, the GPU path for those head ratios.
"""

import importlib
import json

import pytest
import torch

from sglang_ddtree.speculative.gdn_workspace_pool import workspace_slots
from sglang_ddtree.speculative.hybrid_tree_verify import WY_VERIFY_ENV
from support import (
    CONCURRENT_REQUESTS,
    CPU_ENGINE_ARGS,
    accepted_drafts_of_tree_verifies,
    assert_paths_past_the_first_draft,
    run_engine_generate,
)
from tiny_models import HybridShape, fit_dflash_drafter, make_qwen35_hybrid_target, make_swa_dflash_drafter

pytestmark = pytest.mark.slow

CPU_SHAPE = HybridShape(
    hidden_size=64, intermediate_size=128, num_layers=6, full_attention_interval=3, num_heads=2, num_kv_heads=1,
    linear_num_key_heads=1, linear_num_value_heads=1, linear_head_dim=32,
)  # fmt: skip
DRAFT_BLOCK_SIZE = 8  # both drafters'; the sliding-window one's window layer sees the last 16 positions
VOCAB = CPU_SHAPE.vocab_size
# Four prompts, two shorter and two longer than the drafter's window (16); the second one's generation crosses it.
PROMPTS = [[(7 * i + 3 * j) % (VOCAB - 4) + 4 for j in range(length)] for i, length in enumerate([3, 12, 19, 27])]
GREEDY = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}
# SGLang keeps GDN conv states in bfloat16 whatever the model dtype unless told otherwise. One OpenMP thread per
# engine: the interpreted kernels are single-threaded Python, and two engines share CI's two cores.
EXACT_ENV = {"SGLANG_MAMBA_CONV_DTYPE": "float32", "OMP_NUM_THREADS": "1"}
GDN_LAYERS, GDN_STATE_BYTES = 4, 1 * 32 * 32 * 4  # CPU_SHAPE's (2 in every 3 layers; one float32 head of dim 32)
GDN_CONV_INPUT_BYTES = 3 * 32 * 4  # one token's q, k and v (one head of dim 32 each), float32; a window is 3 of them


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The two archs of one language model; ``drafter``: fitted to its continuations of :data:`PROMPTS` (three target
    layers, 600 steps, ~50 s), whose trees are accepted two and three drafts deep (accept histogram [8, 4, 4, 8] over
    the verifies of the prompts alone and four at a time at budget 8, [8, 4, 2, 10] at 32; a random drafter's
    [19, 5, 0, 0] over the prompts alone never went past the first draft);
    ``swa_drafter``: random, z-lab's sliding-window layout, for DFLASH's window."""
    root = tmp_path_factory.mktemp("hybrid_models")
    text = make_qwen35_hybrid_target(str(root / "qwen35_text"), CPU_SHAPE, arch="Qwen3_5ForCausalLM")
    return {
        "multimodal": make_qwen35_hybrid_target(str(root / "qwen35"), CPU_SHAPE),
        "text": text,
        "drafter": fit_dflash_drafter(text, str(root / "dflash"), PROMPTS, DRAFT_BLOCK_SIZE, steps=600,
                                      random_prompts=16, lr=5e-3, num_features=3),
        "swa_drafter": make_swa_dflash_drafter(
            str(root / "dflash_swa"),
            target_num_layers=CPU_SHAPE.num_layers,
            hidden_size=CPU_SHAPE.hidden_size,
            vocab_size=VOCAB,
            block_size=DRAFT_BLOCK_SIZE,
        ),
    }


def exact_engine_args(target: str) -> dict:
    # A few mamba slots suffice for 4 requests; sized from free memory, the pool would take tens of thousands.
    return {**CPU_ENGINE_ARGS, "model_path": target, "attention_backend": "triton", "dtype": "float32",
            "disable_radix_cache": True, "max_mamba_cache_size": 8}  # fmt: skip


def generate(engine_args: dict, prompts=PROMPTS, modes=("sequential",), env: dict | None = None) -> dict:
    return run_engine_generate(engine_args, prompts, GREEDY, modes=modes, env={**EXACT_ENV, **(env or {})})


@pytest.fixture(scope="module")
def ar_outputs(models):
    return generate(exact_engine_args(models["multimodal"]))["sequential"]["output_ids"]


def hf_greedy(model_path: str) -> list[list[int]]:
    """HF's float32 greedy with the EOS a token like any other, as ``ignore_eos`` has it (``min_new_tokens`` would
    suppress it instead: the tiny target's first prompt continues with it)."""
    import transformers

    arch = transformers.AutoConfig.from_pretrained(model_path).architectures[0]
    model = getattr(transformers, arch).from_pretrained(model_path, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    outputs = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=GREEDY["max_new_tokens"], pad_token_id=0)  # fmt: skip
            outputs.append(out[0, len(prompt) :].tolist())
    return outputs


# pytest-xdist deals the tests out to its two workers in file order: the DDTREE runs, the longest, go first.


def snapshots_unless_wy(gdn_verify: str) -> dict[str, str]:
    """The environment of each GDN verify: the snapshot-free one is the default (no variable), so the ``wy`` cases
    test what a user gets, and their check that it ran fails should the default change; SGLang's per-node
    snapshots are asked for."""
    return {} if gdn_verify == "wy" else {WY_VERIFY_ENV: "0"}


@pytest.fixture(scope="module")
def ddtree_reports(models):
    """DDTREE on the multimodal arch, run once per (budget, GDN verify) and module worker, alone and concurrent."""
    reports = {}

    def report(budget: int, gdn_verify: str, verify: str = "lean") -> dict:
        if (budget, gdn_verify, verify) not in reports:
            env = {**snapshots_unless_wy(gdn_verify),
                   **({"SGLANG_DDTREE_LEAN_VERIFY": "0"} if verify == "sglang" else {})}  # fmt: skip
            reports[budget, gdn_verify, verify] = generate(
                {**exact_engine_args(models["multimodal"]), "speculative_algorithm": "DDTREE",
                 "speculative_draft_model_path": models["drafter"], "speculative_num_draft_tokens": budget + 1},
                modes=("sequential", "concurrent"), env=env or None,
            )  # fmt: skip
        return reports[budget, gdn_verify, verify]

    return report


# The budget-8 snapshot run also serves the text-only arch's comparison below: one worker runs both.
SHARES_THE_B8_RUN = pytest.mark.xdist_group("hybrid_ddtree_b8")


@pytest.mark.parametrize(
    "budget, gdn_verify, verify",
    [(32, "snapshots", "sglang"), pytest.param(8, "snapshots", "lean", marks=SHARES_THE_B8_RUN),
     (8, "wy", "sglang"), (8, "wy", "lean")],
)  # fmt: skip
def test_ddtree_greedy_equals_ar_greedy_alone_and_concurrent(models, ar_outputs, ddtree_reports, budget, gdn_verify,
                                                             verify):  # fmt: skip
    """``gdn_verify``: SGLang's per-node snapshot tree verify, or the snapshot-free one from the root state
    (``SGLANG_DDTREE_GDN_WY_VERIFY``, ``kernels/gdn_tree.py`` and ``gdn_tree_conv.py``), whose use the server
    reports, with its per-request buffers cut to the workspace's states (2 for the budget-8 tree, not 9), which
    also hold one conv input per node, not a window, and SGLang's memory sizing reserving just that: the states
    of the 7 other nodes and the windows go back to the KV cache. ``verify``: the package's greedy one (the
    default), which commits the GDN states of the path its own kernel accepts, or SGLang's EAGLE tree verification
    (``SGLANG_DDTREE_LEAN_VERIFY=0``)."""
    report = ddtree_reports(budget, gdn_verify, verify)
    state = report["scheduler_states"][0]
    if verify == "lean":
        assert state["ddtree_lean_verify"]["lean"] > 0 and state["ddtree_lean_verify"]["sglang"] == 0
    assert state["speculative_algorithm"] == "DDTREE"
    assert state["speculative_num_draft_tokens"] == budget + 1
    if gdn_verify == "wy":
        used = state["ddtree_gdn_wy_verify"]
        assert used["layer_verifies"] > 0 and used["layer_convs"] > 0 and used["commits"] > 0, used
        assert used["layer_convs"] == GDN_LAYERS * used["parents_fills"], used  # the parents once per verify
        buffers = used["intermediate_buffers"]  # per request slot
        nodes, slots = budget + 1, workspace_slots(budget + 1, HV=1, K=32, V=32, conv_input_bytes=GDN_CONV_INPUT_BYTES)
        assert (buffers["tree_nodes"], buffers["ssm_slots_per_request"]) == (nodes, slots) and slots < nodes
        assert buffers["reserved_bytes_per_request"] == buffers["bytes_per_request"]
        saved = GDN_LAYERS * (nodes * (GDN_STATE_BYTES + 3 * GDN_CONV_INPUT_BYTES) - slots * GDN_STATE_BYTES)
        assert buffers["snapshot_bytes_per_request"] - buffers["bytes_per_request"] == saved, buffers
    else:
        assert "ddtree_gdn_wy_verify" not in state
    assert report["sequential"]["output_ids"] == ar_outputs
    assert report["concurrent"]["output_ids"] == ar_outputs[:CONCURRENT_REQUESTS]
    modes = ("sequential", "concurrent")
    assert all(meta["spec_verify_ct"] >= 2 for mode in modes for meta in report[mode]["meta_info"])
    accepted_drafts_of_tree_verifies(report, modes, GREEDY["max_new_tokens"], DRAFT_BLOCK_SIZE)
    # Paths through depth 2 and deeper, once per prompt on average: their GDN states were verified and committed.
    assert_paths_past_the_first_draft(report, modes, at_least=len(PROMPTS))


@pytest.mark.parametrize("gdn_verify, widths", [("snapshots", [1, 9, 33]), ("wy", [1, 5, 9])], ids=["snapshots", "wy"])
def test_budget_auto_changes_the_gdn_verify_width_step_to_step_and_stays_exact(
    models, ar_outputs, tmp_path, gdn_verify, widths
):
    """``--budget auto`` on the hybrid target: the GDN tree verify (SGLang's per-node snapshots, or the
    snapshot-free one laid out for the widest tree whatever the step's width) and the state commit run at whatever
    width the step picked (bonus-only width 1 included), from the same per-request state slots; the output is AR's.
    The middle width verifies the first popped nodes of the widest tree (9 of 33: the budget-8 tree; 5 of 9)."""
    table = tmp_path / "steps.json"  # alone only the middle width pays; four at a time only bonus-only verifies do
    table.write_text(json.dumps({"widths": widths, "batch_sizes": [1, 4],
                                 "step_ms": [[1000.0, 1.0, 1000.0], [1.0, 1000.0, 1000.0]]}))  # fmt: skip
    env = {"SGLANG_DDTREE_STEP_TIME_TABLE": str(table), **snapshots_unless_wy(gdn_verify)}
    report = generate(
        {**exact_engine_args(models["multimodal"]), "speculative_algorithm": "DDTREE",
         "speculative_draft_model_path": models["drafter"], "speculative_num_draft_tokens": widths[-1]},
        modes=("sequential", "concurrent"), env=env,
    )  # fmt: skip
    assert report["sequential"]["output_ids"] == ar_outputs
    assert report["concurrent"]["output_ids"] == ar_outputs[:CONCURRENT_REQUESTS]
    state = report["scheduler_states"][0]
    steps = dict(zip(state["ddtree_budget_auto"]["widths"], state["ddtree_budget_auto"]["steps"]))
    narrow, middle, widest = widths
    assert steps[widest] >= 2 and steps[narrow] > 0 and steps[middle] > steps[widest], steps
    # Alone, every verify after the first two was a middle-width prefix: drafts accepted there went through the GDN
    # layers.
    assert sum(meta["spec_num_correct_drafts"] for meta in report["sequential"]["meta_info"]) > 0, steps
    if gdn_verify == "wy":
        used = state["ddtree_gdn_wy_verify"]
        assert used["layer_verifies"] > 0 and used["layer_convs"] > 0 and used["commits"] > 0, used
        assert used["intermediate_buffers"]["tree_nodes"] == widest, used


@SHARES_THE_B8_RUN
def test_text_only_arch_drafts_from_the_same_target_layers_as_the_multimodal_arch(models, ar_outputs, ddtree_reports):
    """SGLang's text-only wrapper cannot capture DFlash features; the plugin's hook gives it the multimodal
    wrapper's capture. Same language model, so the same drafter features, trees and accepted drafts (budget 8: the
    tree's width is not what this compares)."""
    text = generate({**exact_engine_args(models["text"]), "speculative_algorithm": "DDTREE",
                     "speculative_draft_model_path": models["drafter"], "speculative_num_draft_tokens": 9})["sequential"]
    multimodal = ddtree_reports(8, "snapshots")["sequential"]  # fmt: skip
    assert text["output_ids"] == multimodal["output_ids"] == ar_outputs
    histograms = [[m["spec_accept_histogram"] for m in run["meta_info"]] for run in (text, multimodal)]
    assert histograms[0] == histograms[1] and sum(m["spec_num_correct_drafts"] for m in text["meta_info"]) > 0


# GDN key and value heads split over two tensor-parallel ranks (CPU_SHAPE's single heads cannot be).
TP_SHAPE = HybridShape(
    hidden_size=64, intermediate_size=128, num_layers=6, full_attention_interval=3, num_heads=2, num_kv_heads=1,
    linear_num_key_heads=2, linear_num_value_heads=2, linear_head_dim=32,
)  # fmt: skip


@pytest.mark.parametrize("gdn_verify", ["snapshots", "wy"])
def test_tensor_parallel_ranks_build_identical_trees_through_the_gdn_layers(tmp_path, gdn_verify):
    """TP=2 on a hybrid target: each rank holds half the GDN heads, and the tree (built from the all-gathered
    top-K) must be the same on both, every step (SGLANG_DDTREE_CHECK_TP_TREES); output equals TP=1 AR. Through
    SGLang's per-node snapshots and through the snapshot-free verify (each rank its own heads' workspace)."""
    target = make_qwen35_hybrid_target(str(tmp_path / "qwen35"), TP_SHAPE)
    drafter = make_swa_dflash_drafter(str(tmp_path / "dflash_swa"), target_num_layers=TP_SHAPE.num_layers,
                                      hidden_size=TP_SHAPE.hidden_size, vocab_size=VOCAB)  # fmt: skip
    prompts = PROMPTS[2:]
    expected = generate(exact_engine_args(target), prompts)["sequential"]["output_ids"]
    report = run_engine_generate(
        {**exact_engine_args(target), "tp_size": 2, "speculative_algorithm": "DDTREE",
         "speculative_draft_model_path": drafter, "speculative_num_draft_tokens": 33},
        prompts, GREEDY, env={**EXACT_ENV, "SGLANG_CPU_OMP_THREADS_BIND": "0|1", "SGLANG_DDTREE_CHECK_TP_TREES": "1",
                              **snapshots_unless_wy(gdn_verify)},
    )  # fmt: skip
    assert report["sequential"]["output_ids"] == expected
    if gdn_verify == "wy":
        used = report["scheduler_states"][0]["ddtree_gdn_wy_verify"]
        assert used["layer_verifies"] > 0 and used["layer_convs"] > 0 and used["commits"] > 0, used
    check = report["scheduler_states"][0]["ddtree_tp_tree_check"]
    assert check["ranks"] == 2 and check["trees"] > 0 and check["disagreements"] == 0
    assert sum(meta["spec_num_correct_drafts"] for meta in report["sequential"]["meta_info"]) > 0


PREFIX_TRACK_INTERVAL = 16  # SGLang's mamba_track_interval (256 by default): GDN states tracked at multiples of it
TURN = {"max_new_tokens": 24, "temperature": 0.0, "ignore_eos": True}  # 27 + 24 tokens cross the tracked 32 and 48


@pytest.fixture(scope="module")
def two_turns(models):
    """A conversation on AR without a prefix cache: the first turn (the longest prompt), then the second turn's
    prompt (the first turn, its answer and another prompt) and its answer."""
    ar = exact_engine_args(models["multimodal"])
    first = PROMPTS[-1]
    answer = run_engine_generate(ar, [first], TURN, env=EXACT_ENV)["sequential"]["output_ids"][0]
    second = first + answer + PROMPTS[2]
    return {"prompts": [first, second], "answers": [answer] + run_engine_generate(
        ar, [second], TURN, env=EXACT_ENV)["sequential"]["output_ids"]}  # fmt: skip


@pytest.mark.xdist_group("hybrid_prefix_cache")  # one worker builds the two turns
@pytest.mark.parametrize("gdn_verify", ["snapshots", "wy"])
def test_a_prefix_cache_hit_continues_as_the_full_prefill_does(models, two_turns, gdn_verify):
    """The second turn reuses the first turn's cached prefix (the radix cache with SGLang's ``extra_buffer``
    strategy), whose GDN state and conv window a verify step tracked while decoding the first turn: at every multiple
    of ``mamba_track_interval`` the commit writes that node's into the request's track slot (with the snapshot-free
    verify ``gdn_tree_commit`` and ``gdn_tree_conv_commit`` build it from the root's, before the request's own
    commit replaces the root's). Both turns' tokens are AR's without a cache, and the hit reaches past the first
    turn's prompt, so the second turn started from a tracked state: committing none, or the root's, fails here."""
    report = run_engine_generate(
        {**exact_engine_args(models["multimodal"]), "speculative_algorithm": "DDTREE",
         "speculative_draft_model_path": models["drafter"], "speculative_num_draft_tokens": 9,
         "disable_radix_cache": False, "mamba_radix_cache_strategy": "extra_buffer",
         "mamba_track_interval": PREFIX_TRACK_INTERVAL},
        two_turns["prompts"], TURN, env={**EXACT_ENV, **snapshots_unless_wy(gdn_verify)},
    )  # fmt: skip
    run = report["sequential"]
    assert run["output_ids"] == two_turns["answers"]
    first_turn_length = len(two_turns["prompts"][0]) + TURN["max_new_tokens"]
    hit = run["meta_info"][1]["cached_tokens"]
    assert hit == first_turn_length // PREFIX_TRACK_INTERVAL * PREFIX_TRACK_INTERVAL > len(two_turns["prompts"][0])
    if gdn_verify == "wy":
        assert report["scheduler_states"][0]["ddtree_gdn_wy_verify"]["commits"] > 0


def test_the_tiny_hybrids_tokens_depend_on_its_gdn_layers_and_their_memory(models):
    """What lets the tests above see a wrong GDN state: along the tiny target's own greedy continuation of each
    prompt (HF, float32), the next-token argmax changes at most positions without its GDN layers' outputs
    (tiny_models.GDN_OUTPUT_GAIN; a random init's GDN layers changed 0-2 of 24), and at most positions when their
    states forget every earlier token (tiny_models.GDN_DT_RANGE; with the init's decay, e^-17 per token, a commit of
    the wrong node's state, even the root's, changed no output)."""
    import transformers

    model = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(models["multimodal"], dtype=torch.float32)
    model.eval()
    gdn_layers = [module for module in model.modules() if type(module).__name__.endswith("GatedDeltaNet")]
    gdn_scale = [1.0]
    for module in gdn_layers:
        module.register_forward_hook(lambda _module, _inputs, output: output * gdn_scale[0])
    decays = [module.A_log.data.clone() for module in gdn_layers]

    def next_tokens(sequence: torch.Tensor, start: int) -> torch.Tensor:
        return model(input_ids=sequence).logits[0, start - 1 : -1].argmax(-1)

    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            sequence = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                      max_new_tokens=24, min_new_tokens=24)  # fmt: skip
            with_gdn = next_tokens(sequence, len(prompt))
            gdn_scale[0] = 0.0
            without_gdn = next_tokens(sequence, len(prompt))
            gdn_scale[0] = 1.0
            for module in gdn_layers:
                module.A_log.data.fill_(20.0)  # decay exp(-e^20 dt) per token: the state holds the last token alone
            without_memory = next_tokens(sequence, len(prompt))
            for module, decay in zip(gdn_layers, decays):
                module.A_log.data.copy_(decay)
        assert int((with_gdn != without_gdn).sum()) >= 12, (prompt, with_gdn.tolist(), without_gdn.tolist())
        assert int((with_gdn != without_memory).sum()) >= 12, (prompt, with_gdn.tolist(), without_memory.tolist())


def test_prefill_delta_rule_reference_matches_sglang_recurrent_kernel():
    """The shim's plain-torch GDN prefill (SGLang's chunked FLA kernel cannot run on CPU in float32) is the
    recurrence of SGLang's Triton decode/verify kernel: same outputs and final states, for 3 value heads per key
    head and two sequences of different lengths starting from non-zero states in scattered slots."""
    from sgl_kernel.mamba import chunk_gated_delta_rule_cpu
    from sglang.kernels.ops.attention.fla.fused_gdn_gating import fused_gdn_gating
    from sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent import (
        fused_sigmoid_gating_delta_rule_update,
    )

    torch.manual_seed(0)
    heads, v_heads, dim, lengths = 2, 6, 32, [5, 9]
    tokens = sum(lengths)
    cu_seqlens = torch.tensor([0, lengths[0], tokens], dtype=torch.int32)
    q, k = torch.randn(1, tokens, heads, dim), torch.randn(1, tokens, heads, dim)
    v = torch.randn(1, tokens, v_heads, dim)
    a, b = torch.randn(tokens, v_heads), torch.randn(tokens, v_heads)
    A_log, dt_bias = torch.rand(v_heads), torch.rand(v_heads)
    states, slots = torch.randn(4, v_heads, dim, dim) * 0.1, torch.tensor([2, 0], dtype=torch.int32)

    kernel_states = states.clone()
    expected = fused_sigmoid_gating_delta_rule_update(
        A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_source=kernel_states,
        initial_state_indices=slots, cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=True, softplus_beta=1.0,
        softplus_threshold=20.0,
    )  # fmt: skip
    g, beta = fused_gdn_gating(A_log, a, b, dt_bias)
    reference_states = states.clone()
    out, _, _ = chunk_gated_delta_rule_cpu(
        q, k, v, g, beta, reference_states, cu_seqlens, use_qk_l2norm_in_kernel=True, initial_state_indices=slots
    )
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(reference_states, kernel_states, rtol=1e-5, atol=1e-5)


def test_multimodal_arch_ar_greedy_equals_hf_float32_greedy(models, ar_outputs):
    assert ar_outputs == hf_greedy(models["multimodal"])


def test_plain_torch_model_ops_equal_sglang_triton_kernels():
    """The shim's qkvz/ba split and output gate compute what SGLang's CUDA-path Triton kernels do, for the head
    ratios that take the fused split (1, 2 and 4 value heads per key head) and the strided q/gate view."""
    importlib.import_module("sgl_kernel")  # registers the torch.ops.sgl_kernel ops
    from sglang.kernels.ops.attention.triton_gdn_fused_proj import (
        fused_qkvzba_split_reshape_cat_contiguous,
    )
    from sglang.kernels.ops.elementwise.elementwise import fused_sigmoid_mul

    ops = torch.ops.sgl_kernel
    torch.manual_seed(0)
    for k_heads, v_heads, dim in [(1, 1, 32), (2, 4, 32), (2, 8, 16)]:
        qkvz, ba = torch.randn(5, 2 * (k_heads + v_heads) * dim), torch.randn(5, 2 * v_heads)
        ours = ops.fused_qkvzba_split_reshape_cat_contiguous_cpu(qkvz, ba, k_heads, v_heads, dim, dim)
        theirs = fused_qkvzba_split_reshape_cat_contiguous(qkvz, ba, k_heads, v_heads, dim, dim)
        assert all(torch.equal(x, y) for x, y in zip(ours, theirs))
    q_gate = torch.randn(6, 4 * 2 * 64).view(6, 4, 128)[..., 64:]  # the gate halves of interleaved [q_h, gate_h]
    attn = torch.randn(6, 256)
    torch.testing.assert_close(
        ops.fused_sigmoid_mul_cpu(attn.clone(), q_gate, inplace=True), fused_sigmoid_mul(attn.clone(), q_gate)
    )


def test_text_arch_ar_greedy_equals_hf_float32_greedy(models):
    expected = hf_greedy(models["text"])
    assert generate(exact_engine_args(models["text"]))["sequential"]["output_ids"] == expected


@pytest.mark.parametrize("algorithm", ["NEXTN", "DFLASH"])
def test_upstream_speculative_greedy_equals_ar_greedy(models, ar_outputs, algorithm):
    spec_args = {
        "NEXTN": {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4},
        "DFLASH": {"speculative_draft_model_path": models["swa_drafter"]},
    }[algorithm]
    engine_args = {**exact_engine_args(models["multimodal"]), "speculative_algorithm": algorithm, **spec_args}
    report = generate(engine_args, PROMPTS[2:])  # the two prompts longer than the drafter's window
    assert report["sequential"]["output_ids"] == ar_outputs[2:]
    assert all(meta["spec_verify_ct"] > 0 for meta in report["sequential"]["meta_info"])


@pytest.mark.parametrize(
    "fault", ["gdn_deep_nodes_skip_their_parent", "gdn_commit_one_node_short", "gdn_conv_commit_one_node_short"]
)
def test_the_greedy_comparison_fails_a_gdn_verify_with_a_fault_at_depth_two(models, ar_outputs, fault):
    """The exactness tests above can see a wrong snapshot-free GDN verify: a fault injected by the CPU shims
    (``cpu_shims/ddtree_test_faults.py``: nodes at depth 2 and deeper continuing from their grandparent's state,
    or the state or the conv window committed for an accepted node at depth 2 or deeper being its parent's)
    changes some of the four outputs (measured: 3, 3 and 3 of 4). With the init's decay (the state forgot each
    token) and a random drafter (paths never past depth 1) the commit fault passed as exact, even committing the
    root's state."""
    report = generate(
        {**exact_engine_args(models["multimodal"]), "speculative_algorithm": "DDTREE",
         "speculative_draft_model_path": models["drafter"], "speculative_num_draft_tokens": 9},
        env={"DDTREE_TEST_FAULT": fault},
    )  # fmt: skip
    differing = sum(out != ar for out, ar in zip(report["sequential"]["output_ids"], ar_outputs))
    assert differing > 0, f"{fault}: the exactness tests would pass a GDN verify with this fault"
