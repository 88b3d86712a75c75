"""Test-only stand-in for ``sgl_kernel`` on the CPU-only CI machine.

SGLang's CPU engine imports a few bookkeeping ops from ``sgl_kernel``'s CPU build (AMX/AVX-512 C++), which is
not published on PyPI. On a CPU without AMX the model layers take their native-torch paths, so only these ops
are ever called; each is written here in plain torch (or delegated to SGLang's own Triton kernel, run by the
Triton interpreter). Qwen3.5/3.6 hybrid targets add the model and Gated DeltaNet ops registered below under
``torch.ops.sgl_kernel`` and those of ``sgl_kernel.mamba``. Anything else raises ``NotImplementedError`` naming
the op, so a new dependency shows up as a clear failure rather than as wrong numbers. Never put this directory on
``PYTHONPATH`` on a GPU machine.
"""

import ctypes

import torch

__version__ = "0.0.0+cpu-ci-shim"


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc) -> None:
    """Copy KV rows ``src_loc -> tgt_loc`` in every layer buffer (addresses given as raw pointers)."""
    sources = [int(s) for s in src_loc.tolist()]
    targets = [int(t) for t in tgt_loc.tolist()]
    for base, stride in zip(data_ptrs.tolist(), strides.tolist()):
        base, stride = int(base), int(stride)
        rows = [ctypes.string_at(base + s * stride, stride) for s in sources]  # read all first: in-place safe
        for target, row in zip(targets, rows):
            ctypes.memmove(base + target * stride, row, stride)


def _for_each_request(req_pool_indices, start_offset, end_offset):
    """Yield (row, start, end, flat_offset) per request, ``flat_offset`` counting tokens across requests."""
    flat = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        yield row, start, end, flat
        flat += end - start


def assign_req_to_token_pool_cpu(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len=None
) -> None:
    for row, start, end, flat in _for_each_request(req_pool_indices, start_offset, end_offset):
        req_to_token[row, start:end] = out_cache_loc[flat : flat + end - start].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len=None
) -> None:
    for row, start, end, flat in _for_each_request(req_pool_indices, start_offset, end_offset):
        out_cache_loc[flat : flat + end - start] = req_to_token[row, start:end].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len, topk, num_steps
) -> None:
    """EAGLE drafting: request ``b`` writes its ``topk * num_steps`` draft tokens right after its sequence."""
    per_request = int(topk) * int(num_steps)
    for b, (row, seq_len) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        out_cache_loc[b * per_request : (b + 1) * per_request] = req_to_token[
            row, seq_len : seq_len + per_request
        ].to(out_cache_loc.dtype)


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride) -> None:
    """``bonus[b] = accept_tokens[b, accept_lens[b] - 1]`` over a flattened ``[bs, accept_stride]`` buffer."""
    last = torch.arange(accept_lens.numel()) * accept_stride + accept_lens.long() - 1
    bonus_tokens.copy_(accept_tokens.reshape(-1)[last].to(bonus_tokens.dtype))


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc) -> None:
    """Gather the cache locations of accepted nodes (``accept_index`` is -1 padded)."""
    flat = accept_index.reshape(-1)
    accepted = flat[flat > -1].long()
    accept_out_cache_loc[: accepted.numel()] = out_cache_loc[accepted].to(accept_out_cache_loc.dtype)


def build_tree_kernel_efficient_cpu(*args, **kwargs) -> None:
    """EAGLE tree tensors: SGLang's own Triton version (the XPU path), run by the Triton interpreter."""
    from sglang.srt.speculative.eagle_utils import sgl_build_tree_kernel_triton

    sgl_build_tree_kernel_triton(*args, **kwargs)


def verify_tree_greedy_cpu(
    *,
    predicts,
    accept_index,
    accept_token_num,
    candidates,
    retrive_index,
    retrive_next_token,
    retrive_next_sibling,
    target_predict,
) -> None:
    from sglang.srt.speculative.eagle_utils import verify_tree_greedy_triton

    verify_tree_greedy_triton(
        predicts=predicts,
        accept_index=accept_index,
        accept_token_num=accept_token_num,
        candidates=candidates,
        retrieve_index=retrive_index,
        retrieve_next_token=retrive_next_token,
        retrieve_next_sibling=retrive_next_sibling,
        target_predict=target_predict,
    )


# ``torch.ops.sgl_kernel`` ops that SGLang's Qwen3.5/3.6 hybrid code binds at import on CPU (models/qwen3_5.py,
# layers/attention/linear/gdn_backend.py and kernels/gdn_triton.py). The GDN ops run, under the Triton interpreter,
# the Triton kernels that SGLang's CUDA path calls for the same step; the elementwise model ops are plain torch.
# Only these names are registered: SGLang probes others with ``hasattr`` to pick code paths.
_library = torch.library.Library("sgl_kernel", "FRAGMENT")


def _register(schema: str, kernel) -> None:
    """The dispatcher drops trailing arguments equal to their schema default, so ``kernel`` repeats the defaults."""
    _library.define(schema)
    _library.impl(schema.split("(", 1)[0], kernel, "CPU")


def _fused_sigmoid_mul(attn_output, gate, inplace=False):
    """``attn_output * sigmoid(gate)``, float32 math, as the CUDA path's Triton ``fused_sigmoid_mul`` computes it;
    ``gate`` may be the strided ``[tokens, heads, head_dim]`` view of the q/gate projection."""
    result = (attn_output.float() * torch.sigmoid(gate.reshape(attn_output.shape).float())).to(attn_output.dtype)
    return attn_output.copy_(result) if inplace else result


def _gemma_rmsnorm_per_head(x, weight, eps, head_dim):
    rows = x.reshape(-1, head_dim).float()
    normed = rows * torch.rsqrt(rows.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())
    return normed.to(x.dtype)


def _fused_qk_gemma_rmsnorm(q, k, q_weight, k_weight, eps, head_dim):
    """Gemma RMSNorm (scale ``1 + w``) of each q and k head, in float32, returned in the input dtype as
    ``[rows, head_dim]``. Plain torch: SGLang's Triton versions (models/utils.py, run on ROCm/XPU) and CUDA's fused
    rope-gate kernel store the result as bfloat16 for any non-fp16 input, which a float32 model must not do."""
    return _gemma_rmsnorm_per_head(q, q_weight, eps, head_dim), _gemma_rmsnorm_per_head(k, k_weight, eps, head_dim)


def _fused_qk_gemma_rmsnorm_with_gate(q_gate, k, q_weight, k_weight, eps, head_dim, num_heads):
    """As above, with q and the output gate interleaved per head in ``q_gate`` (``[q_h0, gate_h0, q_h1, ...]``,
    the checkpoint's q_proj layout); the gate comes back unnormalised as ``[rows, head_dim]``."""
    q, gate = q_gate.reshape(q_gate.shape[0], num_heads, 2 * head_dim).split(head_dim, dim=-1)
    q_out, k_out = _fused_qk_gemma_rmsnorm(q, k, q_weight, k_weight, eps, head_dim)
    return q_out, k_out, gate.reshape(-1, head_dim).contiguous()


def _fused_qkvzba_split_reshape_cat_contiguous(mixed_qkvz, mixed_ba, num_heads_qk, num_heads_v, head_qk, head_v):
    """Qwen3.5's contiguous projections ``[q | k | v | z]`` and ``[b | a]`` (all heads of each, in head order) to
    ``mixed_qkv = [q | k | v]``, ``z`` as ``[tokens, v_heads, head_v]``, ``b`` and ``a``: the copies of the CUDA
    path's Triton kernel (triton_gdn_fused_proj), which the interpreter would run as one program per token."""
    qk_size, v_size = num_heads_qk * head_qk, num_heads_v * head_v
    q, k, v, z = mixed_qkvz.split([qk_size, qk_size, v_size, v_size], dim=-1)
    b, a = mixed_ba.split([num_heads_v, num_heads_v], dim=-1)
    tokens = mixed_qkvz.shape[0]
    z = z.reshape(tokens, num_heads_v, head_v).contiguous()
    return torch.cat([q, k, v], dim=-1), z, b.contiguous(), a.contiguous()


def _fused_gdn_gating(A_log, a, b, dt_bias):
    from sglang.kernels.ops.attention.fla.fused_gdn_gating import fused_gdn_gating

    return fused_gdn_gating(A_log, a, b, dt_bias)


def _fused_sigmoid_gating_delta_rule_update(
    A_log, dt_bias, q, k, v, a, b, initial_state_source, initial_state_indices, cu_seqlens,
    use_qk_l2norm_in_kernel, softplus_beta=1.0, softplus_threshold=20.0, is_kda=False, disable_state_update=False,
    intermediate_states_buffer=None, intermediate_state_indices=None, cache_steps=None, retrieve_parent_token=None,
):  # fmt: skip
    """GDN decode and target verify (``retrieve_parent_token``: the tree path, each node from its parent's state)."""
    from sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent import (
        fused_sigmoid_gating_delta_rule_update,
    )

    return fused_sigmoid_gating_delta_rule_update(
        A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_source=initial_state_source,
        initial_state_indices=initial_state_indices, cu_seqlens=cu_seqlens,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, softplus_beta=softplus_beta,
        softplus_threshold=softplus_threshold, is_kda=is_kda, disable_state_update=disable_state_update,
        intermediate_states_buffer=intermediate_states_buffer, intermediate_state_indices=intermediate_state_indices,
        cache_steps=cache_steps, retrieve_parent_token=retrieve_parent_token,
    )  # fmt: skip


_register(
    "fused_sigmoid_mul_cpu(Tensor(a!) attn_output, Tensor gate, bool inplace=False) -> Tensor", _fused_sigmoid_mul
)
_register(
    "fused_qk_gemma_rmsnorm_cpu(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, float eps, int head_dim)"
    " -> (Tensor, Tensor)",
    _fused_qk_gemma_rmsnorm,
)
_register(
    "fused_qk_gemma_rmsnorm_with_gate_cpu(Tensor q_gate, Tensor k, Tensor q_weight, Tensor k_weight, float eps,"
    " int head_dim, int num_heads) -> (Tensor, Tensor, Tensor)",
    _fused_qk_gemma_rmsnorm_with_gate,
)
_register(
    "fused_qkvzba_split_reshape_cat_contiguous_cpu(Tensor mixed_qkvz, Tensor mixed_ba, int num_heads_qk,"
    " int num_heads_v, int head_qk, int head_v) -> (Tensor, Tensor, Tensor, Tensor)",
    _fused_qkvzba_split_reshape_cat_contiguous,
)
_register(
    "fused_gdn_gating_cpu(Tensor A_log, Tensor a, Tensor b, Tensor dt_bias) -> (Tensor, Tensor)", _fused_gdn_gating
)
_register(
    "fused_sigmoid_gating_delta_rule_update_cpu(Tensor A_log, Tensor dt_bias, Tensor q, Tensor k, Tensor v,"
    " Tensor a, Tensor b, Tensor(a!) initial_state_source, Tensor initial_state_indices, Tensor cu_seqlens,"
    " bool use_qk_l2norm_in_kernel, float softplus_beta=1.0, float softplus_threshold=20.0, bool is_kda=False,"
    " bool disable_state_update=False, Tensor(b!)? intermediate_states_buffer=None,"
    " Tensor? intermediate_state_indices=None, int? cache_steps=None, Tensor? retrieve_parent_token=None) -> Tensor",
    _fused_sigmoid_gating_delta_rule_update,
)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def _not_implemented(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel CPU-CI shim: op '{name}' is not implemented")

    return _not_implemented
