"""Where a DDTree decode step spends its time (``SGLANG_DDTREE_PROFILE_STEPS=1``).

The step's phases (``PHASES``) are bracketed by CUDA events recorded on the step's stream. A step's events
are read only once its last one has completed (``Event.query``, one step or more behind), so the profile adds
no host synchronisation; the per-phase means land in ``/server_info`` as ``ddtree_step_profile``. GPU time
between two events includes the GPU waiting for the host to launch the next kernels: that wait is what an
eager, launch-bound phase costs, and what a CUDA graph would remove. On the CPU engine the work is synchronous
and the host clock times it. Under ``--budget auto`` the totals are also kept per verify width (``by_width``): a
mean over mixed widths cannot say which width's verify cost what. The last ``RECENT_STEPS`` steps are kept one by
one (``recent``): a served cell has a few dozen steps, where one slow step (a first use of a shape, a compile) moves
the mean by milliseconds; their median and maximum say whether it did.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from typing import Optional

import torch

from sglang_ddtree.env_flags import env_flag

PROFILE_STEPS_ENV = "SGLANG_DDTREE_PROFILE_STEPS"
PHASES = (
    "draft",  # the drafter's block forward (a graph replay also runs the head)
    "head",  # the draft head when the drafter ran eagerly: LM head, per-depth top-K, tree expansion
    "verify_tensors",  # the tree's verify tensors and mask
    "verify",  # target forward over the tree (CUDA graph when captured), acceptance, KV compaction
    "draft_kv",  # committed tokens' target features into the draft KV cache
)
RECENT_STEPS = 2048  # steps kept one by one: a few served cells' worth


def step_profile_requested() -> bool:
    return env_flag(PROFILE_STEPS_ENV)


class StepTimer:
    """Marks the end of each phase of one step, in ``PHASES`` order."""

    def __init__(self, device: str) -> None:
        self.cuda = str(device).startswith("cuda")
        self.marks: list = []
        self.mark()

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def done(self) -> bool:
        return not self.cuda or self.marks[-1].query()

    def phase_ms(self) -> list[float]:
        if self.cuda:
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [(b - a) * 1000.0 for a, b in zip(self.marks, self.marks[1:])]


class _NoTimer:
    """Stands in for a :class:`StepTimer` when profiling is off, so the step marks its phases unconditionally."""

    def mark(self) -> None:
        pass


NO_TIMER = _NoTimer()


class StepProfile:
    """Per-phase time summed over the profiled decode steps, in all and per verify width; the last
    ``RECENT_STEPS`` steps one by one."""

    def __init__(self) -> None:
        self.enabled = step_profile_requested()
        self.steps = 0
        self.total_ms = dict.fromkeys(PHASES, 0.0)
        self.steps_by_width: dict[int, int] = {}
        self.total_ms_by_width: dict[int, dict[str, float]] = {}
        self.recent: deque[list] = deque(maxlen=RECENT_STEPS)  # [step index, width, ms per phase...]
        self._pending: deque[tuple[StepTimer, int]] = deque()

    def start(self, device: str) -> StepTimer | _NoTimer:
        return StepTimer(device) if self.enabled else NO_TIMER

    def finish(self, timer: StepTimer | _NoTimer, width: int) -> None:
        """``width``: the step's verify width (nodes per request)."""
        if not isinstance(timer, StepTimer):
            return
        if len(timer.marks) != len(PHASES) + 1:
            raise RuntimeError(f"a profiled step marked {len(timer.marks) - 1} phases, expected {len(PHASES)}")
        self._pending.append((timer, width))
        while self._pending and self._pending[0][0].done():
            done, step_width = self._pending.popleft()
            by_width = self.total_ms_by_width.setdefault(step_width, dict.fromkeys(PHASES, 0.0))
            phase_ms = done.phase_ms()
            for phase, ms in zip(PHASES, phase_ms):
                self.total_ms[phase] += ms
                by_width[phase] += ms
            self.recent.append([self.steps, step_width, *(round(ms, 4) for ms in phase_ms)])
            self.steps += 1
            self.steps_by_width[step_width] = self.steps_by_width.get(step_width, 0) + 1

    def as_dict(self) -> dict:
        mean = {phase: round(ms / self.steps, 4) if self.steps else None for phase, ms in self.total_ms.items()}
        step = round(sum(self.total_ms.values()) / self.steps, 4) if self.steps else None
        total = {phase: round(ms, 4) for phase, ms in self.total_ms.items()}
        by_width = {str(w): {"steps": self.steps_by_width[w],
                             "total_ms": {phase: round(ms, 4) for phase, ms in self.total_ms_by_width[w].items()}}
                    for w in sorted(self.steps_by_width)}  # fmt: skip
        return {"steps": self.steps, "mean_ms": mean, "step_mean_ms": step, "total_ms": total, "by_width": by_width,
                "recent": list(self.recent)}


STEP_PROFILE = StepProfile()


def step_profile_report() -> Optional[dict]:
    return STEP_PROFILE.as_dict() if STEP_PROFILE.enabled else None


def server_step_profile(url: str) -> Optional[dict]:
    """A running server's ``ddtree_step_profile`` (``/server_info``), None when it does not profile."""
    from sglang_ddtree.serving import server_state

    return server_state(url, "ddtree_step_profile")


def phase_means(before: dict, after: dict) -> dict[str, float]:
    """Mean ms per step of each phase over the steps profiled between two snapshots of :meth:`StepProfile.as_dict`."""
    steps = max(1, after["steps"] - before["steps"])
    return {p: (after["total_ms"][p] - before["total_ms"][p]) / steps for p in PHASES}


def phase_means_by_width(before: dict, after: dict) -> dict[str, dict]:
    """Per verify width: the steps profiled between two snapshots and their mean ms per phase (widths with
    steps only)."""
    zero = {"steps": 0, "total_ms": dict.fromkeys(PHASES, 0.0)}
    result = {}
    for width, now in after.get("by_width", {}).items():
        then = before.get("by_width", {}).get(width, zero)
        steps = now["steps"] - then["steps"]
        if steps:
            result[width] = {"steps": steps, "phase_ms": {p: (now["total_ms"][p] - then["total_ms"][p]) / steps
                                                          for p in PHASES}}  # fmt: skip
    return result


def step_ms_spread(before: dict, after: dict) -> dict[str, dict]:
    """Median and maximum step ms over the steps profiled between two snapshots, for all of them (``"all"``) and
    per verify width, from the steps kept one by one (``steps``: how many were still kept, fewer than the
    interval's when more than ``RECENT_STEPS`` ran)."""
    kept = [entry for entry in after.get("recent", []) if entry[0] >= before["steps"]]
    groups: dict[str, list[float]] = {"all": [sum(entry[2:]) for entry in kept]}
    for entry in kept:
        groups.setdefault(str(entry[1]), []).append(sum(entry[2:]))
    return {key: {"steps": len(ms), "median_ms": statistics.median(ms), "max_ms": max(ms)}
            for key, ms in groups.items() if ms}  # fmt: skip
