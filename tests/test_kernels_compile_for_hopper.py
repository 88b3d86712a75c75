"""Every Triton kernel of the package compiles for Hopper (sm_90): checked on the CPU, from real launches.

The CPU tests run the kernels under Triton's interpreter, which executes them as Python and skips the compiler's
type rules. So a loop-carried variable that changed dtype (int32 -> int64, loading a tree's int64 parents) passed
every CPU test and failed to compile on the H200 (tests/gpu/RESULTS.md run 51). Here each kernel's first launch in
a few of the kernel specifications below (one per setting of its boolean and string switches) is recorded under
the interpreter (argument dtypes and constexpr values), and a child process without the interpreter lowers each
launch to Triton IR for sm_90: the compiler's front end, which needs no GPU. The GDN kernels are also compiled
whole, for the shared memory an H200 grants a block and for the registers ptxas spills.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import pkgutil
import subprocess
import sys

import pytest
import torch

import sglang_ddtree.kernels

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="records the launches under Triton's interpreter (tests/run_cpu.sh sets it)")

_POINTER_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int64: "i64",
                  torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
                  torch.bool: "i1"}  # fmt: skip
_LOWER_TO_TTIR = """
import importlib, json, sys
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.compiler import ASTSource
from triton._C.libtriton import ir

target = GPUTarget("cuda", 90, 32)
backend = CUDABackend(target)
options = backend.parse_options({})
failures = []
for launch in json.load(sys.stdin):
    module_name, kernel_name = launch["kernel"].rsplit(".", 1)
    kernel = getattr(importlib.import_module(module_name), kernel_name)
    names = kernel.arg_names
    constexprs = {(names.index(name),): value for name, value in launch["constexprs"].items()}
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    try:
        ASTSource(fn=kernel, signature=launch["signature"], constexprs=constexprs).make_ir(
            target, options, backend.get_codegen_implementation(options), backend.get_module_map(), context)
    except Exception as error:  # the compiler's own message names the line and the rule
        failures.append(f"{launch['kernel']}: {error}")
print(json.dumps(failures))
"""


# The GDN tree kernels compiled whole for sm_90 at Qwen3.6-27B's heads and a 65-node tree, in both precisions, with
# its root in the rows (128 padded rows) and apart (64): the shared memory each needs, which the H200 refuses past
# 227 KiB at launch (RESULTS run 67: 256 KiB).
_GDN_SHARED_MEMORY = """
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sglang_ddtree.kernels import gdn_tree as g

HALF = {"q_ptr", "k_ptr", "v_ptr", "a_ptr", "b_ptr", "o_ptr"}
INDEX = {"parents_ptr", "ws_indices_ptr", "h0_indices_ptr", "dst_indices_ptr", "nodes_ptr"}
launches = []
for NP, root in ((128, 0), (64, 1)):
    bv, warps = g._apply_launch(NP)
    launches += [("_gdn_tree_factor_kernel", NP, dict(H=16, BR=g._factor_rows(NP), ROOT=root), g._factor_warps(NP)),
                 ("_gdn_tree_apply_kernel", NP, dict(H=16, BV=bv, ROOT=root), warps)]
launches.append(("_gdn_tree_commit_kernel", 128, dict(BV=g.COMMIT_LAUNCH[0]), g.COMMIT_LAUNCH[1]))
shared = {}
for name, NP, extra, warps in launches:
    kernel = getattr(g, name)
    for precision in g.DOT_PRECISIONS:
        const = {"HV": 48, "K": 128, "V": 128, "NP": NP, "BK": 32, "DOT": precision, **extra}
        const = {name: value for name, value in const.items() if name in kernel.arg_names}  # the commit: no dot
        signature = {}
        for arg in kernel.arg_names:
            if arg in const:
                signature[arg] = "constexpr"
            elif arg.endswith("_ptr"):
                signature[arg] = "*bf16" if arg in HALF else "*i64" if arg in INDEX else "*fp32"
            else:
                signature[arg] = "fp32" if arg in ("scale", "softplus_beta", "softplus_threshold") else "i32"
        source = ASTSource(fn=kernel, signature=signature,
                           constexprs={(kernel.arg_names.index(k),): v for k, v in const.items()})
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
        shared[f"{name}:{NP}:{precision}"] = compiled.metadata.shared
print(json.dumps(shared))
"""
# The tree conv compiled for sm_90 at Qwen3.6-27B's channels in its launch for trees of up to 128 rows, and ptxas's
# report of each build: spilled registers go through local memory on every tap.
_CONV_SPILLS = """
import json, os, re, subprocess, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sglang_ddtree.kernels import gdn_tree_conv as c

INDEX = {"state_indices_ptr", "next_token_ptr", "next_sibling_ptr", "parents_ptr", "input_rows_ptr"}
ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
spills = {}
for NP in (16, 32, 64, 128):
    BD, warps = c._conv_launch(NP)
    kernel = c._gdn_tree_conv_kernel
    const = {"W": 4, "NP": NP, "BD": BD, "HAS_BIAS": False, "SILU": True, "bias_ptr": None}
    signature = {arg: "constexpr" if arg in const else ("*i64" if arg in INDEX else "*bf16") if arg.endswith("_ptr")
                 else "i32" for arg in kernel.arg_names}
    source = ASTSource(fn=kernel, signature=signature,
                       constexprs={(kernel.arg_names.index(k),): v for k, v in const.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    with tempfile.TemporaryDirectory() as folder:
        ptx = os.path.join(folder, "conv.ptx")
        open(ptx, "w").write(compiled.asm["ptx"])
        report = subprocess.run([ptxas, "-arch=sm_90a", "-v", ptx, "-o", os.path.join(folder, "conv.o")],
                                capture_output=True, text=True, check=True).stderr
    spills[NP] = int(re.search(r"(\\d+) bytes spill stores", report).group(1))
print(json.dumps(spills))
"""
H200_SHARED_MEMORY_PER_BLOCK = 232448  # bytes: cudaDevAttrMaxSharedMemoryPerBlockOptin on sm_90
INTEGER_SWITCHES = {"ROOT"}  # 0 / 1 constexprs that compile in code, like the boolean ones


def package_kernels() -> set[str]:
    """Every launchable kernel (``*_kernel``) of ``sglang_ddtree.kernels``, as ``module.name``."""
    found = set()
    for module_info in pkgutil.iter_modules(sglang_ddtree.kernels.__path__):
        module = importlib.import_module(f"sglang_ddtree.kernels.{module_info.name}")
        found |= {f"{module.__name__}.{name}" for name, value in vars(module).items()
                  if name.endswith("_kernel") and hasattr(value, "fn")}  # fmt: skip
    return found


def launch_record(fn, args: tuple, kwargs: dict) -> dict:
    """The signature Triton would compile for this call: pointer dtypes, scalar types and constexpr values."""
    parameters = inspect.signature(fn).parameters
    bound = inspect.signature(fn).bind_partial(*args, **{k: v for k, v in kwargs.items() if k in parameters})
    signature, constexprs = {}, {}
    for name, parameter in parameters.items():
        value = bound.arguments.get(name, parameter.default)
        if "constexpr" in str(parameter.annotation) or value is None:
            constexprs[name] = value
            signature[name] = "constexpr"
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + _POINTER_TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: no Triton type for argument {name}={value!r}")
    return {"kernel": f"{fn.__module__}.{fn.__name__}", "signature": signature, "constexprs": constexprs}


@pytest.fixture(scope="module")
def launches() -> list[dict]:
    """One recorded launch per kernel and setting of its boolean switches, from kernel specifications that exercise
    every kernel (and each switch the package sets) once."""
    from triton.runtime.interpreter import InterpretedFunction

    import test_gdn_tree_conv as conv
    import test_gdn_tree_kernels as gdn
    import test_tree_accept as accept
    import test_tree_kernels as tree
    import test_tree_mask_packed as packed

    recorded: dict[str, dict] = {}
    original_run = InterpretedFunction.run

    def recording_run(self, *args, **kwargs):
        record = launch_record(self.fn, args, kwargs)
        switches = sorted((name, value) for name, value in record["constexprs"].items()
                          if isinstance(value, (bool, str)) or name in INTEGER_SWITCHES)  # fmt: skip
        recorded.setdefault(f"{record['kernel']}{switches}", record)  # each variant a switch compiles in
        return original_run(self, *args, **kwargs)

    InterpretedFunction.run = recording_run
    try:
        tree.test_topk_reads_strided_half_precision_logits()
        tree.test_sharded_merge_equals_unsharded(vocab=1000, k=256, cuts=[0, 100, 1000], style="normal")
        tree.test_build_ddtree_fills_preallocated_buffers_and_matches_reference()
        tree.test_verify_tensors_without_the_full_mask_are_the_same_and_write_no_mask()
        tree.test_the_first_child_branch_kernel_walks_each_trees_chain_as_the_plain_loop_does(per_request=True)
        packed.test_a_request_sees_its_whole_prefix_and_exactly_its_ancestors()
        gdn.test_commit_of_the_root_alone_is_one_recurrence_step()
        gdn.test_every_launch_of_the_sweep_computes_the_same(16, 4, "ieee")  # the default is three-pass TF32
        conv.test_a_commit_leaves_the_window_its_path_ends_with_the_track_node_first()
        accept.test_the_kernel_accepts_the_path_sglangs_sibling_walk_accepts(bs=4, depth=15, vocab=1000, budget=64)
        accept.test_under_the_simulation_the_first_child_chain_is_committed_up_to_the_drawn_length(per_request=False)
        accept.test_under_the_simulation_the_first_child_chain_is_committed_up_to_the_drawn_length(per_request=True)
    finally:
        InterpretedFunction.run = original_run
    return list(recorded.values())


def test_every_kernel_of_the_package_is_launched_by_the_specifications_above(launches):
    assert {launch["kernel"] for launch in launches} == package_kernels()


def test_every_launch_lowers_to_triton_ir_for_sm90(launches):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", _LOWER_TO_TTIR], input=json.dumps(launches), env=env,
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_the_gdn_tree_kernels_fit_an_h200s_shared_memory_at_65_nodes_in_both_precisions():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", _GDN_SHARED_MEMORY], env=env, capture_output=True, text=True,
                            timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    shared = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(shared) == 10
    assert {launch: size for launch, size in shared.items() if size > H200_SHARED_MEMORY_PER_BLOCK} == {}


def test_the_tree_conv_spills_no_register_up_to_128_rows_on_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", _CONV_SPILLS], env=env, capture_output=True, text=True,
                            timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"16": 0, "32": 0, "64": 0, "128": 0}
