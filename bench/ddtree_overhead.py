"""Step time of DDTree's machinery vs built-in DFLASH (and AR) on tiny random models, one GPU.

Random weights make drafts (almost) never accepted, so every algorithm commits ~1 token per step and the
step time is the fixed cost of its decode step: AR's forward; DFLASH's drafter pass + chain verify of
``block`` tokens; DDTree's drafter pass + tree build + tree verify of ``budget + 1`` nodes. DDTree runs at the
verify width of DFLASH (``budget = block - 1``) and at budgets 16, 32 and 64.

All servers are started side by side through ``python -m sglang_ddtree.launch`` with CUDA graphs on, then
measured one after the other: for each batch size, ``bs`` concurrent greedy requests of ``--new-tokens``
tokens; step time = wall time / verify steps of the slowest request (AR: / tokens). Median over
``--repeats``. DDTree servers run with ``SGLANG_DDTREE_PROFILE_STEPS=1`` (CUDA events, no host sync): the
second table splits their GPU step time into the phases of ``sglang_ddtree.profiling.ddtree_step_profile``.

    python bench/ddtree_overhead.py --models /tmp/tiny_models --out bench/results/ddtree_overhead

writes ``ddtree_overhead.json`` and ``ddtree_overhead.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from sglang_ddtree.profiling.ddtree_step_profile import PHASES, PROFILE_STEPS_ENV, phase_means, server_step_profile
from sglang_ddtree.serving import launched_server

COMMON_FLAGS = [
    "--context-length", "4096",
    "--max-total-tokens", "65536",
    "--max-running-requests", "8",
    "--cuda-graph-max-bs", "8",
    "--mem-fraction-static", "0.08",
    "--sampling-backend", "pytorch",
    "--grammar-backend", "none",
    "--disable-radix-cache",
]  # fmt: skip


def post(url: str, payload: dict | None = None, timeout: float = 600) -> dict:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def measure(url: str, bs: int, new_tokens: int, prompt_len: int) -> dict:
    params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    prompts = [[(13 * i + j) % 400 + 10 for j in range(prompt_len)] for i in range(bs)]
    start = time.perf_counter()
    with ThreadPoolExecutor(bs) as pool:
        outs = list(pool.map(lambda ids: post(url + "/generate", {"input_ids": ids, "sampling_params": params}), prompts))
    wall = time.perf_counter() - start
    steps = max(o["meta_info"].get("spec_verify_ct") or len(o["output_ids"]) for o in outs)
    tokens = sum(len(o["output_ids"]) for o in outs)
    accept = tokens / sum(o["meta_info"].get("spec_verify_ct") or len(o["output_ids"]) for o in outs)
    return {"wall_s": wall, "steps": steps, "step_ms": 1000 * wall / steps, "tok_s": tokens / wall, "accept_len": accept}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="/tmp/tiny_models", help="tests/tiny_models.py --out folder")
    parser.add_argument("--out", required=True)
    parser.add_argument("--attention-backend", default="flashinfer")
    parser.add_argument("--block-size", type=int, default=8, help="the drafter's block size (tiny_models: 8)")
    parser.add_argument("--budgets", default="16,32,64")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    target = ["--model-path", f"{args.models}/qwen3"]
    drafter = ["--draft-model-path", f"{args.models}/dflash"]
    budgets = [args.block_size - 1] + [int(b) for b in args.budgets.split(",")]
    configs = {"ar": ["--algo", "ar", *target], "dflash": ["--algo", "dflash", *target, *drafter]}
    configs.update({f"ddtree B={b}": ["--algo", "ddtree", *target, *drafter, "--budget", str(b)] for b in budgets})
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]

    rows = []
    t0 = time.perf_counter()
    with ExitStack() as stack, ThreadPoolExecutor(len(configs)) as pool:
        def start(item):
            name, config = item
            log = out / f"server_{name.replace(' ', '_').replace('=', '')}.log"
            flags = [*config, "--attention-backend", args.attention_backend, *COMMON_FLAGS]
            env = {PROFILE_STEPS_ENV: "1"} if name.startswith("ddtree") else {}
            return name, stack.enter_context(launched_server(flags, log_path=str(log), env=env, ready_timeout=480))

        urls = dict(pool.map(start, configs.items()))
        print(f"[{time.perf_counter() - t0:6.1f}s] {len(urls)} servers up", flush=True)
        for name, url in urls.items():
            info = post(url + "/server_info")
            verify_width = info.get("speculative_num_draft_tokens") or 1
            for bs in batch_sizes:
                measure(url, bs, 16, args.prompt_len)  # warm-up
                before = server_step_profile(url)
                runs = [measure(url, bs, args.new_tokens, args.prompt_len) for _ in range(args.repeats)]
                row = {"algo": name, "verify_width": verify_width, "bs": bs,
                       **{k: statistics.median(r[k] for r in runs) for k in runs[0]}}  # fmt: skip
                if before is not None:
                    row["phase_ms"] = phase_means(before, server_step_profile(url))
                rows.append(row)
                print(f"[{time.perf_counter() - t0:6.1f}s] {name} bs={bs}: {row['step_ms']:.3f} ms/step, "
                      f"accept {row['accept_len']:.3f}", flush=True)  # fmt: skip

    dflash = {r["bs"]: r["step_ms"] for r in rows if r["algo"] == "dflash"}
    meta = {"backend": args.attention_backend, "block_size": args.block_size, "new_tokens": args.new_tokens,
            "prompt_len": args.prompt_len, "repeats": args.repeats}  # fmt: skip
    (out / "ddtree_overhead.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [
        "# DDTree decode-step overhead vs DFLASH (tiny random models, acceptance ~1)", "",
        f"Backend {args.attention_backend}, bf16, CUDA graphs on, drafter block {args.block_size}, "
        f"{args.new_tokens} new tokens after a {args.prompt_len}-token prompt, median of {args.repeats}.", "",
        "| algo | verify width | bs | step (ms) | vs DFLASH | tok/s | accept len |",
        "|:--|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['algo']} | {r['verify_width']} | {r['bs']} | {r['step_ms']:.3f} | "
                     f"{r['step_ms'] / dflash[r['bs']]:.2f}x | {r['tok_s']:.0f} | {r['accept_len']:.3f} |")  # fmt: skip
    lines += ["", "DDTree GPU time per step by phase (ms; CUDA events, including the GPU waiting for launches):", "",
              "| algo | bs | " + " | ".join(PHASES) + " | sum |", "|:--|---:|" + "---:|" * (len(PHASES) + 1)]  # fmt: skip
    for r in rows:
        if r.get("phase_ms"):
            cells = " | ".join(f"{r['phase_ms'][p]:.3f}" for p in PHASES)
            lines.append(f"| {r['algo']} | {r['bs']} | {cells} | {sum(r['phase_ms'].values()):.3f} |")
    (out / "ddtree_overhead.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
