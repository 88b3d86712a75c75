"""GPU suite: the snapshot-free GDN tree verify (``kernels/gdn_tree.py``) at Qwen3.6-27B's head layout (16 key
and 48 value heads of 128, TP 1) equals SGLang 0.5.17's snapshot tree verify on bf16 inputs with fp32 states:
outputs within bf16 rounding, and the committed state within fp32 rounding of the snapshot SGLang would copy; its
tree conv (``kernels/gdn_tree_conv.py``, 10,240 channels) equals SGLang's tree conv, and the window it commits is
the one SGLang would copy, bit for bit. (The float32 proofs against the sequential recurrence and the decode step,
on every tree shape, are tests/test_gdn_tree_kernels.py and tests/test_gdn_tree_conv.py.)"""

import pytest
import torch

from sglang_ddtree.tree.gdn_tree_reference import random_parents
from sglang_ddtree.tree.tree_reference import tree_links
from sglang_ddtree.kernels.gdn_tree import gdn_tree_commit, gdn_tree_verify, workspace_numel
from sglang_ddtree.kernels.gdn_tree_conv import gdn_tree_conv, gdn_tree_conv_commit

pytestmark = pytest.mark.gpu
H, HV, K = 16, 48, 128
CONV_DIM, CONV_WIDTH = (2 * H + HV) * K, 4


@pytest.mark.parametrize("bs, T, shape", [(1, 33, "bushy"), (8, 33, "bushy"), (4, 65, "bushy"), (8, 16, "chain")])
def test_real_shapes_match_sglangs_snapshot_tree_verify(bs, T, shape):
    from sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent import fused_sigmoid_gating_delta_rule_update

    g = torch.Generator().manual_seed(T * bs)
    parents = torch.tensor([random_parents(T, g) if shape == "bushy" else [-1, *range(T - 1)] for _ in range(bs)])
    q, k = (torch.randn(bs, T, H, K, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(bs, T, HV, K, device="cuda", dtype=torch.bfloat16)
    a, b = (torch.randn(bs, T, HV, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    A_log, dt_bias = torch.randn(HV, device="cuda") * 0.5, torch.randn(HV, device="cuda") * 0.5
    slots = torch.arange(bs, device="cuda") * 2
    pool = torch.randn(2 * bs, HV, K, K, device="cuda") * 0.1
    snapshots = torch.empty(bs, T, HV, K, K, device="cuda")
    theirs = fused_sigmoid_gating_delta_rule_update(
        A_log=A_log, a=a.view(bs * T, HV), dt_bias=dt_bias, softplus_beta=1.0, softplus_threshold=20.0,
        q=q.view(1, bs * T, H, K), k=k.view(1, bs * T, H, K), v=v.view(1, bs * T, HV, K), b=b.view(bs * T, HV),
        initial_state_source=pool, initial_state_indices=slots, scale=K**-0.5, use_qk_l2norm_in_kernel=True,
        cu_seqlens=torch.arange(0, bs * T + 1, T, device="cuda"), disable_state_update=True,
        intermediate_states_buffer=snapshots, intermediate_state_indices=torch.arange(bs, device="cuda"),
        cache_steps=T, retrieve_parent_token=parents.cuda(),
    ).view(bs, T, HV, K)  # fmt: skip
    workspace = torch.empty(bs, workspace_numel(T, HV, K, K), device="cuda")
    ours = gdn_tree_verify(q, k, v, a, b, A_log, dt_bias, pool, slots, parents.cuda(), workspace,  # int64, as SGLang
                           torch.arange(bs, device="cuda"), K**-0.5)  # fmt: skip
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=2e-2, atol=2e-2)
    last = torch.randint(0, T, (bs,), generator=g).cuda()
    gdn_tree_commit(pool[None], workspace[None], slots, last, T, source_indices=slots)
    torch.testing.assert_close(pool[slots], snapshots[torch.arange(bs, device="cuda"), last], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("bs, T", [(1, 33), (8, 33), (4, 65), (8, 16)])
def test_the_tree_conv_at_real_shapes_matches_sglangs_and_commits_its_window(bs, T):
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update

    g = torch.Generator().manual_seed(T + bs)
    trees = [random_parents(T, g) for _ in range(bs)]
    links = [tree_links(tree) for tree in trees]
    next_token, next_sibling = (torch.tensor([link[i] for link in links], device="cuda") for i in (0, 1))
    x = torch.randn(bs, T, CONV_DIM, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    weight = torch.randn(CONV_DIM, CONV_WIDTH, device="cuda", dtype=torch.bfloat16) * 0.5
    bias = torch.randn(CONV_DIM, device="cuda", dtype=torch.bfloat16) * 0.1
    slots = torch.arange(bs, device="cuda", dtype=torch.int32) * 2 + 1
    pool = torch.randn(2 * bs + 1, CONV_DIM, CONV_WIDTH - 1, device="cuda", dtype=torch.bfloat16)
    base = pool.clone()
    rows = torch.arange(bs, device="cuda", dtype=torch.int32)
    windows = torch.empty(bs, T, CONV_DIM, CONV_WIDTH - 1, device="cuda", dtype=torch.bfloat16)
    sglang_parents, our_parents = (torch.empty(bs, T, device="cuda", dtype=torch.int64) for _ in range(2))
    theirs = causal_conv1d_update(
        x, pool, weight, bias, "silu", conv_state_indices=slots, intermediate_conv_window=windows,
        intermediate_state_indices=rows, retrieve_next_token=next_token, retrieve_next_sibling=next_sibling,
        retrieve_parent_token=sglang_parents,
    )  # fmt: skip
    pool.copy_(base)  # SGLang's verify overwrote the windows before the roots; ours leaves them
    inputs = torch.empty(bs, T * CONV_DIM, device="cuda", dtype=torch.bfloat16)
    ours = gdn_tree_conv(x, pool, weight, bias, "silu", slots, next_token, next_sibling, our_parents, inputs, rows)
    assert torch.equal(pool, base)
    # Each output is a bf16 rounding of four bf16 products summed in fp32, in the other order: one bf16 step apart.
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=1e-2, atol=1e-2)
    assert torch.equal(our_parents[:, 1:], sglang_parents[:, 1:])  # SGLang leaves the root's 0
    last = torch.randint(0, T, (bs,), generator=g).cuda()
    gdn_tree_conv_commit(pool[None], inputs[None], our_parents[None], slots, last, source_indices=slots)
    assert torch.equal(pool[slots.long()], windows[torch.arange(bs, device="cuda"), last])
