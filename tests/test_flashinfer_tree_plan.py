"""DDTREE's verify-graph replays plan FlashInfer from host lengths, with the mask packed on the device, and so do
its draft-block replays (no mask).

FlashInfer itself does not run on the CPU, so the wrapper is a stand-in carrying the attributes the hook
checks, and SGLang's ``fast_prefill_plan`` is replaced by a recorder: these tests pin what the hook hands
FlashInfer (host metadata, device index arrays, the packed mask in the graph's buffers) and when it leaves
SGLang's own plan in place. The GPU suite runs the real thing (greedy identity with graphs on flashinfer).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_tree_kernels import DEVICE, reference_tree
from test_tree_mask_packed import segment_packbits_reference

from sglang_ddtree.speculative import flashinfer_tree_plan
from sglang_ddtree.speculative.ddtree_cuda_graph import tree_verify_dummy
from sglang_ddtree.kernels.tree_verify_tensors import build_verify_tensors

pytestmark = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a GPU")
BUDGET, SEQ_LENS, GRAPH_BS, FILL = 6, [4, 9], 4, 1
N = BUDGET + 1


def call_begin_forward(self, wrapper_ragged, wrapper_paged, req_pool_indices, paged_kernel_lens, paged_kernel_lens_sum,
                       seq_lens, prefix_lens, kv_start_idx, kv_indptr, qo_indptr, use_ragged, spec_info,
                       use_sliding_window_kv_pool=False, fixed_split_size=None, multi_item_params=None,
                       cross_attention_custom_mask=None, seq_lens_cpu=None, custom_kv_indices=None,
                       window_left=-1):  # fmt: skip
    """SGLang 0.5.17's signature; records that SGLang's own plan ran."""
    self.upstream_calls += 1


def replay(monkeypatch, spec_info, *, planned: bool = True):
    """One replay's plan of a 4-request graph holding the 2 requests of SEQ_LENS."""
    import sglang.srt.layers.attention.flashinfer_backend as backend

    plans = []
    monkeypatch.setattr(backend, "fast_prefill_plan", lambda wrapper, *args, **kwargs: plans.append((args, kwargs)))
    req_to_token = torch.arange(4 * 64, dtype=torch.int32, device=DEVICE).view(4, 64)
    updater = SimpleNamespace(
        upstream_calls=0, req_to_token=req_to_token, num_qo_heads=4, num_kv_heads=2, head_dim=16,
        q_data_type=torch.bfloat16, data_type=torch.bfloat16,
        kv_last_page_len=torch.ones(8, dtype=torch.int32, device=DEVICE),
        attn_backend=SimpleNamespace(page_size=1, get_cuda_graph_seq_len_fill_value=lambda: FILL),
    )  # fmt: skip
    wrapper = SimpleNamespace(
        is_cuda_graph_enabled=True, _backend="fa2", _cached_module=object() if planned else None,
        _custom_mask_buf=torch.zeros(4096, dtype=torch.uint8, device=DEVICE),
        _mask_indptr_buf=torch.zeros(GRAPH_BS + 1, dtype=torch.int32, device=DEVICE),
    )  # fmt: skip
    seq_lens = torch.tensor(SEQ_LENS + [FILL] * (GRAPH_BS - len(SEQ_LENS)), dtype=torch.int32, device=DEVICE)
    flashinfer_tree_plan.plan_tree_verify_without_host_sync(
        call_begin_forward, updater, None, wrapper, torch.arange(GRAPH_BS, device=DEVICE), seq_lens,
        int(seq_lens.sum()), seq_lens, None, None, None, None, False, spec_info, seq_lens_cpu=None,
    )  # fmt: skip
    return updater, wrapper, plans


def tree_spec_info(host_lens: list[int]):
    _, _, (parent, token, depth, _) = reference_tree(len(SEQ_LENS), 4, 1000, BUDGET, "peaked", seed=11)
    seq = torch.tensor(SEQ_LENS, device=DEVICE)
    verify = build_verify_tensors(parent.to(DEVICE), token.to(DEVICE), depth.to(DEVICE),
                                  torch.zeros(len(SEQ_LENS), dtype=torch.int64, device=DEVICE), seq, 4)  # fmt: skip
    spec_info = tree_verify_dummy(verify.custom_mask, N, 4)
    spec_info.ancestor_bits = verify.ancestor_bits
    spec_info.kv_lens_cpu = torch.tensor(host_lens) + N
    return spec_info, verify


def test_a_replay_is_planned_from_the_host_lengths_and_gets_the_packed_mask(monkeypatch):
    spec_info, verify = tree_spec_info(host_lens=SEQ_LENS)
    before = dict(flashinfer_tree_plan._counts)
    updater, wrapper, plans = replay(monkeypatch, spec_info)

    assert updater.upstream_calls == 0 and len(plans) == 1
    args, kwargs = plans[0]
    qo_indptr, kv_indptr = args[0], args[1]
    kv_lens = [SEQ_LENS[0] + N, SEQ_LENS[1] + N, FILL + N, FILL + N]  # the trees', then the graph's padding
    assert kwargs["qo_indptr_host"].tolist() == [0, N, 2 * N, 3 * N, 4 * N] == qo_indptr.tolist()
    assert kwargs["kv_lens_host"].tolist() == kv_lens and kwargs["max_kv_len"] == max(SEQ_LENS) + N and kwargs["max_q_len"] == N
    assert kwargs["kv_indptr_host"].tolist() == np.cumsum([0, *kv_lens]).tolist()
    assert kwargs["qo_indptr_host"].device.type == "cpu" and kwargs["kv_indptr_host"].device.type == "cpu"
    assert kv_indptr.tolist() == np.cumsum([0, *kv_lens]).tolist()  # the device copy FlashInfer's kernels read

    expected, expected_indptr = segment_packbits_reference(verify.custom_mask.cpu(), SEQ_LENS, N)
    assert wrapper._mask_indptr_buf[: len(SEQ_LENS) + 1].tolist() == expected_indptr
    assert bytes(wrapper._custom_mask_buf[: len(expected)].cpu().tolist()) == expected
    assert flashinfer_tree_plan._counts["sync_free_plans"] == before["sync_free_plans"] + 1


@pytest.mark.parametrize(
    "case",
    ["capture (no plan yet)", "no host bounds", "turned off", "mask buffer too small", "not a DDTREE verify"],
)
def test_everything_else_keeps_sglangs_plan(monkeypatch, case):
    spec_info, _ = tree_spec_info(host_lens=SEQ_LENS)
    if case == "no host bounds":
        spec_info.kv_lens_cpu = None
    if case == "turned off":
        monkeypatch.setenv(flashinfer_tree_plan.SYNC_FREE_PLAN_ENV, "0")
    if case == "mask buffer too small":
        spec_info.kv_lens_cpu = torch.tensor([5000, 5000])
    if case == "not a DDTREE verify":
        spec_info = SimpleNamespace(kv_lens_cpu=torch.tensor(SEQ_LENS))
    updater, _, plans = replay(monkeypatch, spec_info, planned=case != "capture (no plan yet)")
    assert updater.upstream_calls == 1 and plans == []


BLOCK = 4


def draft_block_spec_info(host_lens):
    from sglang_ddtree.speculative.ddtree_info import DDTreeDraftBlockInput

    spec_info = DDTreeDraftBlockInput(draft_token=torch.empty(0, dtype=torch.long), positions=torch.empty(0),
                                      draft_token_num=BLOCK)  # fmt: skip
    spec_info.kv_lens_cpu = None if host_lens is None else torch.tensor(host_lens) + BLOCK
    return spec_info


def test_a_draft_block_replay_is_planned_from_the_host_lengths_without_a_mask(monkeypatch):
    """The drafter's block attends to every key of its request (prefix and block): the plan gets the host lengths,
    ``BLOCK`` queries per request, no mask, and the graph's mask buffers are left alone."""
    before = dict(flashinfer_tree_plan._counts)
    updater, wrapper, plans = replay(monkeypatch, draft_block_spec_info(SEQ_LENS))

    assert updater.upstream_calls == 0 and len(plans) == 1
    args, kwargs = plans[0]
    kv_lens = [SEQ_LENS[0] + BLOCK, SEQ_LENS[1] + BLOCK, FILL + BLOCK, FILL + BLOCK]
    assert kwargs["qo_indptr_host"].tolist() == list(range(0, 5 * BLOCK, BLOCK)) == args[0].tolist()
    assert kwargs["kv_lens_host"].tolist() == kv_lens and kwargs["max_q_len"] == BLOCK
    assert args[1].tolist() == np.cumsum([0, *kv_lens]).tolist() == kwargs["kv_indptr_host"].tolist()
    assert "custom_mask" not in kwargs and not kwargs.get("causal", False)
    assert int(wrapper._custom_mask_buf.sum()) == 0 and int(wrapper._mask_indptr_buf.sum()) == 0
    assert flashinfer_tree_plan._counts["sync_free_draft_plans"] == before["sync_free_draft_plans"] + 1


@pytest.mark.parametrize("case", ["capture (no plan yet)", "no host lengths", "turned off"])
def test_a_draft_block_otherwise_keeps_sglangs_plan(monkeypatch, case):
    if case == "turned off":
        monkeypatch.setenv(flashinfer_tree_plan.SYNC_FREE_PLAN_ENV, "0")
    spec_info = draft_block_spec_info(None if case == "no host lengths" else SEQ_LENS)
    before = dict(flashinfer_tree_plan._counts)
    updater, _, plans = replay(monkeypatch, spec_info, planned=case != "capture (no plan yet)")
    assert updater.upstream_calls == 1 and plans == []
    assert flashinfer_tree_plan._counts["upstream_draft_plans"] == before["upstream_draft_plans"] + 1


def test_flashinfer_graph_replays_are_planned_from_host_lengths_on_dense_and_split_hybrid_targets(monkeypatch):
    """A dense FlashInfer target with graphs; a hybrid target whose attention layers verify in the split form
    (its FlashInfer backend behind SGLang's hybrid one), whose paged part takes the same plan; not a hybrid target
    verifying with the FULL mask, nor anything else."""
    from test_flashinfer_split_verify import flashinfer_backend, hybrid_backend

    from sglang_ddtree.speculative.flashinfer_split_verify import SPLIT_VERIFY_ENV

    dense, hybrid = flashinfer_backend(), hybrid_backend(flashinfer_backend())
    assert flashinfer_tree_plan.planned_from_host_lengths(dense, cuda_graphs=True)
    assert flashinfer_tree_plan.planned_from_host_lengths(hybrid, cuda_graphs=True)
    assert not flashinfer_tree_plan.planned_from_host_lengths(dense, cuda_graphs=False)
    assert not flashinfer_tree_plan.planned_from_host_lengths(hybrid, cuda_graphs=False)
    assert not flashinfer_tree_plan.planned_from_host_lengths(hybrid_backend(flashinfer_backend(page_size=16)), True)
    assert not flashinfer_tree_plan.planned_from_host_lengths(None, cuda_graphs=True)
    monkeypatch.setenv(SPLIT_VERIFY_ENV, "0")  # the hybrid target verifies with the FULL mask: SGLang's plan
    assert not flashinfer_tree_plan.planned_from_host_lengths(hybrid, cuda_graphs=True)
    assert flashinfer_tree_plan.planned_from_host_lengths(dense, cuda_graphs=True)
    monkeypatch.setenv(flashinfer_tree_plan.SYNC_FREE_PLAN_ENV, "0")
    assert not flashinfer_tree_plan.planned_from_host_lengths(dense, cuda_graphs=True)


def test_the_worker_decides_once_the_targets_attention_backend_exists(monkeypatch):
    """SGLang constructs the draft worker before any attention backend (``Scheduler.init_model_worker``), so a
    decision taken in the worker's constructor saw none and switched the plan off on every server (tests/gpu/
    RESULTS.md run 41: 0 of 1,292 verify plans took it); the worker decides when its own backends are built,
    right after the target's."""
    import inspect

    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    from sglang_ddtree.speculative.ddtree_worker import DDTreeWorker

    order = inspect.getsource(Scheduler.init_model_worker)
    assert order.index("self.maybe_init_draft_worker()") < order.index("self.init_all_attention_backends()")
    backends = inspect.getsource(Scheduler.init_all_attention_backends)
    assert backends.index("self.tp_worker.init_attention_backends()") < backends.index(
        "self.draft_worker.init_attention_backends()")

    monkeypatch.setattr(DFlashWorkerV2, "init_attention_backends", lambda self: None)
    worker = object.__new__(DDTreeWorker)
    worker._cuda_graphs = True
    worker._target_worker = SimpleNamespace(model_runner=SimpleNamespace(attn_backend=object.__new__(FlashInferAttnBackend)))
    worker.draft_model_runner = SimpleNamespace(attn_backend=object.__new__(FlashInferAttnBackend))
    worker.init_attention_backends()
    assert worker._plans_from_host_lengths and worker._draft_plans_from_host_lengths


def test_the_worker_read_is_compared_with_the_schedulers_host_mirror_of_the_lengths():
    """Whether the one blocking read per step is redundant (SGLang's FutureMap may already hold the same lengths on
    the host): counted, equal or not, and nothing counted where the scheduler keeps no mirror."""
    before = dict(flashinfer_tree_plan._counts)
    read = torch.tensor([7, 12], dtype=torch.int32)
    flashinfer_tree_plan.compare_with_scheduler_mirror(read, torch.tensor([7, 12], dtype=torch.int64))
    flashinfer_tree_plan.compare_with_scheduler_mirror(read, torch.tensor([7, 13]))  # a bound, not the length
    flashinfer_tree_plan.compare_with_scheduler_mirror(read, torch.tensor([7]))  # another batch's mirror
    flashinfer_tree_plan.compare_with_scheduler_mirror(read, None)
    grew = {k: flashinfer_tree_plan._counts[k] - before[k] for k in before}
    assert grew["read_lengths_equal_scheduler_mirror"] == 1 and grew["read_lengths_differ_from_scheduler_mirror"] == 2


def test_on_request_the_lengths_come_from_the_schedulers_mirror_instead_of_a_device_read(monkeypatch):
    """``SGLANG_DDTREE_LENGTHS_FROM_SCHEDULER=1`` (opt-in until a GPU run serves with it): the mirror, as int32, where
    it covers the batch; otherwise (or switched off) None, and the worker reads the device."""
    mirror = torch.tensor([7, 12], dtype=torch.int64)
    assert flashinfer_tree_plan.scheduler_mirror_lengths(mirror, 2) is None
    monkeypatch.setenv(flashinfer_tree_plan.LENGTHS_FROM_SCHEDULER_ENV, "1")
    before = flashinfer_tree_plan._counts["lengths_taken_from_scheduler_mirror"]
    taken = flashinfer_tree_plan.scheduler_mirror_lengths(mirror, 2)
    assert taken.dtype == torch.int32 and taken.tolist() == [7, 12]
    assert flashinfer_tree_plan.scheduler_mirror_lengths(mirror, 3) is None  # another batch's mirror
    assert flashinfer_tree_plan.scheduler_mirror_lengths(None, 2) is None
    assert flashinfer_tree_plan._counts["lengths_taken_from_scheduler_mirror"] == before + 1
