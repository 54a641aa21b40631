"""Split-KV (flash-decoding) paged attention for decode steps (one query token per sequence).

Stage 1: one program per (sequence, kv head, split). The q heads of the GQA group (6 for
Qwen3.5) are packed into one 16-row tile, so K and V are read once per kv head and both products
are ``tl.dot``. Each split walks its tokens in tiles of BLOCK_N; the physical page of every token
is looked up in the block table, so a tile may straddle pages and the block size only has to be a
multiple of 16 (784, 1552, ... work). A split writes its normalized partial output and its
log-sum-exp to the workspace; a sequence that ends up with a single split writes the final output
directly.
Stage 2: one program per (sequence, q head, 64 columns of head_dim) merges the splits by
log-sum-exp; at batch 1 that is 96 short programs instead of 24 long ones.

The grid is (batch, kv heads, max_splits) with max_splits chosen on the host from the batch size
and the number of compute units only; each program computes its own split range from its
sequence's length (launch key even_splits: the tiles spread evenly over min(wanted, tiles) splits; else
cdiv(tiles, wanted) tiles per split, which can leave wanted splits without work). So nothing is read back from
the device and a captured CUDA/HIP graph is valid for any context length.
Launch key balance (batch > 1): the same number of programs, shared out by length. The grid is (programs + batch, kv
heads); each program reads every sequence's length, once for a batch of up to 256 (_balanced_split_in_one; larger
batches chunk by chunk, _balanced_share), works out the batch's tiles and each sequence's part of the programs (rounded
up, the parts scaled down where rounding would start a second wave, _share_within) and finds its sequence and split by
a prefix sum (_balanced_split_of); each sequence's first program hands stage 2 its first workspace row and split count
through the workspace.
Without it every sequence gets as many splits as the longest, so one long request among short ones runs on a few
programs while the rest of the chip idles (H200, one 32K among 4K ones: 2-4x the time with it).

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
int8 caches, launch key int8_qk (on in sm90's entry: 0.95x the fp16 path's time on the H200): QK^T without
converting K. q becomes a per-row int8 pair, q = sq (hi + lo / 256) (_q_int8_pair: within max|q of the row| /
32512 of q), two int8 x int8 dots with K's raw codes accumulate exactly in int32, and S = (hi.K + lo.K / 256) x sq
x K scale x softmax scale. V goes as before. For GPUs with int8 matrix units and no fp8 (the DCU: int8 MFMA);
compiled for gfx90a it takes 181 VGPRs against 226 (compile_check).
int8 caches hold V by dim (kv_quant.layout.V_BY_DIM: a page's V codes are [kv heads, head_dim, block_size], tokens
contiguous), and with V read that way (host: V's token stride is 1) P x V is int8 x int8 too (INT8_PV): P' in [0, 1]
becomes an int8 pair, 127 P' = hi + lo / 254 (_p_int8_pair: within 1 / 64516 of P'), and two int8 dots with V's raw
codes accumulate exactly in int32; V is never converted, and its tile goes from global memory to shared memory to the
matrix operands (no fp16 copy in shared memory; with the reduction axis contiguous that needs no byte gathers).
H200, against the by-token fp16 path with the previous sm90 entry in the same calls (bench/results/2026-12-03-h200-
device-runs-9.md, calls A and B): 0.967 / 0.974x its time (geomean over batch 1/4/16/64 x 4-32K); batch 64
0.92-0.93x (83-91% of copy bandwidth; int8 / bf16 at 16-32K 0.59-0.62 against 0.65-0.68), batch 1-16 0.97-1.01x.
fp8 codes must become fp16 first, so fp8 caches keep V by token. With V by dim, the page loop reads a tile's slots as
one contiguous run whatever the sequence's end (V_CONTIG, as the int8 path does; slots past the end have P' = 0, and
their codes go through the integer e4m3 decode, which makes every code finite where hardware decode makes 0x7f a
NaN): 1.05-1.09x the by-token time (geomean over batch 1/4/16/64 x 4-32K, per fp8 decode), and with early_convert 0
(codes from shared memory straight into the dot operand, converted there: no fp16 tile in shared memory, 76.8 KB
against 109.6 KB) 1.01-1.05x, 0.92-1.16x per cell; at 3 programs per SM 1.1-1.3x at batch 64 (H200, two calls,
bench/results/2026-12-04-h200-fp8-v-by-dim.md). Before V_CONTIG the by-dim fp16 path took 1.3-2.0x its by-token
time (Triton gathered the clamped rows' bytes one by one).
Scores are not clamped: |q . k x scale| must stay within float32 (the prefill kernel saturates S
at +-3e38 for inputs beyond that).
Rows past the end of a sequence re-read its last token instead of being masked, so the K/V loads
carry no row mask. On CUDA the conversions are PTX (4 codes per instruction sequence; the software
e4m3 path uses integer ops only); elsewhere the same values come from portable Triton ops. Only the
conversions differ between the two: the scale arithmetic above is shared.
"""
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..fp8_e4m3 import e4m3_bits_to_f32_hw, use_software_fp8
from ..paged_kv import check_block_table, check_one_device, check_q_and_cache
from ..targets import num_compute_units
from . import launch_params

_LOG2E = 1.4426950408889634
_BLOCK_H = 16  # q rows per tile: smallest tl.dot M; holds GQA groups up to 16
_MERGE_SPLITS = 64  # splits merged per step in stage 2
_MERGE_DIM = 64  # head_dim columns per stage-2 program (more programs, fewer serial loads)
_BATCH_CHUNK = 256  # launch key balance: sequence lengths read per step (one step up to batch 256)
_KV_QUANT = {None: 0, "fp8": 1, "int8": 2}
# constexpr: the compiler (unlike the interpreter) refuses plain Python globals inside a kernel
# 8-bit caches (docstring): log2 of the V factor is at least -65 (V scales floored at 2^-64) and at most ~120
# (bf16's largest V); l is kept x 2^32, so with P' = exp2(score + log2 factor - m) it stays within [2^-88, 2^117]
# for up to 2^20 keys, clear of float32's flush-to-zero and overflow
_V_SCALE_FLOOR = tl.constexpr(5.421010862427522e-20)  # 2^-64
_L_SHIFT = tl.constexpr(32.0)
_KV8_OUT_FACTOR = tl.constexpr(1099511627776.0)  # 2^40 = 2^8 (the V factor's) x 2^32 (l's)
_KV8_PV_OUT_FACTOR = tl.constexpr(1099511627776.0 / (127.0 * 128.0))  # INT8_PV: acc in units of 127 P' x int8 code


@triton.jit
def _num_tiles(seq_len, block_size, BLOCK_N: tl.constexpr, PAGE_LOOP: tl.constexpr):
    """KV tiles of one sequence. PAGE_LOOP: tiles never cross a page, cdiv(block_size, BLOCK_N) of them per page
    (a page's last tile ends at the page's end, overlapping the one before)."""
    if PAGE_LOOP:
        last_page = (seq_len - 1) // block_size
        return last_page * tl.cdiv(block_size, BLOCK_N) + (seq_len - 1 - last_page * block_size) // BLOCK_N + 1
    else:
        return tl.cdiv(seq_len, BLOCK_N)


@triton.jit
def _split_range(seq_len, n_tiles, max_splits, min_split_tokens, EVEN: tl.constexpr):
    """Tiles per split and number of non-empty splits of one sequence (both stages agree). EVEN (launch key
    even_splits): min(wanted, tiles) splits, the first n_tiles % n_splits of them one tile longer than the
    returned count (_split_tiles); else every split takes cdiv(tiles, wanted) tiles, which can leave fewer splits
    than wanted with work (137 tiles over 66 wanted splits: 46 of 3 tiles)."""
    want = tl.maximum(tl.minimum(tl.cdiv(seq_len, min_split_tokens), max_splits), 1)
    if EVEN:
        n_splits = tl.maximum(tl.minimum(want, n_tiles), 1)
        return n_tiles // n_splits, n_splits
    else:
        tiles_per_split = tl.maximum(tl.cdiv(n_tiles, want), 1)
        return tiles_per_split, tl.cdiv(n_tiles, tiles_per_split)


@triton.jit
def _split_tiles(split, tiles_per_split, n_splits, n_tiles, EVEN: tl.constexpr):
    """[first, end) tiles of one split under _split_range's plan."""
    if EVEN:
        longer = n_tiles - tiles_per_split * n_splits  # the first `longer` splits take one tile more
        start = split * tiles_per_split + tl.minimum(split, longer)
        return start, start + tiles_per_split + (split < longer).to(tl.int32)
    else:
        start = split * tiles_per_split
        return start, tl.minimum(start + tiles_per_split, n_tiles)


@triton.jit
def _balanced_tiles(lens, block_size, BLOCK_N: tl.constexpr, PAGE_LOOP: tl.constexpr):
    """Tiles of each sequence of a chunk of the batch (0 for a padded slot or past the batch: length 0)."""
    return tl.where(lens > 0, _num_tiles(tl.maximum(lens, 1), block_size, BLOCK_N, PAGE_LOOP), 0)


@triton.jit
def _balanced_splits(lens, tiles, total, share, max_splits, min_split_tokens):
    """Launch key balance: splits of each sequence, its part of ``share`` programs rounded up, cdiv(share x its tiles,
    the batch's tiles) (no split longer than tiles / share; equal lengths get share / batch each), capped by its tiles,
    max_splits and cdiv(length, min_split_tokens) as the plan without balance is; at least 1 (a padded slot's one
    program writes its zeros). Its tiles spread over them as even_splits spreads them. share x tiles stays far inside
    int32 (share ~ a few hundred, tiles <= 2^16 at 1M tokens)."""
    want = tl.minimum(tl.minimum(tl.cdiv(share * tiles, total), tiles),
                      tl.minimum(tl.cdiv(lens, min_split_tokens), max_splits))
    return tl.maximum(want, 1)


@triton.jit
def _share_within(need, programs):
    """Launch key balance: the programs the sequences' parts are taken of, given the ``need`` their parts of
    ``programs`` add up to once rounded up: ``programs``, or less the overflow (at least 1) where they exceed it
    (_balanced_share says why)."""
    return tl.where(need > programs, tl.maximum(2 * programs - need, 1), programs)


@triton.jit
def _balanced_share(seq_lens_ptr, batch, programs, max_splits, min_split_tokens, block_size, offs,
                    BLOCK_N: tl.constexpr, PAGE_LOOP: tl.constexpr, CHUNK: tl.constexpr):
    """Launch key balance: (the batch's tiles, the programs its sequences' parts are taken of). Rounding each part up
    adds up to one program per sequence beyond ``programs`` (as many as the plan without balance launches), and
    those start a second wave (H200, 16 x 16-32K int8: 1.23x the time without balance), so where they overflow, the
    parts are taken of ``programs`` less the overflow (at least 1). The launch has programs + batch per kv head.
    offs: tl.arange(0, CHUNK). (Scalars start as batch * 0: an int32 with no layout, as the Gluon stage 1 needs.)"""
    total = batch * 0
    for b0 in range(0, batch, CHUNK):
        lens = tl.load(seq_lens_ptr + b0 + offs, mask=b0 + offs < batch, other=0)
        total += tl.sum(_balanced_tiles(lens, block_size, BLOCK_N, PAGE_LOOP))
    total = tl.maximum(total, 1)
    need = batch * 0
    for b0 in range(0, batch, CHUNK):
        valid = b0 + offs < batch
        lens = tl.load(seq_lens_ptr + b0 + offs, mask=valid, other=0)
        counts = _balanced_splits(lens, _balanced_tiles(lens, block_size, BLOCK_N, PAGE_LOOP), total, programs,
                                  max_splits, min_split_tokens)
        need += tl.sum(tl.where(valid, counts, 0))
    return total, _share_within(need, programs)


@triton.jit
def _add3(a0, a1, a2, b0, b1, b2):
    return a0 + b0, a1 + b1, a2 + b2


@triton.jit
def _balanced_split_in_one(program, seq_lens_ptr, batch, programs, max_splits, min_split_tokens, block_size, offs,
                           BLOCK_N: tl.constexpr, PAGE_LOOP: tl.constexpr):
    """_balanced_split_of for a batch of up to len(offs) sequences (offs: tl.arange(0, WIDTH)): the lengths are read
    once and every pass runs on those registers. (A second, 32-wide copy for batches up to 32 spilled registers into
    the 8-bit kernels' main loop: 1.05-1.07x their time, batch 1 included; H200,
    bench/results/2026-12-04-h200-balance-plan-handoff.md.)"""
    valid = offs < batch
    lens = tl.load(seq_lens_ptr + offs, mask=valid, other=0)
    tiles = _balanced_tiles(lens, block_size, BLOCK_N, PAGE_LOOP)
    total = tl.maximum(tl.sum(tiles), 1)
    need = tl.sum(tl.where(valid, _balanced_splits(lens, tiles, total, programs, max_splits, min_split_tokens), 0))
    share = _share_within(need, programs)
    counts = tl.where(valid, _balanced_splits(lens, tiles, total, share, max_splits, min_split_tokens), 0)
    before = tl.cumsum(counts, 0) <= program  # sequences whose programs all come before this one
    n_before, first, _ = tl.reduce((before.to(tl.int32), tl.where(before, counts, 0), counts), 0, _add3)
    seq = tl.where(n_before < batch, n_before, -1)  # past the batch: every program is taken
    here = offs == n_before
    return seq, program - first, tl.sum(tl.where(here, counts, 0)), tl.sum(tl.where(here, lens, 0))


@triton.jit
def _balanced_split_of(program, seq_lens_ptr, batch, programs, max_splits, min_split_tokens, block_size, offs,
                       BLOCK_N: tl.constexpr, PAGE_LOOP: tl.constexpr, CHUNK: tl.constexpr):
    """Launch key balance, stage 1: the (sequence, split, the sequence's split count, its length) that program
    ``program`` of a kv head works on. The programs of a kv head take the sequences' splits (_balanced_splits) in
    batch order, so a sequence's first split is its first workspace row. Sequence -1: no work left (the grid has
    ``programs`` + batch per kv head, each sequence's part rounding up by less than one). A batch of up to CHUNK
    (256) sequences is read once (_balanced_split_in_one), a larger one CHUNK at a time, once per pass. offs:
    tl.arange(0, CHUNK), an argument so that the Gluon stage 1 (gluon_stage1.py), whose aranges carry a layout,
    shares this code."""
    if batch <= CHUNK:
        seq, split, n_splits, seq_len = _balanced_split_in_one(program, seq_lens_ptr, batch, programs, max_splits,
                                                               min_split_tokens, block_size, offs, BLOCK_N, PAGE_LOOP)
    else:
        total, share = _balanced_share(seq_lens_ptr, batch, programs, max_splits, min_split_tokens, block_size, offs,
                                       BLOCK_N, PAGE_LOOP, CHUNK)
        seq = batch * 0 - 1
        first = batch * 0  # this sequence's first program
        taken = batch * 0  # programs taken by the chunks before this one
        for b0 in range(0, batch, CHUNK):
            valid = b0 + offs < batch
            lens = tl.load(seq_lens_ptr + b0 + offs, mask=valid, other=0)
            counts = tl.where(valid, _balanced_splits(lens, _balanced_tiles(lens, block_size, BLOCK_N, PAGE_LOOP),
                                                      total, share, max_splits, min_split_tokens), 0)
            before = tl.cumsum(counts, 0) + taken <= program
            # one reduction: how many such sequences (the index of this program's one), their programs, the chunk's
            n_before, programs_before, in_chunk = tl.reduce((before.to(tl.int32), tl.where(before, counts, 0),
                                                             counts), 0, _add3)
            hit = (n_before < CHUNK) & (seq < 0)  # entries past the batch count 0 programs: a hit is a sequence
            seq = tl.where(hit, b0 + n_before, seq)
            first = tl.where(hit, taken + programs_before, first)
            taken += in_chunk
        n_splits = batch * 0
        seq_len = batch * 0
        if seq >= 0:
            seq_len = tl.load(seq_lens_ptr + seq)
            n_splits = _balanced_splits(seq_len, _balanced_tiles(seq_len, block_size, BLOCK_N, PAGE_LOOP), total,
                                        share, max_splits, min_split_tokens)
        split = program - first
    return seq, split, n_splits, seq_len


# Codes become fp16 bit patterns: e4m3 -> value * 2^-8 (subnormals included), int8 -> value * 2^-7.
# Both exact; the factor goes back in with the scales.
# CUDA: the conversions in PTX on 4 codes (one 32-bit word) at a time. is_pure=False (launch
# parameter early_convert) keeps Triton from moving them behind the shared-memory load of the dot
# operand, where V's bytes would be gathered one by one (V's reduction axis is the strided one).
_PTX_INT8 = tl.constexpr("""{
    .reg .b32 u, a0, a1, k;
    mov.b32 k, 0x48804880;
    xor.b32 u, $2, 0x80808080;
    prmt.b32 a0, u, 0x4848, 0x4140;
    prmt.b32 a1, u, 0x4848, 0x4342;
    sub.f16x2 $0, a0, k;
    sub.f16x2 $1, a1, k;
}""")  # bytes x ^ 0x80 under fp16 exponent 0x48: 8 + (x + 128) / 128; minus 9 leaves x / 128
_PTX_E4M3_SW = tl.constexpr("""{
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


@triton.jit
def _codes_to_f16(codes, KV_QUANT: tl.constexpr, FP8_SOFTWARE: tl.constexpr, PTX: tl.constexpr,
                  PURE: tl.constexpr = False):
    """uint8 codes -> fp16: e4m3 value * 2^-8, or int8 value * 2^-7 (exact either way). PURE lets
    Triton move the PTX conversion behind the shared-memory load of the dot operand (launch
    parameter early_convert)."""
    if PTX:
        if KV_QUANT == 2:
            return tl.inline_asm_elementwise(_PTX_INT8, "=r,=r,r", [codes], dtype=tl.float16, is_pure=PURE, pack=4)
        elif FP8_SOFTWARE:
            return tl.inline_asm_elementwise(_PTX_E4M3_SW, "=r,=r,r", [codes], dtype=tl.float16, is_pure=PURE, pack=4)
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
def _code_unit(KV_QUANT: tl.constexpr):
    """value / fp16 code of _codes_to_f16: int8 codes are value / 128, e4m3 codes value / 256."""
    if KV_QUANT == 2:
        return 128.0
    else:
        return 256.0


@triton.jit
def _v_scale_log2(v_scale, KV_QUANT: tl.constexpr):
    """log2 of each key's V factor: V scale x code unit x 2^-8 (V = fp16 code x factor x 2^8), the V scale floored
    at 2^-64 (a zero scale's codes are all 0, so its factor never shows)."""
    if KV_QUANT == 2:
        bias = -1.0  # log2(_code_unit) - 8, as a literal so it folds
    else:
        bias = 0.0
    return tl.log2(tl.maximum(v_scale, _V_SCALE_FLOOR)) + bias


@triton.jit
def _pow2_fp16_scale(q):
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
def _q_for_codes(q, KV_QUANT: tl.constexpr):
    """q for fp16 products with 8-bit codes (exact in fp16, see _codes_to_f16): scaled by a power of two into
    fp16's range (_pow2_fp16_scale). Returns (q in fp16, the factor S needs to undo that scale and the codes'
    unit, _code_unit)."""
    q32 = q.to(tl.float32)
    q_s, q_inv_s = _pow2_fp16_scale(q32)
    return (q32 * q_s).to(tl.float16), _code_unit(KV_QUANT) * q_inv_s


@triton.jit
def _q_int8_pair(q):
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
def _p_int8_pair(p):
    """P' in [0, 1] as an int8 pair for int8 x int8 P x V products (INT8_PV: int8 caches, V by dim): 127 P' = hi +
    lo / 254, hi in [0, 127], lo the rounded remainder (|remainder| <= 1/2, so |lo| <= 127), so |P' - (hi + lo / 254)
    / 127| <= 1 / 64516 (fp16's P rounds to 2^-11 of P': the pair is finer for P' > 0.03, coarser below, where
    the key's share of the output is as small)."""
    x = p * 127.0
    hi = tl.floor(x + 0.5)
    lo = tl.floor((x - hi) * 254.0 + 0.5)
    return hi.to(tl.int8), lo.to(tl.int8)


@triton.jit
def _kv_rows(tile, bt_row, last, block_size, offs_n, last_page, BLOCK_N: tl.constexpr,
             PAGE_GE_TILE: tl.constexpr):
    """(physical page, slot) of each token of KV tile ``tile``; tokens past ``last`` read ``last``."""
    tok = tl.minimum(tile * BLOCK_N + offs_n, last)
    if PAGE_GE_TILE:
        # a tile touches at most two pages: two scalar block-table reads, no per-token division
        page0 = (tile * BLOCK_N) // block_size
        phys0 = tl.load(bt_row + page0).to(tl.int64)
        phys1 = tl.load(bt_row + tl.minimum(page0 + 1, last_page)).to(tl.int64)
        slot = tok - page0 * block_size
        second = slot >= block_size
        slot = tl.where(second, slot - block_size, slot)
        phys = tl.where(second, phys1, phys0)
    else:
        page = tok // block_size
        slot = tok - page * block_size
        phys = tl.load(bt_row + page).to(tl.int64)
    return phys, slot


@triton.jit
def _tile_update(q, q_lo, acc, m_i, l_i, k_rows, v_rows, ks_ptrs, vs_ptrs, offs_d, stride_vd, key_ok, s_mult, kv_mask,
                 kv_other, KV_QUANT: tl.constexpr, FP8_SOFTWARE: tl.constexpr, PTX: tl.constexpr, K_PURE: tl.constexpr,
                 V_PURE: tl.constexpr, INT8_QK: tl.constexpr, INT8_PV: tl.constexpr = False,
                 V_CONTIG: tl.constexpr = False):
    """One KV tile of the online softmax; returns (acc, m, l). k_rows / v_rows: a pointer per key to its row of
    head_dim values; key_ok: the keys that count (not past the sequence, not already done). INT8_QK: q is the
    int8 pair (q, q_lo) of _q_int8_pair and s_mult its per-row factor; K's codes go to the dot unconverted.
    INT8_PV: P' as an int8 pair (_p_int8_pair) with V's raw codes (V by dim), acc in units of 127 P' x code."""
    k = tl.load(k_rows[:, None] + offs_d[None, :], mask=kv_mask, other=kv_other)
    if INT8_QK:
        k8 = tl.trans(k.to(tl.int8, bitcast=True))
        s = tl.dot(q, k8, out_dtype=tl.int32).to(tl.float32) + \
            tl.dot(q_lo, k8, out_dtype=tl.int32).to(tl.float32) * 0.00390625
    else:
        if KV_QUANT != 0:
            k = _codes_to_f16(k, KV_QUANT, FP8_SOFTWARE, PTX, K_PURE)
        s = tl.dot(q, tl.trans(k))
    if KV_QUANT != 0:
        k_scale = tl.load(ks_ptrs)
        v_scale = tl.load(vs_ptrs)
        if INT8_QK:
            s = s * s_mult[:, None] * k_scale[None, :]  # s_mult: q's factor per row
        else:
            s = s * (k_scale * s_mult)[None, :]
    else:
        s = s * s_mult
    s = tl.where(key_ok[None, :], s, float("-inf"))
    if KV_QUANT != 0:
        # V factor folded into the score as its log (docstring): the running max is over t = score + log2(V
        # factor), P' = exp2(t - m) <= 1 goes to the dot with the codes, l sums exp2(score - m + 32) (its own
        # exponential: a key whose P' underflows can still carry probability, e.g. a zero-V key)
        t = s + _v_scale_log2(v_scale, KV_QUANT)[None, :]
        m_new = tl.maximum(m_i, tl.max(t, axis=1))
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(tl.exp2(s - m_new[:, None] + _L_SHIFT), axis=1)
        p = tl.exp2(t - m_new[:, None])
    else:
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(v_rows[:, None] + offs_d[None, :] * stride_vd, mask=kv_mask, other=kv_other)
    if INT8_PV:
        v8 = v.to(tl.int8, bitcast=True)
        p_hi, p_lo = _p_int8_pair(p)
        pv = tl.dot(p_hi, v8, out_dtype=tl.int32).to(tl.float32) + \
            tl.dot(p_lo, v8, out_dtype=tl.int32).to(tl.float32) * (1.0 / 254.0)
        acc = acc * alpha[:, None] + pv
    else:
        if KV_QUANT != 0:
            # V_CONTIG: slots past the sequence hold whatever codes (P' = 0 there); the integer e4m3 decode makes every
            # code finite (hardware decode makes 0x7f NaN, and 0 x NaN is NaN); same values as the hardware path
            v = _codes_to_f16(v, KV_QUANT, FP8_SOFTWARE or V_CONTIG, PTX, V_PURE)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i


# max_splits and min_split_tokens change with the batch size (or a forced split count): not
# specialized on, so one compiled kernel serves every batch size.
@triton.jit(do_not_specialize=["max_splits", "min_split_tokens", "batch", "balance_programs"])
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, block_table_ptr, seq_lens_ptr,
    out_ptr, ws_o_ptr, ws_lse_ptr, ws_plan_ptr,
    scale_log2, max_splits, min_split_tokens, block_size, num_q_heads, batch, balance_programs,
    stride_qb, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh, stride_vd,
    stride_ksb, stride_kst, stride_ksh,
    stride_vsb, stride_vst, stride_vsh,
    stride_btb,
    stride_ob, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_GE_TILE: tl.constexpr,
    KV_QUANT: tl.constexpr, FP8_SOFTWARE: tl.constexpr, PTX: tl.constexpr,
    K_PURE: tl.constexpr = False, V_PURE: tl.constexpr = False, PAGE_LOOP: tl.constexpr = False,
    INT8_QK: tl.constexpr = False, INT8_PV: tl.constexpr = False, Q_EARLY: tl.constexpr = False,
    EVEN_SPLITS: tl.constexpr = False, BALANCE: tl.constexpr = False, BATCH_CHUNK: tl.constexpr = 256,
    V_CONTIG: tl.constexpr = False,
):  # fmt: skip
    kv_head = tl.program_id(1)
    seq = tl.program_id(0)
    split = tl.program_id(2)
    ws_first = seq * max_splits
    # launch key balance: grid (balance_programs + batch, kv heads); this program's sequence and split come from every
    # sequence's share of the programs (_balanced_split_of), its workspace rows from its place among them.
    # balance_programs 0 (batch 1): the plan without it, in the same compiled kernel
    balanced = False
    if BALANCE:
        balanced = balance_programs > 0
    n_splits_balanced = tl.zeros([], dtype=tl.int32)
    seq_len_balanced = tl.zeros([], dtype=tl.int32)
    if balanced:
        seq, split, n_splits_balanced, seq_len_balanced = _balanced_split_of(
            tl.program_id(0), seq_lens_ptr, batch, balance_programs, max_splits, min_split_tokens, block_size,
            tl.arange(0, BATCH_CHUNK), BLOCK_N, PAGE_LOOP, BATCH_CHUNK)
        ws_first = tl.program_id(0) - split
        if (split == 0) & (kv_head == 0) & (seq >= 0):
            # the sequence's (first workspace row, splits) for stage 2, which then need not redo the plan (before any
            # return: a padded slot's 1 tells stage 2 there is nothing to merge)
            tl.store(ws_plan_ptr + 2 * seq + tl.arange(0, 2), tl.where(tl.arange(0, 2) == 0, ws_first,
                                                                       n_splits_balanced))

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    h_mask = offs_h < GROUP
    d_mask = offs_d < HEAD_DIM
    hd_mask = h_mask[:, None] & d_mask[None, :]
    q_heads = kv_head * GROUP + offs_h
    out_offs = seq * stride_ob + q_heads[:, None] * stride_oh + offs_d[None, :]

    if balanced:
        if seq < 0:
            return  # past the programs the batch's sequences take
        seq_len = seq_len_balanced  # the plan read it (no second load)
    else:
        seq_len = tl.load(seq_lens_ptr + seq)
    q_ptrs = q_ptr + seq * stride_qb + q_heads[:, None] * stride_qh + offs_d[None, :]
    if Q_EARLY:
        # 8-bit caches work on q before the KV loop (its int8 pair or power-of-two scale): q's load goes out with
        # seq_len's (its address does not depend on it; every row of the batch is valid memory), so the two
        # latencies overlap (H200: 0.92-0.96x the int8 time with the page-ahead block-table read below; bf16, which
        # only needs q in the loop, ran 1.04-1.09x slower at batch 1 with it, so it loads q after the checks)
        q = tl.load(q_ptrs, mask=hd_mask, other=0.0)
    n_tiles = _num_tiles(seq_len, block_size, BLOCK_N, PAGE_LOOP)
    if balanced:
        n_splits = n_splits_balanced
        tiles_per_split = n_tiles // n_splits  # spread as even_splits spreads them (_split_tiles below)
    else:
        tiles_per_split, n_splits = _split_range(seq_len, n_tiles, max_splits, min_split_tokens, EVEN_SPLITS)

    if seq_len <= 0:
        # padded batch slot (CUDA graphs): defined output, no KV reads
        if split == 0:
            zero = tl.zeros([BLOCK_H, BLOCK_D], dtype=out_ptr.dtype.element_ty)
            tl.store(out_ptr + out_offs, zero, mask=hd_mask)
        return
    if split >= n_splits:
        return
    if not Q_EARLY:
        q = tl.load(q_ptrs, mask=hd_mask, other=0.0)

    bt_row = block_table_ptr + seq * stride_btb
    if balanced:
        tile_start, tile_end = _split_tiles(split, tiles_per_split, n_splits, n_tiles, True)
    else:
        tile_start, tile_end = _split_tiles(split, tiles_per_split, n_splits, n_tiles, EVEN_SPLITS)
    if PAGE_LOOP:
        # the split's first block-table entry is read before q is worked on below, so its latency overlaps that work
        tiles_per_page = tl.cdiv(block_size, BLOCK_N)
        first_page = tile_start // tiles_per_page
        last_page_of_split = (tile_end - 1) // tiles_per_page
        next_phys = tl.load(bt_row + first_page).to(tl.int64)
    s_mult = scale_log2
    q_lo = q  # the int8 pair's low half (INT8_QK only)
    if INT8_QK:
        # int8 caches with launch key int8_qk: int8 x int8 products of q's int8 pair with K's raw codes (value =
        # code x K scale), no conversion of K; q's per-row factor comes back out of S in s_mult (a vector)
        q, q_lo, sq = _q_int8_pair(q)
        s_mult = sq * scale_log2
    elif KV_QUANT != 0:
        # 8-bit caches: fp16 products (every code is exact in fp16, see _codes_to_f16), q scaled
        # by a power of two into fp16's range; the factors come back out of S in s_mult.
        q, s_factor = _q_for_codes(q, KV_QUANT)
        s_mult = scale_log2 * s_factor

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)

    last = seq_len - 1
    if HEAD_DIM == BLOCK_D:
        kv_mask = None
        kv_other = None
    else:
        kv_mask = d_mask[None, :]
        kv_other = 0
    k_head = k_ptr + kv_head * stride_kh
    v_head = v_ptr + kv_head * stride_vh
    ks_head = ks_ptr + kv_head * stride_ksh
    vs_head = vs_ptr + kv_head * stride_vsh
    # Rows past the end of the sequence re-read its last token (always valid memory, finite), so the K/V loads
    # need no row mask; their scores are set to -inf.
    if PAGE_LOOP:
        # Pages in the outer loop (one block-table read each), the page's tiles in the inner one: nothing the inner
        # loop's addresses depend on is loaded inside it, so the pipeliner keeps num_stages - 1 tiles in flight
        # (with the page read in the same loop it kept one, whatever num_stages said). A page's last tile ends at
        # the page's end and masks the keys of the tile before it.
        # Each page's block-table entry is read one page ahead (the first one above).
        for page in range(first_page, last_page_of_split + 1):
            phys = next_phys
            next_phys = tl.load(bt_row + tl.minimum(page + 1, last_page_of_split)).to(tl.int64)
            first_tok = page * block_size
            for j in range(tl.maximum(tile_start - page * tiles_per_page, 0),
                           tl.minimum(tile_end - page * tiles_per_page, tiles_per_page)):
                start = j * BLOCK_N
                slots = tl.minimum(start, block_size - BLOCK_N) + offs_n
                key_ok = (slots >= start) & (first_tok + slots < seq_len)
                slot = tl.minimum(slots, last - first_tok)
                if V_CONTIG:
                    # V by dim: unclamped slots keep the tile's tokens contiguous (the pipeliner then copies whole
                    # runs); they stay inside the page (valid memory), and keys past the end have P' = 0 exactly,
                    # so whatever codes those slots hold add 0 x code = 0 (int8 codes are all finite; fp8 codes take
                    # the integer decode there, _tile_update)
                    v_slot = slots
                else:
                    v_slot = slot
                acc, m_i, l_i = _tile_update(
                    q, q_lo, acc, m_i, l_i,
                    k_head + phys * stride_kb + slot * stride_kt, v_head + phys * stride_vb + v_slot * stride_vt,
                    ks_head + phys * stride_ksb + slot * stride_kst, vs_head + phys * stride_vsb + slot * stride_vst,
                    offs_d, stride_vd, key_ok, s_mult, kv_mask, kv_other, KV_QUANT, FP8_SOFTWARE, PTX, K_PURE, V_PURE,
                    INT8_QK, INT8_PV, V_CONTIG,
                )  # fmt: skip
    else:
        last_page = last // block_size
        for tile in range(tile_start, tile_end):
            phys, slot = _kv_rows(tile, bt_row, last, block_size, offs_n, last_page, BLOCK_N, PAGE_GE_TILE)
            acc, m_i, l_i = _tile_update(
                q, q_lo, acc, m_i, l_i,
                k_head + phys * stride_kb + slot * stride_kt, v_head + phys * stride_vb + slot * stride_vt,
                ks_head + phys * stride_ksb + slot * stride_kst, vs_head + phys * stride_vsb + slot * stride_vst,
                offs_d, stride_vd, tile * BLOCK_N + offs_n < seq_len, s_mult, kv_mask, kv_other, KV_QUANT, FP8_SOFTWARE,
                PTX, K_PURE, V_PURE, INT8_QK, INT8_PV,
            )  # fmt: skip

    o = acc / l_i[:, None]
    lse = m_i + tl.log2(l_i)
    if KV_QUANT != 0:
        if INT8_PV:
            # acc sums 127 P' x int8 codes, not P' x codes / 128: one factor, so acc / l (up to ~2^14 more than the
            # fp16 path's) is never multiplied by 2^40 first (|V| ~1e37 would overflow float32 there)
            o = o * _KV8_PV_OUT_FACTOR
        else:
            o = o * _KV8_OUT_FACTOR  # acc: values x 2^-8 (_v_scale_log2); l_i: the softmax's sum x 2^32
        lse = lse - _L_SHIFT
    if n_splits == 1:
        tl.store(out_ptr + out_offs, o.to(out_ptr.dtype.element_ty), mask=hd_mask)
    else:
        row = (ws_first + split) * num_q_heads + q_heads
        tl.store(ws_o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], o, mask=hd_mask)
        tl.store(ws_lse_ptr + row, lse, mask=h_mask)


@triton.jit(do_not_specialize=["max_splits", "min_split_tokens", "balance_programs"])
def _merge_splits_kernel(
    ws_o_ptr, ws_lse_ptr, ws_plan_ptr, seq_lens_ptr, out_ptr,
    max_splits, min_split_tokens, num_q_heads, block_size, balance_programs,
    stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_DM: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_LOOP: tl.constexpr,
    MERGE: tl.constexpr, EVEN_SPLITS: tl.constexpr = False, BALANCE: tl.constexpr = False,
):  # fmt: skip
    seq = tl.program_id(0)
    head = tl.program_id(1)
    d_chunk = tl.program_id(2)
    balanced = False
    if BALANCE:
        balanced = balance_programs > 0
    if balanced:
        # stage 1 wrote the sequence's (first workspace row, splits); balance_programs 0 (batch 1): the plan without
        # balance, as stage 1 took it
        ws_first = tl.load(ws_plan_ptr + 2 * seq)
        n_splits = tl.load(ws_plan_ptr + 2 * seq + 1)
    else:
        seq_len = tl.load(seq_lens_ptr + seq)
        _, n_splits = _split_range(seq_len, _num_tiles(seq_len, block_size, BLOCK_N, PAGE_LOOP), max_splits,
                                   min_split_tokens, EVEN_SPLITS)
        ws_first = seq * max_splits
    if n_splits <= 1:
        return  # stage 1 wrote the output (or zeros for an empty slot)

    offs_s = tl.arange(0, MERGE)
    offs_d = d_chunk * BLOCK_DM + tl.arange(0, BLOCK_DM)
    d_mask = offs_d < HEAD_DIM
    m = tl.full([1], float("-inf"), dtype=tl.float32)
    l_sum = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([BLOCK_DM], dtype=tl.float32)
    for first in range(0, n_splits, MERGE):
        s_mask = first + offs_s < n_splits
        row = (ws_first + first + offs_s) * num_q_heads + head
        lse = tl.load(ws_lse_ptr + row, mask=s_mask, other=float("-inf"))
        o = tl.load(ws_o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], mask=s_mask[:, None] & d_mask[None, :],
                    other=0.0)
        m_new = tl.maximum(m, tl.max(lse, axis=0))
        alpha = tl.exp2(m - m_new)
        w = tl.exp2(lse - m_new)
        l_sum = l_sum * alpha + tl.sum(w, axis=0)
        acc = acc * alpha + tl.sum(w[:, None] * o, axis=0)
        m = m_new
    out = acc / l_sum
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty), mask=d_mask)


# None: PTX code conversions on CUDA (not under the interpreter), portable Triton ops elsewhere.
# Tests set it to False to run the portable path on a CUDA GPU.
PTX_CONVERSIONS = None


def _use_ptx(device: torch.device) -> bool:
    if PTX_CONVERSIONS is not None:
        return bool(PTX_CONVERSIONS)
    # an emulated DCU (VLLM_DCU_EMULATE_ARCH) takes the portable conversions, as the DCU does
    return device.type == "cuda" and torch.version.hip is None and not launch_params.current_target(device).startswith(
        ("interpreter", "gfx"))


def split_kernel_launch(launch: dict, block_size: int, kv_quant: int, v_by_dim: bool = False) -> tuple[dict, dict]:
    """A kv16 / kv8 launch entry as _decode_split_kernel takes it: (constexprs, Triton options). Shared by the
    launcher and compile_check, so both compile the same kernel. split_round is the host's split plan (_plan);
    page_loop needs pages of at least BLOCK_N tokens; int8_qk and the kv8 entry's own "int8" options apply to int8
    caches only (kv_quant 2: the kv8 entry also serves fp8 caches). v_by_dim: V's tokens are contiguous (an int8
    cache's pages, kv_quant.layout.V_BY_DIM), so an int8 cache takes the int8 x int8 P x V path (INT8_PV). balance
    compiles the balanced plan in; the launch turns it on where the batch has more than one sequence and splits are
    not forced (balance_programs > 0), and there it spreads tiles as even_splits does whatever even_splits says."""
    options = {k: v for k, v in launch.items() if k != "int8"}
    if kv_quant == 2:
        options.update(launch.get("int8", {}))
    defaults = launch_params.LAUNCH_DEFAULTS
    balance = bool(options.pop("balance", defaults["balance"]))
    for host_only in ("split_round", "programs_per_cu", "min_split_tokens", "gluon"):
        options.pop(host_only, None)
    block_n = options.pop("BLOCK_N")
    early_convert = options.pop("early_convert", defaults["early_convert"])
    consts = dict(BLOCK_N=block_n, PAGE_GE_TILE=block_size >= block_n,
                  PAGE_LOOP=bool(options.pop("page_loop", defaults["page_loop"])) and block_size >= block_n,
                  K_PURE=early_convert < 2, V_PURE=early_convert < 1,
                  INT8_QK=bool(options.pop("int8_qk", defaults["int8_qk"])) and kv_quant == 2,
                  INT8_PV=kv_quant == 2 and v_by_dim, V_CONTIG=kv_quant != 0 and v_by_dim,
                  Q_EARLY=bool(options.pop("q_early", defaults["q_early"])) and kv_quant != 0,
                  EVEN_SPLITS=bool(options.pop("even_splits", defaults["even_splits"])),
                  BALANCE=balance, BATCH_CHUNK=_BATCH_CHUNK)
    return consts, options


class _Plan(NamedTuple):
    launch: dict  # the width's launch entry (split_kernel_launch's input)
    splits: int  # grid z and workspace rows per sequence; balance: the kernel's cap on one sequence's splits
    min_split: int
    programs: int  # balance: programs per kv head the batch's sequences share (grid x: programs + batch); else 0

    def rows(self, batch: int) -> int:
        """Workspace rows (splits) per kv head."""
        return self.programs + batch if self.programs else batch * self.splits

    def plan_ints(self, batch: int) -> int:
        """int32 workspace elements stage 1 hands stage 2 (balance: each sequence's first row and split count), padded
        to 16 bytes so the partial outputs after them stay 16-byte aligned at every batch size (Triton specializes on
        a pointer's alignment: an odd batch would otherwise compile another kernel mid-run)."""
        return -(-2 * batch // 4) * 4 if self.programs else 0

    def numel(self, batch: int, num_q_heads: int, head_dim: int) -> int:
        """float32 workspace elements: the plan's ints, then each row's partial output and log-sum-exp."""
        return self.plan_ints(batch) + self.rows(batch) * num_q_heads * (head_dim + 1)


def _plan(batch, num_q_heads, num_kv_heads, head_dim, device, num_splits, kv8, gluon=False) -> _Plan:
    """The launch and split plan; gluon: for the Gluon stage 1, the kv8 entry's ``gluon`` launch over its own."""
    target = launch_params.current_target(device)
    entry = launch_params.get_params(target)
    launch = dict(entry["kv8" if kv8 else "kv16"])
    if gluon:
        launch.update(launch.pop("gluon"))
        launch.pop("int8", None)
    round_down = launch.get("split_round", launch_params.LAUNCH_DEFAULTS["split_round"]) == "down"
    programs = 0
    if num_splits is None:
        per_cu = {"programs_per_cu": launch.pop("programs_per_cu", entry["programs_per_cu"])}  # this width's own
        splits = launch_params.num_splits(batch, num_kv_heads, num_compute_units(device), {**entry, **per_cu},
                                          round_down)
        min_split = launch.pop("min_split_tokens", entry["min_split_tokens"])  # this width's own, if it sets one
        if batch > 1 and launch.get("balance", launch_params.LAUNCH_DEFAULTS["balance"]):
            # the programs the plan without balance launches for this batch, shared out by length (the same plan
            # where every sequence is as long); one sequence has nothing to share, so it keeps that plan (in the
            # same compiled kernel: programs 0)
            programs, splits = batch * splits, entry["max_splits"]
    else:
        splits, min_split = int(num_splits), 1  # exactly min(num_splits, tiles) splits per sequence
    lds = entry["lds_limit"]
    for tiles in (launch, {**launch, **launch.get("int8", {})}) if lds is not None else ():
        need = launch_params.lds_bytes(tiles["BLOCK_N"], triton.next_power_of_2(head_dim), tiles["num_stages"])
        if need > lds:
            raise ValueError(
                f"decode-attention params for {target}: BLOCK_N={tiles['BLOCK_N']} num_stages={tiles['num_stages']} "
                f"need ~{need} B of LDS at head_dim {head_dim}, limit {lds} B; lower BLOCK_N or num_stages"
            )
    return _Plan(launch, splits, min_split, programs)


def workspace_numel(batch: int, num_q_heads: int, num_kv_heads: int, head_dim: int, device, kv8: bool = False,
                    num_splits: int | None = None) -> int:
    """float32 elements of workspace ``decode_attention`` needs for a batch of this size (for
    preallocating one buffer for the largest batch a CUDA graph captures)."""
    device = torch.device(device)
    plans = [_plan(batch, num_q_heads, num_kv_heads, head_dim, device, num_splits, kv8)]
    if kv8 and launch_params.get_params(launch_params.current_target(device))["kv8"].get("gluon"):
        plans.append(_plan(batch, num_q_heads, num_kv_heads, head_dim, device, num_splits, kv8, gluon=True))
    return max(plan.numel(batch, num_q_heads, head_dim) for plan in plans)  # 8-bit calls may take the Gluon plan


def _takes_gluon(device, kv_quant, ptx, v_by_dim, v_dim_stride, head_dim, group, block_size) -> bool:
    """Launch key gluon (kv8): an 8-bit call runs gluon_stage1's kernel, with the entry's ``gluon`` launch, where
    that kernel covers it (gluon_stage1.gluon_supported: CUDA PTX conversions, the kind's own V layout, pages of at
    least its BLOCK_N, ...); every other call takes the Triton kernel."""
    if kv_quant is None or not ptx:
        return False
    launch = launch_params.get_params(launch_params.current_target(device))["kv8"].get("gluon")
    if not launch:
        return False
    from .gluon_stage1 import gluon_supported

    return gluon_supported(_KV_QUANT[kv_quant], ptx, v_by_dim, head_dim, group, block_size, launch["BLOCK_N"],
                           launch["num_stages"], v_dim_stride)


def _launch_decision(q, k_cache, v_cache, kv_quant, num_splits):
    """(the split plan, whether the Gluon stage 1 takes the call, V by dim, PTX code conversions) for these tensors."""
    batch, hq, d = q.shape
    _, block_size, hkv, _ = k_cache.shape
    ptx = kv_quant is not None and _use_ptx(q.device)
    v_by_dim = v_cache.stride(1) == 1
    gluon = _takes_gluon(q.device, kv_quant, ptx, v_by_dim, v_cache.stride(3), d, hq // hkv, block_size)
    return _plan(batch, hq, hkv, d, q.device, num_splits, kv_quant is not None, gluon), gluon, v_by_dim, ptx


def launch_plan(q, k_cache, v_cache, kv_quant, num_splits=None) -> tuple[_Plan, bool]:
    """(the split plan, whether the Gluon stage 1 takes the call), as decode_attention decides them for these
    tensors (the bench's table labels its rows with them)."""
    return _launch_decision(q, k_cache, v_cache, kv_quant, num_splits)[:2]


def _fail(msg: str):
    raise ValueError(f"decode_attention: {msg}")


def _check_inputs(q, k_cache, v_cache, block_table, seq_lens, out, k_scales, v_scales, kv_quant):
    check_q_and_cache(_fail, q, k_cache, v_cache, out, k_scales, v_scales, kv_quant, _BLOCK_H, q_rows="batch",
                      v_any_dim_stride=True)
    batch = q.shape[0]
    if seq_lens.dim() != 1 or seq_lens.shape[0] != batch or seq_lens.dtype != torch.int32:
        _fail(f"seq_lens must be int32 [{batch}], got {tuple(seq_lens.shape)} {seq_lens.dtype}")
    check_block_table(_fail, block_table, batch)
    check_one_device(_fail, q, k_cache, v_cache, block_table, seq_lens, out)


def decode_attention(q, k_cache, v_cache, block_table, seq_lens, scale, out, *, k_scales=None, v_scales=None,
                     kv_quant=None, software_fp8=None, workspace=None, num_splits=None):
    """Paged decode attention, one query token per sequence; writes ``out`` and returns it.

    q, out: [batch, q_heads, head_dim] fp16/bf16. k_cache, v_cache: [num_blocks, block_size,
    kv_heads, head_dim], q's dtype, or uint8 codes with kv_quant "fp8" / "int8" and float32
    k_scales, v_scales [num_blocks, block_size, kv_heads] (any strides). K is contiguous in head_dim; V may have any
    head_dim stride: an int8 cache's V by dim (tokens contiguous, as kv_quant.layout.split_kv_cache makes it) takes
    the int8 x int8 P x V path; every other layout the fp16 path (fp8 V by dim: 1.05-1.09x its by-token time on the
    H200, bench --v-layouts token,dim). block_table: int32
    [>= batch, max_blocks]; seq_lens: int32 [batch] (0 = padded slot, output zeros).
    software_fp8: decode fp8 with integer ops (None: kernels.fp8_e4m3.use_software_fp8()).
    workspace: float32 1-D buffer of at least ``workspace_numel(...)`` elements (preallocated for
    CUDA graphs); None allocates one. num_splits: force up to this many splits per sequence
    (default: from the batch size and the number of compute units).
    """
    _check_inputs(q, k_cache, v_cache, block_table, seq_lens, out, k_scales, v_scales, kv_quant)
    batch, hq, d = q.shape
    _, block_size, hkv, _ = k_cache.shape
    if num_splits is not None and (not isinstance(num_splits, int) or not 1 <= num_splits <= 65535):
        _fail(f"num_splits must be an int in [1, 65535] (the grid's z limit), got {num_splits!r}")
    plan, gluon, v_by_dim, ptx = _launch_decision(q, k_cache, v_cache, kv_quant, num_splits)
    rows = plan.rows(batch) * hq
    need = plan.numel(batch, hq, d)
    if workspace is None:
        workspace = torch.empty(need, dtype=torch.float32, device=q.device)
    elif workspace.dtype != torch.float32 or workspace.dim() != 1 or workspace.numel() < need:
        _fail(f"workspace must be float32 1-D with >= {need} elements, got {tuple(workspace.shape)} {workspace.dtype}")
    if batch == 0:
        return out
    n_plan = plan.plan_ints(batch)
    ws_plan = workspace[:n_plan].view(torch.int32) if n_plan else seq_lens  # seq_lens: unused placeholder
    ws_o = workspace[n_plan : n_plan + rows * d]
    ws_lse = workspace[n_plan + rows * d : need]
    if kv_quant is None:
        k_scales = v_scales = seq_lens  # unused placeholders
        ks_strides = vs_strides = (0, 0, 0)
    else:
        ks_strides, vs_strides = k_scales.stride(), v_scales.stride()
    if software_fp8 is None:
        software_fp8 = kv_quant == "fp8" and use_software_fp8()
    block_d = triton.next_power_of_2(d)
    consts, options = split_kernel_launch(plan.launch, block_size, _KV_QUANT[kv_quant], v_by_dim=v_by_dim)
    splits, min_split, programs = plan.splits, plan.min_split, plan.programs
    grid = (programs + batch, hkv, 1) if programs else (batch, hkv, splits)
    args = (
        q, k_cache, v_cache, k_scales, v_scales, block_table, seq_lens,
        out, ws_o, ws_lse, ws_plan,
        float(scale) * _LOG2E, splits, min_split, block_size, hq, batch, programs,
        q.stride(0), q.stride(1),
        *k_cache.stride()[:3], *v_cache.stride(), *ks_strides, *vs_strides,
        block_table.stride(0), out.stride(0), out.stride(1),
    )  # fmt: skip
    if gluon:
        from .gluon_stage1 import launch_gluon_stage1

        consts["PAGE_LOOP"] = False  # stage 2 recounts the tiles as the Gluon stage 1 walks them
        launch_gluon_stage1(grid, args, group=hq // hkv, head_dim=d, block_n=consts["BLOCK_N"],
                            num_stages=options["num_stages"], num_warps=options["num_warps"],
                            kv_quant=_KV_QUANT[kv_quant], fp8_software=bool(software_fp8),
                            even_splits=consts["EVEN_SPLITS"], balance=consts["BALANCE"], batch_chunk=_BATCH_CHUNK)
    else:
        _decode_split_kernel[grid](
            *args, GROUP=hq // hkv, HEAD_DIM=d, BLOCK_D=block_d, BLOCK_H=_BLOCK_H, KV_QUANT=_KV_QUANT[kv_quant],
            FP8_SOFTWARE=bool(software_fp8), PTX=ptx, **consts, **options,
        )  # fmt: skip
    if splits > 1:  # some sequence may have more than one split
        block_dm = min(_MERGE_DIM, block_d)
        _merge_splits_kernel[(batch, hq, triton.cdiv(d, block_dm))](
            ws_o, ws_lse, ws_plan, seq_lens, out, splits, min_split, hq, block_size, programs, out.stride(0),
            out.stride(1), HEAD_DIM=d, BLOCK_DM=block_dm, BLOCK_N=consts["BLOCK_N"], PAGE_LOOP=consts["PAGE_LOOP"],
            MERGE=_MERGE_SPLITS, EVEN_SPLITS=consts["EVEN_SPLITS"], BALANCE=consts["BALANCE"], num_warps=4,
        )  # fmt: skip
    return out
