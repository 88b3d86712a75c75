"""GPU suite: the snapshot-free GDN tree verify (``kernels/gdn_tree.py``) at Qwen3.6-27B's head layout (16 key
and 48 value heads of 128, TP 1) equals SGLang 0.5.17's snapshot tree verify on bf16 inputs with fp32 states:
outputs within bf16 rounding, and the committed state within fp32 rounding of the snapshot SGLang would copy.
(The float32 proof against the sequential recurrence, on every tree shape, is tests/test_gdn_tree_kernels.py.)"""

import pytest
import torch

from sglang_ddtree.tree.gdn_tree_reference import random_parents
from sglang_ddtree.kernels.gdn_tree import gdn_tree_commit, gdn_tree_verify, workspace_numel

pytestmark = pytest.mark.gpu
H, HV, K = 16, 48, 128


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
