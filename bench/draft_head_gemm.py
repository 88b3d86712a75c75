"""The tree head's LM-head product at the reference user's shape, in the forms the head could compute it.

Each draft step multiplies the drafter's block states (``[bs, 15, H]``: the 15 drafted positions of a 16-token
block) by the target's LM head ``[V, H]`` (``ddtree_draft_head.py``). In run 80's traces (Qwen3.6-27B's shape, H =
5,120, V = 248,320, an H100, ``tests/gpu/RESULTS.md``) cuBLAS ran that product as one persistent kernel of 512 x 16
tiles on 132 CTAs: 0.85 ms at batch 1 and 6.79 ms at batch 8, the 2.5 GB of weights read once per 16 tokens, and at
16 requests the draft phase was 17.4 ms of a 53 ms step. This times the product in each form, every form checked
against the first on the same inputs, so that the head's form is chosen from a measurement:

* ``matmul``: ``hidden @ W[:V].T`` on the strided ``[bs, 15, H]`` view, as the head did until run 86 (torch runs
  it as ``bmm``: one product per request, each reading the whole weight);
* ``weight_first``: ``(W[:V] @ hidden.T).T`` made contiguous (the same product with the operands' roles swapped);
* ``padded_M``: the tokens as one ``[bs * 15, H]`` matrix padded to a multiple of M rows, then the padding's logits
  dropped (cuBLAS picks its kernel by the shape: the target's own LM head over 264 verify tokens ran as 256 x 136
  tiles in 0.97 ms in the same trace); ``padded_1`` is the head's product since run 86 (``lm_head_logits``), which
  no padding beat at 1-32 requests in run 89;
* ``vocab_chunks_N``: ``N`` products, one per block of the vocabulary's rows (weight first, into row blocks of one
  ``[V, tokens]`` output, then made ``[tokens, V]``), so that a block's weights can stay in L2 while the token tiles
  re-read them.

    python -m bench.draft_head_gemm --out OUT [--batch-sizes 1,2,4,8,16,32] [--pad-tokens-to 1,128,256]

On a machine without CUDA it runs on the CPU (for its tests, at small shapes).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from bench.provenance import checkout_commit, write_report
from sglang_ddtree.cli import OneLineArgumentParser, int_list
from sglang_ddtree.speculative.ddtree_draft_head import lm_head_logits

DRAFTED = 15  # a 16-token block's drafted positions


Form = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def forms(chunks: tuple[int, ...], pads: tuple[int, ...]) -> dict[str, Form]:
    """name -> f(block_states [bs, 16, H], weight [V, H]) -> logits [bs, 15, V]."""

    def matmul(states: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return torch.matmul(states[:, 1:, :], weight.t())

    def weight_first(states: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        bs = states.shape[0]
        tokens = states[:, 1:, :].reshape(bs * DRAFTED, -1)
        return torch.matmul(weight, tokens.t()).t().contiguous().view(bs, DRAFTED, -1)

    def padded(multiple: int) -> Form:
        def run(states: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            bs, _, hidden = states.shape
            rows = states[:, 1:, :].reshape(bs * DRAFTED, hidden)
            padding = -rows.shape[0] % multiple
            logits = lm_head_logits(F.pad(rows, (0, 0, 0, padding)) if padding else rows, weight)
            return logits[: bs * DRAFTED].view(bs, DRAFTED, -1)

        return run

    def vocab_chunks(count: int) -> Form:
        def run(states: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            bs = states.shape[0]
            tokens = states[:, 1:, :].reshape(bs * DRAFTED, -1)
            out = tokens.new_empty((weight.shape[0], bs * DRAFTED))  # row blocks of it are contiguous
            for block, rows in zip(weight.tensor_split(count), out.tensor_split(count)):
                torch.matmul(block, tokens.t(), out=rows)
            return out.t().contiguous().view(bs, DRAFTED, -1)

        return run

    return {"matmul": matmul, "weight_first": weight_first, **{f"padded_{m}": padded(m) for m in pads},
            **{f"vocab_chunks_{count}": vocab_chunks(count) for count in chunks}}  # fmt: skip


def time_ms(fn: Callable[[], torch.Tensor], device: torch.device, repeats: int) -> float:
    if device.type == "cuda":
        import triton

        return float(triton.testing.do_bench(fn, return_mode="median"))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def measure(batch_sizes: list[int], hidden: int, vocab: int, chunks: tuple[int, ...], pads: tuple[int, ...],
            repeats: int = 5) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    generator = torch.Generator(device=device).manual_seed(0)
    weight = torch.randn(vocab, hidden, device=device, dtype=dtype, generator=generator) / hidden**0.5
    rows = []
    for bs in batch_sizes:
        states = torch.randn(bs, DRAFTED + 1, hidden, device=device, dtype=dtype, generator=generator)
        reference = None
        cells = {}
        for name, form in forms(chunks, pads).items():
            logits = form(states, weight)
            reference = logits if reference is None else reference
            cells[name] = {"ms": round(time_ms(lambda: form(states, weight), device, repeats), 4),
                           "max_abs_diff": float((logits.float() - reference.float()).abs().max())}  # fmt: skip
        rows.append({"bs": bs, "tokens": bs * DRAFTED, "forms": cells})
    return {"meta": {"date": time.strftime("%Y-%m-%d"), "commit": checkout_commit(), "device": _device_name(device),
                     "hidden": hidden, "vocab": vocab, "dtype": str(dtype)}, "rows": rows}  # fmt: skip


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def markdown(report: dict) -> str:
    meta, rows = report["meta"], report["rows"]
    names = list(rows[0]["forms"])
    lines = [f"# The tree head's LM-head product: ms per step by form ({meta['device']}, {meta['date']})", "",
             f"commit {meta['commit']} · H = {meta['hidden']}, V = {meta['vocab']}, {meta['dtype']} · "
             f"{DRAFTED} drafted positions per request; median (triton.testing.do_bench on CUDA)", "",
             "| bs | tokens | " + " | ".join(names) + " | fastest |", "|--:|--:|" + "--:|" * len(names) + ":--|"]  # fmt: skip
    for row in rows:
        times = {name: row["forms"][name]["ms"] for name in names}
        lines.append(f"| {row['bs']} | {row['tokens']} | " + " | ".join(f"{times[n]:.3f}" for n in names)
                     + f" | {min(times, key=times.get)} |")  # fmt: skip
    worst = max(cell["max_abs_diff"] for row in rows for cell in row["forms"].values())
    return "\n".join([*lines, "", f"Largest difference of any form's logits from `matmul`'s: {worst:.3g}", ""])


def main(argv=None) -> dict:
    parser = OneLineArgumentParser(prog="python -m bench.draft_head_gemm", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch-sizes", type=int_list, default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--hidden", type=int, default=5120, help="Qwen3.6-27B's")
    parser.add_argument("--vocab", type=int, default=248320, help="Qwen3.6-27B's LM head rows")
    parser.add_argument("--vocab-chunks", type=int_list, default=[8, 64])
    parser.add_argument("--pad-tokens-to", type=int_list, default=[1, 128, 256],
                        help="pad the tokens to a multiple of each (cuBLAS picks its kernel by the shape)")
    args = parser.parse_args(argv)
    report = measure(args.batch_sizes, args.hidden, args.vocab, tuple(args.vocab_chunks),
                     tuple(args.pad_tokens_to))
    write_report(args.out, "draft_head_gemm", report, markdown(report))
    return report


if __name__ == "__main__":
    main()
