"""Tree-verify attention against context length, two forms of the same result, on one GPU (issue 14 point 5).

SGLang's verify (and DDTREE's today) runs FlashInfer's paged prefill with a FULL custom mask: every tree node's row
of ``prefix + N`` bits, the prefix bits all set. FlashInfer's custom-mask kernel reads a mask bit for every query and
key it scores, so its cost grows with the prefix at a rate causal and unmasked attention do not pay. The split form
gives the same output: the prefix without a mask (every node sees all of it) plus the N x N tree block with one,
merged by log-sum-exp (``flashinfer.cascade.merge_state``), as SGLang's extend merges its paged and ragged parts.

Per (shape, batch, prefix), one layer's attention time, median of CUDA-graph replays of ``--repeats`` calls (the
way a verify graph launches one call per layer):

- ``full_mask``: paged prefill over ``prefix + N`` keys with the packed FULL mask (today's verify);
- ``split``: paged prefill over the prefix (no mask) + ragged prefill over the tree (N x N mask) + merge;
- ``chain_causal``: paged causal prefill of ``--chain`` queries over ``prefix + chain`` keys (DFLASH's verify);
- ``nodes_causal``: the same with N queries (a lower bound: N queries with no mask to read).

and the largest difference between ``full_mask``'s and ``split``'s outputs on the same inputs.

    python -m bench.verify_attention --out bench/results/verify_attention
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from bench.provenance import checkout_commit, write_report
from sglang_ddtree.tree.gdn_tree_reference import random_parents


@dataclass(frozen=True)
class AttentionShape:
    """One model's attention layers at TP 1: query heads, key/value heads, head dim, layers with full attention."""

    q_heads: int
    kv_heads: int
    head_dim: int
    layers: int


SHAPES = {
    "smollm2_135m": AttentionShape(9, 3, 64, 30),
    "qwen36_27b": AttentionShape(24, 4, 256, 16),  # its 16 full-attention layers (bench/hybrid_verify_cost.py)
}


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """``[N, N]`` bool: node ``i`` sees node ``j`` iff ``j`` is ``i`` or one of its ancestors."""
    n = len(parents)
    mask = torch.eye(n, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            mask[i] |= mask[parent]
    return mask


def full_tree_mask(tree: torch.Tensor, prefix: int) -> torch.Tensor:
    """The FULL mask of one request's verify: ``[N, prefix + N]``, every prefix key visible."""
    return torch.cat([torch.ones(tree.shape[0], prefix, dtype=torch.bool), tree], dim=1)


def _graph_time_ms(call: Callable[[], object], repeats: int, replays: int) -> float:
    """Median over ``replays`` of one CUDA-graph replay of ``repeats`` calls, divided by ``repeats``."""
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            call()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / repeats)
    return statistics.median(times)


def measure(shape: AttentionShape, bs: int, prefix: int, n: int, chain: int, repeats: int) -> dict:
    import flashinfer
    from flashinfer.cascade import merge_state

    dev, dtype = "cuda", torch.bfloat16
    g = torch.Generator().manual_seed(bs * 100003 + prefix)
    trees = [ancestor_mask(random_parents(n, g)) for _ in range(bs)]
    slots_per_request = prefix + max(n, chain)
    k_cache = torch.randn(bs * slots_per_request, 1, shape.kv_heads, shape.head_dim, device=dev, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    last_page_len = torch.ones(bs, dtype=torch.int32, device=dev)

    def paged_layout(keys: int) -> tuple[torch.Tensor, torch.Tensor]:
        indices = torch.cat([torch.arange(keys) + b * slots_per_request for b in range(bs)])
        return torch.arange(0, (bs + 1) * keys, keys, dtype=torch.int32, device=dev), indices.int().to(dev)

    def query_indptr(rows: int) -> torch.Tensor:
        return torch.arange(0, (bs + 1) * rows, rows, dtype=torch.int32, device=dev)

    def paged_wrapper(queries: int, keys: int, **plan) -> "flashinfer.BatchPrefillWithPagedKVCacheWrapper":
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
        kv_indptr, kv_indices = paged_layout(keys)
        wrapper.plan(query_indptr(queries), kv_indptr, kv_indices, last_page_len, shape.q_heads, shape.kv_heads,
                     shape.head_dim, 1, q_data_type=dtype, kv_data_type=dtype, **plan)  # fmt: skip
        return wrapper

    q = torch.randn(bs * n, shape.q_heads, shape.head_dim, device=dev, dtype=dtype)
    q_chain = torch.randn(bs * chain, shape.q_heads, shape.head_dim, device=dev, dtype=dtype)
    tree_rows = torch.cat([torch.arange(n) + b * slots_per_request + prefix for b in range(bs)]).to(dev)
    k_tree, v_tree = k_cache[tree_rows, 0].contiguous(), v_cache[tree_rows, 0].contiguous()
    kv = (k_cache, v_cache)

    full = paged_wrapper(n, prefix + n, custom_mask=torch.cat([full_tree_mask(t, prefix).flatten() for t in trees]).to(dev))
    prefix_only = paged_wrapper(n, prefix, causal=False)
    tree_block = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend="fa2")
    tree_block.plan(query_indptr(n), query_indptr(n), shape.q_heads, shape.kv_heads, shape.head_dim,
                    custom_mask=torch.cat([t.flatten() for t in trees]).to(dev), q_data_type=dtype)  # fmt: skip
    chain_causal = paged_wrapper(chain, prefix + chain, causal=True)
    nodes_causal = paged_wrapper(n, prefix + n, causal=True)

    def split() -> torch.Tensor:
        out_prefix, lse_prefix = prefix_only.run(q, kv, return_lse=True)
        out_tree, lse_tree = tree_block.run(q, k_tree, v_tree, return_lse=True)
        return merge_state(out_prefix, lse_prefix, out_tree, lse_tree)[0]

    forms = {
        "full_mask": lambda: full.run(q, kv),
        "split": split,
        "chain_causal": lambda: chain_causal.run(q_chain, kv),
        "nodes_causal": lambda: nodes_causal.run(q, kv),
    }
    difference = float((forms["full_mask"]().float() - split().float()).abs().max())
    ms = {name: round(_graph_time_ms(call, repeats, replays=20), 4) for name, call in forms.items()}
    return {"bs": bs, "prefix": prefix, "n": n, "chain": chain, "ms_per_layer": ms,
            "max_abs_diff_split_vs_full_mask": difference}  # fmt: skip


def markdown(report: dict) -> str:
    meta = report["meta"]
    lines = [
        "# Tree-verify attention against context: the FULL custom mask vs prefix (no mask) + tree block, merged",
        "",
        f"{meta['date']} · commit {meta['commit']} · {meta['gpu']} · FlashInfer {meta['flashinfer']} (fa2) · "
        f"bf16 · N = {meta['n']} tree nodes (random trees), chain of {meta['chain']} for DFLASH · per layer, "
        f"median of 20 CUDA-graph replays of {meta['repeats']} calls",
        "",
        "| shape | bs | prefix | FULL mask us | split us | DFLASH chain causal us | N causal us | FULL / split | "
        "split / chain | max abs diff |",
        "|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in report["rows"]:
        ms = r["ms_per_layer"]
        lines.append(
            f"| {r['shape']} | {r['bs']} | {r['prefix']} | {ms['full_mask'] * 1e3:.1f} | {ms['split'] * 1e3:.1f} | "
            f"{ms['chain_causal'] * 1e3:.1f} | {ms['nodes_causal'] * 1e3:.1f} | {ms['full_mask'] / ms['split']:.2f}x | "
            f"{ms['split'] / ms['chain_causal']:.2f}x | {r['max_abs_diff_split_vs_full_mask']:.1e} |"
        )
    return "\n".join(lines) + "\n"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.verify_attention", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--batch-sizes", type=_ints, default=[1, 8])
    parser.add_argument("--prefix-lengths", type=_ints, default=[128, 2048, 8192, 32768])
    parser.add_argument("--nodes", type=int, default=33, help="tree nodes per request (budget + 1)")
    parser.add_argument("--chain", type=int, default=16, help="DFLASH's verify queries per request (its block)")
    parser.add_argument("--repeats", type=int, default=30, help="calls per graph (one per layer)")
    args = parser.parse_args()
    unknown = sorted(set(args.shapes.split(",")) - set(SHAPES))
    if unknown:
        parser.error(f"unknown shape(s) {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    import flashinfer

    rows = []
    for name in args.shapes.split(","):
        for bs in args.batch_sizes:
            for prefix in args.prefix_lengths:
                row = {"shape": name, **measure(SHAPES[name], bs, prefix, args.nodes, args.chain, args.repeats)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    report = {"meta": {"date": time.strftime("%Y-%m-%d"), "commit": checkout_commit(),
                       "gpu": torch.cuda.get_device_name(), "flashinfer": flashinfer.__version__, "n": args.nodes,
                       "chain": args.chain, "repeats": args.repeats}, "rows": rows}  # fmt: skip
    write_report(args.out, "verify_attention", report, markdown(report))


if __name__ == "__main__":
    main()
