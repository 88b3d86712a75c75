"""Gated DeltaNet tree verify from the root state alone, and the commit of the accepted path (Triton).

SGLang's tree verify through a GDN layer runs the recurrence node by node and writes every node's ``[HV, V, K]``
fp32 state to HBM (reserved for every running request: ~144 MiB per node per request at Qwen3.6-27B's shape,
TP 1), so that the accepted node's state can be committed. Here nothing per node is written but a value-sized
vector: the delta rule along a path has a WY form (FLA's chunked gated delta rule, with the causal mask of a
chunk replaced by the tree's ancestor mask; nodes numbered parent before child keep it triangular). With
``G_i`` the log-decay summed along node ``i``'s path and ``S0`` the persistent state, every node's pseudo-value

    u_i = beta_i * (v_i - exp(G_i) S0^T k_i - sum_{j ancestor of i} exp(G_i - G_j) (k_i . k_j) u_j)

is a forward substitution over the tree, node ``i``'s output is

    o_i = exp(G_i) S0^T q_i + sum_{j = i or ancestor} exp(G_i - G_j) (q_i . k_j) u_j

and the state after the accepted path ending at node ``L`` is ``exp(G_L) S0 + sum_{j on the path}
exp(G_L - G_j) k_j u_j^T``: :func:`gdn_tree_commit` builds it from ``u``, ``G`` and the unit keys that
:func:`gdn_tree_verify` returns (``T x (V + 1)`` floats per value head and ``T x K`` per key head, instead of
``T x K x V``). The executable specification is ``sglang_ddtree.gdn_tree_reference``; the layouts are SGLang's:
``q, k [bs, T, H, K]``, ``v [bs, T, HV, V]``, ``a, b [bs, T, HV]``, states ``[slots, HV, V, K]``, and the tree
as the ancestor bits of ``kernels/tree_verify_tensors.py`` (``[bs, T, ceil(T / 64)]`` int64, self included).

One program per (request, value head, block of ``BV`` value columns); ``T`` is padded to a power of two
``NP >= 16`` (``tl.dot``'s minimum), dots in IEEE fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

_BV = 32


@dataclass
class GDNTreeVerifyOutput:
    """What the commit needs besides the tree: float32 pseudo-values ``u [bs, T, HV, V]``, path log-decays
    ``g_cum [bs, T, HV]`` and unit keys ``k_unit [bs, T, H, K]``; and the layer's output ``o [bs, T, HV, V]``."""

    o: torch.Tensor
    u: torch.Tensor
    g_cum: torch.Tensor
    k_unit: torch.Tensor


@triton.jit
def _ancestors(bits_ptr, rows, cols, T, W: tl.constexpr):
    """``[rows, cols]`` bool block of a request's ancestor mask (``rows`` are token indices of that request)."""
    words = tl.load(bits_ptr + rows[:, None] * W + cols[None, :] // 64,
                    mask=(rows[:, None] >= 0) & (cols[None, :] < T), other=0)  # fmt: skip
    return ((words >> (cols[None, :] % 64).to(tl.int64)) & 1) != 0


@triton.jit
def _gdn_tree_verify_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr,
    h0_ptr, h0_indices_ptr, stride_h0, bits_ptr,
    o_ptr, u_ptr, g_cum_ptr, k_unit_ptr,
    scale, softplus_beta, softplus_threshold, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr,
    NP: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    rows = tl.arange(0, NP)
    valid = rows < T
    tok = (i_n * T + rows).to(tl.int64)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    mask_v = o_v < V

    b_q = tl.load(q_ptr + (tok[:, None] * H + i_h) * K + o_k[None, :], mask=valid[:, None], other=0).to(tl.float32)
    b_k = tl.load(k_ptr + (tok[:, None] * H + i_h) * K + o_k[None, :], mask=valid[:, None], other=0).to(tl.float32)
    b_v = tl.load(v_ptr + (tok[:, None] * HV + i_hv) * V + o_v[None, :], mask=valid[:, None] & mask_v[None, :],
                  other=0).to(tl.float32)  # fmt: skip
    x = tl.load(a_ptr + tok * HV + i_hv, mask=valid, other=0).to(tl.float32) + tl.load(dt_bias_ptr + i_hv).to(tl.float32)
    softplus = tl.where(softplus_beta * x <= softplus_threshold, tl.log(1.0 + tl.exp(softplus_beta * x)) / softplus_beta, x)
    b_g = tl.where(valid, -tl.exp(tl.load(A_log_ptr + i_hv).to(tl.float32)) * softplus, 0.0)
    b_beta = tl.sigmoid(tl.load(b_ptr + tok * HV + i_hv, mask=valid, other=0).to(tl.float32))
    b_q = b_q / tl.sqrt(tl.sum(b_q * b_q, 1) + 1e-6)[:, None] * scale
    b_k = b_k / tl.sqrt(tl.sum(b_k * b_k, 1) + 1e-6)[:, None]

    req_bits = bits_ptr + i_n.to(tl.int64) * T * W
    cols = tl.arange(0, NP)
    anc = _ancestors(req_bits, tl.where(valid, rows, -1), cols, T, W)  # [i, j]: j is i or an ancestor of i
    b_G = tl.sum(tl.where(anc, b_g[None, :], 0.0), 1)
    decay = tl.exp(tl.where(anc, b_G[:, None] - b_G[None, :], float("-inf")))  # exp(G_i - G_j) on the path, else 0

    slot = tl.load(h0_indices_ptr + i_n).to(tl.int64)
    b_h0 = tl.load(h0_ptr + slot * stride_h0 + i_hv * V * K + o_v[None, :] * K + o_k[:, None],
                   mask=mask_v[None, :] & (slot >= 0), other=0).to(tl.float32)  # [K, BV]  # fmt: skip
    gamma = tl.exp(b_G)
    strict = anc & (rows[:, None] != cols[None, :])
    a_mat = tl.where(strict, decay * tl.dot(b_k, tl.trans(b_k), input_precision="ieee"), 0.0) * b_beta[:, None]
    b_u = b_beta[:, None] * (b_v - gamma[:, None] * tl.dot(b_k, b_h0, input_precision="ieee"))
    for i in range(1, T):  # forward substitution: row i needs only its ancestors' rows, all before it
        a_row = tl.sum(tl.where(rows[:, None] == i, a_mat, 0.0), 0)
        b_u = tl.where(rows[:, None] == i, b_u - tl.sum(a_row[:, None] * b_u, 0)[None, :], b_u)
    p_mat = tl.where(anc, decay * tl.dot(b_q, tl.trans(b_k), input_precision="ieee"), 0.0)
    b_o = gamma[:, None] * tl.dot(b_q, b_h0, input_precision="ieee") + tl.dot(p_mat, b_u, input_precision="ieee")

    out_mask = valid[:, None] & mask_v[None, :]
    out_offsets = (tok[:, None] * HV + i_hv) * V + o_v[None, :]
    tl.store(o_ptr + out_offsets, b_o.to(o_ptr.dtype.element_ty), mask=out_mask)
    tl.store(u_ptr + out_offsets, b_u, mask=out_mask)
    if i_v == 0:
        tl.store(g_cum_ptr + tok * HV + i_hv, b_G, mask=valid)
        if i_hv % (HV // H) == 0:
            tl.store(k_unit_ptr + (tok[:, None] * H + i_h) * K + o_k[None, :], b_k, mask=valid[:, None])


@triton.jit
def _gdn_tree_commit_kernel(
    h0_ptr, h0_indices_ptr, stride_h0, bits_ptr, last_ptr, u_ptr, g_cum_ptr, k_unit_ptr, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr,
    NP: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    slot = tl.load(h0_indices_ptr + i_n).to(tl.int64)
    if slot >= 0:
        rows = tl.arange(0, NP)
        valid = rows < T
        tok = (i_n * T + rows).to(tl.int64)
        o_k = tl.arange(0, K)
        o_v = i_v * BV + tl.arange(0, BV)
        mask_v = o_v < V
        last = tl.load(last_ptr + i_n).to(tl.int32)
        req_bits = bits_ptr + i_n.to(tl.int64) * T * W
        on_path = tl.sum(_ancestors(req_bits, tl.full([1], last, tl.int32), rows, T, W).to(tl.int32), 0) > 0
        b_G = tl.load(g_cum_ptr + tok * HV + i_hv, mask=valid, other=0)
        g_last = tl.sum(tl.where(rows == last, b_G, 0.0), 0)
        weight = tl.exp(tl.where(on_path, g_last - b_G, float("-inf")))
        b_u = tl.load(u_ptr + (tok[:, None] * HV + i_hv) * V + o_v[None, :], mask=valid[:, None] & mask_v[None, :],
                      other=0)  # fmt: skip
        b_k = tl.load(k_unit_ptr + (tok[:, None] * H + i_h) * K + o_k[None, :], mask=valid[:, None], other=0)
        p_h = h0_ptr + slot * stride_h0 + i_hv * V * K + o_v[None, :] * K + o_k[:, None]
        b_h = tl.load(p_h, mask=mask_v[None, :], other=0).to(tl.float32)
        b_h = tl.exp(g_last) * b_h + tl.dot(tl.trans(b_k), weight[:, None] * b_u, input_precision="ieee")
        tl.store(p_h, b_h.to(p_h.dtype.element_ty), mask=mask_v[None, :])


def _padded_nodes(T: int) -> int:
    return max(16, triton.next_power_of_2(T))


def gdn_tree_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_states: torch.Tensor,
    cache_indices: torch.Tensor,
    ancestor_bits: torch.Tensor,
    scale: float,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
) -> GDNTreeVerifyOutput:
    """Every tree node's output of one GDN layer, from the requests' persistent states (``ssm_states[
    cache_indices]``, read only) and the trees' ancestor bits; see the module docstring for the layouts."""
    bs, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if K != triton.next_power_of_2(K) or K < 16 or HV % H:
        raise ValueError(f"gdn_tree_verify needs a power-of-two key dim >= 16 and HV a multiple of H, got K={K}, "
                         f"H={H}, HV={HV}")  # fmt: skip
    o = torch.empty_like(v)
    u = torch.empty(bs, T, HV, V, dtype=torch.float32, device=v.device)
    g_cum = torch.empty(bs, T, HV, dtype=torch.float32, device=v.device)
    k_unit = torch.empty(bs, T, H, K, dtype=torch.float32, device=v.device)
    grid = (triton.cdiv(V, _BV), bs * HV)
    _gdn_tree_verify_kernel[grid](
        q.contiguous(), k.contiguous(), v.contiguous(), a.contiguous(), b.contiguous(), A_log, dt_bias,
        ssm_states, cache_indices, ssm_states.stride(0), ancestor_bits.contiguous(),
        o, u, g_cum, k_unit, scale, softplus_beta, softplus_threshold, T,
        H=H, HV=HV, K=K, V=V, W=ancestor_bits.shape[-1], NP=_padded_nodes(T), BV=_BV,
    )  # fmt: skip
    return GDNTreeVerifyOutput(o=o, u=u, g_cum=g_cum, k_unit=k_unit)


def gdn_tree_commit(
    ssm_states: torch.Tensor,
    cache_indices: torch.Tensor,
    ancestor_bits: torch.Tensor,
    last_accepted: torch.Tensor,
    verified: GDNTreeVerifyOutput,
) -> None:
    """Advance each request's persistent state (in place) along its accepted path, the root-to-node path of
    ``last_accepted [bs]`` (node indices; the root is always accepted)."""
    bs, T, H, K = verified.k_unit.shape
    HV, V = verified.u.shape[2], verified.u.shape[3]
    grid = (triton.cdiv(V, _BV), bs * HV)
    _gdn_tree_commit_kernel[grid](
        ssm_states, cache_indices, ssm_states.stride(0), ancestor_bits.contiguous(), last_accepted,
        verified.u, verified.g_cum, verified.k_unit, T,
        H=H, HV=HV, K=K, V=V, W=ancestor_bits.shape[-1], NP=_padded_nodes(T), BV=_BV,
    )  # fmt: skip
