"""The size of one request's workspace in the snapshot-free GDN tree verify (``gdn_tree``, ``gdn_tree_conv``), in
plain Python: the kernels lay it out, the server's buffer (``gdn_workspace_pool``) and the launcher's memory check
size it.

A request's workspace in one GDN layer is one float32 row: first what the recurrence's commit needs
(:func:`workspace_numel`), then, from :func:`conv_inputs_offset`, each node's conv input in the conv dtype."""

from __future__ import annotations

_ALIGN = 16  # floats: the conv inputs start on a 64-byte boundary of the row


def parents_offset(T: int, HV: int, K: int, V: int) -> int:
    """Where a workspace's parents start (per node u, G and the unit key per value head come before them): the
    tree conv's commit reads them there (``gdn_tree_conv``)."""
    return T * HV * (V + 1 + K)


def workspace_numel(T: int, HV: int, K: int, V: int) -> int:
    """float32 elements of the recurrence's part of one request's workspace: per node u, G, the unit key (per value
    head) and the parent. The root state stays in the pool, where the commit reads it."""
    return parents_offset(T, HV, K, V) + T


def conv_inputs_offset(T: int, HV: int, K: int, V: int) -> int:
    """Where, in float32 elements of the row, the nodes' conv inputs start."""
    return -(-workspace_numel(T, HV, K, V) // _ALIGN) * _ALIGN


def workspace_slots(nodes: int, HV: int, K: int, V: int, conv_input_bytes: int = 0) -> int:
    """State-sized (``HV x V x K`` float32) slots that hold one request's workspace for trees of ``nodes`` nodes,
    with ``conv_input_bytes`` per node of conv inputs after the recurrence's part (0: without them)."""
    floats = workspace_numel(nodes, HV, K, V)
    if conv_input_bytes:
        floats = conv_inputs_offset(nodes, HV, K, V) + -(-nodes * conv_input_bytes // 4)
    return -(-floats // (HV * V * K))
