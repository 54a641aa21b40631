"""Paged causal attention for prefill chunks (and the rows of mixed batches) over a vLLM KV cache: the public entry
``prefill_attention``, its input checks and launches. The kernel bodies are prefill_kernel.py, the 16-bit mirror
of 8-bit caches mirror.py, the launch table launch_params.py.

Quantized caches (kv_quant "fp8" / "int8", docs/kv-cache-layout.md): uint8 codes become fp16 exactly
(e4m3 value / 256, int8 value / 128; the decode kernel's conversions, PTX on CUDA) and both products run in
fp16. Q is multiplied by a power of two that puts max|q| of the tile at 2^12 (exact; undone in S). The K
scales multiply the columns of S. The V scales enter as the decode kernel's: log2 of each key's V factor is
added to its score for the running max, so P' = P x factor stays in [0, 1] in fp16 for any finite V; the 8-bit
accumulator is not normalized (it sums P' x codes, bounded by the key count) and l, with its own exponential,
divides it at the end (decode_attention/codes.py's docstring has the ranges). Each 8-bit tile is converted once per
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
"""
import torch
import triton

from ..decode_attention.planning import use_ptx
from ..fp8_e4m3 import use_software_fp8
from ..paged_kv import check_block_table, check_one_device, check_q_and_cache
from . import launch_params
from .mirror import (MIRROR_BLOCK_S, MIRROR_BLOCK_T, MIRROR_DEFAULT_TOKENS, MIRROR_ENV, MIRROR_MIN_QUERY,  # noqa: F401
                     MIRROR_PAGE, MIRRORS, _mirror_kernel, _plan_mirror_kernel, mirror_buffer, mirror_tokens)
from .prefill_kernel import _prefill_kernel

_LOG2E = 1.4426950408889634
_KV_QUANT = {None: 0, "fp8": 1, "int8": 2}
MAX_GROUP = 16  # query heads per kv head the launcher accepts


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
    BLOCK_N up to 512. Pages of a multiple of 16 tokens (every vLLM block size; int8 hybrid pages 1664): the
    windows start on a multiple of 16 slots, which the kernel tells the compiler for V's 16-byte loads."""
    return (int8_v_by_dim and not mirror and block_size >= block_n and block_size % 16 == 0 and block_m <= 32
            and head_dim <= 512 and block_n <= 512)


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
        PTX=kv_quant is not None and use_ptx(q.device), SEQ_FILTER=seq_filter, MIRROR=mirror, INT8_PV=int8_pv,
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
    buf, buf_s = mirror_buffer(q.device, hkv, d, tokens)
    width = triton.cdiv(int(max_seqlen_k), MIRROR_PAGE)
    sel = torch.empty(num_seqs, dtype=torch.int32, device=q.device)
    mtab = torch.empty(num_seqs, width, dtype=torch.int32, device=q.device)
    owner = torch.empty(buf.shape[0], dtype=torch.int32, device=q.device)
    _plan_mirror_kernel[(1,)](
        cu_seqlens_q, seq_lens, sel, mtab, owner, num_seqs, width, MIRROR_MIN_QUERY, buf.shape[0], mtab.stride(0),
        PAGE=MIRROR_PAGE, BLOCK_S=MIRROR_BLOCK_S, BLOCK_W=64, num_warps=4,
    )  # fmt: skip
    mk, mv, msk = buf[:, 0].view(q.dtype), buf[:, 1].view(torch.bfloat16), buf_s  # K's codes in q's dtype
    _mirror_kernel[(buf.shape[0] * (MIRROR_PAGE // MIRROR_BLOCK_T), hkv)](
        k_cache, v_cache, k_scales, v_scales, block_table, seq_lens, owner, mk, mv, msk,
        block_size, block_table.stride(0),
        *k_cache.stride()[:3], *v_cache.stride(), *k_scales.stride(), *v_scales.stride(), *mk.stride()[:3],
        *msk.stride(),
        HEAD_DIM=d, BLOCK_D=triton.next_power_of_2(d), BLOCK_T=MIRROR_BLOCK_T, PAGE=MIRROR_PAGE,
        KV_QUANT=_KV_QUANT[kv_quant], FP8_SOFTWARE=bool(software_fp8), PTX=use_ptx(q.device), num_warps=4,
    )  # fmt: skip
    _attend(q, mk, mv, msk, msk, out, cu_seqlens_q, seq_lens, mtab, scale, kv_quant, software_fp8, mirror_launch,
            sel, 1, mirror=True)
    _attend(q, k_cache, v_cache, k_scales, v_scales, out, cu_seqlens_q, seq_lens, block_table, scale, kv_quant,
            software_fp8, params, sel, 2)
    return out
