"""One GDN layer's tree verify + commit at Qwen3.6-27B's shape: SGLang 0.5.17's snapshot path against
``kernels/gdn_tree.py`` and ``kernels/gdn_tree_conv.py`` (issue 17), on one GPU.

SGLang: ``fused_sigmoid_gating_delta_rule_update`` with ``retrieve_parent_token`` writes every node's fp32 state
into an intermediate buffer; its commit copies the last accepted node's state into the pool. Ours: the WY-form
verify from the root state (its factor kernel also timed alone: the part the values do not enter; and, where it
sets the root apart, the same verify with the root in the rows), then the commit builds the accepted path's
state. The conv before it likewise: SGLang's ``causal_conv1d_update`` with the tree's links writes every node's
bf16 window, its commit copies one; ours writes every node's input and its commit assembles the accepted node's
window. Per (bs, T), median of ``triton.testing.do_bench``; the per-request scratch each needs; and the largest
differences between the two (outputs, committed states and windows) on the same bf16 inputs and fp32 states.

    python -m bench.gdn_tree_kernel --out bench/results/gdn_tree_kernel [--launch-configs 32x4,64x8,32x8:tf32x3]

``--launch-configs BVxWARPS[:PRECISION],...`` also times our verify and commit at each launch (value columns per
program of the apply and commit kernels x their warps; the products in IEEE fp32, the default, or three-pass
TF32 on tensor cores), with each launch's largest output difference from SGLang's beside its times.

Shapes from Qwen3.6-27B's config (see ``bench/hybrid_verify_cost.py``): 16 key heads and 48 value heads of 128
at TP 1 (``--tp 2`` halves the heads); trees random with parents among the last 4 nodes and at most 15 levels
below the root, as a DDTree drafted from a block of 16 is (bushy; uncapped in RESULTS runs 66-70, whose trees
at T = 33 and 65 went up to 16 and 30 levels deep), or chains.
"""

from __future__ import annotations

import argparse
import time

import torch
import triton.testing
from triton.runtime.errors import OutOfResources

from bench.provenance import checkout_commit, write_report
from sglang_ddtree.tree.gdn_tree_reference import random_parents
from sglang_ddtree.tree.tree_reference import tree_links
from sglang_ddtree.kernels.gdn_tree_conv import gdn_tree_conv, gdn_tree_conv_commit
from sglang_ddtree.kernels.gdn_tree import (
    DEFAULT_DOT_PRECISION,
    DOT_PRECISIONS,
    build_factors,
    gdn_tree_commit,
    gdn_tree_verify,
    root_apart_pads_fewer_rows,
    workspace_numel,
)

KEY_HEADS, VALUE_HEADS, HEAD_DIM, CONV_WIDTH = 16, 48, 128, 4
DDTREE_MAX_DEPTH = 15  # levels below the root of a tree drafted from a block of 16 (z-lab's Qwen3.6 drafters)
MIB = 1 << 20


def random_tree(T: int, shape: str, g: torch.Generator) -> list[int]:
    if shape == "chain":
        return [-1] + list(range(T - 1))
    return random_parents(T, g, max_depth=DDTREE_MAX_DEPTH)


def launch_configs(text: str) -> list[tuple[int, int, str]]:
    """argparse type: ``32x4,16x8:tf32x3`` -> ``[(32, 4, "ieee"), (16, 8, "tf32x3")]`` (value columns per
    program, warps, the products' precision)."""
    configs = []
    for item in (item for item in text.split(",") if item):
        launch, colon, precision = item.partition(":")
        try:
            block_v, warps = (int(x) for x in launch.split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{item}' is not BVxWARPS[:PRECISION], e.g. 64x8:tf32x3") from None
        if block_v < 16 or block_v & (block_v - 1) or warps not in (1, 2, 4, 8, 16):
            raise argparse.ArgumentTypeError(f"'{item}': BV a power of two >= 16, WARPS one of 1, 2, 4, 8, 16")
        if (precision or ("" if colon else "ieee")) not in DOT_PRECISIONS:
            raise argparse.ArgumentTypeError(f"'{item}': PRECISION one of {', '.join(DOT_PRECISIONS)}")
        configs.append((block_v, warps, precision or "ieee"))
    if not configs:
        raise argparse.ArgumentTypeError("give at least one BVxWARPS[:PRECISION], e.g. 32x4")
    return configs


def launch_name(block_v: int, warps: int, precision: str) -> str:
    return f"{block_v}x{warps}" + ("" if precision == "ieee" else f":{precision}")


def measure(bs: int, T: int, shape: str, tp: int, launches: list[tuple[int, int, str]] = ()) -> dict:
    from sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent import fused_sigmoid_gating_delta_rule_update

    H, HV, K = KEY_HEADS // tp, VALUE_HEADS // tp, HEAD_DIM
    g = torch.Generator().manual_seed(bs * 1000 + T)
    parents = torch.tensor([random_tree(T, shape, g) for _ in range(bs)])
    dev = "cuda"
    q, k = (torch.randn(bs, T, H, K, device=dev, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(bs, T, HV, K, device=dev, dtype=torch.bfloat16)
    a, b = (torch.randn(bs, T, HV, device=dev, dtype=torch.bfloat16) for _ in range(2))
    A_log, dt_bias = torch.randn(HV, device=dev) * 0.5, torch.randn(HV, device=dev) * 0.5
    slots = torch.arange(bs, device=dev) * 2  # every other slot: the pool is shared
    pool = torch.randn(2 * bs, HV, K, K, device=dev) * 0.1
    snapshots = torch.empty(bs, T, HV, K, K, device=dev)
    workspace = torch.empty(bs, workspace_numel(T, HV, K, K), device=dev)
    parents_d, last = parents.to(torch.int32).to(dev), torch.full((bs,), T - 1, device=dev)
    cu_seqlens = torch.arange(0, bs * T + 1, T, device=dev)
    scale = K**-0.5

    def sglang_verify() -> torch.Tensor:
        return fused_sigmoid_gating_delta_rule_update(
            A_log=A_log, a=a.view(bs * T, HV), dt_bias=dt_bias, softplus_beta=1.0, softplus_threshold=20.0,
            q=q.view(1, bs * T, H, K), k=k.view(1, bs * T, H, K), v=v.view(1, bs * T, HV, K), b=b.view(bs * T, HV),
            initial_state_source=pool, initial_state_indices=slots, scale=scale, use_qk_l2norm_in_kernel=True,
            cu_seqlens=cu_seqlens, disable_state_update=True, intermediate_states_buffer=snapshots,
            intermediate_state_indices=torch.arange(bs, device=dev), cache_steps=T, retrieve_parent_token=parents_d,
        )  # fmt: skip

    def ours_verify() -> torch.Tensor:
        return gdn_tree_verify(q, k, v, a, b, A_log, dt_bias, pool, slots, parents_d, workspace,
                               torch.arange(bs, device=dev), scale)  # fmt: skip

    base = pool.clone()
    sglang_out = sglang_verify().view(bs, T, HV, K)
    sglang_state = snapshots[torch.arange(bs, device=dev), last].clone()
    ours_out = ours_verify()
    gdn_tree_commit(pool[None], workspace[None], slots, last, T, source_indices=slots)
    ours_state = pool[slots].clone()
    pool.copy_(base)

    def ours_factor() -> torch.Tensor:  # the verify's first kernel alone: what the values do not enter
        return build_factors(q, k, a, b, A_log, dt_bias, parents_d, workspace, torch.arange(bs, device=dev), HV,
                             v.shape[-1], scale, 1.0, 20.0, T, DEFAULT_DOT_PRECISION)  # fmt: skip

    def sglang_commit() -> None:
        pool[slots] = snapshots[torch.arange(bs, device=dev), last]

    def ours_commit() -> None:
        gdn_tree_commit(pool[None], workspace[None], slots, last, T, source_indices=slots)

    def ours_verify_root_in_rows() -> torch.Tensor:  # the A/B of setting the root apart, where the kernel does
        return gdn_tree_verify(q, k, v, a, b, A_log, dt_bias, pool, slots, parents_d, workspace,
                               torch.arange(bs, device=dev), scale, root_apart=False)  # fmt: skip

    timed = [("sglang_verify", sglang_verify), ("sglang_commit", sglang_commit), ("ours_verify", ours_verify),
             ("ours_factor", ours_factor), ("ours_commit", ours_commit)]
    if root_apart_pads_fewer_rows(T):
        timed.append(("ours_verify_root_in_rows", ours_verify_root_in_rows))
    times = {name: triton.testing.do_bench(fn, return_mode="median") for name, fn in timed}
    swept = {}
    for block_v, warps, precision in launches:
        launch = {"block_v": block_v, "num_warps": warps, "dot_precision": precision}
        pool.copy_(base)  # the commits timed above left their states in the requests' slots
        try:
            out = gdn_tree_verify(q, k, v, a, b, A_log, dt_bias, pool, slots, parents_d, workspace,
                                  torch.arange(bs, device=dev), scale, **launch)  # fmt: skip
            gdn_tree_commit(pool[None], workspace[None], slots, last, T, source_indices=slots, block_v=block_v,
                            num_warps=warps)  # fmt: skip
        except OutOfResources as error:  # e.g. three-pass TF32 on [128, 128] tiles: over Hopper's shared memory
            swept[launch_name(block_v, warps, precision)] = {"error": str(error).split(".")[0]}
            continue
        state_diff = float((pool[slots] - sglang_state).abs().max())
        pool.copy_(base)
        verify_ms = triton.testing.do_bench(lambda: gdn_tree_verify(
            q, k, v, a, b, A_log, dt_bias, pool, slots, parents_d, workspace, torch.arange(bs, device=dev), scale,
            **launch), return_mode="median")  # fmt: skip
        commit_ms = triton.testing.do_bench(lambda: gdn_tree_commit(
            pool[None], workspace[None], slots, last, T, source_indices=slots, block_v=block_v, num_warps=warps),
            return_mode="median")  # fmt: skip
        swept[launch_name(block_v, warps, precision)] = {
            "verify": round(verify_ms, 4), "commit": round(commit_ms, 4),
            "max_abs_diff_output": float((out.float() - sglang_out.float()).abs().max()),
            "max_abs_diff_state": state_diff,
        }  # fmt: skip
    pool.copy_(base)
    return {
        "bs": bs, "T": T, "tree": shape, "tp": tp, "conv": measure_conv(bs, T, parents, tp),
        "ms": {n: round(t, 4) for n, t in times.items()},
        "launch_ms": swept,
        "scratch_mib_per_request": {"sglang": round(T * HV * K * K * 4 / MIB, 3),
                                    "ours": round(workspace_numel(T, HV, K, K) * 4 / MIB, 3)},  # fmt: skip
        "max_abs_diff": {"output": float((ours_out.float() - sglang_out.float()).abs().max()),
                         "committed_state": float((ours_state - sglang_state).abs().max())},  # fmt: skip
    }  # fmt: skip


def measure_conv(bs: int, T: int, parents: torch.Tensor, tp: int) -> dict:
    """The layer's conv over the same trees: SGLang's tree conv + window copy against ours + window assembly."""
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update

    dim = (2 * KEY_HEADS + VALUE_HEADS) * HEAD_DIM // tp  # over [q; k; v]
    dev, W = "cuda", CONV_WIDTH
    x = torch.randn(bs, T, dim, device=dev, dtype=torch.bfloat16).transpose(1, 2)  # SGLang's view of the tokens
    weight = torch.randn(dim, W, device=dev, dtype=torch.bfloat16) * 0.5
    slots = torch.arange(bs, device=dev, dtype=torch.int32) * 2
    pool = torch.randn(2 * bs, dim, W - 1, device=dev, dtype=torch.bfloat16)
    links = [tree_links(tree) for tree in parents.tolist()]
    next_token, next_sibling = (torch.tensor([link[i] for link in links], device=dev) for i in (0, 1))
    rows, last = torch.arange(bs, device=dev, dtype=torch.int32), torch.full((bs,), T - 1, device=dev)
    windows = torch.empty(bs, T, dim, W - 1, device=dev, dtype=torch.bfloat16)
    inputs = torch.empty(bs, T * dim, device=dev, dtype=torch.bfloat16)
    sglang_parents, our_parents = (torch.empty(bs, T, device=dev, dtype=torch.int64) for _ in range(2))
    base = pool.clone()

    def sglang_conv() -> torch.Tensor:
        return causal_conv1d_update(x, pool, weight, None, "silu", conv_state_indices=slots,
                                    intermediate_conv_window=windows, intermediate_state_indices=rows,
                                    retrieve_next_token=next_token, retrieve_next_sibling=next_sibling,
                                    retrieve_parent_token=sglang_parents)  # fmt: skip

    def sglang_commit() -> None:
        pool[slots.long()] = windows[torch.arange(bs, device=dev), last]

    def ours_conv() -> torch.Tensor:
        return gdn_tree_conv(x, pool, weight, None, "silu", slots, next_token, next_sibling, our_parents, inputs,
                             rows)  # fmt: skip

    def ours_commit() -> None:
        gdn_tree_conv_commit(pool[None], inputs[None], our_parents[None], slots, last, source_indices=slots)

    sglang_out = sglang_conv()  # its verify also overwrites the root window, which its commit then replaces
    sglang_commit()
    sglang_window = pool[slots.long()].clone()
    pool.copy_(base)
    ours_out = ours_conv()
    ours_commit()
    ours_window = pool[slots.long()].clone()
    times = {}
    for name, fn in (("sglang_conv", sglang_conv), ("sglang_conv_commit", sglang_commit), ("ours_conv", ours_conv),
                     ("ours_conv_commit", ours_commit)):  # fmt: skip
        pool.copy_(base)
        times[name] = round(triton.testing.do_bench(fn, return_mode="median"), 4)
    return {
        "ms": times,
        "scratch_mib_per_request": {"sglang": round(T * dim * (W - 1) * 2 / MIB, 3),
                                    "ours": round(T * dim * 2 / MIB, 3)},
        "max_abs_diff": {"output": float((ours_out.float() - sglang_out.float()).abs().max()),
                         "committed_window": float((ours_window.float() - sglang_window.float()).abs().max())},
    }  # fmt: skip


def markdown(report: dict) -> str:
    meta = report["meta"]
    lines = [
        "# One GDN layer's tree verify + commit: SGLang's snapshots vs the WY form from the root state",
        "",
        f"{meta['date']} · commit {meta['commit']} · {meta['gpu']} · {KEY_HEADS // meta['tp']} key / "
        f"{VALUE_HEADS // meta['tp']} value heads of {HEAD_DIM} (TP {meta['tp']}) · bf16 inputs, fp32 states",
        "",
        "| tree | bs | T | SGLang verify ms | + commit | ours verify ms | of which factor | + commit | ratio | scratch "
        "MiB / request SGLang / ours | max abs diff out / state | ours verify, root in rows |",
        "|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in report["rows"]:
        ms, mem, diff = r["ms"], r["scratch_mib_per_request"], r["max_abs_diff"]
        theirs, ours = ms["sglang_verify"] + ms["sglang_commit"], ms["ours_verify"] + ms["ours_commit"]
        factor = f"{ms['ours_factor']:.3f}" if "ours_factor" in ms else "–"  # not timed before 2026-12-04's last run
        # timed where the root is set apart (from 2026-12-05): the same verify with the root in the rows
        in_rows = f"{ms['ours_verify_root_in_rows']:.3f}" if "ours_verify_root_in_rows" in ms else "–"
        lines.append(f"| {r['tree']} | {r['bs']} | {r['T']} | {ms['sglang_verify']:.3f} | {ms['sglang_commit']:.3f} | "
                     f"{ms['ours_verify']:.3f} | {factor} | {ms['ours_commit']:.3f} | {theirs / ours:.2f}x | "
                     f"{mem['sglang']:.1f} / {mem['ours']:.2f} | {diff['output']:.2e} / {diff['committed_state']:.2e} | "
                     f"{in_rows} |")
    convs = [r for r in report["rows"] if "conv" in r]  # timed from 2026-12-05
    if convs:
        lines += ["", "The conv before it, ms (verify / commit; SGLang writes a window per node, ours an input):", "",
                  "| tree | bs | T | SGLang conv | + commit | ours conv | + commit | ratio | scratch MiB / request "
                  "SGLang / ours | max abs diff out / window |", "|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
        for r in convs:
            ms, mem, diff = r["conv"]["ms"], r["conv"]["scratch_mib_per_request"], r["conv"]["max_abs_diff"]
            theirs, ours = ms["sglang_conv"] + ms["sglang_conv_commit"], ms["ours_conv"] + ms["ours_conv_commit"]
            lines.append(f"| {r['tree']} | {r['bs']} | {r['T']} | {ms['sglang_conv']:.3f} | "
                         f"{ms['sglang_conv_commit']:.3f} | {ms['ours_conv']:.3f} | {ms['ours_conv_commit']:.3f} | "
                         f"{theirs / ours:.2f}x | {mem['sglang']:.2f} / {mem['ours']:.2f} | "
                         f"{diff['output']:.2e} / {diff['committed_window']:.2e} |")
    swept = [r for r in report["rows"] if r.get("launch_ms")]
    if swept:
        names = list(swept[0]["launch_ms"])
        lines += ["", "Our verify / commit ms per launch (value columns per program x warps[:products' precision]; "
                  "in brackets the largest output / committed-state difference from SGLang's):", "",
                  "| tree | bs | T | " + " | ".join(names) + " |", "|:--|--:|--:|" + "--:|" * len(names)]
        for r in swept:
            cells = [launch_cell(r["launch_ms"][n]) for n in names]
            lines.append(f"| {r['tree']} | {r['bs']} | {r['T']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def launch_cell(times: dict) -> str:
    if "error" in times:
        return "does not launch"
    cell = f"{times['verify']:.3f} / {times['commit']:.3f}"
    if "max_abs_diff_output" not in times:  # reports from before the differences were recorded
        return cell
    return cell + f" ({times['max_abs_diff_output']:.1e} / {times['max_abs_diff_state']:.1e})"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gdn_tree_kernel", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tp", type=int, default=1, choices=(1, 2))
    parser.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    parser.add_argument("--widths", type=lambda s: [int(x) for x in s.split(",")], default=[8, 16, 33, 65])
    parser.add_argument("--launch-configs", type=launch_configs, default=[],
                        help="also time our kernels at these launches, BVxWARPS[:PRECISION],... (e.g. "
                        "32x4,64x8,32x8:tf32x3)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    report = {"meta": {"date": time.strftime("%Y-%m-%d"), "commit": checkout_commit(),
                       "gpu": torch.cuda.get_device_name(), "tp": args.tp}, "rows": []}  # fmt: skip
    for shape in ("bushy", "chain"):
        for bs in args.batch_sizes:
            for T in (T for T in args.widths if not (shape == "chain" and T == 65)):
                report["rows"].append(measure(bs, T, shape, args.tp, args.launch_configs))
                # Written after every row: a run cut short by its machine's time limit keeps what it measured.
                write_report(args.out, "gdn_tree_kernel", report, markdown(report))


if __name__ == "__main__":
    main()
