"""DDTREE's tree verify on FlashInfer in the split form: the prefix with no mask, the tree block with its N x N
ancestor mask, merged by log-sum-exp, is the FULL-mask verify's attention.

FlashInfer does not run on the CPU, so its wrappers are stand-ins: the ragged one is a recorder installed as
``flashinfer.BatchPrefillWithRaggedKVCacheWrapper``, SGLang's ``fast_prefill_plan`` a recorder, and for the layer's
forward both compute attention in torch from what the hook hands them. These tests pin the plan (which keys, which
queries, which mask bits) and that the forward's pieces merge into the FULL-mask attention; the GPU suite runs the
real kernels (greedy identity on flashinfer with graphs on and off, graph replay equal to eager).
"""

from __future__ import annotations

import importlib.machinery
import math
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_flashinfer_tree_plan import FILL, GRAPH_BS, N, SEQ_LENS, call_begin_forward, tree_spec_info
from test_tree_kernels import DEVICE
from test_tree_mask_packed import segment_packbits_reference

from sglang_ddtree.speculative import flashinfer_split_verify, flashinfer_tree_plan
from sglang_ddtree.speculative.ddtree_cuda_graph import tree_verify_dummy

pytestmark = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a GPU")


class RaggedRecorder:
    """FlashInfer's ragged prefill wrapper as far as the split verify uses it."""

    def __init__(self, workspace, layout, use_cuda_graph=False, backend="auto", **buffers):
        self.use_cuda_graph, self.buffers, self.plans = use_cuda_graph, buffers, []

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim, **kwargs):
        """Records the call and, as FlashInfer 0.6.15 does with a packed mask, stores the offsets in bits."""
        self.plans.append(dict(qo_indptr=qo_indptr, kv_indptr=kv_indptr, heads=(num_qo_heads, num_kv_heads), **kwargs))
        bits = torch.cumsum(torch.diff(qo_indptr) * torch.diff(kv_indptr), 0)
        self.buffers["mask_indptr_buf"][1:].copy_(bits)


@pytest.fixture
def fake_flashinfer(monkeypatch):
    import sglang.srt.layers.attention.flashinfer_backend  # noqa: F401  (imported before the stand-in goes in)

    module = types.ModuleType("flashinfer")
    module.__spec__ = importlib.machinery.ModuleSpec("flashinfer", None)
    module.BatchPrefillWithRaggedKVCacheWrapper = RaggedRecorder
    monkeypatch.setitem(sys.modules, "flashinfer", module)


def split_spec_info(host_lens):
    spec_info, verify = tree_spec_info(host_lens=SEQ_LENS)
    spec_info.custom_mask, spec_info.split_attention = None, True
    spec_info.kv_lens_cpu = None if host_lens is None else torch.tensor(host_lens) + N
    return spec_info, verify


def plan(monkeypatch, spec_info, *, graph=True, planned=True, updater=None, paged=None):
    """One plan of a 4-request batch holding the 2 requests of SEQ_LENS; returns the updater, the paged wrapper
    and what SGLang's fast plan and the wrapper's own plan were given."""
    import sglang.srt.layers.attention.flashinfer_backend as backend

    fast_plans, own_plans = [], []
    monkeypatch.setattr(backend, "fast_prefill_plan", lambda wrapper, *a, **kw: fast_plans.append((a, kw)))
    updater = updater or SimpleNamespace(
        upstream_calls=0, req_to_token=torch.arange(4 * 64, dtype=torch.int32, device=DEVICE).view(4, 64),
        num_qo_heads=4, num_kv_heads=2, head_dim=16, q_data_type=torch.bfloat16, data_type=torch.bfloat16,
        kv_last_page_len=torch.ones(8, dtype=torch.int32, device=DEVICE),
        attn_backend=SimpleNamespace(page_size=1, get_cuda_graph_seq_len_fill_value=lambda: FILL,
                                     workspace_buffer=torch.empty(8, dtype=torch.uint8, device=DEVICE)),
    )  # fmt: skip
    paged = paged or SimpleNamespace(
        is_cuda_graph_enabled=graph, _backend="fa2", _cached_module=object() if planned else None,
        begin_forward=lambda *a, **kw: own_plans.append((a, kw)),
    )  # fmt: skip
    seq_lens = torch.tensor(SEQ_LENS + [FILL] * (GRAPH_BS - len(SEQ_LENS)), dtype=torch.int32, device=DEVICE)
    kv_indptr, qo_indptr = (torch.zeros(GRAPH_BS + 1, dtype=torch.int32, device=DEVICE) for _ in range(2))
    flashinfer_tree_plan.plan_tree_verify_without_host_sync(
        call_begin_forward, updater, None, paged, torch.arange(GRAPH_BS, device=DEVICE), seq_lens, int(seq_lens.sum()),
        seq_lens, None, None, kv_indptr, qo_indptr, False, spec_info, seq_lens_cpu=None,
    )  # fmt: skip
    return updater, paged, fast_plans, own_plans


def test_the_paged_part_is_planned_over_each_prefix_with_n_queries_and_no_mask(monkeypatch, fake_flashinfer):
    spec_info, _ = split_spec_info(host_lens=SEQ_LENS)
    updater, _, fast_plans, own_plans = plan(monkeypatch, spec_info)

    assert updater.upstream_calls == 0 and own_plans == [] and len(fast_plans) == 1
    args, kwargs = fast_plans[0]
    qo_indptr, kv_indptr, kv_indices = args[0], args[1], args[2]
    prefix_lens = [*SEQ_LENS, FILL, FILL]  # the trees' prefixes, then the graph's padding rows: no tree keys
    assert kwargs["kv_lens_host"].tolist() == prefix_lens and kwargs["max_kv_len"] == max(SEQ_LENS)
    assert kv_indptr.tolist() == np.cumsum([0, *prefix_lens]).tolist() == kwargs["kv_indptr_host"].tolist()
    assert qo_indptr.tolist() == [0, N, 2 * N, 3 * N, 4 * N] == kwargs["qo_indptr_host"].tolist()
    assert kwargs["causal"] is False and "custom_mask" not in kwargs and kwargs["max_q_len"] == N
    rows = [updater.req_to_token[b, :length].tolist() for b, length in enumerate(prefix_lens)]
    assert kv_indices[: sum(prefix_lens)].tolist() == sum(rows, [])


def test_the_tree_block_gets_the_n_by_n_ancestor_masks_and_is_planned_once_per_graph(monkeypatch, fake_flashinfer):
    spec_info, verify = split_spec_info(host_lens=SEQ_LENS)
    updater, paged, _, _ = plan(monkeypatch, spec_info)
    plan(monkeypatch, spec_info, updater=updater, paged=paged)  # the same graph's next replay: a new paged plan
    block = updater.attn_backend.__dict__[flashinfer_split_verify._TREE_BLOCKS][id(paged)]
    assert len(block.wrapper.plans) == 1  # the next graph (another id) would get its own

    # The FULL mask's tree columns alone, i.e. the FULL layout at seq_len 0: then every padding request sees all.
    full = verify.custom_mask.cpu()
    tree_only, offset = [], 0
    for seq_len in SEQ_LENS:
        rows = full[offset : offset + N * (seq_len + N)].view(N, seq_len + N)
        tree_only.append(rows[:, seq_len:].flatten())
        offset += N * (seq_len + N)
    expected, expected_indptr = segment_packbits_reference(torch.cat(tree_only), [0, 0], N)
    segment = flashinfer_split_verify.tree_block_mask_bytes(N)
    assert bytes(block.mask[: len(expected)].cpu().tolist()) == expected
    all_visible = np.packbits(np.ones(N * N, dtype=np.uint8), bitorder="little").tobytes()
    assert bytes(block.mask[len(expected) : GRAPH_BS * segment].cpu().tolist()) == all_visible * (GRAPH_BS - 2)
    assert block.mask_indptr.tolist() == [i * segment for i in range(GRAPH_BS + 1)]
    assert expected_indptr[-1] == 2 * segment

    ragged_plan = block.wrapper.plans[0]
    assert block.wrapper.use_cuda_graph and ragged_plan["causal"] is False
    assert ragged_plan["qo_indptr"].tolist() == ragged_plan["kv_indptr"].tolist() == [0, N, 2 * N, 3 * N, 4 * N]
    assert ragged_plan["qo_indptr"].device.type == "cpu" and ragged_plan["packed_custom_mask"] is block.mask


def test_without_host_lengths_or_before_capture_the_wrapper_plans_itself(monkeypatch, fake_flashinfer):
    for host_lens, planned in ((None, True), (SEQ_LENS, False)):
        updater, _, fast_plans, own_plans = plan(monkeypatch, split_spec_info(host_lens)[0], planned=planned)
        assert fast_plans == [] and len(own_plans) == 1 and updater.upstream_calls == 0
        args, kwargs = own_plans[0]
        assert args[1].tolist() == np.cumsum([0, *SEQ_LENS, FILL, FILL]).tolist()
        assert kwargs["causal"] is False and "custom_mask" not in kwargs


def test_an_eager_verify_keeps_its_tree_block_while_the_batch_shape_holds(monkeypatch, fake_flashinfer):
    """Eager verifies too run the block on buffers of its own (a graph-kind wrapper): FlashInfer's own eager buffers
    would hold the mask offsets in bits, and requests after the first would read the wrong bits."""
    spec_info, _ = split_spec_info(host_lens=None)
    updater, paged, _, _ = plan(monkeypatch, spec_info, graph=False)
    blocks = updater.attn_backend.__dict__[flashinfer_split_verify._TREE_BLOCKS]
    block = blocks[id(paged)]
    plan(monkeypatch, spec_info, graph=False, updater=updater, paged=paged)
    assert blocks[id(paged)] is block and block.wrapper.use_cuda_graph and len(block.wrapper.plans) == 1
    assert block.wrapper.buffers["mask_indptr_buf"] is block.mask_indptr
    segment = flashinfer_split_verify.tree_block_mask_bytes(N)
    assert block.mask_indptr.tolist() == [i * segment for i in range(GRAPH_BS + 1)]  # bytes, as the kernel reads

    spec_info.draft_token_num = N - 2  # another width (``--budget auto``): a block of its own shape
    spec_info.ancestor_bits = spec_info.ancestor_bits[:, : N - 2].contiguous()
    plan(monkeypatch, spec_info, graph=False, updater=updater, paged=paged)
    assert blocks[id(paged)] is not block and blocks[id(paged)].nodes == N - 2


def test_a_capture_dummy_leaves_the_mask_all_visible_with_byte_offsets(monkeypatch, fake_flashinfer):
    spec_info, _ = split_spec_info(host_lens=SEQ_LENS)
    spec_info.ancestor_bits = None
    updater, paged, _, _ = plan(monkeypatch, spec_info, planned=False)
    block = updater.attn_backend.__dict__[flashinfer_split_verify._TREE_BLOCKS][id(paged)]
    segment = flashinfer_split_verify.tree_block_mask_bytes(N)
    assert block.mask_indptr.tolist() == [i * segment for i in range(GRAPH_BS + 1)]
    assert set(block.mask.tolist()) == {255}


def test_a_verify_without_split_keeps_the_full_mask_plans(monkeypatch, fake_flashinfer):
    spec_info, _ = tree_spec_info(host_lens=SEQ_LENS)  # split_attention False: flashinfer_tree_plan's own test
    updater, _, _, _ = plan(monkeypatch, spec_info)
    assert flashinfer_split_verify._TREE_BLOCKS not in updater.attn_backend.__dict__


# --- the layer's forward -----------------------------------------------------------------------------------------


def attention(q, k, v, visible, scale):
    """Reference attention of ``q [Q, H, D]`` over ``k, v [K, Hk, D]`` (GQA) with a ``[Q, K]`` bool mask; returns the
    output and the natural-log LSE ``[Q, H]``."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    scores = scores.masked_fill(~visible[None], -math.inf)
    lse = torch.logsumexp(scores, -1)
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v), lse.transpose(0, 1)


def merge(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    return out_a * torch.exp(lse_a - lse)[..., None] + out_b * torch.exp(lse_b - lse)[..., None], lse


def test_prefix_and_tree_block_merged_equal_the_full_mask_attention(monkeypatch):
    """Two requests (prefixes of 5 and 3 keys, trees of 4 nodes), GQA 4 query heads over 2 KV heads: the hook
    writes the tree's KV to its slots, attends the prefix non-causally and the tree through the block's
    mask, and the merge is the FULL-mask attention of every node."""
    import sglang.srt.layers.attention.flashinfer_backend as backend_module

    monkeypatch.setattr(backend_module, "_safe_merge_state", merge, raising=False)
    g = torch.Generator().manual_seed(0)
    n, heads, kv_heads, dim = 4, 4, 2, 8
    parents = [[-1, 0, 0, 1], [-1, 0, 1, 1]]
    slots = 32
    k_pool, v_pool = torch.randn(slots, kv_heads, dim, generator=g), torch.randn(slots, kv_heads, dim, generator=g)
    prefix_slots = [torch.tensor([3, 7, 8, 1, 0]), torch.tensor([20, 2, 9])]
    tree_slots = torch.tensor([10, 11, 12, 13, 24, 25, 26, 27])
    q = torch.randn(2 * n, heads * dim, generator=g)
    k, v = torch.randn(2 * n, kv_heads * dim, generator=g), torch.randn(2 * n, kv_heads * dim, generator=g)
    ancestors = []
    for tree in parents:
        mask = torch.eye(n, dtype=torch.bool)
        for i, parent in enumerate(tree):
            if parent >= 0:
                mask[i] |= mask[parent]
        ancestors.append(mask)
    scale = dim**-0.5

    class Paged:  # over each request's prefix keys, read from the pool the hook hands it
        def forward_return_lse(self, q3, kv, causal, sm_scale, logits_soft_cap):
            assert causal is False and sm_scale == scale
            everything = torch.ones(n, max(len(s) for s in prefix_slots), dtype=torch.bool)
            parts = [attention(q3[b * n : (b + 1) * n], kv[0][s], kv[1][s], everything[:, : len(s)], scale)
                     for b, s in enumerate(prefix_slots)]  # fmt: skip
            return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    class Ragged:  # over each request's own tree keys, as the layer computed them
        def forward_return_lse(self, q3, k3, v3, causal, sm_scale, logits_soft_cap):
            parts = [attention(q3[b * n : (b + 1) * n], k3[b * n : (b + 1) * n], v3[b * n : (b + 1) * n], ancestors[b],
                               scale) for b in range(2)]  # fmt: skip
            return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    paged = Paged()

    class Pool:
        def set_kv_buffer(self, layer, loc, k_new, v_new, *scales):
            k_pool[loc.loc] = k_new.view(-1, kv_heads, dim)
            v_pool[loc.loc] = v_new.view(-1, kv_heads, dim)

        def get_kv_buffer(self, layer_id):
            return k_pool, v_pool

    backend = SimpleNamespace(
        token_to_kv_pool=Pool(), forward_metadata=SimpleNamespace(prefill_wrappers=[paged], swa_out_cache_loc=None),
        _kv_write_scales=lambda layer: (None, None),
        **{flashinfer_split_verify._TREE_BLOCKS: {id(paged): SimpleNamespace(wrapper=Ragged())}},
    )  # fmt: skip
    layer = SimpleNamespace(layer_id=0, is_cross_attention=False, attn_type=None, sliding_window_size=-1, scaling=scale,
                            logit_cap=0.0, tp_q_head_num=heads, tp_k_head_num=kv_heads, tp_v_head_num=kv_heads,
                            head_dim=dim)  # fmt: skip
    forward_batch = SimpleNamespace(forward_mode=SimpleNamespace(is_target_verify=lambda: True), out_cache_loc=tree_slots,
                                    spec_info=SimpleNamespace(split_attention=True))  # fmt: skip

    out = flashinfer_split_verify.forward_split_tree_verify(None, backend, q, k, v, layer, forward_batch)

    assert torch.equal(k_pool[tree_slots], k.view(-1, kv_heads, dim))  # the tree's KV is in the cache for the commit
    q3 = q.view(-1, heads, dim)
    for b, prefix in enumerate(prefix_slots):
        keys = torch.cat([prefix, tree_slots[b * n : (b + 1) * n]])
        full = torch.cat([torch.ones(n, len(prefix), dtype=torch.bool), ancestors[b]], dim=1)
        expected, _ = attention(q3[b * n : (b + 1) * n], k_pool[keys], v_pool[keys], full, scale)
        torch.testing.assert_close(out.view(-1, heads, dim)[b * n : (b + 1) * n], expected, rtol=1e-5, atol=1e-5)


def test_other_forwards_are_sglangs(monkeypatch):
    calls = []
    original = lambda backend, *args: calls.append(args) or "sglang"  # noqa: E731
    for spec_info in (SimpleNamespace(split_attention=False), SimpleNamespace(), None):
        batch = SimpleNamespace(forward_mode=SimpleNamespace(is_target_verify=lambda: True), spec_info=spec_info)
        assert flashinfer_split_verify.forward_split_tree_verify(original, None, 1, 2, 3, None, batch) == "sglang"
    assert len(calls) == 3


# --- when the split form is used ------------------------------------------------------------------------------


def flashinfer_backend(**overrides):
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend

    backend = object.__new__(FlashInferAttnBackend)
    attributes = dict(dispatch_reason=None, use_sliding_window_kv_pool=False, prefill_uses_dequant_workspace=False,
                      prefill_backend="fa2", page_size=1,
                      indices_updater_prefill=SimpleNamespace(data_type=torch.bfloat16, q_data_type=torch.bfloat16))  # fmt: skip
    backend.__dict__.update({**attributes, **overrides})
    return backend


@pytest.mark.parametrize(
    "overrides",
    [
        {"dispatch_reason": "SLIDING_WINDOW"},
        {"use_sliding_window_kv_pool": True},
        {"prefill_uses_dequant_workspace": True},
        {"prefill_backend": "fa3"},
        {"page_size": 16},
        {"indices_updater_prefill": SimpleNamespace(data_type=torch.float8_e4m3fn, q_data_type=torch.bfloat16)},
        {"indices_updater_prefill": SimpleNamespace(data_type=torch.bfloat16, q_data_type=torch.bfloat16,
                                                    sliding_window_size=4096)},  # fmt: skip
    ],
)
def test_the_split_form_covers_plain_flashinfer_layouts_only(overrides):
    assert flashinfer_split_verify.split_verify_supported(flashinfer_backend())
    assert not flashinfer_split_verify.split_verify_supported(flashinfer_backend(**overrides))


def hybrid_backend(full_attn_backend):
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend

    backend = object.__new__(HybridLinearAttnBackend)
    backend.full_attn_backend, backend.linear_attn_backend = full_attn_backend, SimpleNamespace()
    return backend


def test_a_hybrid_target_verifies_its_attention_layers_split_when_its_full_attention_backend_qualifies():
    assert flashinfer_split_verify.split_verify_supported(hybrid_backend(flashinfer_backend()))
    assert not flashinfer_split_verify.split_verify_supported(hybrid_backend(flashinfer_backend(page_size=16)))
    assert not flashinfer_split_verify.split_verify_supported(hybrid_backend(SimpleNamespace()))  # e.g. triton


def test_the_split_form_is_on_by_default_and_can_be_turned_off(monkeypatch):
    assert not flashinfer_split_verify.split_verify_supported(SimpleNamespace())  # not FlashInfer (e.g. triton)
    monkeypatch.setenv(flashinfer_split_verify.SPLIT_VERIFY_ENV, "0")
    assert not flashinfer_split_verify.split_verify_supported(flashinfer_backend())
    assert not flashinfer_split_verify.split_verify_supported(hybrid_backend(flashinfer_backend()))


def test_a_split_capture_dummy_carries_no_full_mask():
    mask = torch.ones(8, dtype=torch.bool)
    assert tree_verify_dummy(mask, N, 4).custom_mask is mask
    dummy = tree_verify_dummy(mask, N, 4, split_attention=True)
    assert dummy.custom_mask is None and dummy.split_attention
