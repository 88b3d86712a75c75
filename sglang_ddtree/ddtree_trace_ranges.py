"""Profiler ranges inside SGLang's speculative verify (``SGLANG_DDTREE_TRACE_RANGES=1``, for ``bench.step_profile``).

A trace without Python stacks (stacks crashed SGLang's scheduler on the H200, tests/gpu/RESULTS.md run 34) sees
only ranges: SGLang's scheduler functions, DDTreeWorker's phases, and nothing inside SGLang's verify, where most
of a DDTree step goes. With the variable set, AROUND hooks open a ``spec.<function>`` range around each SGLang
function below, for every algorithm that calls it (AR's target forward, MTP's and DDTREE's EAGLE verify,
DFLASH's draft-context append), so ``bench.step_trace`` can split the verify into plan, replay, acceptance and
commits. Off by default: each hooked call costs one Python frame more.
"""

from __future__ import annotations

import os
from typing import Any, Callable

TRACE_RANGES_ENV = "SGLANG_DDTREE_TRACE_RANGES"
_SPEC = "sglang.srt.speculative"
_GRAPH_RUNNER = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner"
TRACED_FUNCTIONS = {  # range name -> SGLang 0.5.17 function
    "target_forward": "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation",
    "eagle_prepare_for_verify": f"{_SPEC}.eagle_utils.eagle_prepare_for_verify",
    "graph_load_batch": f"{_GRAPH_RUNNER}.load_batch",
    "graph_execute": f"{_GRAPH_RUNNER}.execute",
    "eagle_sample": f"{_SPEC}.eagle_utils.eagle_sample",
    "commit_mamba_states_after_verify": f"{_SPEC}.spec_utils.commit_mamba_states_after_verify",
    "finalize_accept_tree_path": f"{_SPEC}.eagle_worker_common._finalize_accept_tree_path",
    "append_target_hidden_to_draft_kv": f"{_SPEC}.dflash_worker_v2.DFlashWorkerV2._append_target_hidden_to_draft_kv_by_loc",
}


def trace_ranges_requested() -> bool:
    return os.environ.get(TRACE_RANGES_ENV, "0") not in ("", "0", "false", "False")


def _in_range(name: str) -> Callable[..., Any]:
    def around(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from sglang.srt.utils.nvtx_utils import profile_range

        with profile_range(name):
            return original(*args, **kwargs)

    return around


def register(registry: Any, hook_type: Any) -> None:
    for name, target in TRACED_FUNCTIONS.items():
        registry.register(target, _in_range(f"spec.{name}"), hook_type.AROUND)
