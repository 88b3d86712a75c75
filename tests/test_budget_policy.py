"""``--budget auto``'s policy: one widest tree prices every verify width; the width chosen maximises expected
committed tokens per second for the batch, calibrated online by what the target accepted, without a host sync.

Most tests take each decision at the next step (``decisions_in_flight=0``, a host that waits for every step);
the server's policy takes it one tree later, which its own test pins."""

import math

import pytest
import torch

from sglang_ddtree.tree.budget_policy import (
    BudgetPolicy,
    StepTimeTable,
    expected_tokens_per_width,
    load_step_time_table,
)
from sglang_ddtree.tree.tree_reference import reference_build_tree

WIDTHS = (1, 2, 4, 8, 16, 33)


def table(step_ms) -> StepTimeTable:
    """``step_ms(bs, width)`` for batch sizes 1, 8 and 16."""
    return StepTimeTable({(bs, w): step_ms(bs, w) for bs in (1, 8, 16) for w in WIDTHS}, WIDTHS)


def policy_of(times: StepTimeTable, **kwargs) -> BudgetPolicy:
    return BudgetPolicy(times, WIDTHS, decisions_in_flight=0, **kwargs)


def tree_of(node_probs: list[list[float]], budget: int = 32) -> torch.Tensor:
    """``path_logprob [bs, budget]`` with the given path probabilities first (pop order), -inf padding."""
    out = torch.full((len(node_probs), budget), -math.inf)
    for b, probs in enumerate(node_probs):
        out[b, : len(probs)] = torch.log(torch.tensor(probs))
    return out


def no_accepts(bs: int) -> torch.Tensor:
    return torch.full((bs, 15), -1, dtype=torch.int64)


def test_every_prefix_of_a_best_first_pop_order_is_a_tree_with_non_increasing_path_probability():
    """Why one tree prices every width: the first w - 1 popped nodes hold each one's parent, and no later node is
    more probable."""
    torch.manual_seed(0)
    logits = torch.randn(3, 15, 64) * 2
    top_logprobs, top_tokens = torch.log_softmax(logits, -1).topk(16, dim=-1)
    parent, _, _, path_logprob = reference_build_tree(top_logprobs, top_tokens, budget=64)
    assert bool((parent < torch.arange(1, 65).view(1, -1)).all())  # parent id < own id: parents pop first
    assert bool((path_logprob[:, 1:] <= path_logprob[:, :-1]).all())


def test_expected_tokens_are_one_plus_the_prefix_sums_of_path_probabilities():
    path = tree_of([[0.9, 0.8, 0.5, 0.1], [0.2]], budget=7)
    got = expected_tokens_per_width(path, torch.tensor([1, 2, 4, 8]))
    assert torch.allclose(got, torch.tensor([[1.0, 1.9, 3.2, 3.3], [1.0, 1.2, 1.2, 1.2]]))


def test_a_confident_drafter_gets_a_wide_tree_and_a_hopeless_one_no_tree():
    """Step time 1 ms + 0.02 ms per verify token: a 33-wide verify costs 1.64x a bonus-only step. (Each decision
    from the newest tree alone: ``smoothing=1``.)"""
    policy = policy_of(table(lambda bs, w: 1.0 + 0.02 * w), smoothing=1.0)
    policy.observe(tree_of([[0.95 ** (i + 1) for i in range(32)]]), 33, no_accepts(1))
    assert policy.width() == 33
    policy.observe(tree_of([[0.01] * 32]), 1, no_accepts(1))
    assert policy.width() == 1


def test_the_same_trees_get_narrower_as_the_batch_makes_width_expensive():
    """Verify cost proportional to batch x width (compute-bound at 16 requests): the best width shrinks."""
    policy = policy_of(table(lambda bs, w: 1.0 + 0.01 * bs * w))
    probs = [0.9 ** (i + 1) for i in range(32)]
    policy.observe(tree_of([probs]), 33, no_accepts(1))
    alone = policy.width()
    policy.observe(tree_of([probs] * 16), 33, no_accepts(16))
    batched = policy.width()
    assert alone == 33 and batched < alone


def test_an_overconfident_drafter_is_calibrated_down_by_what_the_target_accepts():
    """The drafter claims 0.9 per node, the target accepts one node of the first level: the calibrated
    prediction falls until no tree pays, and the narrower widths were calibrated by the same verifies."""
    policy = policy_of(table(lambda bs, w: 1.0 + 0.02 * w), ema=0.5, smoothing=1.0)
    claimed = tree_of([[0.9] * 32])
    first_node_only = torch.tensor([[1] + [-1] * 14])
    policy.observe(claimed, 33, first_node_only)
    assert policy.width() == 33  # one verify is not enough evidence to give up
    for _ in range(8):
        policy.observe(claimed, policy.width(), first_node_only)
    assert policy.width() == 2  # a chain of one draft: it is accepted every time
    assert policy.calibration[WIDTHS.index(2)].item() == pytest.approx(1 / 0.9, rel=1e-3)
    assert policy.calibration[WIDTHS.index(33)].item() < 0.1


@pytest.mark.parametrize("price_narrower_widths", [True, False])
def test_a_verify_prices_the_narrower_widths_unless_told_that_its_paths_are_not_theirs(price_narrower_widths):
    """By default a width-33 verify calibrates every width up to 33 (its accepted path cut to their prefixes);
    under a per-width simulation (``price_narrower_widths=False``) only width 33, the one it verified."""
    policy = policy_of(table(lambda bs, w: 1.0), ema=0.5, price_narrower_widths=price_narrower_widths)
    policy.observe(tree_of([[0.9] * 32]), 33, torch.tensor([[1] + [-1] * 14]))
    changed = [w for w, c in zip(WIDTHS, policy.calibration.tolist()) if c != 1.0]
    assert changed == ([2, 4, 8, 16, 33] if price_narrower_widths else [33])


def test_at_width_one_the_drafter_runs_again_every_probe_interval_steps_at_the_widest_width():
    """The probe re-prices every width and commits what the widest tree accepts (a probe at width 2 spent its step
    on one draft: tests/gpu/RESULTS.md run 96, replayed in bench/results/budget_policy_replay/)."""
    policy = policy_of(table(lambda bs, w: 1.0 + 0.02 * w), probe_interval=4)
    policy.observe(tree_of([[0.01] * 32]), 33, no_accepts(1))
    assert [policy.width() for _ in range(8)] == [1, 1, 1, 33, 1, 1, 1, 33]
    narrow_probe = policy_of(table(lambda bs, w: 1.0 + 0.02 * w), probe_interval=2, probe_width=2)
    narrow_probe.observe(tree_of([[0.01] * 32]), 33, no_accepts(1))
    assert [narrow_probe.width() for _ in range(4)] == [1, 2, 1, 2]
    with pytest.raises(ValueError, match="probe_width must be one of the widths above 1"):
        policy_of(table(lambda bs, w: 1.0), probe_width=3)


def test_one_hopeless_tree_among_confident_ones_does_not_stop_drafting_but_a_run_of_them_does():
    """A decision takes effect a step or more after the tree it was made from, so it prices the trees to come by
    the recent ones' smoothed expectation (``smoothing``, per verify), not by one tree: on the demo pair a
    single low-confidence tree sent the policy to width 1 for 16 steps on 38% of its steps (run 96)."""
    policy = policy_of(table(lambda bs, w: 1.0 + 0.02 * w))
    confident, hopeless = tree_of([[0.95 ** (i + 1) for i in range(32)]]), tree_of([[0.01] * 32])
    for _ in range(10):
        policy.observe(confident, 33, no_accepts(1))
    policy.observe(hopeless, 33, no_accepts(1))
    assert policy.width() == 33
    for _ in range(30):
        policy.observe(hopeless, 33, no_accepts(1))
    assert policy.width() == 1
    with pytest.raises(ValueError, match="smoothing must be in"):
        policy_of(table(lambda bs, w: 1.0), smoothing=0.0)


def test_before_any_tree_the_policy_verifies_the_widest_so_the_first_tree_prices_every_width():
    policy = policy_of(table(lambda bs, w: 1.0 + 0.02 * w))
    assert [policy.width() for _ in range(3)] == [33, 33, 33]


def test_a_step_uses_the_decision_of_the_tree_before_the_newest_so_every_rank_picks_the_same_width():
    """Under overlap scheduling the newest decision may still be on the GPU when the host prepares the next step;
    taking "whatever has landed" would let tensor-parallel ranks pick different widths at the same step."""
    policy = BudgetPolicy(table(lambda bs, w: 1.0 + 0.02 * w), WIDTHS, smoothing=1.0)
    confident, hopeless = tree_of([[0.95 ** (i + 1) for i in range(32)]]), tree_of([[0.01] * 32])
    widths = []
    for tree in (hopeless, confident, confident, hopeless, hopeless):
        widths.append(policy.width())
        policy.observe(tree, widths[-1], no_accepts(1))
    widths.append(policy.width())
    assert widths == [33, 33, 1, 33, 33, 1]


def test_a_batch_size_between_measured_ones_uses_the_next_larger_row_and_gaps_are_refused():
    times = table(lambda bs, w: float(bs * 100 + w))
    assert times.row(5)[0].item() == 801.0 and times.row(64)[0].item() == 1601.0
    with pytest.raises(ValueError, match=r"lacks \(batch size, width\) \[\(1, 33\)\]"):
        StepTimeTable({(1, w): 1.0 for w in WIDTHS[:-1]}, WIDTHS)
    with pytest.raises(ValueError, match="widths must ascend from 1"):
        BudgetPolicy(times, (2, 4))


def test_the_table_file_gives_the_step_times_and_each_defect_is_named(tmp_path):
    good = tmp_path / "table.json"
    good.write_text('{"widths": [1, 2, 4], "batch_sizes": [1, 8], "step_ms": [[1.0, 1.1, 1.2], [2.0, 2.5, 3.0]]}')
    times = load_step_time_table(str(good))
    assert times.widths == [1, 2, 4] and times.row(3).tolist() == [2.0, 2.5, 3.0]
    defects = {
        "not json": "cannot read it as JSON",
        '{"widths": [1, 2]}': "expected lists 'widths', 'batch_sizes' and 'step_ms'",
        '{"widths": [2, 4], "batch_sizes": [1], "step_ms": [[1, 1]]}': "ascending from 1",
        '{"widths": [1, 2], "batch_sizes": [1, 1], "step_ms": [[1, 1], [1, 1]]}': "distinct positive integers",
        '{"widths": [1, 2], "batch_sizes": [1], "step_ms": [[1, 0]]}': "one positive number of milliseconds per width",
        '{"widths": [1, 2], "batch_sizes": [1, 8], "step_ms": [[1, 2]]}': "one row per batch size",
    }
    for text, message in defects.items():
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(ValueError, match=f"step time table {bad}: .*{message}"):
            load_step_time_table(str(bad))
    with pytest.raises(ValueError, match="cannot read it as JSON"):
        load_step_time_table(str(tmp_path / "missing.json"))


def test_a_widths_calibration_starts_from_the_drafters_claim_counted_as_one_verify():
    """The mean of the verifies so far with the claim (ratio 1) as one of them, then a moving average once
    ``1 / ema`` verifies are in: the first verify moves a width halfway, not by ``ema``."""
    policy = policy_of(table(lambda bs, w: 1.0), ema=0.25, price_narrower_widths=False)
    claimed = tree_of([[0.5] * 32])  # width 33 claims 16 drafts; a verify of it accepts 4: ratio 0.25
    four = torch.tensor([[1, 2, 3, 4] + [-1] * 11])
    calibrations = []
    for _ in range(4):
        policy.observe(claimed, 33, four)
        calibrations.append(policy.calibration[WIDTHS.index(33)].item())
    mean_with_claim = [(1 + n * 0.25) / (n + 1) for n in (1, 2, 3)]  # weights 1/2, 1/3, 1/4: the mean
    assert calibrations[:3] == pytest.approx(mean_with_claim, rel=1e-5)
    assert calibrations[3] == pytest.approx(calibrations[2] + 0.25 * (0.25 - calibrations[2]), rel=1e-5)  # then ema


def test_under_a_per_width_simulation_the_policy_settles_on_the_width_that_pays_within_a_few_dozen_steps():
    """RESULTS runs 91-93's cell: 16 requests, the server's own step times, certain top-1 branches (every width up
    to 16 claims all its drafts) and the simulated mean committed tokens per width. Width 16 pays most. A policy
    whose calibration crept from 1 by 5% per verify chose another width on 61 of these 120 steps (33 on 25: the
    served cells' 20%); a width not chosen keeps its last calibration, so a wider one is still tried now and then
    when the chosen one's estimate dips below it."""
    step_ms = {1: 28.18, 2: 31.78, 4: 33.24, 8: 35.44, 16: 40.13, 33: 67.90}
    tokens = {2: 1.68, 4: 2.45, 8: 2.97, 16: 3.94, 33: 4.39}  # 16: between 8's 2.97 and 17's 4.06
    policy = BudgetPolicy(StepTimeTable({(16, w): ms for w, ms in step_ms.items()}, WIDTHS), WIDTHS,
                          decisions_in_flight=0, price_narrower_widths=False)  # fmt: skip
    branch = tree_of([[1.0] * 15 + [1e-4] * 17] * 16)  # the simulation's certain top-1 chain, then siblings

    def accepted(width: int) -> torch.Tensor:
        drafts = tokens.get(width, 1.0) - 1.0  # 16 requests: floor or ceil, mean as simulated
        counts = [int(drafts) + (b < round((drafts - int(drafts)) * 16)) for b in range(16)]
        return torch.tensor([list(range(1, c + 1)) + [-1] * (15 - c) for c in counts])

    chosen = []
    for _ in range(120):
        chosen.append(policy.width())
        policy.observe(branch, chosen[-1], accepted(chosen[-1]))
    assert sum(w != 16 for w in chosen[:60]) <= 15
    assert sum(w != 16 for w in chosen[60:]) <= 5
