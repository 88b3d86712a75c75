"""Which requests a DDTREE server serves: DFlash's admission check, named for DDTREE, plus what a tree cannot
serve exactly. A refused request finishes with an abort whose message the HTTP API returns as a 400."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

import sglang_ddtree

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req

# (sampling parameter, its neutral value): logit processors that depend on how many tokens precede each one.
# SGLang's speculative verify applies them once per request, to every node of the step, not per node along a
# drafted path: penalties were ignored on DDTREE's path (greedy output differed from AR's on every case tried),
# and ``min_new_tokens``' stop-token mask stayed on nodes past its end, replacing a stop AR emits there
# (tests/test_ddtree_edge_cases_cpu.py).
UNSERVABLE_SAMPLING_PARAMS = (
    ("frequency_penalty", 0.0), ("presence_penalty", 0.0), ("repetition_penalty", 1.0), ("min_new_tokens", 0),
)  # fmt: skip


def _serving_ddtree() -> bool:
    from sglang.srt.runtime_context import get_spec

    return get_spec().speculative_algorithm == sglang_ddtree.DDTREE_ALGORITHM_NAME


def refuse_what_ddtree_cannot_serve(original: Callable[..., Optional[str]], req: Req, enable_overlap: bool) -> Optional[str]:
    """AROUND ``dflash_utils.validate_dflash_request`` (the scheduler's admission check for the DFlash family)."""
    error = original(req, enable_overlap)
    if not _serving_ddtree():
        return error
    if error is not None:
        return error.replace("DFLASH", sglang_ddtree.DDTREE_ALGORITHM_NAME)
    unservable = [name for name, neutral in UNSERVABLE_SAMPLING_PARAMS if getattr(req.sampling_params, name) != neutral]
    if unservable:
        return (f"DDTREE speculative decoding does not support {', '.join(unservable)}: a tree verify cannot apply "
                "them along the drafted tokens; serve such requests without speculative decoding.")  # fmt: skip
    return None
