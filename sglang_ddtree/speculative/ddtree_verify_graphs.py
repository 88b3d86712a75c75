"""Target-verify CUDA graphs for every width of ``--budget auto``.

SGLang's ``DecodeCudaGraphRunner`` replays one capture width (the server's ``--speculative-num-draft-tokens``) and
refuses any other (``can_run_graph``), so without more graphs a step that verifies a narrower tree runs the target
eagerly: on a small target that costs more than the narrower tree saves. SGLang solves the same problem for EAGLE's
adaptive step counts (``EAGLEWorkerV2.build_adaptive_runtime_state`` / ``apply_runtime_state``): one target
attention backend and one graph runner per shape, swapped into the target's model runner. This module does that
for the widths of the step time table, and swaps them in for the verify of one step only (``verifying``): prefill,
idle and the draft keep the server's own runner and backend.

Each width needs its own attention backend: a backend's graph state (FlashInfer's per-batch-size wrappers and mask
buffers, the GDN backend's per-batch-size indices) is allocated for one token count per request. The backends share
FlashInfer's float workspace, as SGLang's target and draft backends already do: it only holds a kernel's
temporaries, and one stream runs the widths' verifies one after another. The graph runners share SGLang's input
buffers (``share_input_buffer`` never repoints a captured buffer) and its graph memory pool.

On by default under ``--budget auto``: the GPU suite showed every width's replays equal to eager re-runs and the
outputs lossless on dense targets (tests/gpu/RESULTS.md run 47) and on hybrid (GDN) targets with the snapshot-free
verify (run 85: 324 verifies over widths 1-17, 8 argmax flips in 5,686 rows at bf16 ties, greedy == AR by the margin
rule); ``SGLANG_DDTREE_AUTO_VERIFY_GRAPHS=0`` verifies the narrower widths eagerly instead (run 45's path), which on
a 27B hybrid target cost 57-86 ms a step where its graphed widest took 27-79 (runs 83-84).

Their memory comes out of the KV cache's budget (``verify_graphs_bytes``), not out of the slack that
``--mem-fraction-static`` leaves for activations: captured after the pools, they took 0.89 GB of an 80 GB card's
6.1 GB slack at Qwen3.6-27B's shape and 16 requests, and the first decode after 16 prefills of 1,024 tokens failed
to launch a kernel for lack of memory (RESULTS run 88).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any, Iterator

from sglang_ddtree.env_flags import env_flag

if TYPE_CHECKING:
    from sglang.srt.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)

AUTO_VERIFY_GRAPHS_ENV = "SGLANG_DDTREE_AUTO_VERIFY_GRAPHS"

# Beyond its output logits, one width's graphs and attention backend took 0.10-0.12 GB at Qwen3.6-27B's shape and
# 16 requests (RESULTS run 88: 0.119 GB for width 1, whose fp32 logits are 16 MB).
GRAPH_BYTES_PER_WIDTH = 128 << 20


def verify_graphs_per_width_requested() -> bool:
    return env_flag(AUTO_VERIFY_GRAPHS_ENV, default=True)


class VerifyGraphsPerWidth:
    """A target model runner's verify graphs by tree width: its own runner at its capture width, added ones below."""

    def __init__(self, target_runner: ModelRunner, added: dict[int, tuple[Any, Any]]) -> None:
        """``added``: width -> (attention backend, graph runner) captured for that width."""
        self.target_runner = target_runner
        self.added = added
        self.replays = {width: 0 for width in self.widths}

    @property
    def widths(self) -> list[int]:
        """Every width a verify graph exists for, the server's own capture width included."""
        return sorted({*self.added, self.target_runner.decode_cuda_graph_runner.captured_req_width})

    def has_graph(self, width: int) -> bool:
        return width in self.replays

    @contextlib.contextmanager
    def verifying(self, width: int) -> Iterator[None]:
        """The target runner replays (or plans eagerly with) ``width``'s runner and backend inside the block."""
        if width not in self.added:
            yield
            return
        runner = self.target_runner
        saved = runner.attn_backend, runner.decode_cuda_graph_runner
        runner.attn_backend, runner.decode_cuda_graph_runner = self.added[width]
        try:
            yield
        finally:
            runner.attn_backend, runner.decode_cuda_graph_runner = saved

    def record(self, width: int, replayed: bool) -> None:
        """After a verify of ``width`` nodes per request; ``replayed``: it ran a graph (a host flag, no read)."""
        if replayed and width in self.replays:
            self.replays[width] += 1

    def report(self) -> dict[str, list[int]]:
        return {"graph_widths": self.widths, "graph_replays": [self.replays[w] for w in self.widths]}


def verify_graphs_bytes(widths: list[int], max_batch_size: int, vocab_size: int, hidden_size: int) -> int:
    """What verify graphs of ``widths`` keep on the GPU (an upper estimate): each width's graphs hold their
    output logits (fp32) and hidden states for ``max_batch_size x width`` rows, and its attention backend and graph
    runner their own buffers (``GRAPH_BYTES_PER_WIDTH``)."""
    row_bytes = vocab_size * 4 + hidden_size * 2 * 4
    return sum(max_batch_size * width * row_bytes + GRAPH_BYTES_PER_WIDTH for width in widths)


def capture_verify_graphs(target_runner: ModelRunner, widths: list[int]) -> VerifyGraphsPerWidth:
    """Capture the target's verify graphs at each of ``widths`` it has none for yet (all batch sizes SGLang captures).

    The caller checks that the target runner replays graphs at all (``DecodeCudaGraphRunner``).
    """
    from sglang.srt.model_executor.model_runner_components.attention_backend_setup import get_attention_backend
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.utils import get_available_gpu_memory

    own = target_runner.decode_cuda_graph_runner
    added: dict[int, tuple[Any, Any]] = {}
    for width in sorted(set(widths) - {own.captured_req_width}):
        before, tic = get_available_gpu_memory(target_runner.device, target_runner.gpu_id), time.perf_counter()
        backend = _new_attention_backend(target_runner, get_attention_backend)
        graph_runner = DecodeCudaGraphRunner(
            target_runner,
            attn_backend=backend,
            speculative_num_steps=own.speculative_num_steps,
            speculative_num_draft_tokens=width,
        )
        added[width] = (backend, graph_runner)
        after = get_available_gpu_memory(target_runner.device, target_runner.gpu_id)
        logger.info("DDTREE verify graphs of width %d: bs=%s, %.2f s, %.3f GB", width, graph_runner.capture_bs,
                    time.perf_counter() - tic, before - after)  # fmt: skip
    return VerifyGraphsPerWidth(target_runner, added)


def _new_attention_backend(target_runner: ModelRunner, get_attention_backend: Any) -> Any:
    """A second target attention backend like the first (same kinds, FlashInfer's float workspace shared)."""
    own = target_runner.attn_backend
    saved = getattr(target_runner, "init_new_workspace", False)  # SGLang's builder sets it on the runner
    try:
        backend = get_attention_backend(model_runner=target_runner, init_new_workspace=False)
    finally:
        target_runner.init_new_workspace = saved
    backend.prefill_attention_backend_str = own.prefill_attention_backend_str
    backend.decode_attention_backend_str = own.decode_attention_backend_str
    return backend
