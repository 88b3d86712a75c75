"""Where a decode step's wall time goes: AR, DFLASH and DDTree at batch 1 and 8, host and GPU.

    python -m bench.step_profile --model-path P --draft-model-path D [--algos ar,dflash,ddtree]
        [--budgets 16,32,64] [--batch-sizes 1,8] [--datasets mt_bench,humaneval] [--max-new-tokens 256]
        [--ignore-eos] [--simulate-tau dflash=1.42,ddtree=1.90] [--sync-debug] [--trace-steps 0]
        [--ab-env NAME=VALUE] [--widths 1,2,4,8,16,33 [--write-step-table FILE]] [--host-profile]
        [--prompt-lengths 128,2048,8192,32768] --out DIR
        [-- shared SGLang server flags ...]

Per configuration (launched in turn through the launcher, as ``bench.side_by_side`` does) and batch size, after
a warm-up at that batch size:

1. **untraced step wall**: ``batch`` concurrent greedy requests; per request, decode time over verify steps
   (TPOT x tau; AR: over its decode steps). This is how long a step really takes.
2. **GPU phases** of DDTree's step (``SGLANG_DDTREE_PROFILE_STEPS``: CUDA events, no host sync).
3. **host time per scheduler iteration** of the scheduler's functions, the worker's phases and SGLang's verify
   functions (``SGLANG_DDTREE_TRACE_RANGES=1``: a host clock around each, read from ``/server_info``; see
   ``sglang_ddtree.profiling.ddtree_trace_ranges``), over the same requests as the step wall.
4. optionally (``--host-profile``) **the Python functions of the host time**: the servers run their decode
   iterations under cProfile (``SGLANG_DDTREE_HOST_PROFILE=1``, see ``sglang_ddtree.profiling.ddtree_host_profile``);
   per cell, the functions with the most own milliseconds per iteration. The profiler charges every Python call, so
   such a run's step walls are inflated: its shares are what it measures.
5. optionally (``--trace-steps N``) **a torch-profiler trace** of N steps (CPU and GPU; the same functions as
   profiler ranges, no Python stacks), accounted step by step by ``bench.step_trace``: host time blocked in
   syncs, kernel and graph launches, GPU busy and idle time. On the H200 machine SGLang 0.5.17's scheduler
   died freeing the profiler's result after the first trace (RESULTS.md runs 34, 36): off by default.

A step's cost depends on shapes, not weights: with ``--load-format dummy`` after ``--`` (random target weights)
and ``--ignore-eos``, ``--simulate-tau ALGO=MEAN`` makes that algorithm's servers commit a drawn length of mean
MEAN per verify (SGLang's ``SGLANG_SIMULATE_ACC_LEN``; DDTREE along each tree's best branch), so a model's
shape is profiled at a measured acceptance without its weights. The report says which cells simulated.
``--sync-debug`` makes each server log, once per source line, every call of its decode loop that synchronises
with the GPU (torch's sync debug mode).

``--prompt-lengths L1,L2,...`` measures every cell again at each prompt length (the benchmark prompts' tokens
repeated to exactly L tokens, so the requests share no prefix): how a step's cost grows with the context. The
server then needs ``--context-length`` (and, past the model's own, ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1``).

``--ab-env NAME=VALUE`` measures every DDTree configuration twice, as it is and as ``ddtree B=32 NAME=VALUE``
with that variable in its server's environment: a switch's before/after in one run (e.g.
``SGLANG_DDTREE_FLASHINFER_SYNC_FREE_PLAN=0``).

``--widths 1,2,...,W`` also measures DDTree at each verify width ``w`` as ``--budget auto`` runs it (``ddtree W=w``:
an auto server whose table makes every step verify ``w`` nodes of the widest tree, ``W``; at ``w = 1`` the
policy's probe still drafts every 16th step, at width 2). ``--write-step-table FILE`` writes those cells' step
wall times as the ``--step-time-table`` of ``--budget auto`` (``{"widths", "batch_sizes", "step_ms"}`` plus
where they were measured).

Writes ``step_profile.json`` (every number, the traces' paths, the commands) and ``step_profile.md`` after
every configuration; the traces stay under ``DIR/traces``.
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Optional

from bench import step_trace
from bench.provenance import checkout_commit
from bench.side_by_side import (
    WARMUP_PROMPTS,
    RequestRecord,
    _device_name,
    budget_list,
    configurations,
    refused_configuration,
    run_cell,
    simulated_taus,
    simulation_env,
    tokenized_prompts,
)
from sglang_ddtree.cli import OneLineArgumentParser, int_list
from sglang_ddtree.profiling.ddtree_host_profile import HOST_PROFILE_ENV, per_iteration
from sglang_ddtree.profiling.ddtree_step_profile import PROFILE_STEPS_ENV, phase_means, server_step_profile
from sglang_ddtree.serving import launched_server, server_state


def step_wall_ms(record: RequestRecord) -> Optional[float]:
    """Decode wall time per step of one request: per verify for speculative ones, per token for AR."""
    steps = record.verify_ct or record.completion_tokens - 1
    return 1000 * (record.end - record.first_token) / steps if steps > 0 else None


def server_host_ranges(url: str) -> Optional[dict]:
    """A running server's ``ddtree_host_ranges`` (``SGLANG_DDTREE_TRACE_RANGES=1``), else None."""
    return server_state(url, "ddtree_host_ranges")


def host_ms_per_iteration(before: Optional[dict], after: Optional[dict]) -> Optional[dict]:
    """Host ms per scheduler iteration (``run_batch`` call) of each range, and its calls per iteration, over
    the requests measured between two ``ddtree_host_ranges`` snapshots (prefills included, as in the wall)."""
    if not before or not after or "run_batch" not in after:
        return None
    iterations = after["run_batch"]["calls"] - before.get("run_batch", {}).get("calls", 0)
    if iterations <= 0:
        return None
    out = {"iterations": iterations}
    for name, now in after.items():
        then = before.get(name, {"calls": 0, "total_ms": 0.0})
        if now["calls"] > then["calls"]:
            out[name] = {"ms": round((now["total_ms"] - then["total_ms"]) / iterations, 4),
                         "calls": round((now["calls"] - then["calls"]) / iterations, 3)}  # fmt: skip
    return out


def _post(url: str, payload: dict) -> None:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        response.read()


def traced_steps(url: str, config: str, prompts: list[dict], batch: int, max_new_tokens: int, steps: int,
                 trace_dir: Path, ignore_eos: bool = False) -> dict:  # fmt: skip
    """Trace the first ``steps`` decode steps of ``batch`` requests and account them (``bench.step_trace``).

    The profiler is armed by stage before the requests are sent: SGLang writes the prefill steps to one trace and
    starts a second at the first decode batch, so a short generation is not missed and no prefill is counted.
    """
    trace_dir.mkdir(parents=True, exist_ok=True)
    _post(url + "/start_profile", {"output_dir": str(trace_dir), "num_steps": steps, "activities": ["CPU", "GPU"],
                                   "with_stack": False, "record_shapes": False, "profile_by_stage": True})  # fmt: skip
    run_cell(url, config, prompts[:batch], 0.0, batch, max_new_tokens, ignore_eos)
    deadline = time.monotonic() + 120
    while not (traces := sorted(glob.glob(str(trace_dir / "*DECODE*.json*")))) and time.monotonic() < deadline:
        time.sleep(1)
    if not traces:
        return {"error": f"no decode trace written under {trace_dir}"}
    accounted = step_trace.median_step(step_trace.account_steps(step_trace.load_trace(traces[-1])))
    return {"trace": traces[-1], **accounted} if accounted else {"error": f"no complete step in {traces[-1]}"}


def profile_cell(url: str, config: str, prompts: list[dict], batch: int, args: argparse.Namespace,
                 out: Path, phases: bool, prompt_label: str = "benchmark") -> dict:  # fmt: skip
    """Warm up at ``batch``, then the untraced step wall, DDTree's GPU phases and the traced split."""
    warmup = (prompts * batch)[: max(batch, 2)]
    run_cell(url, config, warmup, 0.0, batch, 32, args.ignore_eos)
    before, host_before = server_step_profile(url) if phases else None, server_host_ranges(url)
    functions_before = server_state(url, "ddtree_host_profile") if args.host_profile else None
    records = run_cell(url, config, prompts[: 2 * batch], 0.0, batch, args.max_new_tokens, args.ignore_eos)
    after, host_after = server_step_profile(url) if phases else None, server_host_ranges(url)
    functions_after = server_state(url, "ddtree_host_profile") if args.host_profile else None
    tokens, verifies = sum(r.completion_tokens for r in records), sum(r.verify_ct for r in records)
    cell = {
        "config": config, "batch": batch, "requests": len(records),
        "step_wall_ms": round(statistics.median(w for r in records if (w := step_wall_ms(r)) is not None), 3),
        "tau": round(tokens / verifies, 3) if verifies else None,
        "gpu_phase_ms": {p: round(ms, 3) for p, ms in phase_means(before, after).items()} if phases else None,
        "simulated_tau": args.simulate_tau.get(config.split()[0]),
        "host_ms_per_iteration": host_ms_per_iteration(host_before, host_after),
        # --budget auto: steps per width so far, and the step times the server measured (milliseconds per width)
        "auto_budget": server_state(url, "ddtree_budget_auto") if config == "ddtree auto" else None,
        # --host-profile: the Python functions per decode iteration (cProfile; the step wall above is inflated)
        "host_profile": per_iteration(functions_before, functions_after) if functions_after else None,
    }  # fmt: skip
    if not args.trace_steps:
        return cell
    slug = config.replace(" ", "_").replace("=", "")
    cell["traced"] = traced_steps(url, config, prompts, batch, args.max_new_tokens, args.trace_steps,
                                  out / "traces" / slug / f"bs{batch}_{prompt_label}", args.ignore_eos)  # fmt: skip
    return cell


HOST_RANGE_ORDER = (*step_trace.SCHEDULER_FUNCTIONS[1:], *step_trace.WORKER_FUNCTIONS, *step_trace.SPEC_FUNCTIONS)


def prompts_of_length(prompts: list[dict], length: int) -> list[dict]:
    """Each prompt's tokens repeated and cut to exactly ``length`` (distinct prompts stay distinct from their
    first token on, so concurrent requests share no cached prefix)."""
    out = []
    for prompt in prompts:
        ids = prompt["input_ids"]
        out.append({**prompt, "id": f"{prompt['id']}@{length}", "input_ids": (ids * (length // len(ids) + 1))[:length]})
    return out


def tau_text(cell: dict) -> str:
    tau = cell["tau"] or "–"
    return f"{tau} (simulated, mean {cell['simulated_tau']})" if cell.get("simulated_tau") else str(tau)


def prompt_text(cell: dict) -> str:
    return str(cell["prompt_tokens"]) if cell.get("prompt_tokens") else "benchmark"


def markdown(report: dict) -> str:
    meta = report["meta"]
    lines = [
        "# Step profile: where a decode step's wall time goes",
        "",
        f"{meta['date']} · commit {meta['commit']} · {meta['gpu']} · model {meta['model_path']} · "
        f"{meta['max_new_tokens']} new tokens, greedy",
        "",
        "Untraced: step wall = decode time / steps (median over requests), DDTree's GPU phases from CUDA events. "
        "Traced (torch profiler, CPU + GPU, SGLang's and the worker's ranges): median per scheduler iteration.",
        "",
        "| config | bs | prompt tokens | tau | step wall ms | GPU phases ms | traced wall ms | GPU busy | GPU idle | "
        "host sync | launches (graphs) | run_batch | process_batch_result | schedule | other host |",
        "|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for c in report["cells"]:
        t = c.get("traced", {})
        s = t.get("scheduler_ms", {})
        phases = f"{sum(c['gpu_phase_ms'].values()):.2f}" if c.get("gpu_phase_ms") else "–"
        if "wall_ms" not in t:
            lines.append(f"| {c['config']} | {c['batch']} | {prompt_text(c)} | {tau_text(c)} | "
                         f"{c['step_wall_ms']:.2f} | {phases} | {t.get('error', '–')} | | | | | | | | |")  # fmt: skip
            continue
        other = t["wall_ms"] - s["run_batch"] - s["process_batch_result"] - s["get_next_batch_to_run"]
        lines.append(
            f"| {c['config']} | {c['batch']} | {prompt_text(c)} | {tau_text(c)} | {c['step_wall_ms']:.2f} | {phases} | "
            f"{t['wall_ms']:.2f} | {t['gpu_busy_ms']:.2f} | {t['gpu_idle_ms']:.2f} | {t['sync_ms']:.2f} | "
            f"{t['launches']:.0f} ({t['graph_launches']:.0f}) | {s['run_batch']:.2f} | {s['process_batch_result']:.2f} | "
            f"{s['get_next_batch_to_run']:.2f} | {other:.2f} |"
        )  # fmt: skip
    host_rows = [c for c in report["cells"] if c.get("host_ms_per_iteration")]
    names = [n for n in HOST_RANGE_ORDER if any(n in c["host_ms_per_iteration"] for c in host_rows)]
    if host_rows:
        lines += ["", "Host ms per scheduler iteration (`SGLANG_DDTREE_TRACE_RANGES=1`: host clock around each "
                  "function, untraced run; nested names overlap; `process_batch_result` includes the wait for the "
                  "previous step's results):", "", "| config | bs | prompt tokens | iterations | " + " | ".join(names)
                  + " |", "|:--|--:|--:|--:|" + "--:|" * len(names)]  # fmt: skip
        for c in host_rows:
            h = c["host_ms_per_iteration"]
            lines.append(f"| {c['config']} | {c['batch']} | {prompt_text(c)} | {h['iterations']} | "
                         + " | ".join(f"{h[n]['ms']:.3f}" if n in h else "–" for n in names) + " |")
    worker_rows = [c for c in report["cells"] if c.get("traced", {}).get("worker_ms")]
    functions = [f for f in (*step_trace.WORKER_FUNCTIONS, *step_trace.SPEC_FUNCTIONS)
                 if any(f in c["traced"]["worker_ms"] for c in worker_rows)]  # fmt: skip
    if worker_rows:
        lines += ["", "Host ms per step inside the worker (traced; SGLang's own functions as `spec.*` ranges, nested "
                  "in the worker's):", "", "| config | bs | " + " | ".join(functions) + " |",
                  "|:--|--:|" + "--:|" * len(functions)]  # fmt: skip
        for c in worker_rows:
            w = c["traced"]["worker_ms"]
            lines.append(f"| {c['config']} | {c['batch']} | "
                         + " | ".join(f"{w[f]:.2f}" if f in w else "–" for f in functions) + " |")
    lines += host_profile_markdown(report["cells"])
    return "\n".join(lines) + "\n"


def host_profile_markdown(cells: list[dict], top: int = 25) -> list[str]:
    """Per ``--host-profile`` cell, the functions with the most own milliseconds per decode iteration."""
    lines = []
    for c in cells:
        profile = c.get("host_profile")
        if not profile or not profile["iterations"]:
            continue
        lines += ["", f"Python functions of {c['config']}, batch {c['batch']}, {prompt_text(c)} prompts "
                  f"({profile['iterations']} decode iterations under cProfile, whose step wall is inflated: "
                  f"{c['step_wall_ms']:.2f} ms; own times of all functions: {profile['own_ms']:.2f} ms per iteration):",
                  "", "| function | calls / it | own ms / it |", "|:--|--:|--:|"]  # fmt: skip
        lines += [f"| `{label}` | {calls:g} | {own:.3f} |" for label, calls, own in profile["by_own_ms"][:top]]
    return lines


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    own, shared = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = OneLineArgumentParser(prog="python -m bench.step_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--draft-model-path")
    parser.add_argument("--algos", type=lambda s: s.split(","), default=["ar", "dflash", "ddtree"])
    parser.add_argument("--budgets", type=budget_list, default=[16, 32, 64])
    parser.add_argument("--step-time-table", help="fixed step times for the 'ddtree auto' configuration (--budgets "
                        "...,auto); without it the server measures its own")  # fmt: skip
    parser.add_argument("--widths", type=int_list, default=[],
                        help="also measure DDTree at each of these verify widths (ascending from 1; the last is the "
                        "tree the drafter builds), as --budget auto runs them")  # fmt: skip
    parser.add_argument("--write-step-table", help="write the --widths cells as a --budget auto step time table")
    parser.add_argument("--batch-sizes", type=int_list, default=[1, 8])
    parser.add_argument("--datasets", type=lambda s: s.split(","), default=["mt_bench", "humaneval"])
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--prompt-lengths", type=int_list, default=[],
                        help="measure every cell at each of these prompt lengths (tokens; the benchmark prompts "
                        "repeated), for the step's growth with context")  # fmt: skip
    parser.add_argument("--trace-steps", type=int, default=0,
                        help="also take a torch-profiler trace of this many decode steps per cell (it has crashed "
                        "SGLang 0.5.17's scheduler on the H200 machine)")  # fmt: skip
    parser.add_argument("--sync-debug", action="store_true",
                        help="servers log every synchronising call of their decode loop (SGLANG_DDTREE_SYNC_DEBUG)")
    parser.add_argument("--ignore-eos", action="store_true", help="every request generates --max-new-tokens")
    parser.add_argument("--host-profile", action="store_true",
                        help="servers run their decode iterations under cProfile (SGLANG_DDTREE_HOST_PROFILE): the "
                        "functions of the host time per cell; the step walls of such a run are inflated")  # fmt: skip
    parser.add_argument("--simulate-tau", type=simulated_taus, default={},
                        help="ALGO=MEAN,...: that algorithm's servers simulate acceptance (SGLANG_SIMULATE_ACC_LEN)")
    parser.add_argument("--ab-env", action="append", default=[], metavar="NAME=VALUE",
                        help="also measure every DDTree configuration with NAME=VALUE in its server's environment")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--wheel-dir", default=str(Path.home() / ".cache" / "sglang_ddtree" / "wheels"))
    parser.add_argument("--out", required=True)
    args = parser.parse_args(own)
    if any(not name or "=" not in item for item in args.ab_env for name in [item.partition("=")[0]]):
        parser.error("--ab-env takes NAME=VALUE, e.g. SGLANG_DDTREE_FLASHINFER_SYNC_FREE_PLAN=0")
    unknown = sorted(set(args.algos) - {"ar", "mtp", "dflash", "ddtree"})
    if unknown:
        parser.error(f"unknown algorithm(s) {', '.join(unknown)}; choose from ar, mtp, dflash, ddtree")
    if any(a in args.algos for a in ("dflash", "ddtree")) and not args.draft_model_path:
        parser.error("dflash and ddtree need --draft-model-path")
    if set(args.simulate_tau) - ({"mtp", "dflash", "ddtree"} & set(args.algos)):
        parser.error("--simulate-tau names speculative algorithms of --algos (mtp, dflash, ddtree)")
    if args.step_time_table and "auto" not in args.budgets:
        parser.error("--step-time-table is the table of --budgets auto")
    if args.widths and (args.widths != sorted(set(args.widths)) or args.widths[0] != 1 or "ddtree" not in args.algos):
        parser.error("--widths must ascend from 1 (the last is the drafted tree), with ddtree among --algos")
    if args.prompt_lengths and min(args.prompt_lengths) < 1:
        parser.error("--prompt-lengths take positive integers")
    if args.write_step_table and not args.widths:
        parser.error("--write-step-table needs --widths")
    if not args.batch_sizes or min(args.batch_sizes) < 1 or args.trace_steps == 1 or args.trace_steps < 0 \
            or args.max_new_tokens < 2:
        parser.error("--batch-sizes take positive integers, --trace-steps 0 (no trace) or at least 2, "
                     "--max-new-tokens at least 2")
    return args, shared


def with_ab_variants(configs: dict[str, list[str]], ab_env: list[str]) -> dict[str, tuple[list[str], dict[str, str]]]:
    """``{config: (launcher args, extra env)}``: every configuration, and after each DDTree one its ``--ab-env``
    variants (same arguments, named ``<config> NAME=VALUE``)."""
    out = {}
    for config, launch_args in configs.items():
        out[config] = (launch_args, {})
        if config.startswith("ddtree"):
            for assignment in ab_env:
                name, _, value = assignment.partition("=")
                out[f"{config} {assignment}"] = (launch_args, {name: value})
    return out


def forced_width_configurations(args: argparse.Namespace, out: Path) -> dict[str, list[str]]:
    """``ddtree W=w`` for each ``--widths`` entry: a ``--budget auto`` server whose table (written under ``out``)
    prices ``w`` at 1 ms a step and every other width at a million, so that every step verifies ``w`` nodes."""
    tables = out / "forced_widths"
    tables.mkdir(parents=True, exist_ok=True)
    configs = {}
    for width in args.widths:
        row = [1.0 if w == width else 1e6 for w in args.widths]
        table = tables / f"width_{width}.json"
        table.write_text(json.dumps({"widths": args.widths, "batch_sizes": [1], "step_ms": [row]}))
        configs[f"ddtree W={width}"] = ["--algo", "ddtree", "--model-path", args.model_path, "--tp", str(args.tp),
                                        "--draft-model-path", args.draft_model_path, "--budget", "auto",
                                        "--step-time-table", str(table)]  # fmt: skip
    return configs


def step_time_table(report: dict, widths: list[int], batch_sizes: list[int]) -> dict:
    """The ``ddtree W=w`` cells' step wall milliseconds as ``--budget auto``'s table, with their provenance."""
    wall = {(c["config"], c["batch"]): c["step_wall_ms"] for c in report["cells"]}
    rows = [[wall[f"ddtree W={w}", bs] for w in widths] for bs in batch_sizes]
    meta = report["meta"]
    return {"widths": widths, "batch_sizes": batch_sizes, "step_ms": rows,
            "measured": {"by": "python -m bench.step_profile --widths", "date": meta["date"],
                         "commit": meta["commit"], "gpu": meta["gpu"], "model_path": meta["model_path"]}}  # fmt: skip


def server_env(config: str, args: argparse.Namespace, extra: Optional[dict[str, str]] = None) -> dict[str, str]:
    """Environment of one configuration's server: DDTree's phase timer, the host-timed ranges, the sync debug
    mode and the host profiler when asked, the simulated acceptance asked for that algorithm and the variant's own
    variables."""
    from sglang_ddtree.profiling.ddtree_trace_ranges import SYNC_DEBUG_ENV, TRACE_RANGES_ENV

    env = {PROFILE_STEPS_ENV: "1"} if config.startswith("ddtree") else {}
    env[TRACE_RANGES_ENV] = "1"
    if args.sync_debug:
        env[SYNC_DEBUG_ENV] = "1"
    if args.host_profile:
        env[HOST_PROFILE_ENV] = "1"
    return {**env, **simulation_env(config, args.simulate_tau), **(extra or {})}


def main(argv: Optional[list[str]] = None) -> None:
    from bench import prompts as prompt_sets

    args, shared = parse_args(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    configs = {**configurations(args), **forced_width_configurations(args, out)}
    refused = refused_configuration(configs, shared)
    if refused:
        print(f"python -m bench.step_profile: error: {refused}", file=sys.stderr)
        sys.exit(2)
    rows = [row for name in args.datasets for row in prompt_sets.load([name], args.wheel_dir)]
    prompts = tokenized_prompts(rows[: 2 * max(args.batch_sizes)], args.model_path)
    warm = tokenized_prompts([{"id": f"warmup/{i}", "dataset": "warmup", "prompt": p}
                              for i, p in enumerate(WARMUP_PROMPTS)], args.model_path)  # fmt: skip
    report = {"meta": {"date": time.strftime("%Y-%m-%d"), "commit": checkout_commit(), "gpu": _device_name(),
                       "model_path": args.model_path, "max_new_tokens": args.max_new_tokens, "args": vars(args),
                       "commands": {}}, "cells": []}  # fmt: skip
    for config, (launch_args, extra) in with_ab_variants(configs, args.ab_env).items():
        report["meta"]["commands"][config] = [*(f"{k}={v}" for k, v in extra.items()), "python", "-m",
                                              "sglang_ddtree.launch", *launch_args, *shared]  # fmt: skip
        phases = config.startswith("ddtree")
        log = str(out / f"server_{config.replace(' ', '_')}.log")
        with launched_server([*launch_args, *shared], log_path=log, env=server_env(config, args, extra) or None,
                             ready_timeout=900) as url:  # fmt: skip
            run_cell(url, config, warm, 0.0, 1, 32, args.ignore_eos)
            for length in args.prompt_lengths or [None]:
                cell_prompts = prompts_of_length(prompts, length) if length else prompts
                for batch in args.batch_sizes:
                    cell = profile_cell(url, config, cell_prompts, batch, args, out, phases, str(length or "benchmark"))
                    report["cells"].append({**cell, "prompt_tokens": length})
        (out / "step_profile.json").write_text(json.dumps(report, indent=1))
        (out / "step_profile.md").write_text(markdown(report))
    if args.write_step_table:
        Path(args.write_step_table).write_text(json.dumps(step_time_table(report, args.widths, args.batch_sizes), indent=1))
    print((out / "step_profile.md").read_text())


if __name__ == "__main__":
    main()
