"""``python -m sglang_ddtree.launch``: start SGLang's HTTP server for one decoding algorithm.

    python -m sglang_ddtree.launch --algo {ar,mtp,dflash,ddtree} [--model-path P] [--draft-model-path D]
        [--tp N] [--budget B] [--dry-run] [any sglang launch_server flag ...]

The launcher only resolves and checks arguments, then runs SGLang's own server in this process; the plugin
entry point registers this package inside every SGLang process. Any flag it does not know passes through to
SGLang unchanged (and, coming last, overrides the presets). Problems are reported as one line on stderr with
exit code 2, before anything heavy is imported.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from sglang_ddtree import DDTREE_ALGORITHM_NAME, DDTREE_DEFAULT_BUDGET, model_configs
from sglang_ddtree.model_configs import ModelConfigError

ALGORITHMS = ("ar", "mtp", "dflash", "ddtree")
DEFAULT_HOST = "127.0.0.1"
MTP_PRESET = (
    "--speculative-algorithm", "NEXTN",
    "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
)  # fmt: skip

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
    budget: int | None
    host: str
    passthrough: tuple[str, ...]


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
        "--budget", type=int, help=f"ddtree: tree nodes per request, root excluded (default {DDTREE_DEFAULT_BUDGET})"
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
        budget=args.budget,
        host=args.host,
        passthrough=tuple(passthrough),
    )
    return request, args.dry_run


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


def _checked_drafter_block_size(request: LaunchRequest, target_config: dict) -> int:
    """The DFlash drafter's block size, once the drafter is known to fit this target and TP size."""
    drafter_config = model_configs.load_config(request.draft_model_path, role="drafter")
    block_size = model_configs.dflash_block_size(drafter_config, request.draft_model_path)
    model_configs.check_dflash_drafter_matches_target(target_config, drafter_config, request.draft_model_path)
    model_configs.check_tensor_parallel_size(drafter_config, request.tp, request.draft_model_path)
    return block_size


def _dflash_flags(request: LaunchRequest, target_config: dict) -> list[str]:
    block_size = _checked_drafter_block_size(request, target_config)
    return [
        "--speculative-algorithm", "DFLASH",
        "--speculative-draft-model-path", request.draft_model_path,
        "--speculative-num-draft-tokens", str(block_size),
    ]  # fmt: skip


def _ddtree_flags(request: LaunchRequest, target_config: dict) -> list[str]:
    budget = DDTREE_DEFAULT_BUDGET if request.budget is None else request.budget
    if budget < 1:
        raise LaunchError(f"--budget must be at least 1 tree node, got {budget}")
    block_size = _checked_drafter_block_size(request, target_config)
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
    ]  # fmt: skip


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
    request = LaunchRequest(**{**request.__dict__, "model_path": model_path})
    target_config = model_configs.load_config(model_path)
    model_configs.check_tensor_parallel_size(target_config, request.tp, model_path)
    algorithm_flags = _ALGORITHM_FLAGS[request.algo](request, target_config)
    return [
        "--model-path", model_path,
        "--tp-size", str(request.tp),
        "--host", request.host,
        *algorithm_flags,
        *request.passthrough,
    ]  # fmt: skip


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
        server_argv = resolve_server_argv(request, _model_path(request))
    except (LaunchError, ModelConfigError) as e:
        print(f"sglang_ddtree.launch: error: {e}", file=sys.stderr)
        return 2
    if dry_run:
        print(shlex.join([sys.executable, "-m", "sglang.launch_server", *server_argv]))
        return 0
    _serve(server_argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
