"""DDTree on a real SGLang engine (CPU): greedy output is token-identical to AR greedy.

Exactness is judged in float32 with the radix cache off, where it is well defined. The target's next token
depends on its context (``tiny_models.ATTENTION_QK_NORM_GAIN``) and the drafter is fitted to the target's
continuations of these prompts (``tiny_models.fit_dflash_drafter``), so steps accept paths of every depth of the
block and exercise the tree's mask, positions, acceptance and KV compaction; the fault tests at the end show that
a wrong position, mask row or KV move at depth 2 does change the outputs.
"""

import json

import pytest

from support import (
    CONCURRENT_REQUESTS,
    CPU_ENGINE_ARGS,
    accepted_drafts_of_tree_verifies,
    assert_paths_past_the_first_draft,
    run_engine_generate,
)
from tiny_models import TinyShape, fit_dflash_drafter, make_qwen3_target

pytestmark = pytest.mark.slow

TARGET_LAYERS = 4
BLOCK_SIZE = 4
# Eight prompts of different lengths (1 to 37 tokens).
VOCAB = 64
PROMPTS = [[(7 * i + 3 * j) % (VOCAB - 4) + 4 for j in range(length)] for i, length in enumerate([1, 3, 6, 9, 14, 20, 29, 37])]
GREEDY = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddtree_models")
    target = make_qwen3_target(str(root / "qwen3"), TinyShape(num_layers=TARGET_LAYERS, vocab_size=VOCAB))
    drafter = fit_dflash_drafter(target, str(root / "dflash"), PROMPTS, BLOCK_SIZE)
    return target, drafter


def exact_engine_args(target: str) -> dict:
    return {**CPU_ENGINE_ARGS, "model_path": target, "attention_backend": "triton", "dtype": "float32",
            "disable_radix_cache": True}  # fmt: skip


@pytest.fixture(scope="module")
def ar_outputs(models):
    target, _ = models
    return run_engine_generate(exact_engine_args(target), PROMPTS, GREEDY)["sequential"]["output_ids"]


@pytest.mark.parametrize("budget", [1, 8, 32])
def test_ddtree_greedy_equals_ar_greedy_alone_and_concurrent(models, ar_outputs, budget):
    target, drafter = models
    report = run_engine_generate(
        {
            **exact_engine_args(target),
            "speculative_algorithm": "DDTREE",
            "speculative_draft_model_path": drafter,
            "speculative_num_draft_tokens": budget + 1,
        },
        PROMPTS,
        GREEDY,
        modes=("sequential", "concurrent"),
    )
    assert report["scheduler_states"][0]["speculative_algorithm"] == "DDTREE"
    assert report["scheduler_states"][0]["speculative_num_draft_tokens"] == budget + 1
    assert report["sequential"]["output_ids"] == ar_outputs
    assert report["concurrent"]["output_ids"] == ar_outputs[:CONCURRENT_REQUESTS]
    modes = ("sequential", "concurrent")
    accepted_drafts_of_tree_verifies(report, modes, GREEDY["max_new_tokens"], BLOCK_SIZE)
    if budget >= 8:  # paths past depth 1 accepted, each prompt once on average, so depth 2's nodes were tested
        assert_paths_past_the_first_draft(report, modes, at_least=len(PROMPTS))


SGLANG_VERIFY = {"SGLANG_DDTREE_LEAN_VERIFY": "0"}  # every batch through SGLang's EAGLE verify


def test_the_lean_greedy_verify_is_greedy_exact_and_sampled_batches_take_sglangs(models, ar_outputs):
    """By default (``ddtree_greedy_verify``) all-greedy batches are verified by the package's own acceptance kernel, token-identical to AR alone and four at a time; the one sampled request (sent last,
    alone) goes through SGLang's EAGLE verify, which the server's tally shows."""
    target, drafter = models
    sampled = {**GREEDY, "temperature": 1.0, "top_k": 8}
    params = [GREEDY] * (len(PROMPTS) - 1) + [sampled]
    report = run_engine_generate(
        {**exact_engine_args(target), "speculative_algorithm": "DDTREE", "speculative_draft_model_path": drafter,
         "speculative_num_draft_tokens": 9},
        PROMPTS, params, modes=("sequential", "concurrent"),
    )  # fmt: skip
    assert report["sequential"]["output_ids"][:-1] == ar_outputs[:-1]
    assert report["concurrent"]["output_ids"] == ar_outputs[:CONCURRENT_REQUESTS]
    # batch verifies, the engine's warm-up request's and the concurrent batch's included
    verifies = report["scheduler_states"][0]["ddtree_lean_verify"]
    greedy_verifies = sum(meta["spec_verify_ct"] for meta in report["sequential"]["meta_info"][:-1])
    sampled_verifies = report["sequential"]["meta_info"][-1]["spec_verify_ct"]
    assert verifies["lean"] >= greedy_verifies > 0 and verifies["sglang"] >= sampled_verifies > 0, verifies
    modes = ("sequential", "concurrent")
    assert accepted_drafts_of_tree_verifies(report, modes, GREEDY["max_new_tokens"], BLOCK_SIZE) > 0


AUTO_WIDTHS = [1, 2, 4, 9]  # the widest, 9, is the server's tree: budget 8
# Alone, narrow trees pay (width 9 costs 3x); four at a time, nothing beats a bonus-only verify.
AUTO_STEP_MS = {1: [1.0, 1.02, 1.05, 3.0], 4: [1.0, 1000.0, 1000.0, 1000.0]}


@pytest.mark.parametrize("verify", ["sglang", "lean"])
def test_budget_auto_is_greedy_exact_at_every_width_it_picks(models, ar_outputs, tmp_path, verify):
    """``--budget auto``: each step verifies the first ``w - 1`` popped nodes of the widest tree (or, at width 1,
    the bonus token alone with the drafter skipped), ``w`` chosen from the step time table and the trees' path
    probabilities; whatever it picks, the output is AR's, and the server tallies the widths it verified. With
    SGLang's EAGLE verify (``SGLANG_DDTREE_LEAN_VERIFY=0``), and with the package's greedy one."""
    target, drafter = models
    table = tmp_path / "steps.json"
    table.write_text(json.dumps({"widths": AUTO_WIDTHS, "batch_sizes": list(AUTO_STEP_MS),
                                 "step_ms": list(AUTO_STEP_MS.values())}))  # fmt: skip
    report = run_engine_generate(
        {**exact_engine_args(target), "speculative_algorithm": "DDTREE", "speculative_draft_model_path": drafter,
         "speculative_num_draft_tokens": AUTO_WIDTHS[-1]},
        PROMPTS, GREEDY, modes=("sequential", "concurrent"),
        env={"SGLANG_DDTREE_STEP_TIME_TABLE": str(table), **(SGLANG_VERIFY if verify == "sglang" else {})},
    )  # fmt: skip
    assert report["sequential"]["output_ids"] == ar_outputs
    if verify == "lean":
        assert report["scheduler_states"][0]["ddtree_lean_verify"]["sglang"] == 0
    assert report["concurrent"]["output_ids"] == ar_outputs[:CONCURRENT_REQUESTS]
    auto = report["scheduler_states"][0]["ddtree_budget_auto"]
    assert auto["widths"] == AUTO_WIDTHS and auto["table"] == str(table)
    steps = dict(zip(auto["widths"], auto["steps"]))
    # The widest at start (two decisions in flight: nothing priced yet), then bonus-only and narrow verifies.
    assert steps[9] >= 2 and steps[1] > 0 and steps[2] + steps[4] > steps[9], steps
    accepted = [sum(meta["spec_num_correct_drafts"] for meta in report[mode]["meta_info"])
                for mode in ("sequential", "concurrent")]  # fmt: skip
    assert accepted[0] > 0, (accepted, steps)  # narrow trees were verified alone and drafts accepted


def test_tensor_parallel_ranks_build_identical_trees_and_stay_lossless(models, ar_outputs, tmp_path):
    """TP=2: each rank sees half of the LM head; the all-gathered top-K gives every rank the same tree. Under
    ``--budget auto``, so the ranks must also pick the same width at every step (a verify of another width on one
    rank would hang or corrupt the collective).

    Compared with single-GPU AR: float32 TP sums in another order, far below these models' logit gaps."""
    target, drafter = models
    prompts = PROMPTS[:CONCURRENT_REQUESTS]
    table = tmp_path / "steps.json"  # alone the widest tree pays, four at a time bonus-only verifies
    table.write_text(json.dumps({"widths": AUTO_WIDTHS, "batch_sizes": [1, 4],
                                 "step_ms": [[1000.0, 1000.0, 1000.0, 1.0], [1.0, 1000.0, 1000.0, 1000.0]]}))  # fmt: skip
    # SGLang's CPU engine binds one core per TP rank; the tree check compares the ranks' trees every step.
    env = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1", "SGLANG_DDTREE_CHECK_TP_TREES": "1",
           "SGLANG_DDTREE_STEP_TIME_TABLE": str(table)}  # fmt: skip
    report = run_engine_generate(
        {**exact_engine_args(target), "tp_size": 2, "speculative_algorithm": "DDTREE",
         "speculative_draft_model_path": drafter, "speculative_num_draft_tokens": AUTO_WIDTHS[-1]},
        prompts, GREEDY, modes=("sequential", "concurrent"), env=env,
    )  # fmt: skip
    assert report["sequential"]["output_ids"] == ar_outputs[:CONCURRENT_REQUESTS]
    assert report["concurrent"]["output_ids"] == ar_outputs[:CONCURRENT_REQUESTS]
    check = report["scheduler_states"][0]["ddtree_tp_tree_check"]
    assert check["ranks"] == 2 and check["trees"] > 0 and check["disagreements"] == 0
    auto = report["scheduler_states"][0]["ddtree_budget_auto"]
    assert sum(meta["spec_num_correct_drafts"] for meta in report["sequential"]["meta_info"]) > 0, auto
    steps = dict(zip(auto["widths"], auto["steps"]))
    assert steps[9] > 0 and steps[1] > 0, steps


def test_tensor_parallel_ranks_measure_one_step_time_row_and_pick_the_same_width_every_step(models, ar_outputs):
    """``--budget auto`` with step times measured by the server, at TP=2: the ranks measure the same widths at the
    same steps, agree on one row per batch size (each timed its own clock: the worker's mean over ranks) and then
    pick the same width at every step; a verify of another width on one rank would hang the collective or show in
    the tree check. The eight requests one after another give batch size 1 the steps its row needs."""
    target, drafter = models
    env = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1", "SGLANG_DDTREE_CHECK_TP_TREES": "1", "SGLANG_DDTREE_BUDGET_AUTO": "1"}
    report = run_engine_generate(
        {**exact_engine_args(target), "tp_size": 2, "speculative_algorithm": "DDTREE",
         "speculative_draft_model_path": drafter, "speculative_num_draft_tokens": AUTO_WIDTHS[-1]},
        PROMPTS, GREEDY, modes=("sequential",), env=env,
    )  # fmt: skip
    assert report["sequential"]["output_ids"] == ar_outputs
    check = report["scheduler_states"][0]["ddtree_tp_tree_check"]
    assert check["ranks"] == 2 and check["trees"] > 0 and check["disagreements"] == 0
    auto = report["scheduler_states"][0]["ddtree_budget_auto"]
    assert auto["widths"] == AUTO_WIDTHS and all(steps > 0 for steps in auto["steps"]), auto
    assert list(auto["measured_step_ms"]) == ["1"], auto


# SGLang's mean, or the package's per-width means (the budget-8 tree verifies 9 nodes; SGLang's knob stays on)
SIMULATED_MEAN_3_5 = {"mean": {"SGLANG_SIMULATE_ACC_LEN": "3.5"},
                      "by_width": {"SGLANG_SIMULATE_ACC_LEN": "1.2", "SGLANG_DDTREE_SIMULATE_ACC_BY_WIDTH": "5:2,9:3.5"}}


@pytest.mark.parametrize("verify, source", [("sglang", "mean"), ("lean", "mean"), ("lean", "by_width")])
def test_simulated_acceptance_commits_the_requested_mean_along_the_best_branch(models, verify, source):
    """``SGLANG_SIMULATE_ACC_LEN`` on DDTREE (cost-only, issue 18): SGLang's "match-expected" draw at 3.5 commits 3
    or 4 tokens per verify, half and half, along each tree's first-child branch. The test drafter's random weights
    give flat distributions, whose best-first trees are stars (a branch of one draft: at most 2 tokens); under the
    simulation the head scores each depth's top candidate as certain, so the branch spans the block (4 tokens)
    and the requested mean is what the verifies commit. The server keeps serving on the committed tokens, and it
    says that it simulates. The package's greedy verify (the default) simulates in its acceptance kernel, SGLang's
    in its own. With ``SGLANG_DDTREE_SIMULATE_ACC_BY_WIDTH`` the mean is the one given for the verify's width."""
    target, drafter = models
    engine = {**exact_engine_args(target), "speculative_algorithm": "DDTREE", "speculative_draft_model_path": drafter,
              "speculative_num_draft_tokens": 9}  # fmt: skip
    params = {**GREEDY, "max_new_tokens": 40}
    report = run_engine_generate(engine, PROMPTS, params,
                                 env={**SIMULATED_MEAN_3_5[source], **(SGLANG_VERIFY if verify == "sglang" else {})})
    simulated = report["scheduler_states"][0]["ddtree_simulated_acceptance"]
    if source == "mean":
        assert simulated["mean_accept_length"] == 3.5
    else:
        assert simulated["mean_accept_length_by_width"] == {"5": 2.0, "9": 3.5}
    metas = report["sequential"]["meta_info"]
    assert all(meta["completion_tokens"] == params["max_new_tokens"] for meta in metas)
    verifies = sum(m["spec_verify_ct"] for m in metas)
    drafts_per_verify = sum(m["spec_num_correct_drafts"] for m in metas) / verifies
    # ~90 draws of 2 or 3 drafts: 2.5 within 4 standard deviations (0.21), less where a request's last verify was
    # cut by max_new_tokens (at most one per request, ~11 verifies each)
    assert 2.5 - 0.35 <= drafts_per_verify <= 2.5 + 0.25, (drafts_per_verify, verifies)
    lean_path = report["scheduler_states"][0].get("ddtree_lean_verify")  # None where it is off
    if verify == "sglang":
        assert lean_path is None
    else:
        assert lean_path["lean"] >= verifies and lean_path["sglang"] == 0


@pytest.mark.parametrize("verify", ["sglang", "lean"])
def test_the_host_profile_times_each_verify_phase_once_per_verify(models, verify):
    """Run as ``bench.step_profile`` runs it (simulated acceptance, the host-timed ranges and the host profiler
    on; a short run, since profiling doubles an engine's time): each verify's phases and SGLang's verify
    functions inside it are timed once per verify, and the profile finds the worker's step and SGLang's verify
    inside the decode iterations. SGLang's path gathers the accepted predictions and hidden states to the front
    of each block and samples with ``eagle_sample``; the package's greedy verify (the default) does neither."""
    target, drafter = models
    engine = {**exact_engine_args(target), "speculative_algorithm": "DDTREE", "speculative_draft_model_path": drafter,
              "speculative_num_draft_tokens": 9}  # fmt: skip
    profiled = {**SIMULATED_MEAN_3_5["mean"], "SGLANG_DDTREE_TRACE_RANGES": "1", "SGLANG_DDTREE_HOST_PROFILE": "1"}
    report = run_engine_generate(engine, PROMPTS[:4], GREEDY,
                                 env={**profiled, **(SGLANG_VERIFY if verify == "sglang" else {})})
    verifies = sum(m["spec_verify_ct"] for m in report["sequential"]["meta_info"])
    host = report["scheduler_states"][0]["ddtree_host_ranges"]  # the server's warm-up verifies included
    verify_range = "run_eagle_verify" if verify == "sglang" else "run_greedy_tree_verify"
    inside = ("eagle_sample", "finalize_accept_tree_path") if verify == "sglang" else ("accept_tree_greedy",)
    phases = ("_draft_block", verify_range, "eagle_prepare_for_verify", *inside, "_append_committed_to_draft_kv")
    verify_calls = host[verify_range]["calls"]
    assert len({host[phase]["calls"] for phase in phases}) == 1 and verify_calls >= verifies > 0
    # the draft-context append also runs after each prefill
    assert host["append_target_hidden_to_draft_kv"]["calls"] > verify_calls
    assert 0 < host[inside[0]]["total_ms"] < host[verify_range]["total_ms"] < host["run_batch"]["total_ms"]
    assert host["move_accepted_kv"]["calls"] == verify_calls  # one KV move per verify
    assert host.get("compact_accept_to_front", {"calls": 0})["calls"] == (2 * verify_calls if verify == "sglang" else 0)
    assert host["draft_project_target_hidden"]["calls"] == host["append_target_hidden_to_draft_kv"]["calls"]
    profile = report["scheduler_states"][0]["ddtree_host_profile"]
    [step] = [row for label, row in profile["functions"].items()  # [calls, own ms]
              if label.startswith("sglang_ddtree/speculative/ddtree_worker.py:")
              and label.endswith("(forward_batch_generation)")]
    samples = [row for label, row in profile["functions"].items()
               if label.startswith("sglang/srt/speculative/eagle_utils.py:") and label.endswith("(eagle_sample)")]
    assert step[0] == profile["iterations"] == verify_calls  # one tree verify per decode step
    if verify == "sglang":
        assert samples[0][0] == step[0] and samples[0][1] > 0
    else:
        assert samples == [] and "eagle_sample" not in host
        assert report["scheduler_states"][0]["ddtree_lean_verify"] == {"lean": verify_calls, "sglang": 0}


@pytest.mark.parametrize("step_ms, means, settles_at", [
    ([1.0, 1.1, 1.2, 3.0], "2:1.5,4:3,9:3.5", 4),  # width 4: 3 tokens in 1.2 ms, 9: 3.5 in 3 ms
    ([1.0, 1.1, 1.2, 1.3], "2:1.5,4:2,9:3.5", 9),  # 9: 3.5 tokens in 1.3 ms, 4: 2 in 1.2 ms
], ids=["narrow-pays", "wide-pays"])  # fmt: skip
def test_budget_auto_under_per_width_simulation_settles_where_the_table_pays(models, tmp_path, step_ms, means,
                                                                            settles_at):  # fmt: skip
    """``--budget auto`` with ``SGLANG_DDTREE_SIMULATE_ACC_BY_WIDTH`` (issue 18's cost-only runs on random weights):
    each verify commits the mean given for its own width (a bonus-only step 1 token), and the policy learns each
    width from that width's own verifies, so it settles where the table's tokens per step time are highest. (A
    real tree's accepted path, cut to a narrower prefix, is what that prefix would have accepted; a simulated one
    is not, so here a wide verify does not price the narrower widths.)"""
    target, drafter = models
    table = tmp_path / "steps.json"
    table.write_text(json.dumps({"widths": AUTO_WIDTHS, "batch_sizes": [1], "step_ms": [step_ms]}))
    report = run_engine_generate(
        {**exact_engine_args(target), "speculative_algorithm": "DDTREE", "speculative_draft_model_path": drafter,
         "speculative_num_draft_tokens": AUTO_WIDTHS[-1]},
        PROMPTS, {**GREEDY, "max_new_tokens": 40},
        env={"SGLANG_DDTREE_STEP_TIME_TABLE": str(table), "SGLANG_SIMULATE_ACC_LEN": "1.2",
             "SGLANG_DDTREE_SIMULATE_ACC_BY_WIDTH": means},
    )  # fmt: skip
    state = report["scheduler_states"][0]
    assert state["ddtree_simulated_acceptance"]["mean_accept_length_by_width"] == {
        w: float(m) for w, m in (item.split(":") for item in means.split(","))}
    metas = report["sequential"]["meta_info"]
    assert all(meta["completion_tokens"] == 40 for meta in metas)
    steps = dict(zip(state["ddtree_budget_auto"]["widths"], state["ddtree_budget_auto"]["steps"]))
    # wide-pays: 89% at width 9 when measured, 79% while a wide verify also priced the narrower widths
    assert steps[settles_at] > 0.85 * sum(steps.values()), steps


def test_the_best_branch_is_the_first_child_chain_cut_at_the_drawn_length():
    import torch

    from sglang_ddtree.speculative.ddtree_simulation import best_branch_accept_index

    # Tree 0: 0 -> 1 -> 3 -> 4, with 2 a second child of 0. Tree 1: 0 -> 1, and 1 has no child.
    next_token = torch.tensor([[1, 3, -1, 4, -1], [1, -1, -1, -1, -1]])
    assert best_branch_accept_index(next_token, length=3, width=5).tolist() == [[0, 1, 3, -1, -1], [5, 6, -1, -1, -1]]
    assert best_branch_accept_index(next_token, length=9, width=4).tolist() == [[0, 1, 3, 4], [5, 6, -1, -1]]
    assert best_branch_accept_index(next_token, length=1, width=4).tolist() == [[0, -1, -1, -1], [5, -1, -1, -1]]


def test_the_simulated_commit_writes_the_branch_tokens_and_the_root_bonus_and_nothing_else(monkeypatch):
    """Each committed node's prediction is the next branch node's drafted token; the last one's is the root's
    candidate (the bonus); every other slot keeps its value (the write has no boolean index: no host read)."""
    import torch
    from sglang.srt.speculative import spec_utils

    from sglang_ddtree.speculative import ddtree_simulation
    monkeypatch.setattr(spec_utils, "_sample_simulated_acc_len", lambda mean, method, width: 3)
    monkeypatch.setattr(ddtree_simulation.CURRENT_TREE, "next_token", torch.tensor([[1, 3, -1, 4, -1], [1, -1, -1, -1, -1]]))
    candidates = torch.arange(100, 110).view(2, 5)  # node i of tree b drafted token 100 + 5b + i
    predict = torch.full((10,), -7, dtype=torch.int32)
    drafts = torch.zeros(2, dtype=torch.int32)
    index = ddtree_simulation.simulate_acceptance_along_the_best_branch(
        lambda **kwargs: None, candidates=candidates, predict=predict, num_correct_drafts=drafts, spec_steps=4,
        simulate_acc_len=3.0,
    )  # fmt: skip
    assert index.tolist() == [[0, 1, 3, -1, -1], [5, 6, -1, -1, -1]]
    assert drafts.tolist() == [2, 1]
    assert predict.tolist() == [101, 103, -7, 100, -7, 106, 105, -7, -7, -7]


def test_per_request_lengths_cut_each_tree_at_its_own_draw():
    import torch

    from sglang_ddtree.speculative.ddtree_simulation import best_branch_accept_index

    next_token = torch.tensor([[1, 3, -1, 4, -1], [1, -1, -1, -1, -1], [1, 2, 3, 4, -1]])
    index = best_branch_accept_index(next_token, torch.tensor([2, 4, 5]), width=5)
    assert index.tolist() == [[0, 1, -1, -1, -1], [5, 6, -1, -1, -1], [10, 11, 12, 13, 14]]


def test_per_width_means_are_linear_between_the_given_widths_and_bad_tables_are_named(tmp_path, monkeypatch):
    """``SGLANG_DDTREE_SIMULATE_ACC_BY_WIDTH``: a verify of the bonus token alone commits 1; between given widths
    the mean is linear, past the widest it is the widest's (never more than the width); a table that does not
    parse, or set beside a histogram file or without SGLang's knob, is refused naming the variable."""
    from sglang_ddtree.speculative import ddtree_simulation as simulation

    points = simulation.parse_width_means("9:3.5, 5:2")
    assert points == [(5, 2.0), (9, 3.5)]
    expected = {1: 1.0, 3: 1.5, 5: 2.0, 7: 2.75, 9: 3.5, 33: 3.5}
    assert {w: simulation.mean_for_width(points, w) for w in expected} == expected
    assert simulation.mean_for_width([(2, 2.0)], 65) == 2.0
    for bad in ("9", "9:x", "1:1", "4:5", "4:0.5", "4:2,4:3", ","):
        with pytest.raises(ValueError, match=simulation.BY_WIDTH_ENV):
            simulation.parse_width_means(bad)
    monkeypatch.setenv(simulation.BY_WIDTH_ENV, "9:3.5")
    with pytest.raises(ValueError, match=f"{simulation.BY_WIDTH_ENV} needs SGLANG_SIMULATE_ACC_LEN > 0"):
        simulation.check_simulation_settings(-1.0)
    simulation.check_simulation_settings(1.2)
    (tmp_path / "h.json").write_text("[1, 1]")
    monkeypatch.setenv(simulation.HISTOGRAM_ENV, str(tmp_path / "h.json"))
    with pytest.raises(ValueError, match="two ways to draw the lengths"):
        simulation.check_simulation_settings(1.2)


def test_histogram_draws_follow_the_file_and_bad_files_are_named(tmp_path, monkeypatch):
    """``SGLANG_DDTREE_SIMULATE_ACC_HISTOGRAM``: weights [1, 2, 0, 1] -> lengths 1/2/4 at 1/4, 1/2, 1/4 (capped at
    the verify's width); a file that is not a list of weights is refused naming the variable."""
    import json

    import torch

    from sglang_ddtree.speculative import ddtree_simulation
    path = tmp_path / "histogram.json"
    path.write_text(json.dumps([1, 2, 0, 1]))
    monkeypatch.setenv(ddtree_simulation.HISTOGRAM_ENV, str(path))
    histogram = ddtree_simulation.simulated_length_histogram()
    assert histogram.tolist() == [0.25, 0.5, 0.0, 0.25]
    lengths = ddtree_simulation.draw_lengths(histogram, 40000, width=8, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(lengths, minlength=5).tolist()
    assert counts[0] == counts[3] == 0
    for length, p in ((1, 0.25), (2, 0.5), (4, 0.25)):  # within 4 standard deviations of 40,000 draws
        assert abs(counts[length] / 40000 - p) < 4 * (p * (1 - p) / 40000) ** 0.5, counts
    assert ddtree_simulation.draw_lengths(histogram, 1000, width=2).max() == 2
    with pytest.raises(ValueError, match="needs SGLANG_SIMULATE_ACC_LEN > 0"):
        ddtree_simulation.check_simulation_settings(-1.0)
    ddtree_simulation.check_simulation_settings(2.0)
    for bad in ("[]", "[-1, 2]", '{"a": 1}', "[0, 0]", "not json"):
        bad_path = tmp_path / f"bad{len(bad)}.json"
        bad_path.write_text(bad)
        monkeypatch.setenv(ddtree_simulation.HISTOGRAM_ENV, str(bad_path))
        with pytest.raises(ValueError, match=ddtree_simulation.HISTOGRAM_ENV):
            ddtree_simulation.simulated_length_histogram()


@pytest.mark.parametrize("fault", ["deep_node_positions", "root_hidden_from_deep_nodes", "depth2_kv_from_parent"])
def test_the_greedy_comparison_fails_a_verify_with_a_fault_at_depth_two(models, ar_outputs, fault):
    """The exactness tests above can see a wrong verify: a fault injected into DDTREE's verify by the CPU shims
    (``tests/cpu_shims/ddtree_test_faults.py``: deep nodes one position too far, the root hidden from their mask
    rows, the depth-1 node's KV moved into the depth-2 slot) changes some of the eight outputs (measured: 7, 2 and
    4 of 8). Before the target's QK-norm gain and the fitted drafter, the first two passed as exact and the third
    could not act: the random drafter's trees were never accepted past depth 1 (accept histogram [62, 13, 0, 0]),
    and the target's next token hardly depended on its context."""
    target, drafter = models
    report = run_engine_generate(
        {**exact_engine_args(target), "speculative_algorithm": "DDTREE", "speculative_draft_model_path": drafter,
         "speculative_num_draft_tokens": 9},
        PROMPTS, GREEDY, env={"DDTREE_TEST_FAULT": fault},
    )  # fmt: skip
    differing = sum(out != ar for out, ar in zip(report["sequential"]["output_ids"], ar_outputs))
    assert differing > 0, f"{fault}: the exactness tests would pass a verify with this fault"
