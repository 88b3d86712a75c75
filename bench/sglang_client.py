"""SGLang's own serving client against servers the launcher starts: ``bench.side_by_side``'s numbers checked with a
client this project did not write (issue 14 point 4: AR against DDTree ``--budget auto``).

For each algorithm the server is started (``python -m sglang_ddtree.launch``), then for each concurrency SGLang's
client runs once, ``python -m sglang.benchmark.serving --backend sglang --dataset-name random-ids`` with every prompt
and output of the given length (``--random-range-ratio 1``, EOS ignored, greedy, ``--flush-cache``, its own warm-up
requests), appending one JSON line per run; then the server stops. The report takes SGLang's figures as they are
(output tok/s of the run, median TPOT and TTFT, accept length) and gives each algorithm's ratio to the first's at the
same concurrency. CPU CI tests this orchestration with a stand-in client: in its venv (CPU torch 2.13) SGLang's
client does not import (torchvision); the GPU machine's torch 2.11 / torchvision 0.26 runs it.

    python -m bench.sglang_client --model-path M [--draft-model-path D] --out OUT [--algos ar,ddtree] \\
        [--budget auto] [--concurrency 1,4,8,16,32] [--rounds 4] [--input-len 1024] [--output-len 256] \\
        [-- SERVER FLAGS ...]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from bench.provenance import checkout_commit, write_report
from sglang_ddtree.cli import OneLineArgumentParser, int_list
from sglang_ddtree.serving import launched_server

ALGOS = ("ar", "mtp", "dflash", "ddtree")  # the launcher's
REPORTED = ("output_throughput", "median_tpot_ms", "median_ttft_ms", "accept_length", "completed", "duration")


def serving_client_code(module: str = "sglang.benchmark.serving") -> str:
    """``python -c`` code that runs SGLang's client ``module`` as ``__main__``. Its dataset registry imports Hugging
    Face ``datasets`` for the MMMU loader, which random-ids never calls, and the GPU machine has no ``datasets``
    (tests/gpu/RESULTS.md run 99): where it does not import, a stand-in whose ``load_dataset`` says so takes its place."""
    return ("import runpy, sys, types\n"
            "try:\n"
            "    import datasets\n"
            "except ImportError:\n"
            "    def load_dataset(*args, **kwargs):\n"
            "        raise ImportError('Hugging Face datasets is not installed: only --dataset-name random-ids runs')\n"
            "    sys.modules['datasets'] = types.ModuleType('datasets')\n"
            "    sys.modules['datasets'].load_dataset = load_dataset\n"
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n")  # fmt: skip


def client_command(url: str, tokenizer: str, concurrency: int, prompts: int, input_len: int, output_len: int,
                   raw: Path) -> list[str]:  # fmt: skip
    return [sys.executable, "-c", serving_client_code(), "--backend", "sglang", "--base-url", url,
            "--tokenizer", tokenizer, "--dataset-name", "random-ids", "--random-input-len", str(input_len),
            "--random-output-len", str(output_len), "--random-range-ratio", "1.0", "--num-prompts", str(prompts),
            "--max-concurrency", str(concurrency), "--temperature", "0", "--flush-cache", "--seed", "1",
            "--disable-tqdm", "--output-file", str(raw)]  # fmt: skip


def launch_args(algo: str, args) -> list[str]:
    launch = ["--algo", algo, "--model-path", args.model_path]
    if algo in ("dflash", "ddtree"):
        if not args.draft_model_path:
            raise SystemExit(f"python -m bench.sglang_client: error: --algos {algo} needs --draft-model-path")
        launch += ["--draft-model-path", args.draft_model_path]
    if algo == "ddtree":
        launch += ["--budget", args.budget]
    return launch + ["--max-running-requests", str(max(args.concurrency)), *args.server_flags]


def run(args, serve: Callable = launched_server, client: Callable = subprocess.run) -> dict:
    """``serve(launch_args, log_path=...)``: a context manager yielding the server's URL; ``client(command)`` runs
    SGLang's client (both replaceable for the tests)."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for algo in args.algos:
        raw = out / f"raw_{algo}.jsonl"
        raw.unlink(missing_ok=True)
        with serve(launch_args(algo, args), log_path=str(out / f"server_{algo}.log")) as url:
            for concurrency in args.concurrency:
                command = client_command(url, args.model_path, concurrency, args.rounds * concurrency,
                                         args.input_len, args.output_len, raw)  # fmt: skip
                result = client(command, capture_output=True, text=True)
                if result.returncode != 0:
                    tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
                    raise SystemExit(f"python -m bench.sglang_client: error: SGLang's client failed for {algo} at "
                                     f"concurrency {concurrency}: {tail[0]}")  # fmt: skip
        lines = [json.loads(line) for line in raw.read_text().splitlines() if line.strip()]
        if len(lines) != len(args.concurrency):
            raise SystemExit(f"python -m bench.sglang_client: error: {raw} has {len(lines)} results for "
                             f"{len(args.concurrency)} concurrencies")  # fmt: skip
        for concurrency, line in zip(args.concurrency, lines):
            rows.append({"algo": algo, "concurrency": concurrency, **{key: line.get(key) for key in REPORTED}})
    return {"meta": {"date": time.strftime("%Y-%m-%d"), "commit": checkout_commit(), "model_path": args.model_path,
                     "draft_model_path": args.draft_model_path, "budget": args.budget, "input_len": args.input_len,
                     "output_len": args.output_len, "rounds": args.rounds, "server_flags": args.server_flags,
                     "client": "python -m sglang.benchmark.serving --dataset-name random-ids"},
            "rows": rows}  # fmt: skip


def markdown(report: dict) -> str:
    meta, rows = report["meta"], report["rows"]
    baseline = {row["concurrency"]: row for row in rows if row["algo"] == rows[0]["algo"]}

    def ratio(row: dict) -> str:
        base: Optional[dict] = baseline.get(row["concurrency"])
        if not base or not base["output_throughput"] or row is base:
            return "–"
        return f"{row['output_throughput'] / base['output_throughput']:.2f}x"

    lines = [f"# SGLang's serving client: {', '.join(dict.fromkeys(r['algo'] for r in rows))} ({meta['date']})", "",
             f"commit {meta['commit']} · {meta['model_path']} · DDTree budget {meta['budget']} · random-ids prompts "
             f"of {meta['input_len']} tokens, {meta['output_len']} output tokens, greedy, {meta['rounds']} x "
             "concurrency prompts per run", "",
             f"| algo | concurrency | output tok/s | vs {rows[0]['algo']} | median TPOT ms | median TTFT ms | "
             "accept length | completed |",
             "|:--|--:|--:|--:|--:|--:|--:|--:|"]  # fmt: skip
    for row in rows:
        accept = row["accept_length"]
        lines.append(f"| {row['algo']} | {row['concurrency']} | {row['output_throughput']:.1f} | {ratio(row)} | "
                     f"{row['median_tpot_ms']:.2f} | {row['median_ttft_ms']:.1f} | "
                     f"{'–' if accept is None else f'{accept:.2f}'} | {row['completed']} |")  # fmt: skip
    return "\n".join([*lines, ""])


def parse_args(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    server_flags = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = OneLineArgumentParser(prog="python -m bench.sglang_client", description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--draft-model-path")
    parser.add_argument("--out", required=True)
    parser.add_argument("--algos", type=lambda s: [x for x in s.split(",") if x], default=["ar", "ddtree"])
    parser.add_argument("--budget", default="auto", help="DDTree's --budget (default: auto)")
    parser.add_argument("--concurrency", type=int_list, default=[1, 4, 8, 16, 32])
    parser.add_argument("--rounds", type=int, default=4, help="prompts per run = rounds x concurrency")
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=256)
    args = parser.parse_args(argv)
    unknown = [algo for algo in args.algos if algo not in ALGOS]
    if unknown:
        parser.error(f"--algos: unknown {', '.join(unknown)} (one of {', '.join(ALGOS)})")
    args.server_flags = server_flags
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    report = run(args)
    write_report(args.out, "sglang_client", report, markdown(report))
    return report


if __name__ == "__main__":
    main()
