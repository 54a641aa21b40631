"""Reading per-(token, head) quantized KV codes inside attention kernels (Triton device functions).

Codes are exact in fp16/bf16 (e4m3 has 3 mantissa bits and |x| <= 448; int8 has |x| <= 127), so
readers convert codes to the query dtype and apply the float32 scales outside the matrix products
(docs/kv-cache-layout.md), or multiply the tile by its scales where that is safer (fp16 queries).
"""
import triton
import triton.language as tl

from ..fp8_e4m3 import e4m3_bits_to_f32

# kernels take the kind as a constexpr int
KV_QUANT_CODE = {None: 0, "fp8": 1, "int8": 2}


@triton.jit
def codes_to_float(codes, DTYPE: tl.constexpr, KV_QUANT: tl.constexpr, FP8_SOFTWARE: tl.constexpr):
    """uint8 codes -> their unscaled values in DTYPE (KV_QUANT 1: e4m3, 2: int8)."""
    if KV_QUANT == 1:
        return e4m3_bits_to_f32(codes, FP8_SOFTWARE).to(DTYPE)
    else:
        return codes.to(tl.int8, bitcast=True).to(tl.float32).to(DTYPE)
