"""Test-only stand-in for ``sgl_kernel`` on the CPU-only CI machine.

SGLang's CPU engine imports a few bookkeeping ops from ``sgl_kernel``'s CPU build (AMX/AVX-512 C++), which is
not published on PyPI. On a CPU without AMX the model layers take their native-torch paths, so only these ops
are ever called; each is written here in plain torch (or delegated to SGLang's own Triton kernel, run by the
Triton interpreter). Anything else raises ``NotImplementedError`` naming the op, so a new dependency shows up
as a clear failure rather than as wrong numbers. Never put this directory on ``PYTHONPATH`` on a GPU machine.
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


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def _not_implemented(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel CPU-CI shim: op '{name}' is not implemented")

    return _not_implemented
