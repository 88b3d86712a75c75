"""Under the snapshot-free GDN tree verify a request slot's per-node buffers hold the workspace's SSM states and one
conv input per tree node, not one SSM state and one conv window per node
(``sglang_ddtree.speculative.gdn_workspace_pool``): how many states that is, what SGLang's memory sizing is made
to reserve for it, and the pool SGLang builds with it. The served end of it (a DDTREE engine on a hybrid target,
its buffers and reservation read from ``/server_info``, output equal to AR's) is in test_hybrid_cpu.py."""

from __future__ import annotations

import pytest
import torch
from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape

from sglang_ddtree.speculative import gdn_workspace_pool
from sglang_ddtree.speculative.gdn_workspace_pool import (
    WorkspaceLayout,
    allocate_the_workspace_not_node_states,
    workspace_slots,
)
from sglang_ddtree.kernels.gdn_tree import workspace_numel
from sglang_ddtree.kernels.gdn_workspace import conv_inputs_offset

MIB = 1 << 20


def qwen36_27b_cache_params(tp: int) -> Mamba2CacheParams:
    """SGLang's GDN state parameters for Qwen3.6-27B's text config (48 of 64 layers GDN; 16 key and 48 value heads
    of dim 128, conv kernel 4) on one of ``tp`` ranks, in its default dtypes (bfloat16 conv, float32 SSM)."""
    shape = Mamba2StateShape.create(tp_world_size=tp, intermediate_size=48 * 128, n_groups=16, num_heads=48,
                                    head_dim=128, state_size=128, conv_kernel=4)  # fmt: skip
    return Mamba2CacheParams(shape=shape, layers=[i for i in range(64) if (i + 1) % 4],
                             dtype=Mamba2StateDType(conv=torch.bfloat16, temporal=torch.float32))  # fmt: skip


@pytest.mark.parametrize(
    "nodes, HV, K, V, slots",
    [(33, 48, 128, 128, 1), (33, 24, 128, 128, 1), (9, 24, 128, 128, 1), (65, 24, 128, 128, 2), (2, 24, 128, 128, 1),
     (9, 1, 32, 32, 1), (33, 1, 32, 32, 3)],
)  # fmt: skip
def test_a_request_workspace_takes_the_fewest_whole_states_that_hold_it(nodes, HV, K, V, slots):
    """Qwen3.6-27B's heads (at TP 1 and 2): 1 state for trees of 2, 9 or 33 nodes, where SGLang keeps 2, 9 or 33
    (the root state is not copied: the commit reads it in the request's slot), 2 for 65. The last two rows are
    test_hybrid_cpu.py's GDN heads, whose small states hold fewer nodes each."""
    state = HV * V * K
    assert workspace_slots(nodes, HV, K, V) == slots
    assert (slots - 1) * state < workspace_numel(nodes, HV, K, V) <= slots * state


def test_sglangs_sizing_reserves_one_state_per_request_slot_at_qwen36_27b_not_33():
    """SGLang's sizing charges per-node buffers in whole nodes (``mamba_cache_per_req``: one conv window and one
    SSM state in every GDN layer) times N. With N replaced by the layout's size in that unit it reserves exactly
    the layout: at TP 2, one SSM state per GDN layer, which also holds the 33 conv inputs: 72 MiB per request slot
    where the per-node snapshots take 2.37 GiB (73.4 MiB per node)."""
    params = qwen36_27b_cache_params(tp=2)
    layout = WorkspaceLayout.of(params, nodes=33)
    ssm_bytes, conv_input_bytes = 24 * 128 * 128 * 4, (2 * 16 + 48) * 128 // 2 * 2
    assert (layout.ssm_slots, layout.ssm_bytes, layout.conv_input_bytes) == (1, ssm_bytes, conv_input_bytes)
    assert layout.conv_bytes == 3 * conv_input_bytes  # SGLang's window: the last 3 inputs
    node_bytes = params.mamba_cache_per_req
    assert node_bytes == 48 * (ssm_bytes + layout.conv_bytes) and round(node_bytes / MIB, 1) == 73.4
    reserved = round(node_bytes * layout.reserved_node_states)
    assert reserved == 48 * ssm_bytes and reserved == 72 * MIB
    assert node_bytes * 33 - reserved == 48 * (32 * ssm_bytes + 33 * layout.conv_bytes)  # back to the KV cache


@pytest.mark.parametrize("tp", [1, 2])
def test_at_qwen36_27b_one_state_per_layer_holds_trees_up_to_45_nodes_conv_inputs_included(tp):
    """The memory a request's verify takes does not grow with the tree up to 45 nodes: one SSM state per GDN layer
    (72 MiB per request at TP 2, 144 at TP 1); 46 to 65 nodes take two."""
    params = qwen36_27b_cache_params(tp=tp)
    slots = {n: WorkspaceLayout.of(params, nodes=n).ssm_slots for n in (2, 9, 16, 33, 45, 46, 65)}
    assert slots == {2: 1, 9: 1, 16: 1, 33: 1, 45: 1, 46: 2, 65: 2}


def test_the_planned_pool_holds_the_workspace_states_and_a_conv_input_per_node_in_them(monkeypatch):
    """``MambaPool`` built through the hook under a plan for 9-node trees: the same persistent states as SGLang's
    own pool for 9 nodes, but 2 SSM states per request slot where SGLang's has 9 (this head is 32 x 32: its
    state is small against the nodes' 96-channel conv inputs), and the 9 conv inputs, where SGLang has 9 windows
    of 3, are views of those states past the recurrence's workspace: nothing else is allocated (CPU device: the
    CPU-CI shim sends the pool's hard-coded CUDA buffers to the pool's device)."""
    from sglang.srt.mem_cache.memory_pool import MambaPool

    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=32, n_groups=1, num_heads=1, head_dim=32,
                                    state_size=32, conv_kernel=4)  # fmt: skip
    params = Mamba2CacheParams(shape=shape, layers=[0, 1], dtype=Mamba2StateDType(conv=torch.float32,
                                                                                   temporal=torch.float32))  # fmt: skip
    kwargs = dict(size=3, spec_state_size=3, cache_params=params, mamba_layer_ids=[0, 1], device="cpu",
                  speculative_num_draft_tokens=9, speculative_eagle_topk=2)  # fmt: skip
    sglangs = MambaPool(**kwargs).mamba_cache
    monkeypatch.setattr(gdn_workspace_pool, "_planned", WorkspaceLayout.of(params, nodes=9))
    monkeypatch.setattr(gdn_workspace_pool, "_report", {})
    monkeypatch.setattr(gdn_workspace_pool, "_allocated", None)
    pool = MambaPool.__new__(MambaPool)
    allocate_the_workspace_not_node_states(MambaPool.__init__, pool, **kwargs)
    ours = pool.mamba_cache
    assert ours.intermediate_ssm.shape == (2, 4, 2, 1, 32, 32) and sglangs.intermediate_ssm.shape[2] == 9
    assert [t.shape for t in sglangs.intermediate_conv_window] == [(2, 4, 9, 96, 3)]
    [inputs] = ours.intermediate_conv_window
    assert inputs.shape == (2, 4, 9, 96) and pool._intermediate_conv_window_phys == []
    assert [t.shape for t in ours.conv] == [t.shape for t in sglangs.conv]
    assert ours.temporal.shape == sglangs.temporal.shape
    assert gdn_workspace_pool.conv_inputs_in_place()
    # Layer 1, request row 2, node 8's input is that row's floats from the offset on: the same memory.
    rows = ours.intermediate_ssm.view(2, 4, -1)
    start = conv_inputs_offset(9, HV=1, K=32, V=32) + 8 * 96
    inputs[1, 2, 8] = torch.arange(96.0)
    assert torch.equal(rows[1, 2, start:start + 96], torch.arange(96.0))
    assert rows[1, 2, :start].abs().max() == 0 and rows[1, 2, start + 96:].abs().max() == 0
    per_request = gdn_workspace_pool.workspace_pool_report()
    assert per_request["ssm_slots_per_request"] == 2
    assert per_request["bytes_per_request"] == 2 * 2 * 32 * 32 * 4


@pytest.mark.parametrize("tp", [1, 2])
def test_the_launchers_estimate_from_config_json_is_what_the_sizing_reserves(tp):
    """The launcher sizes ``--max-running-requests`` from ``config.json`` alone (``hybrid_targets``, no SGLang
    import); at Qwen3.6-27B's shape and N = 33 its per-slot figure for the WY verify is the pool's layout: 144 MiB
    per request slot at TP 1, 72 at TP 2."""
    from sglang_ddtree.speculative.hybrid_targets import gdn_state_size

    config = {"num_hidden_layers": 64, "full_attention_interval": 4, "linear_num_value_heads": 48,
              "linear_num_key_heads": 16, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
              "linear_conv_kernel_dim": 4}  # fmt: skip
    params = qwen36_27b_cache_params(tp=tp)
    reserved = round(params.mamba_cache_per_req * WorkspaceLayout.of(params, nodes=33).reserved_node_states)
    estimate = gdn_state_size(config, tp).verify_scratch_bytes(33, running_requests=0, snapshot_free=True)
    assert estimate == reserved and reserved == {1: 144, 2: 72}[tp] * MIB
