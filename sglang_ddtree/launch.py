"""``python -m sglang_ddtree.launch``: start SGLang's HTTP server for one decoding algorithm.

    python -m sglang_ddtree.launch --algo {ar,mtp,dflash,ddtree} [--model-path P] [--draft-model-path D]
        [--tp N] [--budget B | --budget auto [--step-time-table FILE]] [--dry-run] [any sglang launch_server flag ...]

The launcher only resolves and checks arguments, then runs SGLang's own server in this process; the plugin
entry point registers this package inside every SGLang process. Any flag it does not know passes through to
SGLang unchanged (and, coming last, overrides the presets). Problems are reported as one line on stderr with
exit code 2, before anything heavy is imported.
"""

from __future__ import annotations

import argparse
import glob
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Optional

from sglang_ddtree import AUTO_BUDGET_TREE, DDTREE_ALGORITHM_NAME, DDTREE_DEFAULT_BUDGET, model_configs
from sglang_ddtree.speculative import hybrid_targets
from sglang_ddtree.model_configs import ModelConfigError

ALGORITHMS = ("ar", "mtp", "dflash", "ddtree")
DEFAULT_HOST = "127.0.0.1"
MTP_PRESET = (
    "--speculative-algorithm", "NEXTN",
    "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
)  # fmt: skip

# SGLang 0.5.17's DFlash handling resets an unset --max-running-requests to this (speculative_hook._handle_dflash).
SGLANG_DFLASH_MAX_RUNNING_REQUESTS = 48
# What the launcher assumes of SGLang's automatic --mem-fraction-static (an estimate, for the check below).
ASSUMED_MEM_FRACTION_STATIC = 0.85
# The Qwen hybrids among SGLang 0.5.17's architectures whose prefix cache keeps GDN states with the extra_buffer
# strategy (arg_groups/overrides.py); the only strategy that runs with overlap scheduling.
MAMBA_EXTRA_BUFFER_ARCHS = {
    "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration", "Qwen3NextForCausalLM",
}  # fmt: skip
DEFAULT_MAMBA_TRACK_INTERVAL = 256
GIB = 1 << 30

# SGLang flags that the launcher owns: passing them through would silently fight the launcher's own.
_OWNED_FLAGS = {
    "--model-path": "--model-path",
    "--model": "--model-path",
    "--tp-size": "--tp",
    "--tensor-parallel-size": "--tp",
    "--speculative-algorithm": "--algo",
    "--speculative-draft-model-path": "--draft-model-path",
}


class LaunchError(Exception):
    """A user error; its message is printed as the launcher's single line of output."""


@dataclass(frozen=True)
class LaunchRequest:
    algo: str
    model_path: str | None
    draft_model_path: str | None
    tp: int
    budget: int | str | None  # tree nodes, or "auto"
    host: str
    passthrough: tuple[str, ...]
    step_time_table: str | None = None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sglang_ddtree.launch",
        description="Serve a model with SGLang using AR, MTP, DFlash or DDTree decoding. "
        "Unknown flags are passed to SGLang's launch_server unchanged.",
    )
    parser.add_argument("--algo", required=True, help="decoding algorithm: " + ", ".join(ALGORITHMS))
    parser.add_argument(
        "--model-path",
        help="target model folder or Hugging Face id (default: the embedded SmolLM2-135M-Instruct demo)",
    )
    parser.add_argument(
        "--draft-model-path",
        help="DFlash drafter folder or id (dflash, ddtree; default with the demo model: its shipped drafter)",
    )
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    parser.add_argument(
        "--budget",
        help=f"ddtree: tree nodes per request, root excluded, or 'auto' (the default; {HYBRID_DEFAULT_BUDGET} on a "
        f"hybrid GDN target): each step verifies the prefix of a {AUTO_BUDGET_TREE}-node tree that commits the most "
        "tokens per second, step times measured by the server on its first steps at each batch size",
    )
    parser.add_argument(
        "--step-time-table",
        help="ddtree --budget auto: fixed step times instead of measured ones, a JSON of step milliseconds per batch "
        "size and verify width on this model and GPU (its widest width is the tree's)",
    )
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"bind address (default {DEFAULT_HOST})")
    parser.add_argument("--dry-run", action="store_true", help="print the SGLang command line and exit")
    return parser


def parse_request(argv: Sequence[str]) -> tuple[LaunchRequest, bool]:
    """Split ``argv`` into the launcher's own options and SGLang pass-through flags."""
    args, passthrough = build_parser().parse_known_args(list(argv))
    for flag in passthrough:
        owned_by = _OWNED_FLAGS.get(flag.split("=", 1)[0])
        if owned_by:
            raise LaunchError(f"use the launcher's {owned_by} instead of SGLang's {flag.split('=', 1)[0]}")
    if args.algo not in ALGORITHMS:
        raise LaunchError(f"unknown --algo '{args.algo}'; choose one of {', '.join(ALGORITHMS)}")
    request = LaunchRequest(
        algo=args.algo,
        model_path=args.model_path,
        draft_model_path=args.draft_model_path,
        tp=args.tp,
        budget=_budget(args.budget),
        host=args.host,
        passthrough=tuple(passthrough),
        step_time_table=args.step_time_table,
    )
    return request, args.dry_run


def _budget(value: str | None) -> int | str | None:
    if value is None or value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"--budget must be a number of tree nodes or 'auto', got '{value}'") from None


def _ar_flags(request: LaunchRequest, target_config: dict) -> list[str]:
    return []


def _mtp_flags(request: LaunchRequest, target_config: dict) -> list[str]:
    if model_configs.num_mtp_layers(target_config) == 0:
        fields = "/".join(model_configs.MTP_LAYER_FIELDS)
        raise LaunchError(
            f"--algo mtp needs a target that ships MTP layers, but '{request.model_path}' declares none "
            f"(no {fields} in its config)"
        )
    return list(MTP_PRESET)


def _checked_drafter(request: LaunchRequest, target_config: dict) -> tuple[int, list[str]]:
    """The DFlash drafter's block size and the flags that load it like the target, once the drafter is known
    to fit this target and TP size."""
    drafter_config = model_configs.load_config(request.draft_model_path, role="drafter")
    block_size = model_configs.dflash_block_size(drafter_config, request.draft_model_path)
    model_configs.check_dflash_drafter_matches_target(target_config, drafter_config, request.draft_model_path)
    model_configs.check_tensor_parallel_size(drafter_config, request.tp, request.draft_model_path)
    return block_size, _drafter_dtype_flags(request, target_config, drafter_config)


def _drafter_dtype_flags(request: LaunchRequest, target_config: dict, drafter_config: dict) -> list[str]:
    """``--dtype`` of the target when ``auto`` would load the drafter in another dtype.

    SGLang resolves ``--dtype auto`` for each checkpoint from its own config, so a drafter saved in float32 is
    loaded in float16 beside a bfloat16 target, and the drafter's first matmul on the target's features fails
    on the first request. An explicit ``--dtype`` applies to both."""
    if _passes(request, "--dtype"):
        return []
    target_dtype = model_configs.auto_dtype(target_config)
    if model_configs.auto_dtype(drafter_config) == target_dtype:
        return []
    return ["--dtype", target_dtype]


def _passes(request: LaunchRequest, flag: str) -> bool:
    return any(arg == flag or arg.startswith(flag + "=") for arg in request.passthrough)


def _dflash_flags(request: LaunchRequest, target_config: dict) -> list[str]:
    block_size, dtype_flags = _checked_drafter(request, target_config)
    return [
        "--speculative-algorithm", "DFLASH",
        "--speculative-draft-model-path", request.draft_model_path,
        "--speculative-num-draft-tokens", str(block_size),
        *dtype_flags,
    ]  # fmt: skip


def _ddtree_flags(request: LaunchRequest, target_config: dict) -> list[str]:
    budget = _ddtree_budget(request)
    if budget == "auto":
        budget = _auto_budget_widest_width(request) - 1
    if budget < 1:
        raise LaunchError(f"--budget must be at least 1 tree node, got {budget}")
    block_size, dtype_flags = _checked_drafter(request, target_config)
    if 2 * (budget + 1) < block_size:
        raise LaunchError(
            f"--budget {budget} is too small for the drafter's block size {block_size}: "
            f"use at least {(block_size + 1) // 2 - 1}"
        )
    return [
        "--speculative-algorithm", DDTREE_ALGORITHM_NAME,
        "--speculative-draft-model-path", request.draft_model_path,
        "--speculative-num-draft-tokens", str(budget + 1),
        "--speculative-dflash-block-size", str(block_size),
        *dtype_flags,
    ]  # fmt: skip


# The fixed budget on hybrid targets: at Qwen3.6-27B's shape (simulated acceptance, B = 16 at tau 4.06 and B = 32 at
# 4.39: the user's DFlash tau times the demo pair's tree/chain ratio) B = 16 served more than B = 32 at every
# concurrency measured, in output tok/s: 169.8 / 486.3 / 668.3 against 152.1 / 418.8 / 525.1 at 1 / 4 / 8 requests (H200, run
# 63), 976.1 against 760.1 at 16 (H100, runs 88 and 91): a step of 17 nodes costs 0.62-0.83x one of 33 there, and
# the wider tree's acceptance gain (assumed 8%) does not pay for it.
HYBRID_DEFAULT_BUDGET = 16


def with_default_budget(request: LaunchRequest, model_path: str) -> LaunchRequest:
    """``--algo ddtree`` without ``--budget``: ``auto`` on a dense target, :data:`HYBRID_DEFAULT_BUDGET` on a
    hybrid (GDN) target. ``auto`` is lossless there (the hybrid GPU suite, per-width verify graphs included: RESULTS
    run 85) but lost at Qwen3.6-27B's shape (run 91: 543.7 output tok/s at 16 requests against 760.1 for B = 32 and
    976.1 for B = 16 in run 88; its served steps cost twice what its own table priced)."""
    if request.algo != "ddtree" or request.budget is not None:
        return request
    hybrid = hybrid_targets.is_hybrid_gdn(model_configs.load_config(model_path))
    return replace(request, budget=HYBRID_DEFAULT_BUDGET if hybrid else "auto")


def _ddtree_budget(request: LaunchRequest) -> int | str:
    return DDTREE_DEFAULT_BUDGET if request.budget is None else request.budget


def _auto_budget_widest_width(request: LaunchRequest) -> int:
    """The widest verify width of ``--budget auto``: the tree the drafter builds every step (a table's widest)."""
    from sglang_ddtree.tree.budget_policy import load_step_time_table

    if not request.step_time_table:
        return AUTO_BUDGET_TREE + 1
    try:
        return load_step_time_table(request.step_time_table).widths[-1]
    except ValueError as e:
        raise LaunchError(str(e)) from None


def server_environment(request: LaunchRequest) -> dict[str, str]:
    """Variables the server needs beside its flags: ``--budget auto``, measuring or with its step time table."""
    from sglang_ddtree.tree.budget_policy import STEP_TIME_TABLE_ENV
    from sglang_ddtree.speculative.ddtree_auto_budget import BUDGET_AUTO_ENV

    if request.algo != "ddtree" or _ddtree_budget(request) != "auto":
        return {}
    if request.step_time_table:
        return {STEP_TIME_TABLE_ENV: os.path.abspath(request.step_time_table)}
    return {BUDGET_AUTO_ENV: "1"}


_ALGORITHM_FLAGS: dict[str, Callable[[LaunchRequest, dict], list[str]]] = {
    "ar": _ar_flags,
    "mtp": _mtp_flags,
    "dflash": _dflash_flags,
    "ddtree": _ddtree_flags,
}


def resolve_server_argv(request: LaunchRequest, model_path: str) -> list[str]:
    """Check the request against the model configs and return the ``launch_server`` argument list."""
    needs_drafter = request.algo in ("dflash", "ddtree")
    if needs_drafter and not request.draft_model_path:
        raise LaunchError(f"--algo {request.algo} needs a DFlash drafter: pass --draft-model-path")
    if not needs_drafter and request.draft_model_path:
        raise LaunchError(f"--draft-model-path is only used by --algo dflash and ddtree, not {request.algo}")
    if request.budget is not None and request.algo != "ddtree":
        raise LaunchError(f"--budget only applies to --algo ddtree, not {request.algo}")
    if request.step_time_table and (request.algo != "ddtree" or _ddtree_budget(request) != "auto"):
        raise LaunchError("--step-time-table only applies to --algo ddtree --budget auto")
    if request.algo == "ddtree":
        _check_no_stray_auto_budget_variables(request)
        _check_simulated_acceptance()
    request = LaunchRequest(**{**request.__dict__, "model_path": model_path})
    target_config = model_configs.load_config(model_path)
    model_configs.check_tensor_parallel_size(target_config, request.tp, model_path)
    _check_hybrid_dtype(request, target_config)
    algorithm_flags = _ALGORITHM_FLAGS[request.algo](request, target_config)
    if request.algo != "ar":
        algorithm_flags += _hybrid_target_flags(request, target_config, algorithm_flags)
    return [
        "--model-path", model_path,
        "--tp-size", str(request.tp),
        "--host", request.host,
        *algorithm_flags,
        *request.passthrough,
    ]  # fmt: skip


def _flag_value(args: Sequence[str], flag: str) -> Optional[str]:
    """The last value given to ``flag`` in ``args`` (``--flag v`` or ``--flag=v``), else None."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def _number_flag(args: Sequence[str], flag: str, kind: type, default):
    """``flag``'s value in ``args`` as ``kind`` (``default`` when absent); a malformed one is the user's error."""
    value = _flag_value(args, flag)
    if value is None:
        return default
    try:
        return kind(value)
    except ValueError:
        raise LaunchError(f"{flag} must be {'an integer' if kind is int else 'a number'}, got '{value}'") from None


_DTYPE_ALIASES = {"half": "float16", "float": "float32"}


def _check_no_stray_auto_budget_variables(request: LaunchRequest) -> None:
    """Either variable makes every DDTREE server's budget auto: only the launcher's ``--budget auto`` sets them."""
    from sglang_ddtree.tree.budget_policy import STEP_TIME_TABLE_ENV
    from sglang_ddtree.speculative.ddtree_auto_budget import BUDGET_AUTO_ENV

    for name, instead in ((STEP_TIME_TABLE_ENV, "--budget auto --step-time-table FILE"), (BUDGET_AUTO_ENV, "--budget auto")):
        if os.environ.get(name) and _ddtree_budget(request) != "auto":
            raise LaunchError(f"{name} is set in the environment: pass {instead} instead, or unset it")


def _check_simulated_acceptance() -> None:
    """The cost-only simulation's histogram file (``SGLANG_DDTREE_SIMULATE_ACC_HISTOGRAM``) reads or its width table
    (``SGLANG_DDTREE_SIMULATE_ACC_BY_WIDTH``) parses, one of them at most, and SGLang's own knob is on beside it
    (SGLang calls the simulation only then): checked here rather than in the worker."""
    from sglang_ddtree.speculative.ddtree_simulation import check_simulation_settings

    raw = os.environ.get("SGLANG_SIMULATE_ACC_LEN", "")
    try:
        mean = float(raw) if raw else -1.0
    except ValueError:
        raise LaunchError(f"SGLANG_SIMULATE_ACC_LEN={raw!r} is not a number") from None
    try:
        check_simulation_settings(mean)
    except ValueError as e:
        raise LaunchError(str(e)) from None


def _check_hybrid_dtype(request: LaunchRequest, target_config: dict) -> None:
    """SGLang 0.5.17 keeps GDN conv states in ``SGLANG_MAMBA_CONV_DTYPE`` (bfloat16 unless set) whatever the model's
    dtype, and its conv kernels refuse activations of another dtype at start-up; ``--dtype auto`` gives a float32
    config float16."""
    if not hybrid_targets.is_hybrid_gdn(target_config):
        return
    given = _flag_value(request.passthrough, "--dtype")
    dtype = _DTYPE_ALIASES.get(given, given) if given and given != "auto" else model_configs.auto_dtype(target_config)
    conv_dtype = hybrid_targets.conv_state_dtype()
    if dtype != conv_dtype:
        source = f"--dtype {given}" if given and given != "auto" else "--dtype auto (from the config)"
        raise LaunchError(
            f"{source} serves this hybrid target in {dtype}, but SGLang keeps its GDN conv states in {conv_dtype} "
            f"(SGLANG_MAMBA_CONV_DTYPE) and fails at start-up: pass --dtype {conv_dtype}, or set "
            f"SGLANG_MAMBA_CONV_DTYPE={dtype}"
        )


def _hybrid_target_flags(request: LaunchRequest, target_config: dict, algorithm_flags: list[str]) -> list[str]:
    """What speculation on a hybrid (Gated DeltaNet) target needs from the launcher: a prefix-cache strategy that
    runs with overlap scheduling, and the per-node verify state checked against the GPU before SGLang starts."""
    ssm_dtype = _flag_value(request.passthrough, "--mamba-ssm-dtype")
    try:
        state = hybrid_targets.gdn_state_size(target_config, request.tp, ssm_dtype)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    if state is None:
        return []
    width = _number_flag([*algorithm_flags, *request.passthrough], "--speculative-num-draft-tokens", int, 1)
    return [*_mamba_cache_flags(request, target_config, width), *_running_requests_flags(request, target_config,
                                                                                          state, width)]  # fmt: skip


def _mamba_cache_flags(request: LaunchRequest, target_config: dict, width: int) -> list[str]:
    """SGLang picks ``extra_buffer`` under overlap scheduling for the architectures that support it; the
    launcher says so explicitly and refuses, in one line, what SGLang would refuse with an assertion later."""
    if _passes(request, "--disable-radix-cache"):
        return []
    passthrough = request.passthrough
    strategy = _flag_value(passthrough, "--mamba-radix-cache-strategy") or _flag_value(
        passthrough, "--mamba-scheduler-strategy"
    )
    overlap = not _passes(request, "--disable-overlap-schedule")
    if strategy == "no_buffer" and overlap:
        raise LaunchError(
            "--mamba-radix-cache-strategy no_buffer does not run with overlap scheduling: "
            "use extra_buffer, or add --disable-overlap-schedule"
        )
    if strategy == "extra_buffer_lazy" and request.algo in ("dflash", "ddtree"):
        raise LaunchError(f"--mamba-radix-cache-strategy extra_buffer_lazy does not support --algo {request.algo}: "
                          "use extra_buffer")  # fmt: skip
    arch = (target_config.get("architectures") or [""])[0]
    chosen = strategy or ("extra_buffer" if overlap and arch in MAMBA_EXTRA_BUFFER_ARCHS else None)
    if chosen in ("extra_buffer", "extra_buffer_lazy"):
        interval = _number_flag(passthrough, "--mamba-track-interval", int, DEFAULT_MAMBA_TRACK_INTERVAL)
        if width > interval:
            raise LaunchError(
                f"{width} verify tokens per request exceed --mamba-track-interval {interval} (the prefix cache "
                f"snapshots GDN states every interval tokens): raise it to at least {width}, or lower the budget"
            )
    return ["--mamba-radix-cache-strategy", chosen] if chosen and not strategy else []


def _snapshot_free_gdn_verify() -> bool:
    """DDTREE's snapshot-free GDN verify, on unless ``SGLANG_DDTREE_GDN_WY_VERIFY=0`` in the environment the
    server inherits."""
    from sglang_ddtree.speculative.hybrid_tree_verify import wy_verify_requested

    return wy_verify_requested()


def _running_requests_flags(
    request: LaunchRequest, target_config: dict, state: hybrid_targets.GdnStateSize, width: int
) -> list[str]:
    """Check that the per-node GDN verify state of every running request fits on the GPU; without
    ``--max-running-requests``, give dflash and ddtree the most requests whose state takes at most half of what
    the weights leave (SGLang's default of 48 does not fit a large hybrid model)."""
    if _flag_value(request.passthrough, "--device") not in (None, "cuda"):
        return []
    gpu_bytes = _gpu_memory_bytes()
    weight_bytes = _weight_bytes_per_rank(request, target_config)
    if weight_bytes is not None:
        weight_bytes += _drafter_bytes_per_rank(request, target_config)
    if gpu_bytes is None or weight_bytes is None:
        return []  # SGLang checks after loading the weights
    fraction = _number_flag(request.passthrough, "--mem-fraction-static", float, ASSUMED_MEM_FRACTION_STATIC)
    left = gpu_bytes * fraction - weight_bytes
    snapshot_free = request.algo == "ddtree" and _snapshot_free_gdn_verify()

    def scratch(running: int) -> int:
        return state.verify_scratch_bytes(width, running, snapshot_free)

    fitting = max(r for r in range(SGLANG_DFLASH_MAX_RUNNING_REQUESTS + 1) if r == 0 or scratch(r) <= left / 2)

    def refuse(running: int) -> LaunchError:
        what = f"--budget {width - 1}" if request.algo == "ddtree" else f"--algo {request.algo}"
        need = scratch(running)
        return LaunchError(
            f"{what} ({width} verify tokens) with {running} running requests needs {need / GIB:.1f} GiB of GDN "
            f"verify state per GPU ({need / (running + 1) / width / 2**20:.1f} MiB per token and request) but about "
            f"{max(left, 0) / GIB:.1f} GiB of the GPU's {gpu_bytes / GIB:.1f} GiB is left after "
            f"{weight_bytes / GIB:.1f} GiB of weights: lower --max-running-requests (at most {fitting} fit) "
            "or the budget"
        )

    requested = _number_flag(request.passthrough, "--max-running-requests", int, None)
    if requested is not None:
        if scratch(requested) > left:
            raise refuse(requested)
        return []
    if fitting == 0:
        raise refuse(1)
    if request.algo == "mtp" or fitting == SGLANG_DFLASH_MAX_RUNNING_REQUESTS:
        return []
    return ["--max-running-requests", str(fitting)]


def _gpu_memory_bytes() -> Optional[int]:
    """Memory of the first visible GPU (nvidia-smi), or None on a machine without one."""
    device = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    try:
        query = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", device],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        return int(float(query.stdout.split()[0])) << 20 if query.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def _weight_bytes_per_rank(request: LaunchRequest, target_config: dict) -> Optional[int]:
    """The target's weight files, or its parameter count in the serving dtype for ``--load-format dummy`` and
    hub ids, split over the TP ranks."""
    files = glob.glob(os.path.join(request.model_path, "*.safetensors"))
    if files and _flag_value(request.passthrough, "--load-format") != "dummy":
        return sum(os.path.getsize(f) for f in files) // request.tp
    parameters = model_configs.parameter_count(target_config)
    if parameters is None:
        return None
    dtype = _flag_value(request.passthrough, "--dtype") or model_configs.auto_dtype(target_config)
    return parameters * (4 if dtype == "float32" else 2) // request.tp


def _drafter_bytes_per_rank(request: LaunchRequest, target_config: dict) -> int:
    """A DFlash drafter's weights beside the target's (SGLang counts both before sizing its pools: RESULTS run 73's
    DFLASH server passed a check without them and failed at start), from its files or, for ``--load-format dummy``
    (which SGLang applies to the drafter too) and hub ids, its own parameters in the target's dtype."""
    if request.algo not in ("dflash", "ddtree") or not request.draft_model_path:
        return 0
    files = glob.glob(os.path.join(request.draft_model_path, "*.safetensors"))
    if files and _flag_value(request.passthrough, "--load-format") != "dummy":
        return sum(os.path.getsize(f) for f in files) // request.tp
    parameters = model_configs.dflash_drafter_parameter_count(
        model_configs.load_config(request.draft_model_path, role="drafter"))
    dtype = _flag_value(request.passthrough, "--dtype") or model_configs.auto_dtype(target_config)
    return (parameters or 0) * (4 if dtype == "float32" else 2) // request.tp


def exposure_warning(request: LaunchRequest) -> Optional[str]:
    """The warning for a server reachable from other machines with no ``--api-key``: anyone who can reach the
    port can then run requests, flush the cache and read the server's configuration."""
    loopback = request.host == "localhost" or request.host == "::1" or request.host.startswith("127.")
    if loopback or _passes(request, "--api-key"):
        return None
    return (f"--host {request.host} serves every endpoint to the network without authentication; "
            "pass --api-key KEY (clients send 'Authorization: Bearer KEY') or bind 127.0.0.1")  # fmt: skip


def with_demo_drafter(request: LaunchRequest) -> LaunchRequest:
    """The embedded demo model comes with its shipped drafter, so ``--algo dflash`` and ``ddtree`` run with
    no paths at all; a target given by ``--model-path`` needs its own drafter."""
    if request.algo in ("dflash", "ddtree") and not request.model_path and not request.draft_model_path:
        from sglang_ddtree.demo_model import DEMO_DRAFTER_PATH

        return replace(request, draft_model_path=DEMO_DRAFTER_PATH)
    return request


def _model_path(request: LaunchRequest) -> str:
    """The target to serve: ``--model-path``, else the embedded demo model (built once, also on a dry run,
    since its config is what the checks read)."""
    if request.model_path:
        return request.model_path
    from sglang_ddtree import demo_model

    try:
        return demo_model.ensure_demo_model()
    except demo_model.DemoModelUnavailable as e:
        raise LaunchError(str(e)) from None


def _serve(server_argv: list[str]) -> None:
    """Run SGLang's HTTP server in this process, exactly as ``python -m sglang.launch_server`` does."""
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    server_args = prepare_server_args(server_argv)
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        request, dry_run = parse_request(sys.argv[1:] if argv is None else argv)
        request = with_demo_drafter(request)
        model_path = _model_path(request)
        request = with_default_budget(request, model_path)
        server_argv = resolve_server_argv(request, model_path)
    except (LaunchError, ModelConfigError) as e:
        print(f"sglang_ddtree.launch: error: {e}", file=sys.stderr)
        return 2
    warning = exposure_warning(request)
    if warning:
        print(f"sglang_ddtree.launch: warning: {warning}", file=sys.stderr)
    environment = server_environment(request)
    if dry_run:
        assignments = [f"{name}={value}" for name, value in environment.items()]
        print(shlex.join([*assignments, sys.executable, "-m", "sglang.launch_server", *server_argv]))
        return 0
    os.environ.update(environment)
    _serve(server_argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
