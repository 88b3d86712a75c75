"""Benchmark of the DDTree tree-construction kernels on one GPU (budget: under 4 min on an H200).

Times, per call, median over repetitions:

* (a) per-depth log-softmax + top-K: Triton ``topk_logprobs`` vs ``torch.topk`` + logsumexp,
  for every (bs, B, V);
* (b) best-first expansion: Triton ``build_tree`` vs a batched plain-torch loop, and the
  authors' style CPU heap (device->host copy + ``tree_reference.reference_build_tree``);
* (c) verify tensors (links, positions, FULL mask, ancestor bits): Triton vs plain torch;
* (b+c) and the whole ``build_ddtree`` (a+b+c) as CUDA graphs.

GPU rows are timed eagerly and as a replayed ``torch.cuda.CUDAGraph`` (``triton.testing.do_bench``
medians, cold L2). Every configuration first checks that the Triton and plain-torch versions
agree (tokens picked, trees and verify tensors exactly), and records the result.

    python bench/tree_kernels.py --out results/tree_kernels

writes ``tree_kernels.json`` and ``tree_kernels.md`` to ``--out``. Target: (b+c) graph <= 30 us
at bs 1, B 64.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch
import triton

from sglang_ddtree.kernels.tree_build import build_tree
from sglang_ddtree.kernels.tree_topk import topk_logprobs, topk_workspace_numel
from sglang_ddtree.kernels.tree_verify_tensors import (
    VerifyTensors,
    build_verify_tensors,
    full_mask_numel,
)
from sglang_ddtree.tree.tree_ops import DDTreeTensors, build_ddtree
from sglang_ddtree.tree.tree_reference import reference_build_tree

TARGET_US = 30.0


# --- plain-torch baselines ------------------------------------------------------------------


def torch_topk_logprobs(logits: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The authors' GPU part: fp32 top-K and logsumexp (tie order among equal logits unspecified)."""
    x = logits.float()
    values, tokens = torch.topk(x, k, dim=-1)
    return values - torch.logsumexp(x, dim=-1, keepdim=True), tokens


def torch_build_tree(logq: torch.Tensor, tokens: torch.Tensor, budget: int):
    """Best-first expansion with batched torch ops, one step per node (same rules as the kernel:
    slot p = the candidate under parent p; argmax picks the first, i.e. lowest-parent, max).

    Candidates with a -inf score are treated as absent (fine for finite benchmark logits).
    """
    bs, depth_limit, k = logq.shape
    n, dev = budget + 1, logq.device
    rows = torch.arange(bs, device=dev)
    neg_inf = float("-inf")  # a Python scalar: a device tensor made here would be a host copy in capture
    cand = torch.full((bs, n), float("-inf"), device=dev)
    cand[:, 0] = logq[:, 0, 0]
    rank = torch.zeros((bs, n), dtype=torch.long, device=dev)
    cand_depth = torch.ones((bs, n), dtype=torch.long, device=dev)
    node_score = torch.zeros((bs, n), device=dev)
    parent = torch.empty((bs, budget), dtype=torch.int32, device=dev)
    token = torch.empty((bs, budget), dtype=torch.int64, device=dev)
    depth = torch.empty((bs, budget), dtype=torch.int32, device=dev)
    score_out = torch.empty((bs, budget), device=dev)
    for i in range(budget):
        p = cand.argmax(dim=1)
        s = cand[rows, p]
        found = s > neg_inf
        r, d = rank[rows, p], cand_depth[rows, p]
        parent[:, i] = torch.where(found, p, -1)
        token[:, i] = torch.where(found, tokens[rows, d - 1, r.clamp(max=k - 1)], 0)
        depth[:, i] = torch.where(found, d, 0)
        score_out[:, i] = torch.where(found, s, neg_inf)
        has_sibling = found & (r + 1 < k)
        sibling = node_score[rows, p] + logq[rows, d - 1, (r + 1).clamp(max=k - 1)]
        cand[rows, p] = torch.where(has_sibling, sibling, torch.where(found, neg_inf, cand[rows, p]))
        rank[rows, p] = r + 1
        has_child = found & (d < depth_limit)
        child = s + logq[rows, d.clamp(max=depth_limit - 1), 0]
        cand[:, i + 1] = torch.where(has_child, child, neg_inf)
        cand_depth[:, i + 1] = d + 1
        node_score[:, i + 1] = s
    return parent, token, depth, score_out


def torch_verify_tensors(parent, token, depth, roots, seq_len: int, depth_limit: int) -> Dict[str, torch.Tensor]:
    """Verify tensors with dense [bs, N, N] torch ops (all requests share ``seq_len``)."""
    bs, budget = parent.shape
    n, dev = budget + 1, parent.device
    par = torch.cat([torch.full((bs, 1), -1, device=dev, dtype=torch.long), parent.long()], 1)
    dep = torch.cat([torch.zeros((bs, 1), device=dev, dtype=torch.long), depth.long()], 1)
    nodes = torch.arange(n, device=dev)
    is_child = par[:, None, :] == nodes[None, :, None]  # [b, i, j]: parent[j] == i
    first_child = torch.where(is_child, nodes, n).min(-1).values
    is_sibling = (par[:, None, :] == par[:, :, None]) & (nodes > nodes[:, None]) & (par[:, :, None] >= 0)
    next_sibling = torch.where(is_sibling, nodes, n).min(-1).values
    ancestors = torch.zeros((bs, n, n), dtype=torch.bool, device=dev)
    current = nodes.expand(bs, n)
    for _ in range(depth_limit + 1):
        ancestors |= (nodes == current[..., None]) & (current[..., None] >= 0)
        current = torch.where(current >= 0, par.gather(1, current.clamp(min=0)), -1)
    words = triton.cdiv(n, 64)
    padded = torch.nn.functional.pad(ancestors, (0, words * 64 - n)).view(bs, n, words, 64).long()
    shifts = torch.arange(64, device=dev)
    prefix = torch.ones((bs, n, seq_len), dtype=torch.bool, device=dev)
    return {
        "draft_token": torch.cat([roots[:, None], token], 1).flatten(),
        "positions": (seq_len + dep).flatten(),
        "retrieve_index": torch.arange(bs * n, device=dev).view(bs, n),
        "retrieve_next_token": torch.where(first_child < n, first_child, -1),
        "retrieve_next_sibling": torch.where(next_sibling < n, next_sibling, -1),
        "custom_mask": torch.cat([prefix, ancestors], 2).flatten(),
        "ancestor_bits": (padded << shifts).sum(-1),
    }


# --- timing -----------------------------------------------------------------------------------


class Timer:
    def __init__(self, warmup_ms: int, rep_ms: int):
        self.warmup_ms, self.rep_ms = warmup_ms, rep_ms

    def gpu_us(self, fn: Callable[[], object]) -> float:
        return 1e3 * triton.testing.do_bench(fn, warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median")

    def graph_us(self, fn: Callable[[], object]) -> float:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return self.gpu_us(graph.replay)

    @staticmethod
    def cpu_us(fn: Callable[[], object], reps: int) -> float:
        samples = []
        for _ in range(reps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            samples.append(time.perf_counter() - start)
        return 1e6 * statistics.median(samples)


def make_logits(bs: int, depth: int, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """Drafter-like logits: noise plus one boosted token per depth, so trees are deep and bushy."""
    logits = torch.randn(bs, depth, vocab, device="cuda") * 2
    top = torch.randint(0, vocab, (bs, depth, 1), device="cuda")
    margin = 9 + 9 * torch.rand(bs, depth, 1, device="cuda")
    return logits.scatter_add(-1, top, margin).to(dtype)


# --- one configuration ------------------------------------------------------------------------


def bench_topk(timer: Timer, bs: int, budget: int, vocab: int, args) -> List[dict]:
    logits = make_logits(bs, args.depth, vocab, getattr(torch, args.dtype))
    k = min(budget, vocab)
    out_logq = torch.empty((bs, args.depth, k), device="cuda")
    out_tokens = torch.empty((bs, args.depth, k), dtype=torch.int64, device="cuda")
    workspace = torch.empty(topk_workspace_numel(bs * args.depth, vocab, k), dtype=torch.int64, device="cuda")

    def triton_call():
        topk_logprobs(logits, k, out_logprobs=out_logq, out_tokens=out_tokens, workspace=workspace)

    triton_call()
    torch_logq, _ = torch_topk_logprobs(logits, k)
    # An id outside [0, V) must read as a MISMATCH, not as a device-side assert in gather that
    # ends the whole run (and every later CUDA call of the process).
    bad_ids = int(((out_tokens < 0) | (out_tokens >= vocab)).sum())
    # Compare logits, not ids: torch.topk may order equal logits differently.
    picked = logits.float().gather(-1, out_tokens.clamp(0, vocab - 1))
    same = bad_ids == 0 and torch.equal(picked, torch.topk(logits.float(), k, dim=-1).values)
    close = torch.allclose(out_logq, torch_logq, rtol=1e-5, atol=1e-4)
    check = "ok" if same and close else "MISMATCH"
    common = dict(op="a_topk", bs=bs, budget=budget, vocab=vocab, check=check, bad_token_ids=bad_ids)
    return [
        dict(common, impl="triton", mode="eager", us=timer.gpu_us(triton_call)),
        dict(common, impl="triton", mode="graph", us=timer.graph_us(triton_call)),
        dict(common, impl="torch", mode="eager", us=timer.gpu_us(lambda: torch_topk_logprobs(logits, k))),
        dict(common, impl="torch", mode="graph", us=timer.graph_us(lambda: torch_topk_logprobs(logits, k))),
    ]


def bench_tree(timer: Timer, bs: int, budget: int, args) -> List[dict]:
    vocab = args.vocabs[0]  # (b) and (c) only see K = min(B, V) = B candidates per depth
    depth = args.depth
    logits = make_logits(bs, depth, vocab, getattr(torch, args.dtype))
    logq, tokens = topk_logprobs(logits, min(budget, vocab))
    seq_lens = torch.full((bs,), args.seq_len, dtype=torch.int64, device="cuda")
    roots = torch.randint(0, vocab, (bs,), device="cuda")
    tree = tuple(
        torch.empty((bs, budget), dtype=dtype, device="cuda")
        for dtype in (torch.int32, torch.int64, torch.int32, torch.float32)
    )
    verify = VerifyTensors.allocate(bs, budget, full_mask_numel(bs * args.seq_len, bs, budget), torch.device("cuda"))

    def build_call():
        build_tree(logq, tokens, budget, out=tree)

    def verify_call():
        build_verify_tensors(tree[0], tree[1], tree[2], roots, seq_lens, depth, out=verify)

    def both_call():
        build_call()
        verify_call()

    both_call()
    torch_tree = torch_build_tree(logq, tokens, budget)
    torch_verify = torch_verify_tensors(*tree[:3], roots, args.seq_len, depth)
    same_tree = all(torch.equal(a, b) for a, b in zip(tree, torch_tree))
    same_verify = all(torch.equal(getattr(verify, name), value) for name, value in torch_verify.items())
    common = dict(bs=bs, budget=budget, vocab=None, check="ok" if same_tree and same_verify else "MISMATCH")
    rows = [
        dict(common, op="b_build", impl="triton", mode="eager", us=timer.gpu_us(build_call)),
        dict(common, op="b_build", impl="triton", mode="graph", us=timer.graph_us(build_call)),
        dict(common, op="b_build", impl="torch", mode="eager",
             us=timer.gpu_us(lambda: torch_build_tree(logq, tokens, budget))),
        dict(common, op="b_build", impl="torch", mode="graph",
             us=timer.graph_us(lambda: torch_build_tree(logq, tokens, budget))),
        dict(common, op="b_build", impl="cpu_heap", mode="host",
             us=timer.cpu_us(lambda: reference_build_tree(logq.cpu(), tokens.cpu(), budget), args.cpu_reps)),
        dict(common, op="c_verify", impl="triton", mode="eager", us=timer.gpu_us(verify_call)),
        dict(common, op="c_verify", impl="triton", mode="graph", us=timer.graph_us(verify_call)),
        dict(common, op="c_verify", impl="torch", mode="eager",
             us=timer.gpu_us(lambda: torch_verify_tensors(*tree[:3], roots, args.seq_len, depth))),
        dict(common, op="c_verify", impl="torch", mode="graph",
             us=timer.graph_us(lambda: torch_verify_tensors(*tree[:3], roots, args.seq_len, depth))),
        dict(common, op="bc_build_verify", impl="triton", mode="graph", us=timer.graph_us(both_call)),
    ]
    return rows


def bench_pipeline(timer: Timer, bs: int, budget: int, vocab: int, args) -> dict:
    logits = make_logits(bs, args.depth, vocab, getattr(torch, args.dtype))
    seq_lens = torch.full((bs,), args.seq_len, dtype=torch.int64, device="cuda")
    roots = torch.randint(0, vocab, (bs,), device="cuda")
    out = DDTreeTensors.allocate(
        bs, args.depth, budget, vocab, full_mask_numel(bs * args.seq_len, bs, budget), torch.device("cuda")
    )
    us = timer.graph_us(lambda: build_ddtree(logits, budget, roots, seq_lens, out=out))
    return dict(op="abc_build_ddtree", impl="triton", mode="graph", bs=bs, budget=budget, vocab=vocab, check="-", us=us)


# --- report -----------------------------------------------------------------------------------


def _lookup(rows: List[dict], **key) -> Optional[float]:
    for row in rows:
        if all(row.get(name) == value for name, value in key.items()):
            return row["us"]
    return None


def _fmt(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:,.1f}"


def markdown(rows: List[dict], args) -> str:
    lines = [
        "# DDTree tree kernels (us per call, median)",
        "",
        f"L = {args.depth} draft depths, logits {args.dtype}, seq_len {args.seq_len} (FULL mask prefix), "
        f"K = min(B, V). graph = CUDA-graph replay.",
        "",
        "## (a) log-softmax + top-K",
        "",
        "| bs | B | V | triton | triton graph | torch | torch graph | a+b+c graph | check |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|:--|",
    ]
    for bs in args.bs:
        for budget in args.budgets:
            for vocab in args.vocabs:
                key = dict(op="a_topk", bs=bs, budget=budget, vocab=vocab)
                check = next((r["check"] for r in rows if all(r.get(k) == v for k, v in key.items())), "-")
                lines.append(
                    f"| {bs} | {budget} | {vocab} | {_fmt(_lookup(rows, **key, impl='triton', mode='eager'))} "
                    f"| {_fmt(_lookup(rows, **key, impl='triton', mode='graph'))} "
                    f"| {_fmt(_lookup(rows, **key, impl='torch', mode='eager'))} "
                    f"| {_fmt(_lookup(rows, **key, impl='torch', mode='graph'))} "
                    f"| {_fmt(_lookup(rows, op='abc_build_ddtree', bs=bs, budget=budget, vocab=vocab))} | {check} |"
                )
    lines += [
        "",
        "## (b) best-first expansion and (c) verify tensors",
        "",
        "| bs | B | b triton | b triton graph | b torch | b torch graph | b CPU heap | c triton | c triton graph "
        "| c torch | c torch graph | b+c graph | check |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:--|",
    ]
    for bs in args.bs:
        for budget in args.budgets:
            cells = [
                _lookup(rows, op=op, bs=bs, budget=budget, impl=impl, mode=mode)
                for op, impl, mode in [
                    ("b_build", "triton", "eager"), ("b_build", "triton", "graph"),
                    ("b_build", "torch", "eager"), ("b_build", "torch", "graph"),
                    ("b_build", "cpu_heap", "host"),
                    ("c_verify", "triton", "eager"), ("c_verify", "triton", "graph"),
                    ("c_verify", "torch", "eager"), ("c_verify", "torch", "graph"),
                    ("bc_build_verify", "triton", "graph"),
                ]
            ]
            check = next(
                (r["check"] for r in rows if r["op"] == "b_build" and r["bs"] == bs and r["budget"] == budget), "-"
            )
            lines.append(f"| {bs} | {budget} | " + " | ".join(_fmt(c) for c in cells) + f" | {check} |")
    target = _lookup(rows, op="bc_build_verify", bs=1, budget=64)
    if target is not None:
        verdict = "met" if target <= TARGET_US else "NOT met"
        lines += ["", f"Target b + c <= {TARGET_US:.0f} us at bs 1, B 64 (graph): {target:.1f} us, {verdict}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for tree_kernels.{json,md}")
    parser.add_argument("--bs", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    parser.add_argument("--vocabs", type=int, nargs="+", default=[49152, 151936, 248320])
    parser.add_argument("--depth", type=int, default=15, help="draft positions L (block size - 1)")
    parser.add_argument("--seq-len", type=int, default=2048, help="committed length of every request")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--warmup-ms", type=int, default=10)
    parser.add_argument("--rep-ms", type=int, default=40)
    parser.add_argument("--cpu-reps", type=int, default=3)
    args = parser.parse_args()
    assert torch.cuda.is_available(), "this benchmark needs a CUDA GPU"
    torch.manual_seed(0)
    timer = Timer(args.warmup_ms, args.rep_ms)
    rows: List[dict] = []
    start = time.perf_counter()

    def progress(label: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f}s] {label}", flush=True)

    for bs in args.bs:
        for budget in args.budgets:
            progress(f"bs={bs} B={budget}: build + verify")
            rows += bench_tree(timer, bs, budget, args)
            for vocab in args.vocabs:
                progress(f"bs={bs} B={budget} V={vocab}: top-K + pipeline")
                rows += bench_topk(timer, bs, budget, vocab, args)
                rows.append(bench_pipeline(timer, bs, budget, vocab, args))
            torch.cuda.empty_cache()

    args.out.mkdir(parents=True, exist_ok=True)
    meta = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=triton.__version__,
        depth=args.depth,
        seq_len=args.seq_len,
        dtype=args.dtype,
        seconds=round(time.perf_counter() - start, 1),
    )
    (args.out / "tree_kernels.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    report = markdown(rows, args)
    (args.out / "tree_kernels.md").write_text(report)
    mismatches = sorted({(r["op"], r["bs"], r["budget"], r["vocab"]) for r in rows if r["check"] == "MISMATCH"})
    progress(f"done; wrote {args.out}/tree_kernels.{{json,md}}; mismatches: {mismatches or 'none'}")
    print(report)


if __name__ == "__main__":
    main()
