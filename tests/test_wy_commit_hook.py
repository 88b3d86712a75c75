"""The snapshot-free verify's commit as SGLang calls it (``scatter_mamba_states_after_mtp_verify``, AROUND-hooked in
``hybrid_tree_verify``): the root state and conv window stay in the request's slot, so a prefix-cache track node's
are built first, from them, and the request's accepted node's then replace them. With the package's pool (the conv
inputs in the workspace) the windows are built too and SGLang's scatter is not called; with SGLang's windows it is
left to copy them, and gets no SSM states. The conv hook beside it leaves decode steps to SGLang. (On the CPU
engine SGLang has no prefix-cache track slots for GDN states, so a server never takes the track branch here; the
GPU suite's ``ddtree_wy_radix`` does.)"""

from __future__ import annotations

import os

import pytest
import torch

from sglang_ddtree.kernels.gdn_tree import gdn_tree_verify
from sglang_ddtree.kernels.gdn_workspace import workspace_slots
from sglang_ddtree.speculative import gdn_workspace_pool, hybrid_tree_verify
from sglang_ddtree.speculative.gdn_workspace_pool import conv_input_views
from sglang_ddtree.tree.gdn_tree_reference import reference_gdn_tree_verify, reference_tree_conv
from test_gdn_tree_conv import DIM, Trees
from test_gdn_tree_kernels import DEVICE, HV, K, TOLERANCE, V, bushy, deep_with_twigs, layer_inputs, verify

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
    reason="needs TRITON_INTERPRET=1 or a GPU",
)


def test_the_track_node_is_built_from_the_root_state_before_the_request_commits_over_it(monkeypatch):
    """SGLang's pool (conv windows per node): the SSM states are ours, the windows SGLang's scatter's."""
    from sglang.srt.mem_cache.memory_pool import MambaPool

    parents = torch.tensor([bushy(9, seed=4), deep_with_twigs(9)])
    bs, T = parents.shape
    inputs = layer_inputs(bs, T, seed=4, gating="mixed")
    initial = torch.randn(bs, HV, V, K, generator=torch.Generator().manual_seed(5))
    _, want = reference_gdn_tree_verify(**inputs, initial_states=initial, parents=parents, scale=K**-0.5)

    pool = torch.zeros(bs + 2, HV, V, K, device=DEVICE)  # slots 1 and 3 are the requests', 0 a track slot
    slots, track = torch.tensor([3, 1], device=DEVICE), torch.tensor([0, -1], device=DEVICE)
    pool[slots] = initial.to(DEVICE)
    _, workspace = verify(inputs, pool, slots, parents, T)  # SGLang's buffer shape: [requests, T, HV, V, K]
    conv_windows = [torch.full((1, bs + 2, T, 4, 3), 7.0, device=DEVICE)]
    caches = MambaPool.SpeculativeState(
        conv=[torch.zeros(1, bs + 2, 4, 3, device=DEVICE)], temporal=pool[None], intermediate_ssm=workspace[None],
        intermediate_conv_window=conv_windows,
    )
    monkeypatch.setattr(hybrid_tree_verify, "serving_ddtree", lambda: True)
    monkeypatch.setattr(hybrid_tree_verify, "tree_capacity", lambda: T)
    left_to_sglang = []

    def sglangs_scatter(mamba_caches, *args):
        left_to_sglang.append((mamba_caches, args))

    last, track_nodes = torch.tensor([6, 8], device=DEVICE), torch.tensor([2, -1], device=DEVICE)
    hybrid_tree_verify.commit_nodes_from_the_root_state(sglangs_scatter, caches, slots, last, track, track_nodes)

    committed = pool.cpu()
    torch.testing.assert_close(committed[slots.cpu()], want[torch.arange(bs), last.cpu()], **TOLERANCE)
    torch.testing.assert_close(committed[0], want[0, 2], **TOLERANCE)  # from the root state, not the new one
    assert committed[2].abs().max() == 0  # nobody's slot
    [(mamba_caches, args)] = left_to_sglang
    assert mamba_caches.temporal.numel() == 0 and mamba_caches.intermediate_conv_window is conv_windows
    assert [a is b for a, b in zip(args, (slots, last, track, track_nodes))] == [True] * 4


def test_with_the_packages_pool_the_windows_are_built_from_the_inputs_and_sglang_is_not_called(monkeypatch):
    """One workspace row per request holds both verifies' data, as the package's pool lays it out: the conv's
    inputs past the recurrence's workspace (``conv_input_views``), written first, as a layer runs them; neither
    clobbers the other, and the commit builds the accepted and track nodes' windows and states from them."""
    from sglang.srt.mem_cache.memory_pool import MambaPool

    trees = [bushy(9, seed=4), deep_with_twigs(9)]
    parents = torch.tensor(trees)
    bs, T = parents.shape
    inputs = layer_inputs(bs, T, seed=4, gating="mixed")
    initial = torch.randn(bs, HV, V, K, generator=torch.Generator().manual_seed(5))
    _, want_states = reference_gdn_tree_verify(**inputs, initial_states=initial, parents=parents, scale=K**-0.5)
    conv = Trees(trees, seed=6)  # the requests' windows in slots 1 and 3 of 6
    _, want_windows = reference_tree_conv(conv.x.cpu(), conv.pool[conv.slots.long()].cpu(), conv.weight.cpu(),
                                          conv.bias.cpu(), parents)  # fmt: skip
    slots_per_row = workspace_slots(T, HV, K, V, conv_input_bytes=DIM * 4)
    workspace = torch.full((1, bs, slots_per_row, HV, V, K), float("nan"), device=DEVICE)  # [layers, rows, ...]
    [conv_inputs] = conv_input_views(workspace, T, [(DIM, torch.float32)])
    retrieve_parents = torch.empty(bs, T, dtype=torch.int64, device=DEVICE)
    conv.convolve(inputs=conv_inputs[0].view(bs, -1), parents=retrieve_parents)
    pool = torch.zeros(conv.pool.shape[0], HV, V, K, device=DEVICE)
    slots = conv.slots
    pool[slots.long()] = initial.to(DEVICE)
    gdn_tree_verify(**{n: t.to(DEVICE) for n, t in inputs.items()}, ssm_states=pool, cache_indices=slots,
                    parents=retrieve_parents, workspace=workspace[0].view(bs, -1),
                    workspace_indices=torch.arange(bs, device=DEVICE), scale=K**-0.5, capacity=T)  # fmt: skip
    assert torch.equal(conv_inputs[0].cpu(), conv.x.cpu().transpose(1, 2))  # the recurrence left them alone
    before = conv.pool.clone()
    caches = MambaPool.SpeculativeState(
        conv=[conv.pool[None]], temporal=pool[None], intermediate_ssm=workspace, intermediate_conv_window=[conv_inputs],
    )
    monkeypatch.setattr(hybrid_tree_verify, "serving_ddtree", lambda: True)
    monkeypatch.setattr(hybrid_tree_verify, "tree_capacity", lambda: T)
    monkeypatch.setattr(gdn_workspace_pool, "_allocated", object())

    def sglangs_scatter(*args):
        raise AssertionError("SGLang's scatter would read conv inputs as windows")

    last, track, track_nodes = (torch.tensor(v, device=DEVICE) for v in ([6, 8], [0, -1], [2, -1]))
    hybrid_tree_verify.commit_nodes_from_the_root_state(sglangs_scatter, caches, slots, last, track, track_nodes)

    windows, states = conv.pool.cpu(), pool.cpu()
    for n, (slot, node) in enumerate(zip(slots.tolist(), last.tolist())):
        torch.testing.assert_close(windows[slot], want_windows[n, node], rtol=0, atol=0)
        torch.testing.assert_close(states[slot], want_states[n, node], **TOLERANCE)
    torch.testing.assert_close(windows[0], want_windows[0, 2], rtol=0, atol=0)  # from the root's, not the new one
    torch.testing.assert_close(states[0], want_states[0, 2], **TOLERANCE)
    for nobodys in (2, 4, 5):
        assert torch.equal(windows[nobodys], before[nobodys].cpu()) and states[nobodys].abs().max() == 0


def test_the_conv_hook_leaves_decode_steps_to_sglang_and_refuses_a_chain_verify_on_the_packages_pool(monkeypatch):
    """On the package's pool (one conv input per node) SGLang's conv still runs every decode step; a verify without
    tree links would have SGLang's kernel write whole windows into the inputs' rows, so it is refused."""
    monkeypatch.setattr(gdn_workspace_pool, "_allocated", object())
    calls = []

    def sglangs_conv(*args, **kwargs):
        calls.append(kwargs)
        return "decoded"

    x, state, weight = torch.zeros(1, 8, 1), torch.zeros(2, 8, 3), torch.zeros(8, 4)
    slots = torch.zeros(1, dtype=torch.int32)
    assert hybrid_tree_verify.convolve_tree_without_windows(sglangs_conv, x, state, weight, None, "silu",
                                                            conv_state_indices=slots) == "decoded"  # fmt: skip
    with pytest.raises(RuntimeError, match="without tree links"):
        hybrid_tree_verify.convolve_tree_without_windows(sglangs_conv, x, state, weight, None, "silu",
                                                         conv_state_indices=slots,
                                                         intermediate_conv_window=torch.zeros(2, 4, 8))  # fmt: skip
    assert len(calls) == 1
