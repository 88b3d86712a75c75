"""GPU suite: ``--budget auto``'s per-step policy work never synchronises the host with the GPU."""

import math

import pytest
import torch

from sglang_ddtree.tree.budget_policy import DEFAULT_WIDTHS, BudgetPolicy, StepTimeTable

pytestmark = pytest.mark.gpu


def test_observe_and_width_run_without_a_host_sync():
    """CUDA's sync debug mode raises on any synchronising call (a blocking copy, ``.item()``, a boolean mask)."""
    times = StepTimeTable({(bs, w): 1.0 + 0.01 * bs * w for bs in (1, 8) for w in DEFAULT_WIDTHS}, DEFAULT_WIDTHS)
    policy = BudgetPolicy(times, DEFAULT_WIDTHS, device="cuda")
    path = torch.log(torch.rand(8, 64, device="cuda")).cumsum(dim=1)
    accepted = torch.tensor([[1, 2] + [-1] * 13] * 8, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(4):
            width = policy.width()
            policy.observe(path, width, accepted)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert policy.width() in DEFAULT_WIDTHS and not math.isnan(policy.calibration.sum().item())
