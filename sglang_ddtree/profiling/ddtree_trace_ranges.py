"""Where a decode step's host time goes, without a profiler trace (``SGLANG_DDTREE_TRACE_RANGES=1``).

SGLang 0.5.17's torch-profiler traces crash the scheduler on the H200 machine (SIGSEGV in kineto's destructor
of the profiler result, with and without Python stacks: tests/gpu/RESULTS.md runs 34 and 36), and a trace without
stacks sees nothing inside SGLang's verify, where most of a DDTree step goes. With the variable set, AROUND hooks
around the scheduler's functions and SGLang's speculative-decoding functions below (and DDTreeWorker's phases,
through :func:`traced_range`) each

- open a ``spec.<name>`` profiler range (``bench.step_trace`` accounts them when a trace is taken), and
- add their host wall time (``time.perf_counter``, no device synchronisation) to a per-name total that
  ``/server_info`` reports as ``ddtree_host_ranges``.

``bench.step_profile`` divides the totals' growth over a measured cell by its scheduler iterations. Under
overlap scheduling the host time of ``process_batch_result`` includes waiting for the previous step's results
to reach the host: it is where a GPU-bound loop waits, so a short one means the host is the bottleneck.
Nested names overlap (``target_forward`` contains ``graph_execute``). Off by default: each hooked call costs
~1 µs of Python.

``run_batch``'s range opens only after SGLang's profiler step (``SchedulerProfilerManager.
_profile_batch_predicate``, the first thing ``run_batch`` does), where ``/start_profile`` with ``profile_by_stage``
stops one torch profiler and starts the next: a ``record_function`` range entered under one profiler and left
under the next corrupted the CPU engine's heap (``free(): invalid next size``, the scheduler aborted) whenever the
allocator's layout let it show.

``SGLANG_DDTREE_SYNC_DEBUG=1`` also turns on torch's CUDA synchronisation debug mode (``warn``) at the first
decode batch: every synchronising call of the decode loop is logged once per source line, with its stack.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from typing import Any, Callable, Iterator, Optional

from sglang_ddtree.env_flags import env_flag

TRACE_RANGES_ENV = "SGLANG_DDTREE_TRACE_RANGES"
SYNC_DEBUG_ENV = "SGLANG_DDTREE_SYNC_DEBUG"
_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
_SPEC = "sglang.srt.speculative"
_GRAPH_RUNNER = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner"
_PROFILER_STEP = ("sglang.srt.managers.scheduler_components.profiler_manager.SchedulerProfilerManager."
                  "_profile_batch_predicate")
SCHEDULER_FUNCTIONS = ("process_input_requests", "get_next_batch_to_run", "run_batch", "process_batch_result",
                       "launch_batch_sample_if_needed")  # fmt: skip
TRACED_FUNCTIONS = {  # range name -> SGLang 0.5.17 function
    **{name: f"{_SCHEDULER}.{name}" for name in SCHEDULER_FUNCTIONS},
    "model_runner_forward": "sglang.srt.model_executor.model_runner.ModelRunner.forward",
    "target_forward": "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation",
    "dflash_forward_batch_generation": f"{_SPEC}.dflash_worker_v2.DFlashWorkerV2.forward_batch_generation",
    "eagle_prepare_for_verify": f"{_SPEC}.eagle_utils.eagle_prepare_for_verify",
    "graph_load_batch": f"{_GRAPH_RUNNER}.load_batch",
    "graph_execute": f"{_GRAPH_RUNNER}.execute",
    "eagle_sample": f"{_SPEC}.eagle_utils.eagle_sample",
    "commit_mamba_states_after_verify": f"{_SPEC}.spec_utils.commit_mamba_states_after_verify",
    "finalize_accept_tree_path": f"{_SPEC}.eagle_worker_common._finalize_accept_tree_path",
    "append_target_hidden_to_draft_kv": f"{_SPEC}.dflash_worker_v2.DFlashWorkerV2._append_target_hidden_to_draft_kv_by_loc",
    # inside the above: the graph runners' input copies, replays and FlashInfer plan inputs, the tree path's
    # compaction, the drafter's projection of the committed features, and the scheduler's per-step bookkeeping
    "graph_fill_buffers": "sglang.srt.model_executor.cuda_graph_buffer_registry.CudaGraphBufferRegistry.fill_from",
    "graph_replay": "sglang.srt.model_executor.runner_backend.full_cuda_graph_backend.FullCudaGraphBackend.replay",
    "verify_plan_inputs": f"{_SPEC}.eagle_info.EagleVerifyInput.generate_attn_arg_prefill",
    "draft_block_plan_inputs": f"{_SPEC}.dflash_info.DFlashVerifyInput.generate_attn_arg_prefill",
    "move_accepted_kv": f"{_SPEC}.eagle_worker_common.move_accept_tokens_to_target_kvcache",
    "compact_accept_to_front": f"{_SPEC}.eagle_worker_common._compact_accept_to_front",
    "draft_project_target_hidden": "sglang.srt.models.dflash.DFlashDraftModel.project_target_hidden",
    "resolve_seq_lens_cpu": "sglang.srt.managers.overlap_utils.FutureMap.resolve_seq_lens_cpu",
    # inside eagle_sample under --simulate-tau (SGLang's, or DDTREE's along the best branch): a benchmark's own
    # cost, which a served step does not pay
    "simulated_accept_index": f"{_SPEC}.spec_utils.generate_simulated_accept_index",
    "process_batch_result_decode": ("sglang.srt.managers.scheduler_components.batch_result_processor."
                                    "SchedulerBatchResultProcessor.process_batch_result_decode"),
    "stream_output": "sglang.srt.managers.scheduler_components.output_streamer.SchedulerOutputStreamer.stream_output",
}


def trace_ranges_requested() -> bool:
    return env_flag(TRACE_RANGES_ENV)


class HostRanges:
    """Calls and host seconds per range name, summed since the process started."""

    def __init__(self) -> None:
        self.enabled = trace_ranges_requested()
        self.calls: dict[str, int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)

    def add(self, name: str, seconds: float) -> None:
        self.calls[name] += 1
        self.seconds[name] += seconds

    def as_dict(self) -> dict[str, dict[str, float]]:
        return {name: {"calls": self.calls[name], "total_ms": round(1e3 * self.seconds[name], 4)} for name in self.calls}


HOST_RANGES = HostRanges()


@contextlib.contextmanager
def traced_range(name: str) -> Iterator[None]:
    """A ``ddtree.<name>`` profiler range (one flag check when no profiler runs), host-timed when asked."""
    from sglang.srt.utils.nvtx_utils import profile_range

    if not HOST_RANGES.enabled:
        with profile_range(f"ddtree.{name}"):
            yield
        return
    start = time.perf_counter()
    try:
        with profile_range(f"ddtree.{name}"):
            yield
    finally:
        HOST_RANGES.add(name, time.perf_counter() - start)


def host_ranges_report() -> Optional[dict]:
    return HOST_RANGES.as_dict() if HOST_RANGES.enabled else None


def _timed(name: str) -> Callable[..., Any]:
    def around(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from sglang.srt.utils.nvtx_utils import profile_range

        start = time.perf_counter()
        try:
            with profile_range(f"spec.{name}"):
                return original(*args, **kwargs)
        finally:
            HOST_RANGES.add(name, time.perf_counter() - start)

    return around


# Ranges of run_batch calls in progress whose profiler range waits for the profiler step (innermost last).
_AFTER_PROFILER_STEP: list[contextlib.ExitStack] = []


def _timed_after_profiler_step(name: str) -> Callable[..., Any]:
    """Like :func:`_timed`, but the profiler range opens in :func:`_open_after_profiler_step`."""

    def around(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        ranges = contextlib.ExitStack()
        _AFTER_PROFILER_STEP.append(ranges)
        try:
            return original(*args, **kwargs)
        finally:
            _AFTER_PROFILER_STEP.pop()
            ranges.close()
            HOST_RANGES.add(name, time.perf_counter() - start)

    return around


def _open_after_profiler_step(result: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER SGLang's profiler step: open the ``spec.run_batch`` range of the run_batch call that made it."""
    from sglang.srt.utils.nvtx_utils import profile_range

    if _AFTER_PROFILER_STEP:
        _AFTER_PROFILER_STEP[-1].enter_context(profile_range("spec.run_batch"))
    return result


def _start_the_decode_trace_outside_the_run_batch_that_ends_the_prefill_trace(
    original: Callable[..., Any], manager: Any, batch: Any, *args: Any, **kwargs: Any
) -> Any:
    """AROUND SGLang's profiler step: with ``profile_by_stage``, the first decode batch stops the prefill trace and
    starts the decode trace inside one ``run_batch``, whose own profiler range (SGLang's ``profile_method``) then
    ends under another profiler than it began in; the CPU engine's scheduler aborted on a corrupted heap. Here that
    batch only stops the prefill trace, and the decode trace starts at the next decode batch, whose ``run_batch``
    began with no profiler running."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    if (getattr(manager, "profile_by_stage", False) and batch is not None and batch.forward_mode.is_decode()
            and manager.profiler_decode_ct == 0 and manager.profile_in_progress):  # fmt: skip
        manager._stop_profile(stage=ForwardMode.EXTEND)
        return None
    return original(manager, batch, *args, **kwargs)


def _debug_syncs_from_the_first_decode(original: Callable[..., Any], scheduler: Any, batch: Any, *args: Any,
                                       **kwargs: Any) -> Any:  # fmt: skip
    import torch

    if batch is not None and batch.forward_mode.is_decode() and torch.cuda.get_sync_debug_mode() == 0:
        torch.cuda.set_sync_debug_mode("warn")
    return original(scheduler, batch, *args, **kwargs)


def register(registry: Any, hook_type: Any) -> None:
    """The hooks the environment asks for (none by default)."""
    if trace_ranges_requested():
        for name, target in TRACED_FUNCTIONS.items():
            timed = _timed_after_profiler_step(name) if name == "run_batch" else _timed(name)
            registry.register(target, timed, hook_type.AROUND)
        registry.register(_PROFILER_STEP, _open_after_profiler_step, hook_type.AFTER)
        registry.register(_PROFILER_STEP, _start_the_decode_trace_outside_the_run_batch_that_ends_the_prefill_trace,
                          hook_type.AROUND)  # fmt: skip
    if env_flag(SYNC_DEBUG_ENV):
        registry.register(f"{_SCHEDULER}.run_batch", _debug_syncs_from_the_first_decode, hook_type.AROUND)
