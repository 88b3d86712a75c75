"""A GDN layer's causal convolution over draft trees without a conv window per node, and the commit of any node's
window (Triton).

Before its recurrence a Gated DeltaNet layer convolves each token's projected ``q, k, v`` with the ``W - 1``
tokens before it (``W = 4``). SGLang 0.5.17's tree verify (``causal_conv1d_update`` with ``retrieve_next_token /
sibling``) convolves each node with its ancestors and writes every node's ``[dim, W - 1]`` window to a buffer of N
per request and layer (60 KiB per node and GDN layer at Qwen3.6-27B's shape, TP 1), so that the accepted node's
can be copied into the request's slot. A window is only the last ``W - 1`` inputs along a path, so here the
verify writes each node's input once (``[dim]``, a third of a window) and :func:`gdn_tree_conv_commit` assembles
the accepted node's window from the inputs on its path and the persistent window before the root, which the
verify leaves in place (SGLang's overwrites it with the last three tokens by index, to be replaced by the
commit). The products are rounded and summed as SGLang's decode step does them (each ``x * w`` in the inputs'
dtype, oldest input first), so a node's output is bit-identical to the one decoding its path token by token.

The verify also writes ``retrieve_parent_token`` (the root's entry -1), as SGLang's conv kernel does for the
recurrence after it. The executable specification is ``sglang_ddtree.tree.gdn_tree_reference.reference_tree_conv``.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl


@triton.jit
def _gather(values, index, lanes):
    """``values[index]`` for a vector of indices, from a register vector laid out along ``lanes`` (``-1`` where an
    index is out of range): a one-hot reduction, the trees being at most a few dozen nodes wide."""
    return tl.max(tl.where(index[:, None] == lanes[None, :], values[None, :], -1), 1)


@triton.jit
def _tree_parents(next_token_ptr, next_sibling_ptr, rows, valid, JUMPS: tl.constexpr):
    """Each node's parent (-1 for the root) from SGLang's first-child / next-sibling links: the node whose first
    child it is, or else its first older sibling's, found by pointer jumping along the sibling chain (log2 NP
    rounds instead of a pass over the nodes one at a time)."""
    first_child = tl.load(next_token_ptr + rows, mask=valid, other=-1).to(tl.int32)
    next_sibling = tl.load(next_sibling_ptr + rows, mask=valid, other=-1).to(tl.int32)
    # parent_of_first[c]: p if c is p's first child; previous[c]: c's older neighbour in its sibling chain.
    parent_of_first = tl.max(tl.where(first_child[None, :] == rows[:, None], rows[None, :], -1), 1)
    previous = tl.max(tl.where(next_sibling[None, :] == rows[:, None], rows[None, :], -1), 1)
    eldest = tl.where(previous >= 0, previous, rows)
    for _ in tl.static_range(JUMPS):
        eldest = _gather(eldest, eldest, rows)
    return _gather(parent_of_first, eldest, rows)


@triton.jit
def _up(nodes, parents, T):
    """One step towards the root (``parents``: the request's row of them); past it, ``-1, -2, ...`` name the
    persistent window's columns from its last."""
    drafted = (nodes > 0) & (nodes < T)
    return tl.where(nodes > 0, tl.load(parents + tl.where(drafted, nodes, 0), mask=drafted, other=-1), nodes - 1)


@triton.jit
def _gdn_tree_parents_kernel(
    next_token_ptr, stride_next_token, next_sibling_ptr, stride_next_sibling, parents_ptr, stride_parents, T,
    NP: tl.constexpr, JUMPS: tl.constexpr,
):  # fmt: skip
    """One request's parents from its links, once: the conv's programs (a few hundred per request) read them
    instead of each rebuilding them with [NP, NP] gathers, which past 32 rows cost more than the conv (RESULTS run
    71). A padded request's too: the recurrence after the conv reads every request's."""
    i_n = tl.program_id(0)
    rows = tl.arange(0, NP)
    valid = rows < T
    parents = _tree_parents(next_token_ptr + i_n * stride_next_token, next_sibling_ptr + i_n * stride_next_sibling,
                            rows, valid, JUMPS)  # fmt: skip
    tl.store(parents_ptr + i_n * stride_parents + rows, parents, mask=valid)


@triton.jit
def _tap(acc, source, w_tap, x, state, stride_x_tok, stride_state_col, valid, mask_f, W: tl.constexpr):
    """``acc`` plus one tap of the conv: each node's input ``source`` (a node, or a column of the persistent
    window before the root) times the tap's weights, the product in the inputs' dtype; and those inputs."""
    in_tree = (source >= 0)[:, None] & valid[:, None] & mask_f[None, :]
    before_root = (source < 0)[:, None] & valid[:, None] & mask_f[None, :]
    b_x = tl.load(x + tl.maximum(source, 0)[:, None] * stride_x_tok, mask=in_tree, other=0)
    b_x += tl.load(state + (W - 1 + tl.minimum(source, -1))[:, None] * stride_state_col, mask=before_root, other=0)
    return acc + b_x * tl.load(w_tap, mask=mask_f, other=0)[None, :], b_x


@triton.jit
def _gdn_tree_conv_kernel(
    x_ptr, stride_x_req, stride_x_dim, stride_x_tok, w_ptr, stride_w_dim, stride_w_tap, bias_ptr,
    state_ptr, stride_state_slot, stride_state_dim, stride_state_col, state_indices_ptr, parents_ptr,
    stride_parents, inputs_ptr, stride_inputs_row, input_rows_ptr, o_ptr, stride_o_req, stride_o_dim, stride_o_tok,
    T, dim, W: tl.constexpr, NP: tl.constexpr, BD: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
):  # fmt: skip
    i_d, i_n = tl.program_id(0), tl.program_id(1)
    rows = tl.arange(0, NP)
    valid = rows < T
    parents = parents_ptr + i_n * stride_parents
    slot = tl.load(state_indices_ptr + i_n).to(tl.int64)
    if slot >= 0:  # SGLang's pad slot id is -1
        feats = i_d * BD + tl.arange(0, BD)
        mask_f = feats < dim
        x = x_ptr + i_n.to(tl.int64) * stride_x_req + feats[None, :] * stride_x_dim
        state = state_ptr + slot * stride_state_slot + feats[None, :] * stride_state_dim
        if HAS_BIAS:
            acc = tl.zeros((NP, BD), tl.float32) + tl.load(bias_ptr + feats, mask=mask_f, other=0).to(tl.float32)
        else:
            acc = tl.zeros((NP, BD), tl.float32)
        w = w_ptr + feats * stride_w_dim
        # The taps oldest input first, as SGLang's decode step sums them (W is 2, 3 or 4).
        x_tok, col = stride_x_tok, stride_state_col
        up_1 = _up(rows, parents, T)
        if W >= 3:
            up_2 = _up(up_1, parents, T)
            if W == 4:
                acc, _ = _tap(acc, _up(up_2, parents, T), w, x, state, x_tok, col, valid, mask_f, W)
            acc, _ = _tap(acc, up_2, w + (W - 3) * stride_w_tap, x, state, x_tok, col, valid, mask_f, W)
        acc, _ = _tap(acc, up_1, w + (W - 2) * stride_w_tap, x, state, x_tok, col, valid, mask_f, W)
        acc, own = _tap(acc, rows, w + (W - 1) * stride_w_tap, x, state, x_tok, col, valid, mask_f, W)
        # The nodes' own inputs (the last tap's), for the commit.
        inputs = inputs_ptr + tl.load(input_rows_ptr + i_n).to(tl.int64) * stride_inputs_row
        tl.store(inputs + rows[:, None] * dim + feats[None, :], own.to(inputs_ptr.dtype.element_ty),
                 mask=valid[:, None] & mask_f[None, :])  # fmt: skip
        if SILU:
            acc = acc / (1 + tl.exp(-acc))
        o = o_ptr + i_n.to(tl.int64) * stride_o_req + feats[None, :] * stride_o_dim + rows[:, None] * stride_o_tok
        tl.store(o, acc.to(o_ptr.dtype.element_ty), mask=valid[:, None] & mask_f[None, :])


@triton.jit
def _gdn_tree_conv_commit_kernel(
    state_ptr, stride_state_layer, stride_state_slot, stride_state_dim, stride_state_col,
    inputs_ptr, stride_inputs_layer, stride_inputs_row, parents_ptr, stride_parents_layer, stride_parents_row,
    dst_indices_ptr, src_indices_ptr, nodes_ptr, dim, W: tl.constexpr, NW: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    i_d, i_n, i_layer = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    node = tl.load(nodes_ptr + i_n).to(tl.int32)
    if node >= 0:
        cols = tl.arange(0, NW)  # the window's columns, oldest first; column c is W - 2 - c steps up the path
        parents = parents_ptr + i_layer.to(tl.int64) * stride_parents_layer + i_n.to(tl.int64) * stride_parents_row
        source = tl.zeros((NW,), tl.int32) + node
        for step in tl.static_range(W - 2):
            parent = tl.load(parents + tl.maximum(source, 0), mask=source > 0, other=-1).to(tl.int32)
            source = tl.where(W - 2 - cols > step, tl.where(source > 0, parent, source - 1), source)
        feats = i_d * BD + tl.arange(0, BD)
        in_window = (cols < W - 1)[:, None] & (feats < dim)[None, :]
        inputs = (inputs_ptr + i_layer.to(tl.int64) * stride_inputs_layer
                  + i_n.to(tl.int64) * stride_inputs_row)  # fmt: skip
        layer = state_ptr + i_layer.to(tl.int64) * stride_state_layer + feats[None, :] * stride_state_dim
        root = layer + tl.load(src_indices_ptr + i_n).to(tl.int64) * stride_state_slot
        window = tl.load(inputs + tl.maximum(source, 0)[:, None] * dim + feats[None, :],
                         mask=in_window & (source >= 0)[:, None], other=0)  # fmt: skip
        window += tl.load(root + (W - 1 + tl.minimum(source, -1))[:, None] * stride_state_col,
                          mask=in_window & (source < 0)[:, None], other=0)  # fmt: skip
        tl.debug_barrier()  # the destination may be the root's own slot: every read of it before any write
        dst = layer + tl.load(dst_indices_ptr + i_n).to(tl.int64) * stride_state_slot
        tl.store(dst + cols[:, None] * stride_state_col, window.to(state_ptr.dtype.element_ty), mask=in_window)


def _conv_launch(NP: int) -> tuple[int, int]:
    """(channels per program, warps): 64 channels on 4 warps up to 32 rows, as measured (RESULTS run 71), 32 past
    them (compiled for sm_90, a [64, 64] tile spills 148 bytes per thread, [64, 32] and [128, 32] none:
    tests/test_kernels_compile_for_hopper.py); not yet swept on a GPU."""
    return (64, 4) if NP <= 32 else (32, 4)


def gdn_tree_conv(
    x: torch.Tensor, conv_states: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
    activation: Optional[str], state_indices: torch.Tensor, next_token: torch.Tensor, next_sibling: torch.Tensor,
    parents: torch.Tensor, inputs: torch.Tensor, input_rows: torch.Tensor, parents_filled: bool = False,
) -> torch.Tensor:  # fmt: skip
    """The convolved tree ``[bs, dim, T]`` (laid out as ``x``, SGLang's ``[bs, dim, T]`` view of ``[bs, T, dim]``
    tokens) of a batch of trees, each from its request's persistent window ``conv_states[state_indices[n]]``
    (``[slots, dim, W - 1]``, read only); ``parents [bs, T]`` is filled from the ``next_token / next_sibling``
    links, unless ``parents_filled`` says an earlier GDN layer of the same verify filled it (the links are every
    layer's: one launch per layer cost 0.27 ms of a 27.4 ms step, tests/gpu/RESULTS.md run 77), and node ``i``'s
    input goes to ``inputs[input_rows[n], i * dim:]`` (``inputs [rows, >= T * dim]``, contiguous rows) for
    :func:`gdn_tree_conv_commit`. ``activation``: ``"silu"`` / ``"swish"`` / ``True`` or none."""
    if activation not in (None, False, True, "silu", "swish"):
        raise ValueError(f"gdn_tree_conv: activation must be silu, swish or none, got '{activation}'")
    bs, dim, T = x.shape
    W = weight.shape[1]
    if W not in (2, 3, 4):
        raise ValueError(f"gdn_tree_conv: conv kernels of width 2 to 4, got {W}")
    if inputs.stride(-1) != 1 or inputs[0].numel() < T * dim:
        raise ValueError(f"gdn_tree_conv needs contiguous input rows of {T * dim} elements, got {inputs[0].numel()}")
    NP = max(2, triton.next_power_of_2(T))
    if not parents_filled:
        _gdn_tree_parents_kernel[(bs,)](
            next_token, next_token.stride(0), next_sibling, next_sibling.stride(0), parents, parents.stride(0), T,
            NP=NP, JUMPS=NP.bit_length(), num_warps=4,
        )  # fmt: skip
    BD, warps = _conv_launch(NP)
    out = torch.empty_like(x)
    _gdn_tree_conv_kernel[(triton.cdiv(dim, BD), bs)](
        x, *x.stride(), weight, *weight.stride(), bias, conv_states, *conv_states.stride(), state_indices, parents,
        parents.stride(0), inputs, inputs.stride(0), input_rows, out, *out.stride(), T, dim, W=W, NP=NP, BD=BD,
        HAS_BIAS=bias is not None, SILU=activation not in (None, False), num_warps=warps,
    )  # fmt: skip
    return out


def gdn_tree_conv_commit(
    conv_states: torch.Tensor, inputs: torch.Tensor, parents: torch.Tensor, dst_indices: torch.Tensor,
    nodes: torch.Tensor, *, source_indices: torch.Tensor,
) -> None:
    """For each request ``n`` with ``nodes[n] >= 0``: ``conv_states[:, dst_indices[n]]`` = the window after the
    root-to-node path of ``nodes[n]``, from the inputs :func:`gdn_tree_conv` left in ``inputs[:, n]`` and the
    window before the root, ``conv_states[:, source_indices[n]]`` (``conv_states [layers, slots, dim, W - 1]``,
    ``inputs [layers, requests, >= T * dim]``, ``parents [layers, requests, >= T]`` in any numeric dtype: the
    parents the verify used). The destination may be the source slot itself; a commit into another slot (a
    prefix-cache track node's) must come before that one, which replaces the window before the root."""
    layers, _, dim, window = conv_states.shape
    BD = 128
    grid = (triton.cdiv(dim, BD), nodes.shape[0], layers)
    _gdn_tree_conv_commit_kernel[grid](
        conv_states, *conv_states.stride(), inputs, inputs.stride(0), inputs.stride(1), parents, parents.stride(0),
        parents.stride(1), dst_indices, source_indices, nodes, dim, W=window + 1,
        NW=triton.next_power_of_2(window), BD=BD, num_warps=4,
    )  # fmt: skip
