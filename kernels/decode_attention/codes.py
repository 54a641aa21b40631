"""8-bit KV codes in the attention kernels: their conversions (PTX on CUDA, portable Triton ops elsewhere) and the
scale arithmetic the decode kernels (Triton and Gluon stage 1) and the prefill kernel share.

Quantized caches (docs/kv-cache-layout.md, kv_quant "fp8" or "int8"): the uint8 codes become fp16
(e4m3 value / 256, int8 value / 128: exact, e4m3 subnormals included) and both products run in
fp16 with float32 accumulation; the per-(token, head) float32 scales are applied to the columns of
S (K) and of P (V), never to the tiles. fp16 rather than the query's bf16 because e4m3 -> fp16 is a
plain bit move (no subnormal special case) and int8 -> fp16 a byte permute and one subtraction.
S: q is multiplied by a power of two that puts max|q| at 2^12 (exact, undone in S), so q x code
products stay below 2^13 x 1.75 whatever |K| is (|K| 6e4 and beyond: the K scale and the power of
two go into S's float32 column factor after the dot).
V: each key's V factor (V scale x code unit x 2^-8, so V = fp16 code x factor x 2^8) goes into its score as
log2(factor): the running max m is taken over t = score + log2(factor), P' = exp2(t - m) = P x factor is in [0, 1]
for V of any magnitude and goes to the dot with the fp16 codes, acc sums P' x codes (bounded by the key count),
and l sums the softmax's own exp2(score - m + 32) (an exponential of its own: a key whose P' underflows, such as
a zero-V key next to |V| ~1e37, still carries probability). V scales are floored at 2^-64 in the log (a zero
scale's codes are all 0), so log2(factor) lies in [-65, ~120] and l (kept x 2^32) in [2^-88, 2^117] for up to
2^20 keys, clear of float32's flush-to-zero and overflow; the partial output (acc / l x 2^40) and the
log-sum-exp (m + log2 l - 32) are true values for stage 2. Per tile this costs one log2 per key, one add and
one more exponential per (row, key); no reduction beyond the row max the softmax has anyway.
Changed 2026-12 (issue #15): the kernel used to put V scale x code unit itself into fp16 P, which lost heads
with |V| ~ 1e-6 to fp16 subnormals (5-9% error on the H200) and saturated P at 65504 for |V| above ~65000
(int8) / ~114000 (fp8) (22% at 1e5). A first fix kept P in [0, 1] by dividing the V scales by the tile's
largest and carrying that factor in acc: right, but 1.09x / 1.5-1.75x slower at batch 64 / 16 on the H200 (a
cross-warp max per tile, spills); this scheme takes 1.03-1.05x of the old kernel's time (geomean per 8-bit
dtype over batch 1-64 x ctx 4-32K, worst 1.11-1.13x at batch 64 x 8-16K; bf16 unchanged;
bench/results/2026-12-02-h200-device-runs-2.md, both kernels in one call). Accuracy: 1e-2 of a
float64 reference on the dequantized cache for |V| in 1e-6..1e37 and |K| up to 6e4
(tests/test_decode_attention.py, tests/gpu/test_decode_attention_gpu.py).
"""
import triton
import triton.language as tl

from ..fp8_e4m3 import e4m3_bits_to_f32_hw

# constexpr: the compiler (unlike the interpreter) refuses plain Python globals inside a kernel
# 8-bit caches (docstring): log2 of the V factor is at least -65 (V scales floored at 2^-64) and at most ~120
# (bf16's largest V); l is kept x 2^32, so with P' = exp2(score + log2 factor - m) it stays within [2^-88, 2^117]
# for up to 2^20 keys, clear of float32's flush-to-zero and overflow
_V_SCALE_FLOOR = tl.constexpr(5.421010862427522e-20)  # 2^-64
L_SHIFT = tl.constexpr(32.0)
KV8_OUT_FACTOR = tl.constexpr(1099511627776.0)  # 2^40 = 2^8 (the V factor's) x 2^32 (l's)
KV8_PV_OUT_FACTOR = tl.constexpr(1099511627776.0 / (127.0 * 128.0))  # INT8_PV: acc in units of 127 P' x int8 code
KV8_HW_OUT_FACTOR = tl.constexpr(4294967296.0)  # Gluon, hardware e4m3: 2^32, acc holds exact e4m3 values (2^8 x 2^-8)

# Codes become fp16 bit patterns: e4m3 -> value * 2^-8 (subnormals included), int8 -> value * 2^-7.
# Both exact; the factor goes back in with the scales.
# CUDA: the conversions in PTX on 4 codes (one 32-bit word) at a time. is_pure=False (launch
# parameter early_convert) keeps Triton from moving them behind the shared-memory load of the dot
# operand, where V's bytes would be gathered one by one (V's reduction axis is the strided one).
PTX_INT8 = tl.constexpr("""{
    .reg .b32 u, a0, a1, k;
    mov.b32 k, 0x48804880;
    xor.b32 u, $2, 0x80808080;
    prmt.b32 a0, u, 0x4848, 0x4140;
    prmt.b32 a1, u, 0x4848, 0x4342;
    sub.f16x2 $0, a0, k;
    sub.f16x2 $1, a1, k;
}""")  # bytes x ^ 0x80 under fp16 exponent 0x48: 8 + (x + 128) / 128; minus 9 leaves x / 128
PTX_E4M3_SW = tl.constexpr("""{
    .reg .b32 a0, a1;
    prmt.b32 a0, $2, 0, 0x9180;
    prmt.b32 a1, $2, 0, 0xb3a2;
    shl.b32 a0, a0, 7;
    shl.b32 a1, a1, 7;
    and.b32 $0, a0, 0xbf80bf80;
    and.b32 $1, a1, 0xbf80bf80;
}""")  # integer ops only: code c sign-extended into a 16-bit lane (prmt's byte-sign mode), << 7 puts its sign at bit 15
# and exponent / mantissa under fp16's; the mask clears the sign's copy at bit 14 (and the bits the 32-bit shift carries
# over from the lane below): e4m3 bits as fp16 / 256, 6 instructions per 4 codes (the form before, 8)
_PTX_E4M3_HW = tl.constexpr("""{
    .reg .b16 l, h;
    .reg .b32 a0, a1, k;
    mov.b32 k, 0x1c001c00;
    mov.b32 {l, h}, $2;
    cvt.rn.f16x2.e4m3x2 a0, l;
    cvt.rn.f16x2.e4m3x2 a1, h;
    mul.f16x2 $0, a0, k;
    mul.f16x2 $1, a1, k;
}""")  # hardware e4m3 -> fp16, times 2^-8 (exact) to match the software path bit for bit (without the multiply, with
# the power of two moved into S's and the output's factors: 0.993-1.000x the time, so not worth a second convention;
# H200, bench/results/2026-12-04-h200-fp8-v-by-dim.md, call 4)
PTX_E4M3_HW_EXACT = tl.constexpr("""{
    .reg .b16 l, h;
    mov.b32 {l, h}, $2;
    cvt.rn.f16x2.e4m3x2 $0, l;
    cvt.rn.f16x2.e4m3x2 $1, h;
}""")  # the exact e4m3 value (the Gluon stage 1's; _PTX_E4M3_HW also multiplies by 2^-8)
# V by token (Gluon stage 1): a thread's 32-bit word holds two tokens' (even dim, odd dim) byte pairs, b0 b1 | b2 b3;
# the tokens' even dims (b0, b2) and odd dims (b1, b3) become two f16x2 (one per output column of the pair)
PTX_E4M3_HW_PAIRS = tl.constexpr("""{
    .reg .b32 t;
    .reg .b16 e, o;
    prmt.b32 t, $2, 0, 0x3120;
    mov.b32 {e, o}, t;
    cvt.rn.f16x2.e4m3x2 $0, e;
    cvt.rn.f16x2.e4m3x2 $1, o;
}""")  # exact e4m3 values
PTX_E4M3_SW_PAIRS = tl.constexpr("""{
    .reg .b32 a0, a1;
    prmt.b32 a0, $2, 0, 0xa280;
    prmt.b32 a1, $2, 0, 0xb391;
    shl.b32 a0, a0, 7;
    shl.b32 a1, a1, 7;
    and.b32 $0, a0, 0xbf80bf80;
    and.b32 $1, a1, 0xbf80bf80;
}""")  # value / 256: PTX_E4M3_SW with the bytes taken (b0, b2) and (b1, b3)


@triton.jit
def codes_to_f16(codes, KV_QUANT: tl.constexpr, FP8_SOFTWARE: tl.constexpr, PTX: tl.constexpr,
                  PURE: tl.constexpr = False):
    """uint8 codes -> fp16: e4m3 value * 2^-8, or int8 value * 2^-7 (exact either way). PURE lets
    Triton move the PTX conversion behind the shared-memory load of the dot operand (launch
    parameter early_convert)."""
    if PTX:
        if KV_QUANT == 2:
            return tl.inline_asm_elementwise(PTX_INT8, "=r,=r,r", [codes], dtype=tl.float16, is_pure=PURE, pack=4)
        elif FP8_SOFTWARE:
            return tl.inline_asm_elementwise(PTX_E4M3_SW, "=r,=r,r", [codes], dtype=tl.float16, is_pure=PURE, pack=4)
        else:
            return tl.inline_asm_elementwise(_PTX_E4M3_HW, "=r,=r,r", [codes], dtype=tl.float16, is_pure=PURE, pack=4)
    elif KV_QUANT == 2:
        return codes.to(tl.int8, bitcast=True).to(tl.float16) * 0.0078125
    elif FP8_SOFTWARE:
        # sign to bit 15 (x + (x & 0x80) carries bit 7 into bit 8), exponent and mantissa under fp16's (the PTX's
        # sign-extending form, written with Triton ops, took 252 VGPRs against 204 for gfx936 and 254 against 244
        # registers for sm90: compile_check, 2026-12-04)
        x = codes.to(tl.int16)
        return ((x + (x & 0x80)) << 7).to(tl.float16, bitcast=True)
    else:
        return (e4m3_bits_to_f32_hw(codes) * 0.00390625).to(tl.float16)


@triton.jit
def code_unit(KV_QUANT: tl.constexpr):
    """value / fp16 code of codes_to_f16: int8 codes are value / 128, e4m3 codes value / 256."""
    if KV_QUANT == 2:
        return 128.0
    else:
        return 256.0


@triton.jit
def v_scale_log2(v_scale, KV_QUANT: tl.constexpr):
    """log2 of each key's V factor: V scale x code unit x 2^-8 (V = fp16 code x factor x 2^8), the V scale floored
    at 2^-64 (a zero scale's codes are all 0, so its factor never shows)."""
    if KV_QUANT == 2:
        bias = -1.0  # log2(code_unit) - 8, as a literal so it folds
    else:
        bias = 0.0
    return tl.log2(tl.maximum(v_scale, _V_SCALE_FLOOR)) + bias


@triton.jit
def pow2_fp16_scale(q):
    """(s, 1/s): s a power of two that puts max|q| in [2^12, 2^13), so q * s is exact in fp16 (no
    overflow; bf16's 8 significant bits fit fp16's 11 down to 2^-26 of the maximum). Built from the
    exponent bits, not exp2/log2, so it is exact on every target."""
    amax = tl.max(tl.max(tl.abs(q), axis=1), axis=0)
    e = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF  # biased exponent of max|q|
    s_exp = tl.minimum(266 - e, 253)  # 127 + 12 - (e - 127); zero q: 2^126
    s = (s_exp << 23).to(tl.float32, bitcast=True)
    inv_s = ((254 - s_exp) << 23).to(tl.float32, bitcast=True)
    return s, inv_s


@triton.jit
def q_for_codes(q, KV_QUANT: tl.constexpr):
    """q for fp16 products with 8-bit codes (exact in fp16, see codes_to_f16): scaled by a power of two into
    fp16's range (pow2_fp16_scale). Returns (q in fp16, the factor S needs to undo that scale and the codes'
    unit, code_unit)."""
    q32 = q.to(tl.float32)
    q_s, q_inv_s = pow2_fp16_scale(q32)
    return (q32 * q_s).to(tl.float16), code_unit(KV_QUANT) * q_inv_s


@triton.jit
def q_int8_pair(q):
    """q for int8 x int8 products with int8 codes (launch key int8_qk): per row, q = sq x (hi + lo / 256) with hi
    and lo int8 (lo the rounded remainder, clamped to +-127), so |q - sq (hi + lo / 256)| <= sq / 256 = max|q of the
    row| / 32512 (sq / 512 unless the remainder rounds to -128): ~15 significant bits against the row's largest
    element (bf16 q has 8). Returns (hi, lo, sq per row)."""
    q32 = q.to(tl.float32)
    amax = tl.max(tl.abs(q32), axis=1)
    sq = tl.where(amax > 0, amax / 127.0, 1.0)
    hi = tl.minimum(tl.maximum(tl.floor(q32 / sq[:, None] + 0.5), -127.0), 127.0)
    lo = tl.minimum(tl.maximum(tl.floor((q32 - hi * sq[:, None]) * (256.0 / sq[:, None]) + 0.5), -127.0), 127.0)
    return hi.to(tl.int8), lo.to(tl.int8), sq


@triton.jit
def p_int8_pair(p):
    """P' in [0, 1] as an int8 pair for int8 x int8 P x V products (INT8_PV: int8 caches, V by dim): 127 P' = hi +
    lo / 254, hi in [0, 127], lo the rounded remainder (|remainder| <= 1/2, so |lo| <= 127), so |P' - (hi + lo / 254)
    / 127| <= 1 / 64516 (fp16's P rounds to 2^-11 of P': the pair is finer for P' > 0.03, coarser below, where
    the key's share of the output is as small)."""
    x = p * 127.0
    hi = tl.floor(x + 0.5)
    lo = tl.floor((x - hi) * 254.0 + 0.5)
    return hi.to(tl.int8), lo.to(tl.int8)
