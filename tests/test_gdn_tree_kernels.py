"""A tree verified through a Gated DeltaNet layer from the root state alone (``kernels/gdn_tree.py``) gives every
node the output of the sequential recurrence along its root-to-node path, and the commit leaves the state that
path's last node would have: float32, against ``sglang_ddtree.tree.gdn_tree_reference`` and SGLang's own snapshot tree
verify (CPU under TRITON_INTERPRET=1 at small head dims, or a GPU)."""

from __future__ import annotations

import os
from typing import Optional

import pytest
import torch

from sglang_ddtree.tree.gdn_tree_reference import random_parents, reference_gdn_tree_verify
from sglang_ddtree.kernels.gdn_tree import gdn_tree_commit, gdn_tree_verify, root_apart_pads_fewer_rows, workspace_numel

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"
pytestmark = pytest.mark.skipif(
    not INTERPRET and not torch.cuda.is_available(), reason="needs TRITON_INTERPRET=1 or a GPU"
)
# Qwen3.5/3.6's GDN layout at toy head dims: 3 value heads per key head.
H, HV, K, V = 2, 6, 32, 32
TOLERANCE = dict(rtol=1e-4, atol=1e-4)


def chain(n: int) -> list[int]:
    return [-1] + list(range(n - 1))


def star(n: int) -> list[int]:
    return [-1] + [0] * (n - 1)


def bushy(n: int, seed: int) -> list[int]:
    return random_parents(n, torch.Generator().manual_seed(seed))


def deep_with_twigs(n: int) -> list[int]:
    """A chain of half the nodes, each of the others a leaf hanging off it."""
    spine = (n + 1) // 2
    return [-1] + list(range(spine - 1)) + [i % spine for i in range(n - spine)]


def layer_inputs(bs: int, T: int, seed: int, gating: str, same_key: bool = False) -> dict:
    """``same_key``: every node of a tree has the first node's key (a repeated token: the keys' products are all
    1, the triangular solve's worst case)."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    decay_logit, write_logit = {"mixed": (0.0, 0.0), "keep": (-12.0, 10.0), "forget": (6.0, -10.0)}[gating]
    keys = randn(bs, T, H, K)
    return {
        "q": randn(bs, T, H, K), "k": keys[:, :1].expand(-1, T, -1, -1).clone() if same_key else keys,
        "v": randn(bs, T, HV, V),
        # "keep": decay ~1 (softplus ~0) and beta ~1; "forget": decay ~0 and beta ~0
        "a": randn(bs, T, HV) + decay_logit, "b": randn(bs, T, HV) + write_logit,
        "A_log": randn(HV) * 0.5, "dt_bias": randn(HV) * 0.5,
    }  # fmt: skip


def verify(inputs: dict, pool: torch.Tensor, slots: torch.Tensor, parents: torch.Tensor, capacity: int,
           launch: Optional[dict] = None, root_apart: Optional[bool] = None) -> tuple:  # fmt: skip
    """The kernel's outputs and the workspace it filled (one row per request, in an SGLang-sized buffer of
    per-node snapshots for trees of ``capacity`` nodes, as the DDTREE hook uses it)."""
    bs = parents.shape[0]
    workspace = torch.full((bs, capacity, HV, V, K), float("nan"), device=DEVICE)
    out = gdn_tree_verify(**{n: t.to(DEVICE) for n, t in inputs.items()}, ssm_states=pool, cache_indices=slots,
                          parents=parents.to(torch.int64).to(DEVICE), workspace=workspace,  # SGLang's dtype
                          workspace_indices=torch.arange(bs, device=DEVICE), scale=K**-0.5,
                          capacity=capacity, root_apart=root_apart, **(launch or {}))  # fmt: skip
    return out, workspace


def run(parents_per_request: list[list[int]], gating: str = "mixed", seed: int = 0, capacity: int = 0,
        launch: Optional[dict] = None, same_key: bool = False, root_apart: Optional[bool] = None) -> None:  # fmt: skip
    """``capacity``: the widest tree the workspace is laid out for (0: this tree's own width); ``launch``: the
    kernels' ``block_v`` / ``num_warps`` (default: theirs); ``root_apart``: the root solved before the other rows,
    or as one of them (default: the kernel's choice, apart where that pads to fewer rows)."""
    launch = launch or {}
    bs, T = len(parents_per_request), len(parents_per_request[0])
    capacity = capacity or T
    parents = torch.tensor(parents_per_request)
    inputs = layer_inputs(bs, T, seed, gating, same_key)
    initial = torch.randn(bs, HV, V, K, generator=torch.Generator().manual_seed(seed + 1))
    want_out, want_states = reference_gdn_tree_verify(**inputs, initial_states=initial, parents=parents, scale=K**-0.5)

    # The requests' states sit in a pool of slots, as SGLang's mamba pool holds them; one slot belongs to nobody.
    pool = torch.randn(bs + 1, HV, V, K, generator=torch.Generator().manual_seed(seed + 2))
    slots = torch.randperm(bs + 1, generator=torch.Generator().manual_seed(seed + 3))[:bs]
    pool[slots] = initial
    untouched = pool.clone()
    pool_d, slots_d = pool.to(DEVICE), slots.to(DEVICE)
    out, workspace = verify(inputs, pool_d, slots_d, parents, capacity, launch, root_apart)
    torch.testing.assert_close(out.cpu(), want_out, **TOLERANCE)
    assert torch.equal(pool_d.cpu(), untouched)  # the verify writes no state

    # Any node's state, into any slot, from the root state in the request's slot: the last request's track node
    # into the spare slot (a prefix-cache track), then every request's accepted node over its root state.
    spare = int(torch.tensor(sorted(set(range(bs + 1)) - set(slots.tolist()))))
    track_node = torch.full((bs,), -1)
    track_node[-1] = int(torch.randint(0, T, (1,), generator=torch.Generator().manual_seed(seed + 4)))
    last = torch.randint(0, T, (bs,), generator=torch.Generator().manual_seed(seed + 5))
    commit_launch = {name: launch[name] for name in ("block_v", "num_warps") if name in launch}
    gdn_tree_commit(pool_d[None], workspace[None], torch.full((bs,), spare, device=DEVICE), track_node.to(DEVICE),
                    capacity, source_indices=slots_d, **commit_launch)  # fmt: skip
    gdn_tree_commit(pool_d[None], workspace[None], slots_d, last.to(DEVICE), capacity, source_indices=slots_d,
                    **commit_launch)  # fmt: skip
    committed = pool_d.cpu()
    torch.testing.assert_close(committed[slots], want_states[torch.arange(bs), last], **TOLERANCE)
    torch.testing.assert_close(committed[spare], want_states[-1, track_node[-1]], **TOLERANCE)


@pytest.mark.parametrize("root_apart", [True, False], ids=["root-apart", "root-in-rows"])
@pytest.mark.parametrize("shape", [chain, star, deep_with_twigs], ids=["chain", "star", "deep-with-twigs"])
@pytest.mark.parametrize("T", [2, 5, 17, 33, 65])  # its root and at least one node; 65 in rows: blocks of 32 rows
def test_every_node_gets_its_paths_recurrence_and_the_commit_its_state(shape, T, root_apart):
    run([shape(T), shape(T)], seed=T, root_apart=root_apart)


def test_a_narrower_tree_verified_in_a_workspace_laid_out_for_the_widest_commits_the_same_states():
    """``--budget auto``: a step may verify 5 of the 33 nodes SGLang's buffer holds per request; verify and commit
    share the widest tree's layout, whatever the step's width, so any step's commit reads what its verify wrote
    (and the unwritten rows past the tree, NaN here, are never read)."""
    run([bushy(5, seed=1), chain(5)], capacity=33)
    run([star(2)], capacity=9)
    run([bushy(17, seed=2)], capacity=65)  # its root apart, in a layout its 65-node verifies share


@pytest.mark.parametrize("block_v, num_warps, dot_precision", [(16, 4, "ieee"), (32, 4, "ieee"), (64, 8, "ieee"),
                                                               (32, 8, "tf32x3")])  # fmt: skip
def test_every_launch_of_the_sweep_computes_the_same(block_v, num_warps, dot_precision):
    """The launch settings ``bench.gdn_tree_kernel`` sweeps (value columns per program, warps, the products'
    precision: three-pass TF32 keeps fp32's accuracy within the tolerance) change only how the work is split."""
    run([bushy(17, seed=3), deep_with_twigs(17)], seed=7,
        launch={"block_v": block_v, "num_warps": num_warps, "dot_precision": dot_precision})


def as_views_of_one_projection(inputs: dict) -> dict:
    """The layer's q, k, v and gates as SGLang hands them over at widths its fused q/k/v split does not take
    (Qwen3.6-27B at TP 1): strided views of one row per token, ``[q | k | v]`` and ``[b | a]``, values equal."""
    q, k, v, a, b = (inputs[n] for n in "qkvab")
    bs, T = q.shape[:2]
    qkv = torch.cat([q.flatten(2), k.flatten(2), v.flatten(2)], dim=-1)
    ba = torch.cat([b, a], dim=-1)
    q_end, k_end = H * K, 2 * H * K
    return {**inputs, "q": qkv[..., :q_end].view(bs, T, H, K), "k": qkv[..., q_end:k_end].view(bs, T, H, K),
            "v": qkv[..., k_end:].view(bs, T, HV, V), "b": ba[..., :HV], "a": ba[..., HV:]}  # fmt: skip


@pytest.mark.parametrize("root_apart", [True, False], ids=["root-apart", "root-in-rows"])
def test_inputs_that_are_strided_views_of_one_projection_are_read_in_place_with_the_same_result(root_apart):
    """The kernels read q, k, v and the gates by their token strides (no copy per layer: run 77's traces showed
    0.35 ms of q/k/v copies in a 27.4 ms step, gone in run 80's): the outputs and the commit workspace equal those
    of contiguous inputs."""
    parents = torch.tensor([bushy(17, seed=5), chain(17)])
    inputs = {name: t.to(DEVICE) for name, t in layer_inputs(2, 17, seed=7, gating="mixed").items()}
    views = as_views_of_one_projection(inputs)  # on the device already: a copy there would make them contiguous
    assert not views["q"].is_contiguous() and not views["v"].is_contiguous() and not views["a"].is_contiguous()
    pool = torch.randn(2, HV, V, K, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    slots = torch.arange(2, device=DEVICE)
    want_out, want_workspace = verify(inputs, pool, slots, parents, 17, root_apart=root_apart)
    out, workspace = verify(views, pool, slots, parents, 17, root_apart=root_apart)
    assert torch.equal(out, want_out)
    assert torch.equal(workspace.nan_to_num(-7.0), want_workspace.nan_to_num(-7.0))


@pytest.mark.parametrize("gating", ["keep", "forget"])
def test_decay_and_write_strength_near_their_limits(gating):
    run([bushy(17, seed=1), chain(17)], gating=gating, seed=2)


@pytest.mark.parametrize("root_apart", [True, False], ids=["root-apart", "root-in-rows"])
@pytest.mark.parametrize("T", [33, 65])
def test_a_repeated_token_written_at_full_strength_down_a_deep_chain(T, root_apart):
    """Identical keys with no decay and beta ~1 down 32 or 64 levels: the tree's triangular system at its worst
    conditioning (every off-diagonal entry ~1), solved level by level as the recurrence would (at 65 nodes with the
    root in the rows, across blocks of rows)."""
    run([chain(T), deep_with_twigs(T)], gating="keep", seed=9, same_key=True, root_apart=root_apart)


@pytest.mark.parametrize("root_apart", [True, False], ids=["root-apart", "root-in-rows"])
def test_a_batch_of_different_bushy_trees_of_65_nodes(root_apart):
    """A budget-64 DDTree: ``T`` pads to 64 rows with the root apart, 128 with it in the rows."""
    run([bushy(65, seed=s) for s in range(3)], seed=5, root_apart=root_apart)


@pytest.mark.parametrize("T, apart", [(2, False), (16, False), (17, True), (32, False), (33, True), (65, True),
                                      (66, False)])  # fmt: skip
def test_the_root_is_set_apart_where_the_drafted_nodes_alone_pad_to_fewer_rows(T, apart):
    """A DDTree of budget 16, 32 or 64 has 17, 33 or 65 nodes: one past a power of two, its drafted nodes alone
    pad to half the rows."""
    assert root_apart_pads_fewer_rows(T) == apart


def test_commit_of_the_root_alone_is_one_recurrence_step():
    parents = torch.tensor([bushy(9, seed=7)])
    inputs = layer_inputs(1, 9, seed=7, gating="mixed")
    initial = torch.randn(1, HV, V, K)
    _, states = reference_gdn_tree_verify(**inputs, initial_states=initial, parents=parents, scale=K**-0.5)
    pool, slots = initial.clone().to(DEVICE), torch.zeros(1, dtype=torch.int64, device=DEVICE)
    _, workspace = verify(inputs, pool, slots, parents, parents.shape[1])
    gdn_tree_commit(pool[None], workspace[None], slots, torch.zeros(1, dtype=torch.int64, device=DEVICE), 9,
                    source_indices=slots)  # fmt: skip
    torch.testing.assert_close(pool.cpu()[0], states[0, 0], **TOLERANCE)


def test_the_workspace_fits_in_sglangs_snapshot_buffer_and_in_two_snapshots():
    """What makes SGLang's per-node snapshot buffer (T snapshots per request) reusable as the workspace, and what
    a buffer sized for the workspace alone holds (Qwen3.6-27B's heads: 0.03 snapshots at T = 2, 0.52 at 33, 1.02
    at 65; the root state is not copied: the commit reads it in the pool)."""
    snapshot = 48 * 128 * 128
    for T in (2, 8, 33):
        assert workspace_numel(T, HV=48, K=128, V=128) <= snapshot
    assert snapshot < workspace_numel(65, HV=48, K=128, V=128) <= 2 * snapshot


@pytest.mark.parametrize("bad", ["key_dim", "workspace", "precision"])
def test_inputs_the_kernel_cannot_serve_are_refused(bad):
    inputs = layer_inputs(1, 4, seed=0, gating="mixed")
    workspace = torch.zeros(1, workspace_numel(4, HV, K, V))
    if bad == "key_dim":
        inputs["q"], inputs["k"] = inputs["q"][..., :24], inputs["k"][..., :24]
    elif bad == "workspace":
        workspace = workspace[:, :-1].contiguous()
    expected = {"key_dim": "power-of-two key dim", "workspace": "float32 workspace", "precision": "dot_precision"}
    with pytest.raises(ValueError, match=expected[bad]):
        gdn_tree_verify(**inputs, ssm_states=torch.zeros(1, HV, V, inputs["k"].shape[-1]),
                        cache_indices=torch.zeros(1, dtype=torch.int64), parents=torch.tensor([[-1, 0, 1, 2]]),
                        workspace=workspace, workspace_indices=torch.zeros(1, dtype=torch.int64), scale=1.0,
                        dot_precision="tf32" if bad == "precision" else "ieee")  # fmt: skip


def test_outputs_and_committed_state_equal_sglangs_snapshot_tree_verify():
    """SGLang 0.5.17's own tree verify (``fused_sigmoid_gating_delta_rule_update`` with ``retrieve_parent_token``,
    every node's state written to an intermediate buffer, which its commit copies from) on the same trees: the
    same outputs, and the state this commit builds equals the one SGLang would copy for the last accepted node."""
    from sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent import fused_sigmoid_gating_delta_rule_update

    parents = torch.tensor([bushy(17, seed=11), deep_with_twigs(17)])
    bs, T = parents.shape
    inputs = {n: t.to(DEVICE) for n, t in layer_inputs(bs, T, seed=11, gating="mixed").items()}
    pool = torch.randn(bs + 1, HV, V, K, device=DEVICE)
    slots = torch.tensor([2, 0], device=DEVICE)
    snapshots = torch.zeros(bs, T, HV, V, K, device=DEVICE)
    sglang_out = fused_sigmoid_gating_delta_rule_update(
        A_log=inputs["A_log"], a=inputs["a"].view(bs * T, HV), dt_bias=inputs["dt_bias"], softplus_beta=1.0,
        softplus_threshold=20.0, q=inputs["q"].view(1, bs * T, H, K), k=inputs["k"].view(1, bs * T, H, K),
        v=inputs["v"].view(1, bs * T, HV, V), b=inputs["b"].view(bs * T, HV), initial_state_source=pool,
        initial_state_indices=slots, scale=K**-0.5, use_qk_l2norm_in_kernel=True,
        cu_seqlens=torch.arange(0, bs * T + 1, T, device=DEVICE), disable_state_update=True,
        intermediate_states_buffer=snapshots, intermediate_state_indices=torch.arange(bs, device=DEVICE),
        cache_steps=T, retrieve_parent_token=parents.to(DEVICE),
    )  # fmt: skip
    out, workspace = verify({n: t.cpu() for n, t in inputs.items()}, pool, slots, parents, T)
    torch.testing.assert_close(out, sglang_out.view(bs, T, HV, V), **TOLERANCE)
    last = torch.tensor([16, 9], device=DEVICE)
    gdn_tree_commit(pool[None], workspace[None], slots, last, T, source_indices=slots)
    torch.testing.assert_close(pool[slots], snapshots[torch.arange(bs), last], **TOLERANCE)
