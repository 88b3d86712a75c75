"""Faults injected into DDTREE's verify for tests that check the lossless tests can see them
(``DDTREE_TEST_FAULT=NAME`` in a CPU-engine process; ``sitecustomize`` applies the patch after the module loads).

Each is a bug a tree verify could plausibly have, small enough to leave outputs plausible:

* ``deep_node_positions``: nodes at depth 2 and deeper get a position one too far (RoPE of the wrong position).
* ``root_hidden_from_deep_nodes``: the FULL tree mask hides the root (the bonus token) from nodes at depth >= 2.
* ``depth2_kv_from_parent``: the accepted path's KV move writes its depth-1 node's KV into the depth-2 slot.

And in the snapshot-free GDN verify of hybrid targets (``kernels/gdn_tree.py``, through its module's names, which
``speculative/hybrid_tree_verify.py`` imports at each call):

* ``gdn_deep_nodes_skip_their_parent``: the recurrence of a node at depth >= 2 starts from its grandparent's state,
  as an ancestor solve that dropped the nearest ancestor would (the commit follows the same wrong links).
* ``gdn_commit_one_node_short``: the SSM state committed for an accepted node at depth >= 2 is its parent's (the
  conv windows stay right).
* ``gdn_conv_commit_one_node_short``: the conv window committed for an accepted node at depth >= 2 is its parent's
  (``kernels/gdn_tree_conv.py``; the SSM states stay right).
"""

from __future__ import annotations

FAULT_ENV = "DDTREE_TEST_FAULT"
TREE_FAULTS = ("deep_node_positions", "root_hidden_from_deep_nodes")
KV_MOVE_FAULTS = ("depth2_kv_from_parent",)
GDN_FAULTS = ("gdn_deep_nodes_skip_their_parent", "gdn_commit_one_node_short")
GDN_CONV_FAULTS = ("gdn_conv_commit_one_node_short",)


def _depths(positions, seq_lens, nodes: int):
    """Each node's depth ``[bs, N]``, read back from ``positions = seq_len + depth``."""
    return positions.view(-1, nodes) - seq_lens.view(-1, 1).to(positions.dtype)


def patch_tree_ops(module, fault: str) -> None:
    """Wrap ``build_verify_tensors`` (called by ``ddtree_from_expansion`` through the module's globals)."""
    build = module.build_verify_tensors

    def build_with_fault(parent, token, depth, root_tokens, seq_lens, max_depth, **kwargs):
        out = build(parent, token, depth, root_tokens, seq_lens, max_depth, **kwargs)
        nodes = parent.shape[1] + 1
        depths = _depths(out.positions, seq_lens, nodes)
        if fault == "deep_node_positions":
            out.positions.view(-1, nodes)[depths >= 2] += 1
        elif out.custom_mask is not None:  # root_hidden_from_deep_nodes: rows of [N, seq_len + N] per request
            offset = 0
            for b, seq_len in enumerate(seq_lens.tolist()):
                row = seq_len + nodes
                for node in (depths[b] >= 2).nonzero().flatten().tolist():
                    out.custom_mask[offset + node * row + seq_len] = False
                offset += nodes * row
        return out

    module.build_verify_tensors = build_with_fault


def patch_greedy_verify(module, fault: str) -> None:
    """Wrap the KV move that ``run_greedy_tree_verify`` calls by its imported name."""
    move = module.move_accept_tokens_to_target_kvcache

    def move_with_fault(batch, accept_index, *args, **kwargs):
        import torch

        wrong = accept_index.clone()
        if wrong.shape[1] > 2:
            wrong[:, 2] = torch.where(wrong[:, 2] >= 0, wrong[:, 1], wrong[:, 2])
        return move(batch, wrong, *args, **kwargs)

    module.move_accept_tokens_to_target_kvcache = move_with_fault


def _tree_depths(parents):
    """Each node's depth ``[bs, T]`` from its parent links (``-1`` at the root; parents come before children)."""
    depths = parents.new_zeros(parents.shape)
    for node in range(1, parents.shape[1]):
        linked = parents[:, node] >= 0
        depths[linked, node] = depths[linked].gather(1, parents[linked, node : node + 1].long()).flatten() + 1
    return depths


def patch_gdn_tree(module, fault: str) -> None:
    """Wrap ``gdn_tree_verify`` or ``gdn_tree_commit``; the commit reads the parents the verify wrote into each
    request's workspace row."""
    import torch

    from sglang_ddtree.kernels.gdn_workspace import parents_offset

    verify, commit = module.gdn_tree_verify, module.gdn_tree_commit

    def verify_with_fault(q, k, v, a, b, A_log, dt_bias, ssm_states, cache_indices, parents, *args, **kwargs):
        deep = _tree_depths(parents) >= 2
        parents = torch.where(deep, parents.gather(1, parents.clamp(min=0).long()), parents)
        return verify(q, k, v, a, b, A_log, dt_bias, ssm_states, cache_indices, parents, *args, **kwargs)

    def commit_with_fault(dst, workspace, dst_indices, nodes, T, **kwargs):
        HV, V, K = dst.shape[2:]
        start = parents_offset(T, HV, K, V)
        parents = workspace[0, :, start : start + T]
        return commit(dst, workspace, dst_indices, _one_node_short(nodes, parents), T, **kwargs)

    if fault == "gdn_deep_nodes_skip_their_parent":
        module.gdn_tree_verify = verify_with_fault
    else:
        module.gdn_tree_commit = commit_with_fault


def _one_node_short(nodes, parents):
    """``nodes`` (one per request; ``-1``: none) with each one at depth >= 2 replaced by its parent."""
    import torch

    parents = parents[: nodes.shape[0], : max(1, int(nodes.max()) + 1)].long()  # the verified nodes' links only
    at = nodes.clamp(min=0).long().view(-1, 1)
    deep = (nodes >= 0) & (_tree_depths(parents).gather(1, at).flatten() >= 2)
    return torch.where(deep, parents.gather(1, at).flatten().to(nodes.dtype), nodes)


def patch_gdn_tree_conv(module) -> None:
    """Wrap ``gdn_tree_conv_commit``, whose ``parents [layers, requests, >= T]`` are those the verify used."""
    commit = module.gdn_tree_conv_commit

    def commit_with_fault(conv_states, inputs, parents, dst_indices, nodes, **kwargs):
        return commit(conv_states, inputs, parents, dst_indices, _one_node_short(nodes, parents[0]), **kwargs)

    module.gdn_tree_conv_commit = commit_with_fault


def patches(fault: str) -> dict:
    """Module name -> patch for the fault, or a ValueError naming the known faults."""
    if fault in TREE_FAULTS:
        return {"sglang_ddtree.tree.tree_ops": lambda module: patch_tree_ops(module, fault)}
    if fault in KV_MOVE_FAULTS:
        return {"sglang_ddtree.speculative.ddtree_greedy_verify": lambda module: patch_greedy_verify(module, fault)}
    if fault in GDN_FAULTS:
        return {"sglang_ddtree.kernels.gdn_tree": lambda module: patch_gdn_tree(module, fault)}
    if fault in GDN_CONV_FAULTS:
        return {"sglang_ddtree.kernels.gdn_tree_conv": patch_gdn_tree_conv}
    known = TREE_FAULTS + KV_MOVE_FAULTS + GDN_FAULTS + GDN_CONV_FAULTS
    raise ValueError(f"{FAULT_ENV}={fault!r}: not one of {known}")
