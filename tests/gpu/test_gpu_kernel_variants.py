"""GPU suite: the kernels a DDTree decode step launches outside its CUDA graphs compile once per tree width, not
again for each batch size or simulated length a served step brings.

Triton compiles a kernel again for every new value of a ``tl.constexpr`` and, by default, for every integer
argument that newly is 1 or a multiple of 16. At Qwen3.6-27B's shape an auto-budget server stalled 0.2-2.8 s on
steps whose (width, batch size) it had not met before (tests/gpu/RESULTS.md run 92: slowest steps 966 and 2,760 ms,
median 35-40 ms); with the Triton cache of a previous call carried, the same cell's slowest step was 71 ms (run 93).
Here each kernel is launched at one width for batch sizes 1, 3, 16, 13 and 2 (and lengths 1, 5 and 16) and must
have compiled one variant."""

import pytest
import torch

from sglang_ddtree.kernels.tree_accept import _tree_accept_kernel, accept_tree_greedy
from sglang_ddtree.kernels.tree_branch import _first_child_branch_kernel, first_child_branch
from sglang_ddtree.kernels.tree_mask_packed import _pack_tree_mask_kernel, pack_tree_mask
from sglang_ddtree.kernels.tree_verify_tensors import _verify_tensors_kernel, build_verify_tensors

pytestmark = pytest.mark.gpu
BUDGET, DEPTH = 11, 11  # a width no other test launches: its one variant is compiled here
BATCH_SIZES = (1, 3, 16, 13, 2)


def variants(kernel) -> int:
    """Compiled variants of ``kernel`` on the current device (Triton's per-device kernel cache)."""
    return len(kernel.device_caches[torch.cuda.current_device()][0])


def chains(bs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``bs`` chains of ``BUDGET`` drafted nodes in pop order (parent, token, depth)."""
    nodes = torch.arange(BUDGET, device="cuda")
    parent = nodes.to(torch.int32).expand(bs, BUDGET).contiguous()
    token = (nodes + 100).expand(bs, BUDGET).contiguous()
    depth = (nodes + 1).to(torch.int32).expand(bs, BUDGET).contiguous()
    return parent, token, depth


def test_the_steps_tree_kernels_compile_once_whatever_the_batch_size_and_the_simulated_length():
    before = {kernel: variants(kernel) for kernel in
              (_verify_tensors_kernel, _pack_tree_mask_kernel, _tree_accept_kernel, _first_child_branch_kernel)}
    for bs in BATCH_SIZES:
        parent, token, depth = chains(bs)
        seq_lens = torch.full((bs,), 1000 + bs, dtype=torch.int64, device="cuda")
        tensors = build_verify_tensors(parent, token, depth, torch.zeros(bs, dtype=torch.int64, device="cuda"),
                                       seq_lens, DEPTH, full_mask=False)  # fmt: skip
        graph_rows = 16  # the split verify's tree block is laid out for the captured batch
        mask = torch.empty(graph_rows * 64, dtype=torch.uint8, device="cuda")
        pack_tree_mask(tensors.ancestor_bits, torch.zeros(graph_rows, dtype=torch.int64, device="cuda"), mask,
                       torch.empty(graph_rows + 1, dtype=torch.int32, device="cuda"))  # fmt: skip
        predict = torch.zeros(bs * (BUDGET + 1), dtype=torch.int64, device="cuda")
        for length in (1, 5, 16):
            accept_tree_greedy(predict, tensors.draft_token, parent, depth, tensors.ancestor_bits, seq_lens, DEPTH + 1,
                               simulated_length=length, next_token=tensors.retrieve_next_token)  # fmt: skip
            first_child_branch(tensors.retrieve_next_token, length, DEPTH + 1)
    torch.cuda.synchronize()
    compiled = {kernel.fn.__name__: variants(kernel) - count for kernel, count in before.items()}
    assert compiled == {"_verify_tensors_kernel": 1, "_pack_tree_mask_kernel": 1, "_tree_accept_kernel": 1,
                        "_first_child_branch_kernel": 1}  # fmt: skip
