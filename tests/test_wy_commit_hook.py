"""The snapshot-free verify's commit as SGLang calls it (``scatter_mamba_states_after_mtp_verify``, AROUND-hooked in
``hybrid_tree_verify``): the root state stays in the request's slot, so a prefix-cache track node's state is built
first, from that root state, and the request's accepted node's then replaces it; the conv windows are left to
SGLang's scatter, which gets no SSM states to copy. (On the CPU engine SGLang has no prefix-cache track slots for
GDN states, so a server never takes the track branch here; the GPU suite's ``ddtree_wy_radix`` does.)"""

from __future__ import annotations

import os

import pytest
import torch

from sglang_ddtree.speculative import hybrid_tree_verify
from sglang_ddtree.tree.gdn_tree_reference import reference_gdn_tree_verify
from test_gdn_tree_kernels import DEVICE, HV, K, TOLERANCE, V, bushy, deep_with_twigs, layer_inputs, verify

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
    reason="needs TRITON_INTERPRET=1 or a GPU",
)


def test_the_track_node_is_built_from_the_root_state_before_the_request_commits_over_it(monkeypatch):
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
