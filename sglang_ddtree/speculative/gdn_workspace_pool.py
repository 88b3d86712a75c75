"""The snapshot-free GDN tree verify's per-request buffer: one workspace row per GDN layer, a few SSM states' worth,
that holds the recurrence's commit data and every tree node's conv input, not an SSM state and a conv window per
node (the default for float32 states; ``SGLANG_DDTREE_GDN_WY_VERIFY=0`` keeps SGLang's buffers).

For the tree verify of a hybrid GDN target SGLang 0.5.17 gives every request slot, in every GDN layer, N SSM
states (``MambaPool``'s ``intermediate_ssm``, ``[layers, max_running_requests + 1, N, HV, V, K]``, N =
``max_speculative_num_draft_tokens``) and N conv windows (``intermediate_conv_window``, ``[layers, slots + 1, N,
dim, W - 1]``), and its memory sizing (``KVCacheConfigurator._handle_max_mamba_cache``) sets aside N x (conv window
+ SSM state) per request and layer for them. The snapshot-free verify (``hybrid_tree_verify``) writes only
``workspace_numel(N, HV, K, V)`` floats of that SSM buffer per request and layer, and its tree conv
(``gdn_tree_conv``) one ``[dim]`` input per node after them (``gdn_workspace``): at Qwen3.6-27B's heads and N = 33,
0.73 of one state (1 slot), where SGLang keeps 33 states and 33 windows (73 MiB per node over its 48 GDN layers at
TP 2: 2.37 GiB per request slot). Two AROUND hooks, on the target:

- the sizing runs SGLang's own solve with N replaced by the layout's size in the unit SGLang charges (one node's
  conv window + SSM state: :attr:`WorkspaceLayout.reserved_node_states`), so the memory the per-node states no
  longer take goes where that solve puts memory: the KV cache, and more mamba slots where it sizes those;
- the pool is built with the workspace's slots as its draft-token count, then its conv windows are replaced by
  views of the workspace rows' tail, ``[layers, slots + 1, N, dim]`` in the conv dtype, in the same list
  (``intermediate_conv_window``), which only the package's tree conv and commit read
  (:func:`conv_inputs_in_place`).

Only for a DDTREE server's GDN hybrid target with float32 SSM states (the WY verify's requirement; with others the
verify and these buffers stay SGLang's, said once in the log) in SGLang's ``MambaPool`` (``--enable-unified-memory``
builds its own pool: its buffers keep N states and N windows, which the WY verify and SGLang's tree conv serve).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from sglang_ddtree.kernels.gdn_workspace import conv_inputs_offset, workspace_slots

logger = logging.getLogger(__name__)

SIZING_TARGET = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._handle_max_mamba_cache"
POOL_TARGET = "sglang.srt.mem_cache.memory_pool.MambaPool.__init__"
_MIB = 1 << 20


@dataclass(frozen=True)
class WorkspaceLayout:
    """One request's per-node buffers in one GDN layer under the WY verify: ``ssm_slots`` SSM states' worth
    (``ssm_bytes`` each) of workspace, which also holds the ``nodes`` conv inputs (``conv_input_bytes`` each, one
    token of all the layer's conv states), where SGLang has ``nodes`` conv windows (``conv_bytes`` each) and
    ``nodes`` SSM states."""

    nodes: int
    ssm_slots: int
    conv_bytes: int
    conv_input_bytes: int
    ssm_bytes: int

    @classmethod
    def of(cls, cache_params: Any, nodes: int) -> WorkspaceLayout:
        """The layout for SGLang's ``BaseLinearStateParams`` of a GDN model (``shape.temporal`` = HV, V, K)."""
        HV, V, K = cache_params.shape.temporal
        conv_itemsize = cache_params.dtype.conv.itemsize
        conv_shapes = cache_params.shape.conv  # GDN's: [(dim, W - 1)], the window along the last axis
        conv_input_bytes = sum(math.prod(shape[:-1]) for shape in conv_shapes) * conv_itemsize
        return cls(nodes=nodes, ssm_slots=workspace_slots(nodes, HV, K, V, conv_input_bytes),
                   conv_bytes=sum(math.prod(shape) for shape in conv_shapes) * conv_itemsize,
                   conv_input_bytes=conv_input_bytes,
                   ssm_bytes=HV * V * K * cache_params.dtype.temporal.itemsize)  # fmt: skip

    @property
    def reserved_node_states(self) -> float:
        """The layout's bytes in the unit SGLang's sizing charges per-node buffers in (N per request): one node's
        conv window + SSM state. A fraction, which SGLang's solve takes as its N unchanged."""
        return self.ssm_slots * self.ssm_bytes / (self.conv_bytes + self.ssm_bytes)


# What the last sizing planned (for the pool SGLang builds right after it, in the same process), the pool built to
# it, and its report.
_planned: Optional[WorkspaceLayout] = None
_allocated: Optional[WorkspaceLayout] = None
_report: dict[str, int] = {}
_first_layer_conv_inputs: Optional[int] = None  # the address of the first GDN layer's conv inputs


def _layout_for(configurator: Any) -> Optional[WorkspaceLayout]:
    from sglang.srt.runtime_context import get_memory

    from sglang_ddtree.speculative.hybrid_tree_verify import float32_states, serving_ddtree

    if configurator.is_draft_worker or configurator.hybrid_gdn_config is None or not serving_ddtree():
        return None
    cache_params = configurator.mambaish_config.mamba2_cache_params
    if get_memory().enable_unified_memory or not float32_states(cache_params.dtype.temporal):
        return None
    layout = WorkspaceLayout.of(cache_params, configurator.server_args.max_speculative_num_draft_tokens)
    return layout if layout.ssm_slots < layout.nodes else None


def reserve_the_workspace_not_node_states(original: Callable[..., float], configurator: Any,
                                          total_rest_memory: float) -> float:  # fmt: skip
    """AROUND ``KVCacheConfigurator._handle_max_mamba_cache`` (the GiB left for the KV cache after the mamba pool):
    SGLang's solve, charging the per-node buffers as the workspace layout instead of N nodes' states."""
    from sglang.srt.runtime_context import get_spec

    global _planned
    _planned = _layout_for(configurator)
    if _planned is None:
        return original(configurator, total_rest_memory)
    node_bytes = configurator.mambaish_config.mamba2_cache_params.mamba_cache_per_req  # SGLang's unit, all layers
    _report.update(tree_nodes=_planned.nodes, snapshot_bytes_per_request=node_bytes * _planned.nodes,
                   reserved_bytes_per_request=round(node_bytes * _planned.reserved_node_states))  # fmt: skip
    with get_spec().override(speculative_num_draft_tokens=_planned.reserved_node_states):
        return original(configurator, total_rest_memory)


def allocate_the_workspace_not_node_states(original: Callable[..., None], pool: Any, *args: Any,
                                           speculative_num_draft_tokens: Optional[int] = None,
                                           **kwargs: Any) -> None:  # fmt: skip
    """AROUND ``MambaPool.__init__``: the pool the sizing planned, ``ssm_slots`` SSM states and ``nodes`` conv
    inputs per request."""
    global _allocated
    layout = _planned
    if layout is None or speculative_num_draft_tokens != layout.nodes:
        return original(pool, *args, speculative_num_draft_tokens=speculative_num_draft_tokens, **kwargs)
    original(pool, *args, speculative_num_draft_tokens=layout.ssm_slots, **kwargs)
    _conv_inputs_in_the_workspace(pool, layout.nodes)
    _allocated = layout
    workspace = pool.mamba_cache.intermediate_ssm
    _report.update(ssm_slots_per_request=workspace.shape[2],
                   bytes_per_request=workspace[:, 0].numel() * workspace.element_size())  # fmt: skip
    logger.info("DDTREE GDN verify from the root state: %d SSM states per request and layer (the workspace) instead "
                "of %d, per-node buffers of %.1f MiB per request slot", layout.ssm_slots, layout.nodes,
                _report["bytes_per_request"] / _MIB)  # fmt: skip
    return None


def conv_input_views(workspace: torch.Tensor, nodes: int,
                     channels: Sequence[tuple[int, torch.dtype]]) -> list[torch.Tensor]:  # fmt: skip
    """Views ``[layers, rows, nodes, dim]`` of the workspace rows' tail (``workspace [layers, rows, slots, HV, V,
    K]`` float32; ``gdn_workspace.conv_inputs_offset`` on), one per conv state of ``channels`` (dim, dtype): where
    ``gdn_tree_conv`` writes each node's input and the commit reads it."""
    layers, rows, _, HV, V, K = workspace.shape
    row = workspace.view(layers, rows, -1)
    start, views = conv_inputs_offset(nodes, HV, K, V), []
    for dim, dtype in channels:
        floats = -(-nodes * dim * dtype.itemsize // 4)
        if start + floats > row.shape[-1]:
            raise ValueError(f"DDTREE GDN workspace: {start + floats} floats of workspace and conv inputs per request "
                             f"do not fit its {row.shape[-1]}")  # fmt: skip
        views.append(row[:, :, start:start + floats].view(dtype)[:, :, :nodes * dim].view(layers, rows, nodes, dim))
        start += floats
    return views


def _conv_inputs_in_the_workspace(pool: Any, nodes: int) -> None:
    """The pool's conv windows (SGLang's dense tree layout, ``[layers, slots + 1, ssm_slots, dim, W - 1]``: trees,
    topk > 1, never get the deduplicated one) replaced by :func:`conv_input_views` of its workspace, one input per
    node in the conv dtype. Nothing else is allocated."""
    from sglang.srt.mem_cache.memory_pool import GB

    global _first_layer_conv_inputs
    cache = pool.mamba_cache
    channels = [(math.prod(window.shape[3:-1]), window.dtype) for window in cache.intermediate_conv_window]
    views = conv_input_views(cache.intermediate_ssm, nodes, channels)
    _first_layer_conv_inputs = views[0].data_ptr()
    pool.mamba_cache = dataclasses.replace(cache, intermediate_conv_window=views)
    pool._intermediate_conv_window_phys = []  # SGLang's record of the physical windows: there are none
    pool.mem_usage = (pool.mamba_cache.mem_usage_bytes() - sum(v.numel() * v.element_size() for v in views)) / GB


def conv_inputs_in_place() -> bool:
    """Whether this process's pool holds one conv input per node instead of a window (then SGLang's tree conv and
    its commit of windows must not run on it: ``hybrid_tree_verify`` puts the package's in their place)."""
    return _allocated is not None


def first_gdn_layer(conv_inputs: torch.Tensor) -> bool:
    """Whether ``conv_inputs`` (one layer's, as SGLang's GDN backend hands them to the tree conv) are the pool's
    first GDN layer's: the layer a verify forward reaches first, whose tree conv fills the parents every later layer
    reads."""
    return conv_inputs.data_ptr() == _first_layer_conv_inputs


def workspace_pool_report() -> Optional[dict[str, int]]:
    """For ``/server_info``: this process's per-node buffers under the WY verify, per request slot: the SSM state
    slots and bytes allocated, the bytes SGLang's sizing reserved for them, and what both are without the WY verify
    (None: SGLang's buffers)."""
    return dict(_report) if "bytes_per_request" in _report else None


def register(registry: Any, hook_type: Any) -> None:
    registry.register(SIZING_TARGET, reserve_the_workspace_not_node_states, hook_type.AROUND)
    registry.register(POOL_TARGET, allocate_the_workspace_not_node_states, hook_type.AROUND)
