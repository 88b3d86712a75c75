"""DDTREE's snapshot-free tree verify through Gated DeltaNet layers (issue 17): on by default, lossless on the GPU
suite (greedy, graphs, prefix cache, sampling) and faster than SGLang's per-node snapshots (RESULTS runs 71-73);
``SGLANG_DDTREE_GDN_WY_VERIFY=0`` keeps SGLang's path.

SGLang 0.5.17 verifies a tree through a GDN layer node by node: its conv (``causal_conv1d_update`` with
``retrieve_next_token / sibling``) writes every node's conv window to the layer's ``intermediate_conv_window``
buffer, its recurrence (``GDNKernelDispatcher.target_verify`` with ``retrieve_parent_token``) every node's state to
``intermediate_ssm``, and the commit copies the accepted node's (and a prefix-cache track node's) window and state
into the pool (``scatter_mamba_states_after_mtp_verify``). Three AROUND hooks put ``kernels/gdn_tree_conv.py`` and
``kernels/gdn_tree.py`` in their place on a DDTREE server: the conv writes each node's input, the recurrence
computes every node's output from the root state and leaves the commit data in the request's row of the SSM
buffer, and the commit builds the requested nodes' windows and states from those and the root's, which stay in
the request's slot until the request's own commit replaces them. The per-request buffer holds the workspace's
states, with one conv input per node in them, not N windows and N states (``gdn_workspace_pool``). A float32
state buffer is required (the commit data are float32); with ``--mamba-ssm-dtype bfloat16`` the hooks (and the
buffers' sizes) leave SGLang's path in place and say so once. Where the pool is not the package's
(``--enable-unified-memory``) the conv and its windows stay SGLang's and only the recurrence is replaced.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Optional

import torch

from sglang_ddtree.env_flags import env_flag

logger = logging.getLogger(__name__)

WY_VERIFY_ENV = "SGLANG_DDTREE_GDN_WY_VERIFY"
VERIFY_TARGET = "sglang.srt.layers.attention.linear.gdn_backend.GDNKernelDispatcher.target_verify"
# The name the GDN backend's extend path calls for decode and target-verify convolutions, bound at its import.
CONV_TARGET = "sglang.srt.layers.attention.linear.gdn_backend.causal_conv1d_update"
# The name the hybrid backend's commit calls (``update_mamba_state_after_mtp_verify``), bound at its import.
SCATTER_TARGET = "sglang.srt.layers.attention.hybrid_linear_attn_backend.scatter_mamba_states_after_mtp_verify"
_counts = {"layer_verifies": 0, "layer_convs": 0, "parents_fills": 0, "commits": 0}
_warned = False


def wy_verify_requested() -> bool:
    return env_flag(WY_VERIFY_ENV, default=True)


def serving_ddtree() -> bool:
    import sglang_ddtree
    from sglang.srt.runtime_context import get_spec

    return get_spec().speculative_algorithm == sglang_ddtree.DDTREE_ALGORITHM_NAME


def float32_states(dtype: torch.dtype) -> bool:
    global _warned
    if dtype == torch.float32:
        return True
    if not _warned:
        logger.warning("DDTREE's snapshot-free GDN verify (%s) needs float32 GDN states; %s states keep SGLang's "
                       "per-node snapshots", WY_VERIFY_ENV, dtype)  # fmt: skip
        _warned = True
    return False


def tree_capacity() -> int:
    """N, the tree width every workspace is laid out for: the per-node buffers' node count SGLang sizes
    (``max_speculative_num_draft_tokens``), not the SSM buffer's, which holds only the workspace's states."""
    from sglang.srt.runtime_context import get_server_args

    return int(get_server_args().max_speculative_num_draft_tokens)


def convolve_tree_without_windows(original: Callable[..., torch.Tensor], x: torch.Tensor, conv_states: torch.Tensor,
                                  weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                                  activation: Any = None, **kwargs: Any) -> torch.Tensor:  # fmt: skip
    """AROUND the GDN backend's ``causal_conv1d_update``: a DDTREE tree verify's conv through one GDN layer, where
    the pool holds one input per node (a decode step's conv, and any conv on other pools, stay SGLang's)."""
    from sglang_ddtree.kernels.gdn_tree_conv import gdn_tree_conv
    from sglang_ddtree.speculative.gdn_workspace_pool import conv_inputs_in_place, first_gdn_layer

    parents = kwargs.get("retrieve_parent_token")
    if not conv_inputs_in_place():
        return original(x, conv_states, weight, bias, activation, **kwargs)
    if parents is None:
        if kwargs.get("intermediate_conv_window") is not None:  # SGLang's kernel would write windows into it
            raise RuntimeError("DDTREE: a GDN verify without tree links on a pool that holds one conv input per "
                               "node, not a window (DDTREE always verifies trees)")  # fmt: skip
        return original(x, conv_states, weight, bias, activation, **kwargs)
    bs = x.shape[0]
    inputs = kwargs["intermediate_conv_window"]
    fill_parents = first_gdn_layer(inputs)
    out = gdn_tree_conv(
        x, conv_states, weight, bias, activation, kwargs["conv_state_indices"][:bs], kwargs["retrieve_next_token"],
        kwargs["retrieve_next_sibling"], parents, inputs.view(inputs.shape[0], -1),
        kwargs["intermediate_state_indices"][:bs], parents_filled=not fill_parents,
    )  # fmt: skip
    _counts["layer_convs"] += 1
    _counts["parents_fills"] += fill_parents
    return out


def verify_tree_from_the_root_state(original: Callable[..., torch.Tensor], dispatcher: Any, A_log: torch.Tensor,
                                    dt_bias: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                    a: torch.Tensor, b: torch.Tensor, **kwargs: Any) -> torch.Tensor:  # fmt: skip
    """AROUND ``GDNKernelDispatcher.target_verify``: a DDTREE tree verify through one GDN layer."""
    from sglang_ddtree.kernels.gdn_tree import gdn_tree_verify

    parents, snapshots = kwargs.get("retrieve_parent_token"), kwargs.get("intermediate_states_buffer")
    if parents is None or snapshots is None or not serving_ddtree() or not float32_states(snapshots.dtype):
        return original(dispatcher, A_log, dt_bias, q, k, v, a, b, **kwargs)
    bs, T = parents.shape
    out = gdn_tree_verify(
        q.view(bs, T, *q.shape[2:]), k.view(bs, T, *k.shape[2:]), v.view(bs, T, *v.shape[2:]),
        a.view(bs, T, -1), b.view(bs, T, -1), A_log, dt_bias, kwargs["ssm_states"], kwargs["cache_indices"][:bs],
        parents, snapshots.view(snapshots.shape[0], -1), kwargs["intermediate_state_indices"][:bs],
        scale=q.shape[-1] ** -0.5, capacity=tree_capacity(),
    )  # fmt: skip
    _counts["layer_verifies"] += 1
    return out.view_as(v)


def commit_nodes_from_the_root_state(
    original: Callable[..., None], mamba_caches: Any, state_indices: torch.Tensor,
    last_correct_step_indices: torch.Tensor, mamba_track_indices: Optional[torch.Tensor],
    mamba_steps_to_track: Optional[torch.Tensor],
) -> None:
    """AROUND ``scatter_mamba_states_after_mtp_verify`` (SGLang's commit after a verify: each request's accepted
    node into its slot, a prefix-cache track node into its track slot; SSM states, then conv windows). The states
    and windows are built from the root's in the request's slot and what the verify left, the track node's first:
    the request's own commit then replaces the root's. Where the pool holds conv windows (not the package's pool),
    SGLang's scatter copies them."""
    from sglang_ddtree.kernels.gdn_tree import gdn_tree_commit
    from sglang_ddtree.kernels.gdn_tree_conv import gdn_tree_conv_commit
    from sglang_ddtree.kernels.gdn_workspace import parents_offset
    from sglang_ddtree.speculative.gdn_workspace_pool import conv_inputs_in_place

    ssm_states, workspace = mamba_caches.temporal, mamba_caches.intermediate_ssm
    args = (last_correct_step_indices, mamba_track_indices, mamba_steps_to_track)
    if not serving_ddtree() or workspace is None or ssm_states.numel() == 0 or not float32_states(workspace.dtype):
        return original(mamba_caches, state_indices, *args)
    workspace = workspace.view(*workspace.shape[:2], -1)
    capacity = tree_capacity()  # the layout every verify wrote, whatever its tree's width
    commits = [(mamba_track_indices, mamba_steps_to_track)] if mamba_track_indices is not None else []
    commits.append((state_indices, last_correct_step_indices))  # the request's own last: it replaces the root's
    if conv_inputs_in_place():
        HV, V, K = ssm_states.shape[2:]
        start = parents_offset(capacity, HV, K, V)
        parents = workspace[:, :, start:start + capacity]
        for conv_states, inputs in zip(mamba_caches.conv, mamba_caches.intermediate_conv_window):
            for slots, nodes in commits:
                gdn_tree_conv_commit(conv_states, inputs.view(*inputs.shape[:2], -1), parents, slots, nodes,
                                     source_indices=state_indices)  # fmt: skip
    for slots, nodes in commits:
        gdn_tree_commit(ssm_states, workspace, slots, nodes, capacity, source_indices=state_indices)
    _counts["commits"] += 1
    if conv_inputs_in_place():
        return None
    # SGLang's scatter skips the SSM states when there are none: only the conv windows are left to it.
    return original(dataclasses.replace(mamba_caches, temporal=ssm_states[:0]), state_indices, *args)


def wy_verify_report() -> dict[str, Any] | None:
    """For ``/server_info``: how often this process ran the snapshot-free verify and commit (the verify counts
    Python calls, so a CUDA-graph replay is counted once, at its capture), and the per-request buffer it had."""
    from sglang_ddtree.speculative.gdn_workspace_pool import workspace_pool_report

    if not wy_verify_requested():
        return None
    pool = workspace_pool_report()
    return {**_counts, **({"intermediate_buffers": pool} if pool is not None else {})}


def register(registry: Any, hook_type: Any) -> None:
    from sglang_ddtree.speculative import gdn_workspace_pool
    registry.register(CONV_TARGET, convolve_tree_without_windows, hook_type.AROUND)
    registry.register(VERIFY_TARGET, verify_tree_from_the_root_state, hook_type.AROUND)
    registry.register(SCATTER_TARGET, commit_nodes_from_the_root_state, hook_type.AROUND)
    gdn_workspace_pool.register(registry, hook_type)
