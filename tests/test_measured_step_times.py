"""``--budget auto`` without a table: the server measures each width's step time on its own first decode steps at
each batch size, then the policy chooses from those rows; every tensor-parallel rank ends each row at the same step.

A fake clock stands for the host's: each test says how long each step took."""

import pytest
import torch

from sglang_ddtree.tree.budget_policy import BudgetPolicy
from sglang_ddtree.tree.measured_step_times import (
    BLOCK_STEPS,
    UNSAMPLED_STEPS,
    MeasuredStepTimes,
    bucket_of,
    unmeasured_table,
)

WIDTHS = [1, 2, 4, 9]


class FakeClock:
    """The host clock, advanced by the test: ``tick(ms)`` after each step."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def tick(self, ms: float) -> None:
        self.now += ms / 1e3


def meter(clock: FakeClock, rows: list, agree=None) -> MeasuredStepTimes:
    return MeasuredStepTimes(WIDTHS, lambda bucket, row: rows.append((bucket, row)), agree=agree, clock=clock)


def run_steps(times: MeasuredStepTimes, clock: FakeClock, batch_size: int, step_ms, steps: int) -> list:
    """``steps`` back-to-back decode steps; ``step_ms(width)`` is how long a step of that width takes."""
    widths = []
    for _ in range(steps):
        width = times.width_to_measure(batch_size)
        widths.append(width)
        clock.tick(step_ms(width) if width is not None else 1.0)
    return widths


def test_each_width_is_verified_for_a_block_of_steps_and_its_row_is_the_median_step_time():
    clock, rows = FakeClock(), []
    times = meter(clock, rows)
    widths = run_steps(times, clock, 1, lambda w: 1.0 + 0.5 * w, len(WIDTHS) * BLOCK_STEPS + 3)
    assert widths[: len(WIDTHS) * BLOCK_STEPS] == [w for w in WIDTHS for _ in range(BLOCK_STEPS)]
    assert widths[len(WIDTHS) * BLOCK_STEPS :] == [None] * 3  # measured: the policy chooses from now on
    assert rows == [(1, pytest.approx([1.5, 2.0, 3.0, 5.5]))]
    samples = BLOCK_STEPS - UNSAMPLED_STEPS
    assert times.report() == {"measured_step_ms": {1: [1.5, 2.0, 3.0, 5.5]}, "measured_samples": {1: [samples] * 4}}


@pytest.mark.parametrize("lag", [0, 1, 2])
def test_an_interval_that_reflects_an_earlier_width_is_never_sampled(lag):
    """Under overlap scheduling the interval between two step starts is the GPU time of a step up to two before:
    with each interval taking the time of the step ``lag`` before it, every sample of a width is that width's."""
    clock, rows = FakeClock(), []
    times = meter(clock, rows)
    verified = [100.0] * lag  # before the first step: a prefill's time, unlike any width's
    while not rows:
        verified.append(float(times.width_to_measure(1)))
        clock.tick(verified[-1 - lag])
    assert [{round(ms, 9) for ms in s} for s in times.samples[1]] == [{float(w)} for w in WIDTHS]
    assert rows == [(1, pytest.approx([1.0, 2.0, 4.0, 9.0]))]


def test_a_bucket_is_measured_again_after_its_row_served_a_while_and_the_new_row_replaces_it():
    """Contexts grow and a wide verify's attention with them: after ``remeasure_after`` steps with its row, the
    bucket measures every width again (the policy keeps the old row meanwhile) and the new row is passed on."""
    clock, rows = FakeClock(), []
    times = MeasuredStepTimes(WIDTHS, lambda bucket, row: rows.append((bucket, row)), remeasure_after=10, clock=clock)
    measuring = len(WIDTHS) * BLOCK_STEPS
    first = run_steps(times, clock, 1, lambda w: float(w), measuring + 10)
    assert first[measuring:] == [None] * 10
    again = run_steps(times, clock, 1, lambda w: 2.0 * w, measuring + 1)
    assert again == [w for w in WIDTHS for _ in range(BLOCK_STEPS)] + [None]
    assert rows == [(1, pytest.approx([1.0, 2.0, 4.0, 9.0])), (1, pytest.approx([2.0, 4.0, 8.0, 18.0]))]
    assert times.report()["measured_step_ms"] == {1: [2.0, 4.0, 8.0, 18.0]}


def test_batch_sizes_share_a_row_per_power_of_two_and_each_bucket_is_measured_on_its_own():
    assert [bucket_of(bs) for bs in (1, 2, 3, 4, 5, 8, 9, 1000, 5000)] == [1, 2, 4, 4, 8, 8, 16, 1024, 1024]
    clock, rows = FakeClock(), []
    times = meter(clock, rows)
    run_steps(times, clock, 1, lambda w: float(w), len(WIDTHS) * BLOCK_STEPS)
    assert run_steps(times, clock, 3, lambda w: 10.0 * w, 2) == [1, 1]  # bucket 4 starts measuring at width 1
    run_steps(times, clock, 4, lambda w: 10.0 * w, len(WIDTHS) * BLOCK_STEPS - 2)
    assert rows == [(1, pytest.approx([1.0, 2.0, 4.0, 9.0])), (4, pytest.approx([10.0, 20.0, 40.0, 90.0]))]


def test_a_prefill_between_steps_is_never_sampled_and_the_row_waits_for_enough_samples():
    """A prefill interrupts every block at its third step: no interval spans it; each width's samples then come
    from the steps after it, and the row is final only once every width has two."""
    clock, rows = FakeClock(), []
    times = meter(clock, rows)
    for step in range(3 * len(WIDTHS) * BLOCK_STEPS):
        width = times.width_to_measure(2)
        if width is None:
            break
        clock.tick(float(width))
        if step % BLOCK_STEPS == 2:
            times.interrupt()
            clock.tick(1000.0)  # the prefill
    assert rows == [(2, pytest.approx([1.0, 2.0, 4.0, 9.0]))]


def test_which_steps_measure_which_width_does_not_depend_on_the_clock_and_agree_gives_every_rank_one_row():
    """Two tensor-parallel ranks with different clocks verify the same widths at every step and end the row at the
    same step, where ``agree`` (the worker's mean over ranks) gives both the same row."""
    agreed = []

    def agree(row):
        agreed.append(row)
        return [10.0, 20.0, 30.0, 40.0]

    ranks = [(FakeClock(), []), (FakeClock(), [])]
    meters = [meter(clock, rows, agree) for clock, rows in ranks]
    sizes = [1, 1, 2, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2] * 12
    widths = [[], []]
    for step, bs in enumerate(sizes):
        for rank, ((clock, _), times) in enumerate(zip(ranks, meters)):
            widths[rank].append(times.width_to_measure(bs))
            clock.tick(1.0 + rank + (step % 3))
    assert widths[0] == widths[1]
    assert ranks[0][1] == ranks[1][1] and len(ranks[0][1]) == 2 and len(agreed) == 4


def test_the_policy_chooses_from_a_measured_row_once_it_is_set():
    """Before any row is measured every width costs the same (the widest tree wins); a measured row that makes
    the wide tree dear turns the same trees into a narrow verify."""
    policy = BudgetPolicy(unmeasured_table(WIDTHS), WIDTHS, decisions_in_flight=0)
    tree = torch.log(torch.tensor([[0.9, 0.5, 0.3, 0.2, 0.1, 0.05, 0.02, 0.01]]))
    no_accepts = torch.full((1, 5), -1)
    policy.observe(tree, 9, no_accepts)
    assert policy.width() == 9
    policy.set_step_times(1, [1.0, 1.1, 2.0, 4.0])
    policy.observe(tree, 9, no_accepts)
    assert policy.width() == 2
