"""``--budget auto``'s choices replayed along a real pair's greedy paths, without a server or a GPU.

    python -m bench.budget_policy_replay --target PATH --drafter DIR [--datasets mt_bench,humaneval]
        [--num-prompts 16] [--max-new-tokens 256] [--tree-width 33] [--batch-size 1] --table-ms 1:3.32,2:4.65,...
        [--clock-ms 1:2.52,2:3.67,...] [--smoothing 0.1,...] [--probe-interval 16,...] [--trace FILE.pt] --out FILE

The target answers each prompt greedily (float32), and at every
anchor of its answer the drafter's widest tree (``--tree-width`` nodes, root included) is built as the server builds
it, with the nodes the target accepts (``drafter_acceptance``). A tree of width ``w`` is the first ``w - 1`` popped
nodes, and accepts the prefix of that path inside them, so one trace prices every width. The replay then walks
the answers as a server would decode them, ``--batch-size`` at a time (a finished answer's slot takes the next):
a policy picks each step's width for the batch (the server's ``BudgetPolicy``, fed what
the server feeds it: the widest tree's path log-probabilities and the accepted nodes, its decision taking effect
one step later), the step commits the accepted drafts plus the target's token, and a clock charges the width's
step time. Fixed widths are replayed beside it. ``--table-ms``: the step times the policy decides with (the
server's start-up row for that batch size); ``--clock-ms``: what a step of each width took when served (default:
the table), charged for every step, also while the last answers of a batch finish. The trace
is kept in ``--trace`` (reused when it exists). Writes ``FILE.json`` and ``FILE.md``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from sglang_ddtree.cli import OneLineArgumentParser, float_list, int_list
from sglang_ddtree.tree.budget_policy import BudgetPolicy, StepTimeTable


@dataclass
class AnswerTrace:
    """One answer's verify anchors: the widest tree's path log-probabilities ``[A, B]`` (pop order) and the nodes
    the target accepts at each anchor ``[A, D]`` (pop-order ids ascending along the path, -1 padding)."""

    path_logprob: torch.Tensor
    accepted_nodes: torch.Tensor


@dataclass
class ReplayResult:
    """A policy's decoding of every answer: committed tokens, clock milliseconds, verify steps per width and
    request-steps (a step of ``n`` running requests counts ``n``)."""

    tokens: int = 0
    ms: float = 0.0
    steps_per_width: dict[int, int] = field(default_factory=dict)
    request_steps: int = 0

    def summary(self) -> dict:
        return {"tokens": self.tokens, "ms": round(self.ms, 3), "tokens_per_ms": round(self.tokens / self.ms, 4),
                "tau": round(self.tokens / self.request_steps, 4),
                "steps_per_width": dict(sorted(self.steps_per_width.items()))}  # fmt: skip


def ms_row(text: str) -> dict[int, float]:
    """``"1:3.32,2:4.65"`` -> ``{1: 3.32, 2: 4.65}``: step milliseconds per verify width."""
    try:
        row = {int(w): float(ms) for w, ms in (item.split(":") for item in text.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTH:MS,... (e.g. 1:3.32,33:4.86), got {text!r}") from None
    if 1 not in row or any(w < 1 or ms <= 0 for w, ms in row.items()):
        raise argparse.ArgumentTypeError(f"step times need width 1 and positive milliseconds, got {text!r}")
    return dict(sorted(row.items()))


def replay(traces: list[AnswerTrace], clock_ms: dict[int, float], choose: Callable[[], int],
           observe: Callable[[Optional[torch.Tensor], int, torch.Tensor], None], batch_size: int = 1) -> ReplayResult:  # fmt: skip
    """Decode the traced answers ``batch_size`` at a time, a finished one's slot taking the next answer (continuous
    batching): ``choose()`` gives each step's width for the whole batch, ``observe`` hears each verify
    (``path_logprob [n, B]`` of the widest trees, None at width 1; the width; the accepted nodes ``[n, D]``)."""
    result, pending = ReplayResult(), iter(traces)
    running = [[trace, 0] for trace in itertools.islice(pending, batch_size)]
    while running:
        width = choose()
        trees, accepted_rows = [], []
        for slot in running:
            trace, anchor = slot
            nodes = trace.accepted_nodes[anchor]
            accepted = nodes[(nodes > 0) & (nodes < width)]
            padded = torch.full_like(nodes, -1)
            padded[: accepted.numel()] = accepted
            trees.append(trace.path_logprob[anchor])
            accepted_rows.append(padded)
            result.tokens += accepted.numel() + 1
            slot[1] += accepted.numel() + 1
        observe(torch.stack(trees) if width > 1 else None, width, torch.stack(accepted_rows))
        result.ms += clock_ms[width]
        result.steps_per_width[width] = result.steps_per_width.get(width, 0) + 1
        result.request_steps += len(running)
        running = [slot for slot in running if slot[1] < slot[0].path_logprob.shape[0]]
        running += [[trace, 0] for trace in itertools.islice(pending, batch_size - len(running))]
    return result


def replay_policy(traces: list[AnswerTrace], table_ms: dict[int, float], clock_ms: dict[int, float],
                  batch_size: int = 1, **policy_args) -> ReplayResult:  # fmt: skip
    """The server's ``BudgetPolicy`` (widths and decision times from ``table_ms``, the batch size's row) over the
    traces."""
    table = StepTimeTable({(batch_size, w): ms for w, ms in table_ms.items()}, list(table_ms))
    policy = BudgetPolicy(table, list(table_ms), **policy_args)
    return replay(traces, clock_ms, policy.width, policy.observe, batch_size)


def replay_fixed(traces: list[AnswerTrace], width: int, clock_ms: dict[int, float], batch_size: int = 1) -> ReplayResult:
    return replay(traces, clock_ms, lambda: width, lambda *_: None, batch_size)


@torch.no_grad()
def trace_answers(target, drafter, mask_token_id: int, sequences: list[tuple[list[int], int]],
                  tree_width: int) -> list[AnswerTrace]:  # fmt: skip
    """Every anchor of each answer's greedy path (``greedy_acceptance``'s walk visits a subset of them)."""
    from sglang_ddtree.training.drafter_acceptance import anchor_block_logits, tree_accepted_nodes
    from sglang_ddtree.tree.tree_reference import reference_build_tree, reference_topk_logprobs

    traces, budget = [], tree_width - 1
    for ids_list, answer_start in sequences:
        blocks = anchor_block_logits(drafter, target, ids_list, answer_start, mask_token_id)
        if blocks is None:
            continue
        end, logits = blocks
        top_logprobs, top_tokens = reference_topk_logprobs(logits, min(budget, logits.shape[-1]))
        parent, token, _, path_logprob = reference_build_tree(top_logprobs, top_tokens, budget)
        accepted = torch.full((logits.shape[0], drafter.shape.block_size - 1), -1, dtype=torch.int64)
        for row, anchor in enumerate(range(answer_start, end - 1)):
            nodes = tree_accepted_nodes(parent[row].tolist(), token[row].tolist(), ids_list[:end], anchor)
            accepted[row, : len(nodes)] = torch.tensor(nodes, dtype=torch.int64)
        traces.append(AnswerTrace(path_logprob, accepted))
    return traces


def markdown(rows: dict[str, dict]) -> str:
    lines = ["| policy | tau | tokens / ms | vs best fixed | steps per width |", "|:--|--:|--:|--:|:--|"]
    best = max(r["tokens_per_ms"] for name, r in rows.items() if name.startswith("fixed"))
    for name, r in rows.items():
        widths = ", ".join(f"{w}: {n}" for w, n in r["steps_per_width"].items())
        lines.append(f"| {name} | {r['tau']:.3f} | {r['tokens_per_ms']:.4f} | {r['tokens_per_ms'] / best:.3f}x | {widths} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> None:
    from bench.drafter_replay import load_drafter, prompt_rows

    parser = OneLineArgumentParser(prog="python -m bench.budget_policy_replay", description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="target model folder (Hugging Face format)")
    parser.add_argument("--drafter", required=True, help="DFlash drafter folder")
    parser.add_argument("--datasets", type=lambda text: text.split(","), default=["mt_bench", "humaneval"])
    parser.add_argument("--num-prompts", type=int, default=16, help="per dataset (0: all)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--tree-width", type=int, default=33, help="the widest tree's nodes, root included")
    parser.add_argument("--table-ms", type=ms_row, required=True, help="WIDTH:MS,...: the policy's step times")
    parser.add_argument("--clock-ms", type=ms_row, default=None, help="WIDTH:MS,...: served step times")
    parser.add_argument("--batch-size", type=int, default=1,
                        help="requests decoded at once (continuous batching); the step times are that batch size's")
    parser.add_argument("--smoothing", type=float_list, default=[0.1], help="the policy's, one replay each")
    parser.add_argument("--probe-interval", type=int_list, default=[16], help="the policy's, one replay each")
    parser.add_argument("--wheel-dir", default=str(Path.home() / ".cache" / "sglang_ddtree" / "wheels"))
    parser.add_argument("--trace", default="", help="keep (or reuse) the traced trees in this .pt file")
    parser.add_argument("--out", required=True, help="output path without extension")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    clock_ms = args.clock_ms or args.table_ms
    if sorted(clock_ms) != sorted(args.table_ms) or max(args.table_ms) != args.tree_width:
        parser.error(f"--table-ms and --clock-ms must name the same widths, the widest {args.tree_width}")
    if args.batch_size < 1:
        parser.error(f"--batch-size must be at least 1, got {args.batch_size}")

    if args.trace and Path(args.trace).exists():
        traces = [AnswerTrace(*pair) for pair in torch.load(args.trace)]
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from sglang_ddtree.training.train_drafter import self_distill_hf

        prompts = prompt_rows(args.datasets, args.num_prompts, args.wheel_dir, args.target)
        target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
        answers = self_distill_hf(target, AutoTokenizer.from_pretrained(args.target), [p["input_ids"] for p in prompts],
                                  [False] * len(prompts), args.max_new_tokens, batch_size=8)  # fmt: skip
        with open(Path(args.target) / "config.json") as f:
            drafter, mask_token_id = load_drafter(args.drafter, json.load(f), "cpu")
        traces = trace_answers(target, drafter, mask_token_id, [(a.ids, a.answer_start) for a in answers],
                               args.tree_width)  # fmt: skip
        if args.trace:
            torch.save([(t.path_logprob, t.accepted_nodes) for t in traces], args.trace)

    bs = args.batch_size
    rows = {f"fixed width {w}": replay_fixed(traces, w, clock_ms, bs).summary() for w in args.table_ms}
    rows["auto as served at a8111a5 (smoothing 1, probe at width 2)"] = replay_policy(
        traces, args.table_ms, clock_ms, bs, smoothing=1.0, probe_width=min(w for w in args.table_ms if w > 1)).summary()
    for smoothing in args.smoothing:
        for probe_interval in args.probe_interval:
            name = f"auto (smoothing {smoothing}, probe every {probe_interval} at the widest)"
            rows[name] = replay_policy(traces, args.table_ms, clock_ms, bs, smoothing=smoothing,
                                       probe_interval=probe_interval).summary()  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: getattr(args, k) for k in ("target", "drafter", "datasets", "num_prompts", "max_new_tokens",
                                          "tree_width", "table_ms", "clock_ms", "batch_size")}  # fmt: skip
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "answers": len(traces), "policies": rows}, indent=1))
    out.with_suffix(".md").write_text(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
