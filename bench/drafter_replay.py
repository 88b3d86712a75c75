"""DFLASH and DDTree tau of DFlash drafters on the benchmark prompts, without a server or a GPU.

    python -m bench.drafter_replay --target PATH --drafter DIR [--drafter DIR ...] [--datasets mt_bench,humaneval |
        --held-out-of ANSWERS.jsonl] [--num-prompts 16] [--max-new-tokens 256] [--budgets 16,32,64] [--wheel-dir W] \\
        [--device cpu] --out FILE

The target answers each prompt greedily here (float32; prompts built as ``bench.side_by_side`` sends them:
same loader, same chat template), and ``sglang_ddtree.training.drafter_acceptance`` replays decoding along those
answers with each drafter. The tau it gives is what a T = 0 server reports for these paths (on SGLang's CPU
engine the replay takes exactly the server's verify steps); a GPU server in bf16 decodes slightly different
paths, so its tau agrees statistically. Compare drafters on the benchmark prompts on any machine, or, with
``--held-out-of``, on the prompts their training held out (in distribution). Writes ``FILE.json`` and
``FILE.md``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

from bench.side_by_side import tokenized_prompts
from sglang_ddtree.cli import OneLineArgumentParser, int_list


def held_out_prompts(answers_path: str, held_out_fraction: float, limit: int) -> list[dict]:
    """The prompts a training run held out (``train_drafter``'s split of its ``--answers-out`` file), as token
    ids: the in-distribution counterpart of the benchmark prompts."""
    from sglang_ddtree.training.train_drafter import read_answers, split_by_prompt

    held_out, _ = split_by_prompt(read_answers(answers_path), held_out_fraction)
    prompt_ids = list(dict.fromkeys(tuple(a.ids[: a.answer_start]) for a in held_out))
    return [{"dataset": "held-out", "input_ids": list(ids)} for ids in prompt_ids[: limit or None]]


def prompt_rows(datasets: list[str], num_prompts: int, wheel_dir: str, tokenizer_path: str) -> list[dict]:
    """The first ``num_prompts`` of each benchmark set (0: all), tokenized as ``bench.side_by_side`` sends them."""
    from bench import prompts as prompt_sets

    rows = []
    for name in datasets:
        chosen = prompt_sets.load([name], wheel_dir)
        rows += chosen[:num_prompts] if num_prompts else chosen
    return tokenized_prompts(rows, tokenizer_path)


def load_drafter(folder: str, target_config: dict, device: str):
    from sglang_ddtree.training.drafter_model import DFlashDrafter, DrafterShape
    from sglang_ddtree.training.train_drafter import load_drafter as load_weights

    with open(Path(folder) / "config.json") as f:
        config = json.load(f)
    shape = DrafterShape.for_target(target_config, int(config["num_hidden_layers"]),
                                    len(config["dflash_config"]["target_layer_ids"]), int(config["block_size"]))  # fmt: skip
    drafter = DFlashDrafter(shape)
    load_weights(drafter, folder)
    return drafter.float().to(device).eval(), int(config["dflash_config"]["mask_token_id"])


def markdown(rows: list[dict], budgets: list[int]) -> str:
    names = ["dflash"] + [f"ddtree B={b}" for b in budgets]
    lines = ["| drafter | dataset | paths | greedy tokens | " + " | ".join(f"{n} tau" for n in names) + " |",
             "|:--|:--|--:|--:|" + "--:|" * len(names)]  # fmt: skip
    for r in rows:
        taus = " | ".join("–" if r["tau"][n] is None else f"{r['tau'][n]:.3f}" for n in names)
        lines.append(f"| {r['drafter']} | {r['dataset']} | {r['paths']} | {r['greedy_tokens']} | {taus} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench import prompts as prompt_sets
    from sglang_ddtree.training.drafter_acceptance import greedy_acceptance, tau
    from sglang_ddtree.training.train_drafter import self_distill_hf

    parser = OneLineArgumentParser(prog="python -m bench.drafter_replay", description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="target model folder (Hugging Face format)")
    parser.add_argument("--drafter", action="append", required=True, help="DFlash drafter folder (repeatable)")
    parser.add_argument("--datasets", type=lambda text: text.split(","), default=["mt_bench", "humaneval"])
    parser.add_argument("--held-out-of", default="",
                        help="instead of --datasets: the held-out prompts of these training answers (train_drafter "
                        "--answers-out; the trainer's split)")  # fmt: skip
    parser.add_argument("--held-out-fraction", type=float, default=0.05, help="with --held-out-of: the trainer's")
    parser.add_argument("--num-prompts", type=int, default=16, help="per dataset (0: all)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--budgets", type=int_list, default=[16, 32, 64])
    parser.add_argument("--wheel-dir", default=str(Path.home() / ".cache" / "sglang_ddtree" / "wheels"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", required=True, help="output path without extension")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    unknown = sorted(set(args.datasets) - set(prompt_sets.SETS))
    if unknown:
        parser.error(f"unknown dataset(s) {', '.join(unknown)}; choose from {', '.join(prompt_sets.SETS)}")

    if args.held_out_of:
        prompts = held_out_prompts(args.held_out_of, args.held_out_fraction, args.num_prompts)
        args.datasets = ["held-out"]
    else:
        prompts = prompt_rows(args.datasets, args.num_prompts, args.wheel_dir, args.target)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).to(args.device).eval()
    # The trainer's own greedy self-distillation: prompt + answer, ending at the end-of-sequence token.
    answers = self_distill_hf(target, AutoTokenizer.from_pretrained(args.target), [p["input_ids"] for p in prompts],
                              [False] * len(prompts), args.max_new_tokens, batch_size=8)  # fmt: skip
    with open(Path(args.target) / "config.json") as f:
        target_config = json.load(f)
    results = []
    for folder in args.drafter:
        drafter, mask_token_id = load_drafter(folder, target_config, args.device)
        for dataset in args.datasets:
            sequences = [(a.ids, a.answer_start) for p, a in zip(prompts, answers) if p["dataset"] == dataset]
            steps = greedy_acceptance(drafter, target, sequences, mask_token_id, args.budgets)
            results.append({"drafter": folder, "dataset": dataset, "paths": len(sequences),
                            "greedy_tokens": sum(a + 1 for a in steps["dflash"]),
                            "tau": {name: tau(accepted) for name, accepted in steps.items()}})  # fmt: skip
            print(markdown(results[-1:], args.budgets).splitlines()[-1], flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"target": args.target, "drafters": args.drafter, "datasets": args.datasets, "held_out_of": args.held_out_of,
            "num_prompts": args.num_prompts, "max_new_tokens": args.max_new_tokens, "budgets": args.budgets,
            "device": args.device}  # fmt: skip
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    out.with_suffix(".md").write_text(markdown(results, args.budgets))


if __name__ == "__main__":
    main()
