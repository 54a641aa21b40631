"""Paged causal attention for prefill chunks (and the rows of mixed batches) over a vLLM KV cache.

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

Quantized caches (kv_quant "fp8" / "int8", docs/kv-cache-layout.md): uint8 codes become fp16 exactly
(e4m3 value / 256, int8 value / 128; the decode kernel's conversions, PTX on CUDA) and both products run in
fp16. Q is multiplied by a power of two that puts max|q| of the tile at 2^12 (exact; undone in S). The K
scales multiply the columns of S. The V scales enter as the decode kernel's: log2 of each key's V factor is
added to its score for the running max, so P' = P x factor stays in [0, 1] in fp16 for any finite V; the 8-bit
accumulator is not normalized (it sums P' x codes, bounded by the key count) and l, with its own exponential,
divides it at the end (decode_attention.py's docstring has the ranges). Each 8-bit tile is converted once per
query tile (BLOCK_M rows share it); long chunks read a 16-bit mirror instead (below). K is contiguous in
head_dim; int8 caches hold V by dim (tokens contiguous, docs/kv-cache-layout.md), so the direct path and the mirror
kernel read V through its head_dim stride (1 by token, for which Triton specializes: those compile as before).
On an int8 cache with V by dim, query tiles of up to 32 rows on the direct path (the launch table's kv8_short, for
the decode rows and short chunks beside the mirror) take the decode kernel's int8 products instead (INT8_PV; pages
of at least BLOCK_N tokens): q as a per-row int8 pair with K's raw codes, P' as an int8 pair with V's raw codes,
both in int32, no conversion of K or V; keys in windows of BLOCK_N contiguous slots of one page (the decode
kernel's page loop), so V's tiles are runs of tokens. H200, a decode row after 16K-32K of history at 16 x 64:
1.07-1.08x bf16's time, against 2.37-2.41x before V by dim and 3.8-3.9x converting V by dim to fp16
(bench/results/2026-12-03-h200-int8-v-by-dim-engine-prefill-writer.md).

Grid: ``(num_tokens // BLOCK_Q + num_seqs, kv_heads)``; a program finds its sequence by binary search over
``cu_seqlens_q`` (no host sync, so the launch needs only host-known sizes). Programs past the last tile
return at once.
"""
import torch
import triton
import triton.language as tl

from ..decode_attention.decode_attention import (
    _KV8_OUT_FACTOR,
    _KV8_PV_OUT_FACTOR,
    _L_SHIFT,
    _code_unit,
    _codes_to_f16,
    _kv_rows,
    _p_int8_pair,
    _q_for_codes,
    _q_int8_pair,
    _use_ptx,
    _v_scale_log2,
)
from ..fp8_e4m3 import use_software_fp8
from ..paged_kv import check_block_table, check_one_device, check_q_and_cache
from . import launch_params

_LOG2E = 1.4426950408889634
_KV_QUANT = {None: 0, "fp8": 1, "int8": 2}
MAX_GROUP = 16  # query heads per kv head the launcher accepts


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
        # mirror pages hold _MIRROR_PAGE_C tokens, a multiple of BLOCK_N: a tile is one run of one page (one scalar
        # page number, contiguous slots), and the mirror kernel zero-fills each page past its sequence's end, so the
        # keys past ``last`` are read where they lie (finite) and masked by their scores
        start = tile * BLOCK_N
        phys = tl.load(bt_row + start // _MIRROR_PAGE_C).to(tl.int64)
        slot = start % _MIRROR_PAGE_C + offs_n
    else:
        phys, slot = _kv_rows(tile, bt_row, last, block_size, offs_n, last_page, BLOCK_N, PAGE_GE_TILE)
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
            k = _codes_to_f16(k, KV_QUANT, FP8_SOFTWARE, PTX)
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
        t = s + _v_scale_log2(v_scale, KV_QUANT)[None, :]
        m_new = tl.maximum(m_i, tl.max(t, axis=1))
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(tl.exp2(s - m_new[:, None] + _L_SHIFT), axis=1)
        v = _codes_to_f16(v, KV_QUANT, FP8_SOFTWARE, PTX)
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
    8-bit branch; acc is in units of 127 P' x code (_KV8_PV_OUT_FACTOR)."""
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
    t = s + _v_scale_log2(v_scale, 2)[None, :]
    m_new = tl.maximum(m_i, tl.max(t, axis=1))
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(tl.exp2(s - m_new[:, None] + _L_SHIFT), axis=1)
    d_mask_v = None if HEAD_DIM == BLOCK_D else offs_d[None, :] < HEAD_DIM
    v = tl.load(v_ptr + (phys * stride_vb + slots * stride_vt + kv_head * stride_vh)[:, None]
                + offs_d[None, :] * stride_vd, mask=d_mask_v, other=d_other)
    v8 = v.to(tl.int8, bitcast=True)
    p_hi, p_lo = _p_int8_pair(tl.exp2(t - m_new[:, None]))
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
        q, q_lo, sq = _q_int8_pair(q)
        s_mult = sq * (s_mult_base * 0.00390625)
    elif KV_QUANT != 0 and not MIRROR:  # the direct path: q rescaled into fp16 for the fp16 codes
        q, s_factor = _q_for_codes(q, KV_QUANT)
        s_mult = s_mult_base * s_factor
    elif KV_QUANT != 0:  # the mirror's K codes are in q's dtype: q goes to the matrix unit as loaded
        s_mult = s_mult_base * _code_unit(KV_QUANT)
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
                slots = tl.minimum(start, block_size - BLOCK_N) + offs_n
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
        o = acc / l_i[:, None] * _KV8_PV_OUT_FACTOR  # acc in units of 127 P' x int8 code (one factor: see decode)
    elif KV_QUANT != 0 and not MIRROR:
        o = acc / l_i[:, None] * _KV8_OUT_FACTOR  # acc: values x 2^-8 (_v_scale_log2), l: sum x 2^32
    else:
        o = acc
    o_offs = (q_start + tok).to(tl.int64)[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
    tl.store(out_ptr + o_offs, o.to(out_ptr.dtype.element_ty), mask=qo_mask)

# --- 8-bit caches: a 16-bit mirror for long chunks -------------------------------------------------------------
# A chunk of many query tokens converts each 8-bit K/V tile once per query tile when it reads the cache directly
# (on the H200 the converted tile also goes through shared memory again for the matrix unit). For chunks of at
# least MIRROR_MIN_QUERY tokens it is cheaper to convert the sequence once per launch into a scratch "mirror"
# (pages of MIRROR_PAGE tokens) and run the kernel over it with no conversion. K keeps its codes as their exact
# 16-bit values with the float32 scales beside them (the scales multiply S's columns: a K rounded to bf16 moved
# scores by up to 8.5% of a softmax weight at |K| ~3e4 on the H200); V is stored dequantized in bf16, one
# rounding as in a bf16 cache, so P x V is the bf16 path's (any finite V fits bf16's range). The extra traffic is
# one read of the 8-bit cache and one write + read of the mirror per launch, small against the attention's
# arithmetic. Decode rows, short chunks and sequences that do not fit the mirror read the 8-bit cache directly (a
# second launch).
#
# The mirror's layout. K's codes are stored in q's dtype (int8 / 128 has 7 significant bits, e4m3 / 256 has 4,
# down to 2^-17: exact in bf16 as in fp16), so q goes to the matrix unit as loaded and S = q.codes x (scale x code
# unit x softmax scale) per key, with every product q x code exact in float32. Key tiles are addressed as what they
# are in the mirror, one contiguous run of one page (MIRROR_PAGE is a multiple of every BLOCK_N): one page number
# per tile, no per-key clamp or page select; keys past a sequence's end read its last page's tail, which the
# mirror kernel fills with zeros (finite; their scores are masked). Range: a score's dot product |q| x |code| x
# head_dim stays in float32 for |q| < ~2^119 with bf16 q (fp16 q always; the direct path rescales q instead), and
# a q element whose product with a code falls under float32's normal range adds under ~1e-32 to a score.
# Why this form (H200, 4096-token chunk, history 0 / 4K / 16K; time as a multiple of the bf16 cache's, identical
# outputs): the first mirror kept fp16 codes and rescaled q into fp16 per query tile, as the direct path does
# (_q_for_codes), and took 1.58-1.63x. That q is computed, not loaded, so Triton kept the first dot's A operand in
# registers for the whole loop (the bf16 cache's q stays in shared memory) and ptxas serialized the wgmma pipeline
# (C7515, see compile_check). Codes in q's dtype alone: 1.39-1.42x, still serialized. With page-run addressing,
# which also drops the per-key address arithmetic (the K scales' addresses were a third copy of it, in the
# score's layout): 1.06-1.08x for int8, fp8 and software fp8, not serialized. Head-major scales on top: 1.12-1.15x.
MIRROR_MIN_QUERY = 64
MIRROR_PAGE = 256
MIRROR_ENV = "VLLM_DCU_PREFILL_KV8_MIRROR_TOKENS"
# one 32K sequence; 128 MiB for 4 kv heads x 256 (16-bit K and V + K scales). The engine passes its own size, one
# sequence of max_model_len and never below this (dcu/prefill_attention.py, engine_mirror_tokens)
MIRROR_DEFAULT_TOKENS = 32768
_MIRROR_BLOCK_S = 128
_MIRROR_BLOCK_T = 32
_BF16_MAX = tl.constexpr(3.3895313892515355e38)
_MIRROR_PAGE_C = tl.constexpr(MIRROR_PAGE)


@triton.jit(do_not_specialize=["num_seqs", "table_width", "min_query", "cap_pages", "stride_mtab"])
def _plan_mirror_kernel(cu_q_ptr, seq_lens_ptr, sel_ptr, mtab_ptr, owner_ptr, num_seqs, table_width, min_query,
                        cap_pages, stride_mtab, PAGE: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_W: tl.constexpr):
    """One program: mark the sequences that take the mirror (chunk >= min_query tokens, pages left; greedy in
    sequence order), write their mirror block-table rows (consecutive pages) and, per mirror page, its owner
    (sequence * 65536 + page index in the sequence, -1 for a free page)."""
    for p0 in range(0, cap_pages, BLOCK_W * 4):
        pg = p0 + tl.arange(0, BLOCK_W * 4)
        tl.store(owner_ptr + pg, tl.full([BLOCK_W * 4], -1, tl.int32), mask=pg < cap_pages)
    used = 0
    for first in range(0, num_seqs, BLOCK_S):
        s = first + tl.arange(0, BLOCK_S)
        ok = s < num_seqs
        q_len = tl.load(cu_q_ptr + s + 1, mask=ok, other=0) - tl.load(cu_q_ptr + s, mask=ok, other=0)
        seq_len = tl.load(seq_lens_ptr + s, mask=ok, other=0)
        want = ok & (q_len >= min_query)
        pages = tl.where(want, tl.cdiv(seq_len, PAGE), 0)
        end = used + tl.cumsum(pages, axis=0)
        start = end - pages
        take = want & (end <= cap_pages)
        tl.store(sel_ptr + s, take.to(tl.int32), mask=ok)
        for j0 in range(0, table_width, BLOCK_W):
            j = j0 + tl.arange(0, BLOCK_W)
            in_seq = take[:, None] & (j[None, :] < pages[:, None])
            tl.store(mtab_ptr + s[:, None].to(tl.int64) * stride_mtab + j[None, :], start[:, None] + j[None, :],
                     mask=take[:, None] & (j[None, :] < table_width))
            tl.store(owner_ptr + start[:, None] + j[None, :], s[:, None] * 65536 + j[None, :], mask=in_seq)
        used += tl.sum(pages, axis=0)


@triton.jit(do_not_specialize=["block_size", "stride_btb"])
def _mirror_kernel(
    k_ptr, v_ptr, ks_ptr, vs_ptr, block_table_ptr, seq_lens_ptr, owner_ptr, mk_ptr, mv_ptr, msk_ptr,
    block_size, stride_btb,
    stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_vd,
    stride_ksb, stride_kst, stride_ksh, stride_vsb, stride_vst, stride_vsh,
    stride_mb, stride_mt, stride_mh, stride_msb, stride_mst, stride_msh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr, PAGE: tl.constexpr,
    KV_QUANT: tl.constexpr, FP8_SOFTWARE: tl.constexpr, PTX: tl.constexpr,
):  # fmt: skip
    """BLOCK_T tokens of one kv head of one mirror page: its owner's K codes as exact values in mk's 16-bit dtype
    (q's) with their scales, its V as bf16 values; the page's tokens past the sequence's end as zeros (the attention
    kernel reads whole page runs). The cache's V is read through its head_dim stride (an int8 cache holds V by dim);
    the mirror's V is by token, head_dim contiguous. The grid covers the whole mirror (fixed size); free pages return
    at once."""
    mpage = tl.program_id(0) // (PAGE // BLOCK_T)
    kv_head = tl.program_id(1)
    owner = tl.load(owner_ptr + mpage)
    if owner < 0:
        return
    seq = owner // 65536
    seq_len = tl.load(seq_lens_ptr + seq)
    row = (tl.program_id(0) % (PAGE // BLOCK_T)) * BLOCK_T + tl.arange(0, BLOCK_T)  # in the mirror page
    t = (owner % 65536) * PAGE + row
    t_ok = t < seq_len
    tok = tl.minimum(t, seq_len - 1)
    page = tok // block_size
    slot = tok - page * block_size
    phys = tl.load(block_table_ptr + seq.to(tl.int64) * stride_btb + page).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d[None, :] < HEAD_DIM
    mask = t_ok[:, None] & d_ok
    m_off = (mpage.to(tl.int64) * stride_mb + row * stride_mt + kv_head * stride_mh)[:, None] + offs_d[None, :]
    ms_off = mpage.to(tl.int64) * stride_msb + row * stride_mst + kv_head * stride_msh
    # K: the codes as exact 16-bit values and their scales (the scores need every bit: |K| x |q| can be large)
    codes = tl.load(k_ptr + (phys * stride_kb + slot * stride_kt + kv_head * stride_kh)[:, None] + offs_d[None, :],
                    mask=mask, other=0)
    tl.store(mk_ptr + m_off, _codes_to_f16(codes, KV_QUANT, FP8_SOFTWARE, PTX).to(mk_ptr.dtype.element_ty), mask=d_ok)
    k_scale = tl.load(ks_ptr + phys * stride_ksb + slot * stride_kst + kv_head * stride_ksh)
    tl.store(msk_ptr + ms_off, tl.where(t_ok, k_scale, 0.0))
    # V: the dequantized values in bf16 (one rounding, as a bf16 cache has; bf16's range holds any V), saturated
    # at bf16's largest finite value
    v_off = phys * stride_vb + slot * stride_vt + kv_head * stride_vh
    codes = tl.load(v_ptr + v_off[:, None] + offs_d[None, :] * stride_vd, mask=mask, other=0)
    v_scale = tl.load(vs_ptr + phys * stride_vsb + slot * stride_vst + kv_head * stride_vsh)
    vals = _codes_to_f16(codes, KV_QUANT, FP8_SOFTWARE, PTX).to(tl.float32)
    vals = vals * (v_scale * _code_unit(KV_QUANT))[:, None]
    vals = tl.minimum(tl.maximum(vals, -_BF16_MAX), _BF16_MAX)
    tl.store(mv_ptr + m_off, vals.to(mv_ptr.dtype.element_ty), mask=d_ok)


_MIRRORS: dict = {}


def mirror_tokens(env=None) -> int:
    """Tokens the 16-bit mirror of 8-bit caches holds (VLLM_DCU_PREFILL_KV8_MIRROR_TOKENS; 0 = no mirror)."""
    import os

    raw = (os.environ if env is None else env).get(MIRROR_ENV, "").strip()
    try:
        n = int(raw) if raw else MIRROR_DEFAULT_TOKENS
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"{MIRROR_ENV}={raw!r}: must be a token count >= 0 (0 turns the mirror off)")
    return n


def _mirror_buffer(device, num_heads_kv, head_dim, tokens):
    """The mirror of this shape on this device, allocated once: [pages, 2, MIRROR_PAGE, kv_heads, head_dim] 16-bit
    (K's codes in q's dtype, V's bf16 values; stored as fp16, the launcher views each half in its dtype) and K's
    float32 scales [pages, MIRROR_PAGE, kv_heads]."""
    pages = tokens // MIRROR_PAGE
    key = (str(device), num_heads_kv, head_dim, pages)
    if key not in _MIRRORS:
        _MIRRORS[key] = (
            torch.empty(pages, 2, MIRROR_PAGE, num_heads_kv, head_dim, dtype=torch.float16, device=device),
            torch.empty(pages, MIRROR_PAGE, num_heads_kv, dtype=torch.float32, device=device),
        )
    return _MIRRORS[key]


def _fail(msg: str):
    raise ValueError(f"prefill_attention: {msg}")


def _check_inputs(q, k_cache, v_cache, out, cu_seqlens_q, seq_lens, block_table, k_scales, v_scales, kv_quant):
    check_q_and_cache(_fail, q, k_cache, v_cache, out, k_scales, v_scales, kv_quant, MAX_GROUP, v_any_dim_stride=True)
    num_seqs = seq_lens.shape[0] if seq_lens.dim() == 1 else -1
    if seq_lens.dim() != 1 or seq_lens.dtype != torch.int32:
        _fail(f"seq_lens must be int32 [num_seqs], got {tuple(seq_lens.shape)} {seq_lens.dtype}")
    if cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape[0] < num_seqs + 1 or cu_seqlens_q.dtype != torch.int32:
        _fail(f"cu_seqlens_q must be int32 [>= {num_seqs + 1}], got {tuple(cu_seqlens_q.shape)} {cu_seqlens_q.dtype}")
    check_block_table(_fail, block_table, num_seqs)
    check_one_device(_fail, q, k_cache, v_cache, out, cu_seqlens_q, seq_lens, block_table)


def takes_int8_products(int8_v_by_dim, mirror, block_size, block_m, block_n, head_dim) -> bool:
    """Whether a launch runs INT8_PV (_attend_window_int8_pv): an int8 cache holding V by dim, read directly (not
    the mirror), in page windows of BLOCK_N slots (pages of at least BLOCK_N tokens), for query tiles of up to 32
    rows (the fp32 accumulator and the int32 product tile side by side: at 64-128 rows they spill 400-1100 B on
    sm90, and 128 x 32 took 4.9x bf16's time against 3.5x converting V to fp16); its int32 sums hold head_dim and
    BLOCK_N up to 512."""
    return (int8_v_by_dim and not mirror and block_size >= block_n and block_m <= 32 and head_dim <= 512
            and block_n <= 512)


def _attend(q, k_cache, v_cache, k_scales, v_scales, out, cu_seqlens_q, seq_lens, block_table, scale, kv_quant,
            software_fp8, launch, sel=None, seq_filter=0, mirror=False):
    num_tokens, hq, d = q.shape
    _, block_size, hkv, _ = k_cache.shape
    num_seqs = seq_lens.shape[0]
    group = hq // hkv
    launch = dict(launch)
    block_m = max(launch.pop("BLOCK_M"), triton.next_power_of_2(group))
    block_n = launch.pop("BLOCK_N")
    int8_pv = takes_int8_products(kv_quant == "int8" and v_cache.stride(1) == 1, mirror, block_size, block_m,
                                  block_n, d)
    block_q = block_m // group
    total_q_blocks = num_tokens // block_q + num_seqs
    if kv_quant is None:
        k_scales = v_scales = seq_lens  # unused placeholders
        ks_strides = vs_strides = (0, 0, 0)
    else:
        ks_strides, vs_strides = k_scales.stride(), v_scales.stride()
    _prefill_kernel[(total_q_blocks, hkv)](
        q, k_cache, v_cache, k_scales, v_scales, out, cu_seqlens_q, seq_lens, block_table,
        seq_lens if sel is None else sel,
        float(scale) * _LOG2E, num_seqs, total_q_blocks, block_size,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        *k_cache.stride()[:3], *v_cache.stride(), *ks_strides, *vs_strides,
        block_table.stride(0),
        GROUP=group, HEAD_DIM=d, BLOCK_D=triton.next_power_of_2(d),
        BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_N=block_n, PAGE_GE_TILE=block_size >= block_n,
        KV_QUANT=_KV_QUANT[kv_quant], FP8_SOFTWARE=bool(software_fp8),
        PTX=kv_quant is not None and _use_ptx(q.device), SEQ_FILTER=seq_filter, MIRROR=mirror, INT8_PV=int8_pv,
        **launch,
    )  # fmt: skip


def prefill_attention(q, k_cache, v_cache, out, cu_seqlens_q, seq_lens, block_table, scale, *, k_scales=None,
                      v_scales=None, kv_quant=None, software_fp8=None, max_seqlen_k=None, params=None,
                      mirror_params=None, mirror=None):
    """Causal attention of a batch of query chunks over their paged KV; writes ``out`` and returns it.

    q, out: [num_tokens, q_heads, head_dim] fp16/bf16, the chunks of ``num_seqs`` sequences back to back
    (sequence s owns rows ``cu_seqlens_q[s]:cu_seqlens_q[s + 1]``; a decode row is a chunk of one token).
    seq_lens: int32 [num_seqs], each sequence's length including its chunk, whose K/V must already be in the
    cache. k_cache, v_cache: [num_blocks, block_size, kv_heads, head_dim] in q's dtype, or uint8 codes with
    kv_quant "fp8" / "int8" and float32 k_scales, v_scales [num_blocks, block_size, kv_heads] (any strides; K
    contiguous in head_dim, V with any head_dim stride: an int8 cache holds V by dim, docs/kv-cache-layout.md).
    block_table: int32 [>= num_seqs, max_blocks]. Rows past ``cu_seqlens_q[num_seqs]`` are not written.
    software_fp8: decode fp8 with integer ops (None: kernels.fp8_e4m3.use_software_fp8()).
    max_seqlen_k: a host int >= every seq_len; with 8-bit caches it enables the 16-bit mirror
    for chunks of MIRROR_MIN_QUERY tokens or more (see above; ``mirror``: its size in tokens, None: from
    VLLM_DCU_PREFILL_KV8_MIRROR_TOKENS, 0: off). params / mirror_params: the Triton launch for the cache's
    width / for the mirror (dicts like launch_params' entries; None: the current target's kv16 or kv8, and
    kv8_short for the direct launch beside the mirror; the mirror's BLOCK_N must divide MIRROR_PAGE).
    """
    _check_inputs(q, k_cache, v_cache, out, cu_seqlens_q, seq_lens, block_table, k_scales, v_scales, kv_quant)
    num_tokens, hq, d = q.shape
    _, block_size, hkv, _ = k_cache.shape
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    entry = None
    if params is None or mirror_params is None:
        entry = launch_params.get_params(launch_params.current_target(q.device))
    if software_fp8 is None:
        software_fp8 = kv_quant == "fp8" and use_software_fp8()
    tokens = mirror_tokens() if mirror is None else int(mirror)
    # with 8-bit caches the mirror flow runs for every batch it can serve (a batch without long chunks marks no
    # sequence and its mirror launches return at once), so the same kernels run whatever the batch holds
    use_mirror = kv_quant is not None and max_seqlen_k is not None and tokens >= MIRROR_PAGE
    if params is None:  # beside the mirror the direct launch's rows are short: kv8_short
        params = entry["kv8_short" if use_mirror else "kv8" if kv_quant else "kv16"]
    if not use_mirror:
        _attend(q, k_cache, v_cache, k_scales, v_scales, out, cu_seqlens_q, seq_lens, block_table, scale, kv_quant,
                software_fp8, params)
        return out
    mirror_launch = mirror_params if mirror_params is not None else entry["kv16"]
    if MIRROR_PAGE % mirror_launch["BLOCK_N"]:  # a key tile must be one run of one mirror page
        _fail(f"the mirror's BLOCK_N must divide MIRROR_PAGE ({MIRROR_PAGE}), got {mirror_launch['BLOCK_N']}")
    buf, buf_s = _mirror_buffer(q.device, hkv, d, tokens)
    width = triton.cdiv(int(max_seqlen_k), MIRROR_PAGE)
    sel = torch.empty(num_seqs, dtype=torch.int32, device=q.device)
    mtab = torch.empty(num_seqs, width, dtype=torch.int32, device=q.device)
    owner = torch.empty(buf.shape[0], dtype=torch.int32, device=q.device)
    _plan_mirror_kernel[(1,)](
        cu_seqlens_q, seq_lens, sel, mtab, owner, num_seqs, width, MIRROR_MIN_QUERY, buf.shape[0], mtab.stride(0),
        PAGE=MIRROR_PAGE, BLOCK_S=_MIRROR_BLOCK_S, BLOCK_W=64, num_warps=4,
    )  # fmt: skip
    mk, mv, msk = buf[:, 0].view(q.dtype), buf[:, 1].view(torch.bfloat16), buf_s  # K's codes in q's dtype
    _mirror_kernel[(buf.shape[0] * (MIRROR_PAGE // _MIRROR_BLOCK_T), hkv)](
        k_cache, v_cache, k_scales, v_scales, block_table, seq_lens, owner, mk, mv, msk,
        block_size, block_table.stride(0),
        *k_cache.stride()[:3], *v_cache.stride(), *k_scales.stride(), *v_scales.stride(), *mk.stride()[:3],
        *msk.stride(),
        HEAD_DIM=d, BLOCK_D=triton.next_power_of_2(d), BLOCK_T=_MIRROR_BLOCK_T, PAGE=MIRROR_PAGE,
        KV_QUANT=_KV_QUANT[kv_quant], FP8_SOFTWARE=bool(software_fp8), PTX=_use_ptx(q.device), num_warps=4,
    )  # fmt: skip
    _attend(q, mk, mv, msk, msk, out, cu_seqlens_q, seq_lens, mtab, scale, kv_quant, software_fp8, mirror_launch,
            sel, 1, mirror=True)
    _attend(q, k_cache, v_cache, k_scales, v_scales, out, cu_seqlens_q, seq_lens, block_table, scale, kv_quant,
            software_fp8, params, sel, 2)
    return out
