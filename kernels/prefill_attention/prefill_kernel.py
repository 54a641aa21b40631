"""The Triton kernel bodies of the paged prefill attention (prefill_attention.py launches them).

One program per (query tile, kv head). A query tile packs BLOCK_Q consecutive tokens of one sequence x
the GROUP query heads that share a kv head (Qwen3.5-27B: 6), row r = token r // GROUP, head r % GROUP, so
BLOCK_M = BLOCK_Q * GROUP rows (rounded up to a power of two) read each K/V tile once. A chunk of
``query_len`` tokens that follows ``context_len`` cached tokens is the keys' range
``[0, context_len + query_len)``; for a tile whose first query token is t0:

* keys ``< context_len + t0`` are visible to every row: stage 1 walks them in full BLOCK_N tiles with no
  mask at all (the block table is read once per tile: one or two pages);
* the rest, up to the tile's last query token, is the causal diagonal: stage 2, with the causal mask.

Loads are never masked: a key index past the sequence re-reads its last token (finite memory), and its score
is masked. Online softmax in base 2 with the scale folded in; the accumulator is kept normalized (each step
rescales it by l_old / l_new and adds P / l_new times V), so it is a convex combination of V rows and cannot
overflow for any finite V, and scores that overflow float32 saturate. One gap: where single products or
partial sums of q . k overflow with both signs (|q| x |k| beyond ~1e38 per channel), the matrix product itself
can return inf - inf = NaN, depending on how the hardware splits the sum; no saturation after the dot reaches it.
Tiles are launched heaviest first (the last query tiles of each sequence see the most keys), which
shortens the tail of a launch.

Grid: ``(num_tokens // BLOCK_Q + num_seqs, kv_heads)``; a program finds its sequence by binary search over
``cu_seqlens_q`` (no host sync, so the launch needs only host-known sizes). Programs past the last tile
return at once.
The 8-bit codes' conversions and scale arithmetic are the decode kernel's (decode_attention/codes.py); tiles that cross
pages find their rows as the decode kernel's do (decode_attention/splits.kv_rows).
"""
import triton
import triton.language as tl

from ..decode_attention.codes import (KV8_OUT_FACTOR, KV8_PV_OUT_FACTOR, L_SHIFT, code_unit, codes_to_f16, p_int8_pair,
                                      q_for_codes, q_int8_pair, v_scale_log2)
from ..decode_attention.splits import kv_rows
from .mirror import MIRROR_PAGE_C


@triton.jit
def _find_seq(cu_q_ptr, num_seqs, q_block, BLOCK_Q: tl.constexpr):
    """Largest s < num_seqs with cu_q[s] // BLOCK_Q + s <= q_block: the sequence whose tiles hold global tile
    q_block (tiles past the last sequence's map to it and find no query token there)."""
    lo = 0
    hi = num_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        start = tl.load(cu_q_ptr + mid) // BLOCK_Q + mid
        if start <= q_block:
            lo = mid
        else:
            hi = mid - 1
    return lo


@triton.jit
def _attend_tile(
    tile, q, m_i, l_i, acc, q_pos,
    k_ptr, v_ptr, ks_ptr, vs_ptr, bt_row, kv_head, last, last_page, block_size, s_mult,
    stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_vd,
    stride_ksb, stride_kst, stride_ksh, stride_vsb, stride_vst, stride_vsh,
    offs_n, offs_d,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_GE_TILE: tl.constexpr,
    CAUSAL: tl.constexpr, KV_QUANT: tl.constexpr, FP8_SOFTWARE: tl.constexpr, PTX: tl.constexpr,
    MIRROR: tl.constexpr,
):  # fmt: skip
    """One BLOCK_N tile of keys for all rows: online-softmax update of (m_i, l_i, acc). MIRROR: the tiles come
    from the mirror of an 8-bit cache (K as exact codes in q's dtype + scales, V as bf16 values) and go to the
    matrix unit as loaded. K is contiguous in head_dim; V is read through its head_dim stride stride_vd (1 by token;
    an int8 cache holds V by dim, tokens contiguous)."""
    if MIRROR:
        # mirror pages hold MIRROR_PAGE_C tokens, a multiple of BLOCK_N: a tile is one run of one page (one scalar
        # page number, contiguous slots), and the mirror kernel zero-fills each page past its sequence's end, so the
        # keys past ``last`` are read where they lie (finite) and masked by their scores
        start = tile * BLOCK_N
        phys = tl.load(bt_row + start // MIRROR_PAGE_C).to(tl.int64)
        slot = start % MIRROR_PAGE_C + offs_n
    else:
        phys, slot = kv_rows(tile, bt_row, last, block_size, offs_n, last_page, BLOCK_N, PAGE_GE_TILE)
    if HEAD_DIM == BLOCK_D:
        d_mask = None
        d_other = None
    else:
        d_mask = offs_d[:, None] < HEAD_DIM
        d_other = 0
    # K as [BLOCK_D, BLOCK_N] (head_dim contiguous down the columns): the dot's B operand as is
    k_off = phys * stride_kb + slot * stride_kt + kv_head * stride_kh
    k = tl.load(k_ptr + k_off[None, :] + offs_d[:, None], mask=d_mask, other=d_other)
    if KV_QUANT != 0:
        if not MIRROR:
            k = codes_to_f16(k, KV_QUANT, FP8_SOFTWARE, PTX)
        k_scale = tl.load(ks_ptr + phys * stride_ksb + slot * stride_kst + kv_head * stride_ksh)
        s = tl.dot(q, k) * (k_scale * s_mult)[None, :]
    else:
        s = tl.dot(q, k) * s_mult
    # finite inputs whose products overflow float32 saturate instead of turning into inf - inf = NaN
    s = tl.minimum(tl.maximum(s, -3.0e38), 3.0e38)
    if CAUSAL:
        k_pos = tile * BLOCK_N + offs_n
        s = tl.where(k_pos[None, :] <= q_pos[:, None], s, float("-inf"))

    v_off = phys * stride_vb + slot * stride_vt + kv_head * stride_vh
    d_mask_v = None if HEAD_DIM == BLOCK_D else offs_d[None, :] < HEAD_DIM
    v = tl.load(v_ptr + v_off[:, None] + offs_d[None, :] * stride_vd, mask=d_mask_v, other=d_other)
    if KV_QUANT != 0 and not MIRROR:
        # the decode kernel's scheme: the running max is over t = score + log2(V factor), so P' = exp2(t - m) <= 1 in
        # fp16 for V of any magnitude; acc sums P' x codes (bounded by the key count), l sums exp2(score - m + 32)
        v_scale = tl.load(vs_ptr + phys * stride_vsb + slot * stride_vst + kv_head * stride_vsh)
        t = s + v_scale_log2(v_scale, KV_QUANT)[None, :]
        m_new = tl.maximum(m_i, tl.max(t, axis=1))
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(tl.exp2(s - m_new[:, None] + L_SHIFT), axis=1)
        v = codes_to_f16(v, KV_QUANT, FP8_SOFTWARE, PTX)
        acc = tl.dot(tl.exp2(t - m_new[:, None]).to(tl.float16), v, acc * alpha[:, None])
    else:  # 16-bit V values (a bf16/fp16 cache, or the mirror's)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_new = l_i * alpha + tl.sum(p, axis=1)
        # acc stays normalized (a convex combination of V rows), so it cannot overflow for any finite V
        r = 1.0 / l_new
        acc = acc * (alpha * l_i * r)[:, None]
        acc = tl.dot((p * r[:, None]).to(v.dtype), v, acc)
        l_i = l_new
    return m_new, l_i, acc


@triton.jit
def _attend_window_int8_pv(
    q, q_lo, m_i, l_i, acc, q_pos, k_ptr, v_ptr, ks_ptr, vs_ptr, phys, slots, key_ok, kv_head, s_mult,
    stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_vd,
    stride_ksb, stride_kst, stride_ksh, stride_vsb, stride_vst, stride_vsh,
    first, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PTX: tl.constexpr,
):  # fmt: skip
    """INT8_PV (an int8 cache holding V by dim, the direct path): one window of BLOCK_N contiguous slots of one page
    (phys) for all rows, keys at positions first + slots; key_ok drops the window's slots another window covers.
    The decode kernel's int8 products, each pair summed in int32: S from q's int8 pair (q, q_lo; s_mult its per-row
    factor) and K's raw codes (256 hi + lo: |sum| <= 127 x 127 x 257 x head_dim, < 2^31 for head_dim <= 512), and
    P' as an int8 pair with V's raw codes (254 hi + lo: < 2^31 for BLOCK_N <= 512), so neither tile is converted and
    V's goes to the matrix unit tokens contiguous (the reduction axis). Scores, V factor and l as _attend_tile's
    8-bit branch; acc is in units of 127 P' x code (KV8_PV_OUT_FACTOR)."""
    if HEAD_DIM == BLOCK_D:
        d_mask = None
        d_other = None
    else:
        d_mask = offs_d[:, None] < HEAD_DIM
        d_other = 0
    k = tl.load(k_ptr + (phys * stride_kb + slots * stride_kt + kv_head * stride_kh)[None, :] + offs_d[:, None],
                mask=d_mask, other=d_other)
    k8 = k.to(tl.int8, bitcast=True)
    k_scale = tl.load(ks_ptr + phys * stride_ksb + slots * stride_kst + kv_head * stride_ksh)
    s = tl.dot(q_lo, k8, tl.dot(q, k8, out_dtype=tl.int32) * 256, out_dtype=tl.int32).to(tl.float32)
    s = s * s_mult[:, None] * k_scale[None, :]
    s = tl.minimum(tl.maximum(s, -3.0e38), 3.0e38)
    k_pos = first + slots
    s = tl.where(key_ok[None, :] & (k_pos[None, :] <= q_pos[:, None]), s, float("-inf"))
    v_scale = tl.load(vs_ptr + phys * stride_vsb + slots * stride_vst + kv_head * stride_vsh)
    t = s + v_scale_log2(v_scale, 2)[None, :]
    m_new = tl.maximum(m_i, tl.max(t, axis=1))
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(tl.exp2(s - m_new[:, None] + L_SHIFT), axis=1)
    d_mask_v = None if HEAD_DIM == BLOCK_D else offs_d[None, :] < HEAD_DIM
    v = tl.load(v_ptr + (phys * stride_vb + slots * stride_vt + kv_head * stride_vh)[:, None]
                + offs_d[None, :] * stride_vd, mask=d_mask_v, other=d_other)
    v8 = v.to(tl.int8, bitcast=True)
    p_hi, p_lo = p_int8_pair(tl.exp2(t - m_new[:, None]))
    pv = tl.dot(p_lo, v8, tl.dot(p_hi, v8, out_dtype=tl.int32) * 254, out_dtype=tl.int32)
    acc = acc * alpha[:, None] + pv.to(tl.float32) * (1.0 / 254.0)
    return m_new, l_i, acc


# Sizes that change from launch to launch are not specialized on: one compiled kernel per cache layout and
# dtype serves every batch, so warmup() at startup compiles everything a request can meet.
@triton.jit(do_not_specialize=["num_seqs", "total_q_blocks", "block_size", "stride_btb"])
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, out_ptr, cu_q_ptr, seq_lens_ptr, block_table_ptr, sel_ptr,
    s_mult_base, num_seqs, total_q_blocks, block_size,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_vd,
    stride_ksb, stride_kst, stride_ksh, stride_vsb, stride_vst, stride_vsh,
    stride_btb,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_GE_TILE: tl.constexpr,
    KV_QUANT: tl.constexpr, FP8_SOFTWARE: tl.constexpr, PTX: tl.constexpr, SEQ_FILTER: tl.constexpr,
    MIRROR: tl.constexpr, INT8_PV: tl.constexpr = False,
):  # fmt: skip
    q_block = total_q_blocks - 1 - tl.program_id(0)  # heaviest tiles first
    kv_head = tl.program_id(1)
    seq = _find_seq(cu_q_ptr, num_seqs, q_block, BLOCK_Q)
    if SEQ_FILTER != 0:  # 1: only sequences marked in sel (read from the mirror), 2: only the others
        marked = tl.load(sel_ptr + seq) != 0
        if marked != (SEQ_FILTER == 1):
            return
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    t0 = (q_block - (q_start // BLOCK_Q + seq)) * BLOCK_Q  # first query token of the tile, in the chunk
    if t0 >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    tok = t0 + offs_m // GROUP
    row_ok = (offs_m < BLOCK_Q * GROUP) & (tok < q_len)
    head = kv_head * GROUP + offs_m % GROUP
    q_pos = context_len + tok  # position of each row's token in its sequence
    q_offs = (q_start + tok).to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :]
    if HEAD_DIM == BLOCK_D:
        qo_mask = row_ok[:, None]
    else:
        qo_mask = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + q_offs, mask=qo_mask, other=0.0)
    q_lo = q
    if INT8_PV:  # int8 x int8 products with K's raw codes: q as a per-row int8 pair (the decode kernel's int8_qk)
        q, q_lo, sq = q_int8_pair(q)
        s_mult = sq * (s_mult_base * 0.00390625)
    elif KV_QUANT != 0 and not MIRROR:  # the direct path: q rescaled into fp16 for the fp16 codes
        q, s_factor = q_for_codes(q, KV_QUANT)
        s_mult = s_mult_base * s_factor
    elif KV_QUANT != 0:  # the mirror's K codes are in q's dtype: q goes to the matrix unit as loaded
        s_mult = s_mult_base * code_unit(KV_QUANT)
    else:
        s_mult = s_mult_base

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    bt_row = block_table_ptr + seq.to(tl.int64) * stride_btb
    last = seq_len - 1
    last_page = last // block_size
    if INT8_PV:
        # windows of BLOCK_N contiguous slots of one page (the decode kernel's page loop): a page's last window
        # starts at block_size - BLOCK_N and keeps only the slots the others did not cover, so V's tiles are
        # contiguous runs of tokens (block_size, a multiple of 16, need not be one of BLOCK_N); every window masks
        # causally (keys past the sequence's end are past every row's position)
        n_keys = context_len + tl.minimum(t0 + BLOCK_Q, q_len)
        for page in range(0, tl.cdiv(n_keys, block_size)):
            phys = tl.load(bt_row + page).to(tl.int64)
            first = page * block_size
            for j in range(0, tl.minimum(tl.cdiv(block_size, BLOCK_N), tl.cdiv(n_keys - first, BLOCK_N))):
                start = j * BLOCK_N
                # a multiple of 16 (block_size is one: takes_int8_products), which block_size's unspecialized value
                # does not tell the compiler: with it V's token runs load 16 bytes a lane instead of byte by byte
                slots = tl.multiple_of(tl.minimum(start, block_size - BLOCK_N), 16) + offs_n
                m_i, l_i, acc = _attend_window_int8_pv(
                    q, q_lo, m_i, l_i, acc, q_pos, k_ptr, v_ptr, ks_ptr, vs_ptr, phys, slots, slots >= start, kv_head,
                    s_mult, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_vd,
                    stride_ksb, stride_kst, stride_ksh, stride_vsb, stride_vst, stride_vsh,
                    first, offs_d, HEAD_DIM, BLOCK_D, PTX,
                )  # fmt: skip
    else:
        # stage 1: keys every row sees (before the tile's first query token), full tiles, no masks
        n_full = (context_len + t0) // BLOCK_N
        for tile in range(0, n_full):
            m_i, l_i, acc = _attend_tile(
                tile, q, m_i, l_i, acc, q_pos,
                k_ptr, v_ptr, ks_ptr, vs_ptr, bt_row, kv_head, last, last_page, block_size, s_mult,
                stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_vd,
                stride_ksb, stride_kst, stride_ksh, stride_vsb, stride_vst, stride_vsh,
                offs_n, offs_d, HEAD_DIM, BLOCK_D, BLOCK_N, PAGE_GE_TILE, False, KV_QUANT, FP8_SOFTWARE, PTX, MIRROR,
            )  # fmt: skip
        # stage 2: the causal diagonal, up to the tile's last query token
        t_last = tl.minimum(t0 + BLOCK_Q, q_len) - 1
        n_all = tl.cdiv(context_len + t_last + 1, BLOCK_N)
        for tile in range(n_full, n_all):
            m_i, l_i, acc = _attend_tile(
                tile, q, m_i, l_i, acc, q_pos,
                k_ptr, v_ptr, ks_ptr, vs_ptr, bt_row, kv_head, last, last_page, block_size, s_mult,
                stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_vd,
                stride_ksb, stride_kst, stride_ksh, stride_vsb, stride_vst, stride_vsh,
                offs_n, offs_d, HEAD_DIM, BLOCK_D, BLOCK_N, PAGE_GE_TILE, True, KV_QUANT, FP8_SOFTWARE, PTX, MIRROR,
            )  # fmt: skip
    if INT8_PV:
        o = acc / l_i[:, None] * KV8_PV_OUT_FACTOR  # acc in units of 127 P' x int8 code (one factor: see decode)
    elif KV_QUANT != 0 and not MIRROR:
        o = acc / l_i[:, None] * KV8_OUT_FACTOR  # acc: values x 2^-8 (v_scale_log2), l: sum x 2^32
    else:
        o = acc
    o_offs = (q_start + tok).to(tl.int64)[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
    tl.store(out_ptr + o_offs, o.to(out_ptr.dtype.element_ty), mask=qo_mask)
