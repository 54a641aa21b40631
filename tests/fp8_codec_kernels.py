"""Whole-tensor wrappers around kernels/fp8_e4m3.py's device functions, for the codec tests on the CPU
interpreter (tests/test_fp8_e4m3.py) and on a GPU (tests/gpu/test_kv_quant_gpu.py).

Whether the kernels run interpreted is fixed when this module is imported (TRITON_INTERPRET=1 or not).
"""
import torch
import triton
import triton.language as tl

from kernels.fp8_e4m3 import e4m3_bits_to_f32, f32_to_e4m3_bits


@triton.jit
def _decode_kernel(codes_ptr, out_ptr, n, SOFTWARE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    bits = tl.load(codes_ptr + offs, mask=m, other=0)
    tl.store(out_ptr + offs, e4m3_bits_to_f32(bits, SOFTWARE), mask=m)


@triton.jit
def _encode_kernel(x_ptr, out_ptr, n, SOFTWARE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    tl.store(out_ptr + offs, f32_to_e4m3_bits(x, SOFTWARE), mask=m)


def _launch(kernel, x: torch.Tensor, out_dtype: torch.dtype, software: bool, block: int) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    kernel[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), SOFTWARE=software, BLOCK=block)
    return out


def decode(codes: torch.Tensor, software: bool = True, block: int = 256) -> torch.Tensor:
    """uint8 e4m3 codes -> float32 values, through e4m3_bits_to_f32."""
    return _launch(_decode_kernel, codes, torch.float32, software, block)


def encode(x: torch.Tensor, software: bool = True, block: int = 1024) -> torch.Tensor:
    """float32 values -> uint8 e4m3 codes (saturating, round to nearest even), through f32_to_e4m3_bits."""
    return _launch(_encode_kernel, x, torch.uint8, software, block)
