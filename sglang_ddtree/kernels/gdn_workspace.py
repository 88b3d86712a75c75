"""The size of one request's workspace in the snapshot-free GDN tree verify (``gdn_tree``), in plain Python: the
kernels lay it out, the server's buffer (``gdn_workspace_pool``) and the launcher's memory check size it."""

from __future__ import annotations


def parents_offset(T: int, HV: int, K: int, V: int) -> int:
    """Where a workspace's parents start (per node u, G and the unit key per value head come before them): the
    tree conv's commit reads them there (``gdn_tree_conv``)."""
    return T * HV * (V + 1 + K)


def workspace_numel(T: int, HV: int, K: int, V: int) -> int:
    """float32 elements of one request's workspace: per node u, G, the unit key (per value head) and the parent.
    The root state stays in the pool, where the commit reads it."""
    return parents_offset(T, HV, K, V) + T


def workspace_slots(nodes: int, HV: int, K: int, V: int) -> int:
    """State-sized (``HV x V x K``) slots that hold one request's workspace for trees of ``nodes`` nodes."""
    return -(-workspace_numel(nodes, HV, K, V) // (HV * V * K))
