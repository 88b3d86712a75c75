"""A tree verified through a Gated DeltaNet layer from the root state alone (``kernels/gdn_tree.py``) gives every
node the output of the sequential recurrence along its root-to-node path, and the commit leaves the persistent
state that path's last node would have: float32, against ``sglang_ddtree.gdn_tree_reference`` (CPU under
TRITON_INTERPRET=1 at small head dims, or a GPU)."""

from __future__ import annotations

import os

import pytest
import torch

from sglang_ddtree.gdn_tree_reference import (
    ancestor_mask,
    pack_ancestor_bits,
    random_parents,
    reference_gdn_tree_verify,
)
from sglang_ddtree.kernels.gdn_tree import gdn_tree_commit, gdn_tree_verify

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


def layer_inputs(bs: int, T: int, seed: int, gating: str) -> dict:
    g = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    decay_logit, write_logit = {"mixed": (0.0, 0.0), "keep": (-12.0, 10.0), "forget": (6.0, -10.0)}[gating]
    return {
        "q": randn(bs, T, H, K), "k": randn(bs, T, H, K), "v": randn(bs, T, HV, V),
        # "keep": decay ~1 (softplus ~0) and beta ~1; "forget": decay ~0 and beta ~0
        "a": randn(bs, T, HV) + decay_logit, "b": randn(bs, T, HV) + write_logit,
        "A_log": randn(HV) * 0.5, "dt_bias": randn(HV) * 0.5,
    }  # fmt: skip


def run(parents_per_request: list[list[int]], gating: str = "mixed", seed: int = 0) -> None:
    bs, T = len(parents_per_request), len(parents_per_request[0])
    parents = torch.tensor(parents_per_request)
    inputs = layer_inputs(bs, T, seed, gating)
    initial = torch.randn(bs, HV, V, K, generator=torch.Generator().manual_seed(seed + 1))
    want_out, want_states = reference_gdn_tree_verify(**inputs, initial_states=initial, parents=parents, scale=K**-0.5)

    # The requests' states sit in a pool of slots, as SGLang's mamba pool holds them; one slot belongs to nobody.
    pool = torch.randn(bs + 1, HV, V, K, generator=torch.Generator().manual_seed(seed + 2))
    slots = torch.randperm(bs + 1, generator=torch.Generator().manual_seed(seed + 3))[:bs]
    pool[slots] = initial
    untouched = pool.clone()
    bits = pack_ancestor_bits(ancestor_mask(parents))
    on = {name: t.to(DEVICE) for name, t in inputs.items()}
    pool_d, slots_d, bits_d = pool.to(DEVICE), slots.to(DEVICE), bits.to(DEVICE)
    verified = gdn_tree_verify(**on, ssm_states=pool_d, cache_indices=slots_d, ancestor_bits=bits_d, scale=K**-0.5)
    torch.testing.assert_close(verified.o.cpu(), want_out, **TOLERANCE)
    assert torch.equal(pool_d.cpu(), untouched)  # the verify writes no state

    last = torch.randint(0, T, (bs,), generator=torch.Generator().manual_seed(seed + 4))
    gdn_tree_commit(pool_d, slots_d, bits_d, last.to(DEVICE), verified)
    committed = pool_d.cpu()
    torch.testing.assert_close(committed[slots], want_states[torch.arange(bs), last], **TOLERANCE)
    others = torch.ones(bs + 1, dtype=torch.bool)
    others[slots] = False
    assert torch.equal(committed[others], untouched[others])


@pytest.mark.parametrize("shape", [chain, star, deep_with_twigs], ids=["chain", "star", "deep-with-twigs"])
@pytest.mark.parametrize("T", [1, 5, 17, 33])
def test_every_node_gets_its_paths_recurrence_and_the_commit_its_state(shape, T):
    run([shape(T), shape(T)], seed=T)


@pytest.mark.parametrize("gating", ["keep", "forget"])
def test_decay_and_write_strength_near_their_limits(gating):
    run([bushy(17, seed=1), chain(17)], gating=gating, seed=2)


def test_a_batch_of_different_bushy_trees_of_65_nodes():
    """A budget-64 DDTree: ``T`` pads to 128 rows, and the ancestor bits span two words."""
    run([bushy(65, seed=s) for s in range(3)], seed=5)


def test_commit_of_the_root_alone_is_one_recurrence_step():
    parents = [bushy(9, seed=7)]
    inputs = layer_inputs(1, 9, seed=7, gating="mixed")
    initial = torch.randn(1, HV, V, K)
    _, states = reference_gdn_tree_verify(**inputs, initial_states=initial, parents=torch.tensor(parents),
                                          scale=K**-0.5)  # fmt: skip
    bits = pack_ancestor_bits(ancestor_mask(torch.tensor(parents))).to(DEVICE)
    pool, slots = initial.clone().to(DEVICE), torch.zeros(1, dtype=torch.int64, device=DEVICE)
    verified = gdn_tree_verify(**{n: t.to(DEVICE) for n, t in inputs.items()}, ssm_states=pool, cache_indices=slots,
                               ancestor_bits=bits, scale=K**-0.5)  # fmt: skip
    gdn_tree_commit(pool, slots, bits, torch.zeros(1, dtype=torch.int64, device=DEVICE), verified)
    torch.testing.assert_close(pool.cpu()[0], states[0, 0], **TOLERANCE)


def test_a_key_dim_the_kernel_cannot_tile_is_refused():
    inputs = layer_inputs(1, 4, seed=0, gating="mixed")
    inputs["q"], inputs["k"] = inputs["q"][..., :24], inputs["k"][..., :24]
    with pytest.raises(ValueError, match="power-of-two key dim"):
        gdn_tree_verify(**inputs, ssm_states=torch.zeros(1, HV, V, 24), cache_indices=torch.zeros(1, dtype=torch.int64),
                        ancestor_bits=torch.zeros(1, 4, 1, dtype=torch.int64), scale=1.0)  # fmt: skip


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
    bits = pack_ancestor_bits(ancestor_mask(parents)).to(DEVICE)
    verified = gdn_tree_verify(**inputs, ssm_states=pool, cache_indices=slots, ancestor_bits=bits, scale=K**-0.5)
    torch.testing.assert_close(verified.o, sglang_out.view(bs, T, HV, V), **TOLERANCE)
    last = torch.tensor([16, 9], device=DEVICE)
    gdn_tree_commit(pool, slots, bits, last, verified)
    torch.testing.assert_close(pool[slots], snapshots[torch.arange(bs), last], **TOLERANCE)
