"""Triton kernels for GPU-resident DDTree construction (installed as ``sglang_ddtree.kernels``)."""
