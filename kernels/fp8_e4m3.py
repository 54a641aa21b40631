"""OCP FP8 e4m3 (``float8_e4m3fn``) encode/decode as Triton device functions.

Two implementations of each direction:

* hardware: ``tl.float8e4nv`` casts (H100/H200, MI300-class with OCP fp8);
* software: integer bit operations only, for targets with no FP8 convert
  instructions (Hygon DCU gfx928 / gfx936).

Both give bit-identical results for every finite code (tests/test_fp8_e4m3.py).
The software encoder saturates to +-448 (never emits NaN) and rounds to nearest
even, like the hardware ``satfinite`` conversion. Codes 0x7F / 0xFF (NaN) are
never written by our quantizers, so the software decoder does not special-case
them (it returns +-480).
"""
import triton
import triton.language as tl

E4M3_MAX = 448.0


@triton.jit
def e4m3_bits_to_f32_sw(bits):
    """uint8 e4m3 codes -> float32 (software path, no fp8 instructions)."""
    b = bits.to(tl.int32) & 0xFF
    mag = b & 0x7F
    exp = mag >> 3
    # normal numbers: rebias the exponent (7 -> 127) and move the 3 mantissa bits to the top.
    normal = ((mag << 20) + (120 << 23)).to(tl.float32, bitcast=True)
    # subnormals (exp == 0): value = mantissa * 2^-9, exact in fp32
    sub = (mag & 7).to(tl.float32) * 0.001953125
    v = tl.where(exp == 0, sub, normal)
    # OR the sign bit in (not -v: Triton lowers unary minus to 0 - v, which turns 0x80 into +0.0, not -0.0)
    return (v.to(tl.int32, bitcast=True) | ((b & 0x80) << 24)).to(tl.float32, bitcast=True)


@triton.jit
def f32_to_e4m3_bits_sw(x):
    """float32 -> uint8 e4m3 codes, round-to-nearest-even, saturating (software path)."""
    u = x.to(tl.int32, bitcast=True)
    sign = (u >> 24) & 0x80
    a = tl.abs(x)
    a = tl.minimum(a, 448.0)  # saturate (NaN inputs become 448: callers never pass NaN)
    au = a.to(tl.int32, bitcast=True)
    # normal range (a >= 2^-6): round the fp32 mantissa to 3 bits (RNE), then rebias.
    rne = au + 0x7FFFF + ((au >> 20) & 1)
    normal = (rne >> 20) - (120 << 3)
    # subnormal range: m = rne(a * 2^9) in [0, 8]; m == 8 is the smallest normal (code 0x08).
    y = a * 512.0
    m = ((y + 8388608.0) - 8388608.0).to(tl.int32)
    code = tl.where(a < 0.015625, m, normal)
    return (code | sign).to(tl.uint8)


@triton.jit
def e4m3_bits_to_f32_hw(bits):
    return bits.to(tl.float8e4nv, bitcast=True).to(tl.float32)


@triton.jit
def f32_to_e4m3_bits_hw(x):
    x = tl.minimum(tl.maximum(x, -448.0), 448.0)
    return x.to(tl.float8e4nv).to(tl.uint8, bitcast=True)


@triton.jit
def e4m3_bits_to_f32(bits, SOFTWARE: tl.constexpr):
    if SOFTWARE:
        return e4m3_bits_to_f32_sw(bits)
    else:
        return e4m3_bits_to_f32_hw(bits)


@triton.jit
def f32_to_e4m3_bits(x, SOFTWARE: tl.constexpr):
    if SOFTWARE:
        return f32_to_e4m3_bits_sw(x)
    else:
        return f32_to_e4m3_bits_hw(x)


def use_software_fp8() -> bool:
    """Whether kernels should use the software e4m3 path on the current device.

    ``VLLM_DCU_FP8_SOFTWARE=1`` forces software, ``=0`` forces hardware; otherwise
    software is chosen where the target lacks OCP fp8 converts: any ROCm target
    that is not gfx94x/gfx95x/gfx12x (this includes DCU gfx928/gfx936), CUDA
    before sm_89, and the Triton CPU interpreter.
    """
    import os

    forced = os.environ.get("VLLM_DCU_FP8_SOFTWARE", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    if forced:
        raise ValueError(f"VLLM_DCU_FP8_SOFTWARE must be 0 or 1, got {forced!r}")
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    from .targets import emulated_arch

    if emulated_arch():  # the DCU rehearsal on another GPU: the DCU has no fp8 converts
        return True
    import torch

    if not torch.cuda.is_available():
        return True
    if torch.version.hip:
        arch = torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
        return not arch.startswith(("gfx94", "gfx95", "gfx12"))
    major, minor = torch.cuda.get_device_capability()
    return (major, minor) < (8, 9)
