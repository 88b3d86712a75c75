"""``--budget auto``: the verify width that commits the most tokens per second for the running batch.

A best-first DDTree pops its nodes in non-increasing path probability, and a parent always before its children,
so the first ``w - 1`` popped nodes of the widest tree form the best tree of width ``w`` (root included). Its
expected committed tokens per request are 1 (the bonus) plus the sum of those nodes' path probabilities (the
probability that the target accepts the path to each node, if the drafter is calibrated: DDTree's objective).
One drafter pass therefore prices every width at once, with a prefix sum.

The drafter is not calibrated, so the prediction is scaled per width by the ratio of measured to predicted
accepted drafts, online: the mean of the verifies so far with the drafter's own claim (ratio 1) counted as one of
them, an exponential moving average once ``1 / ema`` verifies are in. (A moving average from 1 leaves an
overconfident claim only ~1 / ema verifies of each width later: on the step times a server of 16 requests measured
for itself, tests/gpu/RESULTS.md run 93, it chose widths that did not pay on 61 of 120 simulated steps, this on 16;
tests/test_budget_policy.py.) Step time per (batch size, width) comes from a table measured on the model and GPU
(below). The choice maximises expected tokens per request / step time, the expectation smoothed over verifies
(``smoothing``: each verify moves it 10%): a decision takes effect a step or more after the tree it was made from, on
a tree of its own, so the recent trees' mean prices it better than the newest tree alone (on the demo pair, one
low-confidence tree sent the policy to width 1 for 16 steps, 38% of its steps at one request: tests/gpu/RESULTS.md
run 96; replayed along the pair's greedy paths by ``bench.budget_policy_replay``, 0.89x the best fixed width's
tokens per ms, smoothed 0.96-0.99x). Width 1 means no tree: the bonus token verified alone, with the drafter re-run at
the widest width every ``probe_interval`` steps, which re-prices every width and commits what that tree accepts.

Everything per step runs on the GPU; each decision reaches the host through a non-blocking copy, and a step
uses the decision made ``decisions_in_flight`` trees before the newest (one by default: under overlap scheduling
the host prepares a step while the GPU still runs the previous one, whose decision is then not ready, and the
one before it is). The lag is fixed, not "whatever has landed", so that every tensor-parallel rank picks the same
width at the same step; waiting for that older copy returns at once unless the GPU is more trees behind the host
than overlap scheduling lets it be.

``--budget auto`` measures its step times on the server's first decode steps at each batch size
(``measured_step_times``), or takes them from a JSON file (``SGLANG_DDTREE_STEP_TIME_TABLE``, given by the
launcher's ``--step-time-table``), as SGLang's DSpark takes its profiled SPS table:
``{"widths": [1, 2, ...], "batch_sizes": [1, 8, ...], "step_ms": [[ms per width] per batch size]}``.
"""

from __future__ import annotations

import bisect
import collections
import json
import os
from typing import Mapping, Optional, Sequence

import torch

DEFAULT_WIDTHS = (1, 2, 4, 8, 16, 33, 65)  # verify tokens per request, root included
STEP_TIME_TABLE_ENV = "SGLANG_DDTREE_STEP_TIME_TABLE"


def expected_tokens_per_width(path_logprob: torch.Tensor, widths: torch.Tensor) -> torch.Tensor:
    """``[bs, len(widths)]`` expected committed tokens per request at each width, uncalibrated.

    Args:
        path_logprob: ``[bs, B]`` float32, the tree's nodes in pop order (padding ``-inf``).
        widths: ``[W]`` int64 verify widths, each ``<= B + 1``.
    """
    probs = torch.nan_to_num(path_logprob.float().exp(), nan=0.0)
    cumulative = torch.nn.functional.pad(probs.cumsum(dim=1), (1, 0))  # [bs, B + 1]: 0 nodes, 1 node, ...
    return 1.0 + cumulative.index_select(1, widths - 1)


class StepTimeTable:
    """Step milliseconds per (batch size, width), measured for one model on one GPU; a batch
    size between two measured ones takes the next larger (as a CUDA-graph batch pads to the next captured size)."""

    def __init__(self, step_ms: Mapping[tuple[int, int], float], widths: Sequence[int]) -> None:
        self.widths = list(widths)
        self.batch_sizes = sorted({bs for bs, _ in step_ms})
        missing = [(bs, w) for bs in self.batch_sizes for w in widths if (bs, w) not in step_ms]
        if missing:
            raise ValueError(f"step time table lacks (batch size, width) {missing[:4]}")
        self.rows = {bs: torch.tensor([step_ms[bs, w] for w in widths], dtype=torch.float32) for bs in self.batch_sizes}

    def row_key(self, batch_size: int) -> int:
        """The measured batch size whose row applies (the next larger, or the largest)."""
        return self.batch_sizes[min(bisect.bisect_left(self.batch_sizes, batch_size), len(self.batch_sizes) - 1)]

    def row(self, batch_size: int) -> torch.Tensor:
        return self.rows[self.row_key(batch_size)]


def load_step_time_table(path: str) -> StepTimeTable:
    """The table of a ``--budget auto`` server; ``ValueError`` naming the file and what is wrong with it."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as error:
        raise ValueError(f"step time table {path}: cannot read it as JSON ({error})") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("widths", "batch_sizes",
                                                                                      "step_ms")):  # fmt: skip
        raise ValueError(f"step time table {path}: expected lists 'widths', 'batch_sizes' and 'step_ms' (one row of "
                         "milliseconds per batch size, one entry per width)")  # fmt: skip
    widths, batch_sizes, rows = data["widths"], data["batch_sizes"], data["step_ms"]
    if not widths or not all(isinstance(w, int) and w >= 1 for w in widths) or widths != sorted(set(widths)) \
            or widths[0] != 1:  # fmt: skip
        raise ValueError(f"step time table {path}: 'widths' must be verify widths ascending from 1, got {widths}")
    if not batch_sizes or not all(isinstance(bs, int) and bs >= 1 for bs in batch_sizes) \
            or len(set(batch_sizes)) != len(batch_sizes):  # fmt: skip
        raise ValueError(f"step time table {path}: 'batch_sizes' must be distinct positive integers, got {batch_sizes}")
    if len(rows) != len(batch_sizes) or not all(
        isinstance(row, list) and len(row) == len(widths)
        and all(isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms > 0 for ms in row)
        for row in rows
    ):
        raise ValueError(f"step time table {path}: 'step_ms' must hold one row per batch size, each with one "
                         f"positive number of milliseconds per width ({len(widths)})")  # fmt: skip
    return StepTimeTable({(bs, w): float(ms) for bs, row in zip(batch_sizes, rows) for w, ms in zip(widths, row)},
                         widths)  # fmt: skip


def requested_step_time_table() -> Optional[StepTimeTable]:
    """The table named by ``SGLANG_DDTREE_STEP_TIME_TABLE`` (``--budget auto``), or None (a fixed budget)."""
    path = os.environ.get(STEP_TIME_TABLE_ENV, "")
    return load_step_time_table(path) if path else None


class BudgetPolicy:
    """Chooses each batch's verify width from the previous trees' path probabilities and measured acceptance.

    Call :meth:`observe` after each verify (GPU work only) and :meth:`width` before the next draft (host). ``widths``
    must be the verify widths the worker can run, ascending, starting at 1. ``decisions_in_flight``: how many of
    the newest decisions a step does not wait for (0 on a host that finishes each step before the next).
    ``price_narrower_widths``: a verify also calibrates every narrower width from its accepted path cut to that
    width's prefix (exact for real trees); off, each width learns only from its own verifies (a simulation whose
    committed lengths are drawn per width has no such prefix property).
    """

    def __init__(
        self,
        step_times: StepTimeTable,
        widths: Sequence[int] = DEFAULT_WIDTHS,
        device: torch.device | str = "cpu",
        ema: float = 0.05,
        smoothing: float = 0.1,
        probe_width: Optional[int] = None,
        probe_interval: int = 16,
        decisions_in_flight: int = 1,
        price_narrower_widths: bool = True,
    ) -> None:
        if list(widths) != sorted(set(widths)) or widths[0] != 1:
            raise ValueError(f"widths must ascend from 1, got {list(widths)}")
        self.widths = list(widths)
        self.device = torch.device(device)
        self.step_times = step_times
        self._step_rows = {bs: row.to(self.device) for bs, row in step_times.rows.items()}  # no per-step H2D copy
        self._staged_rows: dict[int, torch.Tensor] = {}
        self.ema = ema
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        self.smoothing = smoothing
        if probe_width is not None and probe_width not in self.widths[1:]:
            raise ValueError(f"probe_width must be one of the widths above 1 {self.widths[1:]}, got {probe_width}")
        self.probe_width = self.widths[-1] if probe_width is None else probe_width
        self._expected = torch.zeros(len(self.widths), device=self.device)  # tokens per request, smoothed
        self._expected_seen = False
        self.probe_interval = probe_interval
        self._width_index = torch.tensor(self.widths, dtype=torch.int64, device=self.device)
        self.calibration = torch.ones(len(self.widths), device=self.device)  # measured / predicted drafts
        self._verifies = torch.zeros(len(self.widths), device=self.device)  # folded into each width's calibration
        self.decisions_in_flight = decisions_in_flight
        self.price_narrower_widths = price_narrower_widths
        # One host slot per decision that can be pending (observed, not yet taken by width()), reused in turn.
        self._choice_host = torch.zeros(decisions_in_flight + 2, dtype=torch.int64,
                                        pin_memory=self.device.type == "cuda")  # fmt: skip
        self._pending: collections.deque[tuple[int, Optional[torch.cuda.Event]]] = collections.deque()
        self._decisions = 0
        self._chosen = len(self.widths) - 1  # start wide: the first trees price every width
        self._steps_at_one = 0

    def set_step_times(self, batch_size: int, step_ms: Sequence[float]) -> None:
        """Replace the row of ``batch_size`` (a row measured by the server) for the decisions after this call."""
        key = self.step_times.row_key(batch_size)
        row = torch.tensor(step_ms, dtype=torch.float32)
        self.step_times.rows[key] = row
        staged = row.pin_memory() if self.device.type == "cuda" else row
        self._step_rows[key].copy_(staged, non_blocking=True)
        self._staged_rows[key] = staged  # alive until the copy has run: the next call for this row is steps later

    def width(self) -> int:
        """The verify width for the next step: the decision made ``decisions_in_flight`` trees before the newest."""
        while len(self._pending) > self.decisions_in_flight:
            slot, copied = self._pending.popleft()
            if copied is not None:
                copied.synchronize()  # long done: the GPU is at most decisions_in_flight trees behind
            self._chosen = int(self._choice_host[slot])
        if self.widths[self._chosen] == 1:
            self._steps_at_one += 1
            if self._steps_at_one >= self.probe_interval:  # draft again to re-price the widths
                self._steps_at_one = 0
                return self.probe_width
        else:
            self._steps_at_one = 0
        return self.widths[self._chosen]

    def observe(self, path_logprob: Optional[torch.Tensor], verified_width: int, accepted_nodes: torch.Tensor) -> None:
        """Fold one verify into the calibration and choose the next width.

        Args:
            path_logprob: ``[bs, B]`` the verified tree's nodes in pop order, built at the widest budget; None for a
                step without a tree (width 1), which changes nothing.
            verified_width: the verify tokens per request of this step (a prefix of that tree).
            accepted_nodes: ``[bs, D]`` pop-order ids (1..B) of each request's accepted drafts, -1 padding.

        The accepted path of a width-``w`` verify, cut to the nodes of a narrower prefix, is what that prefix would
        have accepted (a node's ancestors pop before it), so one verify calibrates every width up to ``w``.
        """
        if path_logprob is None:
            return
        usable = self._width_index[: bisect.bisect_right(self.widths, path_logprob.shape[1] + 1)]  # host-side count
        predicted = expected_tokens_per_width(path_logprob, usable) - 1.0  # [bs, W'] expected accepted drafts
        nodes = accepted_nodes.to(self.device)
        inside = (nodes.unsqueeze(-1) > 0) & (nodes.unsqueeze(-1) < usable.view(1, 1, -1))  # [bs, D, W']
        ratio = inside.sum(dim=(0, 1)).float() / predicted.sum(dim=0).clamp_min(1e-6)
        calibrated = (usable > 1) & ((usable <= verified_width) if self.price_narrower_widths
                                     else (usable == verified_width))  # fmt: skip
        current, verifies = self.calibration[: len(usable)], self._verifies[: len(usable)]
        weight = (1.0 / (verifies + 2.0)).clamp_min(self.ema)  # the claim's weight: one verify's
        self.calibration[: len(usable)] = torch.where(calibrated, torch.lerp(current, ratio.clamp(0.0, 4.0), weight),
                                                      current)  # fmt: skip
        self._verifies[: len(usable)] += calibrated
        tokens = (1.0 + predicted * self.calibration[: len(usable)]).mean(dim=0)  # per request
        expected = self._expected[: len(usable)]
        expected.copy_(torch.lerp(expected, tokens, self.smoothing) if self._expected_seen else tokens)
        self._expected_seen = True
        step_ms = self._step_rows[self.step_times.row_key(path_logprob.shape[0])][: len(usable)]
        choice = torch.argmax(expected / step_ms).reshape(1)
        slot = self._decisions % len(self._choice_host)
        self._decisions += 1
        self._choice_host[slot : slot + 1].copy_(choice, non_blocking=True)
        copied = None
        if self.device.type == "cuda":
            copied = torch.cuda.Event()
            copied.record()
        self._pending.append((slot, copied))
