"""KV cache write with per-(token, head) dynamic scales (fp8 e4m3 or int8), Triton.

Each (token, kv head) of K and V is quantized on its own: absmax over head_dim in float32,
``scale = absmax / QMAX``, codes ``= round(x / scale)``; the rule (and its torch twin) is in reference.py, the page
layout in layout.py / docs/kv-cache-layout.md. Tokens whose slot is negative (padding) are skipped.
``reshape_and_cache_per_token_head`` is the only public name.

Two kernels. V by token (fp8 caches): one program per token x ``BLOCK_H`` heads; each (token, head) row of K and V is
``D`` contiguous bytes. V by dim (int8 caches, ``layout.V_BY_DIM``): a token's V codes lie ``block_size`` bytes apart,
so the per-token kernel stores them one byte per line (H200: 6.3x the by-token time for a 4096-token chunk); from
``tiled_min_tokens`` tokens (a prefill chunk) one program takes ``BLOCK_T`` tokens x one kv head and stores V's codes
as a ``[D, BLOCK_T]`` tile, tokens fastest, so neighbouring lanes write neighbouring tokens' bytes of one dim (a whole
sector per warp where the chunk's slots are consecutive: 1.24x the by-token time for 4096 tokens). Smaller batches
(decode steps, whose slots are scattered anyway) keep the per-token kernel, where the tile's few long programs cost
more.
"""
import torch
import triton
import triton.language as tl

from ..fp8_e4m3 import f32_to_e4m3_bits, use_software_fp8
from ..tuning.decisions import runs_ours
from .layout import QMAX

_WRITE_PATHS = {"int8": "kv_write.int8", "fp8": "kv_write.fp8"}  # the decisions' launch kinds (tuned_file.PATHS)

# launch parameters per target; both kernels are memory bound.
# elems_per_program / num_warps: the per-token kernel (V by token); small programs keep many in flight.
# tile_tokens / tile_warps: the token-tiled kernel (V by dim), one kv head x tile_tokens tokens per program.
# 32 tokens: a warp's 32 lanes store one dim's 32 tokens, a whole 32-byte sector when the slots are consecutive.
# Chosen from compiles at Qwen3.5-27B's shape (4 kv heads x 256, 2026-12-03): sm90 [32, 256] tiles with 8 warps
# 96 registers (4 warps: 148), no spills; gfx90a (the DCU's wave64 proxy) 4 waves 82 VGPRs, no spills.
# tiled_min_tokens: V by dim takes the tiled kernel from this many tokens, the per-token kernel below it. H200
# (bench/results/2026-12-03-h200-int8-v-by-dim-engine-prefill-writer.md): a prefill chunk's 4096 consecutive
# slots 14.4 us tiled against 73 us per token (11.6 us for V by token); but 1-32 tokens take 11-14 us tiled (a few
# long programs) against 3.6-3.8 us per token, and decode batches (up to max-num-seqs: 128 in the contest)
# scatter their slots.
# cpu (the interpreter, tests): 16-token tiles keep the edge tests small; every V-by-dim write takes the tiled kernel.
_LAUNCH = {
    "cuda": dict(elems_per_program=1024, num_warps=4, tile_tokens=32, tile_warps=8, tiled_min_tokens=129),
    "hip": dict(elems_per_program=1024, num_warps=4, tile_tokens=32, tile_warps=4, tiled_min_tokens=129),
    "cpu": dict(elems_per_program=1024, num_warps=1, tile_tokens=16, tile_warps=1, tiled_min_tokens=1),
}


@triton.jit
def _quantize_heads(x, mask, QUANT_INT8: tl.constexpr, SOFTWARE: tl.constexpr, QMAX_: tl.constexpr):
    """x [rows, BLOCK_D] float32 -> (codes uint8 [rows, BLOCK_D], scales float32 [rows]); a row is one (token, head):
    the heads of one token, or the tokens of one head."""
    absmax = tl.max(tl.where(mask, tl.abs(x), 0.0), axis=1)
    scale = tl.math.div_rn(absmax, tl.full(absmax.shape, QMAX_, tl.float32))
    # scales are 0 or normal float32: a head whose scale would be subnormal is stored as zeros
    scale = tl.where(scale < 1.1754943508222875e-38, 0.0, scale)
    nonzero = scale > 0.0
    safe = tl.where(nonzero, scale, 1.0)
    y = tl.math.div_rn(x, safe[:, None])
    if QUANT_INT8:
        # round half to even: adding 1.5 * 2^23 leaves no fraction bits in float32 (|y| <= ~127)
        r = (y + 12582912.0) - 12582912.0
        r = tl.minimum(tl.maximum(r, -127.0), 127.0)
        codes = r.to(tl.int32).to(tl.int8).to(tl.uint8, bitcast=True)
    else:
        codes = f32_to_e4m3_bits(y, SOFTWARE)
    codes = tl.where(nonzero[:, None], codes, 0).to(tl.uint8)
    return codes, scale


@triton.jit
def _reshape_and_cache_pth_kernel(
    key_ptr,
    value_ptr,
    k_codes_ptr,
    v_codes_ptr,
    k_scales_ptr,
    v_scales_ptr,
    slot_mapping_ptr,
    stride_key_tok,
    stride_key_head,
    stride_value_tok,
    stride_value_head,
    stride_codes_blk,
    stride_codes_tok,
    stride_codes_head,
    stride_vcodes_blk,
    stride_vcodes_tok,
    stride_vcodes_head,
    stride_vcodes_dim,
    stride_scales_blk,
    stride_scales_tok,
    stride_scales_head,
    num_heads,
    head_size,
    block_size,
    QUANT_INT8: tl.constexpr,
    SOFTWARE: tl.constexpr,
    QMAX_: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    tok = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    if slot < 0:
        return
    blk = slot // block_size
    off = slot % block_size

    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    mask = (heads < num_heads)[:, None] & (dims < head_size)[None, :]
    tok64 = tok.to(tl.int64)

    codes_off = blk * stride_codes_blk + off * stride_codes_tok + heads[:, None] * stride_codes_head + dims[None, :]
    scales_off = blk * stride_scales_blk + off * stride_scales_tok + heads * stride_scales_head
    head_mask = heads < num_heads

    k = tl.load(key_ptr + tok64 * stride_key_tok + heads[:, None] * stride_key_head + dims[None, :], mask=mask)
    k_codes, k_scale = _quantize_heads(k.to(tl.float32), mask, QUANT_INT8, SOFTWARE, QMAX_)
    tl.store(k_codes_ptr + codes_off, k_codes, mask=mask)
    tl.store(k_scales_ptr + scales_off, k_scale, mask=head_mask)

    v = tl.load(value_ptr + tok64 * stride_value_tok + heads[:, None] * stride_value_head + dims[None, :], mask=mask)
    v_codes, v_scale = _quantize_heads(v.to(tl.float32), mask, QUANT_INT8, SOFTWARE, QMAX_)
    # V's codes through all four strides; the launcher sends V by dim to _reshape_and_cache_tiled_kernel, where
    # one token's bytes would go block_size apart, one byte per store
    v_codes_off = (blk * stride_vcodes_blk + off * stride_vcodes_tok + heads[:, None] * stride_vcodes_head
                   + dims[None, :] * stride_vcodes_dim)
    tl.store(v_codes_ptr + v_codes_off, v_codes, mask=mask)
    tl.store(v_scales_ptr + scales_off, v_scale, mask=head_mask)


@triton.jit(do_not_specialize=["num_tokens"])
def _reshape_and_cache_tiled_kernel(
    key_ptr,
    value_ptr,
    k_codes_ptr,
    v_codes_ptr,
    k_scales_ptr,
    v_scales_ptr,
    slot_mapping_ptr,
    num_tokens,
    stride_key_tok,
    stride_key_head,
    stride_value_tok,
    stride_value_head,
    stride_codes_blk,
    stride_codes_tok,
    stride_codes_head,
    stride_vcodes_blk,
    stride_vcodes_tok,
    stride_vcodes_head,
    stride_vcodes_dim,
    stride_scales_blk,
    stride_scales_tok,
    stride_scales_head,
    head_size,
    block_size,
    QUANT_INT8: tl.constexpr,
    SOFTWARE: tl.constexpr,
    QMAX_: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """BLOCK_T tokens x one kv head (program_id(1)), for V by dim (tokens contiguous). num_tokens is not
    specialized: one compiled kernel serves every batch size."""
    head = tl.program_id(1)
    toks = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    # tokens past num_tokens and padding (slot < 0) are masked rows of the tile: no load, no store
    slot = tl.load(slot_mapping_ptr + toks, mask=toks < num_tokens, other=-1).to(tl.int64)
    tok_ok = slot >= 0
    slot = tl.where(tok_ok, slot, 0)
    blk = slot // block_size
    off = slot % block_size
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_size
    mask = tok_ok[:, None] & dim_ok[None, :]
    toks64 = toks.to(tl.int64)
    scales_off = blk * stride_scales_blk + off * stride_scales_tok + head * stride_scales_head

    # K: [BLOCK_T, BLOCK_D], rows are tokens (_quantize_heads reduces over axis 1), stored by token as before
    k = tl.load(key_ptr + (toks64 * stride_key_tok + head * stride_key_head)[:, None] + dims[None, :], mask=mask,
                other=0.0)
    k_codes, k_scale = _quantize_heads(k.to(tl.float32), mask, QUANT_INT8, SOFTWARE, QMAX_)
    k_row = blk * stride_codes_blk + off * stride_codes_tok + head * stride_codes_head
    tl.store(k_codes_ptr + k_row[:, None] + dims[None, :], k_codes, mask=mask)
    tl.store(k_scales_ptr + scales_off, k_scale, mask=tok_ok)

    v = tl.load(value_ptr + (toks64 * stride_value_tok + head * stride_value_head)[:, None] + dims[None, :],
                mask=mask, other=0.0)
    v_codes, v_scale = _quantize_heads(v.to(tl.float32), mask, QUANT_INT8, SOFTWARE, QMAX_)
    # V's codes as a [BLOCK_D, BLOCK_T] tile, token axis last, flattened: adjacent lanes store adjacent tokens' bytes
    # of one dim (contiguous when the slots are), not one token's bytes block_size apart. The slots come from
    # memory, so the compiler can prove no contiguity along either axis of a 2-D store and picks its thread order
    # by a tie-break (Triton 3.6 puts axis 0 fastest); a 1-D store has one order
    v_tok = blk * stride_vcodes_blk + off * stride_vcodes_tok + head * stride_vcodes_head
    v_ptrs = v_codes_ptr + v_tok[None, :] + (dims * stride_vcodes_dim)[:, None]
    v_mask = dim_ok[:, None] & tok_ok[None, :]
    tl.store(tl.reshape(v_ptrs, [BLOCK_D * BLOCK_T]), tl.reshape(tl.trans(v_codes), [BLOCK_D * BLOCK_T]),
             mask=tl.reshape(v_mask, [BLOCK_D * BLOCK_T]))
    tl.store(v_scales_ptr + scales_off, v_scale, mask=tok_ok)


def _target(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    return "hip" if torch.version.hip else "cuda"


def reshape_and_cache_per_token_head(
    key: torch.Tensor,
    value: torch.Tensor,
    k_codes: torch.Tensor,
    v_codes: torch.Tensor,
    k_scales: torch.Tensor,
    v_scales: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_quant: str,
    software_fp8: bool | None = None,
) -> None:
    """Quantize ``key``/``value`` ``[num_tokens, H, D]`` and write them into the cache views.

    ``k_codes``/``v_codes`` ``[num_blocks, block_size, H, D]`` uint8 and ``k_scales``/``v_scales``
    ``[num_blocks, block_size, H]`` float32 are the views from ``layout.split_kv_cache`` (K by token, head_dim
    contiguous; V by token or, for int8 caches, by dim: it is written through its own strides, by the token-tiled
    kernel when ``v_codes.stride(1) == 1``).
    Token i goes to slot ``slot_mapping[i]`` (block ``slot // block_size``, row ``slot % block_size``);
    negative slots are skipped. Only the first ``slot_mapping.shape[0]`` rows of key/value are read.
    ``kv_quant`` is ``"fp8"`` or ``"int8"``; ``software_fp8=None`` picks the fp8 decode path for the
    device (``fp8_e4m3.use_software_fp8``); both paths write identical codes.
    """
    if kv_quant not in QMAX:
        raise ValueError(f"kv_quant must be 'fp8' or 'int8', got {kv_quant!r}")
    if key.dim() != 3 or value.shape != key.shape:
        raise ValueError(f"key/value must both be [num_tokens, H, D], got {tuple(key.shape)} / {tuple(value.shape)}")
    if key.stride(-1) != 1 or value.stride(-1) != 1:
        raise ValueError("key/value must be contiguous along head_dim")
    num_tokens = slot_mapping.shape[0]
    _, num_heads, head_size = key.shape
    if key.shape[0] < num_tokens:
        raise ValueError(f"slot_mapping has {num_tokens} entries but key has only {key.shape[0]} tokens")
    if k_codes.dtype != torch.uint8 or v_codes.dtype != torch.uint8:
        raise TypeError("k_codes/v_codes must be uint8")
    if k_scales.dtype != torch.float32 or v_scales.dtype != torch.float32:
        raise TypeError("k_scales/v_scales must be float32")
    if k_codes.shape[2:] != (num_heads, head_size) or v_codes.shape != k_codes.shape:
        raise ValueError(f"cache codes {tuple(k_codes.shape)} do not match key heads/head_size {num_heads}/{head_size}")
    if k_scales.stride() != v_scales.stride():
        raise ValueError("K and V scale views must share strides (take them from split_kv_cache)")
    if k_codes.stride(-1) != 1:
        raise ValueError("cache codes must be contiguous along head_dim")
    if num_tokens == 0:
        return
    if software_fp8 is None:
        software_fp8 = use_software_fp8()

    launch = _LAUNCH[_target(key.device)]
    common = dict(QUANT_INT8=kv_quant == "int8", SOFTWARE=bool(software_fp8), QMAX_=QMAX[kv_quant],
                  BLOCK_D=triton.next_power_of_2(head_size))
    views = (key, value, k_codes, v_codes, k_scales, v_scales)
    if v_codes.stride(1) != 1:  # V by token
        _launch_per_token(views, slot_mapping, num_tokens, launch, common)
        return
    tiled = num_tokens >= launch["tiled_min_tokens"]
    (_launch_tiled if tiled else _launch_per_token)(views, slot_mapping, num_tokens, launch, common)
    # V by dim takes either kernel by the batch's size: the first write through these views (the engine's warm-up)
    # also compiles the other one with the same arguments, without launching it (Triton's warmup), so both are
    # compiled before serving and nothing extra is launched, nor recorded if that first write is in a CUDA graph
    sig = (key.device, key.dtype, value.dtype, *(t.stride() for t in views), num_heads, head_size,
           k_codes.shape[1], tuple(common.items()))
    if sig not in _WARMED:
        _WARMED.add(sig)
        other = _launch_per_token if tiled else _launch_tiled
        other(views, slot_mapping, num_tokens, launch, common, compile_only=True)


_WARMED: set = set()


def _kernel_call(kernel, grid, compile_only):
    """``kernel[grid]``, or Triton's compile-only warmup with the same arguments."""
    if compile_only:
        return lambda *args, **kwargs: kernel.warmup(*args, grid=grid, **kwargs)
    return kernel[grid]


def _launch_tiled(views, slot_mapping, num_tokens, launch, common, compile_only=False):
    key, value, k_codes, v_codes, k_scales, v_scales = views
    block_t = launch["tile_tokens"]
    _kernel_call(_reshape_and_cache_tiled_kernel, (triton.cdiv(num_tokens, block_t), key.shape[1]), compile_only)(
        key,
        value,
        k_codes,
        v_codes,
        k_scales,
        v_scales,
        slot_mapping,
        num_tokens,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_codes.stride(0),
        k_codes.stride(1),
        k_codes.stride(2),
        *v_codes.stride(),
        k_scales.stride(0),
        k_scales.stride(1),
        k_scales.stride(2),
        key.shape[2],
        k_codes.shape[1],
        BLOCK_T=block_t,
        num_warps=launch["tile_warps"],
        **common,
    )


def _launch_per_token(views, slot_mapping, num_tokens, launch, common, compile_only=False):
    key, value, k_codes, v_codes, k_scales, v_scales = views
    num_heads = key.shape[1]
    block_h = min(triton.next_power_of_2(num_heads), max(1, launch["elems_per_program"] // common["BLOCK_D"]))
    _kernel_call(_reshape_and_cache_pth_kernel, (num_tokens, triton.cdiv(num_heads, block_h)), compile_only)(
        key,
        value,
        k_codes,
        v_codes,
        k_scales,
        v_scales,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_codes.stride(0),
        k_codes.stride(1),
        k_codes.stride(2),
        *v_codes.stride(),
        k_scales.stride(0),
        k_scales.stride(1),
        k_scales.stride(2),
        num_heads,
        key.shape[2],
        k_codes.shape[1],
        BLOCK_H=block_h,
        num_warps=launch["num_warps"],
        **common,
    )


def reshape_and_cache_torch(key, value, k_codes, v_codes, k_scales, v_scales, slot_mapping, kv_quant,
                            software_fp8=None) -> None:
    """What the engine runs when our cache write failed its startup check on the device (kernels/tuning): the torch
    quantizer of ``reference.py`` (the codes the kernel writes, byte for byte on the tested devices), scattered
    through the same views. Capturable in a CUDA/HIP graph (no host sync): a negative slot (padding) writes to slot 0
    of block 0, vLLM's null block, which no request reads. ``software_fp8`` is accepted for the same signature."""
    from .reference import quantize_per_token_head

    num_tokens = slot_mapping.shape[0]
    if num_tokens == 0:
        return
    block_size = k_codes.shape[1]
    slots = slot_mapping.long()
    valid = slots >= 0
    blk = torch.where(valid, slots // block_size, torch.zeros_like(slots))
    off = torch.where(valid, slots % block_size, torch.zeros_like(slots))
    for src, codes, scales in ((key, k_codes, k_scales), (value, v_codes, v_scales)):
        c, s = quantize_per_token_head(src[:num_tokens], kv_quant)
        codes[blk, off] = c
        scales[blk, off] = s


def reshape_and_cache_routed(key, value, k_codes, v_codes, k_scales, v_scales, slot_mapping, kv_quant,
                             software_fp8=None) -> None:
    """The engine's cache write (patch 0002 imports it as ``kv_quant.reshape_and_cache_per_token_head``): the Triton
    kernel, or the torch write where the device's decision for ``kv_write.<kind>`` is upstream's (VLLM_DCU_KV_WRITE=0,
    the tuned file, or a failed startup check). Per call: a dict lookup (it runs for every attention layer)."""
    path = _WRITE_PATHS.get(kv_quant)  # another kind: the kernel's own check names the error
    write = reshape_and_cache_per_token_head if path is None or runs_ours(path) else reshape_and_cache_torch
    write(key, value, k_codes, v_codes, k_scales, v_scales, slot_mapping, kv_quant, software_fp8)
