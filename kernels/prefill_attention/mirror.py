"""The 16-bit mirror of 8-bit caches for long prefill chunks: its constants, the kernels that plan and fill it, the
buffer it lives in and the variable that sizes it (prefill_attention.py runs the attention over it).
"""
import torch
import triton
import triton.language as tl

from ..decode_attention.codes import code_unit, codes_to_f16

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
# (q_for_codes), and took 1.58-1.63x. That q is computed, not loaded, so Triton kept the first dot's A operand in
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
MIRROR_BLOCK_S = 128
MIRROR_BLOCK_T = 32
_BF16_MAX = tl.constexpr(3.3895313892515355e38)
MIRROR_PAGE_C = tl.constexpr(MIRROR_PAGE)


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
    tl.store(mk_ptr + m_off, codes_to_f16(codes, KV_QUANT, FP8_SOFTWARE, PTX).to(mk_ptr.dtype.element_ty), mask=d_ok)
    k_scale = tl.load(ks_ptr + phys * stride_ksb + slot * stride_kst + kv_head * stride_ksh)
    tl.store(msk_ptr + ms_off, tl.where(t_ok, k_scale, 0.0))
    # V: the dequantized values in bf16 (one rounding, as a bf16 cache has; bf16's range holds any V), saturated
    # at bf16's largest finite value
    v_off = phys * stride_vb + slot * stride_vt + kv_head * stride_vh
    codes = tl.load(v_ptr + v_off[:, None] + offs_d[None, :] * stride_vd, mask=mask, other=0)
    v_scale = tl.load(vs_ptr + phys * stride_vsb + slot * stride_vst + kv_head * stride_vsh)
    vals = codes_to_f16(codes, KV_QUANT, FP8_SOFTWARE, PTX).to(tl.float32)
    vals = vals * (v_scale * code_unit(KV_QUANT))[:, None]
    vals = tl.minimum(tl.maximum(vals, -_BF16_MAX), _BF16_MAX)
    tl.store(mv_ptr + m_off, vals.to(mv_ptr.dtype.element_ty), mask=d_ok)


MIRRORS: dict = {}


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


def mirror_buffer(device, num_heads_kv, head_dim, tokens):
    """The mirror of this shape on this device, allocated once: [pages, 2, MIRROR_PAGE, kv_heads, head_dim] 16-bit
    (K's codes in q's dtype, V's bf16 values; stored as fp16, the launcher views each half in its dtype) and K's
    float32 scales [pages, MIRROR_PAGE, kv_heads]."""
    pages = tokens // MIRROR_PAGE
    key = (str(device), num_heads_kv, head_dim, pages)
    if key not in MIRRORS:
        MIRRORS[key] = (
            torch.empty(pages, 2, MIRROR_PAGE, num_heads_kv, head_dim, dtype=torch.float16, device=device),
            torch.empty(pages, MIRROR_PAGE, num_heads_kv, dtype=torch.float32, device=device),
        )
    return MIRRORS[key]
