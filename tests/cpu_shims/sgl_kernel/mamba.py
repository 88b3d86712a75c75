"""``sgl_kernel.mamba``: the Gated DeltaNet ops that SGLang's CPU GDN backend imports (Qwen3.5/3.6 hybrids).

The causal convolutions are SGLang's own Triton kernels, run by the Triton interpreter: the update kernel is the
one CUDA runs for decode and target verify (its tree path follows ``retrieve_next_token / sibling / parent``),
the prefill one is ROCm's. The call sites already pass those kernels' arguments. The chunked prefill is a
plain-torch reference, see below.
"""

import itertools

import torch


def causal_conv1d_fn_cpu(*args, **kwargs):
    """Prefill conv over varlen sequences; writes each sequence's last window into ``conv_states``."""
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_fn

    return causal_conv1d_fn(*args, **kwargs)


def causal_conv1d_update_cpu(*args, **kwargs):
    """Decode / target-verify conv step (the tree-verify path when ``retrieve_parent_token`` is given)."""
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update

    return causal_conv1d_update(*args, **kwargs)


def chunk_gated_delta_rule_cpu(
    q, k, v, g, beta, initial_state, cu_seqlens, head_first=False, use_qk_l2norm_in_kernel=False,
    initial_state_indices=None,
):  # fmt: skip
    """Prefill gated delta rule, token by token, in float32: the recurrence that SGLang's Triton decode kernel
    (``fused_sigmoid_gating_delta_rule_update``) runs, given ``g`` (log decay) and ``beta`` precomputed.

    SGLang's GPU version (``fla.chunk.chunk_gated_delta_rule``) cannot run here: it asserts that the inputs are
    not float32, the Triton interpreter's bf16 ``tl.dot`` is wrong, and ``chunk_gated_delta_rule_fwd_kkt_solve``
    autotunes over 6 configs ("0 active drivers" under the interpreter). The chunked form is an exact
    reordering of this recurrence. Layouts: q, k ``[1, T, H, K]``; v ``[1, T, HV, V]``; g, beta ``[1, T, HV]``;
    ``initial_state[initial_state_indices[i]]`` is sequence i's ``[HV, V, K]`` state, read and overwritten.
    Returns ``(o, None, None)`` like the GPU version with no state checkpoints (radix-cache tracking is unused).
    """
    assert not head_first and q.shape[0] == 1
    heads, v_heads = k.shape[2], v.shape[2]
    scale = k.shape[-1] ** -0.5  # the GPU version's default; the call site passes none
    out = torch.empty_like(v)
    bounds = cu_seqlens.tolist()
    for seq, (start, end) in enumerate(itertools.pairwise(bounds)):
        slot = int(initial_state_indices[seq])
        state = initial_state[slot].float().clone()  # [HV, V, K]
        for t in range(start, end):
            q_t = q[0, t].float().repeat_interleave(v_heads // heads, dim=0)  # [HV, K]
            k_t = k[0, t].float().repeat_interleave(v_heads // heads, dim=0)
            if use_qk_l2norm_in_kernel:
                q_t = q_t / torch.sqrt((q_t * q_t).sum(-1, keepdim=True) + 1e-6)
                k_t = k_t / torch.sqrt((k_t * k_t).sum(-1, keepdim=True) + 1e-6)
            state = state * torch.exp(g[0, t].float())[:, None, None]
            delta = (v[0, t].float() - (state * k_t[:, None, :]).sum(-1)) * beta[0, t].float()[:, None]
            state = state + delta[:, :, None] * k_t[:, None, :]
            out[0, t] = (state * (q_t * scale)[:, None, :]).sum(-1).to(out.dtype)
        initial_state[slot] = state.to(initial_state.dtype)
    return out, None, None


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def _not_implemented(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel CPU-CI shim: op 'mamba.{name}' is not implemented")

    return _not_implemented
