"""Which Python functions a decode step's host time goes to (``SGLANG_DDTREE_HOST_PROFILE=1``).

The host-timed ranges (``ddtree_trace_ranges``) say how long each of a few named functions takes; they cannot say
what inside SGLang's verify, the graph runners' ``load_batch`` or the attention backends' plans costs, and torch
profiler traces crash SGLang 0.5.17's scheduler on the H200 machine. With the variable set, the scheduler runs its
decode ``run_batch`` and ``process_batch_result`` calls under one ``cProfile`` profiler, and ``/server_info``
reports the totals so far as ``ddtree_host_profile`` (per function: calls and own milliseconds, and the decode
iterations profiled). ``bench.step_profile --host-profile`` turns two reports into milliseconds per iteration
(:func:`per_iteration`).

Own times only: on the H200 machine (Python 3.12) the profiler's cumulative times of the functions that enclose
DDTree's step stayed at zero (``run_eagle_verify``, ``run_batch``: tests/gpu/RESULTS.md run 49; cause not found)
while AR's were whole, so no cumulative column is reported rather than a wrong one; the host-timed ranges give
the enclosing functions' times. A deterministic profiler charges every Python call (~1 µs each), so the step
walls of a profiled server are not a serving step's: read the shares, not the absolute times. Off by default.
"""

from __future__ import annotations

import cProfile
import pstats
from typing import Any, Callable, Optional

from sglang_ddtree.env_flags import env_flag

HOST_PROFILE_ENV = "SGLANG_DDTREE_HOST_PROFILE"
_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
PROFILED_FUNCTIONS = ("run_batch", "process_batch_result")


def host_profile_requested() -> bool:
    return env_flag(HOST_PROFILE_ENV)


class DecodeHostProfile:
    """One profiler over every decode call of the profiled scheduler functions since the process started."""

    def __init__(self) -> None:
        self.profiler = cProfile.Profile()
        self.iterations = 0  # decode run_batch calls profiled
        self._depth = 0  # profiled calls in progress (process_batch_result may run inside run_batch's caller)

    def around(self, name: str) -> Callable[..., Any]:
        def profiled(original: Callable[..., Any], scheduler: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
            if batch is None or not batch.forward_mode.is_decode():
                return original(scheduler, batch, *args, **kwargs)
            if name == "run_batch":
                self.iterations += 1
            self._depth += 1
            if self._depth == 1:
                self.profiler.enable()
            try:
                return original(scheduler, batch, *args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.profiler.disable()

        return profiled

    def report(self) -> dict:
        """``{"iterations", "functions": {"file:line(name)": [calls, own ms]}}`` so far."""
        if self.iterations == 0:
            return {"iterations": 0, "functions": {}}
        stats = pstats.Stats(self.profiler).stats  # type: ignore[attr-defined]
        functions = {function_label(key): [int(nc), round(1e3 * tt, 4)] for key, (_cc, nc, tt, _ct, _) in stats.items()}
        return {"iterations": self.iterations, "functions": functions}


def function_label(key: tuple[str, int, str]) -> str:
    """``file:line(name)``, the path from the package root (``sglang/...``, ``sglang_ddtree/...``, ``torch/...``)."""
    filename, line, name = key
    for marker in ("site-packages/", "dist-packages/"):
        if marker in filename:
            filename = filename.split(marker, 1)[1]
            break
    else:
        if "/sglang_ddtree/" in filename:
            filename = "sglang_ddtree/" + filename.split("/sglang_ddtree/", 1)[1]
    return f"{filename}:{line}({name})" if filename != "~" else name


HOST_PROFILE: Optional[DecodeHostProfile] = DecodeHostProfile() if host_profile_requested() else None


def host_profile_report() -> Optional[dict]:
    return HOST_PROFILE.report() if HOST_PROFILE is not None else None


def per_iteration(before: Optional[dict], after: dict, top: int = 40) -> dict:
    """Milliseconds per decode iteration between two ``ddtree_host_profile`` reports: the ``top`` functions by own
    time, each ``[label, calls per iteration, own ms]``, and every function's own time summed (``own_ms``)."""
    before = before or {"iterations": 0, "functions": {}}
    iterations = after["iterations"] - before["iterations"]
    if iterations <= 0:
        return {"iterations": 0, "own_ms": 0.0, "by_own_ms": []}
    rows = []
    for label, (calls, own) in after["functions"].items():
        then_calls, then_own = before["functions"].get(label, [0, 0.0])
        if calls > then_calls:
            rows.append([label, round((calls - then_calls) / iterations, 3), round((own - then_own) / iterations, 4)])
    rows.sort(key=lambda r: -r[2])
    return {"iterations": iterations, "own_ms": round(sum(r[2] for r in rows), 3), "by_own_ms": rows[:top]}


def register(registry: Any, hook_type: Any) -> None:
    """The profiler's hooks when the environment asks for them (none by default)."""
    if HOST_PROFILE is not None:
        for name in PROFILED_FUNCTIONS:
            registry.register(f"{_SCHEDULER}.{name}", HOST_PROFILE.around(name), hook_type.AROUND)
