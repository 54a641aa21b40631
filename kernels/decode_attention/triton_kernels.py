"""The Triton kernel bodies of the split-KV (flash-decoding) paged decode: stage 1 (_decode_split_kernel, one
program per split) and stage 2 (_merge_splits_kernel), launched by decode_attention.py as planning.py decides.

Stage 1: one program per (sequence, kv head, split). The q heads of the GQA group (6 for
Qwen3.5) are packed into one 16-row tile, so K and V are read once per kv head and both products
are ``tl.dot``. Each split walks its tokens in tiles of BLOCK_N; the physical page of every token
is looked up in the block table, so a tile may straddle pages and the block size only has to be a
multiple of 16 (784, 1552, ... work). A split writes its normalized partial output and its
log-sum-exp to the workspace; a sequence that ends up with a single split writes the final output
directly.
Stage 2: one program per (sequence, q head, 64 columns of head_dim) merges the splits by
log-sum-exp; at batch 1 that is 96 short programs instead of 24 long ones.
The split plan both stages walk is splits.py; the 8-bit codes' conversions and scale arithmetic are codes.py.

int8 caches, launch key int8_qk (on in sm90's entry: 0.95x the fp16 path's time on the H200): QK^T without
converting K. q becomes a per-row int8 pair, q = sq (hi + lo / 256) (q_int8_pair: within max|q of the row| /
32512 of q), two int8 x int8 dots with K's raw codes accumulate exactly in int32, and S = (hi.K + lo.K / 256) x sq
x K scale x softmax scale. V goes as before. For GPUs with int8 matrix units and no fp8 (the DCU: int8 MFMA);
compiled for gfx90a it takes 181 VGPRs against 226 (compile_check).
int8 caches hold V by dim (kv_quant.layout.V_BY_DIM: a page's V codes are [kv heads, head_dim, block_size], tokens
contiguous), and with V read that way (host: V's token stride is 1) P x V is int8 x int8 too (INT8_PV): P' in [0, 1]
becomes an int8 pair, 127 P' = hi + lo / 254 (p_int8_pair: within 1 / 64516 of P'), and two int8 dots with V's raw
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
conversions differ between the two: the scale arithmetic (codes.py) is shared.
"""
import triton
import triton.language as tl

from .codes import (KV8_OUT_FACTOR, KV8_PV_OUT_FACTOR, L_SHIFT, codes_to_f16, p_int8_pair, q_for_codes, q_int8_pair,
                    v_scale_log2)
from .splits import balanced_split_of, kv_rows, num_tiles, split_range, split_tiles


@triton.jit
def _tile_update(q, q_lo, acc, m_i, l_i, k_rows, v_rows, ks_ptrs, vs_ptrs, offs_d, stride_vd, key_ok, s_mult, kv_mask,
                 kv_other, KV_QUANT: tl.constexpr, FP8_SOFTWARE: tl.constexpr, PTX: tl.constexpr, K_PURE: tl.constexpr,
                 V_PURE: tl.constexpr, INT8_QK: tl.constexpr, INT8_PV: tl.constexpr = False,
                 V_CONTIG: tl.constexpr = False):
    """One KV tile of the online softmax; returns (acc, m, l). k_rows / v_rows: a pointer per key to its row of
    head_dim values; key_ok: the keys that count (not past the sequence, not already done). INT8_QK: q is the
    int8 pair (q, q_lo) of q_int8_pair and s_mult its per-row factor; K's codes go to the dot unconverted.
    INT8_PV: P' as an int8 pair (p_int8_pair) with V's raw codes (V by dim), acc in units of 127 P' x code."""
    k = tl.load(k_rows[:, None] + offs_d[None, :], mask=kv_mask, other=kv_other)
    if INT8_QK:
        k8 = tl.trans(k.to(tl.int8, bitcast=True))
        s = tl.dot(q, k8, out_dtype=tl.int32).to(tl.float32) + \
            tl.dot(q_lo, k8, out_dtype=tl.int32).to(tl.float32) * 0.00390625
    else:
        if KV_QUANT != 0:
            k = codes_to_f16(k, KV_QUANT, FP8_SOFTWARE, PTX, K_PURE)
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
        t = s + v_scale_log2(v_scale, KV_QUANT)[None, :]
        m_new = tl.maximum(m_i, tl.max(t, axis=1))
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(tl.exp2(s - m_new[:, None] + L_SHIFT), axis=1)
        p = tl.exp2(t - m_new[:, None])
    else:
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(v_rows[:, None] + offs_d[None, :] * stride_vd, mask=kv_mask, other=kv_other)
    if INT8_PV:
        v8 = v.to(tl.int8, bitcast=True)
        p_hi, p_lo = p_int8_pair(p)
        pv = tl.dot(p_hi, v8, out_dtype=tl.int32).to(tl.float32) + \
            tl.dot(p_lo, v8, out_dtype=tl.int32).to(tl.float32) * (1.0 / 254.0)
        acc = acc * alpha[:, None] + pv
    else:
        if KV_QUANT != 0:
            # V_CONTIG: slots past the sequence hold whatever codes (P' = 0 there); the integer e4m3 decode makes every
            # code finite (hardware decode makes 0x7f NaN, and 0 x NaN is NaN); same values as the hardware path
            v = codes_to_f16(v, KV_QUANT, FP8_SOFTWARE or V_CONTIG, PTX, V_PURE)
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
    # sequence's share of the programs (balanced_split_of), its workspace rows from its place among them.
    # balance_programs 0 (batch 1): the plan without it, in the same compiled kernel
    balanced = False
    if BALANCE:
        balanced = balance_programs > 0
    n_splits_balanced = tl.zeros([], dtype=tl.int32)
    seq_len_balanced = tl.zeros([], dtype=tl.int32)
    if balanced:
        seq, split, n_splits_balanced, seq_len_balanced = balanced_split_of(
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
    n_tiles = num_tiles(seq_len, block_size, BLOCK_N, PAGE_LOOP)
    if balanced:
        n_splits = n_splits_balanced
        tiles_per_split = n_tiles // n_splits  # spread as even_splits spreads them (split_tiles below)
    else:
        tiles_per_split, n_splits = split_range(seq_len, n_tiles, max_splits, min_split_tokens, EVEN_SPLITS)

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
        tile_start, tile_end = split_tiles(split, tiles_per_split, n_splits, n_tiles, True)
    else:
        tile_start, tile_end = split_tiles(split, tiles_per_split, n_splits, n_tiles, EVEN_SPLITS)
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
        q, q_lo, sq = q_int8_pair(q)
        s_mult = sq * scale_log2
    elif KV_QUANT != 0:
        # 8-bit caches: fp16 products (every code is exact in fp16, see codes_to_f16), q scaled
        # by a power of two into fp16's range; the factors come back out of S in s_mult.
        q, s_factor = q_for_codes(q, KV_QUANT)
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
            phys, slot = kv_rows(tile, bt_row, last, block_size, offs_n, last_page, BLOCK_N, PAGE_GE_TILE)
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
            o = o * KV8_PV_OUT_FACTOR
        else:
            o = o * KV8_OUT_FACTOR  # acc: values x 2^-8 (v_scale_log2); l_i: the softmax's sum x 2^32
        lse = lse - L_SHIFT
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
        _, n_splits = split_range(seq_len, num_tiles(seq_len, block_size, BLOCK_N, PAGE_LOOP), max_splits,
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
