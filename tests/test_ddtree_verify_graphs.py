"""Per-width verify graphs (``--budget auto``): a step's verify runs with its width's graph runner and attention
backend, and the target runner gets its own back afterwards, also when the verify raises.

The capture itself needs CUDA graphs: the GPU suite's ``ddtree_auto`` server checks that every width replayed its
own graphs and that each replay equals an eager re-run (tests/gpu/test_gpu_ddtree.py).
"""

from __future__ import annotations

import importlib
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


def kv_budget_configurator(algorithm="DDTREE", draft=False, graph_backend="full", graph_batch_sizes=(1, 8, 16)):
    server_args = SimpleNamespace(
        speculative_algorithm=algorithm, speculative_num_draft_tokens=33,
        cuda_graph_config=SimpleNamespace(decode=SimpleNamespace(backend=graph_backend, bs=list(graph_batch_sizes))),
    )  # fmt: skip
    model_config = SimpleNamespace(vocab_size=248320, hidden_size=5120)
    return SimpleNamespace(server_args=server_args, model_config=model_config, is_draft_worker=draft)


def test_the_narrower_widths_graphs_come_out_of_the_kv_cache_budget_not_the_activations_slack(monkeypatch):
    """At Qwen3.6-27B's shape and 16 requests the widths 1-16 took 0.89 GB after the pools were sized, and the
    server's first decode after long prefills found no memory to launch a kernel (RESULTS run 88): the target's KV
    budget now gives up an upper estimate of that, the widest width (SGLang's own graphs) excluded."""
    from sglang_ddtree.speculative.ddtree_auto_budget import keep_kv_budget_for_verify_graphs, policy_widths
    from sglang_ddtree.speculative.ddtree_verify_graphs import verify_graphs_bytes
    from sglang_ddtree.tree.budget_policy import STEP_TIME_TABLE_ENV

    monkeypatch.delenv(STEP_TIME_TABLE_ENV, raising=False)
    assert policy_widths(33) == [1, 2, 4, 8, 16, 33]
    budget = 70 << 30
    kept = budget - keep_kv_budget_for_verify_graphs(lambda c, memory: budget, kv_budget_configurator(), 80 << 30)
    assert kept == verify_graphs_bytes([1, 2, 4, 8, 16], 16, 248320, 5120)
    measured = [0.119, 0.121, 0.158, 0.197, 0.299]  # GB per width 1 / 2 / 4 / 8 / 16, run 88's server log
    assert sum(measured) < kept / 1e9 < 1.5 * sum(measured)


@pytest.mark.parametrize("configurator", [
    kv_budget_configurator(draft=True), kv_budget_configurator(algorithm="DFLASH"),
    kv_budget_configurator(graph_backend="disabled"), kv_budget_configurator(graph_batch_sizes=()),
], ids=["the drafter's pools", "another algorithm", "decode graphs off", "no decode graph batch sizes"])
def test_the_kv_budget_is_untouched_where_no_verify_graphs_are_added(configurator):
    from sglang_ddtree.speculative.ddtree_auto_budget import keep_kv_budget_for_verify_graphs

    assert keep_kv_budget_for_verify_graphs(lambda c, memory: 12345, configurator, 80 << 30) == 12345


def test_the_kv_budget_hook_is_registered_with_the_auto_budget_unless_per_width_graphs_are_off(monkeypatch):
    from sglang_ddtree.speculative import ddtree_auto_budget
    from sglang_ddtree.speculative.ddtree_verify_graphs import AUTO_VERIFY_GRAPHS_ENV

    for value, expected in [("1", True), ("0", False)]:
        monkeypatch.setenv(AUTO_VERIFY_GRAPHS_ENV, value)
        registered = []
        ddtree_auto_budget.register(SimpleNamespace(register=lambda *a: registered.append(a[0])),
                                    SimpleNamespace(AFTER="after", AROUND="around"))  # fmt: skip
        assert (ddtree_auto_budget.KV_CACHE_BUDGET in registered) is expected
    module, cls, method = ddtree_auto_budget.KV_CACHE_BUDGET.rsplit(".", 2)
    assert hasattr(getattr(importlib.import_module(module), cls), method)  # in the pinned SGLang
