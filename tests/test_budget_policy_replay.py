"""``python -m bench.budget_policy_replay``: ``--budget auto``'s policy and fixed widths decode traced answers,
each step committing what the tree of its width accepts and costing that width's step time."""

import argparse
import math

import pytest
import torch

from bench.budget_policy_replay import AnswerTrace, ms_row, replay, replay_fixed, replay_policy

TABLE = {1: 1.0, 2: 1.2, 4: 1.3, 33: 2.0}


def answer(anchors: int, accepted: list[int], probability: float) -> AnswerTrace:
    """Every anchor's widest tree claims ``probability`` per node and the target accepts the nodes ``accepted``."""
    nodes = torch.full((anchors, 15), -1, dtype=torch.int64)
    nodes[:, : len(accepted)] = torch.tensor(accepted)
    return AnswerTrace(torch.full((anchors, 32), math.log(probability)), nodes)


def test_a_width_commits_the_accepted_path_inside_its_first_nodes_plus_the_targets_token():
    """Accepted nodes 1, 3, 7 (ascending along the path): width 4 holds nodes 1-3, so it commits 2 drafts + 1."""
    trace = answer(9, [1, 3, 7], 0.5)
    width4 = replay_fixed([trace], 4, TABLE).summary()
    assert (width4["tokens"], width4["steps_per_width"], width4["ms"]) == (9, {4: 3}, 3.9)
    width33 = replay_fixed([trace], 33, TABLE).summary()
    assert (width33["tokens"], width33["steps_per_width"], width33["tau"]) == (12, {33: 3}, 4.0)  # the last overshoots
    assert replay_fixed([trace], 1, TABLE).summary()["steps_per_width"] == {1: 9}


def test_the_policy_drafts_where_trees_are_accepted_and_stops_where_nothing_is():
    accepted = replay_policy([answer(200, [1, 2, 3], 0.9)], TABLE, TABLE).summary()
    assert max(accepted["steps_per_width"], key=accepted["steps_per_width"].get) == 33
    hopeless = replay_policy([answer(200, [], 0.01)], TABLE, TABLE).summary()
    assert max(hopeless["steps_per_width"], key=hopeless["steps_per_width"].get) == 1


def test_step_times_are_read_as_width_colon_milliseconds():
    assert ms_row("1:3.3,33:4.9") == {1: 3.3, 33: 4.9}
    with pytest.raises(argparse.ArgumentTypeError, match="expected WIDTH:MS"):
        ms_row("1=3.3")
    with pytest.raises(argparse.ArgumentTypeError, match="need width 1"):
        ms_row("2:3.3,33:4.9")


def test_a_batch_decodes_its_answers_together_and_a_finished_answer_frees_its_slot_for_the_next():
    """Two slots for three answers of 4, 8 and 4 anchors at width 2 (one draft accepted: 2 tokens a step): the
    first and third answer share a slot, so the batch takes 4 steps, each charged once."""
    traces = [answer(4, [1], 0.5), answer(8, [1], 0.5), answer(4, [1], 0.5)]
    result = replay_fixed(traces, 2, TABLE, batch_size=2)
    summary = result.summary()
    assert (summary["tokens"], summary["steps_per_width"], summary["ms"], result.request_steps) == (16, {2: 4}, 4.8, 8)
    seen = []
    replay(traces, TABLE, lambda: 2, lambda trees, width, accepted: seen.append((tuple(trees.shape), accepted.shape[0])),
           batch_size=2)  # fmt: skip
    assert seen == [((2, 32), 2)] * 4  # the policy hears the whole batch's trees at every step
