"""Gated DeltaNet tree verify from the root state alone, and the commit of any node's state (Triton).

SGLang's tree verify through a GDN layer runs the recurrence node by node and writes every node's ``[HV, V, K]``
fp32 state to HBM (reserved for every running request: ~144 MiB per node per request at Qwen3.6-27B's shape,
TP 1), so that the accepted node's state can be committed. Here nothing state-sized is written per node: the
delta rule along a path has a WY form (FLA's chunked gated delta rule, with the causal mask of a chunk replaced
by the tree's ancestor mask; nodes numbered parent before child keep it triangular). With ``G_i`` the log-decay
summed along node ``i``'s path and ``S0`` the persistent state, every node's pseudo-value

    u_i = beta_i * (v_i - exp(G_i) S0^T k_i - sum_{j ancestor of i} exp(G_i - G_j) (k_i . k_j) u_j)

is a forward substitution over the tree, node ``i``'s output is

    o_i = exp(G_i) S0^T q_i + sum_{j = i or ancestor} exp(G_i - G_j) (q_i . k_j) u_j

and the state after the path ending at node ``L`` is ``exp(G_L) S0 + sum_{j on the path} exp(G_L - G_j) k_j
u_j^T``. :func:`gdn_tree_verify` leaves in each request's workspace what :func:`gdn_tree_commit` needs besides
``S0``, which stays in the pool: ``u``, ``G``, the unit keys and the parents (:func:`workspace_numel` floats: T (K +
V + 1) / (K V) snapshots' worth, 0.52 at T = 33 for 128-dim heads, where SGLang writes 33), so any node's state
can be committed into any slot (a prefix-cache track node's into its track slot), the request's own slot last.

Two kernels per layer, FLA's chunked form for one chunk that is a tree: one program per (request, value head)
builds what the values do not enter — the ancestor closure, ``(I + A)^-1`` (``A`` the keys' products under the
ancestor mask, inverted one tree level at a time, in blocks of 32 rows past 64 nodes) and ``P``, the queries'
products with the keys under the same mask — into a scratch of ``2 NP^2 + 3 NP`` floats per (request, value head);
then one program per (request, value head, ``BV`` value columns) applies them: ``u = (I + A)^-1 beta (v - gamma K
S0)``, ``o = gamma Q S0 + P u``. Keys, queries and states are read in chunks of 32 key columns, so no program
holds an ``[NP, K]`` tile whole (the earlier single kernel did, once per value block; 8 warps instead of 4 halved
its time, ``bench/results/gdn_tree_kernel/2026-12-04_launch_sweep``). ``T`` is padded to a power of two ``NP >= 16``
(``tl.dot``'s minimum); the products in three-pass TF32 (IEEE fp32 on request, ``DOT_PRECISIONS``). The padded
width decides the cost (run 69: 0.053 ms at 16 rows, 0.088 at 64, batch 1), and a DDTree's width is one past a
power of two (a budget of 32 drafted nodes and the root), so where that saves rows the root is set apart
(:func:`root_apart_pads_fewer_rows`): it is every node's ancestor, so its ``u`` is solved first from ``S0``
alone, the other rows take it in through one coupling each in ``A`` and ``P``, and 33 nodes pad to 32 rows. The
commit, once per step for all layers, walks the accepted path up from its node and adds one rank-1 term per node to
rows of the decayed root state.

Layouts are SGLang 0.5.17's: ``q, k [bs, T, H, K]``, ``v [bs, T, HV, V]``, ``a, b [bs, T, HV]``, states
``[slots, HV, V, K]``, ``parents [bs, T]`` (``retrieve_parent_token``; the root's entry is not read), and the
commit takes ``fused_mamba_state_scatter_with_mask``'s arguments and the requests' own slots, so it can stand in
for SGLang's scatter of snapshots. The executable specification is ``sglang_ddtree.tree.gdn_tree_reference``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

from sglang_ddtree.kernels.gdn_workspace import workspace_numel


_BK = 32  # key columns per chunk: no program holds a whole [nodes, 128] tile of queries, keys or states
# The products' precision: IEEE fp32 on CUDA cores, or three TF32 tensor-core products that keep fp32's accuracy
# to within a few ulps. Three-pass TF32 is the default: faster at every measured tree but deep 16-node chains
# (bench/results/gdn_tree_kernel/2026-12-04_two_kernels), and its operands go through shared memory where IEEE's
# are held in registers (at 128 rows the IEEE factor kernel spills 5 KB per thread, TF32's 0.6; ptxas -v, sm_90).
DOT_PRECISIONS = ("ieee", "tf32x3")
DEFAULT_DOT_PRECISION = "tf32x3"


def _factor_rows(NP: int) -> int:
    """Rows of the factors the factor kernel builds at once: the whole tree up to 64 nodes; past that, blocks of
    32, each solved from the blocks before it (whole [128, 128] tiles spilled registers: 27 ms per layer at T =
    65, ``bench/results/gdn_tree_kernel/2026-12-04_two_kernels``)."""
    return NP if NP <= 64 else 32


def _factor_warps(NP: int) -> int:
    """Warps of the factor kernel, whose live tiles are a handful of [rows, NP] ones (a first choice, not
    swept)."""
    return 4 if NP <= 16 else 8


def _apply_launch(NP: int) -> tuple[int, int]:
    """(value columns per program, warps) of the apply kernel: [NP, NP] factors and [NP, BV] tiles. 64 x 8 was
    the fastest measured launch up to 33 nodes; at 128 rows 32 columns keep its spills to 0.2 KB."""
    return (64, 8) if NP <= 64 else (32, 8)


COMMIT_LAUNCH = (32, 8)
"""The commit's (state rows per program, warps): [32, 128] float32 rows of state a program, which compiled for sm_90
hold 64 registers a thread, 32 warps an SM, so that many loads are in flight (a first choice, not swept)."""


@triton.jit
def _workspace_offsets(T, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    off_u = 0
    off_g = off_u + T * HV * V
    off_k = off_g + T * HV
    return off_u, off_g, off_k, off_k + T * HV * K


@triton.jit
def _factor_numel(NP: tl.constexpr, ROOT: tl.constexpr):
    """Floats of one (request, value head)'s factors: ``(I + A)^-1``, ``P``, then per row ``beta``, ``gamma / |k|``
    and ``gamma scale / |q|`` (the apply kernel's products use the raw keys and queries); with the root apart, per
    row its coupling to the root in ``A`` (without ``beta``) and in ``P``, then the root's ``beta``, ``gamma /
    |k|``, ``gamma scale / |q|`` and ``P``."""
    return 2 * NP * NP + 3 * NP + ROOT * (2 * NP + 4)


@triton.jit
def _program_tree(i_nh, T, H: tl.constexpr, HV: tl.constexpr, NP: tl.constexpr, ROOT: tl.constexpr):
    """A (request, value head) program's request, value head, key head, padded rows (the tree's nodes from
    ``ROOT`` on: past the root when it is apart), their mask and their token indices in the ``[bs * T, ...]``
    inputs."""
    i_n, i_hv = i_nh // HV, i_nh % HV
    rows = tl.arange(0, NP)
    return i_n, i_hv, i_hv // (HV // H), rows, rows + ROOT < T, (i_n * T + rows + ROOT).to(tl.int64)


@triton.jit
def _gates(a_ptr, b_ptr, stride_a, stride_b, A_log_ptr, dt_bias_ptr, tok, valid, i_hv, softplus_beta,
           softplus_threshold):  # fmt: skip
    """Log-decay ``g`` and write strength ``beta`` of the tokens ``tok`` in value head ``i_hv`` (``stride_a``,
    ``stride_b``: elements between two tokens' gates)."""
    x = tl.load(a_ptr + tok * stride_a + i_hv, mask=valid, other=0).to(tl.float32)
    x += tl.load(dt_bias_ptr + i_hv).to(tl.float32)
    softplus = tl.where(softplus_beta * x <= softplus_threshold,
                        tl.log(1.0 + tl.exp(softplus_beta * x)) / softplus_beta, x)  # fmt: skip
    g = tl.where(valid, -tl.exp(tl.load(A_log_ptr + i_hv).to(tl.float32)) * softplus, 0.0)
    return g, tl.sigmoid(tl.load(b_ptr + tok * stride_b + i_hv, mask=valid, other=0).to(tl.float32))


@triton.jit
def _head_columns(ptr, stride_tok, tok, valid, i_h, o_k, K: tl.constexpr):
    """Columns ``o_k`` of key head ``i_h`` for the tree's rows (queries or keys, ``stride_tok`` elements between two
    tokens, heads packed), fp32."""
    return tl.load(ptr + tok[:, None] * stride_tok + i_h * K + o_k[None, :], mask=valid[:, None], other=0).to(
        tl.float32)


@triton.jit
def _ancestors(parents_ptr, rows, valid, cols):
    """``anc[i, j]``: node ``cols[j]`` is ``rows[i]`` or an ancestor of it, walking every row's parent chain at
    once, as many steps as the deepest row has ancestors (a DDTree is at most its block deep, however wide)."""
    anc = (cols[None, :] == rows[:, None]) & valid[:, None]
    cur = tl.where(valid, rows, 0)
    while tl.max(cur, 0) > 0:
        cur = tl.where(cur > 0, tl.load(parents_ptr + tl.maximum(cur, 0), mask=cur > 0, other=-1).to(tl.int32), -1)
        anc = anc | ((cols[None, :] == cur[:, None]) & (cur[:, None] >= 0))
    return anc


@triton.jit
def _gdn_tree_factor_kernel(
    q_ptr, k_ptr, a_ptr, b_ptr, stride_q, stride_k, stride_a, stride_b, A_log_ptr, dt_bias_ptr, parents_ptr, ws_ptr,
    ws_indices_ptr, stride_ws, factors_ptr, scale, softplus_beta, softplus_threshold, T, T_LAYOUT,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NP: tl.constexpr, BR: tl.constexpr,
    BK: tl.constexpr, DOT: tl.constexpr, ROOT: tl.constexpr,
):  # fmt: skip
    """Per (request, value head): what does not depend on the values. ``(I + A)^-1``, with ``A[i, j] = beta_i
    exp(G_i - G_j) (k_i . k_j)`` over ``j`` a strict ancestor of ``i``, so that ``u = (I + A)^-1 (beta (v - gamma
    K S0))``; ``P[i, j] = exp(G_i - G_j) (q_i . k_j)`` over ``j = i`` or an ancestor, so that ``o = gamma Q S0 + P
    u``; both to ``factors`` with each row's ``beta``, ``gamma / |k|`` and ``gamma scale / |q|``. To the workspace:
    ``G``, the unit keys and (once per request) the parents.

    With the root apart (``ROOT = 1``) the rows are the drafted nodes only: the root, every node's ancestor, is
    solved first by the apply kernel (its ``u`` needs no other node's), and its column of ``A`` and of ``P`` are
    kept as one coupling per row. A tree of 2^n + 1 nodes then pads to 2^n rows instead of 2^(n + 1).

    ``BR`` rows at a time (all of them up to 64 rows): each block's ``A`` and ``P`` rows, then its rows of the
    inverse, from the blocks above it (parents come before children) and, within the block, one tree level at a
    time. Past one block ``factors`` holds a block's ``A`` rows until the inverse's replace them; rows one program
    stores and then loads again cross a barrier."""
    i_nh = tl.program_id(0)
    i_n, i_hv, i_h, cols, valid_c, tok_c = _program_tree(i_nh, T, H, HV, NP, ROOT)
    nodes_c = cols + ROOT  # the tree's node each column stands for
    req_parents = parents_ptr + i_n.to(tl.int64) * T
    ws = ws_ptr + tl.load(ws_indices_ptr + i_n).to(tl.int64) * stride_ws
    off_u, off_g, off_k, off_p = _workspace_offsets(T_LAYOUT, HV, K, V)
    factors = factors_ptr + i_nh.to(tl.int64) * _factor_numel(NP, ROOT)
    square = factors + cols[None, :]  # + row * NP: a row of A, then of the inverse
    p_rows = factors + NP * NP + cols[None, :]

    # Per node: its log-decay g, write strength beta and 1 / |k|; the unit keys and the parents to the workspace.
    g_c, beta_c = _gates(a_ptr, b_ptr, stride_a, stride_b, A_log_ptr, dt_bias_ptr, tok_c, valid_c, i_hv,
                         softplus_beta, softplus_threshold)  # fmt: skip
    k_sq = tl.zeros([NP], dtype=tl.float32)
    for c in range(0, K, BK):
        b_k = _head_columns(k_ptr, stride_k, tok_c, valid_c, i_h, c + tl.arange(0, BK), K)
        k_sq += tl.sum(b_k * b_k, 1)
    inv_k_c = 1.0 / tl.sqrt(k_sq + 1e-6)
    for c in range(0, K, BK):
        o_k = c + tl.arange(0, BK)
        b_k = _head_columns(k_ptr, stride_k, tok_c, valid_c, i_h, o_k, K)
        tl.store(ws + off_k + (nodes_c[:, None] * HV + i_hv) * K + o_k[None, :], b_k * inv_k_c[:, None],
                 mask=valid_c[:, None])  # fmt: skip
    if i_hv == 0:
        tl.store(ws + off_p + nodes_c, tl.load(req_parents + nodes_c, mask=valid_c & (nodes_c > 0), other=-1).to(
            tl.float32), mask=valid_c)  # fmt: skip
    tl.store(factors + 2 * NP * NP + cols, beta_c)
    if ROOT:  # the root's gates, norms and unit key; its G is its own log-decay
        tok_0 = (i_n * T).to(tl.int64)
        lane_0 = tl.arange(0, 2) == 0  # the gates of one token, as a vector of two lanes
        tok_0_lanes = tok_0 + tl.zeros([2], tl.int64)
        g_0, beta_0 = _gates(a_ptr, b_ptr, stride_a, stride_b, A_log_ptr, dt_bias_ptr, tok_0_lanes, lane_0, i_hv,
                             softplus_beta, softplus_threshold)  # fmt: skip
        g_0, beta_0 = tl.sum(g_0, 0), tl.sum(tl.where(lane_0, beta_0, 0.0), 0)
        k0_sq = tl.zeros([BK], dtype=tl.float32)
        q0_sq = tl.zeros([BK], dtype=tl.float32)
        qk_00 = tl.zeros([BK], dtype=tl.float32)
        for c in range(0, K, BK):
            o_k = c + tl.arange(0, BK)
            b_k0 = tl.load(k_ptr + tok_0 * stride_k + i_h * K + o_k).to(tl.float32)
            b_q0 = tl.load(q_ptr + tok_0 * stride_q + i_h * K + o_k).to(tl.float32)
            k0_sq += b_k0 * b_k0
            q0_sq += b_q0 * b_q0
            qk_00 += b_q0 * b_k0
        inv_k0, inv_q0 = 1.0 / tl.sqrt(tl.sum(k0_sq, 0) + 1e-6), scale / tl.sqrt(tl.sum(q0_sq, 0) + 1e-6)
        qk_00 = tl.sum(qk_00, 0)
        for c in range(0, K, BK):
            o_k = c + tl.arange(0, BK)
            b_k0 = tl.load(k_ptr + tok_0 * stride_k + i_h * K + o_k).to(tl.float32)
            tl.store(ws + off_k + i_hv * K + o_k, b_k0 * inv_k0)
        tl.store(ws + off_g + i_hv, g_0)
        if i_hv == 0:
            tl.store(ws + off_p, -1.0)
        root_scalars = factors + 2 * NP * NP + 5 * NP
        tl.store(root_scalars, beta_0)
        tl.store(root_scalars + 1, tl.exp(g_0) * inv_k0)
        tl.store(root_scalars + 2, tl.exp(g_0) * inv_q0)
        tl.store(root_scalars + 3, qk_00 * inv_q0 * inv_k0)

    for r0 in tl.static_range(0, NP, BR):
        rows = r0 + tl.arange(0, BR)
        valid = rows + ROOT < T
        tok = (i_n * T + rows + ROOT).to(tl.int64)
        anc = _ancestors(req_parents, rows + ROOT, valid, nodes_c)  # the root is no row's: node 0 is no column
        b_G = tl.sum(tl.where(anc, g_c[None, :], 0.0), 1)  # the log-decay summed along each row's path
        if ROOT:
            b_G += g_0
        tl.store(ws + off_g + (rows + ROOT) * HV + i_hv, b_G, mask=valid)
        tl.debug_barrier()
        G_c = tl.load(ws + off_g + nodes_c * HV + i_hv, mask=valid_c & (cols < r0 + BR), other=0)
        decay = tl.exp(tl.where(anc, b_G[:, None] - G_c[None, :], float("-inf")))  # exp(G_i - G_j) on the path
        qk = tl.zeros([BR, NP], dtype=tl.float32)
        kk = tl.zeros([BR, NP], dtype=tl.float32)
        q_sq = tl.zeros([BR], dtype=tl.float32)
        qk_0 = tl.zeros([BR], dtype=tl.float32)
        kk_0 = tl.zeros([BR], dtype=tl.float32)
        for c in range(0, K, BK):  # key chunks: no [nodes, K] tile is ever whole
            o_k = c + tl.arange(0, BK)
            b_q = _head_columns(q_ptr, stride_q, tok, valid, i_h, o_k, K)
            b_k = _head_columns(k_ptr, stride_k, tok_c, valid_c, i_h, o_k, K)
            b_k_rows = _head_columns(k_ptr, stride_k, tok, valid, i_h, o_k, K)
            qk += tl.dot(b_q, tl.trans(b_k), input_precision=DOT)
            kk += tl.dot(b_k_rows, tl.trans(b_k), input_precision=DOT)
            q_sq += tl.sum(b_q * b_q, 1)
            if ROOT:
                b_k0 = tl.load(k_ptr + tok_0 * stride_k + i_h * K + o_k).to(tl.float32)
                qk_0 += tl.sum(b_q * b_k0[None, :], 1)
                kk_0 += tl.sum(b_k_rows * b_k0[None, :], 1)
        inv_q = scale / tl.sqrt(q_sq + 1e-6)
        inv_k = tl.sum(tl.where(cols[None, :] == rows[:, None], inv_k_c[None, :], 0.0), 1)
        beta = tl.sum(tl.where(cols[None, :] == rows[:, None], beta_c[None, :], 0.0), 1)
        strict = anc & (cols[None, :] != rows[:, None])
        a_rows = tl.where(strict, decay * kk * inv_k_c[None, :], 0.0) * (beta * inv_k)[:, None]  # [BR, NP]
        tl.store(p_rows + rows[:, None] * NP, tl.where(anc, decay * qk * inv_k_c[None, :], 0.0) * inv_q[:, None])
        gamma = tl.exp(b_G)
        tl.store(factors + 2 * NP * NP + NP + rows, gamma * inv_k)
        tl.store(factors + 2 * NP * NP + 2 * NP + rows, gamma * inv_q)
        if ROOT:  # each row's coupling to the root: its A entry without beta, its P entry
            to_root = tl.where(valid, tl.exp(b_G - g_0), 0.0) * inv_k0
            tl.store(factors + 2 * NP * NP + 3 * NP + rows, to_root * kk_0 * inv_k)
            tl.store(factors + 2 * NP * NP + 4 * NP + rows, to_root * qk_0 * inv_q)

        # These rows of (I + A)^-1 by forward substitution: a node's row is its unit row minus its ancestors' rows
        # weighted by A; ancestors above the block are inverted already, those within it sit at smaller depths.
        inverse = tl.where(cols[None, :] == rows[:, None], 1.0, 0.0)
        if BR == NP:
            a_block = a_rows
        else:  # A's columns of each block, from memory (a register tile has no column slices)
            tl.store(square + rows[:, None] * NP, a_rows)
            tl.debug_barrier()
            for p0 in tl.static_range(0, r0, BR):
                above = p0 + tl.arange(0, BR)
                a_above = tl.load(factors + rows[:, None] * NP + above[None, :])  # [BR, BR]
                inverse -= tl.dot(a_above, tl.load(square + above[:, None] * NP), input_precision=DOT)
            a_block = tl.load(factors + rows[:, None] * NP + rows[None, :])  # [BR, BR]
        unit = inverse
        depth = tl.sum((anc & (cols[None, :] >= r0)).to(tl.int32), 1)  # ancestors within the block, itself too
        for d in range(2, tl.max(depth, 0) + 1):
            level = unit - tl.dot(a_block, inverse, input_precision=DOT)
            inverse = tl.where((depth == d)[:, None], level, inverse)
        if BR != NP:
            tl.debug_barrier()  # every thread's loads of this block's A rows are done
        tl.store(square + rows[:, None] * NP, inverse)
        if BR != NP:
            tl.debug_barrier()  # the next block reads these rows


@triton.jit
def _gdn_tree_apply_kernel(
    q_ptr, k_ptr, v_ptr, stride_q, stride_k, stride_v, h0_ptr, h0_indices_ptr, stride_h0, ws_ptr, ws_indices_ptr,
    stride_ws, factors_ptr, o_ptr, T, T_LAYOUT,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NP: tl.constexpr, BV: tl.constexpr,
    BK: tl.constexpr, DOT: tl.constexpr, ROOT: tl.constexpr,
):  # fmt: skip
    """Per (request, value head, ``BV`` value columns): ``u = (I + A)^-1 beta (v - gamma K S0)``, ``o = gamma Q S0
    + P u`` with the factor kernel's inverse, ``P`` and row scales; ``u`` to the workspace. With the root apart its
    ``u`` comes first (``beta_0 (v_0 - gamma_0 k_0 S0)``), and enters the other rows through their couplings."""
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv, i_h, rows, valid, tok = _program_tree(i_nh, T, H, HV, NP, ROOT)
    cols = tl.arange(0, NP)
    o_v = i_v * BV + tl.arange(0, BV)
    mask_v = o_v < V
    ws = ws_ptr + tl.load(ws_indices_ptr + i_n).to(tl.int64) * stride_ws
    off_u, off_g, off_k, off_p = _workspace_offsets(T_LAYOUT, HV, K, V)

    slot = tl.load(h0_indices_ptr + i_n).to(tl.int64)
    tok_0 = (i_n * T).to(tl.int64)
    q_h0 = tl.zeros([NP, BV], dtype=tl.float32)
    k_h0 = tl.zeros([NP, BV], dtype=tl.float32)
    q0_h0 = tl.zeros([BV], dtype=tl.float32)
    k0_h0 = tl.zeros([BV], dtype=tl.float32)
    for c in range(0, K, BK):
        o_k = c + tl.arange(0, BK)
        b_h0 = tl.load(h0_ptr + slot * stride_h0 + i_hv * V * K + o_v[None, :] * K + o_k[:, None],
                       mask=mask_v[None, :] & (slot >= 0), other=0).to(tl.float32)  # [BK, BV]  # fmt: skip
        b_q = _head_columns(q_ptr, stride_q, tok, valid, i_h, o_k, K)
        b_k = _head_columns(k_ptr, stride_k, tok, valid, i_h, o_k, K)
        q_h0 += tl.dot(b_q, b_h0, input_precision=DOT)
        k_h0 += tl.dot(b_k, b_h0, input_precision=DOT)
        if ROOT:  # the root's row: one vector-matrix product each, beside the padded tiles
            q0_h0 += tl.sum(tl.load(q_ptr + tok_0 * stride_q + i_h * K + o_k).to(tl.float32)[:, None] * b_h0, 0)
            k0_h0 += tl.sum(tl.load(k_ptr + tok_0 * stride_k + i_h * K + o_k).to(tl.float32)[:, None] * b_h0, 0)
    b_v = tl.load(v_ptr + tok[:, None] * stride_v + i_hv * V + o_v[None, :], mask=valid[:, None] & mask_v[None, :],
                  other=0).to(tl.float32)  # fmt: skip
    factors = factors_ptr + i_nh.to(tl.int64) * _factor_numel(NP, ROOT)
    square = rows[:, None] * NP + cols[None, :]
    beta = tl.load(factors + 2 * NP * NP + rows)
    key_scale = tl.load(factors + 2 * NP * NP + NP + rows)  # gamma / |k|: raw keys and queries times S0 above
    query_scale = tl.load(factors + 2 * NP * NP + 2 * NP + rows)  # gamma * scale / |q|
    residual = b_v - key_scale[:, None] * k_h0
    if ROOT:
        root_scalars = factors + 2 * NP * NP + 5 * NP
        v_0 = tl.load(v_ptr + tok_0 * stride_v + i_hv * V + o_v, mask=mask_v, other=0).to(tl.float32)
        u_0 = tl.load(root_scalars) * (v_0 - tl.load(root_scalars + 1) * k0_h0)
        residual -= tl.load(factors + 2 * NP * NP + 3 * NP + rows)[:, None] * u_0[None, :]
    b_u = tl.dot(tl.load(factors + square), beta[:, None] * residual, input_precision=DOT)
    b_o = query_scale[:, None] * q_h0 + tl.dot(tl.load(factors + NP * NP + square), b_u, input_precision=DOT)
    if ROOT:
        b_o += tl.load(factors + 2 * NP * NP + 4 * NP + rows)[:, None] * u_0[None, :]
        o_0 = tl.load(root_scalars + 2) * q0_h0 + tl.load(root_scalars + 3) * u_0
        tl.store(o_ptr + (tok_0 * HV + i_hv) * V + o_v, o_0.to(o_ptr.dtype.element_ty), mask=mask_v)
        tl.store(ws + off_u + i_hv * V + o_v, u_0, mask=mask_v)
    out_mask = valid[:, None] & mask_v[None, :]
    tl.store(o_ptr + (tok[:, None] * HV + i_hv) * V + o_v[None, :], b_o.to(o_ptr.dtype.element_ty), mask=out_mask)
    tl.store(ws + off_u + ((rows[:, None] + ROOT) * HV + i_hv) * V + o_v[None, :], b_u, mask=out_mask)


@triton.jit
def _gdn_tree_commit_kernel(
    dst_ptr, stride_dst_layer, stride_dst_slot, ws_ptr, stride_ws_layer, stride_ws_request,
    dst_indices_ptr, src_indices_ptr, nodes_ptr, T,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    """``BV`` rows of one (layer, request, value head)'s state per program, keys contiguous as the pool holds them:
    the root state decayed to the node, plus one rank-1 term per node of its path, walking up from it (at most a
    block's depth; fp32 products, no tensor-core tiles over the tree's padded rows). With [NP, BV] tiles and a dot,
    looping over the key chunks, a program held 162 registers and an SM one block: 0.39 ms per step for 48 layers at
    batch 1 (tests/gpu/RESULTS.md run 77), where moving the states at the card's bandwidth takes ~0.1."""
    i_v, i_nh, i_layer = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_n, i_hv = i_nh // HV, i_nh % HV
    node = tl.load(nodes_ptr + i_n).to(tl.int32)
    if node >= 0:
        o_v = i_v * BV + tl.arange(0, BV)
        o_k = tl.arange(0, K)
        mask_v = o_v < V
        ws = ws_ptr + i_layer.to(tl.int64) * stride_ws_layer + i_n.to(tl.int64) * stride_ws_request
        off_u, off_g, off_k, off_p = _workspace_offsets(T, HV, K, V)
        g_node = tl.load(ws + off_g + node * HV + i_hv)
        layer = dst_ptr + i_layer.to(tl.int64) * stride_dst_layer + i_hv * V * K
        rows = o_v[:, None] * K + o_k[None, :]
        # The root state where the verify read it; the destination may be that same slot: no other program reads or
        # writes these rows.
        src = layer + tl.load(src_indices_ptr + i_n).to(tl.int64) * stride_dst_slot
        b_h = tl.exp(g_node) * tl.load(src + rows, mask=mask_v[:, None], other=0).to(tl.float32)
        cur = node
        while cur >= 0:  # only the path's rows: past the verified tree's width they hold an earlier verify's data
            weight = tl.exp(g_node - tl.load(ws + off_g + cur * HV + i_hv))
            b_u = tl.load(ws + off_u + (cur * HV + i_hv) * V + o_v, mask=mask_v, other=0)
            b_k = tl.load(ws + off_k + (cur * HV + i_hv) * K + o_k)
            b_h += (weight * b_u)[:, None] * b_k[None, :]
            parent = tl.load(ws + off_p + tl.maximum(cur, 0)).to(tl.int32)
            cur = tl.where(cur > 0, parent, -1)
        p_h = layer + tl.load(dst_indices_ptr + i_n).to(tl.int64) * stride_dst_slot + rows
        tl.store(p_h, b_h.to(p_h.dtype.element_ty), mask=mask_v[:, None])


def _token_rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``x`` (``[bs, T, ...]``) and the elements between two of its tokens, for the kernels, which read token ``n T
    + t`` at ``(n T + t) * stride`` with every later dim packed. At widths SGLang's fused q/k/v split does not take
    (Qwen3.6-27B at TP 1) the layer's q, k and v are such views of one projection, and copying them cost 0.35 ms of
    a 27.4 ms step (tests/gpu/RESULTS.md runs 77 and 80); any other layout is copied."""
    inner_packed = all(x.stride(d) == math.prod(x.shape[d + 1:]) for d in range(2, x.dim()))
    if inner_packed and x.stride(0) == x.shape[1] * x.stride(1):
        return x, x.stride(1)
    return x.contiguous(), math.prod(x.shape[2:])


def _padded_nodes(T: int) -> int:
    return max(16, triton.next_power_of_2(T))


def root_apart_pads_fewer_rows(T: int) -> bool:
    """Whether a tree of ``T`` nodes has fewer padded rows with its root apart: a DDTree's ``B`` drafted nodes and
    its root, with ``B`` a power of two of at least 16 (``--budget 32``: 32 rows instead of 64)."""
    return T > 1 and _padded_nodes(T - 1) < _padded_nodes(T)


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
    parents: torch.Tensor,
    workspace: torch.Tensor,
    workspace_indices: torch.Tensor,
    scale: float,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
    capacity: Optional[int] = None,
    block_v: Optional[int] = None,
    num_warps: Optional[int] = None,
    dot_precision: str = DEFAULT_DOT_PRECISION,
    root_apart: Optional[bool] = None,
) -> torch.Tensor:
    """Every tree node's output ``[bs, T, HV, V]`` of one GDN layer, from the requests' states
    (``ssm_states[cache_indices]``, read only); request ``n``'s commit data goes to ``workspace[
    workspace_indices[n]]`` (float32, contiguous, at least :func:`workspace_numel` elements per row), laid out
    for trees of ``capacity`` nodes (default ``T``): the layout :func:`gdn_tree_commit` reads with the same
    ``T``, so that a server whose steps verify trees of different widths (``--budget auto``) commits from one
    layout, its widest. ``block_v`` (value columns per program) and ``num_warps``: the apply kernel's launch
    (default :func:`_apply_launch`); ``dot_precision``: one of :data:`DOT_PRECISIONS`; both for
    ``bench.gdn_tree_kernel``'s sweep. ``root_apart``: solve the root before the other nodes instead of as one of
    their rows (default :func:`root_apart_pads_fewer_rows`; both for the tests and the bench's A/B)."""
    bs, T, H, K = q.shape
    layout = T if capacity is None else capacity
    if layout < T:
        raise ValueError(f"gdn_tree_verify: a workspace laid out for {layout} nodes cannot hold a tree of {T}")
    HV, V = v.shape[2], v.shape[3]
    if K != triton.next_power_of_2(K) or K < 16 or HV % H:
        raise ValueError(f"gdn_tree_verify needs a power-of-two key dim >= 16 and HV a multiple of H, got K={K}, "
                         f"H={H}, HV={HV}")  # fmt: skip
    row = workspace[0].numel()
    if workspace.dtype != torch.float32 or not workspace.is_contiguous() or row < workspace_numel(layout, HV, K, V):
        raise ValueError(f"gdn_tree_verify needs a contiguous float32 workspace of {workspace_numel(layout, HV, K, V)} "
                         f"elements per request, got {workspace.dtype} rows of {row}")  # fmt: skip
    if dot_precision not in DOT_PRECISIONS:
        raise ValueError(f"gdn_tree_verify: dot_precision must be one of {DOT_PRECISIONS}, got '{dot_precision}'")
    root = int(root_apart_pads_fewer_rows(T) if root_apart is None else root_apart and T > 1)
    NP, BK = _padded_nodes(T - root), min(K, _BK)
    default_bv, default_warps = _apply_launch(NP)
    block_v, num_warps = block_v or default_bv, num_warps or default_warps
    # before the factors, so that an input that must be copied is copied once for both kernels
    (q, stride_q), (k, stride_k), (v, stride_v) = _token_rows(q), _token_rows(k), _token_rows(v)
    factors = build_factors(q, k, a, b, A_log, dt_bias, parents, workspace, workspace_indices, HV, V, scale,
                            softplus_beta, softplus_threshold, layout, dot_precision, bool(root))  # fmt: skip
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    _gdn_tree_apply_kernel[(triton.cdiv(V, block_v), bs * HV)](
        q, k, v, stride_q, stride_k, stride_v, ssm_states, cache_indices, ssm_states.stride(0), workspace,
        workspace_indices, row, factors, o, T, layout, H=H, HV=HV, K=K, V=V, NP=NP, BV=block_v, BK=BK,
        DOT=dot_precision, ROOT=root, num_warps=num_warps,
    )  # fmt: skip
    return o


def build_factors(
    q: torch.Tensor, k: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
    parents: torch.Tensor, workspace: torch.Tensor, workspace_indices: torch.Tensor, HV: int, V: int, scale: float,
    softplus_beta: float, softplus_threshold: float, layout: int, dot_precision: str,
    root_apart: Optional[bool] = None,
) -> torch.Tensor:  # fmt: skip
    """The factor kernel's launch alone (:func:`gdn_tree_verify` checks the arguments first): ``[bs * HV, 2 NP^2 + 3
    NP (+ 2 NP + 4 with the root apart)]`` factors, per layer call; ``G``, unit keys and parents into the workspace.
    Public for ``bench.gdn_tree_kernel``, which times it apart from the apply kernel."""
    bs, T, H, K = q.shape
    root = int(root_apart_pads_fewer_rows(T) if root_apart is None else root_apart and T > 1)
    NP = _padded_nodes(T - root)
    factors = torch.empty(bs * HV, 2 * NP * NP + 3 * NP + root * (2 * NP + 4), dtype=torch.float32, device=q.device)
    (q, stride_q), (k, stride_k), (a, stride_a), (b, stride_b) = map(_token_rows, (q, k, a, b))
    _gdn_tree_factor_kernel[(bs * HV,)](
        q, k, a, b, stride_q, stride_k, stride_a, stride_b, A_log, dt_bias, parents.contiguous(), workspace,
        workspace_indices, workspace[0].numel(), factors, scale, softplus_beta, softplus_threshold, T, layout, H=H,
        HV=HV, K=K, V=V, NP=NP, BR=_factor_rows(NP), BK=min(K, _BK), DOT=dot_precision, ROOT=root,
        num_warps=_factor_warps(NP),
    )  # fmt: skip
    return factors


def gdn_tree_commit(
    dst: torch.Tensor, workspace: torch.Tensor, dst_indices: torch.Tensor, nodes: torch.Tensor, T: int, *,
    source_indices: torch.Tensor, block_v: Optional[int] = None, num_warps: Optional[int] = None,
) -> None:
    """For each request ``i`` with ``nodes[i] >= 0``: ``dst[:, dst_indices[i]]`` = the state after the root-to-node
    path of ``nodes[i]``, from the root state ``dst[:, source_indices[i]]`` (the slot the verify read: the
    request's own) and ``workspace[:, i]`` (``dst [layers, slots, HV, V, K]``, ``workspace [layers, requests,
    ...]`` as :func:`gdn_tree_verify` filled it, laid out for trees of ``T`` nodes: its ``capacity``; the tree
    verified may have had fewer, the nodes of its paths are all below ``T``). The destination may be the source
    slot itself; a commit into another slot (a prefix-cache track node's) must come before that one, which
    replaces the root state. ``block_v`` (state rows per program) and ``num_warps``: the launch (default
    :data:`COMMIT_LAUNCH`; for ``bench.gdn_tree_kernel``'s sweep)."""
    layers, _, HV, V, K = dst.shape
    block_v, num_warps = block_v or COMMIT_LAUNCH[0], num_warps or COMMIT_LAUNCH[1]
    _gdn_tree_commit_kernel[(triton.cdiv(V, block_v), nodes.shape[0] * HV, layers)](
        dst, dst.stride(0), dst.stride(1), workspace, workspace.stride(0), workspace.stride(1),
        dst_indices, source_indices, nodes, T, HV=HV, K=K, V=V, BV=block_v, num_warps=num_warps,
    )  # fmt: skip
