"""Test session setup.

Without a GPU, SGLang runs on its CPU engine and Triton kernels under the interpreter; both read their switches
at import time, and SGLang's spawned scheduler processes need the CPU-CI shims too (``tests/cpu_shims``: a
test-only ``sgl_kernel`` stand-in and import-time patches). ``.ci/run`` sets all of this in the environment;
setting it here as well makes a plain ``pytest`` work the same way on a developer's CPU machine.
"""

import importlib.util
import os
import sys

CPU_SHIMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_shims")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


if not _cuda_available():
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if CPU_SHIMS not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [CPU_SHIMS, os.environ.get("PYTHONPATH")]))
    if CPU_SHIMS not in sys.path:
        sys.path.insert(0, CPU_SHIMS)
    if "sitecustomize" not in sys.modules:  # the interpreter started before PYTHONPATH named the shims
        spec = importlib.util.spec_from_file_location("sitecustomize", os.path.join(CPU_SHIMS, "sitecustomize.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
