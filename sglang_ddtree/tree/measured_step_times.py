"""``--budget auto`` without a table: the server measures its own step time per (batch size, verify width).

What the policy must weigh is the wall time of a whole decode step (draft, tree, verify, the scheduler's host work
and whatever of it the GPU does not hide), and that depends on the model, the GPU, the attention backend, the
graphs and the batch. So the worker measures it on its first decode steps at each batch size: it verifies each
width for ``block_steps`` consecutive steps and takes the host clock between the starts of consecutive steps (one
step's period, host and GPU together). Under overlap scheduling the host launches a step once the results of the
step before the previous one are in, so the interval that ends at a step's start reflects the GPU time of a step
one or two before: the intervals ending at a block's first ``UNSAMPLED_STEPS`` steps are not sampled, and a sample
needs that many steps before it to be this block's. Each width's time is the median of its samples; once every
width has ``MIN_SAMPLES`` the row is fixed and the policy chooses. A bucket is measured again after
``REMEASURE_AFTER_STEPS`` decode steps with its row: the contexts grow, and a wide verify's attention with them
(about 1-2% of the steps are then spent at widths the policy would not choose).

Batch sizes share a row per power of two (the next larger, as a CUDA graph pads a batch to the next captured size).
Which steps are sampled depends only on the sequence of batch sizes and prefills, never on the clock, so every
tensor-parallel rank finishes a row at the same step; ``agree`` (a mean over the ranks) then gives them one row,
hence the same decisions.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from sglang_ddtree.tree.budget_policy import StepTimeTable

BLOCK_STEPS = 7  # consecutive steps per width
UNSAMPLED_STEPS = 3  # the intervals ending at a block's first steps may reflect the previous width's steps
MIN_SAMPLES = 2  # per width before a row is final (a block cut by other batch sizes may sample fewer)
LARGEST_BUCKET = 1024
REMEASURE_AFTER_STEPS = 4096


def bucket_of(batch_size: int) -> int:
    """The power of two whose row a batch size uses: the next larger, capped at ``LARGEST_BUCKET``."""
    return min(1 << max(batch_size - 1, 0).bit_length(), LARGEST_BUCKET)


@dataclass
class _Step:
    bucket: int
    position: int  # index in the bucket's measuring sequence
    started: float  # host clock, seconds
    consecutive: int  # how many steps before it, back to back, had this bucket and the preceding positions


class MeasuredStepTimes:
    """Step milliseconds per (batch-size bucket, width), measured on the server's own decode steps.

    Call :meth:`width_to_measure` at the start of every decode step (it returns the width to verify while the
    step's bucket is being measured, else None) and :meth:`interrupt` on every other forward (a prefill or an idle
    batch breaks the chain of back-to-back steps). ``on_row_measured(bucket, step_ms)`` receives each final row,
    ``agree`` first turns a rank's row into the row every rank uses.
    """

    def __init__(
        self,
        widths: Sequence[int],
        on_row_measured: Callable[[int, list[float]], None],
        agree: Optional[Callable[[list[float]], list[float]]] = None,
        block_steps: int = BLOCK_STEPS,
        remeasure_after: Optional[int] = REMEASURE_AFTER_STEPS,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """``remeasure_after``: decode steps of a bucket with a final row before it is measured again (None:
        never)."""
        if block_steps <= UNSAMPLED_STEPS:
            raise ValueError(f"block_steps must exceed the {UNSAMPLED_STEPS} unsampled steps, got {block_steps}")
        self.widths = list(widths)
        self.block_steps = block_steps
        self.remeasure_after = remeasure_after
        self._steps_with_row: dict[int, int] = {}
        self._on_row_measured = on_row_measured
        self._agree = agree or (lambda row: row)
        self._clock = clock
        self._positions: dict[int, int] = {}
        self._samples: dict[int, list[list[float]]] = {}
        self.rows: dict[int, list[float]] = {}  # final rows, by bucket
        self.samples: dict[int, list[list[float]]] = {}  # the milliseconds each final row was measured from
        self._previous: Optional[_Step] = None

    def width_to_measure(self, batch_size: int) -> Optional[int]:
        """The width this decode step verifies to measure its bucket's row, or None while the row is final."""
        now = self._clock()
        bucket = bucket_of(batch_size)
        previous, self._previous = self._previous, None
        if bucket in self._steps_with_row:
            self._steps_with_row[bucket] += 1
            if self.remeasure_after is None or self._steps_with_row[bucket] <= self.remeasure_after:
                return None
            del self._steps_with_row[bucket]  # measured again from its first width; the policy keeps the old row
            self._positions[bucket] = 0
        position = self._positions.get(bucket, 0)
        samples = self._samples.setdefault(bucket, [[] for _ in self.widths])
        width_index, step_in_block = divmod(position, self.block_steps)
        width_index %= len(self.widths)
        consecutive = 0
        if previous is not None and previous.bucket == bucket and previous.position == position - 1:
            consecutive = previous.consecutive + 1
            if step_in_block >= UNSAMPLED_STEPS and consecutive >= UNSAMPLED_STEPS:  # the steps before: this block's
                samples[width_index].append((now - previous.started) * 1e3)
        self._previous = _Step(bucket, position, now, consecutive)
        self._positions[bucket] = position + 1
        if step_in_block == self.block_steps - 1 and all(len(s) >= MIN_SAMPLES for s in samples):
            self._finish(bucket)
        return self.widths[width_index]

    def interrupt(self) -> None:
        """A forward that is not a decode step ran: the next step's interval would include it."""
        self._previous = None

    def _finish(self, bucket: int) -> None:
        self.samples[bucket] = self._samples.pop(bucket)
        row = self._agree([statistics.median(s) for s in self.samples[bucket]])
        self.rows[bucket] = row
        self._steps_with_row[bucket] = 0
        self._on_row_measured(bucket, row)

    def report(self) -> dict[str, dict[int, list]]:
        """The final rows by bucket, and how many samples each width's median had."""
        buckets = sorted(self.rows)
        return {"measured_step_ms": {b: [round(ms, 4) for ms in self.rows[b]] for b in buckets},
                "measured_samples": {b: [len(s) for s in self.samples[b]] for b in buckets}}  # fmt: skip


def unmeasured_table(widths: Sequence[int]) -> StepTimeTable:
    """The policy's table before any row is measured: one row per bucket, every width 1 ms (so the policy's own
    choice, unused while a bucket is measured, is the widest tree)."""
    buckets = [1 << i for i in range(LARGEST_BUCKET.bit_length())]
    return StepTimeTable({(bucket, width): 1.0 for bucket in buckets for width in widths}, widths)
