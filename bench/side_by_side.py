"""Side-by-side benchmark: AR, MTP, DFlash and DDTree served by SGLang with one set of server flags.

    python -m bench.side_by_side --model-path P [--draft-model-path D] --algos ar,mtp,dflash,ddtree \\
        [--budgets 16,32,64] [--concurrency 1,4,16] [--temperatures 0,1] [--datasets mt_bench,humaneval] \\
        [--num-prompts N] [--max-new-tokens 256] [--tp 2] [--profile-steps] [--ignore-eos] \\
        [--simulate-tau mtp=3.6,dflash=3.1,ddtree=4] [--random-prompt-len 1024] [--rounds R] --out DIR [--resume] \\
        [-- shared SGLang server flags ...]

Each configuration (one per algorithm; DDTree once per budget) is first checked by the launcher's
``--dry-run`` (a configuration it refuses stops the run before anything is measured), then launched in turn
through ``python -m sglang_ddtree.launch`` with the shared flags, or attached with ``--url CONFIG=URL``. It is
warmed up on prompts that are not benchmark prompts, and then every (temperature, concurrency) cell, after a
warm-up of its own batch shape and a flush of the prefix cache, sends the same prompts through streaming
``/generate``. MT-Bench prompts
go through the model's chat template; HumanEval prompts are raw completion prompts.

Per request: TTFT, TPOT, decode tok/s (tokens after the first / time after the first), end-to-end tok/s,
tau (completion tokens per verify, bonus included) and the acceptance histogram. Per cell: medians, output
throughput, speedups vs AR and vs MTP. Greedy outputs are compared with AR's; since bf16 greedy decoding is
not bitwise reproducible on a GPU, each divergence is listed with its prompt, position and AR's top-1/top-2
log-probability margin there (AR's per-token top-2 are recorded in an extra, untimed pass).

``--profile-steps`` also splits each DDTree cell's decode step into its phases (CUDA events on the server,
``sglang_ddtree.profiling.ddtree_step_profile``): where the step's time goes on the pair being measured.

A step's cost depends on shapes, not weights: on a random-weight target (``--load-format dummy`` after ``--``),
``--simulate-tau ALGO=MEAN`` makes that algorithm's servers commit a drawn length of mean MEAN per verify (SGLang's
cost-only ``SGLANG_SIMULATE_ACC_LEN``; DDTREE along each tree's best branch, or per request from the histogram
file in ``SGLANG_DDTREE_SIMULATE_ACC_HISTOGRAM``), ``--simulate-tau-by-width 'ddtree auto=2:1.5,17:4.06'`` a
mean per verify width (what ``--budget auto`` weighs against its step times), with ``--ignore-eos`` so that every
request runs its length;
the report names the simulated configurations and compares their outputs with nothing (AR's top-2 pass is
skipped). ``--datasets random --random-prompt-len N`` sends N-token prompts of seeded random token ids
(``--num-prompts`` of them) instead of MT-Bench/HumanEval. ``--rounds R``: each cell sends only its first R x
concurrency prompts, so that cells at every concurrency take about R requests' time.

Writes ``side_by_side.json`` (every raw number and the exact commands), ``side_by_side.md`` and PNG plots,
after every configuration; ``--resume`` keeps the configurations already in ``DIR`` and measures the others
(a long sweep split over several runs on one machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Collection, Optional, Sequence

from bench.provenance import checkout_commit, refuse_another_cards_report
from sglang_ddtree.cli import OneLineArgumentParser, int_list
from sglang_ddtree.profiling.ddtree_step_profile import (
    PHASES,
    PROFILE_STEPS_ENV,
    phase_means,
    phase_means_by_width,
    server_step_profile,
    step_ms_spread,
)
from sglang_ddtree.serving import launched_server, server_state

ALGORITHMS = ("ar", "mtp", "dflash", "ddtree")
WARMUP_PROMPTS = [
    "Describe the water cycle in two sentences.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
]


@dataclass
class RequestRecord:
    """One streamed ``/generate`` request, as measured by the client."""

    config: str
    dataset: str
    prompt_id: str
    temperature: float
    concurrency: int
    start: float
    first_token: float
    end: float
    completion_tokens: int
    verify_ct: int = 0
    accept_histogram: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)

    @property
    def ttft(self) -> float:
        return self.first_token - self.start

    @property
    def tpot(self) -> Optional[float]:
        return (self.end - self.first_token) / (self.completion_tokens - 1) if self.completion_tokens > 1 else None

    @property
    def decode_tok_s(self) -> Optional[float]:
        tpot = self.tpot
        return 1.0 / tpot if tpot else None

    @property
    def e2e_tok_s(self) -> float:
        return self.completion_tokens / (self.end - self.start)


def _median(values: list) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(records: list[RequestRecord]) -> list[dict]:
    """One row per (config, dataset, temperature, concurrency) cell."""
    cells: dict[tuple, list[RequestRecord]] = defaultdict(list)
    for r in records:
        cells[r.config, r.dataset, r.temperature, r.concurrency].append(r)
    rows = []
    for (config, dataset, temperature, concurrency), cell in cells.items():
        verifies = sum(r.verify_ct for r in cell)
        histogram: list[int] = []
        for r in cell:
            histogram += [0] * (len(r.accept_histogram) - len(histogram))
            for k, count in enumerate(r.accept_histogram):
                histogram[k] += count
        tokens = sum(r.completion_tokens for r in cell)
        rows.append({
            "config": config, "dataset": dataset, "temperature": temperature, "concurrency": concurrency,
            "requests": len(cell), "ttft_s": _median([r.ttft for r in cell]), "tpot_s": _median([r.tpot for r in cell]),
            "decode_tok_s": _median([r.decode_tok_s for r in cell]), "e2e_tok_s": _median([r.e2e_tok_s for r in cell]),
            "output_tok_s": tokens / (max(r.end for r in cell) - min(r.start for r in cell)),
            "tau": tokens / verifies if verifies else None, "accept_histogram": histogram,
        })  # fmt: skip
    add_speedups(rows)
    return rows


def add_speedups(rows: list[dict]) -> None:
    """``speedup_vs_<base>``: decode tok/s over the same cell's ``ar`` / ``mtp`` configuration."""
    by_cell = {(r["config"], r["dataset"], r["temperature"], r["concurrency"]): r for r in rows}
    for row in rows:
        for base in ("ar", "mtp"):
            other = by_cell.get((base, row["dataset"], row["temperature"], row["concurrency"]))
            ratio = None
            if other and other["decode_tok_s"] and row["decode_tok_s"]:
                ratio = row["decode_tok_s"] / other["decode_tok_s"]
            row[f"speedup_vs_{base}"] = ratio


def greedy_divergences(records: list[RequestRecord], ar_top2: dict[str, list[tuple]],
                       simulated: Collection[str] = ()) -> list[dict]:  # fmt: skip
    """Greedy outputs that differ from AR's at the same concurrency (AR's own outputs at other concurrencies
    are compared with its lowest one: the batch-shape noise floor): prompt, configuration, first differing
    position and AR's top-1/top-2 log-probability margin there. Configurations in ``simulated`` (cost-only
    acceptance: their tokens are not the target's) are not compared.

    ``ar_top2[prompt_id][i]`` is ``(top-1, top-2 log-probability, chosen token)`` at token ``i`` of AR's untimed
    logprob pass. That pass can itself take another path at a near tie; a margin is reported only where the
    pass followed the reference output up to the divergence (runs that recorded no top-1 tokens: unchecked).
    """
    greedy = [r for r in records if r.temperature == 0]
    ar = {(r.prompt_id, r.concurrency): r.output_ids for r in greedy if r.config == "ar"}
    lowest = {}
    for prompt_id, concurrency in sorted(ar):
        lowest.setdefault(prompt_id, concurrency)
    found = []
    for r in (r for r in greedy if r.config not in simulated):
        base = lowest.get(r.prompt_id) if r.config == "ar" else r.concurrency
        want = ar.get((r.prompt_id, base))
        if want is None or r.output_ids == want or (r.config == "ar" and r.concurrency == base):
            continue
        at = next((i for i, (a, b) in enumerate(zip(want, r.output_ids)) if a != b), min(len(want), len(r.output_ids)))
        top2 = ar_top2.get(r.prompt_id, [])
        followed = all(len(step) < 3 or step[2] == token for step, token in zip(top2[:at], want))
        margin = top2[at][0] - top2[at][1] if at < len(top2) and followed else None
        found.append({"config": r.config, "prompt_id": r.prompt_id, "concurrency": r.concurrency, "position": at,
                      "ar_top2_margin": margin})  # fmt: skip
    return found


def _fmt(value, digits: int = 2, unit: str = "") -> str:
    return "–" if value is None else f"{value:.{digits}f}{unit}"


def markdown(meta: dict, rows: list[dict], divergences: list[dict]) -> str:
    lines = [
        "# Side-by-side: AR vs MTP vs DFlash vs DDTree", "",
        f"{meta.get('date', '')} · commit {meta.get('commit', '?')} · {meta.get('gpu', '?')} · "
        f"model {meta.get('model_path', '?')} · tp {meta.get('tp', '?')} · max new tokens {meta.get('max_new_tokens')}", "",
        *(["**Simulated acceptance (cost only, outputs are not the target's)**: mean tau "
           + ", ".join(f"{algo} {tau:g}" for algo, tau in meta["simulated_tau"].items()), ""]
          if meta.get("simulated_tau") else []),
        *(["**Simulated acceptance by verify width (cost only)**: "
           + "; ".join(f"{config} {table}" for config, table in meta["simulated_tau_by_width"].items()), ""]
          if meta.get("simulated_tau_by_width") else []),
        "| config | dataset | T | conc. | req | tau | decode tok/s | e2e tok/s | TTFT (s) | TPOT (ms) | output tok/s "
        "| vs AR | vs MTP |",
        "|:--|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]  # fmt: skip
    for r in sorted(rows, key=lambda r: (r["dataset"], r["temperature"], r["concurrency"], r["config"])):
        tpot_ms = r["tpot_s"] * 1000 if r["tpot_s"] is not None else None
        lines.append(
            f"| {r['config']} | {r['dataset']} | {r['temperature']:g} | {r['concurrency']} | {r['requests']} | "
            f"{_fmt(r['tau'])} | {_fmt(r['decode_tok_s'], 1)} | {_fmt(r['e2e_tok_s'], 1)} | {_fmt(r['ttft_s'], 3)} | "
            f"{_fmt(tpot_ms)} | {_fmt(r['output_tok_s'], 1)} | {_fmt(r['speedup_vs_ar'], 2, 'x')} | "
            f"{_fmt(r['speedup_vs_mtp'], 2, 'x')} |"
        )
    lines += ["", f"Greedy divergences from AR: {len(divergences)} (each output vs AR's at the same concurrency; "
              "rows `ar`: AR at a higher concurrency vs its lowest, the bf16 batch-shape noise floor; margin – where "
              "AR's logprob pass took another path first)"]  # fmt: skip
    for d in divergences:
        lines.append(f"- {d['config']} {d['prompt_id']} (concurrency {d['concurrency']}): position {d['position']}, "
                     f"AR top-1/top-2 margin {_fmt(d['ar_top2_margin'], 4)}")  # fmt: skip
    return "\n".join(lines) + "\n"


def plots(rows: list[dict], out: Path) -> list[str]:
    """tok/s vs concurrency per configuration, tau histograms, and DDTree's budget sweep (PNG files)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    written = []
    for (dataset, temperature), group in sorted(_groups(rows, ("dataset", "temperature")).items()):
        fig, ax = plt.subplots(figsize=(6, 4))
        for config, series in sorted(_groups(group, ("config",)).items()):
            series.sort(key=lambda r: r["concurrency"])
            ax.plot([r["concurrency"] for r in series], [r["output_tok_s"] for r in series], marker="o", label=config[0])
        ax.set(xscale="log", xlabel="concurrency", ylabel="output tok/s", title=f"{dataset}, T={temperature:g}")
        ax.legend()
        written.append(_save(fig, out / f"throughput_{dataset}_T{temperature:g}.png"))
        fig, ax = plt.subplots(figsize=(6, 4))
        for config, series in sorted(_groups(group, ("config",)).items()):
            histogram = series[0]["accept_histogram"]
            if histogram:
                total = sum(histogram)
                ax.plot(range(len(histogram)), [c / total for c in histogram], marker="o", label=config[0])
        ax.set(xlabel="accepted draft tokens per verify", ylabel="share of verifies", title=f"{dataset}, T={temperature:g}")
        ax.legend()
        written.append(_save(fig, out / f"acceptance_{dataset}_T{temperature:g}.png"))
    budgets = [r for r in rows if r["config"].startswith("ddtree B=") and r["concurrency"] == min(x["concurrency"] for x in rows)]
    if budgets:
        fig, ax = plt.subplots(figsize=(6, 4))
        for (dataset, temperature), series in sorted(_groups(budgets, ("dataset", "temperature")).items()):
            series.sort(key=lambda r: int(r["config"].split("=")[1]))
            ax.plot([int(r["config"].split("=")[1]) for r in series], [r["decode_tok_s"] for r in series], marker="o",
                    label=f"{dataset} T={temperature:g}")  # fmt: skip
        ax.set(xscale="log", xlabel="DDTree budget (tree nodes)", ylabel="decode tok/s per request", title="budget sweep")
        ax.legend()
        written.append(_save(fig, out / "ddtree_budget_sweep.png"))
    return written


def _groups(rows: list[dict], keys: tuple[str, ...]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[tuple(r[k] for k in keys)].append(r)
    return groups


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    from matplotlib import pyplot as plt

    plt.close(fig)
    return path.name


def write_report(out: Path, meta: dict, records: list[RequestRecord], ar_top2: dict,
                 step_profiles: Sequence[dict] = ()) -> dict:  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    rows = summarize(records)
    simulated = {r.config for r in records
                 if simulation_env(r.config, meta.get("simulated_tau") or {}, meta.get("simulated_tau_by_width"))}
    divergences = greedy_divergences(records, ar_top2, simulated)
    report = {"meta": meta, "summary": rows, "divergences": divergences, "step_profiles": list(step_profiles),
              "requests": [asdict(r) for r in records], "ar_top2": ar_top2}  # fmt: skip
    report["plots"] = plots(rows, out)
    (out / "side_by_side.json").write_text(json.dumps(report, indent=1))
    (out / "side_by_side.md").write_text(markdown(meta, rows, divergences) + step_profile_markdown(step_profiles)
                                         + auto_budget_markdown(meta.get("auto_budget_cells", [])))  # fmt: skip
    return report


def auto_budget_markdown(cells: Sequence[dict]) -> str:
    """The widths ``ddtree auto`` verified per cell, and the step times it measured, or nothing."""
    if not cells:
        return ""
    lines = ["", "`ddtree auto`: decode steps per verify width (share of the cell's steps), the verify graph replays per "
             "width (a step of a width without a replay verified eagerly; – where the server did not report them) and "
             "the step ms it measured per batch-size bucket:", "",
             "| T | conc. | steps per width | graph replays per width | measured ms per width |",
             "|--:|--:|:--|:--|:--|"]  # fmt: skip
    for cell in cells:
        total = sum(cell["steps"]) or 1
        steps = ", ".join(f"{w}: {n} ({n / total:.0%})" for w, n in zip(cell["widths"], cell["steps"]) if n)
        replays = cell.get("graph_replays")
        replayed = ", ".join(f"{w}: {n}" for w, n in replays.items() if n) or "none" if replays is not None else "–"
        measured = "; ".join(f"bs<={b}: {row}" for b, row in (cell.get("measured_step_ms") or {}).items())
        lines.append(f"| {cell['temperature']:g} | {cell['concurrency']} | {steps} | {replayed} | {measured} |")
    return "\n".join(lines) + "\n"


def step_profile_markdown(step_profiles: Sequence[dict]) -> str:
    """The DDTree decode step split into its phases per cell (``--profile-steps``), or nothing; a cell that
    verified at several widths (``--budget auto``) gets a row per width under its own. Beside the mean step, the
    median and slowest step of the row (– in a report from before the server kept steps one by one)."""
    if not step_profiles:
        return ""
    lines = ["", "DDTree decode-step phases, GPU ms per step (CUDA events; "
             "`sglang_ddtree.profiling.ddtree_step_profile`; `· width N`: the cell's steps that verified N nodes; "
             "step: the mean, then the median and the slowest step):",
             "", "| config | datasets | T | conc. | steps | " + " | ".join(PHASES) + " | step | median | max |",
             "|:--|:--|--:|--:|--:|" + "--:|" * (len(PHASES) + 3)]  # fmt: skip
    for p in step_profiles:
        spread = p.get("step_ms_spread") or {}
        rows = [(p["config"], p["steps"], p["phase_ms"], spread.get("all"))]
        by_width = p.get("phase_ms_by_width") or {}
        if len(by_width) > 1:
            rows += [(f"{p['config']} · width {w}", cell["steps"], cell["phase_ms"], spread.get(w))
                     for w, cell in sorted(by_width.items(), key=lambda item: int(item[0]))]  # fmt: skip
        for config, steps, phase_ms, kept in rows:
            phases = [phase_ms[phase] for phase in PHASES]
            ends = f"{kept['median_ms']:.3f} | {kept['max_ms']:.3f}" if kept else "– | –"
            lines.append(f"| {config} | {','.join(p['datasets'])} | {p['temperature']:g} | {p['concurrency']} | "
                         f"{steps} | " + " | ".join(f"{ms:.3f}" for ms in phases)
                         + f" | {sum(phases):.3f} | {ends} |")  # fmt: skip
    return "\n".join(lines) + "\n"


# --- running ------------------------------------------------------------------------------------------


def stream_generate(url: str, payload: dict, timeout: float = 1800) -> tuple[float, float, float, dict]:
    """POST a streaming ``/generate``; returns (start, first token, end, last chunk)."""
    request = urllib.request.Request(url + "/generate", data=json.dumps({**payload, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    start = time.perf_counter()
    first, last = None, None
    with urllib.request.urlopen(request, timeout=timeout) as response:
        for line in response:
            line = line.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data:") :])
            if first is None and chunk.get("meta_info", {}).get("completion_tokens", 0) > 0:
                first = time.perf_counter()
            last = chunk
    end = time.perf_counter()
    if last is None:
        raise RuntimeError("the server streamed no chunk")
    return start, first or end, end, last


def flush_prefix_cache(url: str) -> None:
    """Empty the server's prefix cache; SGLang refuses (400) while a request still runs, ``?timeout=`` waits for
    its scheduler to go idle first."""
    urllib.request.urlopen(urllib.request.Request(url + "/flush_cache?timeout=60", method="POST"), timeout=120)


def run_cell(url: str, config: str, prompts: list[dict], temperature: float, concurrency: int,
             max_new_tokens: int, ignore_eos: bool = False) -> list[RequestRecord]:  # fmt: skip
    params = {"max_new_tokens": max_new_tokens, "temperature": temperature, "ignore_eos": ignore_eos}

    def one(prompt: dict) -> RequestRecord:
        start, first, end, last = stream_generate(url, {"input_ids": prompt["input_ids"], "sampling_params": params})
        meta = last["meta_info"]
        return RequestRecord(
            config=config, dataset=prompt["dataset"], prompt_id=prompt["id"], temperature=temperature,
            concurrency=concurrency, start=start, first_token=first, end=end,
            completion_tokens=int(meta["completion_tokens"]), verify_ct=int(meta.get("spec_verify_ct") or 0),
            accept_histogram=list(meta.get("spec_accept_histogram") or []), output_ids=list(last.get("output_ids") or []),
        )  # fmt: skip

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, prompts))


def ar_top2_logprobs(url: str, prompts: list[dict], max_new_tokens: int) -> dict[str, list[tuple[float, float, int]]]:
    """AR's top-1/top-2 log-probabilities and the token it chose at each greedy position (an untimed pass)."""
    out = {}
    for prompt in prompts:
        request = urllib.request.Request(url + "/generate", headers={"Content-Type": "application/json"}, data=json.dumps({
            "input_ids": prompt["input_ids"], "return_logprob": True, "top_logprobs_num": 2,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}).encode())  # fmt: skip
        with urllib.request.urlopen(request, timeout=1800) as response:
            result = json.loads(response.read())
        top = result["meta_info"]["output_top_logprobs"]
        out[prompt["id"]] = [(step[0][0], step[1][0], token) for step, token in zip(top, result["output_ids"])]
    return out


def tokenized_prompts(rows: list[dict], model_path: str) -> list[dict]:
    """``input_ids`` per prompt: MT-Bench through the chat template (when the model has one), HumanEval raw."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    out = []
    for row in rows:
        text = row["prompt"]
        if row["dataset"] == "mt_bench" and getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 tokenize=False)  # fmt: skip
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            ids = tokenizer(text)["input_ids"]
        out.append({**row, "input_ids": ids})
    return out


def configurations(args: argparse.Namespace) -> dict[str, list[str]]:
    """Launcher arguments per configuration name (DDTree once per budget; ``auto`` as ``ddtree auto``)."""
    common = ["--model-path", args.model_path, "--tp", str(args.tp)]
    drafter = ["--draft-model-path", args.draft_model_path] if args.draft_model_path else []
    configs = {}
    for algo in args.algos:
        if algo == "ddtree":
            for budget in args.budgets:
                if budget == "auto":
                    table = ["--step-time-table", args.step_time_table] if args.step_time_table else []
                    configs["ddtree auto"] = ["--algo", "ddtree", *common, *drafter, "--budget", "auto", *table]
                else:
                    configs[f"ddtree B={budget}"] = ["--algo", "ddtree", *common, *drafter, "--budget", str(budget)]
        else:
            configs[algo] = ["--algo", algo, *common, *(drafter if algo == "dflash" else [])]
    return configs


def refused_configuration(configs: dict[str, list[str]], shared: list[str]) -> Optional[str]:
    """The launcher's own one-line error for the first configuration it refuses (``--dry-run``: no server,
    no GPU), so that an impossible configuration stops the run before any other is measured."""
    import subprocess

    def dry_run(launch_args: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "sglang_ddtree.launch", *launch_args, *shared, "--dry-run"],
                              capture_output=True, text=True)  # fmt: skip

    with ThreadPoolExecutor(max(1, len(configs))) as pool:  # each dry run imports SGLang: seconds apiece
        results = dict(zip(configs, pool.map(dry_run, configs.values())))
    for config, result in results.items():
        if result.returncode != 0:
            reason = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
            return f"configuration '{config}' is refused: {reason}"
    return None


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Own options, and the shared SGLang server flags after ``--``."""
    own, shared = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = OneLineArgumentParser(prog="python -m bench.side_by_side", description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--draft-model-path")
    parser.add_argument("--algos", type=lambda s: s.split(","), default=list(ALGORITHMS))
    parser.add_argument("--budgets", type=budget_list, default=[32],
                        help="DDTree budgets (one configuration each); 'auto' as the launcher's --budget auto")
    parser.add_argument("--step-time-table", help="fixed step times for the 'ddtree auto' configuration (launcher "
                        "flag; without it the server measures its own)")  # fmt: skip
    parser.add_argument("--concurrency", type=int_list, default=[1, 4, 16])
    parser.add_argument("--temperatures", type=lambda s: [float(x) for x in s.split(",")], default=[0.0, 1.0])
    parser.add_argument("--datasets", type=lambda s: s.split(","), default=["mt_bench", "humaneval"])
    parser.add_argument("--num-prompts", type=int, default=0, help="per dataset (0: all)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--wheel-dir", default=str(Path.home() / ".cache" / "sglang_ddtree" / "wheels"))
    parser.add_argument("--url", action="append", default=[], help="CONFIG=URL: attach instead of launching")
    parser.add_argument("--out", required=True)
    parser.add_argument("--profile-steps", action="store_true",
                        help=f"DDTree servers time their decode-step phases ({PROFILE_STEPS_ENV}=1: CUDA events, no "
                        "host sync); the per-cell split is added to the report")  # fmt: skip
    parser.add_argument("--ignore-eos", action="store_true", help="every request generates --max-new-tokens")
    parser.add_argument("--simulate-tau", type=simulated_taus, default={},
                        help="ALGO=MEAN,...: that algorithm's servers simulate acceptance (SGLANG_SIMULATE_ACC_LEN, "
                        "cost only)")  # fmt: skip
    parser.add_argument("--simulate-tau-by-width", action="append", default=[], metavar="CONFIG=WIDTH:MEAN,...",
                        help="a DDTree configuration's simulated mean per verify width (e.g. 'ddtree auto=2:1.5,"
                        "17:4.06'; SGLANG_DDTREE_SIMULATE_ACC_BY_WIDTH, cost only): what --budget auto chooses from")
    parser.add_argument("--tokenizer-path", help="tokenizer of the prompts (default: the model's; for a config-only "
                        "random-weight model folder)")  # fmt: skip
    parser.add_argument("--random-prompt-len", type=int, default=1024,
                        help="tokens per prompt of --datasets random")  # fmt: skip
    parser.add_argument("--resume", action="store_true",
                        help="keep the configurations already measured in --out and run only the others")
    parser.add_argument("--rounds", type=int, default=0,
                        help="each cell sends its first ROUNDS x concurrency prompts (0: every prompt in every cell): "
                        "cells of similar length at every concurrency")  # fmt: skip
    args = parser.parse_args(own)
    unknown = sorted(set(args.algos) - set(ALGORITHMS))
    if unknown:
        parser.error(f"unknown algorithm(s) {', '.join(unknown)}; choose from {', '.join(ALGORITHMS)}")
    if any(a in args.algos for a in ("dflash", "ddtree")) and not args.draft_model_path:
        parser.error("dflash and ddtree need --draft-model-path")
    if any("=" not in item for item in args.url):
        parser.error("--url takes CONFIG=URL, e.g. 'ddtree B=32=http://127.0.0.1:30000'")
    fixed_budgets = [b for b in args.budgets if b != "auto"]
    if not args.concurrency or min(args.concurrency) < 1 or not args.budgets or min(fixed_budgets, default=1) < 1:
        parser.error("--concurrency and --budgets take positive integers")
    if args.step_time_table and "auto" not in args.budgets:
        parser.error("--step-time-table is the table of --budgets auto")
    if {key.split()[0] for key in args.simulate_tau} - ({"mtp", "dflash", "ddtree"} & set(args.algos)):
        parser.error("--simulate-tau names speculative algorithms of --algos (mtp, dflash, ddtree)")
    try:
        args.simulate_tau_by_width = simulated_width_tables(args.simulate_tau_by_width)
    except ValueError as e:
        parser.error(f"--simulate-tau-by-width: {e}")
    unknown_configs = set(args.simulate_tau_by_width) - set(configurations(args))
    if unknown_configs:
        parser.error(f"--simulate-tau-by-width names {', '.join(sorted(unknown_configs))}: not a configuration of "
                     f"this run ({', '.join(configurations(args))})")  # fmt: skip
    if "random" in args.datasets and (args.num_prompts < 1 or args.random_prompt_len < 1):
        parser.error("--datasets random needs --num-prompts and --random-prompt-len of at least 1")
    if args.rounds < 0:
        parser.error("--rounds takes a non-negative integer")
    return args, shared


def budget_list(text: str) -> list:
    """argparse type: comma-separated budgets, integers or ``auto``, e.g. ``16,32,auto``."""
    items = [item for item in text.split(",") if item]
    if not all(item == "auto" or item.lstrip("-").isdigit() for item in items):
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of budgets (integers or auto)")
    return [item if item == "auto" else int(item) for item in items]


def simulated_taus(text: str) -> dict[str, float]:
    """``dflash=1.42,ddtree=1.9,ddtree B=64=2.1`` -> ``{"dflash": 1.42, "ddtree": 1.9, "ddtree B=64": 2.1}``: per
    algorithm, or per configuration name (which wins); a mean acceptance length is >= 1."""
    taus = {}
    for item in text.split(","):
        algo, _, mean = item.rpartition("=")
        try:
            taus[algo] = float(mean)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{item}' is not ALGO=MEAN") from None
        if taus[algo] < 1:
            raise argparse.ArgumentTypeError(f"'{item}': a mean acceptance length is at least 1")
    return taus


def simulated_width_tables(items: list[str]) -> dict[str, str]:
    """``["ddtree auto=2:1.5,17:4.06"]`` -> ``{"ddtree auto": "2:1.5,17:4.06"}`` (``--simulate-tau-by-width``), each
    table checked as the server will read it."""
    from sglang_ddtree.speculative.ddtree_simulation import parse_width_means

    tables = {}
    for item in items:
        config, _, table = item.rpartition("=")
        if not config.startswith("ddtree"):
            raise ValueError(f"'{item}' is not DDTREE_CONFIG=WIDTH:MEAN,..., e.g. 'ddtree auto=2:1.5,17:4.06'")
        parse_width_means(table)
        tables[config] = table
    return tables


def simulation_env(config: str, simulate_tau: dict[str, float], width_tables: Optional[dict[str, str]] = None
                   ) -> dict[str, str]:  # fmt: skip
    """SGLang's cost-only acceptance knob for a configuration that ``--simulate-tau`` names, or whose algorithm it
    names; for one that ``--simulate-tau-by-width`` names, its width table beside the knob (set to the widest
    width's mean unless ``--simulate-tau`` gives one: SGLang simulates only while it is positive)."""
    tau = simulate_tau.get(config, simulate_tau.get(config.split()[0]))
    table = (width_tables or {}).get(config)
    if table is not None:
        from sglang_ddtree.speculative.ddtree_simulation import BY_WIDTH_ENV, parse_width_means

        tau = tau if tau is not None else parse_width_means(table)[-1][1]
        return {"SGLANG_SIMULATE_ACC_LEN": str(tau), BY_WIDTH_ENV: table}
    return {"SGLANG_SIMULATE_ACC_LEN": str(tau)} if tau is not None else {}


def random_prompts(count: int, length: int, model_path: str, tokenizer_path: Optional[str] = None,
                   seed: int = 0) -> list[dict]:  # fmt: skip
    """``count`` prompts of ``length`` seeded random token ids below the model's and the tokenizer's vocabulary
    (SGLang's ``random-ids`` idea): the cost of a prompt length, no text."""
    import torch
    from transformers import AutoTokenizer

    from sglang_ddtree.model_configs import load_config, text_config

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path or model_path)
    vocab = min(len(tokenizer), int(text_config(load_config(model_path))["vocab_size"]))
    generator = torch.Generator().manual_seed(seed)
    return [{"id": f"random/{i}", "dataset": "random", "prompt": None,
             "input_ids": torch.randint(0, vocab, (length,), generator=generator).tolist()}
            for i in range(count)]  # fmt: skip


def main(argv: Optional[list[str]] = None) -> None:
    from tqdm import tqdm

    from bench import prompts as prompt_sets

    args, shared = parse_args(sys.argv[1:] if argv is None else argv)
    configs = configurations(args)
    attached = dict(item.rsplit("=", 1) for item in args.url)  # config names contain "=" (ddtree B=32)
    refused = refused_configuration({c: a for c, a in configs.items() if c not in attached}, shared)
    if refused:
        print(f"python -m bench.side_by_side: error: {refused}", file=sys.stderr)
        sys.exit(2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in (d for d in args.datasets if d != "random"):
        chosen = prompt_sets.load([name], args.wheel_dir)
        rows += chosen[: args.num_prompts] if args.num_prompts else chosen
    tokenizer = args.tokenizer_path or args.model_path
    prompts = tokenized_prompts(rows, tokenizer)
    if "random" in args.datasets:
        prompts += random_prompts(args.num_prompts, args.random_prompt_len, args.model_path, tokenizer)
    warmup = tokenized_prompts([{"id": f"warmup/{i}", "dataset": "warmup", "prompt": p}
                                for i, p in enumerate(WARMUP_PROMPTS)], tokenizer)  # fmt: skip
    if "random" in args.datasets:
        # Prompts as long as the measured ones (other token ids): a long prefill's one-time costs (kernels tuned
        # or compiled for its length) fall in the warm-up, not in the first cell's time to first token.
        warmup += [{**p, "id": f"warmup/random/{i}", "dataset": "warmup"}
                   for i, p in enumerate(random_prompts(len(WARMUP_PROMPTS), args.random_prompt_len, args.model_path,
                                                        tokenizer, seed=1))]  # fmt: skip
    if args.rounds and len(prompts) < args.rounds * max(args.concurrency):
        print(f"python -m bench.side_by_side: error: --rounds {args.rounds} at concurrency {max(args.concurrency)} "
              f"needs {args.rounds * max(args.concurrency)} prompts; the datasets give {len(prompts)}", file=sys.stderr)
        sys.exit(2)
    if args.resume:
        refuse_another_cards_report(out / "side_by_side.json", _device_name(), "bench.side_by_side")
    records, ar_top2, commands, step_profiles = resumed(out) if args.resume else ([], {}, {}, [])
    done = {r.config for r in records}
    meta = {"date": time.strftime("%Y-%m-%d"), "commit": checkout_commit(), "gpu": _device_name(), "model_path": args.model_path, "tp": args.tp,
            "max_new_tokens": args.max_new_tokens, "commands": commands, "shared_flags": shared, "args": vars(args),
            "simulated_tau": args.simulate_tau, "simulated_tau_by_width": args.simulate_tau_by_width,
            "auto_budget_cells": previous_auto_budget_cells(out) if args.resume else []}  # fmt: skip
    cells = [(t, c) for t in args.temperatures for c in args.concurrency]
    todo = {config: launch_args for config, launch_args in configs.items() if config not in done}
    cell_prompts = {c: prompts[: args.rounds * c] if args.rounds else prompts for c in args.concurrency}
    with tqdm(total=len(todo) * sum(len(cell_prompts[c]) for _, c in cells), unit="req") as progress:
        for config, launch_args in todo.items():
            commands[config] = ["python", "-m", "sglang_ddtree.launch", *launch_args, *shared]
            log = str(out / f"server_{config.replace(' ', '_')}.log")
            profile = args.profile_steps and config.startswith("ddtree")
            env = {**({PROFILE_STEPS_ENV: "1"} if profile else {}),
                   **simulation_env(config, args.simulate_tau, args.simulate_tau_by_width)}  # fmt: skip
            with launched_server([*launch_args, *shared], log_path=log, env=env or None, ready_timeout=900) \
                    if config not in attached else _attached(attached[config]) as url:  # fmt: skip
                run_cell(url, config, warmup, 0.0, 1, WARMUP_NEW_TOKENS)
                flush_prefix_cache(url)
                if config == "ar" and 0.0 in args.temperatures and not (args.simulate_tau or args.simulate_tau_by_width):
                    ar_top2 = ar_top2_logprobs(url, prompts, args.max_new_tokens)
                for temperature, concurrency in cells:
                    progress.set_description(f"{config} T={temperature:g} c={concurrency}")
                    warm_up_cell(url, config, warmup, temperature, concurrency, args.max_new_tokens)
                    before = server_step_profile(url) if profile else None
                    auto_before = server_state(url, "ddtree_budget_auto") if config == "ddtree auto" else None
                    records += run_cell(url, config, cell_prompts[concurrency], temperature, concurrency,
                                        args.max_new_tokens, args.ignore_eos)  # fmt: skip
                    if config == "ddtree auto":
                        meta["auto_budget_cells"].append(auto_budget_cell(url, temperature, concurrency, auto_before))
                    if before is not None:
                        after = server_step_profile(url)
                        step_profiles.append({"config": config, "datasets": args.datasets, "temperature": temperature,
                                              "concurrency": concurrency, "steps": after["steps"] - before["steps"],
                                              "phase_ms": phase_means(before, after),
                                              "phase_ms_by_width": phase_means_by_width(before, after),
                                              "step_ms_spread": step_ms_spread(before, after)})  # fmt: skip
                    progress.update(len(cell_prompts[concurrency]))
            # After every configuration, so that a run cut short (or resumed later) keeps what it measured.
            write_report(out, meta, records, ar_top2, step_profiles)
    print((out / "side_by_side.md").read_text())


WARMUP_NEW_TOKENS = 32


def warm_up_cell(url: str, config: str, warmup: list[dict], temperature: float, concurrency: int,
                 max_new_tokens: int) -> None:  # fmt: skip
    """Run the cell's batch shape once on warm-up prompts before it is measured (one-time costs of a new batch
    size: graph selection, allocator growth, JIT of a kernel variant, land here and not in the first measured
    requests), then flush the prefix cache, so that every cell starts from the same cache state.

    ``ddtree auto`` warms up on the cell's whole output length: its widths' step times at this batch size are
    measured, and its calibration learns, on its first steps there, and each (width, batch size) it meets first
    may compile a kernel variant. On 32 tokens a cell of 16 requests ran ~8 decode steps, and the measured cell
    after it verified its widest trees on 20% of its steps while the policy settled, and stalled up to 2.8 s on
    compiles (tests/gpu/RESULTS.md run 92)."""
    batch = [warmup[i % len(warmup)] for i in range(max(concurrency, len(warmup)))]
    if config == "ddtree auto":
        run_cell(url, config, batch, temperature, concurrency, max_new_tokens, ignore_eos=True)
    else:
        run_cell(url, config, batch, temperature, concurrency, WARMUP_NEW_TOKENS)
    flush_prefix_cache(url)


def auto_budget_cell(url: str, temperature: float, concurrency: int, before: dict) -> dict:
    """The widths ``--budget auto`` verified in one cell (steps per width, warm-up excluded), how many of those
    verifies replayed their width's graphs (where the server captured per-width graphs) and the step times it had
    measured by its end."""
    after = server_state(url, "ddtree_budget_auto")
    cell = {"temperature": temperature, "concurrency": concurrency, "widths": after["widths"],
            "steps": [a - b for a, b in zip(after["steps"], before["steps"])],
            "measured_step_ms": after.get("measured_step_ms")}  # fmt: skip
    if "graph_replays" in after:
        cell["graph_replays"] = {str(w): a - b for w, a, b in zip(after["graph_widths"], after["graph_replays"],
                                                                  before["graph_replays"])}  # fmt: skip
    return cell


def previous_auto_budget_cells(out: Path) -> list[dict]:
    path = out / "side_by_side.json"
    return json.loads(path.read_text())["meta"].get("auto_budget_cells", []) if path.is_file() else []


def resumed(out: Path) -> tuple[list[RequestRecord], dict, dict, list[dict]]:
    """Records, AR's top-2 log-probabilities, commands and step profiles of the report already in ``out``
    (``--resume``)."""
    path = out / "side_by_side.json"
    if not path.is_file():
        return [], {}, {}, []
    report = json.loads(path.read_text())
    records = [RequestRecord(**r) for r in report["requests"]]
    ar_top2 = {k: [tuple(pair) for pair in v] for k, v in report.get("ar_top2", {}).items()}
    return records, ar_top2, dict(report["meta"].get("commands", {})), list(report.get("step_profiles", []))


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


class _attached:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def __enter__(self) -> str:
        return self.url

    def __exit__(self, *exc) -> None:
        return None


if __name__ == "__main__":
    main()
