"""Per-width verify graphs (``--budget auto``): a step's verify runs with its width's graph runner and attention
backend, and the target runner gets its own back afterwards, also when the verify raises.

The capture itself needs CUDA graphs: the GPU suite's ``ddtree_auto`` server checks that every width replayed its
own graphs and that each replay equals an eager re-run (tests/gpu/test_gpu_ddtree.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_ddtree.speculative.ddtree_verify_graphs import VerifyGraphsPerWidth


def target_runner_with_widths(own_width: int, added_widths: list[int]):
    own_graphs = SimpleNamespace(captured_req_width=own_width)
    runner = SimpleNamespace(attn_backend="own backend", decode_cuda_graph_runner=own_graphs)
    added = {w: (f"backend {w}", SimpleNamespace(captured_req_width=w)) for w in added_widths}
    return runner, own_graphs, VerifyGraphsPerWidth(runner, added)


def test_a_verify_of_an_added_width_uses_its_runner_and_backend_then_restores_the_servers():
    runner, own_graphs, graphs = target_runner_with_widths(17, [1, 2, 9])
    with graphs.verifying(9):
        assert runner.attn_backend == "backend 9"
        assert runner.decode_cuda_graph_runner.captured_req_width == 9
    assert runner.attn_backend == "own backend" and runner.decode_cuda_graph_runner is own_graphs


def test_the_servers_own_width_keeps_the_servers_runner():
    runner, own_graphs, graphs = target_runner_with_widths(17, [1, 9])
    with graphs.verifying(17):
        assert runner.attn_backend == "own backend" and runner.decode_cuda_graph_runner is own_graphs


def test_a_failing_verify_still_restores_the_servers_runner():
    runner, own_graphs, graphs = target_runner_with_widths(17, [4])
    with pytest.raises(RuntimeError, match="verify failed"), graphs.verifying(4):
        raise RuntimeError("verify failed")
    assert runner.attn_backend == "own backend" and runner.decode_cuda_graph_runner is own_graphs


def test_widths_and_replays_are_reported_per_width_own_width_included():
    _, _, graphs = target_runner_with_widths(17, [1, 2, 9])
    assert graphs.widths == [1, 2, 9, 17]
    assert graphs.has_graph(17) and graphs.has_graph(1) and not graphs.has_graph(5)
    for width, replayed in [(1, True), (1, True), (9, False), (17, True), (5, True)]:
        graphs.record(width, replayed)
    assert graphs.report() == {"graph_widths": [1, 2, 9, 17], "graph_replays": [2, 0, 0, 1]}


@pytest.mark.parametrize("value, requested", [(None, True), ("0", False), ("1", True)])
def test_every_width_gets_graphs_unless_turned_off(monkeypatch, value, requested):
    """On dense and hybrid targets alike: the GPU suite passed them on both (tests/gpu/RESULTS.md runs 47 and 85)."""
    from sglang_ddtree.speculative.ddtree_verify_graphs import AUTO_VERIFY_GRAPHS_ENV, verify_graphs_per_width_requested

    if value is None:
        monkeypatch.delenv(AUTO_VERIFY_GRAPHS_ENV, raising=False)
    else:
        monkeypatch.setenv(AUTO_VERIFY_GRAPHS_ENV, value)
    assert verify_graphs_per_width_requested() is requested
