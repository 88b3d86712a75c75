"""Plain PyTorch reference for verifying draft trees through a Gated DeltaNet layer (the executable specification
of ``sglang_ddtree.kernels.gdn_tree``).

SGLang's tree verify (``fused_sigmoid_gating_delta_rule_update`` with ``retrieve_parent_token``) runs the
recurrence node by node, each from its parent's state, and so writes every node's ``[HV, V, K]`` state to HBM.
This reference runs the same per-token update, along each node's root-to-node path:

    g = -exp(A_log) * softplus(a + dt_bias)      beta = sigmoid(b)
    q, k = l2norm(q), l2norm(k);  q = q * scale
    h = h * exp(g);  v' = beta * (v - h^T k);  h = h + k v'^T;  o = h^T q

with ``h`` a ``[K, V]`` state per value head (value head ``hv`` reads key head ``hv // (HV // H)``), stored as
SGLang stores it, ``[V, K]``. Nodes are numbered parent before child (node 0 is the root, the step's first
token, whose parent is the persistent state): a DDTree's pop order.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

L2NORM_EPS = 1e-6


def gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
          softplus_beta: float = 1.0, softplus_threshold: float = 20.0) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Log-decay ``g`` and write strength ``beta`` per token and value head, as SGLang's kernel computes them."""
    x = a.float() + dt_bias.float()
    softplus = torch.where(softplus_beta * x <= softplus_threshold, F.softplus(x, beta=softplus_beta), x)
    return -torch.exp(A_log.float()) * softplus, torch.sigmoid(b.float())


def unit(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def random_parents(T: int, generator: torch.Generator, reach: int = 4, max_depth: Optional[int] = None) -> list[int]:
    """A random tree in pop order, each node's parent among the ``reach`` nodes before it: wide near the root,
    deep branches below, like a DDTree's (tests and benchmarks). ``max_depth``: no node more than that many edges
    below the root (a DDTree's depth is capped by its drafter's block: 15 below the root for a block of 16); a
    node whose ``reach`` nodes are all that deep hangs off an earlier node that is not."""
    parents, depth = [-1], [0]
    for i in range(1, T):
        allowed = [j for j in range(max(0, i - reach), i) if max_depth is None or depth[j] < max_depth]
        if not allowed:
            allowed = [j for j in range(i) if depth[j] < max_depth]
        parent = allowed[int(torch.randint(0, len(allowed), (1,), generator=generator))]
        parents.append(parent)
        depth.append(depth[parent] + 1)
    return parents


def reference_gdn_tree_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    initial_states: torch.Tensor,
    parents: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs ``[bs, T, HV, V]`` and every node's state ``[bs, T, HV, V, K]`` (float32) of the trees.

    ``q, k [bs, T, H, K]``, ``v [bs, T, HV, V]``, ``a, b [bs, T, HV]``, ``initial_states [bs, HV, V, K]`` (each
    request's persistent state), ``parents [bs, T]`` with ``parents[:, i] < i`` for ``i > 0``.
    """
    bs, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    g, beta = gates(a, b, A_log, dt_bias)
    qn = unit(q.float()).repeat_interleave(HV // H, dim=2) * scale
    kn = unit(k.float()).repeat_interleave(HV // H, dim=2)
    out = torch.empty(bs, T, HV, V)
    states = torch.empty(bs, T, HV, V, K)
    for r in range(bs):
        for i in range(T):
            h = (initial_states[r] if i == 0 else states[r, int(parents[r, i])]).float().transpose(1, 2)  # [HV, K, V]
            h = h * torch.exp(g[r, i])[:, None, None]
            delta = beta[r, i][:, None] * (v[r, i].float() - torch.einsum("hkv,hk->hv", h, kn[r, i]))
            h = h + kn[r, i][:, :, None] * delta[:, None, :]
            out[r, i] = torch.einsum("hkv,hk->hv", h, qn[r, i])
            states[r, i] = h.transpose(1, 2)
    return out, states


def path_inputs(x: torch.Tensor, conv_state: torch.Tensor, parents: list[int], node: int, count: int) -> torch.Tensor:
    """The ``count`` inputs ending at ``node`` along its root-to-node path, oldest first, ``[dim, count]``: the
    path's own tokens (``x [dim, T]``), preceded by the persistent conv window (``conv_state [dim, W - 1]``, its
    last column the token before the root) where the path is shorter than ``count``."""
    path = [node]
    while path[-1] > 0 and len(path) < count:
        path.append(parents[path[-1]])
    columns = [x[:, i] for i in reversed(path)]
    history = conv_state[:, conv_state.shape[1] - (count - len(columns)):] if count > len(columns) else x[:, :0]
    return torch.cat([history, torch.stack(columns, dim=1)], dim=1)


def reference_tree_conv(x: torch.Tensor, conv_states: torch.Tensor, weight: torch.Tensor,
                        bias: Optional[torch.Tensor], parents: torch.Tensor,
                        silu: bool = True) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The causal depthwise convolution of a GDN layer over draft trees: each node convolves the ``W`` inputs
    ending at it along its root-to-node path (SGLang's ``causal_conv1d_update`` with ``retrieve_*`` tree links).
    ``x [bs, dim, T]``, ``conv_states [bs, dim, W - 1]`` (each request's window before the root), ``weight [dim,
    W]`` (its last column multiplies the node itself), ``parents [bs, T]``. Returns the outputs ``[bs, dim, T]`` and
    every node's window after it ``[bs, T, dim, W - 1]``: what committing that node leaves as the request's conv
    state (float32)."""
    bs, dim, T = x.shape
    W = weight.shape[1]
    out = torch.empty(bs, dim, T)
    windows = torch.empty(bs, T, dim, W - 1)
    for r in range(bs):
        tree = [int(p) for p in parents[r]]
        for i in range(T):
            window = path_inputs(x[r].float(), conv_states[r].float(), tree, i, W)
            acc = (window * weight.float()).sum(1) + (0 if bias is None else bias.float())
            out[r, :, i] = acc * torch.sigmoid(acc) if silu else acc
            windows[r, i] = window[:, 1:]
    return out, windows
