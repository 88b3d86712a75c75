"""A GDN layer's causal convolution over draft trees without a window per node (``kernels/gdn_tree_conv.py``): every
node gets the output of decoding its root-to-node path token by token, the persistent window stays as it was, and
committing a node leaves the window that path ends with, in any slot, a prefix-cache track node's first. Against
``gdn_tree_reference.reference_tree_conv``, SGLang's tree conv and SGLang's decode step (CPU under
TRITON_INTERPRET=1, or a GPU)."""

from __future__ import annotations

import os
from typing import Optional

import pytest
import torch
from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update

from sglang_ddtree.kernels.gdn_tree_conv import gdn_tree_conv, gdn_tree_conv_commit
from sglang_ddtree.tree.gdn_tree_reference import random_parents, reference_tree_conv
from sglang_ddtree.tree.tree_reference import tree_links
from test_gdn_tree_kernels import bushy, chain, deep_with_twigs, star

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"
pytestmark = pytest.mark.skipif(
    not INTERPRET and not torch.cuda.is_available(), reason="needs TRITON_INTERPRET=1 or a GPU"
)
DIM, W = 80, 4  # not a multiple of the kernels' channel blocks


class Trees:
    """A batch of trees through one GDN layer's conv: inputs ``x [bs, dim, T]`` laid out as SGLang's view of
    ``[bs, T, dim]`` tokens, a pool of persistent windows (request ``n`` in slot ``slots[n]``), the tree links."""

    def __init__(self, trees: list[list[int]], dtype: torch.dtype = torch.float32, seed: int = 0, bias: bool = True):
        g = torch.Generator().manual_seed(seed)
        self.trees, bs, T = trees, len(trees), len(trees[0])
        self.parents = torch.tensor(trees)
        tokens = torch.randn(bs, T, DIM, generator=g).to(dtype)
        self.x = tokens.to(DEVICE).transpose(1, 2)
        self.weight = (torch.randn(DIM, W, generator=g) * 0.5).to(dtype).to(DEVICE)
        self.bias = (torch.randn(DIM, generator=g) * 0.1).to(dtype).to(DEVICE) if bias else None
        self.slots = torch.arange(bs, dtype=torch.int32, device=DEVICE) * 2 + 1
        self.pool = torch.zeros(2 * bs + 2, DIM, W - 1, dtype=dtype)
        self.pool[self.slots.cpu()] = torch.randn(bs, DIM, W - 1, generator=g).to(dtype)
        self.pool = self.pool.to(DEVICE)
        links = [tree_links(t) for t in trees]
        self.next_token = torch.tensor([f for f, _ in links], dtype=torch.int64, device=DEVICE)  # SGLang's dtype
        self.next_sibling = torch.tensor([s for _, s in links], dtype=torch.int64, device=DEVICE)

    def convolve(self, capacity: int = 0, inputs: Optional[torch.Tensor] = None, parents: Optional[torch.Tensor] = None,
                 parents_filled: bool = False) -> tuple[torch.Tensor, ...]:  # fmt: skip
        """Our verify: outputs, the parents it wrote and the inputs it left (one row per request; ``inputs`` and
        ``parents``: where, default new buffers; ``parents_filled``: a later GDN layer's call, which reads them)."""
        bs, dim, T = self.x.shape
        if parents is None:
            parents = torch.full((bs, T), 99, dtype=torch.int64, device=DEVICE)
        if inputs is None:
            inputs = torch.full((bs, (capacity or T) * dim), float("nan"), dtype=self.x.dtype, device=DEVICE)
        out = gdn_tree_conv(self.x, self.pool, self.weight, self.bias, "silu", self.slots, self.next_token,
                            self.next_sibling, parents, inputs, torch.arange(bs, device=DEVICE),
                            parents_filled=parents_filled)  # fmt: skip
        return out, parents, inputs


def test_a_later_layer_reads_the_parents_the_first_layer_filled_and_does_not_rebuild_them():
    """The links are every GDN layer's, so only a verify's first layer builds the parents (48 launches per step cost
    0.27 ms at Qwen3.6-27B's shape, tests/gpu/RESULTS.md run 77); the others convolve along what it left."""
    batch = Trees([bushy(17, seed=2), deep_with_twigs(17)])
    first, parents, _ = batch.convolve()
    later, still, _ = batch.convolve(parents=parents.clone(), parents_filled=True)
    torch.testing.assert_close(later, first, rtol=0, atol=0)
    assert torch.equal(still, parents)
    # What it reads is what it uses: a chain's parents in place of the bushy tree's change the outputs, and stay.
    chains = torch.tensor([chain(17), chain(17)], dtype=torch.int64, device=DEVICE)
    misled, kept, _ = batch.convolve(parents=chains.clone(), parents_filled=True)
    assert torch.equal(kept, chains) and not torch.allclose(misled, first)


@pytest.mark.parametrize(
    "trees",
    [[chain(9)], [star(9)], [bushy(17, seed=1), deep_with_twigs(17)], [[-1]], [chain(2), star(2)],
     [random_parents(33, torch.Generator().manual_seed(s), reach=6) for s in range(3)]],
    ids=["chain", "star", "bushy_and_deep", "root_only", "two_nodes", "wide_33"],
)  # fmt: skip
def test_every_node_convolves_its_own_path_and_the_parents_come_from_the_links(trees):
    batch = Trees(trees)
    pool_before = batch.pool.clone()
    out, parents, inputs = batch.convolve()
    want, _ = reference_tree_conv(batch.x.cpu(), batch.pool[batch.slots.long()].cpu(), batch.weight.cpu(),
                                  batch.bias.cpu(), batch.parents)  # fmt: skip
    torch.testing.assert_close(out.cpu(), want, rtol=1e-6, atol=1e-6)
    assert out.stride() == batch.x.stride()  # SGLang views it back as [bs, T, dim] tokens
    want_parents = batch.parents.clone()
    assert parents.cpu().tolist() == want_parents.tolist()
    assert torch.equal(inputs.cpu().view(len(trees), -1, DIM), batch.x.cpu().transpose(1, 2))
    assert torch.equal(batch.pool, pool_before)  # the window before the root stays for the commit


# The Triton interpreter's bfloat16 arithmetic is not bfloat16's (numpy has none): float16 stands in for it there.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16 if INTERPRET else torch.bfloat16])
def test_a_node_gets_exactly_what_decoding_its_path_token_by_token_gets(dtype):
    """SGLang's decode step (``causal_conv1d_update`` without tree links, one token, the window rolled in place)
    along each node's path from the persistent window: the same bits, half-precision products included."""
    tree = bushy(12, seed=7)
    batch = Trees([tree], dtype=dtype, seed=3)
    out, _, _ = batch.convolve()
    only_slot = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    for node in range(len(tree)):
        path = [node]
        while path[-1] > 0:
            path.append(tree[path[-1]])
        window = batch.pool[batch.slots.long()].clone()
        for i in reversed(path):
            decoded = causal_conv1d_update(batch.x[:, :, i], window, batch.weight, batch.bias, "silu",
                                           conv_state_indices=only_slot)  # fmt: skip
        assert torch.equal(out[0, :, node], decoded[0]), f"node {node}"


def test_the_outputs_match_sglangs_tree_conv():
    """SGLang's tree conv (the same ``causal_conv1d_update`` with ``retrieve_*`` links and a window per node) sums a
    node's products in the other order, so to rounding."""
    trees = [bushy(17, seed=2), star(17)]
    batch = Trees(trees)
    out, parents, _ = batch.convolve()
    bs, dim, T = batch.x.shape
    sglang_parents = torch.empty(bs, T, dtype=torch.int64, device=DEVICE)
    windows = torch.zeros(bs, T, dim, W - 1, device=DEVICE)
    sglangs = causal_conv1d_update(
        batch.x, batch.pool.clone(), batch.weight, batch.bias, "silu", conv_state_indices=batch.slots,
        intermediate_conv_window=windows, intermediate_state_indices=torch.arange(bs, dtype=torch.int32, device=DEVICE),
        retrieve_next_token=batch.next_token, retrieve_next_sibling=batch.next_sibling,
        retrieve_parent_token=sglang_parents,
    )  # fmt: skip
    torch.testing.assert_close(out, sglangs, rtol=1e-6, atol=1e-6)
    assert torch.equal(parents[:, 1:], sglang_parents[:, 1:])  # SGLang leaves the root's 0


def test_a_commit_leaves_the_window_its_path_ends_with_the_track_node_first():
    """Request 0 commits node 13 and a prefix-cache track node (4) into another slot, request 1 its root, request 2
    nothing (-1); over two layers, with the parents from a float buffer (the SSM workspace's)."""
    trees = [bushy(17, seed=5), deep_with_twigs(17), chain(17)]
    layers = [Trees(trees, seed=s) for s in range(2)]
    pools, inputs, parents = [], [], []
    for layer in layers:
        _, layer_parents, layer_inputs = layer.convolve(capacity=20)
        pools.append(layer.pool)
        inputs.append(layer_inputs)
        parents.append(layer_parents.float())
    conv_states, inputs, parents = torch.stack(pools), torch.stack(inputs), torch.stack(parents)
    before = conv_states.clone()
    slots = layers[0].slots
    track_slots, track_nodes = torch.tensor([0, -1, -1], device=DEVICE), torch.tensor([4, -1, -1], device=DEVICE)
    nodes = torch.tensor([13, 0, -1], device=DEVICE)
    gdn_tree_conv_commit(conv_states, inputs, parents, track_slots, track_nodes, source_indices=slots)
    gdn_tree_conv_commit(conv_states, inputs, parents, slots, nodes, source_indices=slots)

    for l, layer in enumerate(layers):
        _, windows = reference_tree_conv(layer.x.cpu(), before[l][slots.long()].cpu(), layer.weight.cpu(), None,
                                         layer.parents)  # fmt: skip
        committed = conv_states[l].cpu()
        assert torch.equal(committed[int(slots[0])], windows[0, 13])
        assert torch.equal(committed[0], windows[0, 4])  # from the window before the root, not the new one
        assert torch.equal(committed[int(slots[1])], windows[1, 0])
        assert torch.equal(committed[int(slots[2])], before[l, int(slots[2])].cpu())  # nothing accepted
        untouched = [s for s in range(conv_states.shape[1]) if s not in (0, *slots.tolist())]
        assert torch.equal(committed[untouched], before[l][untouched].cpu())
