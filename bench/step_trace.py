"""Account a torch-profiler trace of a serving engine step by step: where each millisecond of the wall goes.

A step is one iteration of SGLang's scheduler loop, from one ``run_batch`` to the next, on the scheduler's
thread. Its wall time is split into

- the scheduler's own functions (``SCHEDULER_FUNCTIONS``: receiving requests, choosing the batch, launching it,
  processing the previous batch's result), with what is left named ``loop``;
- inside ``run_batch``, the speculative worker's phases (``WORKER_FUNCTIONS``, host time to launch each);
- the host time spent blocked on the GPU (``SYNC_CALLS``: stream/event/device synchronisation, blocking scalar
  reads) and in kernel and graph launches, with their counts;
- on the GPU: busy time (the union of kernels, copies and memsets in the window) and idle time.

Needs a trace recorded with CPU and GPU activities (``/start_profile`` with ``"activities": ["CPU", "GPU"]``).
The functions are found by the ranges SGLang 0.5.17 opens under a profiler (``scheduler.run_batch``, ...,
``sglang.srt.utils.nvtx_utils.profile_method``), DDTreeWorker's own (``ddtree._draft_block``, ...) and, on a server
started with ``SGLANG_DDTREE_TRACE_RANGES=1``, SGLang's verify functions (``spec.eagle_sample``, ...), or by
Python stack events when the trace has them (``"with_stack": true``: slower, and on the H200 it crashed SGLang's
scheduler when the profiler's result was freed, tests/gpu/RESULTS.md run 34). ``launch_batch_sample_if_needed``
has no range upstream: it is counted only from stacks. A traced step is longer than an untraced one: the split
says where host time goes, an untraced measurement says how much there is.
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from sglang_ddtree.profiling.ddtree_trace_ranges import TRACED_FUNCTIONS

SCHEDULER_FUNCTIONS = (
    "recv_requests",
    "process_input_requests",
    "get_next_batch_to_run",
    "run_batch",
    "process_batch_result",
    "launch_batch_sample_if_needed",
)
WORKER_FUNCTIONS = (  # DDTreeWorker.forward_batch_generation's phases; DFLASH and AR show only their own names
    "_draft_block",
    "ddtree_from_expansion",
    "_verify_input",
    "run_eagle_verify",
    "_append_committed_to_draft_kv",
)
# SGLang's own, ranged by sglang_ddtree.profiling.ddtree_trace_ranges when asked
SPEC_FUNCTIONS = tuple(name for name in TRACED_FUNCTIONS if name not in SCHEDULER_FUNCTIONS)
SYNC_CALLS = re.compile(r"^(cudaStreamSynchronize|cudaEventSynchronize|cudaDeviceSynchronize|cudaMemcpy|"
                        r"aten::_local_scalar_dense)$")  # fmt: skip
LAUNCH_CALLS = re.compile(r"^(cudaLaunchKernel\w*|cuLaunchKernel\w*|cudaGraphLaunch|cudaLaunchCooperativeKernel\w*)$")
GRAPH_LAUNCH = "cudaGraphLaunch"
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
_PYTHON_NAME = re.compile(r"\): (?P<function>[\w<>]+)$")
_RANGE_PREFIXES = ("scheduler.", "ddtree.", "spec.")  # SGLang's scheduler ranges, DDTreeWorker's, SGLang's verify


@dataclass
class Event:
    name: str
    start: float  # microseconds
    end: float


@dataclass
class StepAccount:
    """One scheduler iteration; all times in ms."""

    wall: float
    scheduler: dict[str, float]  # SCHEDULER_FUNCTIONS + "loop" (the rest of the iteration); sums to ``wall``
    worker: dict[str, float]  # WORKER_FUNCTIONS and SPEC_FUNCTIONS found inside run_batch
    sync: float
    launch: float
    launches: int
    graph_launches: int
    gpu_busy: float
    gpu_idle: float
    gpu_by_category: dict[str, float] = field(default_factory=dict)


def load_trace(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def python_function(name: str) -> str:
    """``sglang/srt/managers/scheduler.py(1763): run_batch`` -> ``run_batch``."""
    match = _PYTHON_NAME.search(name)
    return match.group("function") if match else name


def traced_function(event: dict) -> str | None:
    """The scheduler or worker function an event times: a Python stack event, or a profiler range named
    ``scheduler.<function>`` / ``ddtree.<function>``; None for anything else."""
    if event.get("cat") == "python_function":
        return python_function(event["name"])
    if event.get("cat") == "user_annotation" and event["name"].startswith(_RANGE_PREFIXES):
        return event["name"].split(".", 1)[1]
    return None


def outermost(events: list[Event]) -> list[Event]:
    """The events not inside another of the list (a recursive or re-entered function counts once)."""
    kept: list[Event] = []
    for event in sorted(events, key=lambda e: (e.start, -e.end)):
        if not kept or event.start >= kept[-1].end:
            kept.append(event)
    return kept


def overlap(events: list[Event], start: float, end: float) -> float:
    """Microseconds of [start, end) covered by the union of ``events``."""
    covered, cursor = 0.0, start
    for event in sorted(events, key=lambda e: e.start):
        lo, hi = max(event.start, cursor), min(event.end, end)
        if hi > lo:
            covered += hi - lo
            cursor = hi
    return covered


def account_steps(trace: list[dict]) -> list[StepAccount]:
    """One :class:`StepAccount` per complete scheduler iteration of the trace (between consecutive ``run_batch``
    starts on the scheduler's thread)."""
    complete = [e for e in trace if e.get("ph") == "X" and "dur" in e]
    runs = [e for e in complete if traced_function(e) == "run_batch"]
    if not runs:
        return []
    threads = Counter((e["pid"], e["tid"]) for e in runs)
    thread = threads.most_common(1)[0][0]  # the scheduler's
    host = [e for e in complete if (e["pid"], e["tid"]) == thread]
    by_function: dict[str, list[Event]] = defaultdict(list)
    syncs, launches = [], []
    for e in host:
        event = Event(e["name"], e["ts"], e["ts"] + e["dur"])
        function = traced_function(e)
        if function is not None:
            by_function[function].append(event)
        elif SYNC_CALLS.match(e["name"]):
            syncs.append(event)
        elif LAUNCH_CALLS.match(e["name"]):
            launches.append(event)
    gpu: dict[str, list[Event]] = defaultdict(list)
    for e in complete:
        if e.get("cat") in GPU_CATEGORIES:
            gpu[e["cat"]].append(Event(e["name"], e["ts"], e["ts"] + e["dur"]))
    all_gpu = [event for events in gpu.values() for event in events]
    starts = sorted(e.start for e in outermost(by_function["run_batch"]))
    steps = []
    for start, end in zip(starts, starts[1:]):
        def inside(events: list[Event]) -> list[Event]:
            return [e for e in events if start <= e.start < end]

        scheduler = {f: sum(e.end - e.start for e in outermost(inside(by_function[f]))) / 1e3 for f in SCHEDULER_FUNCTIONS}
        wall = (end - start) / 1e3
        scheduler["loop"] = max(0.0, wall - sum(scheduler.values()))
        worker = {f: sum(e.end - e.start for e in outermost(inside(by_function[f]))) / 1e3
                  for f in (*WORKER_FUNCTIONS, *SPEC_FUNCTIONS) if inside(by_function[f])}  # fmt: skip
        step_launches = inside(launches)
        busy = overlap(all_gpu, start, end) / 1e3
        steps.append(StepAccount(
            wall=wall, scheduler=scheduler, worker=worker,
            sync=sum(e.end - e.start for e in outermost(inside(syncs))) / 1e3,
            launch=sum(e.end - e.start for e in step_launches) / 1e3, launches=len(step_launches),
            graph_launches=sum(e.name == GRAPH_LAUNCH for e in step_launches),
            gpu_busy=busy, gpu_idle=max(0.0, wall - busy),
            gpu_by_category={c: overlap(events, start, end) / 1e3 for c, events in gpu.items()},
        ))  # fmt: skip
    return steps


def median_step(steps: list[StepAccount]) -> dict:
    """The per-field median over ``steps`` (dict fields key by key), for a report row."""
    if not steps:
        return {}

    def med(values: list[float]) -> float:
        return round(statistics.median(values), 3)

    return {
        "steps": len(steps),
        "wall_ms": med([s.wall for s in steps]),
        "scheduler_ms": {k: med([s.scheduler.get(k, 0.0) for s in steps]) for k in [*SCHEDULER_FUNCTIONS, "loop"]},
        "worker_ms": {k: med([s.worker.get(k, 0.0) for s in steps]) for k in (*WORKER_FUNCTIONS, *SPEC_FUNCTIONS)
                      if any(k in s.worker for s in steps)},
        "sync_ms": med([s.sync for s in steps]),
        "launch_ms": med([s.launch for s in steps]),
        "launches": med([s.launches for s in steps]),
        "graph_launches": med([s.graph_launches for s in steps]),
        "gpu_busy_ms": med([s.gpu_busy for s in steps]),
        "gpu_idle_ms": med([s.gpu_idle for s in steps]),
    }  # fmt: skip
