"""The CPU-CI shims change how fast tests run, never what they compute (``tests/cpu_shims/sitecustomize.py``).

The Triton interpreter's ``tl.reduce`` with a custom combine function reduces pairwise in the shim: a kernel's
outputs must equal those of Triton's own element-by-element fold, bit for bit, for payload-carrying maxima (the
tree build's pop), an associative combine that is not commutative, every axis and ``keep_dims``. A device function
called inside a kernel patches ``triton.language`` only where the launch has not already: the outputs must equal
those of the interpreter's patching on every call, bit for bit.
"""

from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the shim patches the interpreter")


@triton.jit
def _larger_key_with_payload(key_a, payload_a, key_b, payload_b):
    take_a = key_a > key_b
    return tl.where(take_a, key_a, key_b), tl.where(take_a, payload_a, payload_b)


@triton.jit
def _first_nonzero(a, b):
    return tl.where(a != 0, a, b)


@triton.jit
def _reduce_kernel(key_ptr, payload_ptr, key_out, payload_out, first_out, all_out, R: tl.constexpr, C: tl.constexpr,
                   AXIS: tl.constexpr, KEEP_DIMS: tl.constexpr):  # fmt: skip
    offsets = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    key, payload = tl.load(key_ptr + offsets), tl.load(payload_ptr + offsets)
    best_key, best_payload = tl.reduce((key, payload), AXIS, _larger_key_with_payload, keep_dims=KEEP_DIMS)
    first = tl.reduce(payload, AXIS, _first_nonzero, keep_dims=KEEP_DIMS)
    if AXIS == 0:
        out = tl.arange(0, C)
    else:
        out = tl.arange(0, R)
    if KEEP_DIMS:
        out = tl.reshape(out, best_key.shape)
    tl.store(key_out + out, best_key)
    tl.store(payload_out + out, best_payload)
    tl.store(first_out + out, first)
    tl.store(all_out, tl.reduce(key, None, _first_nonzero))


def run_reduce_kernel(key: torch.Tensor, payload: torch.Tensor, axis: int, keep_dims: bool) -> list[torch.Tensor]:
    rows, cols = key.shape
    width = cols if axis == 0 else rows
    outs = [torch.full((width,), -7, dtype=key.dtype), torch.full((width,), -7, dtype=payload.dtype),
            torch.full((width,), -7, dtype=payload.dtype), torch.full((1,), -7, dtype=key.dtype)]  # fmt: skip
    _reduce_kernel[(1,)](key, payload, *outs, R=rows, C=cols, AXIS=axis, KEEP_DIMS=keep_dims)
    return outs


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("keep_dims", [False, True])
@pytest.mark.parametrize("rows, cols", [(8, 4), (1, 16), (32, 2)])
def test_pairwise_custom_reduce_equals_the_interpreters_element_by_element_fold(monkeypatch, rows, cols, axis,
                                                                                keep_dims):  # fmt: skip
    from triton.runtime.interpreter import ReduceOps

    pairwise = ReduceOps.generic_reduce
    assert hasattr(pairwise, "element_by_element"), "the CPU-CI shim is not active"
    generator = torch.Generator().manual_seed(rows * 100 + cols)
    # Ties between keys (drawn from few values) check that the fold's tie rule is kept as well.
    key = torch.randint(-3, 3, (rows, cols), generator=generator, dtype=torch.int64)
    payload = torch.randint(0, 3, (rows, cols), generator=generator, dtype=torch.int32) * (torch.rand(rows, cols) < 0.5)
    shimmed = run_reduce_kernel(key, payload, axis, keep_dims)
    monkeypatch.setattr(ReduceOps, "generic_reduce", pairwise.element_by_element)
    folded = run_reduce_kernel(key, payload, axis, keep_dims)
    for got, expected in zip(shimmed, folded):
        assert torch.equal(got, expected), (got, expected)
        assert not torch.any(got == -7)


@triton.jit
def _scaled(x, scale):
    return x * scale


@triton.jit
def _device_calls_kernel(x_ptr, out_ptr, N: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < N, other=0.0)
    # tl.cdiv, tl.sigmoid and tl.max are device functions of triton.language.standard, which sees tl.core only;
    # _scaled sees this module's tl.
    y = _scaled(tl.sigmoid(x), tl.cdiv(N, BLOCK)) + tl.max(x, axis=0)
    tl.store(out_ptr + offsets, y, mask=offsets < N)


def run_device_calls_kernel(x: torch.Tensor, block: int) -> torch.Tensor:
    out = torch.full_like(x, -7.0)
    _device_calls_kernel[(triton.cdiv(x.numel(), block),)](x, out, N=x.numel(), BLOCK=block)
    return out


def test_device_function_calls_without_repatching_equal_the_interpreters_patching_on_every_call(monkeypatch):
    from triton.runtime.interpreter import InterpretedFunction

    call = InterpretedFunction.__call__
    assert hasattr(call, "patching_every_call"), "the CPU-CI shim is not active"
    x = torch.randn(37, generator=torch.Generator().manual_seed(0))
    shimmed = run_device_calls_kernel(x, block=8)  # five programs, each calling the device functions
    assert tl.core.is_builtin(tl.load) and tl.core.is_builtin(tl.tensor.__add__)  # the launch restored tl
    monkeypatch.setattr(InterpretedFunction, "__call__", call.patching_every_call)
    patched_every_call = run_device_calls_kernel(x, block=8)
    assert torch.equal(shimmed, patched_every_call) and not torch.any(shimmed == -7.0)
